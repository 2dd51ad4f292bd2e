"""Zoo cases: Hunyuan: HunyuanDiT and its ControlNets, HunyuanVideo (1, 1.5, Framepack), HunyuanImage.

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

import torch

from tests.zoo._zoo_common import ZooCase, model_param, random_angles_rotary
from tests.zoo.cases._helpers import _Case, _like, _rn, _text_keep, _timestep

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- HunyuanDiT and its ControlNets -------------------------------------------------------

_HYDIT_COMMON = dict(
    # cross_attention_dim_t5 64: the T5 pooler (HunyuanDiTAttentionPool) has 8 heads, of dim 8 here
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=4,
    patch_size=2,
    sample_size=8,
    hidden_size=32,
    mlp_ratio=2.0,
    cross_attention_dim=16,
    cross_attention_dim_t5=64,
    pooled_projection_dim=32,
    text_len=4,
    text_len_t5=6,
)
_HYDIT = dict(_HYDIT_COMMON, num_layers=2)
# The conditioning (timestep + pooled text + sizes) brought to unit scale: at the default scale
# the pooler's attention would barely move the blocks' norm shift.
# ... and the text pooler's output projection x4: its attention reaches the output only
# through the timestep embedding, and in 1 draw of 150 it moved the output by less than
# 1e-3 (_stock_a.py's MIN_EFFECT); with the gain the least of 300 draws is 3.1e-3.
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
    _Case(
        name="HunyuanDiT2DModel",
        config=_HYDIT,
        inputs=_hydit_inputs(),
        note=_HYDIT_NOTE,
        gains=_HYDIT_GAINS,
        extra={"out_shape": (1, 8, 8, 8), "rotary_keys": ("image_rotary_emb",)},
    )
)
CASES.append(
    _Case(
        name="HunyuanDiT2DModel",
        variant="masked",
        config=_HYDIT,
        inputs=_hydit_inputs(masked=True),
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
        name="HunyuanDiT2DControlNetModel",
        config=_HYDIT_CN,
        inputs=_hydit_inputs(control=True),
        gains=_HYDIT_GAINS,
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
        name="HunyuanDiT2DMultiControlNetModel",
        config=_HYDIT_CN,
        make=_hydit_multi_make,
        gains=_HYDIT_GAINS,
        inputs=_hydit_multi_inputs,
        outputs=_hydit_cn_outputs,
        note="wraps one HunyuanDiT2DControlNetModel: " + _HYDIT_NOTE,
        extra={"out_shape": (1, 16, 32), "rotary_keys": ("image_rotary_emb",)},
    )
)


# --- HunyuanVideo family, HunyuanImage ----------------------------------------------------

_HYV = dict(
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
CASES.append(
    _Case(
        name="HunyuanVideoTransformer3DModel", config=_HYV, inputs=_hyv_inputs([24]), note=_HYV_NOTE, gains=_HYV_GAINS
    )
)
CASES.append(
    _Case(
        name="HunyuanVideoTransformer3DModel",
        variant="masked",
        config=_HYV,
        inputs=_hyv_inputs([24, 9]),
        gains=_HYV_GAINS,
        note=_HYV_NOTE + "; batch 2 with 24 and 9 valid text tokens",
    )
)
CASES.append(
    _Case(
        name="HunyuanVideoTransformer3DModel",
        variant="i2v",
        config=dict(_HYV, image_condition_type="token_replace"),
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
    guidance_embeds=True,
    text_embed_dim=16,
    pooled_projection_dim=8,
    rope_axes_dim=(4, 6, 6),
    has_image_proj=True,
    image_proj_dim=16,
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
    _Case(
        name="HunyuanVideoFramepackTransformer3DModel",
        config=_FRAMEPACK,
        inputs=_framepack_inputs([24]),
        note=_FRAMEPACK_NOTE,
        gains=_FRAMEPACK_GAINS,
    )
)
CASES.append(
    _Case(
        name="HunyuanVideoFramepackTransformer3DModel",
        variant="masked",
        config=_FRAMEPACK,
        inputs=_framepack_inputs([24, 9]),
        gains=_FRAMEPACK_GAINS,
        note=_FRAMEPACK_NOTE + "; batch 2 with 24 and 9 valid text tokens",
    )
)

_HYV15 = dict(
    in_channels=4,
    out_channels=4,
    num_attention_heads=2,
    attention_head_dim=16,
    num_layers=1,
    num_refiner_layers=1,
    mlp_ratio=2.0,
    patch_size=1,
    patch_size_t=1,
    text_embed_dim=16,
    text_embed_2_dim=8,
    image_embed_dim=8,
    rope_axes_dim=(4, 6, 6),
    target_size=64,
    task_type="i2v",
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
    _Case(
        name="HunyuanVideo15Transformer3DModel",
        config=_HYV15,
        inputs=_hyv15_inputs([12], [6]),
        note=_HYV15_NOTE,
        gains=_HYV15_GAINS,
    )
)
CASES.append(
    _Case(
        name="HunyuanVideo15Transformer3DModel",
        variant="masked",
        config=_HYV15,
        inputs=_hyv15_inputs([12, 5], [6, 2]),
        gains=_HYV15_GAINS,
        note=_HYV15_NOTE + "; batch 2 with 12/5 text and 6/2 ByT5 valid tokens (fully masked rows for the padding)",
    )
)
CASES.append(
    _Case(
        name="HunyuanVideo15Transformer3DModel",
        variant="t2v",
        config=_HYV15,
        inputs=_hyv15_inputs([12], [6], t2v=True),
        gains=_HYV15_GAINS,
        note=_HYV15_NOTE + "; text-to-video: zero image embeddings, all 4 image tokens masked",
    )
)

_HYIMAGE = dict(
    in_channels=4,
    out_channels=4,
    num_attention_heads=2,
    attention_head_dim=16,
    num_layers=1,
    num_single_layers=1,
    num_refiner_layers=1,
    mlp_ratio=2.0,
    patch_size=(1, 1),
    text_embed_dim=16,
    text_embed_2_dim=8,
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
    _Case(
        name="HunyuanImageTransformer2DModel",
        config=_HYIMAGE,
        inputs=_hyimage_inputs([12], [6]),
        note=_HYIMAGE_NOTE,
        gains=_HYIMAGE_GAINS,
    )
)
CASES.append(
    _Case(
        name="HunyuanImageTransformer2DModel",
        variant="masked",
        config=_HYIMAGE,
        inputs=_hyimage_inputs([12, 5], [6, 2]),
        gains=_HYIMAGE_GAINS,
        note=_HYIMAGE_NOTE + "; batch 2 with 12/5 text and 6/2 ByT5 valid tokens",
    )
)
