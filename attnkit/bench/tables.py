"""The four measurements of `attnkit bench`.

1. it/s per processor (the denoising loop as the pipeline's progress bar counts it);
2. the latency ladder fp32 -> fp16 -> channels_last -> torch.compile -> each processor;
3. the batch-size sweep, speedup over vanilla and xFormers, until out of memory;
4. peak memory per processor.

Each returns a plain dict (JSON-ready); :mod:`attnkit.bench.report` draws them.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from . import published
from .models import SDModel, denoise, dtype_label, make_conditioning, torch_dtype
from .availability import availability, set_processor
from .measure import (
    STATUS_NA,
    STATUS_OK,
    STATUS_OOM,
    STATUS_SKIPPED,
    Cell,
    Config,
    Deadline,
    classify_error,
    free_memory,
    measure_interleaved,
)


@dataclass
class Context:
    """What every table needs: the model, the preset, the processors, the options."""

    model: SDModel
    preset: Any
    processors: list[str]
    device: torch.device
    device_name: str
    compile: bool = False  # tables 2 and 3: compiled rows / runs
    compile_table1: bool = False  # table 1 compiled (the published table is eager)
    progress: bool = True
    seed: int = 0
    budget: float | None = None  # seconds per table
    compile_mode: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return (self.preset.resolution // self.model.vae_scale_factor) ** 2

    def deadline(self) -> Deadline:
        return Deadline(self.budget)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _compiled(unet: torch.nn.Module, mode: str | None) -> Any:
    """torch.compile as a user would call it (dynamic=None: static first, dynamic batch on a
    new batch size). Every configuration compiles its own copy of the UNet, so the cache
    limit is raised: a configuration over the limit would silently run eager."""
    import torch._dynamo

    cfg = torch._dynamo.config
    for limit in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, limit):
            setattr(cfg, limit, max(getattr(cfg, limit), 256))
    return torch.compile(unet, mode=mode, fullgraph=False)


# A compiled UNet's warm-up runs at least this many steps: the first compiled call can
# leave guards that fail on the second (state the traced code fills in on first use, such
# as a backend's per-device cache), and that recompilation belongs in the warm-up.
COMPILED_WARMUP_STEPS = 3


def _forget_compiled(ctx: "Context") -> None:
    """Drop compiled graphs (and the UNet copies they hold) once a table is done."""
    if ctx.compile or ctx.compile_table1:
        try:
            import torch._dynamo

            torch._dynamo.reset()
        except Exception:  # noqa: BLE001
            pass
    free_memory(ctx.device)


def _processor_configs(ctx: Context, unet, dtype, cond, steps, warmup_steps, compile_unets: bool, decode=False, vae=None, label=lambda n: n):
    """One Config per processor: shared UNet with the processor set before each run, or
    (compile) a compiled copy per processor. Also returns the copies to free later."""
    avail = availability(ctx.processors, unet, ctx.device, dtype, cond.batch, ctx.tokens)
    configs, copies = [], []
    for name in ctx.processors:
        proc, status, reason = avail[name]
        if status != STATUS_OK:
            configs.append(Config(label(name), None, status=status, reason=reason))
            continue
        extra = {"processor": name, "processor_repr": repr(proc)}
        if compile_unets:
            holder: dict = {}

            def setup(name=name, proc=proc, holder=holder):
                if "unet" not in holder:  # compile lazily: the warm-up pays for it
                    copy_ = copy.deepcopy(unet)
                    set_processor(copy_, proc)
                    holder["unet"] = _compiled(copy_, ctx.compile_mode)

            def run(warmup, holder=holder):
                n = max(warmup_steps, COMPILED_WARMUP_STEPS) if warmup else steps
                return denoise(ctx.model, cond, n, ctx.preset.resolution,
                               unet=holder["unet"], decode=decode and not warmup, vae=vae, seed=ctx.seed)

            copies.append(holder)
            configs.append(Config(label(name), run, setup=setup, extra=extra))
        else:
            def setup(proc=proc):
                set_processor(unet, proc)

            def run(warmup):
                return denoise(ctx.model, cond, warmup_steps if warmup else steps, ctx.preset.resolution,
                               unet=unet, decode=decode and not warmup, vae=vae, seed=ctx.seed)

            configs.append(Config(label(name), run, setup=setup, extra=extra))
    return configs, copies


# -- table 1 ---------------------------------------------------------------------------
def it_per_s(ctx: Context) -> dict:
    """it/s of the denoising loop per processor, interleaved, with the seed's row."""
    p, model = ctx.preset, ctx.model
    cond = make_conditioning(model, p.batch, model.dtype, ctx.seed)
    configs, copies = _processor_configs(ctx, model.unet, model.dtype, cond, p.steps, p.warmup_steps, ctx.compile_table1)
    cells = measure_interleaved(
        configs, p.repeats, p.skip_steps, desc="table 1: it/s per processor", progress=ctx.progress,
        deadline=ctx.deadline(), device=ctx.device,
    )
    copies.clear()
    _forget_compiled(ctx)
    base = cells.get("vanilla")
    base_median = base.median() if base is not None and base.ok else None
    speedup = {name: _ratio(c.median(), base_median) for name, c in cells.items() if c.ok}
    return {
        "title": "it/s per attention processor",
        "setting": {
            "resolution": p.resolution, "steps": p.steps, "batch": p.batch, "dtype": dtype_label(model.dtype),
            "compile": ctx.compile_table1, "repeats": p.repeats, "warmup_steps": p.warmup_steps,
            "steady_state_skips_first_steps": p.skip_steps,
            "scheduler": type(model.scheduler).__name__, "guidance": "classifier-free (UNet batch = 2 x prompts)",
        },
        "cells": {name: c.to_dict() for name, c in cells.items()},
        "speedup_vs_vanilla": speedup,
        "published": published.published_row(ctx.device_name),
    }


# -- table 2 ---------------------------------------------------------------------------
def ladder(ctx: Context) -> dict:
    """Seconds per image along fp32 -> half -> channels_last -> compile -> processors."""
    p, model = ctx.preset, ctx.model
    half = torch_dtype(p.half_dtype)
    steps = p.ladder_steps or p.steps
    half_name = dtype_label(half)
    rows: list[Config] = []
    keep: list = []

    fp32_unet = model.unet if model.dtype == torch.float32 else model.unet_copy(torch.float32)
    fp32_vae = copy.deepcopy(model.vae).to(torch.float32)
    half_unet = model.unet if model.dtype == half else model.unet_copy(half)
    half_vae = model.vae if model.vae_dtype == half else copy.deepcopy(model.vae).to(half)
    cl_unet = copy.deepcopy(half_unet).to(memory_format=torch.channels_last)
    keep += [fp32_unet, fp32_vae, half_unet, half_vae, cl_unet]
    cond32 = make_conditioning(model, 1, torch.float32, ctx.seed)
    cond_half = make_conditioning(model, 1, half, ctx.seed)

    from .availability import make_processor

    vanilla, why = make_processor("vanilla")

    def row(name, unet, vae, cond, proc, compiled=False):
        holder: dict = {}

        def setup():
            if compiled:
                if "unet" not in holder:
                    copy_ = copy.deepcopy(unet)
                    set_processor(copy_, proc)
                    holder["unet"] = _compiled(copy_, ctx.compile_mode)
            else:
                set_processor(unet, proc)

        def run(warmup):
            n = (max(p.warmup_steps, COMPILED_WARMUP_STEPS) if compiled else p.warmup_steps) if warmup else steps
            return denoise(model, cond, n, p.resolution,
                           unet=holder.get("unet", unet), decode=p.ladder_decode and not warmup, vae=vae, seed=ctx.seed)

        keep.append(holder)
        return Config(name, run, setup=setup)

    rows.append(row("fp32", fp32_unet, fp32_vae, cond32, vanilla))
    rows.append(row(half_name, half_unet, half_vae, cond_half, vanilla))
    rows.append(row(f"{half_name} + channels_last", cl_unet, half_vae, cond_half, vanilla))
    if ctx.compile:
        rows.append(row(f"{half_name} + channels_last + torch.compile", cl_unet, half_vae, cond_half, vanilla, compiled=True))
    else:
        rows.append(Config(f"{half_name} + channels_last + torch.compile", None, status=STATUS_SKIPPED,
                           reason="compile off (--compile)"))
    base_label = f"{half_name} + channels_last" + (" + torch.compile" if ctx.compile else "")
    avail = availability(ctx.processors, cl_unet, ctx.device, half, 1, ctx.tokens)
    for name in ctx.processors:
        if name == "vanilla":
            continue
        proc, status, reason = avail[name]
        label = f"{base_label} + {name}"
        if status != STATUS_OK:
            rows.append(Config(label, None, status=status, reason=reason))
        else:
            rows.append(row(label, cl_unet, half_vae, cond_half, proc, compiled=ctx.compile))
    if vanilla is None:
        for r in rows[:4]:
            r.status, r.reason, r.run = STATUS_NA, why, None

    cells = measure_interleaved(
        rows, p.repeats, 0, desc="table 2: latency ladder", progress=ctx.progress,
        deadline=ctx.deadline(), device=ctx.device, strict=True,
    )
    keep.clear()
    _forget_compiled(ctx)
    first = cells["fp32"].median("seconds") if cells["fp32"].ok else None
    out_rows = []
    for r in rows:
        c = cells[r.name]
        sec = c.median("seconds")
        out_rows.append({**c.to_dict(), "speedup_vs_fp32": _ratio(first, sec)})
    return {
        "title": "latency ladder (seconds per image)",
        "setting": {
            "resolution": p.resolution, "steps": steps, "batch": 1, "half_dtype": half_name,
            "repeats": p.repeats,
            "includes": ("denoising loop + VAE decode to uint8 (no text encoder)" if p.ladder_decode
                         else "denoising loop only (no VAE decode, no text encoder)"),
            "attention_before_processor_rows": "vanilla",
        },
        "rows": out_rows,
        "published": {
            "device": published.LADDER_DEVICE, "source": published.SOURCES[published.LADDER_SOURCE],
            "rows": [{"step": s, "seconds": t, "speedup": x} for s, t, x in published.LADDER_TITAN_RTX],
            "same_device": published.published_ladder(ctx.device_name) is not None,
        },
    }


# -- table 3 ---------------------------------------------------------------------------
def sweep(ctx: Context, dtypes: list[str] | None = None, max_batch: int | None = None) -> dict:
    """Batch 1, 2, 4, ... per processor until out of memory; speedup over vanilla and xformers."""
    p, model = ctx.preset, ctx.model
    dtypes = list(dtypes or p.sweep_dtypes)
    max_batch = max_batch or p.sweep_max_batch
    deadline = ctx.deadline()
    runs = []
    plan = [(d, c) for c in ([False, True] if ctx.compile else [False]) for d in dtypes]  # eager runs first
    for dname, compiled in plan:
        dtype = torch_dtype(dname)
        if ctx.device.type == "cpu" and dtype == torch.float16:
            if not compiled:
                runs.append({"dtype": dtype_label(dtype), "compile": False, "batches": [], "max_batch": {},
                             "oom_at": {}, "stopped": "skipped: fp16 is not fast on CPUs"})
            continue
        if runs and deadline.expired():
            runs.append({"dtype": dtype_label(dtype), "compile": compiled, "batches": [], "max_batch": {},
                         "oom_at": {}, "stopped": "skipped: time budget"})
            continue
        unet = model.unet if dtype == model.dtype else model.unet_copy(dtype)
        run = {"dtype": dtype_label(dtype), "compile": compiled, "batches": [], "max_batch": {}, "oom_at": {},
               "failed": {}, "stopped": ""}
        alive = list(ctx.processors)
        na: dict[str, str] = {}
        holders: dict[str, dict] = {}
        batch = 1
        while batch <= max_batch:
            if batch > 1 and deadline.expired():
                run["stopped"] = f"time budget reached before batch {batch}"
                break
            cond = make_conditioning(model, batch, dtype, ctx.seed)
            sub = Context(**{**ctx.__dict__, "processors": [n for n in alive if n not in na]})
            configs, _ = _processor_configs(sub, unet, dtype, cond, p.sweep_steps, p.sweep_warmup_steps, False)
            if compiled:
                configs = [_compiled_config(c, holders, unet, ctx, cond) for c in configs]
            for c in configs:
                if c.status == STATUS_NA:
                    na[c.name] = c.reason
            cells = measure_interleaved(
                configs, p.sweep_repeats, 0,
                desc=f"table 3: sweep {dtype_label(dtype)}{' compiled' if compiled else ''} batch {batch}",
                progress=ctx.progress, deadline=deadline if batch > 1 else None, device=ctx.device,
            )
            entry = {"batch": batch, "cells": {n: c.to_dict() for n, c in cells.items()}}
            van = cells.get("vanilla")
            xf = cells.get("xformers")
            entry["speedup_vs_vanilla"] = {n: _ratio(c.median(), van.median()) for n, c in cells.items() if c.ok and van is not None and van.ok}
            entry["speedup_vs_xformers"] = {n: _ratio(c.median(), xf.median()) for n, c in cells.items() if c.ok and xf is not None and xf.ok}
            run["batches"].append(entry)
            budget_cut = False
            for n, c in cells.items():
                if c.ok:
                    run["max_batch"][n] = batch
                elif c.status == STATUS_SKIPPED:
                    budget_cut = True
                elif c.status == STATUS_OOM:
                    run["oom_at"][n] = batch
                    alive.remove(n)
                    holders.pop(n, None)
                elif c.status not in (STATUS_NA,):
                    run["failed"][n] = c.text()
                    alive.remove(n)
                    holders.pop(n, None)
            free_memory(ctx.device)
            if budget_cut:
                run["stopped"] = f"time budget reached during batch {batch}"
                break
            if not [n for n in alive if n not in na]:
                run["stopped"] = f"every processor out of memory or failed by batch {batch}"
                break
            batch *= 2
        else:
            run["stopped"] = f"reached the largest batch asked for ({max_batch})"
        run["not_available"] = na
        holders.clear()
        del unet
        _forget_compiled(ctx)
        runs.append(run)
    return {
        "title": "batch-size sweep: speedup over vanilla and xformers",
        "setting": {"resolution": p.resolution, "steps_per_run": p.sweep_steps, "repeats": p.sweep_repeats,
                    "max_batch": max_batch, "dtypes": dtypes, "compile": ctx.compile},
        "runs": runs,
        "published": {"source": published.SOURCES[published.PT2_SOURCE], "claims": published.PT2_CLAIMS,
                      "max_batch": published.PT2_MAX_BATCH},
    }


def _compiled_config(c: Config, holders: dict, unet, ctx: Context, cond) -> Config:
    """Turn a shared-UNet config into one that runs its processor's compiled copy."""
    if c.run is None:
        return c
    name = c.name
    proc = availability([name], unet, ctx.device, cond.prompt_embeds.dtype, cond.batch, ctx.tokens)[name][0]
    holder = holders.setdefault(name, {})

    def setup():
        if "unet" not in holder:
            copy_ = copy.deepcopy(unet)
            set_processor(copy_, proc)
            holder["unet"] = _compiled(copy_, ctx.compile_mode)

    def run(warmup):
        p = ctx.preset
        n = max(p.sweep_warmup_steps, COMPILED_WARMUP_STEPS) if warmup else p.sweep_steps
        return denoise(ctx.model, cond, n, p.resolution, unet=holder["unet"], seed=ctx.seed)

    return Config(name, run, setup=setup, extra=c.extra)


# -- table 4 ---------------------------------------------------------------------------
def memory_cuda(ctx: Context) -> dict:
    """Peak CUDA memory (torch.cuda.max_memory_allocated) of the denoising loop per processor."""
    p, model = ctx.preset, ctx.model
    cond = make_conditioning(model, p.batch, model.dtype, ctx.seed)
    avail = availability(ctx.processors, model.unet, ctx.device, model.dtype, p.batch, ctx.tokens)
    cells = {}
    for name in ctx.processors:
        proc, status, reason = avail[name]
        entry: dict = {"name": name, "status": status, "reason": reason}
        if status == STATUS_OK:
            failure = None
            try:
                set_processor(model.unet, proc)
                free_memory(ctx.device)
                torch.cuda.reset_peak_memory_stats(ctx.device)
                before = torch.cuda.memory_allocated(ctx.device)
                denoise(model, cond, p.memory_steps, p.resolution, seed=ctx.seed)
                torch.cuda.synchronize(ctx.device)
                peak = torch.cuda.max_memory_allocated(ctx.device)
                entry.update(peak_bytes=peak, baseline_bytes=before, activation_bytes=peak - before,
                             peak_reserved_bytes=torch.cuda.max_memory_reserved(ctx.device))
            except Exception as exc:  # noqa: BLE001
                failure = classify_error(exc)
            if failure is not None:
                entry["status"], entry["reason"] = failure
                free_memory(ctx.device)
        cells[name] = entry
    decode = {}
    try:
        free_memory(ctx.device)
        torch.cuda.reset_peak_memory_stats(ctx.device)
        before = torch.cuda.memory_allocated(ctx.device)
        denoise(model, cond, 1, p.resolution, decode=True, seed=ctx.seed)
        decode = {"peak_bytes": torch.cuda.max_memory_allocated(ctx.device), "baseline_bytes": before}
    except Exception as exc:  # noqa: BLE001
        decode = {"status": classify_error(exc)[0], "reason": classify_error(exc)[1]}
    free_memory(ctx.device)
    return {
        "title": "peak memory per processor",
        "method": "torch.cuda.max_memory_allocated over the denoising loop, one process, processors in turn",
        "setting": {"resolution": p.resolution, "steps": p.memory_steps, "batch": p.batch, "dtype": dtype_label(model.dtype)},
        "cells": cells,
        "vae_decode": decode,
    }


def summarise_speedups(cells: dict[str, dict]) -> dict[str, float]:
    base = cells.get("vanilla", {}).get("it_per_s_median")
    return {n: c["it_per_s_median"] / base for n, c in cells.items() if base and c.get("it_per_s_median")}


def median_or_none(values):
    return statistics.median(values) if values else None


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start
