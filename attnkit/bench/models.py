"""The Stable Diffusion model under test, and its denoising loop.

By default the UNet, VAE and scheduler are built from the configs shipped in
``attnkit/configs/`` with random weights: speed does not depend on the values, and no
download is needed. ``load_model(path)`` loads real weights from a local directory or
the local Hugging Face cache instead (never the network).

The text encoder and tokenizer are not used: timing starts from prompt embeddings
(random, never zeros), exactly as ``pipe(prompt_embeds=..., negative_prompt_embeds=...)``.
:func:`denoise` is StableDiffusionPipeline's (and StableDiffusionXLPipeline's)
``__call__`` from "prepare timesteps" to the VAE decode, line for line: latents times
``init_noise_sigma``; per step ``cat([latents] * 2)``, ``scale_model_input``, the UNet,
classifier-free guidance, ``scheduler.step``; then ``vae.decode(latents / scaling_factor)``
and post-processing to uint8. The pipeline classes themselves import ``transformers``,
which the harness does not need.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable

import torch
from torch import nn

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}

TEXT_TOKENS = 77  # CLIP's context length: the cross-attention keys


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose float32, float16 or bfloat16") from None


def dtype_label(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype, str(dtype))


def load_config(config: str | dict) -> dict:
    """A config dict: given as is, or a file name under attnkit/configs/, or a path."""
    if isinstance(config, dict):
        return dict(config)
    package_file = resources.files("attnkit").joinpath("configs", config)
    if package_file.is_file():
        return json.loads(package_file.read_text())
    with open(config) as f:
        return json.load(f)


def _clean(config: dict) -> dict:
    return {k: v for k, v in config.items() if not k.startswith("_")}


@torch.no_grad()
def random_init_(module: nn.Module, seed: int = 0) -> nn.Module:
    """Fill every parameter with torch's default-initialisation scale, quickly.

    Weights of matrices and convolutions ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), biases
    small and random, norm scales 1: activations stay in a realistic range through the
    whole UNet (no NaN/inf in fp16) and nothing is zero.
    """
    gens: dict = {}
    for name, p in module.named_parameters():
        gen = gens.get(p.device)
        if gen is None:
            gen = gens[p.device] = torch.Generator(device=p.device).manual_seed(seed)
        if p.dim() >= 2:
            bound = 1.0 / math.sqrt(p[0].numel())
            p.uniform_(-bound, bound, generator=gen)
        elif name.endswith("weight"):  # norm scales
            p.fill_(1.0)
        else:  # biases
            p.uniform_(-0.01, 0.01, generator=gen)
    return module


def build_from_config(cls, config: dict, device: torch.device, dtype: torch.dtype, seed: int) -> nn.Module:
    """cls.from_config on the meta device, then random weights drawn on `device`: seconds."""
    with torch.device("meta"):
        model = cls.from_config(_clean(config))
    model = model.to_empty(device=device)
    random_init_(model, seed)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


@dataclass
class SDModel:
    """UNet + VAE + scheduler, and what the denoising loop needs to know about them."""

    unet: nn.Module
    vae: nn.Module
    scheduler: Any
    family: str  # "sd" or "sdxl"
    source: str
    device: torch.device
    dtype: torch.dtype
    vae_dtype: torch.dtype
    extra: dict = field(default_factory=dict)

    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    @property
    def cross_attention_dim(self) -> int:
        dim = self.unet.config.cross_attention_dim
        return dim if isinstance(dim, int) else dim[0]

    def unet_copy(self, dtype: torch.dtype | None = None, channels_last: bool = False) -> nn.Module:
        """An independent copy of the UNet (for configurations that change it)."""
        unet = copy.deepcopy(self.unet)
        if dtype is not None:
            unet = unet.to(dtype=dtype)
        if channels_last:
            unet = unet.to(memory_format=torch.channels_last)
        return unet


def build_model(preset, device: torch.device | str, dtype: torch.dtype | str | None = None, seed: int = 0) -> SDModel:
    """The preset's UNet/VAE/scheduler with random weights."""
    from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel

    device = torch.device(device)
    dtype = torch_dtype(dtype or preset.dtype)
    unet_cfg = load_config(preset.unet)
    vae_cfg = load_config(preset.vae)
    sched_cfg = _clean(load_config(preset.scheduler))
    unet = build_from_config(UNet2DConditionModel, unet_cfg, device, dtype, seed)
    vae = build_from_config(AutoencoderKL, vae_cfg, device, dtype, seed + 1)
    scheduler = DDIMScheduler.from_config(sched_cfg)
    source = unet_cfg.get("_source") or (preset.unet if isinstance(preset.unet, str) else "inline config")
    return SDModel(
        unet=unet,
        vae=vae,
        scheduler=scheduler,
        family=preset.family,
        source=f"random weights, architecture of {source}",
        device=device,
        dtype=dtype,
        vae_dtype=dtype,
    )


def load_model(path: str, device: torch.device | str, dtype: torch.dtype | str) -> SDModel:
    """UNet/VAE/scheduler of a real pipeline from a local directory or the local HF cache."""
    from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel

    device = torch.device(device)
    dtype = torch_dtype(dtype)
    kw = {"torch_dtype": dtype, "local_files_only": True}
    unet = UNet2DConditionModel.from_pretrained(path, subfolder="unet", **kw).to(device).eval()
    vae = AutoencoderKL.from_pretrained(path, subfolder="vae", **kw).to(device).eval()
    sched_cfg = DDIMScheduler.load_config(path, subfolder="scheduler", local_files_only=True)
    scheduler = DDIMScheduler.from_config(sched_cfg)
    family = "sdxl" if unet.config.get("addition_embed_type") == "text_time" else "sd"
    return SDModel(
        unet=unet.requires_grad_(False),
        vae=vae.requires_grad_(False),
        scheduler=scheduler,
        family=family,
        source=f"weights from {path}",
        device=device,
        dtype=dtype,
        vae_dtype=dtype,
    )


@dataclass
class Conditioning:
    """Prompt embeddings for `batch` prompts (random: never time on zeros)."""

    prompt_embeds: torch.Tensor  # (B, 77, C)
    negative_prompt_embeds: torch.Tensor
    pooled: torch.Tensor | None = None  # SDXL: (B, 1280)
    negative_pooled: torch.Tensor | None = None

    @property
    def batch(self) -> int:
        return self.prompt_embeds.shape[0]


def make_conditioning(model: SDModel, batch: int, dtype: torch.dtype, seed: int = 0) -> Conditioning:
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=model.device, dtype=dtype)

    c = model.cross_attention_dim
    cond = Conditioning(rand(batch, TEXT_TOKENS, c), rand(batch, TEXT_TOKENS, c))
    if model.family == "sdxl":
        pooled = model.unet.config.projection_class_embeddings_input_dim - 6 * model.unet.config.addition_time_embed_dim
        cond.pooled, cond.negative_pooled = rand(batch, pooled), rand(batch, pooled)
    return cond


class StepClock:
    """Per-step times without perturbing the loop: CUDA events on CUDA, perf_counter else.

    Events are recorded on the stream between steps, so no synchronisation happens
    inside the loop (as with the pipeline's progress bar); ``finish()`` synchronises once.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.marks = [self._now()]

    def mark(self) -> None:
        self.marks.append(self._now())

    def finish(self) -> list[float]:
        """Seconds between consecutive marks."""
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1000.0 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


@dataclass
class LoopTiming:
    step_seconds: list[float]
    decode_seconds: float | None = None

    def it_per_s(self, skip: int = 0) -> float:
        """Steps per second over the steps after the first `skip` (0: the progress bar's rate)."""
        skip = min(skip, max(len(self.step_seconds) - 1, 0))
        steps = self.step_seconds[skip:]
        return len(steps) / sum(steps)

    @property
    def loop_seconds(self) -> float:
        return sum(self.step_seconds)

    @property
    def image_seconds(self) -> float:
        return self.loop_seconds + (self.decode_seconds or 0.0)


def unet_step_inputs(
    model: SDModel, cond: Conditioning, resolution: int, dtype: torch.dtype | None = None, seed: int = 0
) -> tuple[tuple, dict]:
    """(args, kwargs) of one UNet call as a step of :func:`denoise` makes it (random latents,
    both halves of classifier-free guidance, a mid-schedule timestep)."""
    dtype = dtype or cond.prompt_embeds.dtype
    device = model.device
    gen = torch.Generator(device="cpu").manual_seed(seed + 7)
    size = resolution // model.vae_scale_factor
    latents = torch.randn((2 * cond.batch, model.unet.config.in_channels, size, size), generator=gen).to(device, dtype)
    t = torch.tensor(501, device=device)  # int64, 0-dim: what scheduler.timesteps holds
    kwargs: dict = {
        "encoder_hidden_states": torch.cat([cond.negative_prompt_embeds, cond.prompt_embeds]).to(dtype),
        "timestep_cond": None,
        "cross_attention_kwargs": None,
        "added_cond_kwargs": None,
        "return_dict": False,
    }
    if model.family == "sdxl":
        time_ids = torch.tensor([[resolution, resolution, 0, 0, resolution, resolution]], dtype=dtype, device=device)
        kwargs["added_cond_kwargs"] = {
            "text_embeds": torch.cat([cond.negative_pooled, cond.pooled]).to(dtype),
            "time_ids": time_ids.repeat(2 * cond.batch, 1),
        }
    return (latents, t), kwargs


@torch.no_grad()
def denoise(
    model: SDModel,
    cond: Conditioning,
    steps: int,
    resolution: int,
    *,
    unet: Callable | None = None,
    dtype: torch.dtype | None = None,
    vae: nn.Module | None = None,
    decode: bool = False,
    guidance_scale: float = 7.5,
    seed: int = 0,
) -> LoopTiming:
    """StableDiffusionPipeline's denoising loop (and the VAE decode if asked), timed per step."""
    unet = unet if unet is not None else model.unet
    dtype = dtype or cond.prompt_embeds.dtype
    device = model.device
    scheduler = copy.deepcopy(model.scheduler)
    scheduler.set_timesteps(steps, device=device)
    timesteps = scheduler.timesteps
    batch = cond.batch
    generator = torch.Generator(device=device).manual_seed(seed)
    size = resolution // model.vae_scale_factor
    latents = torch.randn(
        (batch, model.unet.config.in_channels, size, size), generator=generator, device=device, dtype=dtype
    )
    latents = latents * scheduler.init_noise_sigma
    prompt_embeds = torch.cat([cond.negative_prompt_embeds, cond.prompt_embeds]).to(dtype)
    added_cond_kwargs = None
    if model.family == "sdxl":
        time_ids = torch.tensor([[resolution, resolution, 0, 0, resolution, resolution]], dtype=dtype, device=device)
        added_cond_kwargs = {
            "text_embeds": torch.cat([cond.negative_pooled, cond.pooled]).to(dtype),
            "time_ids": time_ids.repeat(2 * batch, 1),
        }
    extra_step_kwargs = {"eta": 0.0, "generator": generator}

    clock = StepClock(device)
    clock.start()
    for t in timesteps:
        latent_model_input = torch.cat([latents] * 2)
        latent_model_input = scheduler.scale_model_input(latent_model_input, t)
        noise_pred = unet(
            latent_model_input,
            t,
            encoder_hidden_states=prompt_embeds,
            timestep_cond=None,
            cross_attention_kwargs=None,
            added_cond_kwargs=added_cond_kwargs,
            return_dict=False,
        )[0]
        noise_pred_uncond, noise_pred_text = noise_pred.chunk(2)
        noise_pred = noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)
        latents = scheduler.step(noise_pred, t, latents, **extra_step_kwargs, return_dict=False)[0]
        clock.mark()
    if decode:
        vae = vae if vae is not None else model.vae
        vae_dtype = next(vae.parameters()).dtype
        upcast = vae_dtype == torch.float16 and getattr(vae.config, "force_upcast", False)
        if upcast:  # as the SDXL pipeline does: its VAE overflows in fp16
            vae.to(torch.float32)
        image = vae.decode(
            latents.to(torch.float32 if upcast else vae_dtype) / vae.config.scaling_factor, return_dict=False
        )[0]
        image = ((image / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8).cpu()
        clock.mark()
        if upcast:
            vae.to(vae_dtype)
    times = clock.finish()
    if decode:
        return LoopTiming(times[:-1], times[-1])
    return LoopTiming(times)
