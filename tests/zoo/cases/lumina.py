"""Zoo cases: Lumina 2 and Lumina-Next.

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

import torch

from tests.zoo._zoo_common import ZooCase
from tests.zoo.cases._helpers import _keep, _pd, _r, _t

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- Lumina 2, Lumina-Next ----------------------------------------------------------------

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
        "LuminaNextDiT2DModel", _LUMINA_NEXT, _lumina_next_inputs([6, 2]), variant="masked", note=_LUMINA_NEXT_NOTE
    ),
)
