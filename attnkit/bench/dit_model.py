"""The transformer of table 5 and its loop: built from a shipped config, run as its pipeline runs it.

Random weights, since speed does not depend on their values and nothing is downloaded;
inputs of the pipeline's shapes (latents, prompt embeddings, position ids), never zeros,
so that no kernel takes a shortcut; one forward per step, each followed by the Euler
flow-matching step, so that a step costs what it costs in the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .models import LoopTiming, StepClock, load_config, random_init_, torch_dtype

LATENT_CHANNELS = 16  # Flux, SD3 and Wan VAEs
VAE_FACTOR = 8


@dataclass
class TransformerModel:
    """The transformer under test and the fixed inputs of its forward."""

    transformer: nn.Module
    family: str
    source: str
    device: torch.device
    dtype: torch.dtype
    latents: torch.Tensor  # the initial latents, as the pipeline hands them to the model
    kwargs: dict  # every other input of the forward, the same at every step
    tokens: dict  # {"image": n, "text": n}: what attention sees

    def forward(self, latents: torch.Tensor, sigma: float, net: Callable | None = None) -> torch.Tensor:
        """One forward of the transformer (or of `net`, a compiled one) at flow-matching `sigma`."""
        batch = latents.shape[0]
        # Flux takes the flow-matching sigma (it scales by 1000 itself); SD3 and Wan the
        # pipeline's timestep, sigma * 1000.
        t = sigma if self.family == "flux" else sigma * 1000.0
        timestep = torch.full((batch,), t, device=self.device, dtype=self.dtype)
        net = self.transformer if net is None else net
        return net(hidden_states=latents, timestep=timestep, return_dict=False, **self.kwargs)[0]


def build_transformer(preset, device: torch.device | str, seed: int = 0) -> TransformerModel:
    """The preset's transformer (random weights) and the inputs of its forward."""
    import diffusers

    device = torch.device(device)
    dtype = torch_dtype(preset.dtype)
    config = {**load_config(preset.config), **preset.reduce}
    cls = getattr(diffusers, config["_class_name"])
    torch.manual_seed(seed)
    # Built on the device itself (not on "meta"): the position-embedding buffers of SD3
    # and Wan are computed at construction; random_init_ then draws every weight.
    with torch.device(device):
        model = cls.from_config({k: v for k, v in config.items() if not k.startswith("_")})
    random_init_(model, seed)
    model = model.to(dtype=dtype).eval().requires_grad_(False)
    # As from_pretrained(torch_dtype=...) does: the modules the class keeps in float32 stay so.
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    for name, module in model.named_modules():
        if keep and any(k in name.split(".") for k in keep):
            module.float()
    latents, kwargs, tokens = _inputs(preset, model.config, device, dtype, seed)
    source = f"random weights, architecture of {config.get('_source', preset.config)}"
    if preset.reduce:
        source += " reduced: " + ", ".join(f"{k}={v}" for k, v in preset.reduce.items())
    return TransformerModel(model, preset.family, source, device, dtype, latents, kwargs, tokens)


def _inputs(preset, config, device, dtype, seed) -> tuple[torch.Tensor, dict, dict]:
    """Random inputs of the pipeline's shapes (never zeros): (latents, other kwargs, tokens)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    b, t = preset.batch, preset.text_tokens
    h, w = preset.height // VAE_FACTOR, preset.width // VAE_FACTOR
    if preset.family == "flux":
        # FluxPipeline packs 2x2 latent patches into tokens of 4 * 16 channels.
        hp, wp = h // 2, w // 2
        ids = torch.zeros(hp, wp, 3)
        ids[..., 1] = torch.arange(hp)[:, None]
        ids[..., 2] = torch.arange(wp)[None, :]
        kwargs = {
            "encoder_hidden_states": rand(b, t, config.joint_attention_dim),
            "pooled_projections": rand(b, config.pooled_projection_dim),
            "img_ids": ids.reshape(-1, 3).to(device=device, dtype=dtype),
            "txt_ids": torch.zeros(t, 3, device=device, dtype=dtype),
        }
        if config.guidance_embeds:
            kwargs["guidance"] = torch.full((b,), 3.5, device=device, dtype=dtype)
        return rand(b, hp * wp, config.in_channels), kwargs, {"image": hp * wp, "text": t}
    if preset.family == "sd3":
        p = config.patch_size
        kwargs = {
            "encoder_hidden_states": rand(b, t, config.joint_attention_dim),
            "pooled_projections": rand(b, config.pooled_projection_dim),
        }
        return rand(b, config.in_channels, h, w), kwargs, {"image": (h // p) * (w // p), "text": t}
    if preset.family == "wan":
        frames = (preset.frames - 1) // 4 + 1
        pt, ph, pw = config.patch_size
        kwargs = {"encoder_hidden_states": rand(b, t, config.text_dim)}
        return (
            rand(b, config.in_channels, frames, h, w),
            kwargs,
            {"image": (frames // pt) * (h // ph) * (w // pw), "text": t},
        )
    raise ValueError(f"unknown transformer family {preset.family!r}; choose flux, sd3 or wan")


@torch.no_grad()
def transformer_loop(model: TransformerModel, steps: int, net: Callable | None = None) -> LoopTiming:
    """`steps` forwards (of `net`, a compiled transformer, where given), each followed by the
    Euler flow-matching step, timed per step."""
    latents = model.latents.clone()
    sigmas = torch.linspace(1.0, 1.0 / steps, steps).tolist() + [0.0]
    clock = StepClock(model.device)
    clock.start()
    for sigma, nxt in zip(sigmas, sigmas[1:]):
        velocity = model.forward(latents, sigma, net)
        latents = latents + (nxt - sigma) * velocity
        clock.mark()
    return LoopTiming(clock.finish())
