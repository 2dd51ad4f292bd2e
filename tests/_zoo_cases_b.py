"""The model zoo, second half of the alphabet (Ideogram4... to ZImage...).

One or more :class:`ZooCase` per diffusers model class that computes attention, and
``NO_ATTENTION``: the classes of this half that compute none, each with the reason found in
its source. Configs are tiny (hidden sizes of a few dozen, one or two blocks, head_dim >= 8)
but keep each model's attention layout: joint text+image sequences, rotary embeddings,
qk-norm, GQA, cross-attention, masks. Inputs are random; rotary embeddings that are forward
inputs are random angles; masks have a different valid length per batch item.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from _zoo_common import ZooCase, model_param, randn, random_angles_rotary

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
    "diffusers Attention + AttnProcessor2_0 (8 heads of 8): attention pooling of the text, text "
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
