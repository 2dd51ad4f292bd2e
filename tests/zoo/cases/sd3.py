"""Zoo cases: Stable Diffusion 3 / 3.5 and the SD3 ControlNets.

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

from tests.zoo._zoo_common import ZooCase
from tests.zoo.cases._helpers import _first_tuple, _Fresh, _inner_config, _r, _steps, _WrapperCase

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- SD3 / SD3.5 transformer, SD3 ControlNet, SD3 Multi-ControlNet ------------------------

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
            pooled_projections=_r(gen, model, batch, cfg.pooled_projection_dim), timestep=_steps(gen, model, batch)
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
        "SD3ControlNetModel", _SD3_CONTROLNET, _sd3_inputs(controlnet="single"), outputs=_first_tuple, note=_SD3_NOTE
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
            controlnets=[
                _Fresh("SD3ControlNetModel", **_SD3_CONTROLNET),
                _Fresh("SD3ControlNetModel", **_SD3_CONTROLNET),
            ]
        ),
        _sd3_inputs(controlnet="multi"),
        outputs=_first_tuple,
        note="Two SD3ControlNetModel: " + _SD3_NOTE + " No set_attn_processor on the wrapper.",
    ),
)
