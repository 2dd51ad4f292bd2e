"""Zoo cases: Qwen-Image (its ControlNets) and Qwen-Image 2.1.

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

import math

import torch

from tests.zoo._zoo_common import ZooCase
from tests.zoo.cases._helpers import _Fresh, _inner_config, _keep, _pd, _r, _t, _WrapperCase

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- Qwen-Image, its ControlNet and Multi-ControlNet --------------------------------------

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
        "QwenImageTransformer2DModel", _QWEN, _qwen_inputs([6, 2]), variant="masked", note=_QWEN_NOTE + _QWEN_MASK_NOTE
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


# --- Qwen-Image 2.1 (block-causal single stream) ------------------------------------------

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
