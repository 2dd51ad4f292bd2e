"""Zoo cases: other video transformers: Allegro, AnyFlow, EasyAnimate, Helios, MiniMax-H3, Mochi, Motif-Video.

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

import torch

from tests.zoo._zoo_common import ZooCase, model_param
from tests.zoo.cases._helpers import _keep, _like, _pd, _r, _rn, _rope_halves, _steps, _t, _text_keep, _timestep

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- AllegroTransformer3DModel ------------------------------------------------------------


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
    patch_size=2,
    patch_size_t=1,
    num_attention_heads=2,
    attention_head_dim=24,
    in_channels=4,
    out_channels=4,
    num_layers=1,
    cross_attention_dim=48,
    sample_height=8,
    sample_width=8,
    sample_frames=2,
    caption_channels=16,
)
_ALLEGRO_NOTE = (
    "Attention + AllegroAttnProcessor2_0 -> F.scaled_dot_product_attention: self-attention with "
    "3-axis rotary (image_rotary_emb = (cos, sin) per axis, token positions), cross-attention to text; "
    "encoder_attention_mask -> additive -10000 bias (B, 1, T) repeated per head"
)
CASES.append(
    ZooCase(
        name="AllegroTransformer3DModel",
        config=_ALLEGRO,
        inputs=_allegro_inputs(False),
        note=_ALLEGRO_NOTE,
        extra={"rotary_keys": ("image_rotary_emb",)},
    )
)
CASES.append(
    ZooCase(
        name="AllegroTransformer3DModel",
        variant="masked",
        config=_ALLEGRO,
        inputs=_allegro_inputs(True),
        note=_ALLEGRO_NOTE + "; batch 2 with 7 and 3 valid text tokens",
        extra={"mask_keys": ("encoder_attention_mask",), "rotary_keys": ("image_rotary_emb",)},
    )
)
CASES.append(
    ZooCase(
        name="AllegroTransformer3DModel",
        variant="fullpad",
        config=_ALLEGRO,
        inputs=_allegro_inputs(True, (7, 0)),
        note=_ALLEGRO_NOTE + "; batch 2, the second with no valid text token: every cross-attention key gets -10000 "
        "(a uniform average, not a masked-out row)",
    )
)


# --- AnyFlowTransformer3DModel / AnyFlowFARTransformer3DModel -----------------------------

_ANYFLOW = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=4,
    out_channels=4,
    text_dim=16,
    freq_dim=32,
    ffn_dim=32,
    num_layers=2,
    cross_attn_norm=True,
    rope_max_seq_len=32,
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
        name="AnyFlowTransformer3DModel",
        config=_ANYFLOW,
        inputs=_anyflow_inputs,
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
    ZooCase(
        name="AnyFlowFARTransformer3DModel",
        config=_ANYFLOW_FAR,
        inputs=_anyflow_far_inputs,
        note=_ANYFLOW_FAR_NOTE,
        backward=False,
        # the compressed context frame is not predicted: 3 of the 4 frames come out
        extra={"out_shape": (1, 3, 4, 8, 8)},
    )
)
CASES.append(
    ZooCase(
        name="AnyFlowFARTransformer3DModel",
        variant="kvcache",
        config=_ANYFLOW_FAR,
        inputs=_anyflow_far_kvcache_inputs,
        backward=False,
        note=_ANYFLOW_FAR_NOTE + "; KV-cache step: keys = cached compressed + cached full + new, no mask",
    )
)


# --- EasyAnimate --------------------------------------------------------------------------

CASES.append(
    ZooCase(
        name="EasyAnimateTransformer3DModel",
        config=dict(
            num_attention_heads=2,
            attention_head_dim=16,
            in_channels=4,
            out_channels=4,
            patch_size=2,
            sample_width=8,
            sample_height=8,
            num_layers=2,
            mmdit_layers=1,
            time_embed_dim=8,
            text_embed_dim=16,
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


# --- Helios -------------------------------------------------------------------------------


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
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=4,
            out_channels=4,
            text_dim=16,
            freq_dim=32,
            ffn_dim=32,
            num_layers=1,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            rope_dim=(4, 4, 4),
            has_multi_term_memory_patch=True,
            guidance_cross_attn=True,
            zero_history_timestep=True,
            is_amplify_history=True,
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


# --- MiniMax-H3 (packed text + audio + video) ---------------------------------------------

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
    )
)


# --- Mochi --------------------------------------------------------------------------------

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


# --- Motif-Video --------------------------------------------------------------------------

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
