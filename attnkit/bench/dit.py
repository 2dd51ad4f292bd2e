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

The model and its loop are in :mod:`.dit_model`, the settings in :mod:`.dit_settings`.
"""

from __future__ import annotations

from typing import Callable

import torch

from .context import COMPILED_WARMUP_STEPS
from .dit_model import TransformerModel, build_transformer, transformer_loop
from .dit_settings import (
    COMPILED_SETTINGS,
    HOW,
    LOSSY_SETTINGS,
    SETTINGS,
    NotApplicable,
    RegionalCompiled,
    _default_backend,
    resolve_settings,
    route_of,
)
from .measure import STATUS_NA, STATUS_SKIPPED, Config, describe, measure_interleaved, probe_cells
from .models import LoopTiming, dtype_label
from .share import COMPILED_TOLERANCE, attention_modules, max_difference, safe_profile_step


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
