"""Table 3: the batch-size sweep of the PyTorch 2.0 post, until out of memory.

Batch 1, 2, 4, ... per processor and precision (eager runs first, then compiled), the
images/s and the speedup over vanilla and xformers at each batch, and the largest batch
each processor fits. On CUDA it runs in this process; on the CPU in a subprocess whose
address space is capped (:func:`sweep_in_subprocess`), so that running out of memory is
an allocation error that ends one processor's sweep, not the kernel's OOM killer.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from . import published
from .availability import availability
from .child import build_model_from_spec, run_child
from .context import Context, forget_compiled, unet_config
from .env import free_memory
from .measure import STATUS_NA, STATUS_OK, STATUS_OOM, STATUS_SKIPPED, Config, cell_text, measure_interleaved
from .models import dtype_label, make_conditioning, torch_dtype


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _empty_run(dtype: torch.dtype, compiled: bool, stopped: str) -> dict:
    return {
        "dtype": dtype_label(dtype),
        "compile": compiled,
        "batches": [],
        "max_batch": {},
        "oom_at": {},
        "failed": {},
        "stopped": stopped,
    }


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
                runs.append(_empty_run(dtype, False, "skipped: fp16 is not fast on CPUs"))
            continue
        if runs and deadline.expired():
            runs.append(_empty_run(dtype, compiled, "skipped: time budget"))
            continue
        unet = model.unet if dtype == model.dtype else model.unet_copy(dtype)
        run = _empty_run(dtype, compiled, "")
        alive = list(ctx.processors)
        na: dict[str, str] = {}
        holders: dict[str, dict] = {}  # compiled copies, reused from one batch to the next
        batch = 1
        while batch <= max_batch:
            if batch > 1 and deadline.expired():
                run["stopped"] = f"time budget reached before batch {batch}"
                break
            cond = make_conditioning(model, batch, dtype, ctx.seed)
            names = [n for n in alive if n not in na]
            avail = availability(names, unet, ctx.device, dtype, batch, ctx.tokens)
            configs = []
            for name in names:
                proc, status, reason = avail[name]
                if status != STATUS_OK:
                    na[name] = reason
                    configs.append(Config(name, None, status=status, reason=reason))
                else:
                    configs.append(
                        unet_config(
                            ctx,
                            name,
                            unet,
                            proc,
                            cond,
                            p.sweep_steps,
                            p.sweep_warmup_steps,
                            compiled=compiled,
                            holder=holders.setdefault(name, {}),
                        )
                    )
            cells = measure_interleaved(
                configs,
                p.sweep_repeats,
                0,
                desc=f"table 3: sweep {dtype_label(dtype)}{' compiled' if compiled else ''} batch {batch}",
                progress=ctx.progress,
                deadline=deadline,
                device=ctx.device,
                always=2 if batch == 1 else 0,
                sample_factor=p.sweep_steps / p.sweep_warmup_steps,
            )
            configs.clear()
            entry = {"batch": batch, "cells": {n: c.to_dict() for n, c in cells.items()}}
            van, xf = cells.get("vanilla"), cells.get("xformers")
            entry["speedup_vs_vanilla"] = {
                n: _ratio(c.median(), van.median()) for n, c in cells.items() if c.ok and van is not None and van.ok
            }
            entry["speedup_vs_xformers"] = {
                n: _ratio(c.median(), xf.median()) for n, c in cells.items() if c.ok and xf is not None and xf.ok
            }
            run["batches"].append(entry)
            budget_cut = False
            for n, c in cells.items():
                if c.ok:
                    run["max_batch"][n] = batch
                elif c.status == STATUS_SKIPPED:
                    budget_cut = True
                elif c.status != STATUS_NA:
                    run["oom_at" if c.status == STATUS_OOM else "failed"][n] = (
                        batch if c.status == STATUS_OOM else cell_text(c.status, c.reason, 60)
                    )
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
        forget_compiled(ctx)
        runs.append(run)
    return {
        "title": "batch-size sweep: speedup over vanilla and xformers",
        "setting": {
            "resolution": p.resolution,
            "steps_per_run": p.sweep_steps,
            "repeats": p.sweep_repeats,
            "max_batch": max_batch,
            "dtypes": dtypes,
            "compile": ctx.compile,
            "budget_seconds": ctx.budget,
        },
        "runs": runs,
        "published": {
            "source": published.SOURCES[published.PT2_SOURCE],
            "claims": published.PT2_CLAIMS,
            "max_batch": published.PT2_MAX_BATCH,
        },
    }


# -- the CPU: in a subprocess under a memory cap ---------------------------------------------
def sweep_in_subprocess(ctx: Context) -> dict:
    """:func:`sweep` in a fresh interpreter whose address space is capped at
    ``ctx.mem_cap_bytes`` over its footprint after imports."""
    if ctx.build_seconds is not None and ctx.step_seconds is not None:
        # the child imports and builds the model again, then runs batch 1's first pair at least
        p = ctx.preset
        ctx.check_fits(
            "the sweep's subprocess",
            2 * ctx.build_seconds + 2 * (p.sweep_warmup_steps + p.sweep_steps) * ctx.step_seconds,
        )
    deadline = None if ctx.budget is None else time.time() + ctx.budget
    out = run_child(
        {
            "task": "sweep",
            "preset": dataclasses.asdict(ctx.preset),
            "seed": ctx.seed,
            "model_path": ctx.model_path,
            "threads": torch.get_num_threads(),
            "processors": ctx.processors,
            "compile": ctx.compile,
            "mem_cap_bytes": ctx.mem_cap_bytes,
            "device_name": ctx.device_name,
            "deadline_epoch": deadline,
        },
        timeout=None if ctx.budget is None else ctx.budget + 600,
    )
    if "runs" not in out:
        raise RuntimeError(f"sweep subprocess: {out.get('status')}: {out.get('reason')}")
    return out


def task_sweep(spec: dict) -> dict:
    """The child's side of :func:`sweep_in_subprocess`."""

    preset, model = build_model_from_spec(spec)
    budget = spec.get("budget")
    if spec.get("deadline_epoch") is not None:
        budget = max(spec["deadline_epoch"] - time.time(), 0.0)
    ctx = Context(
        model=model,
        preset=preset,
        processors=spec["processors"],
        device=model.device,
        device_name=spec.get("device_name", "cpu"),
        compile=spec.get("compile", False),
        progress=False,
        seed=spec.get("seed", 0),
        budget=budget,
    )
    out = sweep(ctx, spec.get("dtypes"), spec.get("max_batch"))
    out["mem_cap_bytes"] = spec.get("mem_cap_bytes")
    return out
