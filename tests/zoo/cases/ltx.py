"""Zoo cases: LTX-Video and LTX-2 (and LTX-2's diffusion decoder).

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

import torch

from tests.zoo._zoo_common import ZooCase
from tests.zoo.cases._helpers import _keep, _pd, _r, _SeededNoiseCase, _steps, _t

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- LTX-2 diffusion decoder (a VAE decoder that denoises pixels with neighborhood attention) ---

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
    )
)


# --- LTX-2 (audio + video) ----------------------------------------------------------------

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


def _ltx2_inputs(
    text_lengths=None, audio_text_lengths=None, ltx23=False, frames=2, hw=(4, 4), audio_frames=5, text_len=6
):
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


# --- LTX-Video ----------------------------------------------------------------------------

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
