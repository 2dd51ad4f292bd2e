"""Zoo cases for diffusers' model classes AceStep... to I2VGenXLUNet (first half of the
alphabet): one tiny configuration per class with attention (more where a variant changes
what the attention computes: masks, causal, image conditioning), and the classes without
attention with the reason.

Every configuration keeps the attention layout of the real model (heads >= 2 where the
model has several, head_dim >= 8, GQA, qk-norm, rotary, joint text+image attention, masks)
at the smallest size that runs it. Inputs are random from the generator; masks keep a
different number of text tokens per batch item; rotary inputs are random angles.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from tests.zoo._zoo_common import ZooCase, model_param, randn, random_angles_rotary, random_init_

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


@dataclass(frozen=True)
class _Case(ZooCase):
    """A ZooCase with three optional steps around the random initialisation:

    make:  ``make(config) -> model`` instead of ``cls(**config)``, for wrappers whose
           constructor takes models (Multi-ControlNets hold their ControlNets).
    gains: ((regex on the parameter name, factor), ...) multiplied after the init. At
           torch's default initialisation scale a tiny adaLN-zero DiT gets a timestep
           embedding of ~0.1 and gates of ~0.03, and zero-initialised scalar gates or output
           projections come out near 0, so attention reaches the output at ~1e-5 relative
           and a comparison through the model could barely fail; a gain brings those few
           parameters to the scale of a trained model.
    setup: ``setup(model)`` after that (tiling where the forward has no untiled path,
           module constants that the init draws far from their meaning).
    """

    make: object = None
    gains: tuple = ()
    setup: object = None

    def build(self, seed: int = 0, dtype: torch.dtype = torch.float32, device="cpu"):
        torch.manual_seed(seed)
        model = self.make(self.config) if self.make is not None else self.model_class()(**self.config)
        random_init_(model, seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                for pattern, factor in self.gains:
                    if re.search(pattern, name):
                        p.mul_(factor)
            if self.setup is not None:
                self.setup(model)
        return model.to(device=device, dtype=dtype).eval()


# The timestep embedding's last layer x10: at the default initialisation it comes out at ~0.1
# and every adaLN gate at ~0.03 (see _Case).
def _time_gain(prefix: str) -> tuple:
    return ((prefix + r"timestep_embedder\.linear_2\.", 10.0),)


def _like(model):
    p = model_param(model)
    return {"dtype": p.dtype, "device": p.device}


def _rn(model, gen, *shape):
    return randn(gen, *shape, **_like(model))


def _timestep(model, gen, batch, scale=1000.0):
    """Random timesteps in (0, scale), one per batch item."""
    return (torch.rand(batch, generator=gen) * scale).to(**_like(model))


def _text_keep(lengths, total, device="cpu"):
    """(B, total) bool: True for the first `length` tokens of each batch item."""
    idx = torch.arange(total)
    return torch.stack([idx < n for n in lengths]).to(device)


def _angles(gen, tokens, half):
    return torch.rand(tokens, half, generator=gen) * (2 * math.pi)


def _rope_halves(gen, tokens, dim, dtype=torch.float32, device="cpu"):
    """(cos, sin), each (tokens, dim), random angles in the rotate-half layout
    (cat([a, a], -1)) that Qwen-style rotary embeddings use."""
    a = _angles(gen, tokens, dim // 2)
    a = torch.cat([a, a], dim=-1)
    return a.cos().to(device=device, dtype=dtype), a.sin().to(device=device, dtype=dtype)


# --- AceStepTransformer1DModel -----------------------------------------------------------

def _ace_step_inputs(model, gen):
    b, t = 2, 16
    return {
        "hidden_states": _rn(model, gen, b, t, 8),
        "timestep": torch.rand(b, generator=gen).to(**_like(model)),
        "timestep_r": torch.rand(b, generator=gen).to(**_like(model)),
        "encoder_hidden_states": _rn(model, gen, b, 5, 32),
        "context_latents": _rn(model, gen, b, t, 8),
    }


CASES.append(
    ZooCase(
        name="AceStepTransformer1DModel",
        config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, in_channels=16, audio_acoustic_hidden_dim=8,
            patch_size=2, sliding_window=2,
        ),
        inputs=_ace_step_inputs,
        note=(
            "AceStepAttention (AttentionModuleMixin) + AceStepAttnProcessor2_0 -> dispatch_attention_fn: "
            "GQA (enable_gqa, 4 q / 2 kv heads), RMS qk-norm, rotary (cos, sin) built inside; "
            "self-attention layers alternate a sliding-window additive 4-D mask (finfo.min) and none; "
            "cross-attention to the text without mask."
        ),
        extra={"shape_like": "hidden_states"},
    )
)


# --- AllegroTransformer3DModel -----------------------------------------------------------

def _allegro_inputs(masked, lengths=(7, 3)):
    def make(model, gen):
        b = 2 if masked else 1
        f, h, w = 2, 8, 8
        # rotary: per axis (cos, sin) tables over positions, and the (t, h, w) position of
        # every token, as the pipeline's _prepare_rotary_positional_embeddings builds them.
        gt, gh, gw = f, h // 2, w // 2
        freqs = tuple(_rope_halves(gen, n, 8, **_like(model)) for n in (gt, gh, gw))
        pos = torch.cartesian_prod(torch.arange(gt), torch.arange(gh), torch.arange(gw))
        pos = pos.transpose(0, 1).reshape(3, 1, -1)
        out = {
            "hidden_states": _rn(model, gen, b, 4, f, h, w),
            "encoder_hidden_states": _rn(model, gen, b, 7, 16),
            "timestep": _timestep(model, gen, b),
            "image_rotary_emb": (freqs, tuple(pos)),
        }
        if masked:
            out["encoder_attention_mask"] = _text_keep(lengths, 7).to(**_like(model))
        return out

    return make


_ALLEGRO = dict(
    patch_size=2, patch_size_t=1, num_attention_heads=2, attention_head_dim=24, in_channels=4,
    out_channels=4, num_layers=1, cross_attention_dim=48, sample_height=8, sample_width=8,
    sample_frames=2, caption_channels=16,
)
_ALLEGRO_NOTE = (
    "Attention + AllegroAttnProcessor2_0 -> F.scaled_dot_product_attention: self-attention with "
    "3-axis rotary (image_rotary_emb = (cos, sin) per axis, token positions), cross-attention to text; "
    "encoder_attention_mask -> additive -10000 bias (B, 1, T) repeated per head"
)
CASES.append(ZooCase(name="AllegroTransformer3DModel", config=_ALLEGRO, inputs=_allegro_inputs(False), note=_ALLEGRO_NOTE,
                     extra={"rotary_keys": ("image_rotary_emb",)}))
CASES.append(
    ZooCase(
        name="AllegroTransformer3DModel", variant="masked", config=_ALLEGRO, inputs=_allegro_inputs(True),
        note=_ALLEGRO_NOTE + "; batch 2 with 7 and 3 valid text tokens",
        extra={"mask_keys": ("encoder_attention_mask",), "rotary_keys": ("image_rotary_emb",)},
    )
)
CASES.append(
    ZooCase(
        name="AllegroTransformer3DModel", variant="fullpad", config=_ALLEGRO, inputs=_allegro_inputs(True, (7, 0)),
        note=_ALLEGRO_NOTE + "; batch 2, the second with no valid text token: every cross-attention key gets -10000 "
        "(a uniform average, not a masked-out row)",
    )
)


# --- AnimaTextConditioner -------------------------------------------------------------------

def _anima_inputs(masked, source_lengths=(9, 5)):
    def make(model, gen):
        b = 2 if masked else 1
        out = {
            "source_hidden_states": _rn(model, gen, b, 9, 24),
            "target_input_ids": torch.randint(0, 64, (b, 6), generator=gen).to(model_param(model).device),
        }
        if masked:
            out["target_attention_mask"] = _text_keep([6, 4], 6).long()
            out["source_attention_mask"] = _text_keep(source_lengths, 9).long()
        return out

    return make


_ANIMA = dict(
    source_dim=24, target_dim=32, model_dim=32, num_layers=2, num_attention_heads=4, mlp_ratio=2.0,
    target_vocab_size=64, min_sequence_length=8,
)
_ANIMA_NOTE = (
    "AnimaTextConditionerAttention (AttentionModuleMixin) + AnimaTextConditionerAttnProcessor -> "
    "dispatch_attention_fn: RMS qk-norm, rotate-half rotary on q and k (cross-attention too, with the "
    "source positions), built inside; masks are bool (B, 1, 1, S) key padding"
)
CASES.append(
    ZooCase(name="AnimaTextConditioner", config=_ANIMA, inputs=_anima_inputs(False), note=_ANIMA_NOTE,
            outputs=lambda out: (out,), extra={"out_shape": (1, 8, 32)})
)
CASES.append(
    ZooCase(name="AnimaTextConditioner", variant="masked", config=_ANIMA, inputs=_anima_inputs(True),
            note=_ANIMA_NOTE + "; batch 2: 6 and 4 target tokens, 9 and 5 source tokens",
            outputs=lambda out: (out,), extra={"out_shape": (2, 8, 32),
                                               "mask_keys": ("target_attention_mask", "source_attention_mask")})
)
CASES.append(
    ZooCase(name="AnimaTextConditioner", variant="fullpad", config=_ANIMA, inputs=_anima_inputs(True, (9, 0)),
            note=_ANIMA_NOTE + "; batch 2, the second with no valid source token: its cross-attention rows are fully "
            "masked (zeros from SDPA)",
            outputs=lambda out: (out,), extra={"out_shape": (2, 8, 32)})
)


# --- AnyFlowTransformer3DModel / AnyFlowFARTransformer3DModel ------------------------------

_ANYFLOW = dict(
    patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
    text_dim=16, freq_dim=32, ffn_dim=32, num_layers=2, cross_attn_norm=True, rope_max_seq_len=32,
)


def _anyflow_inputs(model, gen):
    b, f = 1, 2
    return {
        "hidden_states": _rn(model, gen, b, f, 4, 8, 8),
        "timestep": _timestep(model, gen, b * f).view(b, f),
        "r_timestep": _timestep(model, gen, b * f).view(b, f),
        "encoder_hidden_states": _rn(model, gen, b, 6, 16),
    }


CASES.append(
    ZooCase(
        name="AnyFlowTransformer3DModel", config=_ANYFLOW, inputs=_anyflow_inputs,
        note=(
            "AnyFlowAttention (AttentionModuleMixin): self-attention AnyFlowAttnProcessor, cross-attention "
            "AnyFlowCrossAttnProcessor, both -> dispatch_attention_fn without mask; RMS qk-norm across heads; "
            "3-axis complex rotary (float64) built inside, self-attention only"
        ),
    )
)

_ANYFLOW_FAR = dict(_ANYFLOW, compressed_patch_size=(1, 4, 4), full_chunk_limit=2)


def _anyflow_far_inputs(model, gen):
    # Training-rollout path: 3 chunks with full_chunk_limit=2, so the first chunk is FAR
    # compressed context; the causal BlockMask is built inside.
    b, f = 1, 4
    return {
        "hidden_states": _rn(model, gen, b, f, 4, 8, 8),
        "timestep": _timestep(model, gen, b * f).view(b, f),
        "r_timestep": _timestep(model, gen, b * f).view(b, f),
        "encoder_hidden_states": _rn(model, gen, b, 6, 16),
        "chunk_partition": [1, 1, 2],
    }


def _anyflow_far_kvcache_inputs(model, gen):
    # Autoregressive step: the last chunk (2 frames) against a KV cache holding two earlier
    # chunks, one FAR-compressed (2x2 tokens) and one full (4x4 tokens); cached keys and
    # values are random.
    cfg = model.config
    b, f = 1, 2
    heads, d = cfg.num_attention_heads, cfg.attention_head_dim
    cache = {
        i: {
            "full_cache": _rn(model, gen, 2, b, heads, cfg.full_chunk_limit * 2 * 16, d),
            "compressed_cache": _rn(model, gen, 2, b, heads, 2 * 4, d),
        }
        for i in range(cfg.num_layers)
    }
    return {
        "hidden_states": _rn(model, gen, b, f, 4, 8, 8),
        "timestep": _timestep(model, gen, b * f).view(b, f),
        "r_timestep": _timestep(model, gen, b * f).view(b, f),
        "encoder_hidden_states": _rn(model, gen, b, 6, 16),
        "chunk_partition": [1, 1, 2],
        "kv_cache": cache,
        "kv_cache_flag": {"num_cached_chunks": 2, "is_cache_step": False},
    }


_ANYFLOW_FAR_NOTE = (
    "AnyFlowAttention (AttentionModuleMixin): self-attention AnyFlowCausalAttnProcessor -> "
    "dispatch_attention_fn with backend fixed to 'flex' (raises for any other) and a flex BlockMask "
    "(frame-causal, FAR context), q/k/v zero-padded to a multiple of 128 tokens; cross-attention "
    "AnyFlowCrossAttnProcessor without mask; complex rotary (float64) built inside"
)
CASES.append(
    ZooCase(name="AnyFlowFARTransformer3DModel", config=_ANYFLOW_FAR, inputs=_anyflow_far_inputs,
            note=_ANYFLOW_FAR_NOTE, backward=False,
            # the compressed context frame is not predicted: 3 of the 4 frames come out
            extra={"out_shape": (1, 3, 4, 8, 8)})
)
CASES.append(
    ZooCase(name="AnyFlowFARTransformer3DModel", variant="kvcache", config=_ANYFLOW_FAR,
            inputs=_anyflow_far_kvcache_inputs, backward=False,
            note=_ANYFLOW_FAR_NOTE + "; KV-cache step: keys = cached compressed + cached full + new, no mask")
)


# --- image VAEs with diffusers' mid-block attention ----------------------------------------
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
            in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            down_block_out_channels=(16, 32), layers_per_down_block=1,
            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), up_block_out_channels=(16, 32),
            layers_per_up_block=1, latent_channels=4, norm_num_groups=8, sample_size=16,
        ),
        inputs=_image_inputs(),
        note=_VAE_ATTENTION_NOTE + " (decoder: MaskConditionDecoder)",
        extra={"shape_like": "sample"},
    )
)

_KL = dict(
    in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
    up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), block_out_channels=(16, 32),
    layers_per_block=1, latent_channels=4, norm_num_groups=8, sample_size=16,
)
CASES.append(ZooCase(name="AutoencoderKL", config=_KL, inputs=_image_inputs(), note=_VAE_ATTENTION_NOTE,
                     extra={"shape_like": "sample"}))
CASES.append(
    ZooCase(
        name="AutoencoderKLFlux2",
        config=dict(
            in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), block_out_channels=(16, 32),
            layers_per_block=1, latent_channels=4, norm_num_groups=8, sample_size=16,
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
            in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            block_out_channels=(32, 64), layers_per_block=2, latent_channels=4, sample_size=16,
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
            latent_channels=4, sample_size=16, encoder_block_out_channels=(16, 32),
            encoder_down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"), encoder_layers_per_block=1,
            encoder_norm_num_groups=8, decoder_add_attention=True, decoder_block_out_channels=(16, 32),
            decoder_down_block_types=("ResnetDownsampleBlock2D", "ResnetDownsampleBlock2D"),
            decoder_up_block_types=("ResnetUpsampleBlock2D", "ResnetUpsampleBlock2D"),
            decoder_layers_per_block=1, decoder_norm_num_groups=8,
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


# --- AuraFlowTransformer2DModel ------------------------------------------------------------

CASES.append(
    _Case(
        name="AuraFlowTransformer2DModel",
        # Every block's attention output projection x4: in 1 draw of 100 the joint or the
        # single block's attention moved the output by less than 1e-3 (test_zoo_stock_a's
        # MIN_EFFECT); with the gains the least of 800 draws is 1.8e-3.
        gains=((r"^time_step_proj\.linear_2\.", 10.0),
               (r"^(joint|single)_transformer_blocks\.\d+\.attn\.to_out\.0\.weight$", 4.0)),
        config=dict(
            sample_size=8, patch_size=2, in_channels=4, num_mmdit_layers=1, num_single_dit_layers=1,
            attention_head_dim=8, num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16,
            out_channels=4, pos_embed_max_size=16,
        ),
        inputs=lambda model, gen: {
            "hidden_states": _rn(model, gen, 2, 4, 8, 8),
            "encoder_hidden_states": _rn(model, gen, 2, 5, 16),
            "timestep": torch.rand(2, generator=gen).to(**_like(model)),
        },
        note=(
            "Attention + AuraFlowAttnProcessor2_0 -> F.scaled_dot_product_attention(scale=attn.scale), no mask: "
            "MMDiT blocks attend over [8 register + text tokens (added projections), image tokens] with "
            "fp32 LayerNorm qk-norm (norm_added_q/k on text), single blocks over the concatenation"
        ),
    )
)


# --- AutoencoderDC -------------------------------------------------------------------------

CASES.append(
    ZooCase(
        name="AutoencoderDC",
        # DC-AE's released configs put EfficientViTBlocks (linear attention) in the deeper
        # stages; the class default (all ResBlock) has none. An 8x8 input gives 16 tokens at
        # the second stage (> head_dim: ReLU linear attention) and 4 at the third
        # (<= head_dim: the "quadratic" ReLU-kernel path).
        config=dict(
            in_channels=3, latent_channels=4, attention_head_dim=8,
            encoder_block_types=("ResBlock", "EfficientViTBlock", "EfficientViTBlock"),
            decoder_block_types=("ResBlock", "EfficientViTBlock", "EfficientViTBlock"),
            encoder_block_out_channels=(8, 16, 32), decoder_block_out_channels=(8, 16, 32),
            encoder_layers_per_block=(1, 1, 1), decoder_layers_per_block=(1, 1, 1),
            encoder_qkv_multiscales=((), (5,), (5,)), decoder_qkv_multiscales=((), (5,), (5,)),
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


# --- video VAEs ----------------------------------------------------------------------------

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
            in_channels=3, out_channels=3, down_block_types=("AllegroDownBlock3D",) * 3,
            up_block_types=("AllegroUpBlock3D",) * 3, block_out_channels=(8, 8, 8),
            temporal_downsample_blocks=(True, True, False), temporal_upsample_blocks=(False, True, True),
            latent_channels=4, layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4,
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
            in_channels=3, out_channels=3, latent_channels=4, encoder_block_out_channels=(8, 8, 8, 8),
            decode_block_out_channels=(8, 8, 8, 8), attention_resolutions=(8,), resolution=64, num_layers=1,
            patch_size=4, patch_type="haar", spatial_compression_ratio=4, temporal_compression_ratio=4,
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
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 64), layers_per_block=1,
            spatial_compression_ratio=2, sample_size=16,
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
    in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 32), layers_per_block=1,
    spatial_compression_ratio=2, temporal_compression_ratio=2,
)
CASES.append(
    ZooCase(
        name="AutoencoderKLHunyuanImageRefiner", config=_HY3D_VAE,
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
        name="AutoencoderKLHunyuanVideo15", config=_HY3D_VAE,
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
            in_channels=3, out_channels=3, latent_channels=4,
            down_block_types=("HunyuanVideoDownBlock3D",) * 3, up_block_types=("HunyuanVideoUpBlock3D",) * 3,
            block_out_channels=(8, 8, 16), layers_per_block=1, norm_num_groups=4, spatial_compression_ratio=4,
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


# --- audio VAEs ----------------------------------------------------------------------------

CASES.append(
    _Case(
        name="AutoencoderKLKVAEAudio",
        # The one attention's output projection x8: a global average over the frames is small
        # next to its input at the default scale. The decoder's last bias x0.01: drawn at
        # full scale it makes most of the waveform a constant, and in 1 draw of 70 the
        # attention moved the output by less than 1e-3 of it (test_zoo_stock_a's MIN_EFFECT;
        # down to 8e-5). With both, the least of 1,000 draws is 2.8e-3.
        gains=((r"^attn\.to_out\.0\.weight", 8.0), (r"^decoder\.conv2\.bias$", 0.01)),
        config=dict(
            encoder_dim=4, encoder_rates=[2, 2], latent_dim=32, codebook_dim=4, decoder_dim=16,
            decoder_rates=[2, 2], num_channels=1, attn_num_heads=4,
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
            in_channels=2, output_channels=2, latent_channels=4, base_channels=16, ch_mult=(1, 2, 4),
            resolution=16, attn_resolutions=(8,), num_res_blocks=1, norm_type="pixel", causality_axis="height",
            mid_block_add_attention=True, mel_bins=16, is_causal=True, double_z=True,
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
            encoder_dim=4, encoder_rates=(2, 2), latent_dim=32, latent_channels=8, num_attention_heads=2,
            decoder_dim=16, decoder_rates=(2, 2), decoder_kernel_sizes=(4, 4), resblock_kernel_sizes=(3, 7),
            resblock_dilation_sizes=((1, 3), (1, 3)), latents_mean=[0.0] * 8, latents_std=[1.0] * 8,
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


# --- video VAEs with a transformer decoder / attention blocks ------------------------------

CASES.append(
    ZooCase(
        name="AutoencoderKLMiniMaxH3",
        # 17 * n + 5 pixel frames is the geometry the released clip_length / token_drop accept:
        # 22 frames is the shortest video that round-trips.
        config=dict(
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16), layers_per_block=1,
            spatial_downsample_factors=(2, 2), temporal_downsample_factors=(2, 2), norm_num_groups=8,
            decoder_num_layers=2, decoder_num_attention_heads=2, decoder_attention_head_dim=8,
            decoder_num_register_tokens=2, decoder_ffn_mult=2, clip_length=17, token_drop=3,
            latents_mean=(0.0,) * 4, latents_std=(1.0,) * 4,
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
            in_channels=15, out_channels=3, latent_channels=4, encoder_block_out_channels=(32, 32, 32, 32),
            decoder_block_out_channels=(32, 32, 32, 32), layers_per_block=(1, 1, 1, 1, 1), scaling_factor=1,
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
            base_dim=8, z_dim=4, dim_mult=[1, 1, 1], num_res_blocks=1, attn_scales=[],
            temperal_downsample=[False, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4,
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
            base_dim=8, z_dim=4, dim_mult=[1, 1, 1], num_res_blocks=1, attn_scales=[],
            temperal_downsample=[False, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4,
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
            base_dim=8, decoder_base_dim=8, z_dim=4, dim_mult=[1, 1, 1], num_res_blocks=1, attn_scales=[],
            temperal_downsample=[False, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4,
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
            in_channels=3, out_channels=3, ch=8, ch_mult=[1, 2, 2], z_channels=4, double_z=True,
            num_res_blocks=1, regularizer="kl", is_causal=True,
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
            audio_channels=2, patch_size=4, encoder_channels=8, encoder_c_mults=(2,), encoder_strides=(2,),
            encoder_transformer_depths=(1,), latent_dim=8, use_differential_attention=differential, dim_heads=8,
            ff_mult=2, sliding_window=1,
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

CASES.append(
    ZooCase(
        name="AutoencoderRAE",
        # The encoder is a `transformers` vision model built from its config (here DINOv2 with
        # registers; one head of 64 = encoder_hidden_size / 64, which RAE fixes); 32 / 8 = 4x4
        # patches, decoded with patch 4 to 16x16.
        config=dict(
            encoder_type="dinov2", encoder_hidden_size=64, encoder_patch_size=8, encoder_num_hidden_layers=1,
            decoder_hidden_size=32, decoder_num_hidden_layers=1, decoder_num_attention_heads=4,
            decoder_intermediate_size=64, patch_size=4, encoder_input_size=32, num_channels=3,
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


NO_ATTENTION.update({
    "AutoencoderKLCogVideoX": "causal-conv 3D VAE: resnet mid-blocks (CogVideoXMidBlock3D), no attention module",
    "AutoencoderKLKVAE": "conv VAE: the encoder/decoder `attn` ModuleLists are always empty, mid-block is two resnets",
    "AutoencoderKLKVAEVideo": "causal-conv video VAE: `attn` ModuleLists always empty, mid-block is two resnets",
    "AutoencoderKLLTX2Video": "causal-conv video VAE: resnet/up/down blocks only, no attention module",
    "AutoencoderKLLTXVideo": "causal-conv video VAE: resnet/up/down blocks only, no attention module",
    "AutoencoderKLMagvit": "causal-conv video VAE (EasyAnimate): resnet mid-block, no attention module",
    "AutoencoderOobleck": "1-D conv audio VAE (Snake residual units), no attention module",
    "AutoencoderTiny": "EncoderTiny / DecoderTiny: conv blocks only, no attention module",
    "Cosmos3AVAEAudioTokenizer": "audio tokenizer: ConvNeXt spectrogram encoder and conv decoder, no attention module",
})


# --- Bria (Flux-like) ----------------------------------------------------------------------

def _random_ids(gen, tokens, axes=3, span=16.0):
    """(tokens, axes) random positions: the rotary angles they give are random too (as in
    diffusers' own tests of these models), never the identity."""
    return torch.rand(tokens, axes, generator=gen) * span


def _bria_inputs(model, gen):
    b, n_img, n_txt = 1, 16, 6
    return {
        "hidden_states": _rn(model, gen, b, n_img, 4),
        "encoder_hidden_states": _rn(model, gen, b, n_txt, 16),
        "timestep": _timestep(model, gen, b),
        "img_ids": _random_ids(gen, n_img).to(**_like(model)),
        "txt_ids": _random_ids(gen, n_txt).to(**_like(model)),
    }


CASES.append(
    _Case(
        name="BriaTransformer2DModel",
        gains=_time_gain(r"^time_embed\."),
        config=dict(
            patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=16, axes_dims_rope=[4, 6, 6],
        ),
        inputs=_bria_inputs,
        note=(
            "BriaAttention (AttentionModuleMixin) + BriaAttnProcessor -> dispatch_attention_fn, no mask: Flux layout "
            "(joint [text, image] with added projections and RMS qk-norm in double blocks, pre_only single blocks); "
            "image_rotary_emb (cos, sin) from txt_ids/img_ids"
        ),
    )
)

_FIBO = dict(
    patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
    joint_attention_dim=16, text_encoder_dim=8, axes_dims_rope=[4, 6, 6],
)


def _fibo_inputs(masked):
    def make(model, gen):
        b = 2 if masked else 1
        n_img, n_txt = 16, 6
        text = _rn(model, gen, b, n_txt, 16)
        out = {
            "hidden_states": _rn(model, gen, b, n_img, 4),
            "encoder_hidden_states": text,
            "text_encoder_layers": [_rn(model, gen, b, n_txt, 8) for _ in range(2)],
            "timestep": _timestep(model, gen, b),
            "img_ids": _random_ids(gen, n_img).to(**_like(model)),
            "txt_ids": _random_ids(gen, n_txt).to(**_like(model)),
        }
        if masked:
            # As the pipeline builds it: bool key padding over [text, image], (B, 1, 1, S).
            keep = torch.cat([_text_keep([6, 2], n_txt), torch.ones(b, n_img, dtype=torch.bool)], dim=1)
            out["joint_attention_kwargs"] = {"attention_mask": keep[:, None, None, :].to(model_param(model).device)}
        return out

    return make


_FIBO_NOTE = (
    "double blocks: BriaFiboAttention (AttentionModuleMixin) + BriaFiboAttnProcessor; single blocks: legacy "
    "Attention (pre_only, RMS qk-norm) + BriaAttnProcessor; both -> dispatch_attention_fn over [text, image] "
    "with image_rotary_emb from the ids; the pipeline's mask goes through joint_attention_kwargs['attention_mask']"
)
CASES.append(ZooCase(name="BriaFiboTransformer2DModel", config=_FIBO, inputs=_fibo_inputs(False), note=_FIBO_NOTE))
CASES.append(
    ZooCase(
        name="BriaFiboTransformer2DModel", variant="masked", config=_FIBO, inputs=_fibo_inputs(True),
        note=_FIBO_NOTE + "; batch 2: 6 and 2 valid text tokens, bool (B, 1, 1, S) key padding",
        extra={"mask_keys": ("joint_attention_kwargs",)},
    )
)

_FIBO2 = dict(
    in_channels=4, patch_size=2, dim=32, n_layers=2, n_refiner_layers=1, n_heads=2, cap_feat_dim=16,
    injection_layer_ids=(1,), perceiver_num_layers=1, min_num_gist_tokens=4, max_num_gist_tokens=8, gist_step=4,
    gist_min_text_len=2, gist_max_text_len=10, axes_dims=(4, 6, 6), axes_lens=(32, 16, 16),
)


def _fibo2_inputs(masked):
    def make(model, gen):
        b = 2 if masked else 1
        out = {
            "hidden_states": _rn(model, gen, b, 4, 8, 8),
            "timestep": torch.rand(b, generator=gen).to(**_like(model)),
            # the Perceiver's bundle, then one per injection block
            "encoder_hidden_states": _rn(model, gen, b, 2, 10, 16),
        }
        if masked:
            # 10 and 2 text tokens: 8 and 4 gist tokens, so the gist tokens are padded and
            # masked in the self-attention too.
            out["encoder_attention_mask"] = _text_keep([10, 2], 10).to(model_param(model).device)
        return out

    return make


_FIBO2_NOTE = (
    "BriaFibo2Attention (AttentionModuleMixin) + BriaFibo2AttnProcessor -> dispatch_attention_fn: self-attention "
    "with complex rotary freqs_cis (from ids, built inside) and RMS qk-norm; Perceiver cross- and self-attention "
    "over gist tokens; gated cross-attention to the text in injection blocks; masks: encoder_attention_mask (B, T) "
    "bool -> (B, 1, 1, T) for cross-attention, gist padding (B, 1, 1, S) bool for self-attention"
)
# cross_attn_gate is a zero-initialised scalar gate (tanh): random_init_ draws it at ~0.05,
# which would mute the injection cross-attention; at 1 its tanh is 0.76.
_FIBO2_GAINS = ((r"cross_attn_gate$", 20.0),)
CASES.append(_Case(name="BriaFibo2Transformer2DModel", config=_FIBO2, inputs=_fibo2_inputs(False),
                   note=_FIBO2_NOTE, gains=_FIBO2_GAINS))
CASES.append(
    _Case(
        name="BriaFibo2Transformer2DModel", variant="masked", config=_FIBO2, inputs=_fibo2_inputs(True),
        note=_FIBO2_NOTE + "; batch 2 with 10 and 2 text tokens (8 and 4 gist tokens)", gains=_FIBO2_GAINS,
        extra={"mask_keys": ("encoder_attention_mask",)},
    )
)


# --- Flux, Chroma and the Flux ControlNets ---------------------------------------------------

_FLUX = dict(
    patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
    joint_attention_dim=16, pooled_projection_dim=8, axes_dims_rope=(4, 6, 6),
)
_FLUX_NOTE = (
    "FluxAttention (AttentionModuleMixin) + FluxAttnProcessor -> dispatch_attention_fn: joint [text, image] with "
    "added projections and RMS qk-norm (double blocks), pre_only single blocks over the concatenation; "
    "image_rotary_emb (cos, sin) from txt_ids/img_ids; a mask only through joint_attention_kwargs['attention_mask']"
)


def _flux_inputs(masked, guidance=False, n_img=16, n_txt=6):
    def make(model, gen):
        b = 2 if masked else 1
        out = {
            "hidden_states": _rn(model, gen, b, n_img, 4),
            "encoder_hidden_states": _rn(model, gen, b, n_txt, 16),
            "pooled_projections": _rn(model, gen, b, 8),
            "timestep": torch.rand(b, generator=gen).to(**_like(model)),
            "img_ids": _random_ids(gen, n_img).to(**_like(model)),
            "txt_ids": _random_ids(gen, n_txt).to(**_like(model)),
        }
        if guidance:
            out["guidance"] = (1.0 + 4.0 * torch.rand(b, generator=gen)).to(**_like(model))
        if masked:
            keep = torch.cat([_text_keep([n_txt, 2], n_txt), torch.ones(b, n_img, dtype=torch.bool)], dim=1)
            out["joint_attention_kwargs"] = {"attention_mask": keep[:, None, None, :].to(model_param(model).device)}
        return out

    return make


_FLUX_GAINS = _time_gain(r"time_text_embed\.")
CASES.append(_Case(name="FluxTransformer2DModel", config=_FLUX, inputs=_flux_inputs(False), note=_FLUX_NOTE,
                   gains=_FLUX_GAINS))
CASES.append(
    _Case(
        name="FluxTransformer2DModel", variant="masked", config=dict(_FLUX, guidance_embeds=True), gains=_FLUX_GAINS,
        inputs=_flux_inputs(True, guidance=True),
        note=_FLUX_NOTE + "; guidance embedding; batch 2 with 6 and 2 valid text tokens, bool (B, 1, 1, S)",
        extra={"mask_keys": ("joint_attention_kwargs",)},
    )
)

_CHROMA = dict(
    patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
    joint_attention_dim=16, axes_dims_rope=(4, 6, 6), approximator_num_channels=16, approximator_hidden_dim=32,
    approximator_layers=1,
)


def _chroma_inputs(masked):
    def make(model, gen):
        b, n_img, n_txt = (2 if masked else 1), 16, 6
        out = {
            "hidden_states": _rn(model, gen, b, n_img, 4),
            "encoder_hidden_states": _rn(model, gen, b, n_txt, 16),
            "timestep": torch.rand(b, generator=gen).to(**_like(model)),
            "img_ids": _random_ids(gen, n_img).to(**_like(model)),
            "txt_ids": _random_ids(gen, n_txt).to(**_like(model)),
        }
        if masked:
            # As ChromaPipeline builds it: text tokens valid up to and including the first
            # padding token, in the model's float dtype, then the image tokens (bool ones)
            # concatenated: the result is float 0/1 of shape (B, text + image).
            text = (torch.arange(n_txt)[None, :] <= torch.tensor([[n_txt - 1], [2]])).to(**_like(model))
            out["attention_mask"] = torch.cat([text, torch.ones(b, n_img, dtype=torch.bool)], dim=1)
        return out

    return make


_CHROMA_NOTE = (
    "FluxAttention + FluxAttnProcessor -> dispatch_attention_fn (Flux layout, pruned adaLN from an approximator); "
    "attention_mask (B, S) is expanded per block to a pairwise (B, 1, S, S) product and passed as is: the "
    "pipeline's mask is float 0/1, which SDPA adds to the scores (+1 on kept pairs) rather than masking"
)
CASES.append(ZooCase(name="ChromaTransformer2DModel", config=_CHROMA, inputs=_chroma_inputs(False), note=_CHROMA_NOTE))
CASES.append(
    ZooCase(
        name="ChromaTransformer2DModel", variant="masked", config=_CHROMA, inputs=_chroma_inputs(True),
        note=_CHROMA_NOTE + "; batch 2 with 6 and 3 text tokens kept (the pipeline's float mask)",
        extra={"mask_keys": ("attention_mask",)},
    )
)

_FLUX_CN = dict(_FLUX, num_mode=None)


def _flux_cn_outputs(out):
    # FluxControlNetModel returns FluxControlNetOutput, FluxMultiControlNetModel a tuple.
    blocks, singles = (out.controlnet_block_samples, out.controlnet_single_block_samples) if hasattr(
        out, "controlnet_block_samples") else out
    return (*blocks, *singles)


def _flux_cn_inputs(model, gen):
    out = _flux_inputs(False)(model, gen)
    out["controlnet_cond"] = _rn(model, gen, 1, 16, 4)
    out["conditioning_scale"] = 0.7
    return out


CASES.append(
    _Case(
        name="FluxControlNetModel", config=_FLUX_CN, inputs=_flux_cn_inputs, outputs=_flux_cn_outputs,
        gains=_FLUX_GAINS,
        note=(
            "FluxAttention + FluxAttnProcessor -> dispatch_attention_fn (Flux blocks); joint_attention_kwargs is "
            "not passed to the blocks, so no mask reaches the attention; outputs: every block's residual"
        ),
        extra={"out_shape": (1, 16, 32)},
    )
)


def _flux_multi_make(config):
    import diffusers

    return diffusers.FluxMultiControlNetModel([diffusers.FluxControlNetModel(**config)])


def _flux_multi_inputs(model, gen):
    out = _flux_inputs(False)(model, gen)
    out["controlnet_cond"] = [_rn(model, gen, 1, 16, 4), _rn(model, gen, 1, 16, 4)]
    out["controlnet_mode"] = [torch.tensor([0]), torch.tensor([2])]
    out["conditioning_scale"] = [0.7, 0.4]
    # As the pipelines call it: with return_dict=True the wrapper unpacks each ControlNet's
    # output dataclass into its field names.
    out["return_dict"] = False
    return out


CASES.append(
    _Case(
        name="FluxMultiControlNetModel", config=dict(_FLUX, num_mode=3), make=_flux_multi_make, gains=_FLUX_GAINS,
        inputs=_flux_multi_inputs, outputs=_flux_cn_outputs,
        note=(
            "wraps one FluxControlNetModel (ControlNet-Union, num_mode=3) run once per condition; the mode "
            "embedding is prepended to the text tokens; FluxAttention + FluxAttnProcessor -> dispatch_attention_fn"
        ),
        extra={"out_shape": (1, 16, 32)},
    )
)


# --- Flux2 ---------------------------------------------------------------------------------

_FLUX2 = dict(
    patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
    joint_attention_dim=16, timestep_guidance_channels=32, mlp_ratio=2.0, axes_dims_rope=(4, 4, 4, 4),
    guidance_embeds=True,
)
_FLUX2_NOTE = (
    "double blocks: Flux2Attention (AttentionModuleMixin) + Flux2AttnProcessor; single blocks: "
    "Flux2ParallelSelfAttention + Flux2ParallelSelfAttnProcessor (fused qkv+MLP in); both -> dispatch_attention_fn "
    "over [text, image] with RMS qk-norm and image_rotary_emb (cos, sin) from 4-axis txt_ids/img_ids; a mask only "
    "through joint_attention_kwargs['attention_mask']"
)


def _flux2_inputs(masked=False, n_ref=0, cache=False, lengths=(6, 2)):
    def make(model, gen):
        b, n_img, n_txt = (2 if masked else 1), 16, 6
        n_all = n_img + n_ref
        out = {
            "hidden_states": _rn(model, gen, b, n_all, 4),
            "encoder_hidden_states": _rn(model, gen, b, n_txt, 16),
            "timestep": torch.rand(b, generator=gen).to(**_like(model)),
            "guidance": (1.0 + 4.0 * torch.rand(b, generator=gen)).to(**_like(model)),
            "img_ids": _random_ids(gen, n_all, axes=4).to(**_like(model)),
            "txt_ids": _random_ids(gen, n_txt, axes=4).to(**_like(model)),
        }
        if masked:
            # 2-D bool key padding over [text, image].
            keep = torch.cat([_text_keep(lengths, n_txt), torch.ones(b, n_img, dtype=torch.bool)], dim=1)
            out["joint_attention_kwargs"] = {"attention_mask": keep.to(model_param(model).device)}
        if n_ref:
            out.update(kv_cache_mode="extract", num_ref_tokens=n_ref, ref_fixed_timestep=0.0)
        if cache:
            # Reference-image keys/values cached by an earlier "extract" step: random here,
            # (batch, ref tokens, heads, head_dim) per layer.
            from diffusers.models.transformers.transformer_flux2 import Flux2KVCache

            heads, d = model.config.num_attention_heads, model.config.attention_head_dim
            kv = Flux2KVCache(model.config.num_layers, model.config.num_single_layers)
            kv.num_ref_tokens = 8
            for layer in kv.double_block_caches + kv.single_block_caches:
                layer.store(_rn(model, gen, b, 8, heads, d), _rn(model, gen, b, 8, heads, d))
            out.update(kv_cache=kv, kv_cache_mode="cached")
        return out

    return make


def _flux2_kv_processors(model):
    # What Flux2KleinKVPipeline does before its first step.
    from diffusers.models.transformers.transformer_flux2 import (
        Flux2KVAttnProcessor,
        Flux2KVParallelSelfAttnProcessor,
    )

    for block in model.transformer_blocks:
        block.attn.set_processor(Flux2KVAttnProcessor())
    for block in model.single_transformer_blocks:
        block.attn.set_processor(Flux2KVParallelSelfAttnProcessor())


_FLUX2_GAINS = _time_gain(r"^time_guidance_embed\.")
CASES.append(_Case(name="Flux2Transformer2DModel", config=_FLUX2, inputs=_flux2_inputs(), note=_FLUX2_NOTE,
                   gains=_FLUX2_GAINS))
CASES.append(
    _Case(
        name="Flux2Transformer2DModel", variant="masked", config=_FLUX2, inputs=_flux2_inputs(masked=True),
        gains=_FLUX2_GAINS,
        note=_FLUX2_NOTE + "; batch 2 with 6 and 2 valid text tokens, 2-D bool (B, S) key padding",
        extra={"mask_keys": ("joint_attention_kwargs",)},
    )
)
CASES.append(
    _Case(
        name="Flux2Transformer2DModel", variant="fullpad", config=_FLUX2, gains=_FLUX2_GAINS,
        inputs=_flux2_inputs(masked=True, lengths=(6, 0)),
        note=_FLUX2_NOTE + "; batch 2, the second with no valid text token (2-D bool key padding): its text keys "
        "are all masked, the image keys remain",
    )
)
CASES.append(
    _Case(
        name="Flux2Transformer2DModel", variant="kvextract", config=_FLUX2, inputs=_flux2_inputs(n_ref=8),
        gains=_FLUX2_GAINS,
        setup=_flux2_kv_processors,
        note=(
            "Flux2KVAttnProcessor / Flux2KVParallelSelfAttnProcessor (Klein KV pipeline), kv_cache_mode='extract' "
            "with 8 reference tokens: two dispatch_attention_fn calls per module (text+image queries over all keys; "
            "reference queries over reference keys only), no mask, parallel_config not passed"
        ),
        extra={"out_shape": (1, 16, 4)},  # the reference tokens are not predicted
    )
)
CASES.append(
    _Case(
        name="Flux2Transformer2DModel", variant="kvcached", config=_FLUX2, inputs=_flux2_inputs(cache=True),
        gains=_FLUX2_GAINS,
        setup=_flux2_kv_processors,
        note=(
            "Flux2KV processors, kv_cache_mode='cached': 8 cached reference keys/values (random) inserted between "
            "the text and image keys, one dispatch_attention_fn call without mask"
        ),
    )
)


# --- Flux3 ---------------------------------------------------------------------------------

def _flux3_inputs(model, gen):
    b, n_img, n_cond, n_txt = 1, 16, 16, 12
    return {
        "hidden_states": _rn(model, gen, b, n_img, 4),
        "encoder_hidden_states": _rn(model, gen, b, n_txt, 16),
        "timestep": torch.rand(b, generator=gen).to(**_like(model)),
        "img_ids": _random_ids(gen, n_img, axes=4).to(**_like(model)),
        "txt_ids": _random_ids(gen, n_txt, axes=4).to(**_like(model)),
        # Reference-image tokens (image-to-image): their per-mode blocks only run with them.
        "image_cond_hidden_states": _rn(model, gen, b, n_cond, 4),
        "image_cond_ids": _random_ids(gen, n_cond, axes=4).to(**_like(model)),
    }


CASES.append(
    _Case(
        name="Flux3Transformer2DModel",
        # timestep embedding at unit scale; the text and reference-image streams' input
        # projections x0.25 and the per-mode attention outputs x4: at the default scale a
        # per-mode block barely changes its stream, and its attention would barely show.
        gains=(
            (r"^timestep_embedder\.linear_2\.", 10.0),
            (r"mode_blocks\.(\w+\.)?\d+\.attn\.to_out\.0\.weight", 4.0),
            (r"^context_embedder\.", 0.25),
            (r"^x_embedders\.image_cond\.", 0.25),
        ),
        config=dict(
            in_channels=4, cond_in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=16, timestep_channels=32, mlp_ratio=2.0,
            axes_dims_rope=(4, 4, 4, 4),
        ),
        inputs=_flux3_inputs,
        note=(
            "Flux3Attention (AttentionModuleMixin) + Flux3AttnProcessor -> dispatch_attention_fn, never a mask: "
            "per-mode self-attention (text / image / reference image) then joint single blocks over [text, image, "
            "reference]; fp32 RMS qk-norm, image_rotary_emb (cos, sin) from 4-axis ids"
        ),
    )
)


# --- ChronoEdit (Wan layout) ----------------------------------------------------------------

_CHRONO = dict(
    patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4, text_dim=16,
    freq_dim=16, ffn_dim=32, num_layers=1, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
    rope_max_seq_len=32,
)
_CHRONO_NOTE = (
    "WanAttention (AttentionModuleMixin, ChronoEdit's copy) + WanAttnProcessor -> dispatch_attention_fn, no mask: "
    "self-attention with real-valued interleaved rotary (cos, sin) built inside (2 frames: temporal positions "
    "0 and temporal_skip_len-1), RMS qk-norm across heads; cross-attention to the text"
)


def _chrono_inputs(i2v):
    def make(model, gen):
        out = {
            "hidden_states": _rn(model, gen, 1, 4, 2, 8, 8),
            "timestep": _timestep(model, gen, 1),
            # The I2V processor splits the context at len - 512: the text is 512 tokens there.
            "encoder_hidden_states": _rn(model, gen, 1, 512 if i2v else 7, 16),
        }
        if i2v:
            out["encoder_hidden_states_image"] = _rn(model, gen, 1, 5, 12)
        return out

    return make


CASES.append(ZooCase(name="ChronoEditTransformer3DModel", config=_CHRONO, inputs=_chrono_inputs(False),
                     note=_CHRONO_NOTE))
CASES.append(
    ZooCase(
        name="ChronoEditTransformer3DModel", variant="i2v",
        config=dict(_CHRONO, image_dim=12, added_kv_proj_dim=24), inputs=_chrono_inputs(True),
        note=_CHRONO_NOTE + "; I2V: the image tokens (context[:, :-512]) go through add_k/add_v and a second "
        "dispatch_attention_fn call (no mask, parallel_config=None), summed with the text attention",
    )
)


# --- CogVideoX, CogView3Plus, CogView4, ConsisID ---------------------------------------------

_COGVIDEOX = dict(
    num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=8,
    text_embed_dim=16, num_layers=1, sample_width=8, sample_height=8, sample_frames=5, patch_size=2,
    temporal_compression_ratio=4, max_text_seq_length=8,
)


def _cogvideox_inputs(rotary):
    def make(model, gen):
        out = {
            "hidden_states": _rn(model, gen, 1, 2, 4, 8, 8),
            "encoder_hidden_states": _rn(model, gen, 1, 8, 16),
            "timestep": _timestep(model, gen, 1),
        }
        if rotary:
            # (cos, sin) over the 2 x 4 x 4 video tokens, interleaved pairs as
            # get_3d_rotary_pos_embed gives them to apply_rotary_emb.
            out["image_rotary_emb"] = random_angles_rotary(gen, 32, 16, **_like(model))
        return out

    return make


_COGVIDEOX_NOTE = (
    "Attention + CogVideoXAttnProcessor2_0 -> F.scaled_dot_product_attention, no mask: one self-attention over "
    "[text, video] with LayerNorm qk-norm, split back into (video, text) outputs"
)
CASES.append(
    ZooCase(
        name="CogVideoXTransformer3DModel", config=dict(_COGVIDEOX, use_rotary_positional_embeddings=True),
        inputs=_cogvideox_inputs(True),
        note=_COGVIDEOX_NOTE + "; image_rotary_emb (cos, sin) forward input, applied to the video queries and keys "
        "only (CogVideoX-5B)",
        extra={"rotary_keys": ("image_rotary_emb",)},
    )
)
CASES.append(
    ZooCase(
        name="CogVideoXTransformer3DModel", variant="sincos", config=_COGVIDEOX, inputs=_cogvideox_inputs(False),
        note=_COGVIDEOX_NOTE + "; sin-cos positional embedding added to the tokens, no rotary (CogVideoX-2B)",
    )
)


def _cogview_sizes(model, gen, b):
    sizes = (torch.tensor([[16.0, 16.0]]).repeat(b, 1) * (1 + torch.rand(b, 1, generator=gen))).to(**_like(model))
    return {"original_size": sizes, "target_size": sizes.flip(-1), "crop_coords": torch.zeros(b, 2).to(**_like(model))}


CASES.append(
    ZooCase(
        name="CogView3PlusTransformer2DModel",
        config=dict(
            patch_size=2, in_channels=4, num_layers=1, attention_head_dim=16, num_attention_heads=2, out_channels=4,
            text_embed_dim=16, time_embed_dim=8, condition_dim=4, pos_embed_max_size=8, sample_size=8,
        ),
        inputs=lambda model, gen: {
            "hidden_states": _rn(model, gen, 1, 4, 8, 8),
            "encoder_hidden_states": _rn(model, gen, 1, 6, 16),
            "timestep": _timestep(model, gen, 1),
            **_cogview_sizes(model, gen, 1),
        },
        note=(
            "Attention + CogVideoXAttnProcessor2_0 -> F.scaled_dot_product_attention, no mask, no rotary (sin-cos "
            "positions added): self-attention over [text, image] with LayerNorm qk-norm (no affine)"
        ),
    )
)

_COGVIEW4 = dict(
    patch_size=2, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=16, num_attention_heads=2,
    text_embed_dim=16, time_embed_dim=8, condition_dim=4, pos_embed_max_size=8, sample_size=8, rope_axes_dim=(8, 8),
)


def _cogview4_inputs(masked):
    def make(model, gen):
        b = 2 if masked else 1
        out = {
            "hidden_states": _rn(model, gen, b, 4, 8, 8),
            "encoder_hidden_states": _rn(model, gen, b, 12, 16),
            "timestep": _timestep(model, gen, b),
            **_cogview_sizes(model, gen, b),
            # (cos, sin) over the 4 x 4 image tokens, rotate-half layout (use_real_unbind_dim=-2).
            "image_rotary_emb": _rope_halves(gen, 16, 16, **_like(model)),
        }
        if masked:
            out["attention_mask"] = _text_keep([12, 2], 12).long().to(model_param(model).device)
        return out

    return make


_COGVIEW4_NOTE = (
    "Attention + CogView4AttnProcessor -> F.scaled_dot_product_attention: self-attention over [text, image], "
    "LayerNorm qk-norm, image_rotary_emb (cos, sin) on the image tokens (forward input, or built inside); "
    "attention_mask (B, T) text mask -> pairwise (B, 1, S, S) cast to the query dtype: a float 0/1 mask that SDPA "
    "adds to the scores rather than masking"
)
CASES.append(
    ZooCase(
        name="CogView4Transformer2DModel", config=_COGVIEW4, inputs=_cogview4_inputs(False), note=_COGVIEW4_NOTE,
        extra={"rotary_keys": ("image_rotary_emb",)},
    )
)
CASES.append(
    ZooCase(
        name="CogView4Transformer2DModel", variant="masked", config=_COGVIEW4, inputs=_cogview4_inputs(True),
        note=_COGVIEW4_NOTE + "; batch 2 with 12 and 2 valid text tokens (many padded: the float mask only "
        "down-weights them by e^-1)",
        extra={"mask_keys": ("attention_mask",), "rotary_keys": ("image_rotary_emb",)},
    )
)


def _consisid_inputs(model, gen):
    return {
        "hidden_states": _rn(model, gen, 1, 2, 4, 8, 8),
        "encoder_hidden_states": _rn(model, gen, 1, 8, 16),
        "timestep": _timestep(model, gen, 1),
        "image_rotary_emb": random_angles_rotary(gen, 32, 24, **_like(model)),
        "id_cond": _rn(model, gen, 1, 8),
        "id_vit_hidden": [_rn(model, gen, 1, 5, 16) for _ in range(2)],
    }


CASES.append(
    ZooCase(
        name="ConsisIDTransformer3DModel",
        config=dict(
            # the face cross-attention reads LFE_output_dim = 2/3 of the inner dim (2048 of 3072)
            num_attention_heads=2, attention_head_dim=24, in_channels=4, out_channels=4, time_embed_dim=8,
            text_embed_dim=16, num_layers=2, sample_width=8, sample_height=8, sample_frames=5, patch_size=2,
            temporal_compression_ratio=4, max_text_seq_length=8, use_rotary_positional_embeddings=True,
            is_train_face=True, is_kps=False, cross_attn_interval=1, cross_attn_dim_head=8, cross_attn_num_heads=2,
            LFE_id_dim=8, LFE_vit_dim=16, LFE_depth=2, LFE_dim_head=8, LFE_num_heads=2, LFE_num_id_token=2,
            LFE_num_querie=4, LFE_output_dim=32, LFE_ff_mult=1, LFE_num_scale=2,
        ),
        inputs=_consisid_inputs,
        note=(
            "CogVideoX blocks: Attention + CogVideoXAttnProcessor2_0 -> F.scaled_dot_product_attention over "
            "[text, video] with image_rotary_emb on the video tokens; face path outside diffusers' processors: "
            "PerceiverAttention (LocalFacialExtractor) and PerceiverCrossAttention (video -> face tokens) compute "
            "softmax(q k^T) v themselves (fp32 softmax, scale split as d**-0.25 on q and k), no mask"
        ),
        extra={"rotary_keys": ("image_rotary_emb",)},
    )
)


# --- UNet ControlNets ----------------------------------------------------------------------

_SD_CONTROLNET = dict(
    in_channels=4, conditioning_channels=3, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=8, cross_attention_dim=16,
    attention_head_dim=2, conditioning_embedding_out_channels=(8, 16),
)
_UNET_ATTENTION_NOTE = (
    "Attention (BasicTransformerBlock of Transformer2DModel in the cross-attention down/mid blocks: attn1 "
    "self-attention over H*W, attn2 cross-attention to the text) + AttnProcessor2_0 -> "
    "F.scaled_dot_product_attention"
)


def _controlnet_outputs(out):
    samples, mid = (out.down_block_res_samples, out.mid_block_res_sample) if hasattr(
        out, "down_block_res_samples") else out
    return (*samples, mid)


CASES.append(
    ZooCase(
        name="ControlNetModel", config=_SD_CONTROLNET,
        inputs=lambda model, gen: {
            "sample": _rn(model, gen, 1, 4, 8, 8),
            "timestep": _timestep(model, gen, 1),
            "encoder_hidden_states": _rn(model, gen, 1, 7, 16),
            "controlnet_cond": _rn(model, gen, 1, 3, 16, 16),
            "conditioning_scale": 0.8,
        },
        outputs=_controlnet_outputs,
        note=_UNET_ATTENTION_NOTE + "; no encoder mask in the forward; outputs: every down and mid residual",
        extra={"out_shape": (1, 32, 8, 8)},
    )
)


def _controlnet_union_inputs(model, gen):
    b = 2  # see the note: the task transformer attends across the batch
    return {
        "sample": _rn(model, gen, b, 4, 8, 8),
        "timestep": _timestep(model, gen, b),
        "encoder_hidden_states": _rn(model, gen, b, 7, 16),
        "controlnet_cond": [_rn(model, gen, b, 3, 16, 16), _rn(model, gen, b, 3, 16, 16)],
        "control_type": torch.tensor([[1, 0, 1]] * b).to(**_like(model)),
        "control_type_idx": [0, 2],
        "conditioning_scale": [0.8, 0.6],
        "added_cond_kwargs": {"text_embeds": _rn(model, gen, b, 8), "time_ids": _rn(model, gen, b, 6)},
    }


CASES.append(
    ZooCase(
        name="ControlNetUnionModel",
        config=dict(
            _SD_CONTROLNET, addition_embed_type="text_time", addition_time_embed_dim=8,
            projection_class_embeddings_input_dim=8 + 6 * 8, num_control_type=3, num_trans_channel=32,
            num_trans_head=2, num_trans_layer=1, num_proj_channel=32,
        ),
        inputs=_controlnet_union_inputs,
        outputs=_controlnet_outputs,
        note=(
            _UNET_ATTENTION_NOTE + "; plus the task transformer: ResidualAttentionBlock with torch "
            "nn.MultiheadAttention (not a diffusers module, no processor) fed (B, conditions+1, C) although it is "
            "sequence-first: it attends across the batch (trivial with batch 1; batch 2 here, as with CFG)"
        ),
        extra={"out_shape": (2, 32, 8, 8)},
    )
)


def _controlnet_xs_make(config):
    # A ControlNetXSAdapter has no forward of its own (it raises): its attention runs inside the
    # UNetControlNetXSModel that joins it to a UNet, as every ControlNet-XS pipeline builds it.
    import diffusers

    unet = diffusers.UNet2DConditionModel(**config)
    adapter = diffusers.ControlNetXSAdapter.from_unet(unet, size_ratio=0.5, conditioning_embedding_out_channels=(8, 8))
    return diffusers.UNetControlNetXSModel.from_unet(unet, adapter)


CASES.append(
    _Case(
        name="ControlNetXSAdapter",
        # ControlNet-XS' zero-initialised control-to-base connections x4: at the default scale
        # the control branch (and its attention) barely reaches the base UNet.
        gains=((r"ctrl_to_base\.weight", 4.0),),
        config=dict(
            # ControlNet-XS blocks assume two layers per block (as SD), so layers_per_block=2.
            block_out_channels=(32, 64), layers_per_block=2, sample_size=8, in_channels=4, out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            cross_attention_dim=16, attention_head_dim=2, norm_num_groups=8, use_linear_projection=True,
        ),
        make=_controlnet_xs_make,
        inputs=lambda model, gen: {
            "sample": _rn(model, gen, 1, 4, 8, 8),
            "timestep": _timestep(model, gen, 1),
            "encoder_hidden_states": _rn(model, gen, 1, 7, 16),
            "controlnet_cond": _rn(model, gen, 1, 3, 16, 16),
            "conditioning_scale": 0.8,
        },
        note=(
            "built as UNetControlNetXSModel.from_unet(unet, adapter) (the adapter alone cannot run): "
            + _UNET_ATTENTION_NOTE + " in the base UNet and the adapter's (narrower) control blocks"
        ),
        extra={"shape_like": "sample"},
    )
)


# --- Cosmos3 Omni, Cosmos (Predict) and its ControlNet ----------------------------------------

def _cosmos3_inputs(model, gen):
    # A packed sequence: 6 causal text ("understanding") tokens, then 2 x 2 x 2 vision tokens
    # (the generation stream); mRoPE positions (t, h, w) random.
    und, t, h, w = 6, 2, 2, 2
    n_vis = t * h * w
    seq = und + n_vis
    vis = torch.arange(und, seq)
    dev = model_param(model).device
    return {
        "input_ids": torch.randint(0, 32, (und,), generator=gen).to(dev),
        "text_indexes": torch.arange(und).to(dev),
        "position_ids": torch.randint(0, 64, (3, seq), generator=gen).to(dev),
        "und_len": und,
        "sequence_length": seq,
        "vision_tokens": [_rn(model, gen, 1, 4, t, h, w)],
        "vision_token_shapes": [(t, h, w)],
        "vision_sequence_indexes": vis.to(dev),
        "vision_mse_loss_indexes": vis.to(dev),
        "vision_timesteps": torch.rand(n_vis, generator=gen).to(**_like(model)),
        "vision_noisy_frame_indexes": [torch.arange(t).to(dev)],
    }


CASES.append(
    ZooCase(
        name="Cosmos3OmniTransformer",
        config=dict(
            head_dim=16, hidden_size=32, intermediate_size=64, latent_channel=4, latent_patch_size=1,
            num_attention_heads=2, num_hidden_layers=2, num_key_value_heads=1, patch_latent_dim=4,
            rope_axes_dim=[2, 3, 3], rope_theta=10000.0, vocab_size=32,
        ),
        inputs=_cosmos3_inputs,
        outputs=lambda out: tuple(out.sample),
        note=(
            "Cosmos3PackedMoTAttention (AttentionModuleMixin) + Cosmos3AttnProcessor: two dispatch_attention_fn "
            "calls on an unbatched packed sequence (batch 1): text queries over text keys with is_causal=True, and "
            "vision queries over [text, vision] keys (non-causal); GQA (enable_gqa=True, 2 q / 1 kv heads), RMS "
            "qk-norm, interleaved 3-axis mRoPE (rotate-half) from position_ids, no mask"
        ),
        extra={"out_shape": (1, 4, 2, 2, 2)},
    )
)

_COSMOS = dict(
    in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=12, num_layers=1, mlp_ratio=2.0,
    text_embed_dim=16, adaln_lora_dim=8, max_size=(4, 16, 16), patch_size=(1, 2, 2),
    # The real configs concatenate a padding mask resized with torchvision, which `make setup`
    # does not install; the attention is the same without it.
    concat_padding_mask=False, extra_pos_embed_type="learnable",
)
_COSMOS_NOTE = (
    "Attention + CosmosAttnProcessor2_0 -> dispatch_attention_fn *without* backend= (only the process-wide "
    "backend applies: set_attention_backend does nothing): self-attention with RMS qk-norm and rotate-half "
    "rotary (cos, sin) built inside, K/V repeat_interleave'd for GQA before the call; cross-attention to the text"
)


def _cosmos_inputs(masked=False, img_context=False, lengths=(7, 3)):
    def make(model, gen):
        b = 2 if masked else 1
        text = _rn(model, gen, b, 7, 16)
        out = {
            "hidden_states": _rn(model, gen, b, 4, 2, 8, 8),
            "timestep": _timestep(model, gen, b),
            "encoder_hidden_states": (text, _rn(model, gen, b, 4, 8)) if img_context else text,
            "fps": 24,
        }
        if masked:
            out["attention_mask"] = _text_keep(lengths, 7).to(model_param(model).device)
        return out

    return make


CASES.append(ZooCase(name="CosmosTransformer3DModel", config=_COSMOS, inputs=_cosmos_inputs(), note=_COSMOS_NOTE))
CASES.append(
    ZooCase(
        name="CosmosTransformer3DModel", variant="masked", config=_COSMOS, inputs=_cosmos_inputs(masked=True),
        note=_COSMOS_NOTE + "; attention_mask (B, T) bool -> (B, 1, 1, T) for the cross-attention; batch 2 with 7 "
        "and 3 valid text tokens",
        extra={"mask_keys": ("attention_mask",)},
    )
)
CASES.append(
    ZooCase(
        name="CosmosTransformer3DModel", variant="fullpad", config=_COSMOS,
        inputs=_cosmos_inputs(masked=True, lengths=(7, 0)),
        note=_COSMOS_NOTE + "; batch 2, the second with no valid text token: its cross-attention rows are fully "
        "masked (zeros from SDPA)",
    )
)
CASES.append(
    ZooCase(
        name="CosmosTransformer3DModel", variant="imgctx",
        config=dict(_COSMOS, extra_pos_embed_type=None, img_context_dim_in=8, img_context_num_tokens=4,
                    img_context_dim_out=24),
        inputs=_cosmos_inputs(img_context=True),
        note=_COSMOS_NOTE + "; Cosmos 2.5: cross-attention is CosmosAttention + CosmosAttnProcessor2_5 with "
        "encoder_hidden_states = (text, image context): two dispatch calls (text; image tokens through "
        "q_img/k_img/v_img with their own RMS norms) summed (a tensor attention_mask crashes this path: "
        "`if attention_mask` on a tensor)",
    )
)


def _cosmos_controlnet_inputs(model, gen):
    return {
        "controls_latents": _rn(model, gen, 1, 4, 2, 8, 8),
        "latents": _rn(model, gen, 1, 4, 2, 8, 8),
        "timestep": _timestep(model, gen, 1),
        "encoder_hidden_states": (_rn(model, gen, 1, 7, 16), _rn(model, gen, 1, 4, 8)),
        "condition_mask": (torch.rand(1, 1, 2, 8, 8, generator=gen) > 0.5).to(**_like(model)),
        "padding_mask": torch.zeros(1, 1, 8, 8).to(**_like(model)),
        "conditioning_scale": 0.8,
        "fps": 24,
    }


CASES.append(
    ZooCase(
        name="CosmosControlNetModel",
        # controls: 4 channels + condition mask + padding mask; base latents the same
        config=dict(
            n_controlnet_blocks=2, in_channels=6, latent_channels=6, model_channels=24, num_attention_heads=2,
            attention_head_dim=12, mlp_ratio=2.0, text_embed_dim=16, adaln_lora_dim=8, patch_size=(1, 2, 2),
            max_size=(4, 16, 16), img_context_dim_in=8, img_context_dim_out=24,
        ),
        inputs=_cosmos_controlnet_inputs,
        outputs=lambda out: tuple(out.control_block_samples),
        note=(
            "CosmosTransformerBlocks (Transfer 2.5): self-attention Attention + CosmosAttnProcessor2_0, "
            "cross-attention CosmosAttention + CosmosAttnProcessor2_5 over (text, image context); dispatch without "
            "backend=; the forward resizes padding_mask with torchvision (required)"
        ),
        extra={"out_shape": (1, 32, 24), "requires": ("torchvision",)},
    )
)


# --- DiT, DreamLite ------------------------------------------------------------------------

CASES.append(
    ZooCase(
        name="DiTTransformer2DModel",
        config=dict(
            num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, num_layers=2,
            sample_size=8, patch_size=2, num_embeds_ada_norm=10,
        ),
        inputs=lambda model, gen: {
            "hidden_states": _rn(model, gen, 1, 4, 8, 8),
            "timestep": _timestep(model, gen, 1),
            "class_labels": torch.randint(0, 10, (1,), generator=gen).to(model_param(model).device),
        },
        note=(
            "Attention (BasicTransformerBlock, ada_norm_zero, self-attention only) + AttnProcessor2_0 -> "
            "F.scaled_dot_product_attention, no mask; the model has no set_attn_processor"
        ),
        extra={"out_shape": (1, 4, 8, 8)},
    )
)

_DREAMLITE_T = dict(
    num_attention_heads=2, attention_head_dim=16, in_channels=32, num_layers=1, norm_num_groups=8,
    cross_attention_dim=16, qk_norm="rms_norm", ff_mult=2,
)


def _dreamlite_t_inputs(masked):
    def make(model, gen):
        b = 2 if masked else 1
        out = {
            "hidden_states": _rn(model, gen, b, 32, 4, 4),
            "encoder_hidden_states": _rn(model, gen, b, 7, 16),
        }
        if masked:
            out["encoder_attention_mask"] = _text_keep([7, 3], 7).long().to(model_param(model).device)
        return out

    return make


def _dreamlite_processors(model):
    # What DreamLiteUNetModel installs on every Attention: the standalone class keeps
    # Attention's default AttnProcessor2_0, which fails with num_kv_heads < heads.
    from diffusers.models.attention_processor import Attention
    from diffusers.models.unets.unet_dreamlite import DreamLiteAttnProcessor2_0

    for module in model.modules():
        if isinstance(module, Attention):
            module.set_processor(DreamLiteAttnProcessor2_0())


_DREAMLITE_T_NOTE = (
    "Attention (BasicTransformerBlockDreamLite: self- and cross-attention, RMS qk-norm) + AttnProcessor2_0 -> "
    "F.scaled_dot_product_attention (Attention's default: the standalone class installs no processor); "
    "2-D masks are turned into bool (not additive) masks"
)
CASES.append(
    ZooCase(name="DreamLiteTransformer2DModel", config=_DREAMLITE_T, inputs=_dreamlite_t_inputs(False),
            note=_DREAMLITE_T_NOTE, extra={"shape_like": "hidden_states"})
)
CASES.append(
    ZooCase(
        name="DreamLiteTransformer2DModel", variant="masked", config=_DREAMLITE_T, inputs=_dreamlite_t_inputs(True),
        note=_DREAMLITE_T_NOTE + "; encoder_attention_mask (B, T) -> bool, batch 2 with 7 and 3 valid tokens",
        extra={"shape_like": "hidden_states", "mask_keys": ("encoder_attention_mask",)},
    )
)
CASES.append(
    _Case(
        name="DreamLiteTransformer2DModel", variant="gqa", config=dict(_DREAMLITE_T, num_kv_heads=1),
        inputs=_dreamlite_t_inputs(False), setup=_dreamlite_processors,
        note=(
            "as inside DreamLiteUNetModel: one K/V head (kv_heads=1) and DreamLiteAttnProcessor2_0 -> "
            "dispatch_attention_fn with K/V repeat_interleave'd to the query heads (no enable_gqa), RMS qk-norm"
        ),
        extra={"shape_like": "hidden_states"},
    )
)

_DREAMLITE_UNET = dict(
    sample_size=8, in_channels=4, out_channels=4,
    down_block_types=("DreamLiteCrossAttnNoSelfAttnDownBlock2D", "DreamLiteCrossAttnDownBlock2D"),
    up_block_types=("DreamLiteCrossAttnUpBlock2D", "DreamLiteCrossAttnNoSelfAttnUpBlock2D"),
    block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=8, cross_attention_dim=16,
    attention_head_dim=(2, 4), ff_mult=2, num_kv_heads=1, qk_norm="rms_norm",
)


def _dreamlite_unet_inputs(masked, lengths=(7, 3)):
    def make(model, gen):
        b = 2 if masked else 1
        out = {
            "sample": _rn(model, gen, b, 4, 8, 8),
            "timestep": _timestep(model, gen, b),
            "encoder_hidden_states": _rn(model, gen, b, 7, 16),
        }
        if masked:
            out["encoder_attention_mask"] = _text_keep(lengths, 7).long().to(model_param(model).device)
        return out

    return make


_DREAMLITE_UNET_NOTE = (
    "Attention in DreamLiteTransformer2DModel blocks (self+cross in CrossAttn blocks, cross only in "
    "NoSelfAttn blocks and the mid-block) with DreamLiteAttnProcessor2_0 installed on every Attention -> "
    "dispatch_attention_fn; MQA (kv_heads=1) by K/V repeat_interleave, RMS qk-norm; the UNet's "
    "encoder_attention_mask becomes an additive -10000 bias (B, 1, T)"
)
CASES.append(
    ZooCase(name="DreamLiteUNetModel", config=_DREAMLITE_UNET, inputs=_dreamlite_unet_inputs(False),
            note=_DREAMLITE_UNET_NOTE)
)
CASES.append(
    ZooCase(
        name="DreamLiteUNetModel", variant="masked", config=_DREAMLITE_UNET, inputs=_dreamlite_unet_inputs(True),
        note=_DREAMLITE_UNET_NOTE + "; batch 2 with 7 and 3 valid text tokens",
        extra={"mask_keys": ("encoder_attention_mask",)},
    )
)
CASES.append(
    ZooCase(
        name="DreamLiteUNetModel", variant="fullpad", config=_DREAMLITE_UNET,
        inputs=_dreamlite_unet_inputs(True, (7, 0)),
        note=_DREAMLITE_UNET_NOTE + "; batch 2, the second with no valid text token: -10000 on every key (a uniform "
        "average)",
    )
)


# --- EasyAnimate, ERNIE-Image, GLM-Image, Helios, HiDream --------------------------------------

CASES.append(
    ZooCase(
        name="EasyAnimateTransformer3DModel",
        config=dict(
            num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, patch_size=2,
            sample_width=8, sample_height=8, num_layers=2, mmdit_layers=1, time_embed_dim=8, text_embed_dim=16,
        ),
        inputs=lambda model, gen: {
            "hidden_states": _rn(model, gen, 1, 4, 2, 8, 8),
            "timestep": _timestep(model, gen, 1),
            "encoder_hidden_states": _rn(model, gen, 1, 7, 16),
        },
        note=(
            "Attention + EasyAnimateAttnProcessor2_0 -> F.scaled_dot_product_attention, no mask: MMDiT blocks "
            "(added text projections, LayerNorm qk-norm) and plain blocks over [text, video]; interleaved 3-D "
            "rotary (cos, sin) built inside, applied to the video tokens only"
        ),
    )
)

_ERNIE = dict(
    hidden_size=32, num_attention_heads=2, num_layers=2, ffn_hidden_size=64, in_channels=4, out_channels=4,
    patch_size=2, text_in_dim=16, rope_axes_dim=(4, 6, 6),
)


def _ernie_inputs(lengths):
    def make(model, gen):
        b = len(lengths)
        return {
            "hidden_states": _rn(model, gen, b, 4, 8, 8),
            "timestep": _timestep(model, gen, b),
            "text_bth": _rn(model, gen, b, 7, 16),
            "text_lens": torch.tensor(lengths).to(model_param(model).device),
        }

    return make


_ERNIE_NOTE = (
    "ErnieImageAttention (AttentionModuleMixin) + ErnieImageSingleStreamAttnProcessor -> dispatch_attention_fn: "
    "single stream over [image, text] with RMS qk-norm and rotate-half rotary from angles (freqs_cis, built "
    "inside; passed positionally as image_rotary_emb); the mask is always built from text_lens: bool "
    "(B, 1, 1, S), image keys always valid"
)
CASES.append(ZooCase(name="ErnieImageTransformer2DModel", config=_ERNIE, inputs=_ernie_inputs([7]), note=_ERNIE_NOTE))
CASES.append(
    ZooCase(
        name="ErnieImageTransformer2DModel", variant="masked", config=_ERNIE, inputs=_ernie_inputs([7, 3]),
        # text_lens also sets the image tokens' first rotary coordinate, so no "mask reaches the
        # output" check here: changing it changes more than the mask.
        note=_ERNIE_NOTE + "; batch 2 with text_lens 7 and 3",
    )
)
CASES.append(
    ZooCase(
        name="ErnieImageTransformer2DModel", variant="fullpad", config=_ERNIE, inputs=_ernie_inputs([7, 0]),
        note=_ERNIE_NOTE + "; batch 2, the second with text_lens 0: every text key masked (an empty prompt), "
        "the image keys still valid",
    )
)

_GLM = dict(
    patch_size=2, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=16, num_attention_heads=2,
    text_embed_dim=16, time_embed_dim=8, condition_dim=4, prior_vq_quantizer_codebook_size=32,
)


def _glm_inputs(masked=False, cache=False):
    def make(model, gen):
        b = 2 if masked else 1
        dev = model_param(model).device
        out = {
            "hidden_states": _rn(model, gen, b, 4, 8, 8),
            "encoder_hidden_states": _rn(model, gen, b, 12, 16),
            "prior_token_id": torch.randint(0, 32, (b, 16), generator=gen).to(dev),
            "prior_token_drop": torch.rand(b, 16, generator=gen).to(dev) < 0.2,
            "timestep": _timestep(model, gen, b),
            "target_size": torch.tensor([[8.0, 8.0]] * b).to(**_like(model)),
            "crop_coords": torch.zeros(b, 2).to(**_like(model)),
            # (cos, sin) over the 4 x 4 image tokens, rotate-half layout
            "image_rotary_emb": _rope_halves(gen, 16, 16, **_like(model)),
        }
        if masked:
            out["attention_mask"] = _text_keep([12, 2], 12).long().to(dev)
        if cache:
            # Keys/values of a condition image written by an earlier "write" pass: random here,
            # (1, tokens, heads, head_dim) per layer, read and prepended to the keys.
            from diffusers.models.transformers.transformer_glm_image import GlmImageKVCache

            kv = GlmImageKVCache(num_layers=model.config.num_layers)
            for layer in kv.caches:
                layer.store(_rn(model, gen, 1, 16, 2, 16), _rn(model, gen, 1, 16, 2, 16))
            kv.set_mode("read")
            out["kv_caches"] = kv
        return out

    return make


_GLM_NOTE = (
    "Attention + GlmImageAttnProcessor -> dispatch_attention_fn: self-attention over [text, image] with LayerNorm "
    "qk-norm and image_rotary_emb (cos, sin; forward input or built inside) on the image tokens; attention_mask "
    "(B, T) text mask -> pairwise (B, 1, S, S) cast to the query dtype: float 0/1, added to the scores by SDPA"
)
CASES.append(
    ZooCase(name="GlmImageTransformer2DModel", config=_GLM, inputs=_glm_inputs(), note=_GLM_NOTE,
            extra={"rotary_keys": ("image_rotary_emb",)})
)
CASES.append(
    ZooCase(
        name="GlmImageTransformer2DModel", variant="masked", config=_GLM, inputs=_glm_inputs(masked=True),
        note=_GLM_NOTE + "; batch 2 with 12 and 2 valid text tokens (many padded: the float mask only "
        "down-weights them by e^-1)",
        extra={"mask_keys": ("attention_mask",), "rotary_keys": ("image_rotary_emb",)},
    )
)
CASES.append(
    ZooCase(
        name="GlmImageTransformer2DModel", variant="kvcache", config=_GLM, inputs=_glm_inputs(cache=True),
        note=_GLM_NOTE + "; kv_caches in 'read' mode: 16 cached condition-image keys/values (random) prepended to "
        "the keys, no mask",
    )
)


def _helios_inputs(model, gen):
    b, c, f, h, w = 1, 4, 2, 16, 16
    dev = model_param(model).device
    frames = lambda n, start: (start + torch.arange(n)).view(1, n).repeat(b, 1).float().to(dev)  # noqa: E731
    return {
        "hidden_states": _rn(model, gen, b, c, f, h, w),
        "timestep": _timestep(model, gen, b),
        "encoder_hidden_states": _rn(model, gen, b, 7, 16),
        # Frame positions (the rotary's temporal axis) of the current chunk and of the three
        # history memories, as the pipeline lays them out (long, mid, short history, then now).
        "indices_hidden_states": frames(f, 6),
        "indices_latents_history_short": frames(1, 5),
        "indices_latents_history_mid": frames(1, 4),
        "indices_latents_history_long": frames(4, 0),
        "latents_history_short": _rn(model, gen, b, c, 1, h, w),
        "latents_history_mid": _rn(model, gen, b, c, 1, h, w),
        "latents_history_long": _rn(model, gen, b, c, 4, h, w),
    }


CASES.append(
    ZooCase(
        name="HeliosTransformer3DModel",
        config=dict(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
            text_dim=16, freq_dim=32, ffn_dim=32, num_layers=1, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", rope_dim=(4, 4, 4), has_multi_term_memory_patch=True,
            guidance_cross_attn=True, zero_history_timestep=True, is_amplify_history=True,
        ),
        inputs=_helios_inputs,
        note=(
            "HeliosAttention (AttentionModuleMixin) + HeliosAttnProcessor -> dispatch_attention_fn, no mask: "
            "self-attention over [history memories, current frames] with RMS qk-norm across heads and rotary "
            "(rotary_emb, built inside from the frame indices); is_amplify_history scales the history keys "
            "before the call; cross-attention to the text; original_context_length passed positionally"
        ),
    )
)


def _hidream_inputs(model, gen):
    b = 1
    return {
        "hidden_states": _rn(model, gen, b, 4, 8, 8),
        "timesteps": _timestep(model, gen, b),
        "encoder_hidden_states_t5": _rn(model, gen, b, 6, 8),
        # one Llama-3 hidden state per block, stacked on the first axis
        "encoder_hidden_states_llama3": _rn(model, gen, 2, b, 5, 4),
        "pooled_embeds": _rn(model, gen, b, 8),
    }


CASES.append(
    ZooCase(
        name="HiDreamImageTransformer2DModel",
        config=dict(
            patch_size=2, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, caption_channels=[8, 4], text_emb_dim=8, num_routed_experts=2,
            num_activated_experts=2, axes_dims_rope=(8, 4, 4), max_resolution=(16, 16), llama_layers=(0, 1),
            force_inference_output=True,
        ),
        inputs=_hidream_inputs,
        note=(
            "HiDreamAttention (an Attention subclass with its own projections, no AttentionModuleMixin) + "
            "HiDreamAttnProcessor -> F.scaled_dot_product_attention, no attention mask: joint [image, text] "
            "(double blocks, separate text projections) and single blocks, RMS qk-norm, complex-style rotary "
            "(apply_rope) built inside; hidden_states_masks (padded patches) multiplies the keys by 0/1 instead of "
            "masking (not used for square inputs); MoEGate's softmax is routing, not attention"
        ),
    )
)


# --- HunyuanDiT and its ControlNets ------------------------------------------------------------

_HYDIT_COMMON = dict(
    # cross_attention_dim_t5 64: the T5 pooler (HunyuanDiTAttentionPool) has 8 heads, of dim 8 here
    num_attention_heads=2, attention_head_dim=16, in_channels=4, patch_size=2, sample_size=8, hidden_size=32,
    mlp_ratio=2.0, cross_attention_dim=16, cross_attention_dim_t5=64, pooled_projection_dim=32, text_len=4,
    text_len_t5=6,
)
_HYDIT = dict(_HYDIT_COMMON, num_layers=2)
# The conditioning (timestep + pooled text + sizes) brought to unit scale: at the default scale
# the pooler's attention would barely move the blocks' norm shift.
# ... and the text pooler's output projection x4: its attention reaches the output only
# through the timestep embedding, and in 1 draw of 150 it moved the output by less than
# 1e-3 (test_zoo_stock_a's MIN_EFFECT); with the gain the least of 300 draws is 3.1e-3.
_HYDIT_GAINS = ((r"time_extra_emb\.extra_embedder\.linear_2\.", 10.0), (r"time_extra_emb\.pooler\.c_proj\.weight", 4.0))


def _hydit_inputs(masked=False, control=False):
    def make(model, gen):
        b = 2 if masked else 1
        dev = model_param(model).device
        out = {
            "hidden_states": _rn(model, gen, b, 4, 8, 8),
            "timestep": _timestep(model, gen, b),
            "encoder_hidden_states": _rn(model, gen, b, 4, 16),
            "text_embedding_mask": _text_keep([4, 2] if masked else [4], 4).long().to(dev),
            "encoder_hidden_states_t5": _rn(model, gen, b, 6, 64),
            "text_embedding_mask_t5": _text_keep([6, 3] if masked else [6], 6).long().to(dev),
            "image_meta_size": torch.tensor([[8.0, 8.0, 8.0, 8.0, 0.0, 0.0]] * b).to(**_like(model)),
            "style": torch.zeros(b, dtype=torch.long).to(dev),
            # (cos, sin) over the 4 x 4 image tokens, interleaved pairs (apply_rotary_emb default)
            "image_rotary_emb": random_angles_rotary(gen, 16, 16, **_like(model)),
        }
        if control:
            out["controlnet_cond"] = _rn(model, gen, b, 4, 8, 8)
            out["conditioning_scale"] = 0.8
        return out

    return make


_HYDIT_NOTE = (
    "Attention + HunyuanAttnProcessor2_0 -> F.scaled_dot_product_attention, no attention mask: self-attention "
    "(attn1) with image_rotary_emb (cos, sin) on q and k, cross-attention (attn2) with it on q only, LayerNorm "
    "qk-norm; plus the T5 pooler HunyuanDiTAttentionPool (torch F.multi_head_attention_forward, 8 heads, one "
    "query, not a diffusers attention module); the text masks do not reach the attention: padded text tokens "
    "are replaced by a learned padding embedding"
)
CASES.append(
    _Case(name="HunyuanDiT2DModel", config=_HYDIT, inputs=_hydit_inputs(), note=_HYDIT_NOTE, gains=_HYDIT_GAINS,
            extra={"out_shape": (1, 8, 8, 8), "rotary_keys": ("image_rotary_emb",)})
)
CASES.append(
    _Case(
        name="HunyuanDiT2DModel", variant="masked", config=_HYDIT, inputs=_hydit_inputs(masked=True),
        gains=_HYDIT_GAINS,
        note=_HYDIT_NOTE + "; batch 2 with 4/2 CLIP and 6/3 T5 valid tokens",
        extra={"out_shape": (2, 8, 8, 8), "rotary_keys": ("image_rotary_emb",)},
    )
)

_HYDIT_CN = dict(_HYDIT_COMMON, conditioning_channels=3, transformer_num_layers=4)


def _hydit_cn_outputs(out):
    samples = out.controlnet_block_samples if hasattr(out, "controlnet_block_samples") else out[0]
    return tuple(samples)


CASES.append(
    _Case(
        name="HunyuanDiT2DControlNetModel", config=_HYDIT_CN, inputs=_hydit_inputs(control=True), gains=_HYDIT_GAINS,
        outputs=_hydit_cn_outputs,
        note=(
            "HunyuanDiTBlocks (first half of the DiT): " + _HYDIT_NOTE + "; the model defines attn_processors / "
            "set_attn_processor itself (no AttentionMixin)"
        ),
        extra={"out_shape": (1, 16, 32), "rotary_keys": ("image_rotary_emb",)},
    )
)


def _hydit_multi_make(config):
    import diffusers

    return diffusers.HunyuanDiT2DMultiControlNetModel([diffusers.HunyuanDiT2DControlNetModel(**config)])


def _hydit_multi_inputs(model, gen):
    out = _hydit_inputs(control=True)(model, gen)
    out["controlnet_cond"] = [out["controlnet_cond"]]
    out["conditioning_scale"] = [0.8]
    out["return_dict"] = False
    return out


CASES.append(
    _Case(
        name="HunyuanDiT2DMultiControlNetModel", config=_HYDIT_CN, make=_hydit_multi_make, gains=_HYDIT_GAINS,
        inputs=_hydit_multi_inputs, outputs=_hydit_cn_outputs,
        note="wraps one HunyuanDiT2DControlNetModel: " + _HYDIT_NOTE,
        extra={"out_shape": (1, 16, 32), "rotary_keys": ("image_rotary_emb",)},
    )
)


# --- HunyuanVideo family, HunyuanImage ------------------------------------------------------

_HYV = dict(
    in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1, num_single_layers=1,
    num_refiner_layers=1, mlp_ratio=2.0, patch_size=2, patch_size_t=1, text_embed_dim=16, pooled_projection_dim=8,
    rope_axes_dim=(4, 6, 6),
)


def _hyv_inputs(lengths, image_cond=False):
    def make(model, gen):
        b = len(lengths)
        out = {
            "hidden_states": _rn(model, gen, b, 4, 2, 8, 8),
            "timestep": _timestep(model, gen, b),
            "encoder_hidden_states": _rn(model, gen, b, 24, 16),
            "encoder_attention_mask": _text_keep(lengths, 24).long().to(model_param(model).device),
            "pooled_projections": _rn(model, gen, b, 8),
            "guidance": (1.0 + 5.0 * torch.rand(b, generator=gen)).to(**_like(model)) * 1000,
        }
        return out

    return make


_HYV_NOTE = (
    "token refiner: Attention + AttnProcessor2_0 (Attention's default) -> F.scaled_dot_product_attention with a "
    "pairwise bool (B, 1, T, T) text mask, key 0 always kept; double/single blocks: Attention + "
    "HunyuanVideoAttnProcessor2_0 -> dispatch_attention_fn over [video, text] (text last) with a bool (B, 1, 1, S) "
    "key-padding mask from encoder_attention_mask, RMS qk-norm, image_rotary_emb (cos, sin) built inside on the "
    "video tokens"
)
# Both timestep embeddings brought to unit scale (the token refiner's gates come from its own),
# and the refiner's attention output projection x4: at the default scale its attention (an
# average over the text) is a small part of the refined text and would barely show.
_HYV_GAINS = (
    (r"^time_text_embed\.timestep_embedder\.linear_2\.", 10.0),
    (r"context_embedder\.time_text_embed\.timestep_embedder\.linear_2\.", 10.0),
    (r"refiner_blocks\.\d+\.attn\.to_out\.0\.weight", 4.0),
)
# 24 text tokens next to 32 video tokens: with fewer, the text (and its refiner) holds too
# small a share of the attention for a perturbation of the refiner to show.
CASES.append(_Case(name="HunyuanVideoTransformer3DModel", config=_HYV, inputs=_hyv_inputs([24]), note=_HYV_NOTE,
                   gains=_HYV_GAINS))
CASES.append(
    _Case(
        name="HunyuanVideoTransformer3DModel", variant="masked", config=_HYV, inputs=_hyv_inputs([24, 9]),
        gains=_HYV_GAINS,
        note=_HYV_NOTE + "; batch 2 with 24 and 9 valid text tokens",
    )
)
CASES.append(
    _Case(
        name="HunyuanVideoTransformer3DModel", variant="i2v", config=dict(_HYV, image_condition_type="token_replace"),
        gains=_HYV_GAINS,
        inputs=_hyv_inputs([24, 13]),
        note=_HYV_NOTE + "; HunyuanVideo-I2V token_replace: TokenReplace double/single blocks (first-frame tokens "
        "modulated apart), same attention; batch 2 with 24 and 13 valid text tokens",
    )
)


def _framepack_inputs(lengths):
    def make(model, gen):
        b, c, f, h, w = len(lengths), 4, 3, 8, 8
        dev = model_param(model).device
        pos = lambda n, start: (start + torch.arange(n)).float().to(dev)  # noqa: E731
        return {
            "hidden_states": _rn(model, gen, b, c, f, h, w),
            "timestep": _timestep(model, gen, b),
            "encoder_hidden_states": _rn(model, gen, b, 24, 16),
            "encoder_attention_mask": _text_keep(lengths, 24).long().to(dev),
            "pooled_projections": _rn(model, gen, b, 8),
            "guidance": (1.0 + 5.0 * torch.rand(b, generator=gen)).to(**_like(model)) * 1000,
            "image_embeds": _rn(model, gen, b, 5, 16),
            # frame positions of the section being generated and of the clean / 2x / 4x history
            "indices_latents": pos(f, 8),
            "latents_clean": _rn(model, gen, b, c, 2, h, w),
            "indices_latents_clean": pos(2, 6),
            "latents_history_2x": _rn(model, gen, b, c, 2, h, w),
            "indices_latents_history_2x": pos(2, 4),
            "latents_history_4x": _rn(model, gen, b, c, 8, h, w),
            "indices_latents_history_4x": pos(8, 0),
        }

    return make


_FRAMEPACK = dict(
    in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1, num_single_layers=1,
    num_refiner_layers=1, mlp_ratio=2.0, patch_size=2, patch_size_t=1, guidance_embeds=True, text_embed_dim=16,
    pooled_projection_dim=8, rope_axes_dim=(4, 6, 6), has_image_proj=True, image_proj_dim=16,
    has_clean_x_embedder=True,
)
_FRAMEPACK_NOTE = (
    "HunyuanVideo blocks and token refiner (see HunyuanVideoTransformer3DModel): AttnProcessor2_0 in the refiner, "
    "HunyuanVideoAttnProcessor2_0 -> dispatch_attention_fn with a bool (B, 1, 1, S) mask in the blocks; the "
    "sequence is [clean / 2x / 4x history + current latents, CLIP image tokens + text], rotary from the frame "
    "indices built inside"
)
# The history tokens outnumber the text: the refiner's attention output another x2.
_FRAMEPACK_GAINS = _HYV_GAINS + ((r"refiner_blocks\.\d+\.attn\.to_out\.0\.weight", 2.0),)
CASES.append(
    _Case(name="HunyuanVideoFramepackTransformer3DModel", config=_FRAMEPACK, inputs=_framepack_inputs([24]),
          note=_FRAMEPACK_NOTE, gains=_FRAMEPACK_GAINS)
)
CASES.append(
    _Case(
        name="HunyuanVideoFramepackTransformer3DModel", variant="masked", config=_FRAMEPACK,
        inputs=_framepack_inputs([24, 9]), gains=_FRAMEPACK_GAINS,
        note=_FRAMEPACK_NOTE + "; batch 2 with 24 and 9 valid text tokens",
    )
)

_HYV15 = dict(
    in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1, num_refiner_layers=1,
    mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=16, text_embed_2_dim=8, image_embed_dim=8,
    rope_axes_dim=(4, 6, 6), target_size=64, task_type="i2v",
)


def _hyv15_inputs(lengths, lengths_2, t2v=False):
    def make(model, gen):
        b = len(lengths)
        dev = model_param(model).device
        image = _rn(model, gen, b, 4, 8)
        return {
            "hidden_states": _rn(model, gen, b, 4, 2, 4, 4),
            "timestep": _timestep(model, gen, b),
            "encoder_hidden_states": _rn(model, gen, b, 12, 16),
            "encoder_attention_mask": _text_keep(lengths, 12).long().to(dev),
            "encoder_hidden_states_2": _rn(model, gen, b, 6, 8),
            "encoder_attention_mask_2": _text_keep(lengths_2, 6).long().to(dev),
            # all-zero image embeddings mean text-to-video: the model masks the image tokens
            "image_embeds": torch.zeros_like(image) if t2v else image,
        }

    return make


_HYV15_GAINS = _HYV_GAINS + ((r"^time_embed\.timestep_embedder\.linear_2\.", 10.0),)
_HYV15_NOTE = (
    "token refiner: Attention + AttnProcessor2_0 -> F.scaled_dot_product_attention (pairwise bool text mask); "
    "blocks: Attention + HunyuanVideo15AttnProcessor2_0 -> dispatch_attention_fn over [video, image, ByT5, text] "
    "(valid tokens first), RMS qk-norm, image_rotary_emb built inside; the mask is pairwise bool (B, 1, S, S): "
    "padded tokens' query rows are fully masked"
)
CASES.append(
    _Case(name="HunyuanVideo15Transformer3DModel", config=_HYV15, inputs=_hyv15_inputs([12], [6]), note=_HYV15_NOTE,
          gains=_HYV15_GAINS)
)
CASES.append(
    _Case(
        name="HunyuanVideo15Transformer3DModel", variant="masked", config=_HYV15,
        inputs=_hyv15_inputs([12, 5], [6, 2]), gains=_HYV15_GAINS,
        note=_HYV15_NOTE + "; batch 2 with 12/5 text and 6/2 ByT5 valid tokens (fully masked rows for the padding)",
    )
)
CASES.append(
    _Case(
        name="HunyuanVideo15Transformer3DModel", variant="t2v", config=_HYV15,
        inputs=_hyv15_inputs([12], [6], t2v=True), gains=_HYV15_GAINS,
        note=_HYV15_NOTE + "; text-to-video: zero image embeddings, all 4 image tokens masked",
    )
)

_HYIMAGE = dict(
    in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1, num_single_layers=1,
    num_refiner_layers=1, mlp_ratio=2.0, patch_size=(1, 1), text_embed_dim=16, text_embed_2_dim=8,
    rope_axes_dim=(8, 8),
)


def _hyimage_inputs(lengths, lengths_2):
    def make(model, gen):
        b = len(lengths)
        dev = model_param(model).device
        return {
            "hidden_states": _rn(model, gen, b, 4, 4, 4),
            "timestep": _timestep(model, gen, b),
            "encoder_hidden_states": _rn(model, gen, b, 12, 16),
            "encoder_attention_mask": _text_keep(lengths, 12).long().to(dev),
            "encoder_hidden_states_2": _rn(model, gen, b, 6, 8),
            "encoder_attention_mask_2": _text_keep(lengths_2, 6).long().to(dev),
        }

    return make


_HYIMAGE_NOTE = (
    "token refiner: Attention + AttnProcessor2_0 -> F.scaled_dot_product_attention (pairwise bool text mask); "
    "double/single blocks: Attention + HunyuanImageAttnProcessor -> dispatch_attention_fn over [image, ByT5 + text "
    "(valid first)] with a bool (B, 1, 1, S) key-padding mask, RMS qk-norm, 2-axis image_rotary_emb built inside"
)
_HYIMAGE_GAINS = (
    (r"^time_guidance_embed\..*linear_2\.", 10.0),
    (r"context_embedder\.time_text_embed\.timestep_embedder\.linear_2\.", 10.0),
    (r"refiner_blocks\.\d+\.attn\.to_out\.0\.weight", 4.0),
)
CASES.append(
    _Case(name="HunyuanImageTransformer2DModel", config=_HYIMAGE, inputs=_hyimage_inputs([12], [6]),
          note=_HYIMAGE_NOTE, gains=_HYIMAGE_GAINS)
)
CASES.append(
    _Case(
        name="HunyuanImageTransformer2DModel", variant="masked", config=_HYIMAGE,
        inputs=_hyimage_inputs([12, 5], [6, 2]), gains=_HYIMAGE_GAINS,
        note=_HYIMAGE_NOTE + "; batch 2 with 12/5 text and 6/2 ByT5 valid tokens",
    )
)


# --- I2VGenXLUNet --------------------------------------------------------------------------

CASES.append(
    ZooCase(
        name="I2VGenXLUNet",
        # attention_head_dim is the head count of the spatial blocks and the head dim of
        # transformer_in (as in the real config, where it gives 64 heads of 5 at 320 channels).
        config=dict(
            sample_size=8, in_channels=4, out_channels=4, down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
            up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"), block_out_channels=(32, 64), layers_per_block=1,
            norm_num_groups=8, cross_attention_dim=16, attention_head_dim=8,
        ),
        inputs=lambda model, gen: {
            "sample": _rn(model, gen, 1, 4, 3, 8, 8),
            "timestep": _timestep(model, gen, 1),
            "fps": torch.tensor([8.0]).to(**_like(model)),
            "image_latents": _rn(model, gen, 1, 4, 3, 8, 8),
            "image_embeddings": _rn(model, gen, 1, 16),
            "encoder_hidden_states": _rn(model, gen, 1, 7, 16),
        },
        note=(
            "Attention + AttnProcessor2_0 -> F.scaled_dot_product_attention everywhere, no mask: spatial "
            "self/cross-attention (Transformer2DModel; context = text + image-latent tokens + image embedding), "
            "temporal self-attention over frames (TransformerTemporalModel, transformer_in), and the image-latent "
            "temporal encoder (I2VGenXLTransformerTemporalEncoder, 2 heads of dim in_channels = 4)"
        ),
        extra={"shape_like": "sample"},
    )
)
