"""Zoo cases: Kandinsky 3, 5 and 6, and the Kandinsky 2 / unCLIP prior.

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

import torch

from tests.zoo._zoo_common import ZooCase
from tests.zoo.cases._helpers import _keep, _pd, _r, _steps

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- Kandinsky 3 --------------------------------------------------------------------------

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


# --- Kandinsky 5 --------------------------------------------------------------------------

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
    )
)


# --- Kandinsky 6 (video + audio) ----------------------------------------------------------

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
        return dict(hidden_states=_r(gen, model, batch, frames, *hw, c), timestep=_steps(gen, model, batch))

    return inputs


_add(
    ZooCase(
        "Kandinsky6SRTransformer3DModel",
        _K6SR,
        _k6sr_inputs(),
        note=(
            "Kandinsky6SRAttention + Kandinsky6SRAttnProcessor -> dispatch_attention_fn with backend=FLEX "
            "hard-coded and a flex BlockMask (NABLA: 64-token blocks chosen from pooled q.k statistics OR'ed with "
            "a sliding-tile prior); q/k RMSNorm, 3-D RoPE as rotation matrices. At this size the mask keeps every "
            "block (it hides nothing): attnkit drops it."
        ),
    ),
    ZooCase(
        "Kandinsky6SRTransformer3DModel",
        dict(_K6SR, nabla_threshold=0.5),
        _k6sr_inputs(),
        variant="sparse",
        note=(
            "NABLA at threshold 0.5: each 64-token query block keeps about 2 of the 4 key blocks, a mask of block "
            "lists alone (from_kv_blocks, mask_mod None), which eager flex ignores (it attends to every key; the "
            "references compute the lists' meaning, tests/zoo/_flex.py) and attnkit's flex route computes."
        ),
    ),
)


# --- Prior (Kandinsky 2 / unCLIP) ---------------------------------------------------------

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


NO_ATTENTION.update(
    {
        "Kandinsky6SRLatentUpscalerBank": (
            "convolutional latent upscalers (3-D convolutions, modulated RMS norms, nearest upsampling): "
            "no attention module, no softmax"
        )
    }
)
