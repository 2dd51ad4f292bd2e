"""Pipeline cases of the model zoo: whole tiny diffusers pipelines, every component built
from a tiny config with random weights (see _zoo_common.random_init_), run end to end.

A :class:`PipelineCase` builds a pipeline (UNet or transformer, VAE, the scheduler from its
default config; no tokenizer and no text encoder: nothing is downloaded) and gives the
keyword arguments of its call: the prompt embeddings (pooled ones, negative ones where
classifier-free guidance needs them, the text's attention mask where the pipeline takes
one), the initial latents, 2 denoising steps and a seeded generator. tests/zoo/test_pipelines.py
runs each with stock attention and through attnkit's routes.

Every random tensor is drawn in float32 from a seeded generator and then cast: the float64
run sees the same values (torch.randn draws different numbers in float64). The initial
latents are passed in for that reason, in the shape the pipeline's own prepare_latents
would draw (packed for Flux, Qwen-Image and LTX).

diffusers exports its pipelines only when ``transformers`` is installed (the pipeline
modules import its classes at import time, and diffusers.loaders gates the mixins the
pipelines inherit on it): without it every pipeline class is a placeholder that refuses to
be built, and tests/zoo/test_pipelines.py skips. No transformers model is built here; the
text encoders stay None.

``NO_PIPELINE``: pipelines asked for that cannot run here, each with the reason (none today).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from tests.zoo._zoo import cast_floats
from tests.zoo.cases._helpers import _Case

STEPS = 2


@dataclass(frozen=True)
class Component:
    """One model of a pipeline: the diffusers class, its tiny config, and gains applied
    after the random initialisation (as the zoo's ``_Case``: regex on the parameter name,
    factor)."""

    cls: str
    config: dict
    gains: tuple = ()

    def build(self, seed: int, dtype: torch.dtype) -> torch.nn.Module:
        return _Case(name=self.cls, config=self.config, inputs=None, gains=self.gains).build(seed, dtype=dtype)


@dataclass(frozen=True)
class PipelineCase:
    """One diffusers pipeline at test size.

    id:         short readable id (``flux``, ``sdxl``): the tests' ids.
    pipeline:   the class name as exported by ``diffusers``.
    models:     {component name: Component}: the models with attention (and the VAE).
    scheduler:  the scheduler class name, built from its default config (plus
                ``scheduler_config``).
    none:       the components passed as None (tokenizers, text encoders, safety checker).
    call:       ``call(gen) -> dict`` of call keyword arguments with random tensors (float32;
                cast to the pipeline's dtype by :meth:`call_kwargs`): prompt embeddings,
                masks, latents, sizes, guidance.
    output:     the output_type: "pt" where the VAE decodes (and holds attention), "latent"
                where the VAE holds none (decoding would add time and nothing attnkit serves).
    options:    other keyword arguments of the pipeline's constructor.
    note:       what runs attention in the pipeline, and how.
    """

    id: str
    pipeline: str
    models: dict[str, Component]
    scheduler: str
    call: Callable[[torch.Generator], dict[str, Any]]
    none: tuple[str, ...] = ()
    output: str = "pt"
    scheduler_config: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    note: str = ""

    def pipeline_class(self) -> type:
        import diffusers

        return getattr(diffusers, self.pipeline)

    def build(self, seed: int = 0, dtype: torch.dtype = torch.float32):
        """The pipeline with random weights (seeded: the same weights at every build)."""
        import diffusers

        parts: dict[str, Any] = {name: None for name in self.none}
        for i, (name, component) in enumerate(self.models.items()):
            parts[name] = component.build(seed + i, dtype)
        parts["scheduler"] = getattr(diffusers, self.scheduler)(**self.scheduler_config)
        pipe = self.pipeline_class()(**parts, **self.options)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def call_kwargs(self, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
        """The call's keyword arguments: the same random values for every dtype."""
        kwargs = cast_floats(self.call(torch.Generator().manual_seed(seed)), dtype)
        # the pipelines draw nothing once the latents are given (deterministic samplers);
        # a generator all the same, seeded, should one draw
        return {
            **kwargs,
            "num_inference_steps": STEPS,
            "output_type": self.output,
            "generator": torch.Generator().manual_seed(seed),
            "return_dict": False,
        }

    def run(self, pipe, kwargs: dict[str, Any]) -> torch.Tensor:
        with torch.no_grad():
            out = pipe(**kwargs)[0]
        return out if isinstance(out, torch.Tensor) else torch.as_tensor(out)


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


def _keep(lengths: list[int], total: int) -> torch.Tensor:
    """(B, total) int64 text mask, as a tokenizer gives it: item b keeps its first lengths[b]."""
    return torch.stack([torch.arange(total) < n for n in lengths]).long()


# --- the components -------------------------------------------------------------------------

# An image VAE with diffusers' mid-block Attention (encoder and decoder) and 2x compression:
# AutoencoderKL as in SD, SDXL, Flux and SD3 (shift_factor: Flux and SD3 read it).
_KL = Component(
    "AutoencoderKL",
    dict(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(16, 32),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=16,
        scaling_factor=0.5,
        shift_factor=0.1,
    ),
)

_UNET_SD = Component(
    "UNet2DConditionModel",
    dict(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        block_out_channels=(16, 32),
        layers_per_block=1,
        attention_head_dim=2,
        norm_num_groups=8,
        cross_attention_dim=24,
    ),
)
_UNET_SDXL = Component(
    "UNet2DConditionModel",
    dict(
        _UNET_SD.config,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 2),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=16 + 6 * 8,
    ),
)

# The timestep embedding's last layer x10 in the adaLN DiTs (see cases/_helpers._time_gain).
_FLUX = Component(
    "FluxTransformer2DModel",
    dict(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=16,
        pooled_projection_dim=8,
        axes_dims_rope=(4, 6, 6),
        guidance_embeds=True,
    ),
    gains=((r"time_text_embed\.timestep_embedder\.linear_2\.", 10.0),),
)

_SD3 = Component(
    "SD3Transformer2DModel",
    dict(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=24,
        caption_projection_dim=32,
        pooled_projection_dim=16,
        out_channels=4,
        pos_embed_max_size=16,
    ),
)

# Qwen-Image's and Wan's VAE: 4x spatial, 2x temporal; the attention blocks' output x4 (see
# cases/autoencoders.py).
_WAN_VAE_GAIN = ((r"attentions\.\d+\.proj\.weight", 4.0),)
_QWEN_VAE = Component(
    "AutoencoderKLQwenImage",
    dict(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 1, 1],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[False, True],
        latents_mean=[0.1, -0.2, 0.0, 0.3],
        latents_std=[1.0, 1.5, 0.8, 1.2],
    ),
    gains=_WAN_VAE_GAIN,
)
_QWEN = Component(
    "QwenImageTransformer2DModel",
    dict(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=24,
        axes_dims_rope=(4, 6, 6),
    ),
)

_WAN_VAE = Component(
    "AutoencoderKLWan",
    dict(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 1, 1],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[False, True],
        latents_mean=[0.1, -0.2, 0.0, 0.3],
        latents_std=[1.0, 1.5, 0.8, 1.2],
        scale_factor_temporal=2,
        scale_factor_spatial=4,
    ),
    gains=_WAN_VAE_GAIN,
)
_WAN = Component(
    "WanTransformer3DModel",
    dict(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        text_dim=24,
        freq_dim=16,
        ffn_dim=48,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    ),
)

# DC-AE with EfficientViT blocks (ReLU linear attention) in its deeper stages, as Sana's.
_DC_AE = Component(
    "AutoencoderDC",
    dict(
        in_channels=3,
        latent_channels=4,
        attention_head_dim=8,
        encoder_block_types=("ResBlock", "EfficientViTBlock", "EfficientViTBlock"),
        decoder_block_types=("ResBlock", "EfficientViTBlock", "EfficientViTBlock"),
        encoder_block_out_channels=(8, 16, 32),
        decoder_block_out_channels=(8, 16, 32),
        encoder_layers_per_block=(1, 1, 1),
        decoder_layers_per_block=(1, 1, 1),
        encoder_qkv_multiscales=((), (5,), (5,)),
        decoder_qkv_multiscales=((), (5,), (5,)),
        decoder_norm_types="rms_norm",
    ),
)
_SANA = Component(
    "SanaTransformer2DModel",
    dict(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=16,
        num_layers=2,
        num_cross_attention_heads=2,
        cross_attention_head_dim=16,
        cross_attention_dim=32,
        caption_channels=24,
        sample_size=8,
        patch_size=1,
    ),
)

# CogVideoX's VAE holds no attention (causal-conv): 2x spatial, 4x temporal.
_COG_VAE = Component(
    "AutoencoderKLCogVideoX",
    dict(
        in_channels=3,
        out_channels=3,
        down_block_types=("CogVideoXDownBlock3D",) * 2,
        up_block_types=("CogVideoXUpBlock3D",) * 2,
        block_out_channels=(8, 8),
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=2,
        temporal_compression_ratio=4,
    ),
)
# The timestep embedding's last layer x10 (its adaLN gates come out at ~0.03 otherwise): an
# attention wrong by 1e-3 then moves the output 25x the rule's tolerance, not 7x.
_COGVIDEOX = Component(
    "CogVideoXTransformer3DModel",
    dict(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        time_embed_dim=8,
        text_embed_dim=16,
        num_layers=2,
        sample_width=8,
        sample_height=8,
        sample_frames=5,
        patch_size=2,
        temporal_compression_ratio=4,
        max_text_seq_length=8,
        use_rotary_positional_embeddings=True,
    ),
    gains=((r"^time_embedding\.linear_2\.", 10.0),),
)

_HYV_VAE = Component(
    "AutoencoderKLHunyuanVideo",
    dict(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        down_block_types=("HunyuanVideoDownBlock3D",) * 3,
        up_block_types=("HunyuanVideoUpBlock3D",) * 3,
        block_out_channels=(8, 8, 16),
        layers_per_block=1,
        norm_num_groups=4,
        spatial_compression_ratio=4,
        temporal_compression_ratio=4,
    ),
)
_HYV = Component(
    "HunyuanVideoTransformer3DModel",
    dict(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=16,
        num_layers=1,
        num_single_layers=1,
        num_refiner_layers=1,
        mlp_ratio=2.0,
        patch_size=2,
        patch_size_t=1,
        text_embed_dim=16,
        pooled_projection_dim=8,
        rope_axes_dim=(4, 6, 6),
    ),
    gains=(
        (r"^time_text_embed\.timestep_embedder\.linear_2\.", 10.0),
        (r"context_embedder\.time_text_embed\.timestep_embedder\.linear_2\.", 10.0),
        (r"refiner_blocks\.\d+\.attn\.to_out\.0\.weight", 4.0),
    ),
)

# LTX's VAE holds no attention: 4x spatial, 4x temporal (two spatio-temporal stages).
_LTX_VAE = Component(
    "AutoencoderKLLTXVideo",
    dict(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(8, 8, 8),
        decoder_block_out_channels=(8, 8, 8),
        down_block_types=("LTXVideoDownBlock3D",) * 3,
        layers_per_block=(1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, False),
        decoder_spatio_temporal_scaling=(True, True, False),
        decoder_inject_noise=(False,) * 4,
        downsample_type=("conv",) * 3,
        upsample_residual=(False,) * 3,
        upsample_factor=(1,) * 3,
        patch_size=1,
        patch_size_t=1,
    ),
)
_LTX = Component(
    "LTXVideoTransformer3DModel",
    dict(
        in_channels=4,
        out_channels=4,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=2,
        attention_head_dim=16,
        cross_attention_dim=32,
        num_layers=2,
        caption_channels=24,
    ),
)


# --- the cases ------------------------------------------------------------------------------


def _sd_call(gen):
    return dict(
        prompt_embeds=_randn(gen, 1, 7, 24),
        negative_prompt_embeds=_randn(gen, 1, 7, 24),
        latents=_randn(gen, 1, 4, 8, 8),
        height=16,
        width=16,
        guidance_scale=5.0,
    )


def _sdxl_call(gen):
    return dict(
        _sd_call(gen), pooled_prompt_embeds=_randn(gen, 1, 16), negative_pooled_prompt_embeds=_randn(gen, 1, 16)
    )


def _flux_call(gen):
    # 16 x 16 pixels -> 8 x 8 latents of 4 channels, packed 2 x 2: (1, 16, 16)
    return dict(
        prompt_embeds=_randn(gen, 1, 6, 16),
        pooled_prompt_embeds=_randn(gen, 1, 8),
        latents=_randn(gen, 1, 16, 16),
        height=16,
        width=16,
        guidance_scale=3.5,
    )


def _sd3_call(gen):
    return dict(
        prompt_embeds=_randn(gen, 1, 7, 24),
        negative_prompt_embeds=_randn(gen, 1, 7, 24),
        pooled_prompt_embeds=_randn(gen, 1, 16),
        negative_pooled_prompt_embeds=_randn(gen, 1, 16),
        latents=_randn(gen, 1, 4, 8, 8),
        height=16,
        width=16,
        guidance_scale=5.0,
    )


def _qwen_call(gen):
    # 32 x 32 pixels -> 8 x 8 latents of 4 channels, packed 2 x 2: (1, 16, 16); the negative
    # prompt padded (4 of 6 tokens valid), true CFG
    return dict(
        prompt_embeds=_randn(gen, 1, 6, 24),
        prompt_embeds_mask=_keep([6], 6),
        negative_prompt_embeds=_randn(gen, 1, 6, 24),
        negative_prompt_embeds_mask=_keep([4], 6),
        latents=_randn(gen, 1, 16, 16),
        height=32,
        width=32,
        true_cfg_scale=4.0,
    )


def _wan_call(gen):
    # 5 frames of 16 x 16 -> 3 latent frames of 4 x 4
    return dict(
        prompt_embeds=_randn(gen, 1, 6, 24),
        negative_prompt_embeds=_randn(gen, 1, 6, 24),
        latents=_randn(gen, 1, 4, 3, 4, 4),
        height=16,
        width=16,
        num_frames=5,
        guidance_scale=5.0,
    )


def _sana_call(gen):
    # 32 x 32 pixels -> 8 x 8 latents; prompts padded (6 and 3 of 6 tokens valid), CFG
    return dict(
        prompt_embeds=_randn(gen, 1, 6, 24),
        prompt_attention_mask=_keep([5], 6),
        negative_prompt_embeds=_randn(gen, 1, 6, 24),
        negative_prompt_attention_mask=_keep([3], 6),
        latents=_randn(gen, 1, 4, 8, 8),
        height=32,
        width=32,
        guidance_scale=4.5,
        use_resolution_binning=False,
        negative_prompt=None,  # "" by default, which the embeddings may not be given with
    )


def _cogvideox_call(gen):
    # 5 frames of 16 x 16 -> 2 latent frames of 8 x 8, (B, F, C, H, W)
    return dict(
        prompt_embeds=_randn(gen, 1, 8, 16),
        negative_prompt_embeds=_randn(gen, 1, 8, 16),
        latents=_randn(gen, 1, 2, 4, 8, 8),
        height=16,
        width=16,
        num_frames=5,
        guidance_scale=6.0,
    )


def _hunyuan_call(gen):
    # 5 frames of 32 x 32 -> 2 latent frames of 8 x 8; the prompt padded (9 of 12 tokens valid)
    return dict(
        prompt_embeds=_randn(gen, 1, 12, 16),
        pooled_prompt_embeds=_randn(gen, 1, 8),
        prompt_attention_mask=_keep([9], 12),
        latents=_randn(gen, 1, 4, 2, 8, 8),
        height=32,
        width=32,
        num_frames=5,
        guidance_scale=6.0,
    )


def _ltx_call(gen):
    # 5 frames of 32 x 32 -> 2 latent frames of 8 x 8, packed: (1, 128, 4); prompts padded, CFG
    return dict(
        prompt_embeds=_randn(gen, 1, 6, 24),
        prompt_attention_mask=_keep([6], 6),
        negative_prompt_embeds=_randn(gen, 1, 6, 24),
        negative_prompt_attention_mask=_keep([2], 6),
        latents=_randn(gen, 1, 128, 4),
        height=32,
        width=32,
        num_frames=5,
        guidance_scale=3.0,
    )


CASES = [
    PipelineCase(
        "sd",
        "StableDiffusionPipeline",
        {"unet": _UNET_SD, "vae": _KL},
        "EulerDiscreteScheduler",
        _sd_call,
        none=("text_encoder", "tokenizer", "safety_checker", "feature_extractor"),
        options=dict(requires_safety_checker=False),
        scheduler_config=dict(steps_offset=1),  # as SD1.5's; the default 0 makes the pipeline rewrite it, warning
        note="SD1.5 layout: UNet and VAE Attention + AttnProcessor2_0 (no dispatch); CFG",
    ),
    PipelineCase(
        "sdxl",
        "StableDiffusionXLPipeline",
        {"unet": _UNET_SDXL, "vae": _KL},
        "EulerDiscreteScheduler",
        _sdxl_call,
        none=("text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2"),
        note="SDXL layout (text_time conditioning, 2 transformer layers); Attention + AttnProcessor2_0; CFG",
    ),
    PipelineCase(
        "flux",
        "FluxPipeline",
        {"transformer": _FLUX, "vae": _KL},
        "FlowMatchEulerDiscreteScheduler",
        _flux_call,
        none=("text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2"),
        note="FluxAttnProcessor -> dispatch_attention_fn (joint text+image, rotary); guidance embedding, no CFG",
    ),
    PipelineCase(
        "sd3",
        "StableDiffusion3Pipeline",
        {"transformer": _SD3, "vae": _KL},
        "FlowMatchEulerDiscreteScheduler",
        _sd3_call,
        none=("text_encoder", "text_encoder_2", "text_encoder_3", "tokenizer", "tokenizer_2", "tokenizer_3"),
        note="JointAttnProcessor2_0 (no dispatch): joint image+text attention; CFG",
    ),
    PipelineCase(
        "qwenimage",
        "QwenImagePipeline",
        {"transformer": _QWEN, "vae": _QWEN_VAE},
        "FlowMatchEulerDiscreteScheduler",
        _qwen_call,
        none=("text_encoder", "tokenizer"),
        note="QwenDoubleStreamAttnProcessor2_0 -> dispatch_attention_fn, text masks; VAE attention blocks; true CFG",
    ),
    PipelineCase(
        "wan",
        "WanPipeline",
        {"transformer": _WAN, "vae": _WAN_VAE},
        "FlowMatchEulerDiscreteScheduler",
        _wan_call,
        none=("text_encoder", "tokenizer"),
        note="WanAttnProcessor -> dispatch_attention_fn (self with rotary, text cross-attention); VAE attention; CFG",
    ),
    PipelineCase(
        "sana",
        "SanaPipeline",
        {"transformer": _SANA, "vae": _DC_AE},
        "DPMSolverMultistepScheduler",
        _sana_call,
        none=("text_encoder", "tokenizer"),
        note=(
            "self-attention SanaLinearAttnProcessor2_0 (ReLU linear, kept), text cross-attention "
            "SanaAttnProcessor2_0 (masked); DC-AE linear attention (kept); CFG"
        ),
    ),
    PipelineCase(
        "cogvideox",
        "CogVideoXPipeline",
        {"transformer": _COGVIDEOX, "vae": _COG_VAE},
        "CogVideoXDDIMScheduler",
        _cogvideox_call,
        none=("text_encoder", "tokenizer"),
        output="latent",
        note="CogVideoXAttnProcessor2_0 (no dispatch): joint text+video with rotary; VAE without attention; CFG",
    ),
    PipelineCase(
        "hunyuanvideo",
        "HunyuanVideoPipeline",
        {"transformer": _HYV, "vae": _HYV_VAE},
        "FlowMatchEulerDiscreteScheduler",
        _hunyuan_call,
        none=("text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2"),
        note=(
            "token refiner AttnProcessor2_0 (masked), blocks HunyuanVideoAttnProcessor2_0 -> dispatch_attention_fn "
            "(masked); VAE mid-block attention with a frame-causal mask; guidance embedding, no CFG"
        ),
    ),
    PipelineCase(
        "ltx",
        "LTXPipeline",
        {"transformer": _LTX, "vae": _LTX_VAE},
        "FlowMatchEulerDiscreteScheduler",
        _ltx_call,
        none=("text_encoder", "tokenizer"),
        output="latent",
        note="LTXVideoAttnProcessor -> dispatch_attention_fn (rotary, masked text cross-attention); VAE without "
        "attention; CFG. The pipeline keeps its latents and scheduler steps in float32 whatever the models' "
        "dtype: the float64 reference has a float64 transformer between float32 steps",
    ),
]
BY_ID = {case.id: case for case in CASES}

# Pipelines that cannot run without a downloaded component, each with the reason.
NO_PIPELINE: dict[str, str] = {}
