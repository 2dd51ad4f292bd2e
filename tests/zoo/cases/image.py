"""Zoo cases: other image transformers: Anima, AuraFlow, DreamLite, ERNIE-Image, GLM-Image, HiDream, Ideogram4, JoyImage, Krea 2, NucleusMoE-Image, OmniGen, PRX, Z-Image, UVit2D, UniDiffuser.

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

import torch

from tests.zoo._zoo_common import ZooCase, model_param
from tests.zoo.cases._helpers import (
    _Case,
    _keep,
    _like,
    _pd,
    _r,
    _rn,
    _rope_halves,
    _SharedWithTransformerCase,
    _steps,
    _t,
    _text_keep,
    _timestep,
)

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- AnimaTextConditioner -----------------------------------------------------------------


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
    source_dim=24,
    target_dim=32,
    model_dim=32,
    num_layers=2,
    num_attention_heads=4,
    mlp_ratio=2.0,
    target_vocab_size=64,
    min_sequence_length=8,
)
_ANIMA_NOTE = (
    "AnimaTextConditionerAttention (AttentionModuleMixin) + AnimaTextConditionerAttnProcessor -> "
    "dispatch_attention_fn: RMS qk-norm, rotate-half rotary on q and k (cross-attention too, with the "
    "source positions), built inside; masks are bool (B, 1, 1, S) key padding"
)
CASES.append(
    ZooCase(
        name="AnimaTextConditioner",
        config=_ANIMA,
        inputs=_anima_inputs(False),
        note=_ANIMA_NOTE,
        outputs=lambda out: (out,),
        extra={"out_shape": (1, 8, 32)},
    )
)
CASES.append(
    ZooCase(
        name="AnimaTextConditioner",
        variant="masked",
        config=_ANIMA,
        inputs=_anima_inputs(True),
        note=_ANIMA_NOTE + "; batch 2: 6 and 4 target tokens, 9 and 5 source tokens",
        outputs=lambda out: (out,),
        extra={"out_shape": (2, 8, 32), "mask_keys": ("target_attention_mask", "source_attention_mask")},
    )
)
CASES.append(
    ZooCase(
        name="AnimaTextConditioner",
        variant="fullpad",
        config=_ANIMA,
        inputs=_anima_inputs(True, (9, 0)),
        note=_ANIMA_NOTE + "; batch 2, the second with no valid source token: its cross-attention rows are fully "
        "masked (zeros from SDPA)",
        outputs=lambda out: (out,),
        extra={"out_shape": (2, 8, 32)},
    )
)


# --- AuraFlowTransformer2DModel -----------------------------------------------------------

CASES.append(
    _Case(
        name="AuraFlowTransformer2DModel",
        # Every block's attention output projection x4: in 1 draw of 100 the joint or the
        # single block's attention moved the output by less than 1e-3 (_stock_a.py's
        # MIN_EFFECT); with the gains the least of 800 draws is 1.8e-3.
        gains=(
            (r"^time_step_proj\.linear_2\.", 10.0),
            (r"^(joint|single)_transformer_blocks\.\d+\.attn\.to_out\.0\.weight$", 4.0),
        ),
        config=dict(
            sample_size=8,
            patch_size=2,
            in_channels=4,
            num_mmdit_layers=1,
            num_single_dit_layers=1,
            attention_head_dim=8,
            num_attention_heads=2,
            joint_attention_dim=16,
            caption_projection_dim=16,
            out_channels=4,
            pos_embed_max_size=16,
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


# --- DreamLite (transformer and UNet) -----------------------------------------------------

_DREAMLITE_T = dict(
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=32,
    num_layers=1,
    norm_num_groups=8,
    cross_attention_dim=16,
    qk_norm="rms_norm",
    ff_mult=2,
)


def _dreamlite_t_inputs(masked):
    def make(model, gen):
        b = 2 if masked else 1
        out = {"hidden_states": _rn(model, gen, b, 32, 4, 4), "encoder_hidden_states": _rn(model, gen, b, 7, 16)}
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
    ZooCase(
        name="DreamLiteTransformer2DModel",
        config=_DREAMLITE_T,
        inputs=_dreamlite_t_inputs(False),
        note=_DREAMLITE_T_NOTE,
        extra={"shape_like": "hidden_states"},
    )
)
CASES.append(
    ZooCase(
        name="DreamLiteTransformer2DModel",
        variant="masked",
        config=_DREAMLITE_T,
        inputs=_dreamlite_t_inputs(True),
        note=_DREAMLITE_T_NOTE + "; encoder_attention_mask (B, T) -> bool, batch 2 with 7 and 3 valid tokens",
        extra={"shape_like": "hidden_states", "mask_keys": ("encoder_attention_mask",)},
    )
)
CASES.append(
    _Case(
        name="DreamLiteTransformer2DModel",
        variant="gqa",
        config=dict(_DREAMLITE_T, num_kv_heads=1),
        inputs=_dreamlite_t_inputs(False),
        setup=_dreamlite_processors,
        note=(
            "as inside DreamLiteUNetModel: one K/V head (kv_heads=1) and DreamLiteAttnProcessor2_0 -> "
            "dispatch_attention_fn with K/V repeat_interleave'd to the query heads (no enable_gqa), RMS qk-norm"
        ),
        extra={"shape_like": "hidden_states"},
    )
)

_DREAMLITE_UNET = dict(
    sample_size=8,
    in_channels=4,
    out_channels=4,
    down_block_types=("DreamLiteCrossAttnNoSelfAttnDownBlock2D", "DreamLiteCrossAttnDownBlock2D"),
    up_block_types=("DreamLiteCrossAttnUpBlock2D", "DreamLiteCrossAttnNoSelfAttnUpBlock2D"),
    block_out_channels=(32, 64),
    layers_per_block=1,
    norm_num_groups=8,
    cross_attention_dim=16,
    attention_head_dim=(2, 4),
    ff_mult=2,
    num_kv_heads=1,
    qk_norm="rms_norm",
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
    ZooCase(
        name="DreamLiteUNetModel",
        config=_DREAMLITE_UNET,
        inputs=_dreamlite_unet_inputs(False),
        note=_DREAMLITE_UNET_NOTE,
    )
)
CASES.append(
    ZooCase(
        name="DreamLiteUNetModel",
        variant="masked",
        config=_DREAMLITE_UNET,
        inputs=_dreamlite_unet_inputs(True),
        note=_DREAMLITE_UNET_NOTE + "; batch 2 with 7 and 3 valid text tokens",
        extra={"mask_keys": ("encoder_attention_mask",)},
    )
)
CASES.append(
    ZooCase(
        name="DreamLiteUNetModel",
        variant="fullpad",
        config=_DREAMLITE_UNET,
        inputs=_dreamlite_unet_inputs(True, (7, 0)),
        note=_DREAMLITE_UNET_NOTE + "; batch 2, the second with no valid text token: -10000 on every key (a uniform "
        "average)",
    )
)


# --- ERNIE-Image --------------------------------------------------------------------------

_ERNIE = dict(
    hidden_size=32,
    num_attention_heads=2,
    num_layers=2,
    ffn_hidden_size=64,
    in_channels=4,
    out_channels=4,
    patch_size=2,
    text_in_dim=16,
    rope_axes_dim=(4, 6, 6),
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
        name="ErnieImageTransformer2DModel",
        variant="masked",
        config=_ERNIE,
        inputs=_ernie_inputs([7, 3]),
        # text_lens also sets the image tokens' first rotary coordinate, so no "mask reaches the
        # output" check here: changing it changes more than the mask.
        note=_ERNIE_NOTE + "; batch 2 with text_lens 7 and 3",
    )
)
CASES.append(
    ZooCase(
        name="ErnieImageTransformer2DModel",
        variant="fullpad",
        config=_ERNIE,
        inputs=_ernie_inputs([7, 0]),
        note=_ERNIE_NOTE + "; batch 2, the second with text_lens 0: every text key masked (an empty prompt), "
        "the image keys still valid",
    )
)


# --- GLM-Image ----------------------------------------------------------------------------

_GLM = dict(
    patch_size=2,
    in_channels=4,
    out_channels=4,
    num_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    text_embed_dim=16,
    time_embed_dim=8,
    condition_dim=4,
    prior_vq_quantizer_codebook_size=32,
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
    ZooCase(
        name="GlmImageTransformer2DModel",
        config=_GLM,
        inputs=_glm_inputs(),
        note=_GLM_NOTE,
        extra={"rotary_keys": ("image_rotary_emb",)},
    )
)
CASES.append(
    ZooCase(
        name="GlmImageTransformer2DModel",
        variant="masked",
        config=_GLM,
        inputs=_glm_inputs(masked=True),
        note=_GLM_NOTE + "; batch 2 with 12 and 2 valid text tokens (many padded: the float mask only "
        "down-weights them by e^-1)",
        extra={"mask_keys": ("attention_mask",), "rotary_keys": ("image_rotary_emb",)},
    )
)
CASES.append(
    ZooCase(
        name="GlmImageTransformer2DModel",
        variant="kvcache",
        config=_GLM,
        inputs=_glm_inputs(cache=True),
        note=_GLM_NOTE + "; kv_caches in 'read' mode: 16 cached condition-image keys/values (random) prepended to "
        "the keys, no mask",
    )
)


# --- HiDream ------------------------------------------------------------------------------


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
            patch_size=2,
            in_channels=4,
            out_channels=4,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            caption_channels=[8, 4],
            text_emb_dim=8,
            num_routed_experts=2,
            num_activated_experts=2,
            axes_dims_rope=(8, 4, 4),
            max_resolution=(16, 16),
            llama_layers=(0, 1),
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


# --- Ideogram4 ----------------------------------------------------------------------------


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


# --- JoyImage Edit / Edit Plus ------------------------------------------------------------

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


# --- Krea 2 -------------------------------------------------------------------------------

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
            [
                torch.zeros(gh * gw, dtype=torch.long),
                torch.arange(gh).repeat_interleave(gw),
                torch.arange(gw).repeat(gh),
            ],
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


# --- NucleusMoE-Image ---------------------------------------------------------------------

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


# --- OmniGen ------------------------------------------------------------------------------

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


# --- PRX ----------------------------------------------------------------------------------

_PRX = dict(
    in_channels=4, patch_size=2, context_in_dim=24, hidden_size=32, mlp_ratio=2.0, num_heads=2, depth=2, axes_dim=[8, 8]
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


# --- Z-Image and its ControlNet -----------------------------------------------------------

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
    )
)


# --- UVit2DModel (aMUSEd) -----------------------------------------------------------------

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
    )
)


# --- UniDiffuser (U-ViT over [timesteps, data type, text, CLIP image, VAE patches]) ---------

_UNIDIFFUSER = dict(
    text_dim=12,
    clip_img_dim=10,
    num_text_tokens=5,
    num_attention_heads=2,
    attention_head_dim=8,
    in_channels=4,
    out_channels=4,
    num_layers=2,  # one in-block, the mid block, one out-block (with its skip)
    sample_size=8,
    patch_size=2,
    activation_fn="gelu",
    block_type="unidiffuser",  # post-LayerNorm on the residual stream, as released
    pre_layer_norm=False,
    use_timestep_embedding=False,
    use_data_type_embedding=True,  # UniDiffuser-v1
)


def _unidiffuser_inputs(model, gen, batch=2):
    device, _ = _pd(model)
    cfg = model.config
    return dict(
        latent_image_embeds=_r(gen, model, batch, cfg.in_channels, cfg.sample_size, cfg.sample_size),
        image_embeds=_r(gen, model, batch, 1, cfg.clip_img_dim),
        prompt_embeds=_r(gen, model, batch, cfg.num_text_tokens, cfg.text_dim),
        timestep_img=_steps(gen, model, batch),
        timestep_text=_steps(gen, model, batch),
        data_type=torch.randint(0, 2, (batch,), generator=gen).to(device),
    )


_add(
    ZooCase(
        "UniDiffuserModel",
        _UNIDIFFUSER,
        _unidiffuser_inputs,
        outputs=lambda out: tuple(out),
        note=(
            "diffusers Attention + AttnProcessor2_0 (F.scaled_dot_product_attention): self-attention only (attn1; "
            "no cross-attention dim, so no attn2) over the joint [image timestep, text timestep, data type, text, "
            "CLIP image, VAE patches] sequence in UniDiffuserBlocks (post-LayerNorm); no mask. Outputs: the VAE "
            "image, CLIP image and text predictions. No set_attn_processor on the model."
        ),
    )
)


NO_ATTENTION.update(
    {
        "Ideogram4PromptEnhancerHead": (
            "one linear LM head; the prompt enhancer's attention runs in the pipeline's Qwen3-VL text encoder "
            "(transformers), not in this class"
        ),
        "UniDiffuserTextDecoder": (
            "a GPT-2 caption decoder: two linear prefix projections around transformers' GPT2LMHeadModel, whose "
            "attention (GPT2Attention, transformers' attention interface) attnkit does not serve; no diffusers "
            "attention"
        ),
    }
)
