"""Small diffusers models built from configs (random weights, no hub) for the tests.

Each keeps the attention layout of the real model it stands for and shrinks the rest:
- SD1.5: head dims 40 / 80 / 160 (real: 8 heads of 40/80/160; here 2 heads each),
  cross-attention from text tokens, conv projections.
- SD2.1: upcast_attention, use_linear_projection, head dim 64.
- SDXL: text_time added embedding, several transformer layers per block, head dim 64.
- VAE: single-head mid-block attention over (B, C, H, W) with group norm and residual.
"""

from __future__ import annotations

import copy

import torch
from diffusers import AutoencoderKL, UNet2DConditionModel


def tiny_sd15_unet(seed: int = 0) -> UNet2DConditionModel:
    torch.manual_seed(seed)
    return UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        block_out_channels=(80, 160, 320, 320),
        layers_per_block=1,
        # SD1.5's config calls the number of heads attention_head_dim.
        attention_head_dim=2,
        norm_num_groups=8,
        cross_attention_dim=64,
    ).eval()


def two_level_sd15_unet(seed: int = 0) -> UNet2DConditionModel:
    """SD1.5's layout (AttnProcessor2_0, self- and cross-attention, 2 heads of 16 and 32)
    at two resolutions instead of four: for the tests that compile a model with
    inductor, whose C++ build grows with the number of blocks."""
    torch.manual_seed(seed)
    return UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        block_out_channels=(32, 64),
        layers_per_block=1,
        attention_head_dim=2,
        norm_num_groups=8,
        cross_attention_dim=32,
    ).eval()


def tiny_sd21_unet(seed: int = 0) -> UNet2DConditionModel:
    torch.manual_seed(seed)
    return UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        block_out_channels=(64, 128, 128),
        layers_per_block=1,
        attention_head_dim=(1, 2, 2),
        norm_num_groups=16,
        cross_attention_dim=48,
        upcast_attention=True,
        use_linear_projection=True,
    ).eval()


def tiny_sdxl_unet(seed: int = 0) -> UNet2DConditionModel:
    torch.manual_seed(seed)
    return UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        block_out_channels=(64, 128, 128),
        layers_per_block=1,
        transformer_layers_per_block=(1, 2, 2),
        attention_head_dim=(1, 2, 2),
        norm_num_groups=16,
        cross_attention_dim=48,
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=32 + 6 * 8,
    ).eval()


def tiny_vae(seed: int = 0) -> AutoencoderKL:
    torch.manual_seed(seed)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(32, 64),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=16,
        sample_size=16,
    ).eval()


def unet_inputs(
    unet: UNet2DConditionModel,
    batch: int = 2,
    dtype: torch.dtype = torch.float32,
    text_len: int = 77,
    seed: int | None = None,
) -> dict:
    """Random (never zero) inputs for a UNet forward."""
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    cfg = unet.config
    size = cfg.sample_size
    kw = {
        "sample": torch.randn(batch, cfg.in_channels, size, size, generator=g, dtype=dtype),
        "timestep": torch.tensor([10.0 + 490.0 * i for i in range(batch)], dtype=dtype),
        "encoder_hidden_states": torch.randn(batch, text_len, cfg.cross_attention_dim, generator=g, dtype=dtype),
    }
    if cfg.addition_embed_type == "text_time":
        text_dim = cfg.projection_class_embeddings_input_dim - 6 * cfg.addition_time_embed_dim
        kw["added_cond_kwargs"] = {
            "text_embeds": torch.randn(batch, text_dim, generator=g, dtype=dtype),
            "time_ids": torch.tensor([[64.0, 64.0, 0.0, 0.0, 64.0, 64.0]] * batch, dtype=dtype),
        }
    return kw


def cast_inputs(kw: dict, dtype: torch.dtype) -> dict:
    out = {}
    for key, value in kw.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            out[key] = value.to(dtype)
        elif isinstance(value, dict):
            out[key] = cast_inputs(value, dtype)
        else:
            out[key] = value
    return out


def float64_copy(model: torch.nn.Module) -> torch.nn.Module:
    """The same weights in float64, running diffusers' own AttnProcessor: the reference."""
    from diffusers.models.attention_processor import AttnProcessor

    ref = copy.deepcopy(model).double()
    ref.set_attn_processor(AttnProcessor())
    return ref
