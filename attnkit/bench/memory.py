"""Table 4: peak memory of the denoising loop per processor.

On CUDA, ``torch.cuda.max_memory_allocated`` in this process, processors in turn. On the
CPU a process's peak resident memory (VmHWM) is the only honest figure, and it never goes
down: each processor runs in its own subprocess (:func:`memory_in_subprocesses`, two at a
time, one thread each: peak memory does not depend on speed), whose peak is reset
right before its loop.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from .availability import availability, set_processor
from .child import build_model_from_spec, run_child
from .context import Context
from .env import free_memory, peak_rss_bytes, reset_peak_rss, status_kb
from .measure import MARGIN, STATUS_OK, STATUS_SKIPPED, classify_error
from .models import denoise, dtype_label, make_conditioning
from .progress import progress_bar


def _setting(ctx: Context) -> dict:
    p = ctx.preset
    return {
        "resolution": p.resolution,
        "steps": p.memory_steps,
        "batch": p.batch,
        "dtype": dtype_label(ctx.model.dtype),
        "budget_seconds": ctx.budget,
    }


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
                entry.update(
                    peak_bytes=peak,
                    baseline_bytes=before,
                    activation_bytes=peak - before,
                    peak_reserved_bytes=torch.cuda.max_memory_reserved(ctx.device),
                )
            except Exception as exc:  # noqa: BLE001
                failure = classify_error(exc)
            if failure is not None:
                entry["status"], entry["reason"] = failure
                free_memory(ctx.device)
        cells[name] = entry
    decode: dict = {}
    failure = None
    try:
        free_memory(ctx.device)
        torch.cuda.reset_peak_memory_stats(ctx.device)
        before = torch.cuda.memory_allocated(ctx.device)
        denoise(model, cond, 1, p.resolution, decode=True, seed=ctx.seed)
        decode = {"peak_bytes": torch.cuda.max_memory_allocated(ctx.device), "baseline_bytes": before}
    except Exception as exc:  # noqa: BLE001
        failure = classify_error(exc)
    if failure is not None:
        decode = {"status": failure[0], "reason": failure[1]}
    free_memory(ctx.device)
    return {
        "title": "peak memory per processor",
        "method": "torch.cuda.max_memory_allocated over the denoising loop, one process, processors in turn",
        "setting": _setting(ctx),
        "cells": cells,
        "vae_decode": decode,
    }


def memory_in_subprocesses(ctx: Context) -> dict:
    """Peak RSS of the loop per processor, each in its own process, two at a time."""
    if ctx.build_seconds is not None and ctx.step_seconds is not None:
        # each process imports and builds the model again; one thread runs about half as fast
        ctx.check_fits(
            "the first pair of memory processes", 2 * ctx.build_seconds + 2 * ctx.preset.memory_steps * ctx.step_seconds
        )
    model = ctx.model
    avail = availability(ctx.processors, model.unet, ctx.device, model.dtype, ctx.preset.batch, ctx.tokens)
    deadline = ctx.deadline()
    cells: dict = {}
    todo = []
    for name in ctx.processors:
        proc, status, reason = avail[name]
        if proc is None:
            cells[name] = {"name": name, "status": status, "reason": reason}
        else:
            todo.append(name)
    base = {
        "task": "memory",
        "preset": dataclasses.asdict(ctx.preset),
        "seed": ctx.seed,
        "model_path": ctx.model_path,
        "threads": 1,
    }

    took: list[float] = []  # seconds of each finished process

    def measure(name: str) -> dict:
        # the first pair always runs; a later process only if one like it is predicted to fit
        left = deadline.left()
        if todo.index(name) >= 2 and left is not None and left <= MARGIN * max(took, default=0.0):
            return {"name": name, "status": STATUS_SKIPPED, "reason": "time budget"}
        start = time.perf_counter()
        out = run_child({**base, "processor": name}, timeout=None if ctx.budget is None else ctx.budget + 600)
        took.append(time.perf_counter() - start)
        return out

    with progress_bar(len(todo), "table 4: memory (one process each)", ctx.progress) as bar:
        with ThreadPoolExecutor(max_workers=2) as pool:
            for name, result in zip(todo, pool.map(measure, todo)):
                cells[name] = result
                bar.update(1)
    return {
        "title": "peak memory per processor",
        "method": "peak resident memory (VmHWM) of the denoising loop, each processor in its own process",
        "setting": _setting(ctx),
        "cells": {name: cells[name] for name in ctx.processors},
    }


def task_memory(spec: dict) -> dict:
    """The child's side of :func:`memory_in_subprocesses`: one processor's peak RSS."""

    preset, model = build_model_from_spec(spec)
    name = spec["processor"]
    tokens = (preset.resolution // model.vae_scale_factor) ** 2
    proc, status, reason = availability([name], model.unet, model.device, model.dtype, preset.batch, tokens)[name]
    if proc is None:
        return {"name": name, "status": status, "reason": reason}
    set_processor(model.unet, proc)
    cond = make_conditioning(model, preset.batch, model.dtype, spec.get("seed", 0))
    rss_before = (status_kb("VmRSS") or 0) * 1024
    reset = reset_peak_rss()
    failure = None
    try:
        denoise(model, cond, preset.memory_steps, preset.resolution, seed=spec.get("seed", 0))
    except Exception as exc:  # noqa: BLE001
        failure = classify_error(exc)
    if failure is not None:
        return {"name": name, "status": failure[0], "reason": failure[1]}
    peak = peak_rss_bytes(reset)
    return {
        "name": name,
        "status": STATUS_OK,
        "reason": "",
        "peak_bytes": peak,
        "baseline_bytes": rss_before,
        "activation_bytes": max(peak - rss_before, 0),
        "peak_covers": "denoising loop only" if reset else "whole process (VmHWM could not be reset)",
    }
