"""Table 5: a transformer's forward per step, attnkit against diffusers' own attention.

The model (Flux, SD3 or Wan) is built from a shipped config with random weights and
run as its pipeline runs it: one forward per step on latents, prompt embeddings and ids
of the pipeline's shapes, the latents advanced by an Euler flow-matching step. Each
column of the table is one way of setting the model's attention (:data:`SETTINGS`):

- ``native``, ``flash``, ``sage``: ``model.set_attention_backend(name)``;
- ``attnkit``: ``model.set_attention_backend("attnkit")``, attnkit's diffusers backend;
- ``attnkit.apply``: ``attnkit.apply(model, attnkit.auto())``;
- ``stock``: the processors the model was built with, diffusers' default backend.

All columns share the model and are measured interleaved in this process; before every
run the stock processors are put back and the column's setting applied. A setting that
cannot be made here (a package not installed, a backend diffusers does not know, one that
reaches none of the model's attention modules) is "n/a" with its reason; one that raises
while running is "n/a" or "failed" with the error. ``set_attention_backend`` also sets
diffusers' process-wide active backend: every run happens inside
``attention_backend(<diffusers' default>)``, so the stock column stays stock, and the
table leaves the active backend as it found it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

import attnkit

from .context import COMPILED_WARMUP_STEPS, Compiled, raise_cache_limits
from .measure import STATUS_NA, STATUS_SKIPPED, Config, clip, describe, is_oom, measure_interleaved, probe_cells
from .models import LoopTiming, StepClock, dtype_label, load_config, random_init_, torch_dtype
from .presets import ROUTE_1, ROUTE_2
from .share import COMPILED_TOLERANCE, attention_modules, max_difference, safe_profile_step

LATENT_CHANNELS = 16  # Flux, SD3 and Wan VAEs
VAE_FACTOR = 8


class NotApplicable(Exception):
    """A way of setting attention that does not apply to this model or machine."""


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


# -- ways of setting attention -----------------------------------------------------------
def route_of(stock: dict[nn.Module, Any]) -> str:
    """Which of the two routes the model's stock processors take."""

    return ROUTE_1 if any(hasattr(p, "_attention_backend") for p in stock.values()) else ROUTE_2


def _stock(model: nn.Module, modules: list[nn.Module]) -> str:
    return f"{len(modules)} attention modules, their own processors, diffusers' default backend"


def _diffusers_backend(name: str) -> Callable[[nn.Module, list[nn.Module]], str]:
    def set_backend(model: nn.Module, modules: list[nn.Module]) -> str:
        model.set_attention_backend(name)
        # diffusers sets the backend on processors that dispatch through it and passes
        # over the others without a word: count what it reached.
        reached = sum(1 for m in modules if getattr(m.processor, "_attention_backend", None) == name)
        if not reached:
            kinds = sorted({type(m.processor).__name__ for m in modules})
            raise NotApplicable(
                f"set_attention_backend({name!r}) reaches none of the {len(modules)} attention "
                f"modules (their {', '.join(kinds)} call attention themselves)"
            )
        return f"{reached} of {len(modules)} attention modules"

    return set_backend


def _attnkit_apply(model: nn.Module, modules: list[nn.Module]) -> str:
    where = attnkit.apply(model, attnkit.auto())  # {module: "attnkit..." or the processor kept}
    if not isinstance(where, dict):
        return clip(f"attnkit.apply returned {where!r}", 120)
    served = sum(1 for v in where.values() if str(v).startswith("attnkit"))
    kept = sorted({str(v) for v in where.values() if not str(v).startswith("attnkit")})
    if not served:
        raise NotApplicable(f"attnkit.apply kept every module's own processor ({', '.join(kept)})")
    return f"{served} of {len(where)} attention modules to attnkit" + (f", kept {', '.join(kept)}" if kept else "")


# In the order measured: the comparison the table is for first (diffusers' native backend
# against attnkit's two routes), then diffusers' fused kernels, then stock, which on a
# route-1 model is native again: the pair's difference is the run's noise floor.
SETTINGS: dict[str, Callable[[nn.Module, list[nn.Module]], str]] = {
    "native": _diffusers_backend("native"),
    "attnkit": _diffusers_backend("attnkit"),
    "attnkit.apply": _attnkit_apply,
    # lossy (docs/int8.md): its row carries its output's difference from the attnkit row's
    "attnkit int8": _diffusers_backend("attnkit_int8"),
    "flash": _diffusers_backend("flash"),
    "sage": _diffusers_backend("sage"),
    "stock": _stock,
}


# How each setting is made, as a user would write it (shown in the table).
HOW = {
    "stock": "as built (diffusers' default)",
    "native": "set_attention_backend('native')",
    "flash": "set_attention_backend('flash')",
    "sage": "set_attention_backend('sage')",
    "attnkit": "set_attention_backend('attnkit')",
    "attnkit.apply": "attnkit.apply(model, attnkit.auto())",
    "attnkit int8": "set_attention_backend('attnkit_int8') (lossy: INT8 Q.K under the quality guard)",
}


# The compiled rows: a setting above, then torch.compile (default mode; fullgraph first,
# without it where that fails) of the same model object, no copy of a 12B model: of each
# repeated block where the model declares them (``_repeated_blocks``: Flux, Wan), as
# diffusers' ``compile_repeated_blocks`` does, one compilation per block class (Flux:
# seconds instead of minutes for the whole model); else of the whole model (SD3).
COMPILED_SETTINGS = {"attnkit + torch.compile": "attnkit", "native + torch.compile": "native"}
# Lossy settings -> the exact setting their output is compared with (the row's check).
LOSSY_SETTINGS = {"attnkit int8": "attnkit"}
for _name, _base in COMPILED_SETTINGS.items():
    HOW[_name] = f"{HOW[_base]}, then torch.compile (repeated blocks, or the model)"


class RegionalCompiled:
    """torch.compile of each repeated block of `net` (``net._repeated_blocks``), installed as
    nn.Module.compile installs it (``_compiled_call_impl``) only while this row runs, so
    that the other rows of the table run the same blocks eager. fullgraph=True first for
    all of them; where a block's call fails under it, every block is compiled again
    without it. Without repeated blocks, the whole model (:class:`.context.Compiled`)."""

    def __init__(self, net: nn.Module, backend: str):
        raise_cache_limits()  # every block runs nn.Module._call_impl: one code object, many graphs
        kinds = set(getattr(net, "_repeated_blocks", None) or ())
        self.blocks = [m for m in net.modules() if type(m).__name__ in kinds]
        self.whole = None if self.blocks else Compiled(net, None, backend)
        self.backend, self.fullgraph, self.fullgraph_error, self.called = backend, True, None, False
        self.fns = self._compile(True) if self.blocks else []

    def _compile(self, fullgraph: bool) -> list:
        return [torch.compile(m._call_impl, fullgraph=fullgraph, backend=self.backend) for m in self.blocks]

    def install(self) -> None:
        for i, m in enumerate(self.blocks):
            m._compiled_call_impl = self._guarded(i) if self.fullgraph else self.fns[i]

    def _guarded(self, i: int) -> Callable:
        """Block i's compiled call under fullgraph=True: where it fails, every block is
        compiled again without fullgraph (the error kept), and the call retried."""

        def call(*args, **kwargs):
            if not self.fullgraph:
                return self.fns[i](*args, **kwargs)
            try:
                out = self.fns[i](*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - retried without fullgraph, the first error kept
                if is_oom(exc):
                    raise
                self.fullgraph, self.fullgraph_error = False, describe(exc, 200)
                self.fns = self._compile(False)
                self.install()
                out = self.fns[i](*args, **kwargs)
            self.called = True
            return out

        return call

    def uninstall(self) -> None:
        for m in self.blocks:
            m._compiled_call_impl = None

    def __call__(self, *args, **kwargs):
        if self.whole is not None:
            return self.whole(*args, **kwargs)
        raise TypeError("regional compilation: call the model itself with the blocks installed")

    def info(self) -> dict:
        if self.whole is not None:
            return {**self.whole.info(), "scope": "whole model"}
        kinds = sorted({type(m).__name__ for m in self.blocks})
        tried = self.called or self.fullgraph_error is not None
        return {
            "mode": "default",
            "backend": self.backend,
            "fullgraph": self.fullgraph if tried else None,
            "fullgraph_error": self.fullgraph_error,
            "scope": f"repeated blocks: {len(self.blocks)} ({', '.join(kinds)})",
        }


def resolve_settings(spec: str | None) -> list[str]:
    """`None`/"all" -> every setting, the compiled ones last; else a comma-separated list, checked."""
    known = [*SETTINGS, *COMPILED_SETTINGS]
    if spec is None or spec.strip() in ("", "all"):
        return known
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown attention setting(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    return list(dict.fromkeys(names))


def _default_backend() -> contextlib.AbstractContextManager:
    """diffusers' default active backend for the duration (restored after)."""
    try:
        from diffusers.models.attention_dispatch import attention_backend
        from diffusers.utils.constants import DIFFUSERS_ATTN_BACKEND
    except ImportError:  # a diffusers without attention backends: nothing to keep stock
        return contextlib.nullcontext()
    return attention_backend(DIFFUSERS_ATTN_BACKEND)


# -- table 5 -----------------------------------------------------------------------------
def transformer_table(ctx) -> dict:
    """Seconds per forward step for each way of setting attention, interleaved."""
    p, model = ctx.preset, ctx.model
    net = model.transformer
    modules = attention_modules(net)
    stock = {m: m.processor for m in modules}

    regional: list[RegionalCompiled] = []  # compiled rows' blocks: installed only while their row runs

    def apply_setting(name: str) -> str:
        for r in regional:
            r.uninstall()
        for m, proc in stock.items():
            m.set_processor(proc)
        if hasattr(net, "reset_attention_backend"):
            net.reset_attention_backend()
        return SETTINGS[name](net, modules)

    def run(warmup: bool) -> LoopTiming:
        with _default_backend():
            return transformer_loop(model, p.warmup_steps if warmup else p.steps)

    def eager_probe(name: str) -> Callable[[bool], dict]:
        def probe(profile: bool) -> dict:
            out: dict = {}
            if name in LOSSY_SETTINGS:
                out["check"] = lossy_check(name)
            if not profile:
                return out
            with _default_backend(), torch.no_grad():  # as the loop: grad mode is part of a compiled graph's guards
                apply_setting(name)
                out["attention"] = safe_profile_step(
                    lambda: model.forward(model.latents, 1.0), modules, ctx.device, ranges=True
                )
                return out

        return probe

    def lossy_check(name: str) -> dict:
        """A lossy row's output against the exact setting it stands beside, one step."""
        exact_name = LOSSY_SETTINGS[name]
        try:
            with _default_backend(), torch.no_grad():
                apply_setting(name)
                got = model.forward(model.latents, 1.0).clone()
                apply_setting(exact_name)
                check = max_difference(got, model.forward(model.latents, 1.0))
            return {**check, "lossy": True, "against": HOW[exact_name], "matches": check["finite"]}
        except Exception as exc:  # noqa: BLE001 - reported in the row
            return {"error": describe(exc, 160)}

    def compiled_config(name: str, base: str, where: str) -> Config:
        holder: dict = {}

        def setup() -> None:
            apply_setting(base)
            if "fn" not in holder:
                holder["fn"] = RegionalCompiled(net, ctx.compile_backend)
                regional.append(holder["fn"])
            holder["fn"].install()

        def compiled_net() -> Callable | None:
            """What the loop calls: the model (its blocks compiled, installed), or the whole compiled model."""
            fn = holder["fn"]
            return fn if fn.whole is not None else None

        def run_compiled(warmup: bool) -> LoopTiming:
            steps = max(p.warmup_steps, COMPILED_WARMUP_STEPS) if warmup else p.steps
            with _default_backend():
                return transformer_loop(model, steps, compiled_net())

        def probe(profile: bool) -> dict:
            if "fn" not in holder:
                return {}
            out: dict = {"compile": holder["fn"].info()}
            if not profile or not holder["fn"].called:
                return out
            with _default_backend(), torch.no_grad():  # as the loop: no recompilation for grad mode
                setup()
                fn = compiled_net()
                out["attention"] = safe_profile_step(
                    lambda: model.forward(model.latents, 1.0, fn), modules, ctx.device, ranges=False
                )
                try:
                    got = model.forward(model.latents, 1.0, fn).clone()
                    apply_setting(base)  # the same setting, eager
                    check = max_difference(got, model.forward(model.latents, 1.0))
                    tol = COMPILED_TOLERANCE.get(model.dtype, 1e-1)
                    out["check"] = {**check, "tolerance": tol, "matches": check["finite"] and check["relative"] <= tol}
                except Exception as exc:  # noqa: BLE001 - reported in the row
                    out["check"] = {"error": describe(exc, 160)}
            return out

        return Config(
            name,
            run_compiled,
            setup=setup,
            extra={"how": HOW[name], "where": where},
            keep={"probe": probe, "holder": holder},
            group="compile",
        )

    configs = []
    with _default_backend():
        for name in ctx.processors:
            base = COMPILED_SETTINGS.get(name)
            if base is not None and not ctx.compile:
                configs.append(
                    Config(
                        name, None, status=STATUS_SKIPPED, reason="compile off (--compile)", extra={"how": HOW[name]}
                    )
                )
                continue
            try:
                where = apply_setting(base or name)
            except Exception as exc:  # noqa: BLE001 - cannot be set here: a result, not a crash
                reason = str(exc) if isinstance(exc, NotApplicable) else describe(exc, 300)
                configs.append(Config(name, None, status=STATUS_NA, reason=reason, extra={"how": HOW[name]}))
                continue
            if base is not None:
                configs.append(compiled_config(name, base, where))
                continue
            configs.append(
                Config(
                    name,
                    run,
                    setup=lambda name=name: apply_setting(name),
                    extra={"how": HOW[name], "where": where},
                    keep={"probe": eager_probe(name)},
                )
            )
        deadline = ctx.deadline()
        try:
            cells = measure_interleaved(
                configs,
                p.repeats,
                p.skip_steps,
                desc=f"table 5: {p.name}",
                progress=ctx.progress,
                deadline=deadline,
                device=ctx.device,
                always=2,
                sample_factor=p.steps / p.warmup_steps,
            )
            probe_cells(configs, cells, deadline)
        finally:
            apply_setting("stock")
    ref = {base: cells[base].median("step_seconds") for base in ("native", "stock") if base in cells and cells[base].ok}
    return {
        "title": "transformer forward per step",
        "models": [
            {
                "preset": p.name,
                "label": p.label,
                "route": route_of(stock),
                "source": model.source,
                "setting": {
                    "family": p.family,
                    "height": p.height,
                    "width": p.width,
                    "frames": p.frames,
                    "batch": p.batch,
                    "tokens": model.tokens,
                    "dtype": dtype_label(model.dtype),
                    "steps": p.steps,
                    "repeats": p.repeats,
                    "warmup_steps": p.warmup_steps,
                    "steady_state_skips_first_steps": p.skip_steps,
                    "budget_seconds": ctx.budget,
                    "attention_modules": len(modules),
                },
                "cells": {n: c.to_dict() for n, c in cells.items()},
                "ratio_vs": {
                    base: {n: c.median("step_seconds") / r for n, c in cells.items() if c.ok} for base, r in ref.items()
                },
            }
        ],
        "interrupted": cells.interrupted,
    }


__all__ = [
    "COMPILED_SETTINGS",
    "SETTINGS",
    "attention_modules",
    "TransformerModel",
    "build_transformer",
    "resolve_settings",
    "transformer_loop",
    "transformer_table",
]
