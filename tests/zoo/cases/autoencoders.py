"""Zoo cases: autoencoders (VAEs) of every family: image, video, audio, the DC-AE, MMAudio's, VQModel; and the ones without attention.

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from tests.zoo._zoo_common import ZooCase
from tests.zoo.cases._helpers import _Case, _r, _rn

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- image VAEs with diffusers' mid-block attention ---------------------------------------

# Encoder / Decoder of models/autoencoders/vae.py: UNetMidBlock2D holds one `Attention`
# (single head over all channels, group norm, residual, 4-D input) run by AttnProcessor2_0.

_VAE_ATTENTION_NOTE = (
    "Attention (mid-blocks of Encoder and Decoder: one head of dim = channels, group_norm, "
    "residual_connection, upcast_softmax, 4-D (B, C, H, W) input) + AttnProcessor2_0 -> "
    "F.scaled_dot_product_attention, no mask"
)


def _image_inputs(batch=1, channels=3, size=16, key="sample"):
    def make(model, gen):
        return {key: _rn(model, gen, batch, channels, size, size)}

    return make


CASES.append(
    ZooCase(
        name="AsymmetricAutoencoderKL",
        config=dict(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            down_block_out_channels=(16, 32),
            layers_per_down_block=1,
            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
            up_block_out_channels=(16, 32),
            layers_per_up_block=1,
            latent_channels=4,
            norm_num_groups=8,
            sample_size=16,
        ),
        inputs=_image_inputs(),
        note=_VAE_ATTENTION_NOTE + " (decoder: MaskConditionDecoder)",
        extra={"shape_like": "sample"},
    )
)

_KL = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
    up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
    block_out_channels=(16, 32),
    layers_per_block=1,
    latent_channels=4,
    norm_num_groups=8,
    sample_size=16,
)
CASES.append(
    ZooCase(
        name="AutoencoderKL",
        config=_KL,
        inputs=_image_inputs(),
        note=_VAE_ATTENTION_NOTE,
        extra={"shape_like": "sample"},
    )
)
CASES.append(
    ZooCase(
        name="AutoencoderKLFlux2",
        config=dict(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
            block_out_channels=(16, 32),
            layers_per_block=1,
            latent_channels=4,
            norm_num_groups=8,
            sample_size=16,
        ),
        inputs=_image_inputs(),
        note=_VAE_ATTENTION_NOTE,
        extra={"shape_like": "sample"},
    )
)
CASES.append(
    ZooCase(
        name="AutoencoderKLTemporalDecoder",
        # TemporalDecoder's output GroupNorm has 32 groups: channels are multiples of 32.
        # layers_per_block=2 as in SVD: MidBlockTemporalDecoder calls its attention only
        # between its first and second resnet, so with 1 layer the attention never runs.
        config=dict(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            block_out_channels=(32, 64),
            layers_per_block=2,
            latent_channels=4,
            sample_size=16,
        ),
        inputs=lambda model, gen: {"sample": _rn(model, gen, 2, 3, 16, 16), "num_frames": 2},
        note=(
            "Attention + AttnProcessor2_0 -> F.scaled_dot_product_attention: encoder mid-block (single "
            "head, 4-D input) and the TemporalDecoder's MidBlockTemporalDecoder (single head over channels, "
            "per frame), no mask"
        ),
        extra={"shape_like": "sample"},
    )
)


class _ReseededInputs(Mapping):
    """Forward keyword arguments where ``generator`` is a freshly seeded torch.Generator
    at every read: a model that draws noise inside its forward (ConsistencyDecoderVAE's
    decoder) then sees the same noise in every run on these inputs."""

    def __init__(self, values: dict, seed: int):
        self._values = values
        self._seed = seed

    def __getitem__(self, key):
        if key == "generator":
            return torch.Generator().manual_seed(self._seed)
        return self._values[key]

    def __iter__(self):
        return iter([*self._values, "generator"])

    def __len__(self):
        return len(self._values) + 1


CASES.append(
    ZooCase(
        name="ConsistencyDecoderVAE",
        config=dict(
            latent_channels=4,
            sample_size=16,
            encoder_block_out_channels=(16, 32),
            encoder_down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            encoder_layers_per_block=1,
            encoder_norm_num_groups=8,
            decoder_add_attention=True,
            decoder_block_out_channels=(16, 32),
            decoder_down_block_types=("ResnetDownsampleBlock2D", "ResnetDownsampleBlock2D"),
            decoder_up_block_types=("ResnetUpsampleBlock2D", "ResnetUpsampleBlock2D"),
            decoder_layers_per_block=1,
            decoder_norm_num_groups=8,
        ),
        inputs=lambda model, gen: _ReseededInputs(
            {"sample": _rn(model, gen, 1, 3, 16, 16)}, int(torch.randint(0, 2**31, (1,), generator=gen))
        ),
        note=(
            "Attention + AttnProcessor2_0 -> F.scaled_dot_product_attention: Encoder mid-block (single head, "
            "4-D input) and, with decoder_add_attention=True, the decoder UNet2DModel's mid-block (heads of "
            "dim 8); the forward draws decoder noise from `generator` (re-seeded at every read of the inputs)"
        ),
        extra={"shape_like": "sample"},
    )
)


# --- AutoencoderDC ------------------------------------------------------------------------

CASES.append(
    ZooCase(
        name="AutoencoderDC",
        # DC-AE's released configs put EfficientViTBlocks (linear attention) in the deeper
        # stages; the class default (all ResBlock) has none. An 8x8 input gives 16 tokens at
        # the second stage (> head_dim: ReLU linear attention) and 4 at the third
        # (<= head_dim: the "quadratic" ReLU-kernel path).
        config=dict(
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
        inputs=_image_inputs(size=8),
        note=(
            "SanaMultiscaleLinearAttention (not an Attention subclass; processor SanaMultiscaleAttnProcessor2_0, "
            "no dispatch): ReLU-kernel linear attention (non-softmax; fp32, eps-normalised) over multi-scale "
            "q/k/v when H*W > head_dim, else a ReLU 'quadratic' normalised attention; no mask"
        ),
        extra={"shape_like": "sample"},
    )
)


# --- video VAEs ---------------------------------------------------------------------------


def _allegro_vae_one_tile(model):
    # The forward has no untiled path (NotImplementedError); one tile covering the whole
    # 8 x 16 x 16 input keeps the encoder and decoder each called once.
    model.enable_tiling()
    model.kernel = (8, 16, 16)
    model.stride = (8, 16, 16)


CASES.append(
    _Case(
        name="AutoencoderKLAllegro",
        config=dict(
            in_channels=3,
            out_channels=3,
            down_block_types=("AllegroDownBlock3D",) * 3,
            up_block_types=("AllegroUpBlock3D",) * 3,
            block_out_channels=(8, 8, 8),
            temporal_downsample_blocks=(True, True, False),
            temporal_upsample_blocks=(False, True, True),
            latent_channels=4,
            layers_per_block=1,
            norm_num_groups=2,
            temporal_compression_ratio=4,
        ),
        setup=_allegro_vae_one_tile,
        inputs=lambda model, gen: {"sample": _rn(model, gen, 1, 3, 8, 16, 16)},
        note=(
            "Attention (AllegroMidBlock3DConv of encoder and decoder: single head over channels, group_norm, "
            "residual, per frame on (B*F, C, H, W)) + AttnProcessor2_0 -> F.scaled_dot_product_attention, no mask; "
            "forward only tiled (enable_tiling), output (B, F, C, H, W)"
        ),
        extra={"out_shape": (1, 8, 3, 16, 16)},
    )
)

CASES.append(
    ZooCase(
        name="AutoencoderKLCosmos",
        config=dict(
            in_channels=3,
            out_channels=3,
            latent_channels=4,
            encoder_block_out_channels=(8, 8, 8, 8),
            decode_block_out_channels=(8, 8, 8, 8),
            attention_resolutions=(8,),
            resolution=64,
            num_layers=1,
            patch_size=4,
            patch_type="haar",
            spatial_compression_ratio=4,
            temporal_compression_ratio=4,
        ),
        inputs=lambda model, gen: {"sample": _rn(model, gen, 1, 3, 9, 16, 16)},
        note=(
            "CosmosCausalAttention (plain nn.Module with a processor attribute, single head over channels, "
            "causal 1x1x1 conv projections, residual): CosmosSpatialAttentionProcessor2_0 over H*W per frame, no "
            "mask; CosmosTemporalAttentionProcessor2_0 over frames per pixel with a bool tril (T, T) causal mask "
            "(not is_causal); both F.scaled_dot_product_attention"
        ),
        extra={"shape_like": "sample"},
    )
)

CASES.append(
    ZooCase(
        name="AutoencoderKLHunyuanImage",
        # The attention block's GroupNorm has 32 groups: channels are multiples of 32.
        config=dict(
            in_channels=3,
            out_channels=3,
            latent_channels=4,
            block_out_channels=(32, 64),
            layers_per_block=1,
            spatial_compression_ratio=2,
            sample_size=16,
        ),
        inputs=_image_inputs(),
        note=(
            "HunyuanImageAttentionBlock (plain nn.Module, mid-blocks: GroupNorm, 1x1 conv q/k/v, single head "
            "over channels, residual) -> F.scaled_dot_product_attention on 3-D (B, H*W, C), no mask"
        ),
        extra={"shape_like": "sample"},
    )
)

_HY3D_VAE = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=4,
    block_out_channels=(16, 32),
    layers_per_block=1,
    spatial_compression_ratio=2,
    temporal_compression_ratio=2,
)
CASES.append(
    ZooCase(
        name="AutoencoderKLHunyuanImageRefiner",
        config=_HY3D_VAE,
        inputs=lambda model, gen: {"sample": _rn(model, gen, 1, 3, 5, 16, 16)},
        note=(
            "HunyuanImageRefinerAttnBlock (plain nn.Module, mid-blocks: RMS norm, 1x1x1 conv q/k/v, single head over "
            "channels, residual) -> F.scaled_dot_product_attention over all frames*H*W tokens, attn_mask=None"
        ),
        extra={"shape_like": "sample"},
    )
)
CASES.append(
    ZooCase(
        name="AutoencoderKLHunyuanVideo15",
        config=_HY3D_VAE,
        inputs=lambda model, gen: {"sample": _rn(model, gen, 1, 3, 5, 16, 16)},
        note=(
            "HunyuanVideo15AttnBlock (plain nn.Module, mid-blocks: RMS norm, 1x1x1 conv q/k/v, single head over "
            "channels, residual) -> F.scaled_dot_product_attention over all frames*H*W tokens with a frame-causal "
            "additive float mask (B, S, S) of 0 / -inf"
        ),
        extra={"shape_like": "sample"},
    )
)
CASES.append(
    ZooCase(
        name="AutoencoderKLHunyuanVideo",
        config=dict(
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
        inputs=lambda model, gen: {"sample": _rn(model, gen, 1, 3, 5, 16, 16)},
        note=(
            "Attention (HunyuanVideoMidBlock3D of encoder and decoder: single head over channels, group_norm, "
            "residual) + AttnProcessor2_0 -> F.scaled_dot_product_attention over all frames*H*W tokens with a "
            "frame-causal additive float mask (B, S, S) of 0 / -inf (viewed to (B, 1, S, S))"
        ),
        extra={"shape_like": "sample"},
    )
)


# --- audio VAEs ---------------------------------------------------------------------------

CASES.append(
    _Case(
        name="AutoencoderKLKVAEAudio",
        # The one attention's output projection x8: a global average over the frames is small
        # next to its input at the default scale. The decoder's last bias x0.01: drawn at
        # full scale it makes most of the waveform a constant, and in 1 draw of 70 the
        # attention moved the output by less than 1e-3 of it (_stock_a.py's MIN_EFFECT;
        # down to 8e-5). With both, the least of 1,000 draws is 2.8e-3.
        gains=((r"^attn\.to_out\.0\.weight", 8.0), (r"^decoder\.conv2\.bias$", 0.01)),
        config=dict(
            encoder_dim=4,
            encoder_rates=[2, 2],
            latent_dim=32,
            codebook_dim=4,
            decoder_dim=16,
            decoder_rates=[2, 2],
            num_channels=1,
            attn_num_heads=4,
        ),
        inputs=lambda model, gen: {"sample": _rn(model, gen, 1, 1, 64)},
        note=(
            "KVAEAudioAttention (AttentionModuleMixin) + KVAEAudioAttnProcessor -> dispatch_attention_fn: "
            "global self-attention over the encoder's output frames, no mask, default scale"
        ),
        extra={"shape_like": "sample"},
    )
)
CASES.append(
    ZooCase(
        name="AutoencoderKLLTX2Audio",
        # The class default (and LTX-2's audio VAE) has no attention: mid_block_add_attention=False,
        # attn_resolutions=None. Both switched on here so the attention the class can hold is covered.
        config=dict(
            in_channels=2,
            output_channels=2,
            latent_channels=4,
            base_channels=16,
            ch_mult=(1, 2, 4),
            resolution=16,
            attn_resolutions=(8,),
            num_res_blocks=1,
            norm_type="pixel",
            causality_axis="height",
            mid_block_add_attention=True,
            mel_bins=16,
            is_causal=True,
            double_z=True,
        ),
        inputs=lambda model, gen: {"sample": _rn(model, gen, 1, 2, 8, 16)},
        note=(
            "LTX2AudioAttnBlock (plain nn.Module: norm, 1x1 conv q/k/v, single head over channels, residual) -> "
            "torch.bmm + softmax + bmm, scale C**-0.5, no mask (not causal although the convs are); only present "
            "with mid_block_add_attention=True or attn_resolutions set (off in the class default)"
        ),
        extra={"out_shape": (1, 2, 5, 16)},
    )
)

CASES.append(
    ZooCase(
        name="AutoencoderKLMiniMaxH3Audio",
        # latent_dim // heads (16) differs from latent_channels (8) as at full scale, so the
        # adaptive-average-pool after the attention is exercised.
        config=dict(
            encoder_dim=4,
            encoder_rates=(2, 2),
            latent_dim=32,
            latent_channels=8,
            num_attention_heads=2,
            decoder_dim=16,
            decoder_rates=(2, 2),
            decoder_kernel_sizes=(4, 4),
            resblock_kernel_sizes=(3, 7),
            resblock_dilation_sizes=((1, 3), (1, 3)),
            latents_mean=[0.0] * 8,
            latents_std=[1.0] * 8,
        ),
        inputs=lambda model, gen: {"sample": _rn(model, gen, 1, 1, 32)},
        note=(
            "MiniMaxH3AudioCausalAttention (AttentionModuleMixin) + MiniMaxH3AudioAttnProcessor -> "
            "dispatch_attention_fn(attn_mask=None, is_causal=True): fused qkv with a frozen zero key bias; "
            "heads mean-pooled (not concatenated) after attention"
        ),
        extra={"shape_like": "sample"},
    )
)


# --- video VAEs with a transformer decoder / attention blocks -----------------------------

CASES.append(
    ZooCase(
        name="AutoencoderKLMiniMaxH3",
        # 17 * n + 5 pixel frames is the geometry the released clip_length / token_drop accept:
        # 22 frames is the shortest video that round-trips.
        config=dict(
            in_channels=3,
            out_channels=3,
            latent_channels=4,
            block_out_channels=(8, 16),
            layers_per_block=1,
            spatial_downsample_factors=(2, 2),
            temporal_downsample_factors=(2, 2),
            norm_num_groups=8,
            decoder_num_layers=2,
            decoder_num_attention_heads=2,
            decoder_attention_head_dim=8,
            decoder_num_register_tokens=2,
            decoder_ffn_mult=2,
            clip_length=17,
            token_drop=3,
            latents_mean=(0.0,) * 4,
            latents_std=(1.0,) * 4,
        ),
        inputs=lambda model, gen: {"sample": _rn(model, gen, 1, 3, 22, 8, 8)},
        note=(
            "MiniMaxH3VideoAttention (AttentionModuleMixin) + MiniMaxH3VideoAttnProcessor -> dispatch_attention_fn"
            "(attn_mask=None): ViT decoder over latent voxels + register tokens + a zero token, fp32 RMS qk-norm, "
            "partial rotate-half 3-axis rotary (first 0.75 of head_dim) built inside, positional call "
            "processor(attn, hidden_states, rotary_emb)"
        ),
        extra={"shape_like": "sample"},
    )
)

CASES.append(
    ZooCase(
        name="AutoencoderKLMochi",
        config=dict(
            in_channels=15,
            out_channels=3,
            latent_channels=4,
            encoder_block_out_channels=(32, 32, 32, 32),
            decoder_block_out_channels=(32, 32, 32, 32),
            layers_per_block=(1, 1, 1, 1, 1),
            scaling_factor=1,
        ),
        inputs=lambda model, gen: {"sample": _rn(model, gen, 1, 3, 13, 16, 16)},
        note=(
            "Attention (encoder down blocks and encoder mid-block, heads of dim 32, l2 qk-norm, is_causal=True) + "
            "MochiVaeAttnProcessor2_0 -> F.scaled_dot_product_attention(is_causal=True) over frames per pixel; "
            "a single-frame input skips attention (to_v only); the decoder has none"
        ),
        extra={"shape_like": "sample"},
    )
)

_WAN_FAMILY_NOTE = (
    "{cls} (plain nn.Module, mid-blocks of encoder and decoder{extra}: RMS norm, 1x1 conv qkv, single head over "
    "channels, residual) -> F.scaled_dot_product_attention per frame over H*W (4-D (B*T, 1, H*W, C)), no mask"
)
# Single-head spatial attention blocks: output projection x4 (an average over H*W is small
# next to the residual at the default scale).
_VAE_ATTN_GAIN = ((r"attentions\.\d+\.proj\.weight", 4.0),)
CASES.append(
    _Case(
        name="AutoencoderKLWan",
        gains=_VAE_ATTN_GAIN,
        config=dict(
            # attn_scales stays [] as in the released configs: a WanAttentionBlock in the encoder's
            # down blocks fails in diffusers 0.42.1 (its forward takes no feat_cache).
            base_dim=8,
            z_dim=4,
            dim_mult=[1, 1, 1],
            num_res_blocks=1,
            attn_scales=[],
            temperal_downsample=[False, True],
            latents_mean=[0.0] * 4,
            latents_std=[1.0] * 4,
        ),
        inputs=lambda model, gen: {"sample": _rn(model, gen, 1, 3, 5, 16, 16)},
        note=_WAN_FAMILY_NOTE.format(cls="WanAttentionBlock", extra=""),
        extra={"shape_like": "sample"},
    )
)
CASES.append(
    _Case(
        name="AutoencoderKLQwenImage",
        gains=_VAE_ATTN_GAIN,
        config=dict(
            base_dim=8,
            z_dim=4,
            dim_mult=[1, 1, 1],
            num_res_blocks=1,
            attn_scales=[],
            temperal_downsample=[False, True],
            latents_mean=[0.0] * 4,
            latents_std=[1.0] * 4,
        ),
        inputs=lambda model, gen: {"sample": _rn(model, gen, 1, 3, 5, 16, 16)},
        note=_WAN_FAMILY_NOTE.format(cls="QwenImageAttentionBlock", extra=""),
        extra={"shape_like": "sample"},
    )
)
CASES.append(
    ZooCase(
        name="AutoencoderKLQwenImage21",
        # An image VAE (one frame; its convolutions refuse a temporal cache) with four input
        # channels (images with alpha), as the class default.
        config=dict(
            base_dim=8,
            decoder_base_dim=8,
            z_dim=4,
            dim_mult=[1, 1, 1],
            num_res_blocks=1,
            attn_scales=[],
            temperal_downsample=[False, True],
            latents_mean=[0.0] * 4,
            latents_std=[1.0] * 4,
        ),
        inputs=lambda model, gen: {"sample": _rn(model, gen, 1, 4, 1, 16, 16)},
        note=_WAN_FAMILY_NOTE.format(cls="QwenImage21AttentionBlock", extra=""),
        extra={"shape_like": "sample"},
    )
)

CASES.append(
    ZooCase(
        name="AutoencoderVidTok",
        config=dict(
            in_channels=3,
            out_channels=3,
            ch=8,
            ch_mult=[1, 2, 2],
            z_channels=4,
            double_z=True,
            num_res_blocks=1,
            regularizer="kl",
            is_causal=True,
        ),
        # sample_posterior defaults to True here (noise drawn in the forward): the mode keeps it
        # deterministic.
        inputs=lambda model, gen: {"sample": _rn(model, gen, 1, 3, 9, 16, 16), "sample_posterior": False},
        note=(
            "VidTokAttnBlock (plain nn.Module, mid-blocks: LayerNorm, causal 1x1x1 conv q/k/v, single head over "
            "channels, residual) -> F.scaled_dot_product_attention on (B, T, H*W, C): per-frame spatial attention "
            "with frames in the heads slot, no mask"
        ),
        extra={"shape_like": "sample"},
    )
)


def _dyt_alpha_at_init(model):
    # DynamicTanh's alpha is a 1-element vector that random_init_ draws at ~0.05 (not a
    # "weight"): tanh(0.05 x) ~ constant, and every block then ignores its input. The class
    # initialises it at 4.0 (init_alpha); keep that, with a little spread.
    from diffusers.models.autoencoders.autoencoder_same import DynamicTanh

    for module in model.modules():
        if isinstance(module, DynamicTanh):
            module.alpha.mul_(0.0).add_(4.0 + 0.1 * torch.rand(1))


def _same_case(differential: bool) -> ZooCase:
    return _Case(
        name="AutoencoderSAME",
        setup=_dyt_alpha_at_init,
        gains=((r"attn\.to_out\.weight$", 4.0),),
        variant="" if differential else "standard",
        config=dict(
            audio_channels=2,
            patch_size=4,
            encoder_channels=8,
            encoder_c_mults=(2,),
            encoder_strides=(2,),
            encoder_transformer_depths=(1,),
            latent_dim=8,
            use_differential_attention=differential,
            dim_heads=8,
            ff_mult=2,
            sliding_window=1,
        ),
        inputs=lambda model, gen: {"sample": _rn(model, gen, 1, 2, 64)},
        note=(
            "SAMEAttention (AttentionModuleMixin) + SAMEAttnProcessor -> dispatch_attention_fn with an additive "
            "(S, S) sliding-window band mask of 0 / -inf; DyT qk-norm, partial rotate-half rotary built inside; "
            + (
                "differential attention: Attn(q1, k1, v) - Attn(q2, k2, v), two dispatch calls per module"
                if differential
                else "use_differential_attention=False: one dispatch call per module"
            )
        ),
        extra={"shape_like": "sample"},
    )


CASES.append(_same_case(True))
CASES.append(_same_case(False))


def _layer_scale_at_init(model):
    # DINOv2's LayerScale (`lambda1`, a vector per channel, not a "weight") scales the attention
    # and MLP branches before the residual sum. random_init_ draws it at ~0.05: the encoder's
    # attention then adds ~5% to the patch embeddings, and perturbing it moved the output by
    # ~3e-4 only. The class initialises it at config.layerscale_value (1.0); keep that, with a
    # little spread (then 3e-3 to 6e-3 over 40 draws).
    for name, p in model.named_parameters():
        if name.endswith(".lambda1"):
            p.copy_(1.0 + 0.1 * (2 * torch.rand(p.shape) - 1))


CASES.append(
    _Case(
        name="AutoencoderRAE",
        # The encoder is a `transformers` vision model built from its config (here DINOv2 with
        # registers; one head of 64 = encoder_hidden_size / 64, which RAE fixes); 32 / 8 = 4x4
        # patches, decoded with patch 4 to 16x16.
        setup=_layer_scale_at_init,
        config=dict(
            encoder_type="dinov2",
            encoder_hidden_size=64,
            encoder_patch_size=8,
            encoder_num_hidden_layers=1,
            decoder_hidden_size=32,
            decoder_num_hidden_layers=1,
            decoder_num_attention_heads=4,
            decoder_intermediate_size=64,
            patch_size=4,
            encoder_input_size=32,
            num_channels=3,
        ),
        inputs=lambda model, gen: {"sample": _rn(model, gen, 1, 3, 32, 32)},
        note=(
            "encoder: transformers' Dinov2WithRegisters self-attention (transformers' attention interface, "
            "outside diffusers' processors); decoder: Attention (ViTMAELayer) + AttnProcessor2_0 -> "
            "F.scaled_dot_product_attention, no mask"
        ),
        extra={"out_shape": (1, 3, 16, 16), "requires": ("transformers",)},
    )
)


NO_ATTENTION.update(
    {
        "AutoencoderKLCogVideoX": "causal-conv 3D VAE: resnet mid-blocks (CogVideoXMidBlock3D), no attention module",
        "AutoencoderKLKVAE": "conv VAE: the encoder/decoder `attn` ModuleLists are always empty, mid-block is two resnets",
        "AutoencoderKLKVAEVideo": "causal-conv video VAE: `attn` ModuleLists always empty, mid-block is two resnets",
        "AutoencoderKLLTX2Video": "causal-conv video VAE: resnet/up/down blocks only, no attention module",
        "AutoencoderKLLTXVideo": "causal-conv video VAE: resnet/up/down blocks only, no attention module",
        "AutoencoderKLMagvit": "causal-conv video VAE (EasyAnimate): resnet mid-block, no attention module",
        "AutoencoderOobleck": "1-D conv audio VAE (Snake residual units), no attention module",
        "AutoencoderTiny": "EncoderTiny / DecoderTiny: conv blocks only, no attention module",
        "Cosmos3AVAEAudioTokenizer": "audio tokenizer: ConvNeXt spectrogram encoder and conv decoder, no attention module",
    }
)


# --- MMAudio VAE (mel autoencoder) --------------------------------------------------------

_add(
    ZooCase(
        "MMAudioVAE",
        dict(
            mel_bins=16,
            latent_channels=8,
            hidden_channels=16,
            channel_multipliers=(1, 2),
            layers_per_block=1,
            sample_rate=8000,
            n_fft=64,
            hop_length=16,
        ),
        # a waveform in [-1, 1]: 24 mel frames
        lambda model, gen: dict(sample=(0.3 * _r(gen, model, 2, 16 * 24)).clamp(-1, 1)),
        note=(
            "MMAudioAttnBlock1D + MMAudioAttnProcessor -> dispatch_attention_fn with backend=NATIVE hard-coded: "
            "one head over the full channel width (head_dim 32 here, in the thousands at full size), q/k/v "
            "L2-normalised, no mask; one block mid-encoder, one mid-decoder."
        ),
    )
)


# --- VQModel ------------------------------------------------------------------------------

_VQ = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D", "AttnDownEncoderBlock2D"),
    up_block_types=("AttnUpDecoderBlock2D", "UpDecoderBlock2D"),
    block_out_channels=(16, 32),
    layers_per_block=1,
    latent_channels=4,
    norm_num_groups=8,
    num_vq_embeddings=16,
    vq_embed_dim=4,
)
# Kandinsky's MoVQ: spatial normalisation in the decoder, conditioned on the quantized latents
_VQ_MOVQ = dict(_VQ, norm_type="spatial", block_out_channels=(32, 64))  # SpatialNorm uses 32 groups
_VQ_NOTE = (
    "diffusers Attention + AttnProcessor2_0: single-head spatial self-attention (group norm, residual inside the "
    "module, 4-D input) in the encoder's and decoder's attention and mid blocks; no mask. No set_attn_processor "
    "on the model."
)
_add(
    ZooCase("VQModel", _VQ, lambda model, gen: dict(sample=_r(gen, model, 2, 3, 16, 16)), note=_VQ_NOTE),
    ZooCase(
        "VQModel",
        _VQ_MOVQ,
        lambda model, gen: dict(sample=_r(gen, model, 2, 3, 16, 16)),
        variant="movq",
        note=_VQ_NOTE + " MoVQ: the decoder's attention modules use SpatialNorm and receive temb (the latents).",
    ),
)


NO_ATTENTION.update(
    {
        "Kandinsky6SRVAE": (
            "causal 3-D convolutional VAE: ResNet blocks with spatial norms, down/upsamplers; no attention "
            "block in encoder, decoder or mid block"
        ),
        "LongCatAudioDiTVae": "1-D convolutional audio VAE (residual units with Snake activations): no attention",
    }
)
