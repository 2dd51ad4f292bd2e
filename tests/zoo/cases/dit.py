"""Zoo cases: DiT-style transformers: DiT, PixArt, Latte, diffusers' Transformer2DModel and TransformerTemporalModel.

See tests/zoo/cases/__init__.py for what a case keeps of its model.
"""

from __future__ import annotations

import torch

from tests.zoo._zoo_common import ZooCase, model_param
from tests.zoo.cases._helpers import _keep, _pd, _r, _rn, _steps, _timestep

CASES: list[ZooCase] = []
NO_ATTENTION: dict[str, str] = {}


def _add(*cases: ZooCase) -> None:
    CASES.extend(cases)


# --- DiT ----------------------------------------------------------------------------------

CASES.append(
    ZooCase(
        name="DiTTransformer2DModel",
        config=dict(
            num_attention_heads=2,
            attention_head_dim=16,
            in_channels=4,
            out_channels=4,
            num_layers=2,
            sample_size=8,
            patch_size=2,
            num_embeds_ada_norm=10,
        ),
        inputs=lambda model, gen: {
            "hidden_states": _rn(model, gen, 1, 4, 8, 8),
            "timestep": _timestep(model, gen, 1),
            "class_labels": torch.randint(0, 10, (1,), generator=gen).to(model_param(model).device),
        },
        note=(
            "Attention (BasicTransformerBlock, ada_norm_zero, self-attention only) + AttnProcessor2_0 -> "
            "F.scaled_dot_product_attention, no mask; the model has no set_attn_processor"
        ),
        extra={"out_shape": (1, 4, 8, 8)},
    )
)


# --- Latte --------------------------------------------------------------------------------

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
    )
)


# --- PixArt -------------------------------------------------------------------------------

_PIXART = dict(
    num_attention_heads=3,  # the size embeddings need a width divisible by 3
    attention_head_dim=16,
    in_channels=4,
    out_channels=8,
    num_layers=2,
    cross_attention_dim=48,
    sample_size=8,
    patch_size=2,
    caption_channels=24,
    use_additional_conditions=True,  # PixArt-alpha 1024: resolution and aspect-ratio embeddings
)


def _pixart_inputs(text_lengths, text_len=6, hw=8):
    def inputs(model, gen):
        device, dtype = _pd(model)
        batch = len(text_lengths)
        return dict(
            hidden_states=_r(gen, model, batch, 4, hw, hw),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.caption_channels),
            timestep=_steps(gen, model, batch),
            added_cond_kwargs={
                "resolution": torch.tensor([[64.0, 64.0]] * batch, device=device, dtype=dtype),
                "aspect_ratio": torch.tensor([[1.0]] * batch, device=device, dtype=dtype),
            },
            # the T5 tokenizer's int64 mask, as the pipeline passes it
            encoder_attention_mask=_keep(text_lengths, text_len, device, dtype=torch.long),
        )

    return inputs


_PIXART_NOTE = (
    "diffusers Attention + AttnProcessor2_0 in BasicTransformerBlock (ada_norm_single): image self-attention "
    "and text cross-attention; the text mask is made additive (-10000) (B, 1, L) and expanded by "
    "prepare_attention_mask to (B, heads, 1, L) float."
)
_add(
    ZooCase("PixArtTransformer2DModel", _PIXART, _pixart_inputs([6, 6]), note=_PIXART_NOTE + " Mask all ones."),
    ZooCase("PixArtTransformer2DModel", _PIXART, _pixart_inputs([6, 2]), variant="masked", note=_PIXART_NOTE),
    ZooCase(
        "PixArtTransformer2DModel",
        _PIXART,
        _pixart_inputs([4, 0]),
        variant="fullpad",
        note=_PIXART_NOTE + " Item 2 has every text token masked: the additive mask makes it a uniform average.",
    ),
)


# --- Transformer2DModel (continuous, patched DiT-style, vectorized VQ-Diffusion), TransformerTemporalModel ---

_T2D_CONTINUOUS = dict(
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=32,
    num_layers=2,
    norm_num_groups=8,
    cross_attention_dim=24,
    use_linear_projection=True,
)
_T2D_PATCHED = dict(  # DiT: class-conditioned ada_norm_zero, no cross-attention
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=4,
    out_channels=8,
    num_layers=2,
    sample_size=8,
    patch_size=2,
    num_embeds_ada_norm=10,
    norm_type="ada_norm_zero",
    norm_elementwise_affine=False,
    activation_fn="gelu-approximate",
)
_T2D_VECTORIZED = dict(  # VQ-Diffusion: discrete latent pixels, ada_norm over timesteps, text cross-attention
    num_attention_heads=2,
    attention_head_dim=16,
    num_layers=2,
    sample_size=4,
    num_vector_embeds=17,
    cross_attention_dim=24,
    num_embeds_ada_norm=100,
    norm_type="ada_norm",
    activation_fn="geglu-approximate",
    attention_bias=True,
)


def _t2d_continuous_inputs(text_lengths, hw=6, text_len=5):
    def inputs(model, gen):
        device, _ = _pd(model)
        batch = len(text_lengths)
        return dict(
            hidden_states=_r(gen, model, batch, model.config.in_channels, hw, hw),
            encoder_hidden_states=_r(gen, model, batch, text_len, model.config.cross_attention_dim),
            encoder_attention_mask=_keep(text_lengths, text_len, device, dtype=torch.long),
        )

    return inputs


def _t2d_patched_inputs(model, gen, batch=2, hw=8):
    device, _ = _pd(model)
    return dict(
        hidden_states=_r(gen, model, batch, model.config.in_channels, hw, hw),
        timestep=torch.randint(1, 1000, (batch,), generator=gen).to(device),
        class_labels=torch.randint(0, model.config.num_embeds_ada_norm, (batch,), generator=gen).to(device),
    )


def _t2d_vectorized_inputs(model, gen, batch=2, text_len=5):
    device, _ = _pd(model)
    cfg = model.config
    return dict(
        hidden_states=torch.randint(0, cfg.num_vector_embeds, (batch, cfg.sample_size**2), generator=gen).to(device),
        encoder_hidden_states=_r(gen, model, batch, text_len, cfg.cross_attention_dim),
        # one scalar timestep, as the VQ-Diffusion pipeline passes it (ada_norm chunks a 1-D embedding)
        timestep=torch.randint(1, cfg.num_embeds_ada_norm, (), generator=gen).to(device),
    )


_T2D_NOTE = "diffusers Attention + AttnProcessor2_0 in BasicTransformerBlock; no set_attn_processor on the model."
_add(
    ZooCase(
        "Transformer2DModel",
        _T2D_CONTINUOUS,
        _t2d_continuous_inputs([5, 5]),
        note="Continuous input (the SD UNet block): image self-attention and text cross-attention. " + _T2D_NOTE,
    ),
    ZooCase(
        "Transformer2DModel",
        _T2D_CONTINUOUS,
        _t2d_continuous_inputs([5, 2]),
        variant="masked",
        note="Continuous input; the text mask made additive (-10000), expanded to (B, heads, 1, L) float. " + _T2D_NOTE,
    ),
    ZooCase(
        "Transformer2DModel",
        _T2D_PATCHED,
        _t2d_patched_inputs,
        variant="patched",
        note="Patched input (DiT): class-conditioned ada_norm_zero, self-attention only. " + _T2D_NOTE,
    ),
    ZooCase(
        "Transformer2DModel",
        _T2D_VECTORIZED,
        _t2d_vectorized_inputs,
        variant="vectorized",
        note="Vectorized input (VQ-Diffusion): latent pixel classes, self- and text cross-attention; the output is "
        "log-probabilities over the classes. " + _T2D_NOTE,
    ),
)

_TEMPORAL = dict(num_attention_heads=2, attention_head_dim=16, in_channels=32, num_layers=1, norm_num_groups=8)


def _temporal_inputs(model, gen, batch=2, frames=3, hw=4):
    return dict(hidden_states=_r(gen, model, batch * frames, model.config.in_channels, hw, hw), num_frames=frames)


_add(
    ZooCase(
        "TransformerTemporalModel",
        _TEMPORAL,
        _temporal_inputs,
        note=(
            "diffusers Attention + AttnProcessor2_0 in BasicTransformerBlock: two self-attentions (attn1, attn2 "
            "without a context) over the frames of each pixel; no mask. No set_attn_processor on the model."
        ),
    )
)
