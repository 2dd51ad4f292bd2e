"""The tables of `attnkit bench`, where each one runs, and running them in one budget.

====  ===================================  ==================  ====================================
key   measures                             on CUDA             on the CPU
====  ===================================  ==================  ====================================
1     it/s per processor                   this process        this process
2     latency ladder fp32 -> ... -> proc   this process        this process
3     batch sweep until out of memory      this process        a subprocess with a capped address
                                                               space (out of memory is then an
                                                               allocation error, not the OOM killer)
4     peak memory per processor            this process        one subprocess per processor, two at
                                           (max_memory_        a time (peak RSS, VmHWM: a process's
                                           allocated)          peak covers only its own loop)
5     transformer forward per step, per    this process        this process
      way of setting attention
====  ===================================  ==================  ====================================

Tables 1-4 belong to the Stable Diffusion presets, table 5 to the transformer presets.
Each function returns a plain dict (JSON-ready); :mod:`attnkit.bench.report` draws them.
:data:`TABLES` says the same in code: which function runs a table on CUDA and which on
the CPU, and its share of the run's time budget.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from . import published
from .availability import availability, make_processor
from .context import CUDA_GRAPHS_MODE, Context, Lazy, forget_compiled, unet_config
from .dit import transformer_table
from .measure import (
    STATUS_NA,
    STATUS_OK,
    STATUS_SKIPPED,
    Config,
    Deadline,
    OverBudget,
    classify_error,
    measure_interleaved,
    probe_cells,
)
from .memory import memory_cuda, memory_in_subprocesses
from .models import dtype_label, make_conditioning, torch_dtype
from .sweep import sweep, sweep_in_subprocess

# Table 1 measures its first two processors (auto and sdpa by default) even when the
# budget is spent: the headline is never empty.
HEADLINE = 2


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _speedups(cells: dict, base: str) -> dict[str, float | None]:
    ref = cells.get(base)
    ref_median = ref.median() if ref is not None and ref.ok else None
    return {name: _ratio(c.median(), ref_median) for name, c in cells.items() if c.ok} if ref_median else {}


# -- table 1 ---------------------------------------------------------------------------
def it_per_s(ctx: Context) -> dict:
    """it/s of the denoising loop per processor, interleaved, with the published row."""
    p, model = ctx.preset, ctx.model
    cond = make_conditioning(model, p.batch, model.dtype, ctx.seed)
    avail = availability(ctx.processors, model.unet, ctx.device, model.dtype, cond.batch, ctx.tokens)
    configs = []
    for name in ctx.processors:
        proc, status, reason = avail[name]
        if status != STATUS_OK:
            configs.append(Config(name, None, status=status, reason=reason))
        else:
            configs.append(
                unet_config(
                    ctx,
                    name,
                    model.unet,
                    proc,
                    cond,
                    p.steps,
                    p.warmup_steps,
                    compiled=ctx.compile_table1,
                    extra={"processor_repr": repr(proc)},
                )
            )
    cells = measure_interleaved(
        configs,
        p.repeats,
        p.skip_steps,
        desc="table 1: it/s per processor",
        progress=ctx.progress,
        deadline=ctx.deadline(),
        device=ctx.device,
        always=HEADLINE,
        sample_factor=p.steps / p.warmup_steps,
    )
    configs.clear()
    forget_compiled(ctx)
    steps = [c.median("step_seconds") for c in cells.values() if c.ok]
    ctx.step_seconds = statistics.median(steps) if steps else ctx.step_seconds
    return {
        "title": "it/s per attention processor",
        "setting": {
            "resolution": p.resolution,
            "steps": p.steps,
            "batch": p.batch,
            "dtype": dtype_label(model.dtype),
            "compile": ctx.compile_table1,
            "repeats": p.repeats,
            "warmup_steps": p.warmup_steps,
            "steady_state_skips_first_steps": p.skip_steps,
            "budget_seconds": ctx.budget,
            "scheduler": type(model.scheduler).__name__,
            "guidance": "classifier-free (UNet batch = 2 x prompts)",
        },
        "cells": {name: c.to_dict() for name, c in cells.items()},
        "speedup_vs_vanilla": _speedups(cells, "vanilla"),
        "speedup_vs_sdpa": _speedups(cells, "sdpa"),
        "published": published.published_row(ctx.device_name),
    }


# -- table 2 ---------------------------------------------------------------------------
LADDER_KINDS = ("base", "eager", "compile", "cudagraphs")
COMPILE_LABEL = "torch.compile"
CUDA_GRAPHS_LABEL = "CUDA graphs"  # torch.compile(mode="reduce-overhead")


def ladder_kinds(spec: str | None) -> tuple[str, ...]:
    """`None`/"all" -> every kind of ladder row; else a comma-separated list, checked, in its order."""
    if spec is None or spec.strip() in ("", "all"):
        return LADDER_KINDS
    kinds = [k.strip() for k in spec.split(",") if k.strip()]
    bad = [k for k in kinds if k not in LADDER_KINDS]
    if bad or not kinds:
        raise ValueError(f"--ladder-rows takes {', '.join(LADDER_KINDS)} (comma-separated) or all, got {spec!r}")
    return tuple(dict.fromkeys(kinds))


def ladder(ctx: Context) -> dict:
    """Seconds per image (and it/s) along fp32 -> half -> channels_last -> compile, then each
    processor eager, under torch.compile and under CUDA graphs; how much of a step is
    attention in each row, and each compiled row's output against eager."""
    p, model = ctx.preset, ctx.model
    half = torch_dtype(p.half_dtype)
    steps = p.ladder_steps or p.steps
    half_name = dtype_label(half)
    kinds = ctx.ladder_rows

    # Copies are made when a row first runs: rows the budget does not admit cost nothing.
    fp32_unet = model.unet if model.dtype == torch.float32 else Lazy(lambda: model.unet_copy(torch.float32))
    fp32_vae = Lazy(lambda: copy.deepcopy(model.vae).to(torch.float32))
    half_unet = model.unet if model.dtype == half else Lazy(lambda: model.unet_copy(half))
    half_vae = model.vae if model.vae_dtype == half else Lazy(lambda: copy.deepcopy(model.vae).to(half))
    cl_unet = Lazy(lambda: model.unet_copy(half, channels_last=True))
    cond32 = make_conditioning(model, 1, torch.float32, ctx.seed)
    cond_half = make_conditioning(model, 1, half, ctx.seed)
    vanilla, why = make_processor("vanilla")
    cl = f"{half_name} + channels_last"
    no_compile = "compile off (--compile)"
    no_graphs = (
        f"CUDA graphs need CUDA (torch.compile mode='{CUDA_GRAPHS_MODE}' captures them); "
        f"this run is on {ctx.device.type}"
    )

    def row(label, unet, vae, cond, proc, mode="eager", published_step=None, name="vanilla") -> Config:
        extra = {"kind": mode, "processor": name, "published_step": published_step}
        if proc is None:
            return Config(label, None, status=STATUS_NA, reason=why, extra=extra)
        if mode == "cudagraphs" and ctx.device.type != "cuda":
            return Config(label, None, status=STATUS_NA, reason=no_graphs, extra=extra)
        if mode != "eager" and not ctx.compile:
            return Config(label, None, status=STATUS_SKIPPED, reason=no_compile, extra=extra)
        compiled = mode != "eager"
        config = unet_config(
            ctx,
            label,
            unet,
            proc,
            cond,
            steps,
            p.warmup_steps,
            compiled=compiled,
            mode=CUDA_GRAPHS_MODE if mode == "cudagraphs" else None,
            decode=p.ladder_decode,
            vae=vae,
            extra=extra,
        )
        config.group = mode
        return config

    rows = []
    if "base" in kinds:
        rows += [
            row("fp32", fp32_unet, fp32_vae, cond32, vanilla, published_step=0),
            row(half_name, half_unet, half_vae, cond_half, vanilla, published_step=1),
            row(cl, cl_unet, half_vae, cond_half, vanilla, published_step=2),
            row(f"{cl} + {COMPILE_LABEL}", cl_unet, half_vae, cond_half, vanilla, "compile", published_step=3),
        ]
    avail = availability(ctx.processors, model.unet, ctx.device, half, 1, ctx.tokens)  # reads the structure only
    labels = {"eager": cl, "compile": f"{cl} + {COMPILE_LABEL}", "cudagraphs": f"{cl} + {CUDA_GRAPHS_LABEL}"}
    for kind in (k for k in kinds if k != "base"):
        for name in ctx.processors:
            if name == "vanilla" and kind != "cudagraphs" and "base" in kinds:
                continue  # the base rows are vanilla's eager and compiled rows
            proc, status, reason = avail[name]
            label = f"{labels[kind]} + {name}"
            # the docs' ladder ends with xformers on the traced UNet
            step = 4 if name == "xformers" and kind == "compile" else None
            if status != STATUS_OK:
                rows.append(
                    Config(
                        label,
                        None,
                        status=status,
                        reason=reason,
                        extra={"kind": kind, "processor": name, "published_step": step},
                    )
                )
            else:
                rows.append(row(label, cl_unet, half_vae, cond_half, proc, kind, step, name))

    deadline = ctx.deadline()
    cells = measure_interleaved(
        rows,
        p.repeats,
        0,
        desc="table 2: latency ladder",
        progress=ctx.progress,
        deadline=deadline,
        device=ctx.device,
        strict=True,
        sample_factor=steps / p.warmup_steps,
        first_warmup=None if ctx.step_seconds is None else ctx.step_seconds * p.warmup_steps,
    )
    probe_cells(rows, cells, deadline)
    rows.clear()
    forget_compiled(ctx)
    fp32 = cells.get("fp32")
    first = fp32.median("seconds") if fp32 is not None and fp32.ok else None
    out_rows = [{**c.to_dict(), "speedup_vs_fp32": _ratio(first, c.median("seconds"))} for c in cells.values()]
    return {
        "title": "latency ladder (seconds per image)",
        "setting": {
            "resolution": p.resolution,
            "steps": steps,
            "batch": 1,
            "half_dtype": half_name,
            "repeats": p.repeats,
            "budget_seconds": ctx.budget,
            "rows": list(kinds),
            "includes": (
                "denoising loop + VAE decode to uint8 (no text encoder)"
                if p.ladder_decode
                else "denoising loop only (no VAE decode, no text encoder)"
            ),
            "attention_before_processor_rows": "vanilla",
            "compile": {
                "modes": {"compile": "default", "cudagraphs": CUDA_GRAPHS_MODE},
                "backend": ctx.compile_backend,
                "fullgraph": "tried first; without it where it fails",
            },
        },
        "rows": out_rows,
        "interrupted": cells.interrupted,
        "published": {
            "device": published.LADDER_DEVICE,
            "source": published.SOURCES[published.LADDER_SOURCE],
            "rows": [{"step": s, "seconds": t, "speedup": x} for s, t, x in published.LADDER_TITAN_RTX],
            "same_device": published.published_ladder(ctx.device_name) is not None,
        },
    }


# -- where each table runs ---------------------------------------------------------------
@dataclass(frozen=True)
class Table:
    """A table: the function that runs it on CUDA, the one on the CPU, its budget share."""

    title: str
    on_cuda: Callable[[Context], dict]
    on_cpu: Callable[[Context], dict]
    weight: float  # share of the run's time budget, against the other tables of the run


def _sweep_here(ctx: Context) -> dict:
    return sweep(ctx)


def _sweep_in_subprocess(ctx: Context) -> dict:
    return sweep_in_subprocess(ctx)


def _memory_cuda(ctx: Context) -> dict:
    return memory_cuda(ctx)


def _memory_in_subprocesses(ctx: Context) -> dict:
    return memory_in_subprocesses(ctx)


def _transformer(ctx: Context) -> dict:
    return transformer_table(ctx)


TABLES: dict[str, Table] = {
    "1": Table("it/s per attention processor", it_per_s, it_per_s, 0.4),
    "2": Table("latency ladder", ladder, ladder, 0.2),
    "3": Table("batch-size sweep", _sweep_here, _sweep_in_subprocess, 0.2),
    "4": Table("peak memory per processor", _memory_cuda, _memory_in_subprocesses, 0.2),
    "5": Table("transformer forward per step", _transformer, _transformer, 1.0),
}
SD_TABLES = ("1", "2", "3", "4")
TRANSFORMER_TABLES = ("5",)


def run_tables(ctx: Context, keys: list[str], deadline: Deadline, log: Callable[[str], None]) -> tuple[dict, dict]:
    """Run the tables in order, each with its share of what is left of the budget.

    Returns ({key: table dict}, {key: seconds}). A table whose turn comes after the budget
    is spent is recorded as skipped (the first table always runs: its headline pair is
    measured whatever the budget). A table that raises is recorded with its error and the
    others go on; an interrupt (a time limit's SIGINT) keeps what is done.
    """
    tables: dict = {}
    seconds: dict = {}
    for i, key in enumerate(keys):
        table = TABLES[key]
        left = deadline.left()
        if i > 0 and left is not None and left <= 0:
            tables[key] = {"title": table.title, "skipped": "time budget: nothing was left of it at this table's turn"}
            log(f"table {key} skipped: time budget spent")
            continue
        share = table.weight / sum(TABLES[k].weight for k in keys[i:])
        ctx.budget = None if left is None else max(left, 0.0) * share
        start = time.perf_counter()
        try:
            tables[key] = (table.on_cuda if ctx.device.type == "cuda" else table.on_cpu)(ctx)
        except OverBudget as exc:
            tables[key] = {"title": table.title, "skipped": str(exc)}
        except KeyboardInterrupt:
            tables[key] = {"title": table.title, "error": "interrupted"}
            seconds[key] = time.perf_counter() - start
            break
        except Exception as exc:  # noqa: BLE001 - one table's failure must not lose the others
            status, reason = classify_error(exc)
            tables[key] = {"title": table.title, "error": f"{status}: {reason}"}
        seconds[key] = time.perf_counter() - start
        log(f"table {key} done in {seconds[key]:.0f} s")
        if tables[key].get("interrupted"):  # a time limit's SIGINT: keep what is done, start nothing more
            break
    return tables, seconds
