"""Zoo cases: CogVideoX, CogView3Plus, CogView4, ConsisID.

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

import torch

from tests.zoo._zoo_common import ZooCase, model_param, random_angles_rotary
from tests.zoo.cases._helpers import _like, _rn, _rope_halves, _text_keep, _timestep

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- CogVideoX, CogView3Plus, CogView4, ConsisID ------------------------------------------

_COGVIDEOX = dict(
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=4,
    out_channels=4,
    time_embed_dim=8,
    text_embed_dim=16,
    num_layers=1,
    sample_width=8,
    sample_height=8,
    sample_frames=5,
    patch_size=2,
    temporal_compression_ratio=4,
    max_text_seq_length=8,
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
        name="CogVideoXTransformer3DModel",
        config=dict(_COGVIDEOX, use_rotary_positional_embeddings=True),
        inputs=_cogvideox_inputs(True),
        note=_COGVIDEOX_NOTE + "; image_rotary_emb (cos, sin) forward input, applied to the video queries and keys "
        "only (CogVideoX-5B)",
        extra={"rotary_keys": ("image_rotary_emb",)},
    )
)
CASES.append(
    ZooCase(
        name="CogVideoXTransformer3DModel",
        variant="sincos",
        config=_COGVIDEOX,
        inputs=_cogvideox_inputs(False),
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
            patch_size=2,
            in_channels=4,
            num_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            out_channels=4,
            text_embed_dim=16,
            time_embed_dim=8,
            condition_dim=4,
            pos_embed_max_size=8,
            sample_size=8,
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
    patch_size=2,
    in_channels=4,
    out_channels=4,
    num_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    text_embed_dim=16,
    time_embed_dim=8,
    condition_dim=4,
    pos_embed_max_size=8,
    sample_size=8,
    rope_axes_dim=(8, 8),
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
        name="CogView4Transformer2DModel",
        config=_COGVIEW4,
        inputs=_cogview4_inputs(False),
        note=_COGVIEW4_NOTE,
        extra={"rotary_keys": ("image_rotary_emb",)},
    )
)
CASES.append(
    ZooCase(
        name="CogView4Transformer2DModel",
        variant="masked",
        config=_COGVIEW4,
        inputs=_cogview4_inputs(True),
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
            num_attention_heads=2,
            attention_head_dim=24,
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
            is_train_face=True,
            is_kps=False,
            cross_attn_interval=1,
            cross_attn_dim_head=8,
            cross_attn_num_heads=2,
            LFE_id_dim=8,
            LFE_vit_dim=16,
            LFE_depth=2,
            LFE_dim_head=8,
            LFE_num_heads=2,
            LFE_num_id_token=2,
            LFE_num_querie=4,
            LFE_output_dim=32,
            LFE_ff_mult=1,
            LFE_num_scale=2,
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
