"""The model zoo, second half of the alphabet (Ideogram4... to ZImage...).

One or more :class:`ZooCase` per diffusers model class that computes attention, and
``NO_ATTENTION``: the classes of this half that compute none, each with the reason found in
its source. Configs are tiny (hidden sizes of a few dozen, one or two blocks, head_dim >= 8)
but keep each model's attention layout: joint text+image sequences, rotary embeddings,
qk-norm, GQA, cross-attention, masks. Inputs are random; rotary embeddings that are forward
inputs are random angles; masks have a different valid length per batch item.

Two ``ZooCase.extra`` keys, read by the zoo tests:
- ``"attention_classes"``: names of the module classes of a case that compute attention without
  being a diffusers ``Attention`` or ``AttentionModuleMixin`` (Mochi's ``MochiAttention``...);
- ``"uncalled_attention"``: ``(name fragments, reason)`` for attention modules a model builds but
  its forward never calls (the SANA-WM refiner's audio modules).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tests.zoo._zoo_common import ZooCase, default_outputs, model_param, random_init_, randn, random_angles_rotary

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


@dataclass(frozen=True)
class _SeededNoiseCase(ZooCase):
    """A model whose forward draws noise from the ``generator`` input (a diffusion decoder):
    each run gets a fresh generator with the same seed, so two runs see the same noise."""

    def run(self, model, inputs):
        gen = inputs["generator"]
        fresh = torch.Generator(gen.device).manual_seed(gen.initial_seed())
        return super().run(model, {**inputs, "generator": fresh})


@dataclass(frozen=True)
class _HostedCase(ZooCase):
    """A model whose own forward computes nothing (AnimateDiff's MotionAdapter): ``inputs`` builds a
    host model whose matching submodules *are* the adapter's (shared, not copied), and the run is
    the host's forward. Attention modules of the adapter are the ones that run, so processors set
    on the adapter take effect; the host's own modules stay stock."""

    def run(self, model, inputs):
        kwargs = dict(inputs)
        host = kwargs.pop("host")
        return (self.outputs or default_outputs)(host(**kwargs))


@dataclass(frozen=True)
class _EncodeDecodeCase(ZooCase):
    """An autoencoder whose ``forward`` only decodes (RFD4 Proteina): the run is ``encode`` then
    ``forward`` on the sampled latent, so encoder and decoder attention both run. ``inputs`` holds the
    encode keyword arguments plus ``decode`` (the decoder's other keyword arguments); the encoder's
    generators (one per batch row) are re-seeded each run. Outputs: latent mean, log-scale, decoded
    coordinates."""

    def run(self, model, inputs):
        kwargs = dict(inputs)
        decode_kwargs = kwargs.pop("decode")
        kwargs["generator"] = [torch.Generator(g.device).manual_seed(g.initial_seed()) for g in kwargs["generator"]]
        enc = model.encode(**kwargs)
        dec = model(z_latent=enc.latent, **decode_kwargs)
        return (enc.mean, enc.log_scale, dec.coordinates)


@dataclass(frozen=True)
class _ReferenceThenGenerateCase(ZooCase):
    """Wan-Animate-2's passes, as its pipeline runs them: the reference pass writes every layer's K/V
    into a fresh cache (``kv_cache_mode="extract"``); then, when ``inputs`` has ``"generation"``, the
    generation pass attends to it (``"cached"``). ``inputs`` holds each pass's keyword arguments under
    ``"reference"`` and ``"generation"``; outputs: the reference pass's samples, then the generation
    pass's."""

    def run(self, model, inputs):
        from diffusers.models.transformers.transformer_wan_animate_2 import WanAnimate2KVCache

        cache = WanAnimate2KVCache(len(model.blocks))
        out = model(**inputs["reference"], kv_cache=cache, kv_cache_mode="extract", return_dict=False)[0]
        if "generation" in inputs:
            out = out + model(**inputs["generation"], kv_cache=cache, kv_cache_mode="cached", return_dict=False)[0]
        return tuple(out)


@dataclass(frozen=True)
class _SharedWithTransformerCase(ZooCase):
    """A ControlNet that borrows modules of its transformer (Z-Image's ``from_transformer``: the
    embedders, refiners and pad tokens are the transformer's own): the build makes a transformer from
    ``extra["transformer"]`` and shares them, as the pipeline does. The shared modules are then part
    of the ControlNet (submodules), so its attention modules include the borrowed refiners'."""

    def build(self, seed: int = 0, dtype: torch.dtype = torch.float32, device="cpu"):
        import diffusers

        torch.manual_seed(seed)
        transformer = getattr(diffusers, self.extra["transformer"][0])(**self.extra["transformer"][1])
        model = self.model_class().from_transformer(self.model_class()(**self.config), transformer)
        random_init_(model, seed)
        return model.to(device=device, dtype=dtype).eval()


class _Fresh:
    """A constructor argument that is itself a model (a Multi* wrapper's nets): built anew at each
    build, so that two models built from one case never share a submodule."""

    def __init__(self, class_name: str, **config):
        self.class_name = class_name
        self.config = config

    def make(self):
        import diffusers

        return getattr(diffusers, self.class_name)(**self.config)

    def __repr__(self) -> str:
        return f"{self.class_name}(...)"


@dataclass(frozen=True)
class _WrapperCase(ZooCase):
    """A case whose config holds ``_Fresh`` models (in lists): they are constructed at build time."""

    def build(self, seed: int = 0, dtype: torch.dtype = torch.float32, device="cpu"):
        torch.manual_seed(seed)

        def make(v):
            if isinstance(v, _Fresh):
                return v.make()
            if isinstance(v, (list, tuple)):
                return type(v)(make(x) for x in v)
            return v

        model = self.model_class()(**{k: make(v) for k, v in self.config.items()})
        random_init_(model, seed)
        return model.to(device=device, dtype=dtype).eval()


def _inner_config(model):
    """The config of a model, or of the first net of a Multi* wrapper (which has none of its own)."""
    nets = getattr(model, "nets", None)
    return nets[0].config if nets is not None else model.config


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


def _pd(model):
    """(device, dtype) of the model."""
    p = model_param(model)
    return p.device, p.dtype


def _r(gen, model, *shape):
    device, dtype = _pd(model)
    return randn(gen, *shape, dtype=dtype, device=device)


def _t(gen, model, batch, low=0.05, high=0.95):
    """Random diffusion times in [low, high], one per batch item, in the model's dtype."""
    device, dtype = _pd(model)
    return (low + (high - low) * torch.rand(batch, generator=gen)).to(device=device, dtype=dtype)


def _steps(gen, model, batch, high=1000):
    """Random integer timesteps (as floats in the model's dtype), one per batch item."""
    device, dtype = _pd(model)
    return torch.randint(1, high, (batch,), generator=gen).to(device=device, dtype=dtype)


def _keep(lengths, total, device="cpu", dtype=torch.bool, left=False):
    """(B, total) key-padding mask: item b keeps its first lengths[b] tokens (last, with left=True)."""
    ar = torch.arange(total)
    rows = []
    for n in lengths:
        rows.append(ar >= total - n if left else ar < n)
    return torch.stack(rows).to(device=device, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# Ideogram4
# ---------------------------------------------------------------------------------------------


def _ideogram4_inputs(text_lengths, max_text=5, grid=(2, 3)):
    from diffusers.models.transformers.transformer_ideogram4 import (
        IMAGE_POSITION_OFFSET,
        LLM_TOKEN_INDICATOR,
        OUTPUT_IMAGE_INDICATOR,
        SEQUENCE_PADDING_INDICATOR,
    )

    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(text_lengths)
        gh, gw = grid
        n_img = gh * gw
        seq = max_text + n_img
        # The pipeline's packed [left-pad][text][image] layout; pad tokens form their own segment.
        h = torch.arange(gh).repeat_interleave(gw)
        w = torch.arange(gw).repeat(gh)
        img_pos = torch.stack([torch.zeros_like(h), h, w], dim=1) + IMAGE_POSITION_OFFSET
        position_ids = torch.zeros(batch, seq, 3, dtype=torch.long)
        segment_ids = torch.full((batch, seq), SEQUENCE_PADDING_INDICATOR, dtype=torch.long)
        indicator = torch.zeros(batch, seq, dtype=torch.long)
        for b, n in enumerate(text_lengths):
            off = max_text - n
            position_ids[b, off : off + n] = torch.arange(n)[:, None].expand(n, 3)
            position_ids[b, off + n :] = img_pos
            indicator[b, off : off + n] = LLM_TOKEN_INDICATOR
            indicator[b, off + n :] = OUTPUT_IMAGE_INDICATOR
            segment_ids[b, off:] = 1
        cfg = model.config
        return dict(
            hidden_states=_r(gen, model, batch, seq, cfg.in_channels),
            timestep=_t(gen, model, batch),
            encoder_hidden_states=_r(gen, model, batch, seq, cfg.llm_features_dim),
            position_ids=position_ids.to(device),
            segment_ids=segment_ids.to(device),
            indicator=indicator.to(device),
        )

    return inputs


_IDEOGRAM4 = dict(
    in_channels=16,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    intermediate_size=48,
    adaln_dim=16,
    llm_features_dim=24,
    rope_theta=10_000,
    mrope_section=(4, 2, 2),
)
_IDEOGRAM4_NOTE = (
    "Ideogram4Attention + Ideogram4AttnProcessor -> dispatch_attention_fn over one packed "
    "text+image sequence; q/k RMSNorm, interleaved 3-axis MRoPE (cos, sin) from position_ids; "
    "4-D bool block-diagonal mask (B, 1, L, L) from segment_ids."
)
_add(
    ZooCase("Ideogram4Transformer2DModel", _IDEOGRAM4, _ideogram4_inputs([5]), note=_IDEOGRAM4_NOTE),
    ZooCase(
        "Ideogram4Transformer2DModel",
        _IDEOGRAM4,
        _ideogram4_inputs([5, 2]),
        variant="masked",
        note=_IDEOGRAM4_NOTE + " Item 2 is left-padded: its pad tokens form a segment of their own.",
    ),
    ZooCase(
        "Ideogram4Transformer2DModel",
        _IDEOGRAM4,
        _ideogram4_inputs([3, 0]),
        variant="fullpad",
        note=_IDEOGRAM4_NOTE + " Item 2 has no text token: every text slot is padding.",
    ),
)


# ---------------------------------------------------------------------------------------------
# JoyImage Edit / Edit Plus
# ---------------------------------------------------------------------------------------------

_JOY = dict(
    patch_size=[1, 2, 2],
    in_channels=4,
    hidden_size=32,
    num_attention_heads=2,
    text_dim=16,
    mlp_width_ratio=2.0,
    num_layers=2,
    rope_dim_list=[4, 6, 6],
    theta=256,
)


def _joy_plus_inputs(shape_lists, text_lengths=None, text_len=7):
    """shape_lists: per item, the (t, h, w) patch grids of target and references."""

    def inputs(model, gen):
        device, dtype = _pd(model)
        batch = len(shape_lists)
        max_patches = max(sum(t * h * w for t, h, w in s) for s in shape_lists)
        c = model.config.in_channels
        kw = dict(
            hidden_states=_r(gen, model, batch, max_patches, c, *model.config.patch_size),
            timestep=_steps(gen, model, batch),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.text_dim),
            shape_list=[list(s) for s in shape_lists],
        )
        if text_lengths is not None:
            kw["encoder_hidden_states_mask"] = _keep(text_lengths, text_len, device, dtype=torch.long)
        return kw

    return inputs


_JOYPLUS_NOTE = (
    "JoyImageEditPlusAttention + JoyImageEditPlusAttnProcessor -> dispatch_attention_fn on the "
    "joint [image, text] sequence; q/k RMSNorm per stream, per-item (batched) 3-axis RoPE on image "
    "tokens only (cos, sin of shape (B, N, D))."
)
_add(
    ZooCase(
        "JoyImageEditPlusTransformer3DModel",
        _JOY,
        _joy_plus_inputs([[(1, 2, 2), (1, 1, 2)]]),
        note=_JOYPLUS_NOTE + " No mask: target 2x2 + one 1x2 reference.",
    ),
    ZooCase(
        "JoyImageEditPlusTransformer3DModel",
        _JOY,
        _joy_plus_inputs([[(1, 2, 2), (1, 1, 2)], [(1, 2, 2)]], text_lengths=[7, 3]),
        variant="masked",
        note=_JOYPLUS_NOTE
        + " 4-D bool key mask (B, 1, 1, N_img + N_txt): padded image patches of item 2 and its text padding.",
    ),
    ZooCase(
        "JoyImageEditPlusTransformer3DModel",
        _JOY,
        _joy_plus_inputs([[(1, 2, 2), (1, 1, 2)], [(1, 2, 3)]], text_lengths=[5, 0]),
        variant="fullpad",
        note=_JOYPLUS_NOTE + " Item 2 has every text token masked (image keys stay valid).",
    ),
)


def _joy_inputs(batch=1, items=0, frames=1, hw=(4, 6), text_len=7):
    def inputs(model, gen):
        c = model.config.in_channels
        shape = (batch, items, c, frames, *hw) if items else (batch, c, frames, *hw)
        return dict(
            hidden_states=_r(gen, model, *shape),
            timestep=_steps(gen, model, batch),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.text_dim),
        )

    return inputs


_JOY_NOTE = (
    "JoyImageAttention + JoyImageAttnProcessor -> dispatch_attention_fn on the joint [image, text] "
    "sequence, no mask; q/k RMSNorm per stream; 3-axis RoPE on image tokens"
)
_add(
    ZooCase(
        "JoyImageEditTransformer3DModel",
        _JOY,
        _joy_inputs(batch=2),
        note=_JOY_NOTE + " (rope_type='rope': none on text).",
    ),
    ZooCase(
        "JoyImageEditTransformer3DModel",
        dict(_JOY, rope_type="mrope"),
        _joy_inputs(batch=1, items=2),
        variant="mrope-multi",
        note=_JOY_NOTE + " and on text tokens too (rope_type='mrope'); 6-D multi-item input (target + reference).",
    ),
)


# ---------------------------------------------------------------------------------------------
# Kandinsky 3
# ---------------------------------------------------------------------------------------------

_K3 = dict(
    in_channels=4,
    time_embedding_dim=16,
    groups=4,
    attention_head_dim=8,
    layers_per_block=2,  # 1 builds a model whose up path does not run (channel mismatch)
    block_out_channels=(16, 32),
    cross_attention_dim=16,
    encoder_hid_dim=24,
)


def _k3_inputs(text_lengths, text_len=6, hw=8):
    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(text_lengths)
        return dict(
            sample=_r(gen, model, batch, 4, hw, hw),
            timestep=_steps(gen, model, batch),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.encoder_hid_dim),
            # the pipeline passes the tokenizer's int64 mask; the model makes it additive (-10000)
            encoder_attention_mask=_keep(text_lengths, text_len, device, dtype=torch.long),
        )

    return inputs


_K3_NOTE = (
    "diffusers Attention + AttnProcessor2_0 (heads of 8 channels): attention pooling of the text, text "
    "cross-attention and image self-attention; the text mask arrives as an additive (B, 1, L) float "
    "mask (-10000 on padding) in the pooling and cross-attention."
)
_add(
    ZooCase("Kandinsky3UNet", _K3, _k3_inputs([6]), note=_K3_NOTE + " Mask all ones."),
    ZooCase("Kandinsky3UNet", _K3, _k3_inputs([6, 2]), variant="masked", note=_K3_NOTE),
)


# ---------------------------------------------------------------------------------------------
# Kandinsky 5
# ---------------------------------------------------------------------------------------------

_K5 = dict(
    in_visual_dim=4,
    in_text_dim=24,
    in_text_dim2=12,
    time_dim=16,
    out_visual_dim=4,
    patch_size=(1, 2, 2),
    model_dim=32,
    ff_dim=48,
    num_text_blocks=1,
    num_visual_blocks=2,
    axes_dims=(4, 6, 6),
)


def _k5_inputs(batch=1, frames=2, hw=(4, 6), text_len=5):
    def inputs(model, gen):
        device, _ = _pd(model)
        ph, pw = model.config.patch_size[1:]
        h, w = hw
        return dict(
            hidden_states=_r(gen, model, batch, frames, h, w, model.config.in_visual_dim),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.in_text_dim),
            timestep=_steps(gen, model, batch),
            pooled_projections=_r(gen, model, batch, model.config.in_text_dim2),
            visual_rope_pos=[
                torch.arange(frames, device=device),
                torch.arange(h // ph, device=device),
                torch.arange(w // pw, device=device),
            ],
            text_rope_pos=torch.arange(text_len, device=device),
            scale_factor=(1.0, 2.0, 2.0),
        )

    return inputs


_add(
    ZooCase(
        "Kandinsky5Transformer3DModel",
        _K5,
        _k5_inputs(batch=2),
        note=(
            "Kandinsky5Attention + Kandinsky5AttnProcessor -> dispatch_attention_fn, no mask: text "
            "self-attention (1-D RoPE), video self-attention (3-D RoPE as 2x2 rotation matrices, "
            "rotated q/k rounded through bfloat16 by the processor) and video->text cross-attention; "
            "q/k RMSNorm. The 'nabla' sparse path (sparse_params) passes a flex BlockMask and needs the "
            "flex backend: not covered here."
        ),
    ),
)


# ---------------------------------------------------------------------------------------------
# Kandinsky 6 (video + audio)
# ---------------------------------------------------------------------------------------------

_K6 = dict(
    in_visual_dim=4,
    out_visual_dim=4,
    in_text_dim=24,
    in_text_dim2=12,
    time_dim=16,
    patch_size=(1, 2, 2),
    model_dim=32,
    ff_dim=48,
    num_text_blocks=1,
    num_visual_blocks=2,
    axes_dims=(4, 6, 6),
    visual_cond=True,
    in_audio_dim=6,
    out_audio_dim=6,
    model_dim_a=48,
    axes_dims_a=(6, 4, 6),  # head_dim_a must equal head_dim under ca_rope
    # as the released checkpoints
    text_token_padding=True,
    ca_rope=True,
    cross_gates=True,
    fix_modulation=True,
)


def _k6_inputs(text_lengths, frames=2, hw=(4, 6), text_len=6, audio_len=5):
    def inputs(model, gen):
        device, _ = _pd(model)
        cfg = model.config
        batch = len(text_lengths)
        c = 2 * cfg.in_visual_dim + 1 if cfg.visual_cond else cfg.in_visual_dim
        kw = dict(
            hidden_states=_r(gen, model, batch, frames, *hw, c),
            encoder_hidden_states=_r(gen, model, batch, text_len, cfg.in_text_dim),
            pooled_projections=_r(gen, model, batch, cfg.in_text_dim2),
            timestep=_steps(gen, model, batch),
            audio_hidden_states=_r(gen, model, batch, audio_len, cfg.in_audio_dim),
        )
        if min(text_lengths) < text_len:
            kw["encoder_attention_mask"] = _keep(text_lengths, text_len, device)
        return kw

    return inputs


def _k6_outputs(out):
    return (out.sample, out.audio_sample)


_K6_NOTE = (
    "Kandinsky6Attention + Kandinsky6AttnProcessor -> dispatch_attention_fn; q/k RMSNorm; RoPE as 2x2 "
    "rotation matrices: text self-attention (1-D, video and audio branches), video self-attention "
    "(3-D), audio self-attention (1-D), video->text and audio->text cross-attention, and video<->audio "
    "cross-attention with different rotaries for q and k (ca_rope)."
)
_add(
    ZooCase("Kandinsky6Transformer3DModel", _K6, _k6_inputs([6]), outputs=_k6_outputs, note=_K6_NOTE),
    ZooCase(
        "Kandinsky6Transformer3DModel",
        _K6,
        _k6_inputs([6, 3]),
        outputs=_k6_outputs,
        variant="masked",
        note=_K6_NOTE + " 2-D bool text mask (B, L) in the text self-attention and both text cross-attentions.",
    ),
)


_K6SR = dict(
    in_visual_dim=4,
    out_visual_dim=8,
    time_dim=16,
    patch_size=(1, 1, 1),
    model_dim=32,
    ff_dim=48,
    num_visual_blocks=2,
    axes_dims=(4, 6, 6),
    nabla_threshold=0.8,
    # a window of one 8x8 block: the sparse pattern is then chosen by the NABLA statistics, not all-dense
    nabla_window=(1, 1, 1),
)


def _k6sr_inputs(batch=1, frames=2, hw=(8, 16)):
    def inputs(model, gen):
        c = 2 * model.config.in_visual_dim + 1
        return dict(
            hidden_states=_r(gen, model, batch, frames, *hw, c),
            timestep=_steps(gen, model, batch),
        )

    return inputs


_add(
    ZooCase(
        "Kandinsky6SRTransformer3DModel",
        _K6SR,
        _k6sr_inputs(),
        note=(
            "Kandinsky6SRAttention + Kandinsky6SRAttnProcessor -> dispatch_attention_fn with backend=FLEX "
            "hard-coded and a flex BlockMask (NABLA: 64-token blocks chosen from pooled q.k statistics OR'ed with "
            "a sliding-tile prior); q/k RMSNorm, 3-D RoPE as rotation matrices. Runs flex attention eagerly here."
        ),
    ),
)


# ---------------------------------------------------------------------------------------------
# Krea 2
# ---------------------------------------------------------------------------------------------

_KREA2 = dict(
    in_channels=16,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=48,
    timestep_embed_dim=16,
    text_hidden_dim=24,
    num_text_layers=3,
    text_num_attention_heads=3,
    text_num_key_value_heads=1,
    text_intermediate_size=32,
    num_layerwise_text_blocks=1,
    num_refiner_text_blocks=1,
    axes_dims_rope=(4, 6, 6),
)


def _krea2_inputs(text_lengths, text_len=6, grid=(2, 3)):
    def inputs(model, gen):
        device, _ = _pd(model)
        cfg = model.config
        batch = len(text_lengths)
        gh, gw = grid
        img_ids = torch.stack(
            [torch.zeros(gh * gw, dtype=torch.long), torch.arange(gh).repeat_interleave(gw), torch.arange(gw).repeat(gh)],
            dim=1,
        )
        position_ids = torch.cat([torch.zeros(text_len, 3, dtype=torch.long), img_ids]).to(device)
        kw = dict(
            hidden_states=_r(gen, model, batch, gh * gw, cfg.in_channels),
            encoder_hidden_states=_r(gen, model, batch, text_len, cfg.num_text_layers, cfg.text_hidden_dim),
            timestep=_t(gen, model, batch),
            position_ids=position_ids,
        )
        if min(text_lengths) < text_len:
            kw["encoder_attention_mask"] = _keep(text_lengths, text_len, device)
        return kw

    return inputs


_KREA2_NOTE = (
    "Krea2Attention + Krea2AttnProcessor -> dispatch_attention_fn; GQA with k/v heads repeated in the "
    "processor (enable_gqa never set), q/k RMSNorm, sigmoid output gate. Text fusion: attention across the "
    "tapped-layer axis (per token, no mask) then across text tokens; main blocks: one [text, image] sequence "
    "with 3-axis Flux-style RoPE (cos, sin)."
)
_add(
    ZooCase("Krea2Transformer2DModel", _KREA2, _krea2_inputs([6]), note=_KREA2_NOTE + " No mask."),
    ZooCase(
        "Krea2Transformer2DModel",
        _KREA2,
        _krea2_inputs([6, 2]),
        variant="masked",
        note=_KREA2_NOTE + " 4-D bool key mask (B, 1, 1, L) in the text refiner and the joint blocks.",
    ),
)


# ---------------------------------------------------------------------------------------------
# LTX-2 diffusion decoder (a VAE decoder that denoises pixels with neighborhood attention)
# ---------------------------------------------------------------------------------------------

_LTX2_DD = dict(
    out_channels=3,
    latent_channels=8,
    patch_size=2,
    decoder_head_dim=8,
    decoder_stage_channels=(64, 32, 16, 16, 16),
    decoder_stage_depths=(1, 1, 1, 1, 2),
    decoder_stage_kernels=((3, 3, 3), (3, 3, 3), (3, 3, 3), (3, 3, 3)),
    # smaller upsampling than the released (8x8x8) so that the stage-5 grid stays at 3x6x6 tokens
    decoder_upsample_strides=((1, 1, 1), (2, 1, 1), (1, 1, 1), (1, 2, 2)),
    decoder_upsample_channel_reductions=(2, 2, 1, 1),
    decoder_stage5_kernel=(3, 3, 3),
    decoder_t_emb_dim=32,
    spatial_compression_ratio=4,
    temporal_compression_ratio=2,
)


def _ltx2_dd_inputs(model, gen):
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    return dict(z=_r(gen, model, 1, 8, 2, 3, 3), generator=torch.Generator().manual_seed(seed))


_add(
    _SeededNoiseCase(
        "LTX2VideoDiffusionDecoderModel",
        _LTX2_DD,
        _ltx2_dd_inputs,
        note=(
            "LTX2VideoVaeNeighborhoodAttention + LTX2VideoVaeNeighborhoodAttnProcessor -> dispatch_attention_fn "
            "with backend 'flex' (processor default), a flex BlockMask for 3-D neighborhood windows, scale=1.0 "
            "(q pre-scaled), q/k RMSNorm and 3-D RoPE applied inside the module. The forward draws its noise "
            "from the `generator` input: each run re-seeds it."
        ),
    ),
)


# ---------------------------------------------------------------------------------------------
# LTX-2 (audio + video)
# ---------------------------------------------------------------------------------------------

_LTX2 = dict(
    in_channels=4,
    out_channels=4,
    patch_size=1,
    patch_size_t=1,
    num_attention_heads=2,
    attention_head_dim=16,
    cross_attention_dim=32,
    audio_in_channels=4,
    audio_out_channels=4,
    audio_num_attention_heads=2,
    audio_attention_head_dim=8,
    audio_cross_attention_dim=16,
    num_layers=2,
    caption_channels=24,
    rope_double_precision=False,
)
# LTX-2.3 layout: split RoPE, per-head output gates, prompt cross-attention modulation, no caption
# projection (the text arrives at the model width), the STG-capable processor.
_LTX23 = dict(
    _LTX2,
    rope_type="split",
    gated_attn=True,
    audio_gated_attn=True,
    cross_attn_mod=True,
    audio_cross_attn_mod=True,
    use_prompt_embeddings=False,
    perturbed_attn=True,
)


def _ltx2_inputs(text_lengths=None, audio_text_lengths=None, ltx23=False, frames=2, hw=(4, 4), audio_frames=5, text_len=6):
    def inputs(model, gen):
        device, dtype = _pd(model)
        cfg = model.config
        batch = len(text_lengths) if text_lengths else 2
        text_dim = cfg.num_attention_heads * cfg.attention_head_dim if ltx23 else cfg.caption_channels
        audio_text_dim = cfg.audio_num_attention_heads * cfg.audio_attention_head_dim if ltx23 else cfg.caption_channels
        n_video = frames * hw[0] * hw[1]
        kw = dict(
            hidden_states=_r(gen, model, batch, n_video, cfg.in_channels),
            audio_hidden_states=_r(gen, model, batch, audio_frames, cfg.audio_in_channels),
            encoder_hidden_states=_r(gen, model, batch, text_len, text_dim),
            audio_encoder_hidden_states=_r(gen, model, batch, text_len, audio_text_dim),
            timestep=_steps(gen, model, batch),
            num_frames=frames,
            height=hw[0],
            width=hw[1],
            audio_num_frames=audio_frames,
            fps=25.0,
        )
        if text_lengths:
            kw["encoder_attention_mask"] = _keep(text_lengths, text_len, device, dtype=dtype)
            kw["audio_encoder_attention_mask"] = _keep(audio_text_lengths, text_len, device, dtype=dtype)
        if ltx23:
            kw["sigma"] = _t(gen, model, batch)
            kw["audio_sigma"] = _t(gen, model, batch)
            kw["use_cross_timestep"] = True
            # IC-LoRA style multiplicative self-attention weights in [0, 1] (made additive by the model)
            kw["video_self_attention_mask"] = torch.rand(batch, n_video, n_video, generator=gen).to(device, dtype)
            # spatio-temporal guidance on block 1: item 0 attends, item 1 is perturbed (value pass-through)
            kw["spatio_temporal_guidance_blocks"] = [1]
            kw["perturbation_mask"] = torch.tensor([1.0, 0.0], device=device, dtype=dtype)
        return kw

    return inputs


def _ltx2_outputs(out):
    return (out.sample, out.audio_sample)


_LTX2_NOTE = (
    "LTX2Attention + LTX2AudioVideoAttnProcessor -> dispatch_attention_fn: video and audio self-attention "
    "(interleaved RoPE cos/sin on q and k), video->text and audio->text cross-attention, audio<->video "
    "cross-attention with separate query and key rotaries (query_rotary_emb, key_rotary_emb); qk RMSNorm "
    "across heads."
)
_add(
    ZooCase("LTX2VideoTransformer3DModel", _LTX2, _ltx2_inputs(), outputs=_ltx2_outputs, note=_LTX2_NOTE),
    ZooCase(
        "LTX2VideoTransformer3DModel",
        _LTX2,
        _ltx2_inputs([6, 2], [3, 6]),
        outputs=_ltx2_outputs,
        variant="masked",
        note=_LTX2_NOTE
        + " Text masks made additive (-10000) and expanded by prepare_attention_mask to (B, heads, 1, L) float.",
    ),
    ZooCase(
        "LTX2VideoTransformer3DModel",
        _LTX23,
        _ltx2_inputs([6, 4], [5, 6], ltx23=True),
        outputs=_ltx2_outputs,
        variant="ltx23",
        note=(
            "LTX-2.3 layout: LTX2Attention + LTX2PerturbedAttnProcessor -> dispatch_attention_fn; split RoPE, "
            "per-head sigmoid output gates, text masks, an additive (B, heads, N, N) float video self-attention "
            "mask, and STG on block 1 (item 1's self-attention output replaced by its values)."
        ),
    ),
)


# ---------------------------------------------------------------------------------------------
# LTX-Video
# ---------------------------------------------------------------------------------------------

_LTX = dict(
    in_channels=4,
    out_channels=4,
    patch_size=1,
    patch_size_t=1,
    num_attention_heads=2,
    attention_head_dim=16,
    cross_attention_dim=32,
    num_layers=2,
    caption_channels=24,
)


def _ltx_inputs(text_lengths, frames=2, hw=(4, 4), text_len=6):
    def inputs(model, gen):
        device, dtype = _pd(model)
        batch = len(text_lengths)
        return dict(
            hidden_states=_r(gen, model, batch, frames * hw[0] * hw[1], model.config.in_channels),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.caption_channels),
            timestep=_steps(gen, model, batch),
            encoder_attention_mask=_keep(text_lengths, text_len, device, dtype=torch.long),
            num_frames=frames,
            height=hw[0],
            width=hw[1],
            rope_interpolation_scale=(20 / 25, 32, 32),
        )

    return inputs


_LTX_NOTE = (
    "LTXAttention + LTXVideoAttnProcessor -> dispatch_attention_fn: video self-attention with 3-D RoPE "
    "(cos, sin over the full inner dim, applied before the head split) and qk RMSNorm across heads; "
    "video->text cross-attention with the text mask made additive (-10000) and expanded to (B, heads, 1, L)."
)
_add(
    ZooCase("LTXVideoTransformer3DModel", _LTX, _ltx_inputs([6, 6]), note=_LTX_NOTE + " Mask all ones."),
    ZooCase("LTXVideoTransformer3DModel", _LTX, _ltx_inputs([6, 3]), variant="masked", note=_LTX_NOTE),
    ZooCase(
        "LTXVideoTransformer3DModel",
        _LTX,
        _ltx_inputs([4, 0]),
        variant="fullpad",
        note=_LTX_NOTE + " Item 2 has every text token masked: the additive mask makes it a uniform average.",
    ),
)


# ---------------------------------------------------------------------------------------------
# Latte
# ---------------------------------------------------------------------------------------------

_LATTE = dict(
    sample_size=8,
    num_layers=2,
    patch_size=2,
    attention_head_dim=16,
    num_attention_heads=2,
    caption_channels=24,
    in_channels=4,
    cross_attention_dim=32,
    out_channels=8,
    attention_bias=True,
    activation_fn="gelu-approximate",
    num_embeds_ada_norm=1000,
    norm_type="ada_norm_single",
    norm_elementwise_affine=False,
    norm_eps=1e-6,
    video_length=3,
)


def _latte_inputs(model, gen):
    return dict(
        hidden_states=_r(gen, model, 2, 4, 3, 8, 8),
        encoder_hidden_states=_r(gen, model, 2, 5, model.config.caption_channels),
        timestep=_steps(gen, model, 2),
        enable_temporal_attentions=True,
    )


_add(
    ZooCase(
        "LatteTransformer3DModel",
        _LATTE,
        _latte_inputs,
        note=(
            "diffusers Attention + AttnProcessor2_0 in BasicTransformerBlock (ada_norm_single): spatial "
            "self-attention and text cross-attention per frame, then temporal self-attention per patch; "
            "no mask (the pipeline passes none). No set_attn_processor on the model."
        ),
    ),
)


# ---------------------------------------------------------------------------------------------
# LongCat audio DiT
# ---------------------------------------------------------------------------------------------

_LONGCAT_AUDIO = dict(
    dit_dim=32,
    dit_depth=2,
    dit_heads=2,
    dit_text_dim=24,
    latent_dim=8,
    ff_mult=2.0,
)


def _longcat_audio_inputs(text_lengths, audio_lengths=None, text_len=6, audio_len=10):
    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(text_lengths)
        kw = dict(
            hidden_states=_r(gen, model, batch, audio_len, model.config.latent_dim),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.dit_text_dim),
            encoder_attention_mask=_keep(text_lengths, text_len, device),
            timestep=_t(gen, model, batch),
            latent_cond=_r(gen, model, batch, audio_len, model.config.latent_dim),
        )
        if audio_lengths is not None:
            kw["attention_mask"] = _keep(audio_lengths, audio_len, device)
        return kw

    return inputs


_LONGCAT_AUDIO_NOTE = (
    "AudioDiTAttention (AttentionModuleMixin, no _default_processor_cls) + AudioDiTSelfAttnProcessor / "
    "AudioDiTCrossAttnProcessor -> dispatch_attention_fn: audio self-attention with 1-D RoPE, cross-attention "
    "with RoPE on q (audio positions) and on k (text positions); qk RMSNorm over the inner dim. No "
    "set_attn_processor on the model."
)
_add(
    ZooCase(
        "LongCatAudioDiTTransformer",
        _LONGCAT_AUDIO,
        _longcat_audio_inputs([6]),
        note=_LONGCAT_AUDIO_NOTE + " Text mask (required) all ones, no audio mask.",
    ),
    ZooCase(
        "LongCatAudioDiTTransformer",
        _LONGCAT_AUDIO,
        _longcat_audio_inputs([6, 3], [10, 7]),
        variant="masked",
        note=_LONGCAT_AUDIO_NOTE
        + " 2-D bool masks (B, L): text keys in cross-attention, audio keys in self-attention; outputs of "
        "padded audio tokens are zeroed after attention.",
    ),
)


# ---------------------------------------------------------------------------------------------
# Flux-like single-sequence image transformers: LongCat-Image, Ovis-Image
# ---------------------------------------------------------------------------------------------


def _flux_ids(text_len, grid, image_start=None, device="cpu"):
    """(txt_ids, img_ids), each (N, 3) float: text positions on axes 1 and 2, image grid after them."""
    gh, gw = grid
    txt = torch.zeros(text_len, 3)
    txt[:, 1] = torch.arange(text_len)
    txt[:, 2] = torch.arange(text_len)
    s = text_len if image_start is None else image_start
    img = torch.zeros(gh, gw, 3)
    img[..., 1] = torch.arange(gh)[:, None] + s
    img[..., 2] = torch.arange(gw)[None, :] + s
    return txt.to(device), img.reshape(-1, 3).to(device)


def _flux_like_inputs(text_dim_key, batch=2, text_len=5, grid=(2, 3), guidance=False, ids_image_start=None):
    def inputs(model, gen):
        device, _ = _pd(model)
        cfg = model.config
        txt_ids, img_ids = _flux_ids(text_len, grid, ids_image_start, device)
        kw = dict(
            hidden_states=_r(gen, model, batch, grid[0] * grid[1], cfg.in_channels),
            encoder_hidden_states=_r(gen, model, batch, text_len, cfg[text_dim_key]),
            timestep=_t(gen, model, batch),
            img_ids=img_ids,
            txt_ids=txt_ids,
        )
        if guidance:
            kw["guidance"] = _t(gen, model, batch, 1.0, 5.0)
        return kw

    return inputs


_add(
    ZooCase(
        "LongCatImageTransformer2DModel",
        dict(
            patch_size=1,
            in_channels=8,
            num_layers=1,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=24,
            pooled_projection_dim=24,
            axes_dims_rope=[4, 6, 6],
        ),
        _flux_like_inputs("joint_attention_dim"),
        note=(
            "LongCatImageAttention + LongCatImageAttnProcessor -> dispatch_attention_fn on the joint "
            "[text, image] sequence (double blocks: added k/v projections and norm_added_q/k; single blocks: "
            "one projection), qk RMSNorm, 3-axis Flux RoPE (cos, sin); no mask."
        ),
    ),
    ZooCase(
        "OvisImageTransformer2DModel",
        dict(
            patch_size=1,
            in_channels=8,
            out_channels=8,
            num_layers=1,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=24,
            axes_dims_rope=(4, 6, 6),
        ),
        _flux_like_inputs("joint_attention_dim"),
        note=(
            "OvisImageAttention + OvisImageAttnProcessor -> dispatch_attention_fn on the joint [text, image] "
            "sequence (Flux layout: double and single blocks), qk RMSNorm, 3-axis RoPE (cos, sin); no mask. "
            "No set_attn_processor on the model."
        ),
    ),
)


# ---------------------------------------------------------------------------------------------
# Lumina 2, Lumina-Next
# ---------------------------------------------------------------------------------------------

_LUMINA2 = dict(
    sample_size=8,
    patch_size=2,
    in_channels=4,
    hidden_size=32,
    num_layers=2,
    num_refiner_layers=1,
    num_attention_heads=2,
    num_kv_heads=1,
    multiple_of=16,
    axes_dim_rope=(4, 6, 6),
    axes_lens=(64, 32, 32),
    cap_feat_dim=24,
)


def _lumina2_inputs(text_lengths, text_len=6, hw=8):
    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(text_lengths)
        return dict(
            hidden_states=_r(gen, model, batch, 4, hw, hw),
            timestep=_t(gen, model, batch),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.cap_feat_dim),
            encoder_attention_mask=_keep(text_lengths, text_len, device),
        )

    return inputs


_LUMINA2_NOTE = (
    "diffusers Attention + Lumina2AttnProcessor2_0 (not dispatch: F.scaled_dot_product_attention in the "
    "processor) with image_rotary_emb as complex freqs_cis (apply_rotary_emb use_real=False), GQA by "
    "repeating k/v heads, qk RMSNorm; context refiner (text mask as bool (B, 1, 1, L)), noise refiner (no "
    "mask), joint layers over the repacked [text, image] sequence. No set_attn_processor on the model."
)
_add(
    ZooCase("Lumina2Transformer2DModel", _LUMINA2, _lumina2_inputs([6, 6]), note=_LUMINA2_NOTE + " Mask all ones."),
    ZooCase(
        "Lumina2Transformer2DModel",
        _LUMINA2,
        _lumina2_inputs([6, 3]),
        variant="masked",
        note=_LUMINA2_NOTE + " Different lengths: the joint layers get a bool key mask of the repacked lengths.",
    ),
)


_LUMINA_NEXT = dict(
    sample_size=8,
    patch_size=2,
    in_channels=4,
    hidden_size=48,
    num_layers=2,
    num_attention_heads=3,
    num_kv_heads=1,
    multiple_of=16,
    ffn_dim_multiplier=None,
    norm_eps=1e-5,
    learn_sigma=False,
    qk_norm=True,
    cross_attention_dim=24,
    scaling_factor=1.0,
)


def _lumina_next_inputs(text_lengths, text_len=6, hw=8):
    def inputs(model, gen):
        device, dtype = _pd(model)
        batch = len(text_lengths)
        head_dim = model.config.hidden_size // model.config.num_attention_heads
        tokens = hw // model.config.patch_size
        # the pipeline passes complex freqs_cis (H, W, head_dim / 2); here of random angles
        angles = torch.rand(tokens, tokens, head_dim // 2, generator=gen) * (2 * torch.pi)
        return dict(
            hidden_states=_r(gen, model, batch, 4, hw, hw),
            timestep=_t(gen, model, batch),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.cross_attention_dim),
            # the tokenizer's int64 mask, as the pipeline passes it
            encoder_mask=_keep(text_lengths, text_len, device, dtype=torch.long),
            image_rotary_emb=torch.polar(torch.ones_like(angles), angles).to(device),
            cross_attention_kwargs={},
        )

    return inputs


_LUMINA_NEXT_NOTE = (
    "diffusers Attention + LuminaAttnProcessor2_0 (not dispatch: F.scaled_dot_product_attention in the "
    "processor, returns (B, N, H, D) before the shared output projection): self-attention with complex "
    "query_rotary_emb and key_rotary_emb (image_rotary_emb input) and scale=attn.scale; cross-attention to "
    "text with RoPE on q only and scale=None; GQA by repeating k/v; LayerNorm across heads on q/k; masks are "
    "expanded bool (B, heads, N, L) (self: the model's int32 all-ones patch mask; cross: the text mask). No "
    "set_attn_processor on the model."
)
_add(
    ZooCase("LuminaNextDiT2DModel", _LUMINA_NEXT, _lumina_next_inputs([6, 6]), note=_LUMINA_NEXT_NOTE),
    ZooCase(
        "LuminaNextDiT2DModel",
        _LUMINA_NEXT,
        _lumina_next_inputs([6, 2]),
        variant="masked",
        note=_LUMINA_NEXT_NOTE,
    ),
)


# ---------------------------------------------------------------------------------------------
# MMAudio VAE (mel autoencoder)
# ---------------------------------------------------------------------------------------------

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
    ),
)


# ---------------------------------------------------------------------------------------------
# MiniMax-H3 (packed text + audio + video)
# ---------------------------------------------------------------------------------------------

_MINIMAX_H3 = dict(
    # inner dim (32) differs from hidden size (24) and RoPE covers only 12 of 16 head dims, as released
    num_attention_heads=2,
    attention_head_dim=16,
    hidden_size=24,
    num_layers=2,
    num_refiner_layers=1,
    ffn_dim=32,
    in_channels=4,
    audio_in_channels=6,
    patch_size=(1, 2, 2),
    text_dim=8,
    freq_dim=8,
    time_embed_hidden_dim=24,
    time_embed_dim=16,
    rope_freq_dim=2,
)


def _minimax_h3_inputs(model, gen, batch=2, n_text=4, n_audio=5, n_video=8):
    device, dtype = _pd(model)
    cfg = model.config
    seq = n_text + n_audio + n_video
    text_idx = torch.arange(n_text)
    audio_idx = torch.arange(n_text, n_text + n_audio)
    video_idx = torch.arange(n_text + n_audio, seq)
    tags = torch.empty(seq, dtype=torch.long)
    tags[text_idx], tags[audio_idx], tags[video_idx] = 1, 2, 0
    t_idx = torch.zeros(seq, dtype=torch.long)
    t_idx[audio_idx] = 1
    pos = torch.zeros(seq, 3)
    pos[:, 0] = torch.arange(seq)
    pos[video_idx, 1] = (torch.arange(n_video) % 4).float()
    pos[video_idx, 2] = (torch.arange(n_video) % 2).float()
    patch = cfg.in_channels * cfg.patch_size[0] * cfg.patch_size[1] * cfg.patch_size[2]
    return dict(
        hidden_states=_r(gen, model, batch, n_video, patch),
        audio_hidden_states=_r(gen, model, batch, n_audio, cfg.audio_in_channels),
        encoder_hidden_states=_r(gen, model, batch, n_text, cfg.text_dim),
        timestep=_t(gen, model, 2),
        timestep_indices=t_idx.to(device),
        token_tags=tags.to(device),
        position_ids=pos.to(device),
        video_indices=video_idx.to(device),
        audio_indices=audio_idx.to(device),
        text_indices=text_idx.to(device),
    )


_add(
    ZooCase(
        "MiniMaxH3Transformer3DModel",
        _MINIMAX_H3,
        _minimax_h3_inputs,
        outputs=lambda out: (out.sample, out.audio_sample),
        note=(
            "MiniMaxH3Attention + MiniMaxH3AttnProcessor -> dispatch_attention_fn, no mask: text token refiner "
            "(no RoPE), then full self-attention over one packed [text, audio, video] sequence with partial 3-axis "
            "RoPE (cos, sin cover 12 of 16 head dims) and q/k RMSNorm."
        ),
    ),
)


# ---------------------------------------------------------------------------------------------
# MiniMax Music 3
# ---------------------------------------------------------------------------------------------

_add(
    ZooCase(
        "MiniMaxMusic3RVQDepthDecoder",
        dict(
            hidden_size=32,
            num_layers=2,
            num_attention_heads=2,
            intermediate_size=48,
            audio_vocab_size=16,
            num_codebooks=4,
            max_position_embeddings=8,
        ),
        lambda model, gen: dict(inputs_embeds=_r(gen, model, 2, 7, model.config.hidden_size)),
        note=(
            "MiniMaxMusic3DepthAttention + MiniMaxMusic3DepthAttnProcessor -> dispatch_attention_fn with "
            "is_causal=True (no mask, no RoPE: learned positions): a small causal language model over the "
            "codebook steps."
        ),
    ),
    ZooCase(
        "MiniMaxMusic3Transformer1DModel",
        dict(
            in_channels=8,
            condition_dim=12,
            num_layers=2,
            num_attention_heads=2,
            attention_head_dim=16,
            ff_inner_dim=48,
            rotary_dim=8,
            fourier_embedding_dim=16,
        ),
        lambda model, gen: dict(
            hidden_states=_r(gen, model, 2, 8, 10),
            timestep=_t(gen, model, 2),
            encoder_hidden_states=_r(gen, model, 2, 10, 12),
        ),
        note=(
            "MiniMaxMusic3Attention + MiniMaxMusic3AttnProcessor -> dispatch_attention_fn, no mask: self-attention "
            "over [time token, latent frames] with partial rotate-half RoPE (cos, sin on the first rotary_dim head "
            "dims). No set_attn_processor on the model."
        ),
    ),
)


# ---------------------------------------------------------------------------------------------
# Mochi
# ---------------------------------------------------------------------------------------------

_MOCHI = dict(
    patch_size=2,
    num_attention_heads=2,
    attention_head_dim=16,
    num_layers=2,
    pooled_projection_dim=16,
    in_channels=4,
    out_channels=None,
    qk_norm="rms_norm",
    text_embed_dim=64,  # the text pooling has 8 heads: heads of 8
    time_embed_dim=8,
    activation_fn="swiglu",
    max_sequence_length=8,
)


def _mochi_inputs(text_lengths, frames=2, hw=8, text_len=8):
    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(text_lengths)
        return dict(
            hidden_states=_r(gen, model, batch, 4, frames, hw, hw),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.text_embed_dim),
            timestep=_steps(gen, model, batch),
            encoder_attention_mask=_keep(text_lengths, text_len, device),
        )

    return inputs


_MOCHI_NOTE = (
    "MochiAttention + MochiAttnProcessor2_0 (not dispatch: F.scaled_dot_product_attention, one call per batch "
    "item over [video, valid text tokens] gathered with the text mask, then zero-padded back); video q/k with "
    "learned-frequency 3-D RoPE (cos, sin, interleaved pairs), added text projections with their own RMSNorm; "
    "the last block is context_pre_only. Text pooling: MochiAttentionPool, one mean-token query, "
    "F.scaled_dot_product_attention with a bool (B, 1, 1, 1 + L) mask. No set_attn_processor on the model."
)
# Neither is a diffusers Attention nor an AttentionModuleMixin.
_MOCHI_EXTRA = {"attention_classes": ("MochiAttention", "MochiAttentionPool")}
_add(
    ZooCase(
        "MochiTransformer3DModel",
        _MOCHI,
        _mochi_inputs([8, 8]),
        note=_MOCHI_NOTE + " Mask all ones.",
        extra=_MOCHI_EXTRA,
    ),
    ZooCase(
        "MochiTransformer3DModel", _MOCHI, _mochi_inputs([8, 3]), variant="masked", note=_MOCHI_NOTE, extra=_MOCHI_EXTRA
    ),
    ZooCase(
        "MochiTransformer3DModel",
        _MOCHI,
        _mochi_inputs([5, 0]),
        variant="fullpad",
        note=_MOCHI_NOTE + " Item 2 keeps no text token: its video attends to itself only.",
        extra=_MOCHI_EXTRA,
    ),
)


# ---------------------------------------------------------------------------------------------
# Motif-Video
# ---------------------------------------------------------------------------------------------

_MOTIF = dict(
    in_channels=9,
    out_channels=4,
    num_attention_heads=2,
    attention_head_dim=16,
    num_layers=1,
    num_single_layers=2,
    num_decoder_layers=1,
    mlp_ratio=2.0,
    patch_size=1,
    patch_size_t=1,
    qk_norm="rms_norm",
    norm_type="layer_norm",
    text_embed_dim=24,
    image_embed_dim=8,
    rope_theta=256.0,
    rope_axes_dim=(4, 6, 6),
    enable_text_cross_attention_dual=True,
    enable_text_cross_attention_single=True,
)


def _motif_inputs(text_lengths=None, batch=2, frames=2, hw=(3, 4), text_len=6, image_tokens=3):
    def inputs(model, gen):
        device, _ = _pd(model)
        cfg = model.config
        kw = dict(
            hidden_states=_r(gen, model, batch, cfg.in_channels, frames, *hw),
            encoder_hidden_states=_r(gen, model, batch, text_len, cfg.text_embed_dim),
            timestep=_steps(gen, model, batch),
            image_embeds=_r(gen, model, batch, image_tokens, cfg.image_embed_dim),
        )
        if text_lengths is not None:
            kw["encoder_attention_mask"] = _keep(text_lengths, text_len, device, dtype=torch.long)
        return kw

    return inputs


_MOTIF_NOTE = (
    "MotifVideoAttention + MotifVideoAttnProcessor2_0 -> dispatch_attention_fn on [video, image-embeds + text] "
    "(double blocks: added projections; single blocks: concatenated), 3-axis RoPE (cos, sin) on video tokens "
    "only, qk RMSNorm; MotifVideoCrossAttention + MotifVideoCrossAttnProcessor2_0 -> dispatch_attention_fn: "
    "video->text cross-attention (image embeds sliced off) with RoPE on q only; the last single block is a "
    "decoder layer."
)
_add(
    ZooCase("MotifVideoTransformer3DModel", _MOTIF, _motif_inputs(), note=_MOTIF_NOTE + " No mask."),
    ZooCase(
        "MotifVideoTransformer3DModel",
        _MOTIF,
        _motif_inputs([6, 2]),
        variant="masked",
        note=_MOTIF_NOTE + " Bool key mask (B, 1, 1, N + L) for the joint attention, its text part for the cross.",
    ),
)


# ---------------------------------------------------------------------------------------------
# AnimateDiff: UNetMotionModel and the MotionAdapter it loads
# ---------------------------------------------------------------------------------------------

_UNET_MOTION = dict(
    block_out_channels=(16, 32),
    norm_num_groups=8,
    down_block_types=("CrossAttnDownBlockMotion", "DownBlockMotion"),
    up_block_types=("UpBlockMotion", "CrossAttnUpBlockMotion"),
    cross_attention_dim=24,
    num_attention_heads=2,
    out_channels=4,
    in_channels=4,
    layers_per_block=1,
    sample_size=8,
    motion_num_attention_heads=2,
    motion_max_seq_length=8,
)


def _unet_motion_inputs(model, gen, batch=2, frames=3):
    # the AnimateDiff pipeline repeats the prompt per frame: (batch * frames, L, D)
    return dict(
        sample=_r(gen, model, batch, 4, frames, 8, 8),
        timestep=_steps(gen, model, 1)[0],
        encoder_hidden_states=_r(gen, model, batch * frames, 5, 24),
    )


_MOTION_NOTE = (
    "diffusers Attention + AttnProcessor2_0: spatial self- and text cross-attention per frame "
    "(Transformer2DModel), temporal self-attention per pixel in the motion modules "
    "(AnimateDiffTransformer3D / TransformerTemporalModel, sinusoidal positions); no mask."
)
_add(ZooCase("UNetMotionModel", _UNET_MOTION, _unet_motion_inputs, note=_MOTION_NOTE))

_MOTION_ADAPTER = dict(
    block_out_channels=(16, 32),
    motion_layers_per_block=1,
    motion_num_attention_heads=2,
    motion_norm_num_groups=8,
    motion_max_seq_length=8,
    use_motion_mid_block=True,
)


def _motion_adapter_inputs(model, gen):
    from diffusers import UNet2DConditionModel, UNetMotionModel

    device, dtype = _pd(model)
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    torch.manual_seed(seed)
    unet2d = UNet2DConditionModel(
        block_out_channels=(16, 32),
        norm_num_groups=8,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=24,
        attention_head_dim=2,
        layers_per_block=1,
        sample_size=8,
    )
    random_init_(unet2d, seed)
    host = UNetMotionModel.from_unet2d(unet2d, motion_adapter=model)
    # share, not copy, the adapter's motion modules (from_unet2d copies their weights)
    for host_block, block in zip(host.down_blocks, model.down_blocks):
        host_block.motion_modules = block.motion_modules
    for host_block, block in zip(host.up_blocks, model.up_blocks):
        host_block.motion_modules = block.motion_modules
    host.mid_block.motion_modules = model.mid_block.motion_modules
    host = host.to(device=device, dtype=dtype).eval()
    return dict(host=host, **_unet_motion_inputs(model, gen))


_add(
    _HostedCase(
        "MotionAdapter",
        _MOTION_ADAPTER,
        _motion_adapter_inputs,
        note=(
            "MotionAdapter's forward is a no-op: its motion modules (AnimateDiffTransformer3D, diffusers "
            "Attention + AttnProcessor2_0, temporal self-attention with sinusoidal positions) run inside a "
            "UNetMotionModel built from a tiny UNet2DConditionModel by the inputs (the `host` input), sharing "
            "the adapter's modules."
        ),
    ),
)


# ---------------------------------------------------------------------------------------------
# MultiControlNetModel (two tiny SD ControlNets)
# ---------------------------------------------------------------------------------------------

_SD_CONTROLNET = dict(
    block_out_channels=(16, 32),
    layers_per_block=1,
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    cross_attention_dim=24,
    attention_head_dim=2,
    norm_num_groups=8,
    conditioning_embedding_out_channels=(8, 16),
)


def _multi_controlnet_inputs(model, gen, batch=2, text_len=5):
    device, _ = _pd(model)
    return dict(
        sample=_r(gen, model, batch, 4, 8, 8),
        timestep=_steps(gen, model, 1)[0],
        encoder_hidden_states=_r(gen, model, batch, text_len, 24),
        controlnet_cond=[_r(gen, model, batch, 3, 16, 16) for _ in model.nets],
        conditioning_scale=[0.7, 1.2][: len(model.nets)],
        # as the pipelines call it (return_dict=True unpacks the nets' output dicts by key)
        return_dict=False,
    )


def _down_and_mid(out):
    down, mid = out[0], out[1]
    return (*down, mid)


_add(
    _WrapperCase(
        "MultiControlNetModel",
        dict(controlnets=[_Fresh("ControlNetModel", **_SD_CONTROLNET), _Fresh("ControlNetModel", **_SD_CONTROLNET)]),
        _multi_controlnet_inputs,
        outputs=_down_and_mid,
        note=(
            "Two ControlNetModel: diffusers Attention + AttnProcessor2_0 (self- and text cross-attention in "
            "Transformer2DModel blocks, mid-block attention); no mask. No set_attn_processor on the wrapper."
        ),
    ),
)


# ---------------------------------------------------------------------------------------------
# NucleusMoE-Image
# ---------------------------------------------------------------------------------------------

_NUCLEUS = dict(
    patch_size=2,
    in_channels=16,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=4,
    num_key_value_heads=2,
    joint_attention_dim=24,
    axes_dims_rope=(4, 6, 6),
    moe_enabled=False,  # the MoE feed-forward does not touch attention
)


def _nucleus_inputs(text_lengths=None, batch=2, grid=(2, 3), text_len=6):
    def inputs(model, gen):
        device, _ = _pd(model)
        gh, gw = grid
        kw = dict(
            hidden_states=_r(gen, model, batch, gh * gw, model.config.in_channels),
            img_shapes=[(1, gh, gw)] * batch,
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.joint_attention_dim),
            timestep=_t(gen, model, batch),
        )
        if text_lengths is not None:
            kw["encoder_hidden_states_mask"] = _keep(text_lengths, text_len, device, dtype=torch.long)
        return kw

    return inputs


_NUCLEUS_NOTE = (
    "diffusers Attention + NucleusMoEAttnProcessor2_0 -> dispatch_attention_fn: image queries over "
    "[image, text] keys (text via added k/v projections only; q and k lengths differ), GQA by repeating k/v "
    "heads in the processor, complex RoPE (freqs_cis) on image q/k and on text k, qk RMSNorm."
)
_add(
    ZooCase("NucleusMoEImageTransformer2DModel", _NUCLEUS, _nucleus_inputs(), note=_NUCLEUS_NOTE + " No mask."),
    ZooCase(
        "NucleusMoEImageTransformer2DModel",
        _NUCLEUS,
        _nucleus_inputs([6, 2]),
        variant="masked",
        note=_NUCLEUS_NOTE + " 2-D bool key mask (B, N_img + L) through attention_kwargs.",
    ),
    ZooCase(
        "NucleusMoEImageTransformer2DModel",
        _NUCLEUS,
        _nucleus_inputs([4, 0]),
        variant="fullpad",
        note=_NUCLEUS_NOTE + " Item 2 has every text key masked (its image keys stay).",
    ),
)


# ---------------------------------------------------------------------------------------------
# OmniGen
# ---------------------------------------------------------------------------------------------

_OMNIGEN = dict(
    in_channels=4,
    patch_size=2,
    hidden_size=32,
    num_attention_heads=2,
    num_key_value_heads=1,
    intermediate_size=48,
    num_layers=2,
    pad_token_id=0,
    vocab_size=64,
    rope_scaling={"long_factor": [1.0 + 0.1 * i for i in range(8)], "short_factor": [1.0 + 0.05 * i for i in range(8)]},
    pos_embed_max_size=16,
    time_step_dim=16,
)


def _omnigen_inputs(text_lengths, text_len=9, hw=6, image_at=(1, 5)):
    """OmniGen's multimodal layout, built as its processor does: left-padded condition tokens with
    causal attention (an input image's tokens inside item 0 attend bidirectionally to each other),
    the time token, then the output image tokens, which attend to everything."""

    def inputs(model, gen):
        device, dtype = _pd(model)
        batch = len(text_lengths)
        n_img = (hw // model.config.patch_size) ** 2
        seq = text_len + 1 + n_img
        masks, positions, sizes = [], [], {}
        for b, n in enumerate(text_lengths):
            pad = text_len - n
            m = torch.zeros(seq, seq)
            m[pad:, pad:] = torch.tril(torch.ones(seq - pad, seq - pad))
            m[text_len + 1 :, pad:] = 1  # output image tokens: all non-padding keys
            m[:pad, :] = 1  # padding queries attend everywhere (their output is discarded)
            if b == 0:
                s, e = image_at[0] + pad, image_at[1] + pad
                m[s:e, s:e] = 1
                sizes[b] = [[s, e]]
            masks.append(m)
            positions.append([0] * pad + list(range(n + 1 + n_img)))
        ids = torch.randint(1, model.config.vocab_size, (batch, text_len), generator=gen)
        for b, n in enumerate(text_lengths):
            ids[b, : text_len - n] = model.config.pad_token_id
        return dict(
            hidden_states=_r(gen, model, batch, model.config.in_channels, hw, hw),
            timestep=_t(gen, model, batch),
            input_ids=ids.to(device),
            input_img_latents=[_r(gen, model, 1, model.config.in_channels, 4, 4)],
            input_image_sizes=sizes,
            attention_mask=torch.stack(masks).to(device, dtype),
            position_ids=torch.tensor(positions, device=device),
        )

    return inputs


_OMNIGEN_NOTE = (
    "diffusers Attention + OmniGenAttnProcessor2_0 (not dispatch: F.scaled_dot_product_attention in the "
    "processor) with image_rotary_emb (cos, sin of Phi-3 su-scaled RoPE) and GQA through SDPA's head "
    "broadcast of (B, H_kv, L, D) k/v; the multiplicative (B, L, L) mask (causal text, bidirectional images) is "
    "made additive with finfo.min: (B, 1, L, L) float. No set_attn_processor on the model."
)
_add(
    ZooCase("OmniGenTransformer2DModel", _OMNIGEN, _omnigen_inputs([9, 9]), note=_OMNIGEN_NOTE),
    ZooCase(
        "OmniGenTransformer2DModel",
        _OMNIGEN,
        _omnigen_inputs([9, 5]),
        variant="masked",
        note=_OMNIGEN_NOTE + " Item 2 is left-padded.",
    ),
)


# ---------------------------------------------------------------------------------------------
# PRX
# ---------------------------------------------------------------------------------------------

_PRX = dict(
    in_channels=4,
    patch_size=2,
    context_in_dim=24,
    hidden_size=32,
    mlp_ratio=2.0,
    num_heads=2,
    depth=2,
    axes_dim=[8, 8],
)


def _prx_inputs(text_lengths=None, batch=2, hw=(6, 8), text_len=6):
    def inputs(model, gen):
        device, _ = _pd(model)
        kw = dict(
            hidden_states=_r(gen, model, batch, model.config.in_channels, *hw),
            timestep=_t(gen, model, batch),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.context_in_dim),
        )
        if text_lengths is not None:
            kw["attention_mask"] = _keep(text_lengths, text_len, device)
        return kw

    return inputs


_PRX_NOTE = (
    "PRXAttention + PRXAttnProcessor2_0 -> dispatch_attention_fn: image queries over [text, image] keys (text "
    "k/v projections only, norm_added_k), 2-axis RoPE as rotation matrices on image q/k, qk RMSNorm."
)
_add(
    ZooCase("PRXTransformer2DModel", _PRX, _prx_inputs(), note=_PRX_NOTE + " No mask."),
    ZooCase(
        "PRXTransformer2DModel",
        _PRX,
        _prx_inputs([6, 2]),
        variant="masked",
        note=_PRX_NOTE + " Bool key mask (B, 1, 1, L_txt + N_img).",
    ),
    ZooCase(
        "PRXTransformer2DModel",
        _PRX,
        _prx_inputs([3, 0]),
        variant="fullpad",
        note=_PRX_NOTE + " Item 2 has every text key masked (its image keys stay).",
    ),
)


# ---------------------------------------------------------------------------------------------
# PixArt, Prior (Kandinsky 2 / unCLIP)
# ---------------------------------------------------------------------------------------------

_PIXART = dict(
    num_attention_heads=3,  # the size embeddings need a width divisible by 3
    attention_head_dim=16,
    in_channels=4,
    out_channels=8,
    num_layers=2,
    cross_attention_dim=48,
    sample_size=8,
    patch_size=2,
    caption_channels=24,
    use_additional_conditions=True,  # PixArt-alpha 1024: resolution and aspect-ratio embeddings
)


def _pixart_inputs(text_lengths, text_len=6, hw=8):
    def inputs(model, gen):
        device, dtype = _pd(model)
        batch = len(text_lengths)
        return dict(
            hidden_states=_r(gen, model, batch, 4, hw, hw),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.caption_channels),
            timestep=_steps(gen, model, batch),
            added_cond_kwargs={
                "resolution": torch.tensor([[64.0, 64.0]] * batch, device=device, dtype=dtype),
                "aspect_ratio": torch.tensor([[1.0]] * batch, device=device, dtype=dtype),
            },
            # the T5 tokenizer's int64 mask, as the pipeline passes it
            encoder_attention_mask=_keep(text_lengths, text_len, device, dtype=torch.long),
        )

    return inputs


_PIXART_NOTE = (
    "diffusers Attention + AttnProcessor2_0 in BasicTransformerBlock (ada_norm_single): image self-attention "
    "and text cross-attention; the text mask is made additive (-10000) (B, 1, L) and expanded by "
    "prepare_attention_mask to (B, heads, 1, L) float."
)
_add(
    ZooCase("PixArtTransformer2DModel", _PIXART, _pixart_inputs([6, 6]), note=_PIXART_NOTE + " Mask all ones."),
    ZooCase("PixArtTransformer2DModel", _PIXART, _pixart_inputs([6, 2]), variant="masked", note=_PIXART_NOTE),
    ZooCase(
        "PixArtTransformer2DModel",
        _PIXART,
        _pixart_inputs([4, 0]),
        variant="fullpad",
        note=_PIXART_NOTE + " Item 2 has every text token masked: the additive mask makes it a uniform average.",
    ),
)


_PRIOR = dict(
    num_attention_heads=2,
    attention_head_dim=16,
    num_layers=2,
    embedding_dim=24,
    num_embeddings=6,
    additional_embeddings=4,
)


def _prior_inputs(text_lengths, text_len=6):
    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(text_lengths)
        d = model.config.embedding_dim
        return dict(
            hidden_states=_r(gen, model, batch, d),
            timestep=_steps(gen, model, 1)[0],
            proj_embedding=_r(gen, model, batch, d),
            encoder_hidden_states=_r(gen, model, batch, text_len, d),
            attention_mask=_keep(text_lengths, text_len, device),
        )

    return inputs


_PRIOR_NOTE = (
    "diffusers Attention + AttnProcessor2_0 in BasicTransformerBlock: self-attention over [text, projected "
    "embedding, time, image embedding, prd token] with an additive causal + text-padding mask (-10000) of "
    "shape (B * heads, L, L) float (only applied when a text mask is given)."
)
_add(
    ZooCase(
        "PriorTransformer",
        _PRIOR,
        _prior_inputs([6, 6]),
        outputs=lambda out: (out.predicted_image_embedding,),
        note=_PRIOR_NOTE + " Mask all ones (causal only).",
    ),
    ZooCase(
        "PriorTransformer",
        _PRIOR,
        _prior_inputs([6, 2]),
        outputs=lambda out: (out.predicted_image_embedding,),
        variant="masked",
        note=_PRIOR_NOTE,
    ),
)


# ---------------------------------------------------------------------------------------------
# Qwen-Image, its ControlNet and Multi-ControlNet
# ---------------------------------------------------------------------------------------------

_QWEN = dict(
    patch_size=2,
    in_channels=16,
    out_channels=4,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=24,
    axes_dims_rope=(4, 6, 6),
)


def _qwen_inputs(text_lengths, grids=((1, 2, 3),), text_len=6):
    """grids: the (frames, h, w) of the target image, then of any reference images (Qwen-Image-Edit)."""

    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(text_lengths)
        n_img = sum(f * h * w for f, h, w in grids)
        cfg = _inner_config(model)
        kw = dict(
            hidden_states=_r(gen, model, batch, n_img, cfg.in_channels),
            encoder_hidden_states=_r(gen, model, batch, text_len, cfg.joint_attention_dim),
            timestep=_t(gen, model, batch),
            img_shapes=[list(grids)] * batch,
        )
        if min(text_lengths) < text_len:
            # the tokenizer's int64 mask, as the pipeline passes it
            kw["encoder_hidden_states_mask"] = _keep(text_lengths, text_len, device, dtype=torch.long)
        return kw

    return inputs


_QWEN_NOTE = (
    "diffusers Attention + QwenDoubleStreamAttnProcessor2_0 -> dispatch_attention_fn on the joint [text, image] "
    "sequence (added q/k/v projections for text), complex RoPE (freqs_cis) on both streams, qk RMSNorm."
)
_QWEN_MASK_NOTE = " The text mask becomes a bool key mask (B, 1, 1, L + N) built by the processor."
_add(
    ZooCase("QwenImageTransformer2DModel", _QWEN, _qwen_inputs([6, 6]), note=_QWEN_NOTE + " No mask."),
    ZooCase(
        "QwenImageTransformer2DModel",
        _QWEN,
        _qwen_inputs([6, 2]),
        variant="masked",
        note=_QWEN_NOTE + _QWEN_MASK_NOTE,
    ),
    ZooCase(
        "QwenImageTransformer2DModel",
        _QWEN,
        _qwen_inputs([4, 0]),
        variant="fullpad",
        note=_QWEN_NOTE + _QWEN_MASK_NOTE + " Item 2 has every text key masked (its image keys stay).",
    ),
    ZooCase(
        "QwenImageTransformer2DModel",
        dict(_QWEN, zero_cond_t=True),
        _qwen_inputs([6, 3], grids=((1, 2, 3), (1, 2, 2))),
        variant="edit",
        note=_QWEN_NOTE + _QWEN_MASK_NOTE + " Edit layout: a reference image after the target (zero_cond_t).",
    ),
)

_QWEN_CONTROLNET = dict(
    patch_size=2,
    in_channels=16,
    out_channels=4,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=24,
    axes_dims_rope=(4, 6, 6),
    extra_condition_channels=0,
)


def _qwen_controlnet_inputs(text_lengths, multi=False, grids=((1, 2, 3),), text_len=6):
    base = _qwen_inputs(text_lengths, grids, text_len)

    def inputs(model, gen):
        kw = base(model, gen)
        cond = lambda: _r(gen, model, *kw["hidden_states"].shape)  # noqa: E731
        if multi:
            # the wrapper runs its one (union) net once per condition and sums
            kw["controlnet_cond"] = [cond(), cond()]
            kw["conditioning_scale"] = [0.8, 1.1]
        else:
            kw["controlnet_cond"] = cond()
            kw["conditioning_scale"] = 0.9
        kw["return_dict"] = False
        return kw

    return inputs


def _block_samples(out):
    """return_dict=False: the list of per-block control samples."""
    return tuple(out)


_add(
    ZooCase(
        "QwenImageControlNetModel",
        _QWEN_CONTROLNET,
        _qwen_controlnet_inputs([6, 6]),
        outputs=_block_samples,
        note=_QWEN_NOTE + " No mask.",
    ),
    ZooCase(
        "QwenImageControlNetModel",
        _QWEN_CONTROLNET,
        _qwen_controlnet_inputs([6, 2]),
        outputs=_block_samples,
        variant="masked",
        note=_QWEN_NOTE + _QWEN_MASK_NOTE,
    ),
    _WrapperCase(
        "QwenImageMultiControlNetModel",
        # it accepts exactly one (union) net
        dict(controlnets=[_Fresh("QwenImageControlNetModel", **_QWEN_CONTROLNET)]),
        _qwen_controlnet_inputs([6, 2], multi=True),
        outputs=_block_samples,
        note="One QwenImageControlNetModel run for two conditions: "
        + _QWEN_NOTE
        + _QWEN_MASK_NOTE
        + " No set_attn_processor on the wrapper.",
    ),
)


# ---------------------------------------------------------------------------------------------
# Qwen-Image 2.1 (block-causal single stream)
# ---------------------------------------------------------------------------------------------

_QWEN21 = dict(
    patch_size=1,
    in_channels=4,
    out_channels=4,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    context_in_dim=12,
    mlp_ratio=2,
    axes_dims_rope=(4, 6, 6),
)


def _qwen21_inputs(vlm_layout, img_shapes, mask_rows=None, batch=2):
    """vlm_layout: the vision-language sequence as a string, 't' a text token, 'i' an image slot (2x2
    latents); the last image's slots are the target's. mask_rows: per item, the valid text length
    (keys past it are padding), or None for no mask."""

    def inputs(model, gen):
        device, _ = _pd(model)
        img_mask = torch.tensor([c == "i" for c in vlm_layout]).expand(batch, -1).to(device)
        target_slots = math.prod(img_shapes[-1]) // 4
        enc_len = len(vlm_layout) - target_slots
        n_img = sum(math.prod(s) for s in img_shapes)
        kw = dict(
            hidden_states=_r(gen, model, batch, n_img, model.config.in_channels),
            encoder_hidden_states=_r(gen, model, batch, enc_len, model.config.context_in_dim),
            timestep=_t(gen, model, batch),
            img_shapes=[list(img_shapes)] * batch,
            img_mask=img_mask,
        )
        if mask_rows is not None:
            kw["encoder_hidden_states_mask"] = _keep(mask_rows, enc_len, device, dtype=torch.long)
        return kw

    return inputs


_QWEN21_NOTE = (
    "QwenImage21Attention + QwenImage21AttnProcessor -> dispatch_attention_fn, block-causal prefill split into "
    "one call per prefix segment (text segments: bool causal-triangle masks (1, 1, S, end), AND the key mask "
    "when given) plus one for the target image; these calls pass backend=None, ignoring the module's "
    "set_attention_backend. 3-axis RoPE over the joint sequence, q/k RMSNorm."
)
_add(
    ZooCase(
        "QwenImage21Transformer2DModel",
        _QWEN21,
        _qwen21_inputs("tttti", [(1, 2, 2)]),
        note=_QWEN21_NOTE + " Text then the target image; no mask.",
    ),
    ZooCase(
        "QwenImage21Transformer2DModel",
        _QWEN21,
        _qwen21_inputs("tttittii", [(1, 2, 2), (1, 2, 4)], mask_rows=[6, 5]),
        variant="edit-masked",
        note=_QWEN21_NOTE
        + " Text, a condition image, text, the target; item 2's last text key is padding (bool (B, 1, 1, end)).",
    ),
)


# ---------------------------------------------------------------------------------------------
# RFD4 Proteina (protein structure): the denoiser and the autoencoder
# ---------------------------------------------------------------------------------------------

_RFD4 = dict(
    nlayers=2,
    token_dim=32,
    nheads=2,
    dim_cond=16,
    pair_repr_dim=8,
    latent_dim=4,
    token_type_emb_dim=8,
    cath_emb_dim=4,
    t_emb_dim=16,
    seq_sep_dim=8,
    xt_pair_dist_dim=6,
    feats_seq=("xt_bb_ca", "xt_local_latents", "token_type"),
    feats_cond_seq=("time_emb_bb_ca", "time_emb_local_latents"),
    feats_pair_repr=("xt_bb_ca_pair_dists",),
    feats_pair_cond=("time_emb_bb_ca",),
    update_pair_repr_every_n=1,
    tri_mult_c=8,
    num_sequence_classes=10,
)


def _rfd4_conditioning(batch, tokens, device):
    return {
        "is_in_context_conditioning": torch.zeros(batch, tokens, dtype=torch.bool, device=device),
        "supports_local_latent": torch.ones(batch, tokens, dtype=torch.bool, device=device),
    }


def _rfd4_inputs(lengths, tokens=7):
    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(lengths)
        return dict(
            bb_ca=randn(gen, batch, tokens, 3, device=device),  # the sampler state stays float32
            local_latents=randn(gen, batch, tokens, model.config.latent_dim, device=device),
            bb_ca_time=torch.rand(batch, generator=gen).to(device),
            local_latents_time=torch.rand(batch, generator=gen).to(device),
            padding_mask=_keep(lengths, tokens, device),
            token_type=torch.randint(0, 3, (batch, tokens), generator=gen).to(device),
            conditioning=_rfd4_conditioning(batch, tokens, device),
        )

    return inputs


def _rfd4_outputs(out):
    return (out.backbone, out.local_latents, out.sequence_logits, out.insertion_logits)


_RFD4_NOTE = (
    "RFD4ProteinaPairAttention + RFD4ProteinaPairAttnProcessor -> dispatch_attention_fn with a per-head additive "
    "float pair bias (B, heads, N, N) projected from the pair representation, padding filled with -1e4 (padded "
    "queries see every key at -1e4: uniform, not NaN); q/k RMSNorm over the width, sigmoid output gate. "
    "insertion_logits are a bilinear q.k readout (torch.bmm), not attention."
)
_add(
    ZooCase("RFD4ProteinaTransformer", _RFD4, _rfd4_inputs([7, 7]), outputs=_rfd4_outputs, note=_RFD4_NOTE),
    ZooCase(
        "RFD4ProteinaTransformer",
        _RFD4,
        _rfd4_inputs([7, 4]),
        outputs=_rfd4_outputs,
        variant="masked",
        note=_RFD4_NOTE + " Item 2 has 3 padding tokens.",
    ),
)

_RFD4_RESIDUES, _RFD4_TOKEN_TYPES = 5, 3
_RFD4_AE = dict(
    # every atom slot valid for every residue type, every type allowed: the decoded atom mask then does
    # not depend on the (discrete) residue prediction
    atom37_mask=[[True] * 37] * _RFD4_RESIDUES,
    allowed_residue_types=[[True] * _RFD4_RESIDUES] * _RFD4_TOKEN_TYPES,
    latent_dim=4,
    n_residue_types=_RFD4_RESIDUES,
    num_token_types=_RFD4_TOKEN_TYPES,
    nlayers=1,
    token_dim=32,
    nheads=2,
    dim_cond=8,
    pair_repr_dim=8,
    token_type_emb_dim=8,
    encoder_feats_seq=("token_type", "x1_a37coors_nm", "x1_a37coors_nm_rel", "chain_idx_seq"),
    decoder_feats_seq=("ca_coors_nm", "z_latent_seq", "token_type"),
)


def _rfd4_ae_conditioning(batch, tokens, device):
    return {
        **_rfd4_conditioning(batch, tokens, device),
        "chain_iid": torch.zeros(batch, tokens, dtype=torch.long, device=device),
        # every atom slot "required": the decoded atom mask does not depend on the presence head's sign
        "condition_CoordinateGroup_1_atom": torch.zeros(batch, tokens, 37, dtype=torch.long, device=device),
    }


def _rfd4_ae_inputs(lengths, tokens=6):
    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(lengths)
        seeds = torch.randint(0, 2**31 - 1, (batch,), generator=gen).tolist()
        coords = _r(gen, model, batch, tokens, 37, 3)
        padding = _keep(lengths, tokens, device)
        token_type = torch.randint(0, _RFD4_TOKEN_TYPES, (batch, tokens), generator=gen).to(device)
        conditioning = _rfd4_ae_conditioning(batch, tokens, device)
        return dict(
            coords_nm=coords,
            padding_mask=padding,
            token_type=token_type,
            atom37_mask=torch.ones(batch, tokens, 37, dtype=torch.bool, device=device),
            conditioning=conditioning,
            generator=[torch.Generator().manual_seed(s) for s in seeds],
            # decoded from the CA atom (slot 1) of the encoded structure, as a round trip
            decode=dict(
                ca_coors_nm=coords[:, :, 1], padding_mask=padding, token_type=token_type, conditioning=conditioning
            ),
        )

    return inputs


_RFD4_AE_NOTE = (
    "RFD4ProteinaPairAttention + RFD4ProteinaPairAttnProcessor -> dispatch_attention_fn without pair bias: an "
    "additive float mask (B, heads, N, N) of zeros and -1e4 on padding; q/k LayerNorm, sigmoid output gate."
)
_add(
    _EncodeDecodeCase(
        "RFD4ProteinaAutoencoder",
        _RFD4_AE,
        _rfd4_ae_inputs([6, 4]),
        note="encode then forward (= decode; forward alone runs only the decoder). " + _RFD4_AE_NOTE,
    ),
)


# ---------------------------------------------------------------------------------------------
# SD3 / SD3.5 transformer, SD3 ControlNet, SD3 Multi-ControlNet
# ---------------------------------------------------------------------------------------------

_SD3 = dict(
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
)
_SD35 = dict(_SD3, dual_attention_layers=(0,), qk_norm="rms_norm")


def _sd3_inputs(batch=2, hw=8, text_len=7, controlnet=None):
    """controlnet: None, "single" or "multi" (a condition image per net of a Multi* wrapper)."""

    def inputs(model, gen):
        cfg = _inner_config(model)
        kw = dict(
            pooled_projections=_r(gen, model, batch, cfg.pooled_projection_dim),
            timestep=_steps(gen, model, batch),
        )
        if cfg.joint_attention_dim is not None:
            kw["hidden_states"] = _r(gen, model, batch, cfg.in_channels, hw, hw)
            kw["encoder_hidden_states"] = _r(gen, model, batch, text_len, cfg.joint_attention_dim)
        else:
            # SD3.5-large ControlNet: no text; the pipeline passes the latents patch-embedded by the
            # transformer, (B, N, width)
            n = (hw // cfg.patch_size) ** 2
            kw["hidden_states"] = _r(gen, model, batch, n, cfg.num_attention_heads * cfg.attention_head_dim)
        if controlnet == "single":
            kw["controlnet_cond"] = _r(gen, model, batch, cfg.in_channels, hw, hw)
            kw["conditioning_scale"] = 0.9
            kw["return_dict"] = False
        elif controlnet == "multi":
            kw["controlnet_cond"] = [_r(gen, model, batch, cfg.in_channels, hw, hw) for _ in model.nets]
            kw["conditioning_scale"] = [0.8, 1.1][: len(model.nets)]
            kw["return_dict"] = False
        return kw

    return inputs


def _first_tuple(out):
    """return_dict=False: a 1-tuple holding the tuple of per-block control samples."""
    return tuple(out[0])


_SD3_NOTE = (
    "diffusers Attention + JointAttnProcessor2_0 (not dispatch: F.scaled_dot_product_attention) in "
    "JointTransformerBlock: joint [image, text] attention with added q/k/v projections (context_pre_only on "
    "the last block), no mask, no RoPE."
)
_SD35_NOTE = (
    " SD3.5 layout: qk RMSNorm (norm_q/k, norm_added_q/k) and a second image-only self-attention (attn2, also "
    "JointAttnProcessor2_0, without a text stream) in the dual-attention block."
)
_add(
    ZooCase("SD3Transformer2DModel", _SD3, _sd3_inputs(), note=_SD3_NOTE),
    ZooCase("SD3Transformer2DModel", _SD35, _sd3_inputs(), variant="sd35", note=_SD3_NOTE + _SD35_NOTE),
)

_SD3_CONTROLNET = dict(_SD3, num_layers=1)
_SD35_CONTROLNET = dict(
    # SD3.5-large ControlNets: no text stream (SD3SingleTransformerBlock), no image position embedding
    _SD3_CONTROLNET,
    joint_attention_dim=None,
    pos_embed_type=None,
    use_pos_embed=False,
    force_zeros_for_pooled_projection=False,
)
_add(
    ZooCase(
        "SD3ControlNetModel",
        _SD3_CONTROLNET,
        _sd3_inputs(controlnet="single"),
        outputs=_first_tuple,
        note=_SD3_NOTE,
    ),
    ZooCase(
        "SD3ControlNetModel",
        _SD35_CONTROLNET,
        _sd3_inputs(controlnet="single"),
        outputs=_first_tuple,
        variant="single",
        note=(
            "SD3.5-large ControlNet: SD3SingleTransformerBlock, diffusers Attention + JointAttnProcessor2_0 "
            "without a text stream (plain image self-attention through F.scaled_dot_product_attention)."
        ),
    ),
    _WrapperCase(
        "SD3MultiControlNetModel",
        dict(
            controlnets=[_Fresh("SD3ControlNetModel", **_SD3_CONTROLNET), _Fresh("SD3ControlNetModel", **_SD3_CONTROLNET)]
        ),
        _sd3_inputs(controlnet="multi"),
        outputs=_first_tuple,
        note="Two SD3ControlNetModel: " + _SD3_NOTE + " No set_attn_processor on the wrapper.",
    ),
)


# ---------------------------------------------------------------------------------------------
# Sana, Sana Sprint, Sana ControlNet
# ---------------------------------------------------------------------------------------------

_SANA = dict(
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
)
# Sana Sprint: guidance embedding, q/k RMSNorm across heads, scaled timesteps
_SANA_SPRINT = dict(_SANA, guidance_embeds=True, qk_norm="rms_norm_across_heads", timestep_scale=1000.0)


def _sana_inputs(text_lengths, hw=(6, 8), text_len=6, guidance=False, controlnet=False):
    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(text_lengths)
        cfg = model.config
        kw = dict(
            hidden_states=_r(gen, model, batch, cfg.in_channels, *hw),
            encoder_hidden_states=_r(gen, model, batch, text_len, cfg.caption_channels),
            timestep=_t(gen, model, batch) if guidance else _steps(gen, model, batch),
            # the Gemma tokenizer's int64 mask, as the pipeline passes it
            encoder_attention_mask=_keep(text_lengths, text_len, device, dtype=torch.long),
        )
        if guidance:
            kw["guidance"] = _t(gen, model, batch, 2.0, 5.0)
        if controlnet:
            kw["controlnet_cond"] = _r(gen, model, batch, cfg.in_channels, *hw)
            kw["conditioning_scale"] = 0.9
            kw["return_dict"] = False
        return kw

    return inputs


_SANA_NOTE = (
    "diffusers Attention: self-attention with SanaLinearAttnProcessor2_0 (ReLU linear attention, not softmax: "
    "matmuls in float32, no mask), text cross-attention with SanaAttnProcessor2_0 (F.scaled_dot_product_attention; "
    "the text mask made additive (-10000) and expanded to (B, heads, 1, L) float)."
)
_add(
    ZooCase("SanaTransformer2DModel", _SANA, _sana_inputs([6, 6]), note=_SANA_NOTE + " Mask all ones."),
    ZooCase("SanaTransformer2DModel", _SANA, _sana_inputs([6, 2]), variant="masked", note=_SANA_NOTE),
    ZooCase(
        "SanaTransformer2DModel",
        _SANA,
        _sana_inputs([4, 0]),
        variant="fullpad",
        note=_SANA_NOTE + " Item 2 has every text token masked: the additive mask makes it a uniform average.",
    ),
    ZooCase(
        "SanaTransformer2DModel",
        _SANA_SPRINT,
        _sana_inputs([6, 3], guidance=True),
        variant="sprint",
        note=_SANA_NOTE + " Sana Sprint: q/k RMSNorm across heads in both attentions, guidance embedding.",
    ),
    ZooCase(
        "SanaControlNetModel",
        dict(_SANA, num_layers=2),
        _sana_inputs([6, 3], controlnet=True),
        outputs=_first_tuple,
        note=_SANA_NOTE,
    ),
)


_SANA_VIDEO = dict(
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
    patch_size=(1, 2, 2),
    rope_max_seq_len=32,
)


def _sana_video_inputs(text_lengths, frames=2, hw=(4, 6), text_len=6):
    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(text_lengths)
        return dict(
            hidden_states=_r(gen, model, batch, model.config.in_channels, frames, *hw),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.caption_channels),
            timestep=_steps(gen, model, batch),
            encoder_attention_mask=_keep(text_lengths, text_len, device, dtype=torch.long),
        )

    return inputs


_SANA_VIDEO_NOTE = (
    "diffusers Attention: self-attention with SanaLinearAttnProcessor3_0 (ReLU linear attention with 3-D RoPE on "
    "the numerator's q/k only, not softmax; float32 matmuls), text cross-attention with SanaAttnProcessor2_0 -> "
    "dispatch_attention_fn (text mask additive (-10000), expanded to (B, heads, 1, L) float); q/k RMSNorm "
    "across heads."
)
_add(
    ZooCase("SanaVideoTransformer3DModel", _SANA_VIDEO, _sana_video_inputs([6, 6]), note=_SANA_VIDEO_NOTE),
    ZooCase(
        "SanaVideoTransformer3DModel",
        _SANA_VIDEO,
        _sana_video_inputs([6, 2]),
        variant="masked",
        note=_SANA_VIDEO_NOTE,
    ),
)


# ---------------------------------------------------------------------------------------------
# SANA-WM (world model, camera control)
# ---------------------------------------------------------------------------------------------

_SANA_WM = dict(
    in_channels=4,
    num_layers=2,  # with softmax_every_n=2: block 0 is a GDN block, block 1 a softmax block
    hidden_size=32,
    num_attention_heads=2,
    patch_size=(1, 1, 1),
    softmax_every_n=2,
    linear_head_dim=16,
    t_kernel_size=3,
    conv_kernel_size=4,
    caption_channels=12,
    mlp_ratio=2.0,
    chunk_plucker_channels=8,
    chunk_plucker_post_attn_blocks=2,
)


def _camera_conditions(batch, frames, hw, device):
    """(B, F, 20): a flat 4x4 camera-to-world matrix (a small random rotation about y and a forward
    translation) then pinhole intrinsics [fx, fy, cx, cy] centred on the latent grid."""
    h, w = hw
    angle = torch.linspace(0, 0.2, frames)
    c2w = torch.eye(4).repeat(batch, frames, 1, 1)
    c2w[..., 0, 0], c2w[..., 0, 2] = angle.cos(), angle.sin()
    c2w[..., 2, 0], c2w[..., 2, 2] = -angle.sin(), angle.cos()
    c2w[..., 2, 3] = torch.arange(frames, dtype=torch.float32) * 0.1
    intrinsics = torch.tensor([float(w), float(h), w / 2, h / 2]).expand(batch, frames, 4)
    return torch.cat([c2w.flatten(start_dim=-2), intrinsics], dim=-1).to(device)


def _sana_wm_inputs(text_lengths, frames=4, hw=(6, 8), text_len=6, valid_frames=None):
    def inputs(model, gen):
        device, dtype = _pd(model)
        batch = len(text_lengths)
        cfg = model.config
        kw = dict(
            hidden_states=_r(gen, model, batch, cfg.in_channels, frames, *hw),
            timestep=torch.randint(0, 1000, (batch, 1, frames), generator=gen).to(device, dtype),
            encoder_hidden_states=_r(gen, model, batch, 1, text_len, cfg.caption_channels),
            encoder_attention_mask=_keep(text_lengths, text_len, device, dtype=torch.long),
            camera_conditions=_camera_conditions(batch, frames, hw, device).to(dtype),
            chunk_plucker=_r(gen, model, batch, cfg.chunk_plucker_channels, frames, *hw),
        )
        if valid_frames is not None:
            kw["frame_valid_mask"] = _keep(valid_frames, frames, device)
        return kw

    return inputs


_SANA_WM_NOTE = (
    "Not diffusers attention processors except the text cross-attention: MultiHeadCrossAttention "
    "(AttentionModuleMixin) + SanaWMCrossAttnProcessor -> dispatch_attention_fn with a bool text key mask "
    "(B, 1, 1, L). Self-attention of GDN blocks: SanaWMBidirectionalGDNAttention (bidirectional gated-delta-rule "
    "linear attention, RoPE on the numerator only) and SanaWMBidirectionalGDNCamAttention (the same in UCPE camera "
    "ray space) -- not softmax; of softmax blocks: SanaWMSoftmaxAttention (F.scaled_dot_product_attention with RoPE, "
    "q/k/v cast to bfloat16 even in a float32 model) and SanaWMSoftmaxCamAttention (UCPE ray transforms, bfloat16, "
    "head dim zero-padded to 128 so the default scale is 1/sqrt(128), additive -1e9 key bias on padded frames)."
)
# None of the four self-attention classes is a diffusers Attention or an AttentionModuleMixin.
_SANA_WM_EXTRA = {
    "attention_classes": (
        "SanaWMBidirectionalGDNAttention",
        "SanaWMBidirectionalGDNCamAttention",
        "SanaWMSoftmaxAttention",
        "SanaWMSoftmaxCamAttention",
    )
}
_add(
    ZooCase(
        "SanaWMTransformer3DModel",
        _SANA_WM,
        _sana_wm_inputs([6]),
        note=_SANA_WM_NOTE,
        extra=_SANA_WM_EXTRA,
    ),
    ZooCase(
        "SanaWMTransformer3DModel",
        _SANA_WM,
        _sana_wm_inputs([6, 3], valid_frames=[4, 3]),
        variant="masked",
        note=_SANA_WM_NOTE + " Item 2: text padding and a padded last frame (frame_valid_mask).",
        extra=_SANA_WM_EXTRA,
    ),
)


# ---------------------------------------------------------------------------------------------
# SANA-WM stage-2 refiner (LTX-2 based, video only)
# ---------------------------------------------------------------------------------------------

_SANA_WM_REFINER = dict(
    in_channels=4,
    out_channels=4,
    patch_size=1,
    patch_size_t=1,
    num_attention_heads=2,
    attention_head_dim=16,
    cross_attention_dim=32,
    audio_in_channels=4,
    audio_out_channels=4,
    audio_num_attention_heads=2,
    audio_attention_head_dim=8,
    audio_cross_attention_dim=16,
    num_layers=2,
    qk_norm="rms_norm_across_heads",
    caption_channels=24,
    rope_double_precision=False,
)


def _sana_wm_refiner_inputs(text_lengths, frames=2, hw=(4, 4), text_len=6):
    def inputs(model, gen):
        device, dtype = _pd(model)
        batch = len(text_lengths)
        n = frames * hw[0] * hw[1]
        inner = model.config.num_attention_heads * model.config.attention_head_dim
        # the caller supplies the video RoPE: random angles in the interleaved layout, (B, N, inner)
        cos, sin = random_angles_rotary(gen, n, inner, dtype=dtype, device=device)
        return dict(
            hidden_states=_r(gen, model, batch, n, model.config.in_channels),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.caption_channels),
            timestep=(torch.rand(batch, n, generator=gen) * 1000).to(device, dtype),
            video_rotary_emb=(cos.expand(batch, -1, -1), sin.expand(batch, -1, -1)),
            encoder_attention_mask=_keep(text_lengths, text_len, device, dtype=dtype),
        )

    return inputs


_SANA_WM_REFINER_NOTE = (
    "SanaWMLTX2Attention: video self-attention with SanaWMLTX2RefinerAttnProcessor -> dispatch_attention_fn (no mask; "
    "interleaved RoPE from the video_rotary_emb input; the KV-cache sink/history paths are not exercised), video->text "
    "cross-attention with SanaWMLTX2AudioVideoAttnProcessor -> dispatch_attention_fn (text mask additive, "
    "(B, heads, 1, L) float); qk RMSNorm across heads. The audio attention modules are built (checkpoint layout) "
    "but the video-only forward never calls them."
)
# Built but never called by this model's forward.
_SANA_WM_REFINER_EXTRA = {
    "uncalled_attention": (
        ("audio_attn1", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn"),
        "the refiner's forward is video-only; the LTX-2 audio submodules exist so checkpoints load",
    )
}
_add(
    ZooCase(
        "SanaWMLTX2RefinerTransformer3DModel",
        _SANA_WM_REFINER,
        _sana_wm_refiner_inputs([6, 6]),
        note=_SANA_WM_REFINER_NOTE,
        extra=_SANA_WM_REFINER_EXTRA,
    ),
    ZooCase(
        "SanaWMLTX2RefinerTransformer3DModel",
        _SANA_WM_REFINER,
        _sana_wm_refiner_inputs([6, 2]),
        variant="masked",
        note=_SANA_WM_REFINER_NOTE,
        extra=_SANA_WM_REFINER_EXTRA,
    ),
)


# ---------------------------------------------------------------------------------------------
# SkyReels-V2
# ---------------------------------------------------------------------------------------------

_SKYREELS = dict(
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
)
# image-to-video: CLIP image tokens through added k/v projections
_SKYREELS_I2V = dict(_SKYREELS, image_dim=12, added_kv_proj_dim=32, in_channels=8)
# diffusion forcing: block-causal self-attention over frames, one timestep per frame
_SKYREELS_DF = dict(_SKYREELS, num_frame_per_block=2, inject_sample_info=True)

# the I2V processors split the context at a hard-coded 512 text tokens
_WAN_TEXT_LEN_I2V = 512


def _wan_like_inputs(batch=2, frames=4, hw=(4, 6), text_len=6, image_tokens=0, diffusion_forcing=False, fps=False):
    def inputs(model, gen):
        cfg = model.config
        kw = dict(
            hidden_states=_r(gen, model, batch, cfg.in_channels, frames, *hw),
            timestep=_steps(gen, model, batch),
            encoder_hidden_states=_r(gen, model, batch, text_len, cfg.text_dim),
        )
        if image_tokens:
            kw["encoder_hidden_states_image"] = _r(gen, model, batch, image_tokens, cfg.image_dim)
        if diffusion_forcing:
            kw["timestep"] = torch.randint(1, 1000, (batch, frames), generator=gen).to(kw["hidden_states"])
            kw["enable_diffusion_forcing"] = True
        if fps:
            # the pipeline's fps index: 0 for 16 fps, 1 otherwise (one value for the whole batch)
            kw["fps"] = [0] * batch
        return kw

    return inputs


_SKYREELS_NOTE = (
    "SkyReelsV2Attention + SkyReelsV2AttnProcessor -> dispatch_attention_fn: video self-attention with 3-D RoPE "
    "(cos, sin, interleaved pairs), text cross-attention; qk RMSNorm across heads."
)
_add(
    ZooCase("SkyReelsV2Transformer3DModel", _SKYREELS, _wan_like_inputs(), note=_SKYREELS_NOTE + " No mask."),
    ZooCase(
        "SkyReelsV2Transformer3DModel",
        _SKYREELS_I2V,
        _wan_like_inputs(text_len=_WAN_TEXT_LEN_I2V, image_tokens=5),
        variant="i2v",
        note=_SKYREELS_NOTE
        + " I2V: a second dispatch_attention_fn call per cross-attention over the image tokens (add_k/v_proj, "
        "norm_added_k), summed with the text attention; the context is split at 512 text tokens.",
    ),
    ZooCase(
        "SkyReelsV2Transformer3DModel",
        _SKYREELS_DF,
        # batch 1, as the pipeline runs it: the fps term broadcasts wrongly for batch > 1
        _wan_like_inputs(batch=1, diffusion_forcing=True, fps=True),
        variant="df",
        note=_SKYREELS_NOTE
        + " Diffusion forcing: a block-causal bool self-attention mask (1, 1, N, N) over 2-frame blocks, "
        "per-frame timesteps, fps conditioning.",
    ),
)


# ---------------------------------------------------------------------------------------------
# Wan 2.1 / 2.2, Wan-VACE
# ---------------------------------------------------------------------------------------------

_WAN = dict(
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
)
# Wan 2.1 I2V: CLIP image tokens with added k/v projections
_WAN_I2V = dict(_WAN, in_channels=8, image_dim=12, added_kv_proj_dim=32)


def _wan_ti2v_inputs(model, gen, batch=2, frames=4, hw=(4, 6), text_len=6):
    """Wan 2.2 TI2V: one timestep per patch token (the first frame's tokens at 0, as the pipeline does)."""
    kw = _wan_like_inputs(batch=batch, frames=frames, hw=hw, text_len=text_len)(model, gen)
    tokens_per_frame = (hw[0] // 2) * (hw[1] // 2)
    t = torch.randint(1, 1000, (batch, 1), generator=gen).float().expand(batch, frames * tokens_per_frame).clone()
    t[:, :tokens_per_frame] = 0
    kw["timestep"] = t.to(kw["hidden_states"])
    return kw


_WAN_NOTE = (
    "WanAttention + WanAttnProcessor -> dispatch_attention_fn: video self-attention with 3-D RoPE (cos, sin, "
    "interleaved pairs), text cross-attention; qk RMSNorm across heads; no mask."
)
_WAN_I2V_NOTE = (
    " I2V: the cross-attention makes a second dispatch_attention_fn call over the image tokens (add_k/v_proj, "
    "norm_added_k) and sums it with the text attention; the context is split at a hard-coded 512 text tokens."
)
_add(
    ZooCase("WanTransformer3DModel", _WAN, _wan_like_inputs(), note=_WAN_NOTE),
    ZooCase(
        "WanTransformer3DModel",
        _WAN_I2V,
        _wan_like_inputs(text_len=_WAN_TEXT_LEN_I2V, image_tokens=5),
        variant="i2v",
        note=_WAN_NOTE + _WAN_I2V_NOTE,
    ),
    ZooCase(
        "WanTransformer3DModel",
        _WAN,
        _wan_ti2v_inputs,
        variant="ti2v",
        note=_WAN_NOTE + " Wan 2.2 TI2V: per-token timesteps (B, N).",
    ),
)

_WAN_VACE = dict(_WAN, num_layers=2, vace_layers=[0, 1], vace_in_channels=6)


def _wan_vace_inputs(model, gen, batch=2, frames=4, hw=(4, 6)):
    kw = _wan_like_inputs(batch=batch, frames=frames, hw=hw)(model, gen)
    kw["control_hidden_states"] = _r(gen, model, batch, model.config.vace_in_channels, frames, *hw)
    kw["control_hidden_states_scale"] = torch.tensor([0.8, 1.2], device=kw["hidden_states"].device)
    return kw


_add(
    ZooCase(
        "WanVACETransformer3DModel",
        _WAN_VACE,
        _wan_vace_inputs,
        note="WanAttention + WanAttnProcessor -> dispatch_attention_fn in the main and the VACE control blocks: "
        "video self-attention with 3-D RoPE, text cross-attention, qk RMSNorm across heads; no mask.",
    ),
)


# ---------------------------------------------------------------------------------------------
# Wan-Animate
# ---------------------------------------------------------------------------------------------

_WAN_ANIMATE = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=12,  # 2 * latent + 4
    latent_channels=4,
    out_channels=4,
    text_dim=24,
    freq_dim=16,
    ffn_dim=48,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    image_dim=16,
    added_kv_proj_dim=32,  # the released checkpoint's layout (= inner dim)
    rope_max_seq_len=32,
    motion_encoder_channel_sizes={"4": 16, "8": 16, "16": 16},
    motion_encoder_size=16,
    motion_style_dim=8,
    motion_dim=4,
    motion_encoder_dim=16,
    face_encoder_hidden_dim=16,
    face_encoder_num_heads=2,
    inject_face_latents_blocks=2,
)


def _wan_animate_inputs(model, gen, batch=1, frames=5, hw=(8, 8), face_frames=13, image_tokens=5):
    """frames latent frames (the reference frame first); the face encoder turns face_frames pixel frames
    into frames - 1 motion frames, plus a leading zero one."""
    cfg = model.config
    return dict(
        hidden_states=_r(gen, model, batch, cfg.in_channels, frames, *hw),
        timestep=_steps(gen, model, batch),
        encoder_hidden_states=_r(gen, model, batch, _WAN_TEXT_LEN_I2V, cfg.text_dim),
        encoder_hidden_states_image=_r(gen, model, batch, image_tokens, cfg.image_dim),
        pose_hidden_states=_r(gen, model, batch, cfg.latent_channels, frames - 1, *hw),
        face_pixel_values=_r(gen, model, batch, 3, face_frames, cfg.motion_encoder_size, cfg.motion_encoder_size),
    )


_add(
    ZooCase(
        "WanAnimateTransformer3DModel",
        _WAN_ANIMATE,
        _wan_animate_inputs,
        note=(
            "WanAttention + WanAttnProcessor -> dispatch_attention_fn (video self-attention with 3-D RoPE; text "
            "cross-attention plus a second call over the CLIP-image tokens (added k/v), the context split at 512 "
            "text tokens), and "
            "WanAnimateFaceBlockCrossAttention + WanAnimateFaceBlockAttnProcessor -> dispatch_attention_fn: per-frame "
            "cross-attention of each frame's video tokens to that frame's face-motion tokens (batch and frames "
            "folded: (B * T, S / T) queries over (B * T, N) keys); qk RMSNorm; no mask."
        ),
    ),
)


# Wan-Animate-2: a 5-frame 32x32 segment -> 4x4 latents, 2 reference latent frames, 3 generation ones.
_WAN_ANIMATE2 = dict(
    patch_size=(1, 2, 2),
    text_len=16,
    in_dim=4 + 8,  # latents + conditioning latents (with their i2v mask channels)
    dim=32,
    ffn_dim=48,
    freq_dim=16,
    text_dim=24,
    out_dim=4,
    num_heads=2,
    num_layers=2,
    cross_attn_norm=True,
    use_img_emb=True,
)
_WAN_ANIMATE2_CLIP_DIM = 1280  # the image projection hard-codes CLIP's width


def _wan_animate2_inputs(model, gen, ref_frames=2, hw=(4, 4), text_len=8, clip_len=4, generation_pass=False):
    device, _ = _pd(model)
    cfg = model.config
    patches = (hw[0] // 2) * (hw[1] // 2)
    latent, cond = cfg.out_dim, cfg.in_dim - cfg.out_dim

    def one_pass(frames):
        return dict(
            hidden_states=[_r(gen, model, latent, frames, *hw)],
            encoder_hidden_states=[_r(gen, model, text_len, cfg.text_dim)],
            condition_latents=[_r(gen, model, cond, frames, *hw)],
            encoder_hidden_states_image=_r(gen, model, 1, clip_len, _WAN_ANIMATE2_CLIP_DIM),
            seq_len=frames * patches,
        )

    grid = torch.tensor([[ref_frames, hw[0] // 2, hw[1] // 2]], dtype=torch.long)
    reference = dict(one_pass(ref_frames), timestep=torch.tensor([1.0], device=device), offset_grid_sizes=grid)
    if not generation_pass:
        return dict(reference=reference)
    generation = dict(
        one_pass(ref_frames + 1),
        timestep=_steps(gen, model, 1),
        reference_grid_sizes=grid,
        origin_len=5,
        origin_area=[8 * hw[0], 8 * hw[1]],
    )
    return dict(reference=reference, generation=generation)


_WAN_ANIMATE2_NOTE = (
    "WanAnimate2Attention: self-attention with WanAnimate2AttnProcessor; the reference pass runs it dense through "
    "dispatch_attention_fn (module backend, no mask) and caches K/V; the generation pass packs [generation | cached "
    "reference] into 128-aligned buffers and calls dispatch_attention_fn with backend=FLEX hard-coded and a flex "
    "BlockMask (each frame sees all generation tokens plus the same-frame reference tokens). RoPE via rope_apply "
    "(float64). Cross-attention: WanAnimate2CrossAttnProcessor -> dispatch_attention_fn, text plus a second call over "
    "the CLIP image tokens (added k/v). qk RMSNorm."
)
_add(
    _ReferenceThenGenerateCase(
        "WanAnimate2Transformer3DModel",
        _WAN_ANIMATE2,
        _wan_animate2_inputs,
        note="The reference pass only. " + _WAN_ANIMATE2_NOTE,
    ),
    _ReferenceThenGenerateCase(
        "WanAnimate2Transformer3DModel",
        _WAN_ANIMATE2,
        lambda model, gen: _wan_animate2_inputs(model, gen, generation_pass=True),
        variant="generate",
        note="Reference pass, then the generation pass (flex BlockMask, eager flex here). " + _WAN_ANIMATE2_NOTE,
        # the generation pass builds its BlockMask with create_block_mask(_compile=True): torch.compile on the CPU
        extra={"slow": "create_block_mask(_compile=True) compiles with torch.compile: ~20 s on a CPU"},
    ),
)


# ---------------------------------------------------------------------------------------------
# Z-Image and its ControlNet
# ---------------------------------------------------------------------------------------------

_ZIMAGE = dict(
    all_patch_size=(2,),
    all_f_patch_size=(1,),
    in_channels=4,
    dim=32,
    n_layers=2,
    n_refiner_layers=1,
    n_heads=2,
    n_kv_heads=2,
    qk_norm=True,
    cap_feat_dim=24,
    rope_theta=256.0,
    t_scale=1000.0,
    axes_dims=[4, 6, 6],
    axes_lens=[128, 32, 32],
)


def _zimage_inputs(cap_lengths, hw=(8, 8), controlnet=False):
    """Lists of per-item tensors, as the model takes them; captions of different lengths (each padded to a
    multiple of 32 with a learned pad token inside the model) make the batch need a key mask."""

    def inputs(model, gen):
        cfg = model.config
        c = getattr(cfg, "in_channels", None) or 4
        cap_dim = getattr(cfg, "cap_feat_dim", None) or 24
        kw = dict(
            x=[_r(gen, model, c, 1, *hw) for _ in cap_lengths],
            t=_t(gen, model, len(cap_lengths)),
            cap_feats=[_r(gen, model, n, cap_dim) for n in cap_lengths],
        )
        if controlnet:
            kw["control_context"] = [_r(gen, model, cfg.control_in_dim, 1, *hw) for _ in cap_lengths]
            kw["conditioning_scale"] = 0.9
        else:
            kw["return_dict"] = False
        return kw

    return inputs


def _zimage_outputs(out):
    """return_dict=False: a 1-tuple holding the list of per-item samples."""
    return tuple(out[0])


_ZIMAGE_NOTE = (
    "diffusers Attention + ZSingleStreamAttnProcessor -> dispatch_attention_fn: noise refiner (image tokens), "
    "context refiner (caption tokens) and main layers over the unified [image, caption] sequence; complex RoPE "
    "(freqs_cis keyword, view_as_complex), qk RMSNorm. No set_attn_processor on the model."
)
_ZIMAGE_MASK_NOTE = (
    " Captions of different padded lengths: a bool key mask (B, 1, 1, L) from the per-item lengths (pad-to-32 "
    "tokens inside an item are attended)."
)
_add(
    ZooCase(
        "ZImageTransformer2DModel",
        _ZIMAGE,
        _zimage_inputs([7, 20]),
        outputs=_zimage_outputs,
        note=_ZIMAGE_NOTE + " Both captions pad to 32 tokens: no mask.",
    ),
    ZooCase(
        "ZImageTransformer2DModel",
        _ZIMAGE,
        _zimage_inputs([7, 40]),
        outputs=_zimage_outputs,
        variant="masked",
        note=_ZIMAGE_NOTE + _ZIMAGE_MASK_NOTE,
    ),
)

_ZIMAGE_CONTROLNET = dict(
    control_layers_places=[0, 1],
    control_refiner_layers_places=[0],
    control_in_dim=4,
    add_control_noise_refiner="control_noise_refiner",
    all_patch_size=(2,),
    all_f_patch_size=(1,),
    dim=32,
    n_refiner_layers=1,
    n_heads=2,
    n_kv_heads=2,
    qk_norm=True,
)


def _control_samples(out):
    """A dict {layer index: control sample}."""
    return tuple(out[k] for k in sorted(out))


_add(
    _SharedWithTransformerCase(
        "ZImageControlNetModel",
        _ZIMAGE_CONTROLNET,
        _zimage_inputs([7, 40], controlnet=True),
        outputs=_control_samples,
        note=_ZIMAGE_NOTE.replace(" No set_attn_processor on the model.", "")
        + " Control blocks and a control noise refiner (ZImageControlTransformerBlock), plus the transformer's "
        "noise and context refiners shared through from_transformer."
        + _ZIMAGE_MASK_NOTE
        + " No set_attn_processor on the model.",
        extra={"transformer": ("ZImageTransformer2DModel", _ZIMAGE)},
    ),
)


# ---------------------------------------------------------------------------------------------
# Stable Audio Open DiT
# ---------------------------------------------------------------------------------------------

_STABLE_AUDIO = dict(
    sample_size=8,
    in_channels=4,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    num_key_value_attention_heads=1,
    out_channels=4,
    cross_attention_dim=24,
    time_proj_dim=16,
    global_states_input_dim=12,
    cross_attention_input_dim=20,
)


def _half_split_rotary(gen, tokens, dim, dtype, device):
    """(cos, sin) of random angles, each (tokens, dim), in the rotate-half layout (the angles of the
    first half repeated in the second), as get_1d_rotary_pos_embed(repeat_interleave_real=False) builds."""
    angles = torch.rand(tokens, dim // 2, generator=gen) * (2 * math.pi)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(device, dtype), angles.sin().to(device, dtype)


def _stable_audio_inputs(lengths=None, text_lengths=None, batch=2, length=10, text_len=6):
    def inputs(model, gen):
        device, dtype = _pd(model)
        cfg = model.config
        kw = dict(
            hidden_states=_r(gen, model, batch, cfg.in_channels, length),
            timestep=_steps(gen, model, 1),
            encoder_hidden_states=_r(gen, model, batch, text_len, cfg.cross_attention_input_dim),
            global_hidden_states=_r(gen, model, batch, 1, cfg.global_states_input_dim),
            # partial RoPE over half the head dim, for [global token, latents], random angles
            rotary_embedding=_half_split_rotary(gen, length + 1, cfg.attention_head_dim // 2, dtype, device),
        )
        if lengths is not None:
            kw["attention_mask"] = _keep(lengths, length, device)
            kw["encoder_attention_mask"] = _keep(text_lengths, text_len, device)
        return kw

    return inputs


_STABLE_AUDIO_NOTE = (
    "diffusers Attention + StableAudioAttnProcessor2_0 (not dispatch: F.scaled_dot_product_attention): self-attention "
    "with partial RoPE (rotary_embedding input, (cos, sin) over half the head dim, rotate-half layout) and GQA by "
    "repeating k/v heads; cross-attention to text (RoPE on q only)."
)
_add(
    ZooCase(
        "StableAudioDiTModel",
        _STABLE_AUDIO,
        _stable_audio_inputs(),
        note=_STABLE_AUDIO_NOTE + " No mask (the pipeline zeroes padded text embeddings instead).",
    ),
    ZooCase(
        "StableAudioDiTModel",
        _STABLE_AUDIO,
        _stable_audio_inputs([10, 7], [6, 3]),
        variant="masked",
        note=_STABLE_AUDIO_NOTE
        + " Bool key masks given: self (B, N) with the global token prepended, cross (B, L); prepare_attention_mask "
        "expands them to (B, heads, 1, L) bool.",
    ),
)


_STABLE_AUDIO3 = dict(
    io_channels=8,
    patch_size=1,
    embed_dim=32,
    depth=2,
    num_heads=2,
    cond_token_dim=16,
    global_cond_dim=12,
    local_add_cond_dim=5,
    timestep_features_dim=16,
    ff_mult=2,
    num_memory_tokens=3,
    use_differential_attention=True,  # as the released SA3 Medium
)


def _stable_audio3_inputs(text_lengths=None, batch=2, length=12, text_len=5):
    def inputs(model, gen):
        device, _ = _pd(model)
        cfg = model.config
        kw = dict(
            hidden_states=_r(gen, model, batch, cfg.io_channels, length),
            timestep=_t(gen, model, batch),
            encoder_hidden_states=_r(gen, model, batch, text_len, cfg.cond_token_dim),
            global_hidden_states=_r(gen, model, batch, cfg.global_cond_dim),
        )
        if text_lengths is not None:
            kw["encoder_attention_mask"] = _keep(text_lengths, text_len, device)
        return kw

    return inputs


_STABLE_AUDIO3_NOTE = (
    "StableAudio3SelfAttention + StableAudio3SelfAttnProcessor and StableAudio3CrossAttention + "
    "StableAudio3CrossAttnProcessor -> dispatch_attention_fn. Differential attention: each module returns "
    "attn(q1, k1, v) - attn(q2, k2, v), two dispatch calls sharing v; self-attention over [memory tokens, latents] "
    "with partial rotate-half RoPE, qk RMSNorm; cross-attention to text, no RoPE."
)
_add(
    ZooCase("StableAudio3DiTModel", _STABLE_AUDIO3, _stable_audio3_inputs(), note=_STABLE_AUDIO3_NOTE + " No mask."),
    ZooCase(
        "StableAudio3DiTModel",
        _STABLE_AUDIO3,
        _stable_audio3_inputs([5, 2]),
        variant="masked",
        note=_STABLE_AUDIO3_NOTE
        + " With a text mask the model swaps padded text for a learned padding embedding and drops the mask: "
        "the attention calls still get none (the cross processor accepts a context_mask the model never passes).",
    ),
    ZooCase(
        "StableAudio3DiTModel",
        dict(_STABLE_AUDIO3, use_differential_attention=False),
        _stable_audio3_inputs(),
        variant="plain",
        note=(
            "StableAudio3SelfAttention + StableAudio3SelfAttnProcessor and StableAudio3CrossAttention + "
            "StableAudio3CrossAttnProcessor -> dispatch_attention_fn, configured without differential attention "
            "(one call per module): self-attention over [memory tokens, latents] with partial rotate-half RoPE, qk "
            "RMSNorm; cross-attention to text, no RoPE. No mask."
        ),
    ),
)


# ---------------------------------------------------------------------------------------------
# Stable Cascade (Würstchen v3) UNets: the prior (stage C) and the decoder (stage B)
# ---------------------------------------------------------------------------------------------

_CASCADE_PRIOR = dict(
    in_channels=4,
    out_channels=4,
    timestep_ratio_embedding_dim=16,
    conditioning_dim=32,
    block_out_channels=(32, 32),
    num_attention_heads=(2, 2),
    down_num_layers_per_block=(1, 1),
    up_num_layers_per_block=(1, 1),
    clip_text_in_channels=24,
    clip_text_pooled_in_channels=24,
    clip_image_in_channels=12,
    clip_seq=2,
    dropout=(0.1, 0.1),  # as released; inactive in eval mode
    switch_level=[False],
)
_CASCADE_DECODER = dict(
    in_channels=4,
    out_channels=4,
    timestep_ratio_embedding_dim=16,
    conditioning_dim=32,
    block_out_channels=(16, 32),
    num_attention_heads=(0, 2),
    down_num_layers_per_block=(1, 1),
    up_num_layers_per_block=(1, 1),
    block_types_per_layer=(
        ("SDCascadeResBlock", "SDCascadeTimestepBlock"),
        ("SDCascadeResBlock", "SDCascadeTimestepBlock", "SDCascadeAttnBlock"),
    ),
    clip_text_pooled_in_channels=24,
    clip_seq=2,
    effnet_in_channels=6,
    pixel_mapper_in_channels=3,
    self_attn=True,
    dropout=(0, 0),
    switch_level=None,
)


def _cascade_inputs(decoder=False, batch=2, hw=8, text_len=5):
    def inputs(model, gen):
        cfg = model.config
        kw = dict(
            sample=_r(gen, model, batch, cfg.in_channels, hw, hw),
            timestep_ratio=_t(gen, model, batch),
            clip_text_pooled=_r(gen, model, batch, 1, cfg.clip_text_pooled_in_channels),
        )
        if decoder:
            kw["effnet"] = _r(gen, model, batch, cfg.effnet_in_channels, hw // 2, hw // 2)
            kw["pixels"] = _r(gen, model, batch, 3, 8, 8)
        else:
            kw["clip_text"] = _r(gen, model, batch, text_len, cfg.clip_text_in_channels)
            kw["clip_img"] = _r(gen, model, batch, 1, cfg.clip_image_in_channels)
        return kw

    return inputs


_CASCADE_NOTE = (
    "diffusers Attention + AttnProcessor2_0 in SDCascadeAttnBlock: attention of the image tokens over [image "
    "tokens, mapped conditioning tokens] (self_attn=True concatenates them as keys); no mask. No set_attn_processor "
    "on the model."
)
_add(
    ZooCase("StableCascadeUNet", _CASCADE_PRIOR, _cascade_inputs(), note="Prior (stage C). " + _CASCADE_NOTE),
    ZooCase(
        "StableCascadeUNet",
        _CASCADE_DECODER,
        _cascade_inputs(decoder=True),
        variant="decoder",
        note="Decoder (stage B): attention in the second level only, conditioned on the pooled text. " + _CASCADE_NOTE,
    ),
)


# ---------------------------------------------------------------------------------------------
# SparseCtrl (AnimateDiff sparse ControlNet)
# ---------------------------------------------------------------------------------------------

_SPARSECTRL = dict(
    in_channels=4,
    conditioning_channels=4,
    down_block_types=("CrossAttnDownBlockMotion", "DownBlockMotion"),
    block_out_channels=(16, 32),
    layers_per_block=1,
    norm_num_groups=8,
    cross_attention_dim=24,
    attention_head_dim=2,
    conditioning_embedding_out_channels=(8, 16),
    motion_max_seq_length=8,
    motion_num_attention_heads=2,
    concat_conditioning_mask=True,
    use_simplified_condition_embedding=True,
)


def _sparsectrl_inputs(model, gen, batch=2, frames=3, hw=8, text_len=5):
    device, dtype = _pd(model)
    # frames 0 and 2 carry a condition, frame 1 does not (the "sparse" in SparseCtrl)
    mask = torch.zeros(batch, 1, frames, hw, hw)
    mask[:, :, ::2] = 1
    cond = _r(gen, model, batch, model.config.conditioning_channels, frames, hw, hw) * mask.to(device, dtype)
    return dict(
        sample=_r(gen, model, batch, model.config.in_channels, frames, hw, hw),
        timestep=_steps(gen, model, 1)[0],
        # the AnimateDiff pipeline repeats the prompt per frame
        encoder_hidden_states=_r(gen, model, batch * frames, text_len, 24),
        controlnet_cond=cond,
        conditioning_mask=mask.to(device, dtype),
        conditioning_scale=0.9,
        return_dict=False,
    )


_add(
    ZooCase(
        "SparseControlNetModel",
        _SPARSECTRL,
        _sparsectrl_inputs,
        outputs=_down_and_mid,
        note=(
            "diffusers Attention + AttnProcessor2_0: spatial self- and text cross-attention per frame "
            "(Transformer2DModel) and temporal self-attention in the motion modules; no mask."
        ),
    ),
)


# ---------------------------------------------------------------------------------------------
# T5FilmDecoder (spectrogram diffusion)
# ---------------------------------------------------------------------------------------------

_T5FILM = dict(
    input_dims=8,
    targets_length=12,
    d_model=32,
    num_layers=2,
    num_heads=2,
    d_kv=16,
    d_ff=48,
    dropout_rate=0.1,  # as released; inactive in eval mode
)


def _t5film_inputs(note_lengths, ctx_len=7, batch=2):
    """Two encodings (notes, continuous context) with their masks, as the spectrogram-diffusion pipeline
    builds them."""

    def inputs(model, gen):
        device, _ = _pd(model)
        cfg = model.config
        return dict(
            encodings_and_masks=[
                (_r(gen, model, batch, 6, cfg.d_model), _keep(note_lengths, 6, device)),
                (_r(gen, model, batch, ctx_len, cfg.d_model), _keep([ctx_len] * batch, ctx_len, device)),
            ],
            decoder_input_tokens=_r(gen, model, batch, cfg.targets_length, cfg.input_dims),
            decoder_noise_time=_t(gen, model, batch),
        )

    return inputs


_T5FILM_NOTE = (
    "diffusers Attention with scale_qk=False, hence the classic AttnProcessor (not dispatch: baddbmm + softmax, "
    "scale 1.0 instead of 1/sqrt(d)): decoder self-attention (no mask) and cross-attention to the concatenated "
    "encodings with an additive (B, N, L) float mask (0 / -1e10) made from the encodings' masks."
)
_add(
    ZooCase("T5FilmDecoder", _T5FILM, _t5film_inputs([6, 6]), note=_T5FILM_NOTE),
    ZooCase("T5FilmDecoder", _T5FILM, _t5film_inputs([6, 2]), variant="masked", note=_T5FILM_NOTE),
)


# ---------------------------------------------------------------------------------------------
# Transformer2DModel (continuous, patched DiT-style, vectorized VQ-Diffusion), TransformerTemporalModel
# ---------------------------------------------------------------------------------------------

_T2D_CONTINUOUS = dict(
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=32,
    num_layers=2,
    norm_num_groups=8,
    cross_attention_dim=24,
    use_linear_projection=True,
)
_T2D_PATCHED = dict(  # DiT: class-conditioned ada_norm_zero, no cross-attention
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=4,
    out_channels=8,
    num_layers=2,
    sample_size=8,
    patch_size=2,
    num_embeds_ada_norm=10,
    norm_type="ada_norm_zero",
    norm_elementwise_affine=False,
    activation_fn="gelu-approximate",
)
_T2D_VECTORIZED = dict(  # VQ-Diffusion: discrete latent pixels, ada_norm over timesteps, text cross-attention
    num_attention_heads=2,
    attention_head_dim=16,
    num_layers=2,
    sample_size=4,
    num_vector_embeds=17,
    cross_attention_dim=24,
    num_embeds_ada_norm=100,
    norm_type="ada_norm",
    activation_fn="geglu-approximate",
    attention_bias=True,
)


def _t2d_continuous_inputs(text_lengths, hw=6, text_len=5):
    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(text_lengths)
        return dict(
            hidden_states=_r(gen, model, batch, model.config.in_channels, hw, hw),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.cross_attention_dim),
            encoder_attention_mask=_keep(text_lengths, text_len, device, dtype=torch.long),
        )

    return inputs


def _t2d_patched_inputs(model, gen, batch=2, hw=8):
    device, _ = _pd(model)
    return dict(
        hidden_states=_r(gen, model, batch, model.config.in_channels, hw, hw),
        timestep=torch.randint(1, 1000, (batch,), generator=gen).to(device),
        class_labels=torch.randint(0, model.config.num_embeds_ada_norm, (batch,), generator=gen).to(device),
    )


def _t2d_vectorized_inputs(model, gen, batch=2, text_len=5):
    device, _ = _pd(model)
    cfg = model.config
    return dict(
        hidden_states=torch.randint(0, cfg.num_vector_embeds, (batch, cfg.sample_size**2), generator=gen).to(device),
        encoder_hidden_states=_r(gen, model, batch, text_len, cfg.cross_attention_dim),
        # one scalar timestep, as the VQ-Diffusion pipeline passes it (ada_norm chunks a 1-D embedding)
        timestep=torch.randint(1, cfg.num_embeds_ada_norm, (), generator=gen).to(device),
    )


_T2D_NOTE = "diffusers Attention + AttnProcessor2_0 in BasicTransformerBlock; no set_attn_processor on the model."
_add(
    ZooCase(
        "Transformer2DModel",
        _T2D_CONTINUOUS,
        _t2d_continuous_inputs([5, 5]),
        note="Continuous input (the SD UNet block): image self-attention and text cross-attention. " + _T2D_NOTE,
    ),
    ZooCase(
        "Transformer2DModel",
        _T2D_CONTINUOUS,
        _t2d_continuous_inputs([5, 2]),
        variant="masked",
        note="Continuous input; the text mask made additive (-10000), expanded to (B, heads, 1, L) float. " + _T2D_NOTE,
    ),
    ZooCase(
        "Transformer2DModel",
        _T2D_PATCHED,
        _t2d_patched_inputs,
        variant="patched",
        note="Patched input (DiT): class-conditioned ada_norm_zero, self-attention only. " + _T2D_NOTE,
    ),
    ZooCase(
        "Transformer2DModel",
        _T2D_VECTORIZED,
        _t2d_vectorized_inputs,
        variant="vectorized",
        note="Vectorized input (VQ-Diffusion): latent pixel classes, self- and text cross-attention; the output is "
        "log-probabilities over the classes. " + _T2D_NOTE,
    ),
)

_TEMPORAL = dict(num_attention_heads=2, attention_head_dim=16, in_channels=32, num_layers=1, norm_num_groups=8)


def _temporal_inputs(model, gen, batch=2, frames=3, hw=4):
    return dict(
        hidden_states=_r(gen, model, batch * frames, model.config.in_channels, hw, hw),
        num_frames=frames,
    )


_add(
    ZooCase(
        "TransformerTemporalModel",
        _TEMPORAL,
        _temporal_inputs,
        note=(
            "diffusers Attention + AttnProcessor2_0 in BasicTransformerBlock: two self-attentions (attn1, attn2 "
            "without a context) over the frames of each pixel; no mask. No set_attn_processor on the model."
        ),
    ),
)


# ---------------------------------------------------------------------------------------------
# UNet1DModel (Dance Diffusion blocks)
# ---------------------------------------------------------------------------------------------

_UNET1D = dict(
    block_out_channels=(32, 32, 64),
    extra_in_channels=64,  # the Fourier time features concatenated to the input (2 x 32)
    sample_size=64,
    sample_rate=16_000,
    in_channels=2,
    out_channels=2,
    flip_sin_to_cos=True,
    use_timestep_embedding=False,
    time_embedding_type="fourier",
    mid_block_type="UNetMidBlock1D",
    down_block_types=("DownBlock1DNoSkip", "DownBlock1D", "AttnDownBlock1D"),
    up_block_types=("AttnUpBlock1D", "UpBlock1D", "UpBlock1DNoSkip"),
)
_add(
    ZooCase(
        "UNet1DModel",
        _UNET1D,
        lambda model, gen: dict(sample=_r(gen, model, 2, 2, 64), timestep=_t(gen, model, 2, 0.1, 0.9)),
        note=(
            "SelfAttention1d (neither a diffusers Attention nor an AttentionModuleMixin): hand-written "
            "matmul + softmax with q and k each scaled by d**-0.25, heads of 32 channels, no mask, in the "
            "attention down/up and mid blocks. The ResNet-only block types (the RL value function) have no "
            "attention. No set_attn_processor on the model."
        ),
        extra={"attention_classes": ("SelfAttention1d",)},
    ),
)


# ---------------------------------------------------------------------------------------------
# UNet2DModel, UNet2DConditionModel
# ---------------------------------------------------------------------------------------------

_UNET2D = dict(
    sample_size=8,
    in_channels=3,
    out_channels=3,
    block_out_channels=(16, 32),
    layers_per_block=1,
    down_block_types=("DownBlock2D", "AttnDownBlock2D"),
    up_block_types=("AttnUpBlock2D", "UpBlock2D"),
    attention_head_dim=8,
    norm_num_groups=8,
)
_add(
    ZooCase(
        "UNet2DModel",
        _UNET2D,
        lambda model, gen: dict(sample=_r(gen, model, 2, 3, 8, 8), timestep=_steps(gen, model, 2)),
        note=(
            "diffusers Attention + AttnProcessor2_0 in the attention down/up and mid blocks: spatial self-attention "
            "with group norm and residual inside the module (4-D input), heads of 8; no mask. No set_attn_processor "
            "on the model."
        ),
    ),
)

_UNET2D_COND = dict(
    sample_size=8,
    in_channels=4,
    out_channels=4,
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    block_out_channels=(16, 32),
    layers_per_block=1,
    attention_head_dim=2,  # SD's naming: the number of heads
    norm_num_groups=8,
    cross_attention_dim=24,
)
# SDXL: text_time added conditioning, linear projections, two transformer layers
_UNET2D_SDXL = dict(
    _UNET2D_COND,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
    transformer_layers_per_block=(1, 2),
    use_linear_projection=True,
    addition_embed_type="text_time",
    addition_time_embed_dim=8,
    projection_class_embeddings_input_dim=16 + 6 * 8,
)
# unCLIP / Kandinsky 2.x layout: the simple cross-attention mid block, added k/v projections of the text
_UNET2D_SIMPLE = dict(
    _UNET2D_COND,
    down_block_types=("ResnetDownsampleBlock2D", "SimpleCrossAttnDownBlock2D"),
    up_block_types=("SimpleCrossAttnUpBlock2D", "ResnetUpsampleBlock2D"),
    mid_block_type="UNetMidBlock2DSimpleCrossAttn",
    attention_head_dim=8,
    only_cross_attention=False,
    resnet_time_scale_shift="scale_shift",
)


def _unet2d_cond_inputs(text_lengths=None, batch=2, text_len=5, sdxl=False):
    def inputs(model, gen):
        device, _ = _pd(model)
        kw = dict(
            sample=_r(gen, model, batch, 4, 8, 8),
            timestep=_steps(gen, model, batch),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.cross_attention_dim),
        )
        if text_lengths is not None:
            kw["encoder_attention_mask"] = _keep(text_lengths, text_len, device, dtype=torch.long)
        if sdxl:
            kw["added_cond_kwargs"] = {"text_embeds": _r(gen, model, batch, 16), "time_ids": _r(gen, model, batch, 6)}
        return kw

    return inputs


_UNET2D_COND_NOTE = (
    "diffusers Attention + AttnProcessor2_0 (not dispatch: F.scaled_dot_product_attention): self-attention and "
    "text cross-attention in Transformer2DModel blocks, mid-block attention."
)
_add(
    ZooCase("UNet2DConditionModel", _UNET2D_COND, _unet2d_cond_inputs(), note=_UNET2D_COND_NOTE + " No mask."),
    ZooCase(
        "UNet2DConditionModel",
        _UNET2D_COND,
        _unet2d_cond_inputs([5, 2]),
        variant="masked",
        note=_UNET2D_COND_NOTE + " encoder_attention_mask made additive (-10000), (B, heads, 1, L) float.",
    ),
    ZooCase(
        "UNet2DConditionModel",
        _UNET2D_SDXL,
        _unet2d_cond_inputs(sdxl=True),
        variant="sdxl",
        note=_UNET2D_COND_NOTE + " SDXL layout: text_time conditioning, linear projections, 2 transformer layers.",
    ),
    ZooCase(
        "UNet2DConditionModel",
        _UNET2D_SIMPLE,
        _unet2d_cond_inputs([5, 3]),
        variant="simple",
        note=(
            "unCLIP / Kandinsky layout: diffusers Attention + AttnAddedKVProcessor2_0 (F.scaled_dot_product_attention "
            "over [text via add_k/v_proj, image] keys, group norm, residual inside the module), with the text mask "
            "additive and padded by zeros for the image keys."
        ),
    ),
)


# ---------------------------------------------------------------------------------------------
# UNet3DConditionModel, UNetSpatioTemporalConditionModel, UNetControlNetXSModel
# ---------------------------------------------------------------------------------------------

_UNET3D = dict(
    sample_size=8,
    in_channels=4,
    out_channels=4,
    down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
    up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"),
    # attention_head_dim is the number of heads of the spatial/temporal blocks (SD's naming) but the head
    # width of the first temporal transformer (8 heads): 64 channels and 8 give heads of 8 in both
    block_out_channels=(64, 64),
    layers_per_block=1,
    norm_num_groups=8,
    cross_attention_dim=24,
    attention_head_dim=8,
)
_add(
    ZooCase(
        "UNet3DConditionModel",
        _UNET3D,
        lambda model, gen: dict(
            sample=_r(gen, model, 2, 4, 3, 8, 8),
            timestep=_steps(gen, model, 1)[0],
            encoder_hidden_states=_r(gen, model, 2, 5, 24),
        ),
        note=(
            "diffusers Attention + AttnProcessor2_0: spatial self- and text cross-attention per frame, temporal "
            "self-attention over frames (TransformerTemporalModel, with the first one ahead of the down blocks), "
            "no mask."
        ),
    ),
)

_SVD = dict(
    sample_size=8,
    in_channels=8,
    out_channels=4,
    block_out_channels=(32, 64),
    down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
    up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
    cross_attention_dim=24,
    num_attention_heads=(2, 4),
    layers_per_block=1,
    addition_time_embed_dim=8,
    projection_class_embeddings_input_dim=3 * 8,
    num_frames=3,
)


def _svd_inputs(model, gen, batch=2, frames=3, hw=8):
    device, dtype = _pd(model)
    return dict(
        sample=_r(gen, model, batch, frames, model.config.in_channels, hw, hw),
        timestep=_steps(gen, model, 1)[0],
        # the CLIP image embedding: one token
        encoder_hidden_states=_r(gen, model, batch, 1, model.config.cross_attention_dim),
        # fps, motion bucket id, noise augmentation strength
        added_time_ids=torch.tensor([[6.0, 127.0, 0.02]] * batch, device=device, dtype=dtype),
    )


_add(
    ZooCase(
        "UNetSpatioTemporalConditionModel",
        _SVD,
        _svd_inputs,
        note=(
            "diffusers Attention + AttnProcessor2_0 in TransformerSpatioTemporalModel: spatial self- and "
            "cross-attention per frame (to one image token), temporal self- and cross-attention over frames; no mask."
        ),
    ),
)

_CONTROLNET_XS = dict(
    sample_size=8,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
    block_out_channels=(16, 32),
    cross_attention_dim=24,
    transformer_layers_per_block=1,
    num_attention_heads=2,
    norm_num_groups=8,
    upcast_attention=False,
    ctrl_block_out_channels=[8, 16],
    ctrl_num_attention_heads=1,
    ctrl_max_norm_num_groups=4,
    ctrl_conditioning_embedding_out_channels=(4, 4),
)
_add(
    ZooCase(
        "UNetControlNetXSModel",
        _CONTROLNET_XS,
        lambda model, gen: dict(
            sample=_r(gen, model, 2, 4, 8, 8),
            timestep=_steps(gen, model, 1)[0],
            encoder_hidden_states=_r(gen, model, 2, 5, 24),
            controlnet_cond=_r(gen, model, 2, 3, 16, 16),
            conditioning_scale=0.9,
        ),
        note=(
            "diffusers Attention + AttnProcessor2_0: self- and text cross-attention in the base UNet's and the "
            "control branch's Transformer2DModel blocks (interleaved, block by block); no mask."
        ),
    ),
)


# ---------------------------------------------------------------------------------------------
# UVit2DModel (aMUSEd), VQModel
# ---------------------------------------------------------------------------------------------

_UVIT = dict(
    hidden_size=32,
    use_bias=False,
    hidden_dropout=0.0,
    cond_embed_dim=16,
    micro_cond_encode_dim=4,
    micro_cond_embed_dim=20,  # 5 micro conditions x 4
    encoder_hidden_size=24,
    vocab_size=40,
    codebook_size=32,
    in_channels=16,
    block_out_channels=32,
    num_res_blocks=1,
    downsample=True,
    upsample=True,
    block_num_heads=2,
    num_hidden_layers=2,
    num_attention_heads=2,
    attention_dropout=0.0,
    intermediate_size=48,
    layer_norm_eps=1e-06,
    ln_elementwise_affine=True,
    sample_size=8,
)


def _uvit_inputs(model, gen, batch=2, hw=8, text_len=5):
    device, dtype = _pd(model)
    cfg = model.config
    return dict(
        input_ids=torch.randint(0, cfg.vocab_size, (batch, hw, hw), generator=gen).to(device),
        encoder_hidden_states=_r(gen, model, batch, text_len, cfg.encoder_hidden_size),
        pooled_text_emb=_r(gen, model, batch, cfg.cond_embed_dim),
        # original width, height, crop top, crop left, aesthetic score
        micro_conds=torch.tensor([[512.0, 512.0, 0.0, 0.0, 6.0]] * batch, device=device, dtype=dtype),
    )


_add(
    ZooCase(
        "UVit2DModel",
        _UVIT,
        _uvit_inputs,
        note=(
            "diffusers Attention + AttnProcessor2_0: self- and text cross-attention in the BasicTransformerBlock "
            "layers, and in the SkipFFTransformerBlock of the down/up UVit blocks; no mask."
        ),
    ),
)

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


# ---------------------------------------------------------------------------------------------
# Classes of this half that compute no attention (checked in their source and module trees)
# ---------------------------------------------------------------------------------------------

NO_ATTENTION.update(
    {
        "Kandinsky6SRLatentUpscalerBank": (
            "convolutional latent upscalers (3-D convolutions, modulated RMS norms, nearest upsampling): "
            "no attention module, no softmax"
        ),
        "Kandinsky6SRVAE": (
            "causal 3-D convolutional VAE: ResNet blocks with spatial norms, down/upsamplers; no attention "
            "block in encoder, decoder or mid block"
        ),
        "LongCatAudioDiTVae": "1-D convolutional audio VAE (residual units with Snake activations): no attention",
        "MMAudioVocoder": "BigVGAN-style vocoder (transposed convolutions, AMP blocks, anti-aliased Snake): no attention",
        "MiniMaxMusic3ConditionEncoder": (
            "a softmax over learned layer-mixing weights, a 1-D convolution and resampling: no attention "
            "between tokens"
        ),
        "MiniMaxMusic3Vocoder": "1-D convolutional vocoder (transposed convolutions, Snake residual units): no attention",
        "MultiAdapter": "a weighted sum of T2IAdapter outputs: convolutional, no attention",
        "T2IAdapter": (
            "convolutional adapter (full, full_xl and light variants: pixel unshuffle, ResNet-like conv blocks): "
            "no attention"
        ),
    }
)
