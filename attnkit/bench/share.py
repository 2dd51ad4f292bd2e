"""How much of a step is attention: one step run again under torch.profiler, after timing.

Two measures, each a fraction of the same profiled step:

- **processor calls**: every attention module's forward (the processor: projections,
  norms, the attention itself, the output projection) inside a ``record_function`` range
  opened and closed by module hooks; on the CPU the ranges' CPU time, on CUDA the device
  time of the kernels launched inside them. ``torch.compile`` drops such ranges from what
  it traces (dynamo ignores ``record_function``), so compiled rows have no such figure
  and say so.
- **attention kernels**: the time of the operations named as attention, whoever called
  them: on the CPU the outermost operators whose names say attention
  (``aten::scaled_dot_product_attention``, ``attnkit::flash_attention_forward``...), their
  CPU time; on CUDA the kernels whose names say so (``flash_fwd``, ``fmha_cutlass``,
  cuDNN's ``sdpa``, attnkit's ``_attn_fwd``...), their device time. This works through
  ``torch.compile`` and CUDA graphs too. Where no operator or kernel is named as attention
  (the vanilla processor's bmm + softmax + bmm, or a compiler that fused them into
  kernels of its own) it says so rather than guessing.

The step's time: on the CPU its wall time (perf_counter around the profiled call, so it
carries the profiler's own overhead as the ranges do); on CUDA the device time of all
its kernels (the GPU's busy time in that step; the step's wall time, longer where the
GPU waits for the host, is recorded beside it). The profiled step is never one of the
timed samples.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable

import torch
from torch import nn

from .measure import describe

RANGE = "attnkit.bench::attention"
# Names that say attention: operators on the CPU, kernels on CUDA.
ATTENTION_NAME = re.compile(r"attn|attention|sdpa|fmha|flash", re.IGNORECASE)


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """diffusers' attention modules (the legacy ``Attention`` and ``AttentionModuleMixin``)."""
    from diffusers.models.attention_processor import Attention

    kinds: tuple = (Attention,)
    try:
        from diffusers.models.attention import AttentionModuleMixin

        kinds += (AttentionModuleMixin,)
    except ImportError:
        pass
    return [m for m in model.modules() if isinstance(m, kinds)]


def _hook_ranges(modules: list[nn.Module]) -> Callable[[], None]:
    """A record_function range around each module's forward; returns the remover."""
    open_ranges: list[Any] = []

    def enter(_module, _args):
        rf = torch.autograd.profiler.record_function(RANGE)
        rf.__enter__()
        open_ranges.append(rf)

    def leave(_module, _args, _out):
        if open_ranges:
            open_ranges.pop().__exit__(None, None, None)

    handles = [h for m in modules for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]

    def remove() -> None:
        for h in handles:
            h.remove()
        while open_ranges:  # a forward that raised
            open_ranges.pop().__exit__(None, None, None)

    return remove


def _outermost(events: list, keep: Callable[[Any], bool]) -> list:
    """The events `keep` accepts that have no accepted ancestor (nested ones counted once)."""
    out = []
    for e in events:
        if not keep(e):
            continue
        parent, nested = e.cpu_parent, False
        while parent is not None:
            if keep(parent):
                nested = True
                break
            parent = parent.cpu_parent
        if not nested:
            out.append(e)
    return out


def _is_cpu_op(e) -> bool:
    return e.device_type == torch.autograd.DeviceType.CPU and not getattr(e, "is_async", False)


def _is_kernel(e) -> bool:
    return e.device_type != torch.autograd.DeviceType.CPU and not getattr(e, "is_user_annotation", False)


def profile_step(step: Callable[[], Any], modules: list[nn.Module], device: torch.device, ranges: bool) -> dict:
    """Run `step` once under torch.profiler and attribute its time to attention.

    Returns {"step_seconds", "device_busy_seconds" (CUDA), "processor_calls": {...},
    "attention_kernels": {...}}; each measure is {"seconds", "share"} or {"reason"} (why
    it could not be attributed). ``ranges``: hook the attention modules (eager models only).
    """
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    remove = _hook_ranges(modules) if ranges else (lambda: None)
    try:
        if cuda:
            torch.cuda.synchronize(device)
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize(device)
            wall = time.perf_counter() - start
    finally:
        remove()
    events = list(prof.events())
    out: dict = {"step_seconds": wall, "method": "torch.profiler, one step after the timed runs"}
    if cuda:
        kernels = [e for e in events if _is_kernel(e)]
        busy = sum(e.device_time_total for e in kernels) / 1e6
        out["device_busy_seconds"] = busy
        total, what = busy, "the step's kernels (GPU busy time)"
    else:
        total, what = wall, "the step's wall time"
    out["share_of"] = what

    def measure(seconds: float, found: int, none_found: str) -> dict:
        if not found:
            return {"reason": none_found}
        if total <= 0:
            return {"reason": "the profiler recorded no time for the step"}
        return {"seconds": seconds, "share": min(seconds / total, 1.0), "count": found}

    if ranges:
        spans = _outermost([e for e in events if _is_cpu_op(e)], lambda e: e.name == RANGE)
        secs = sum((e.device_time_total if cuda else e.cpu_time_total) for e in spans) / 1e6
        out["processor_calls"] = measure(secs, len(spans), "no attention module ran in the profiled step")
    else:
        out["processor_calls"] = {"reason": "not attributable: compiled (torch.compile drops record_function ranges)"}
    if cuda:
        named = [e for e in events if _is_kernel(e) and ATTENTION_NAME.search(e.name)]
        secs = sum(e.device_time_total for e in named) / 1e6
    else:
        named = _outermost(
            [e for e in events if _is_cpu_op(e)], lambda e: e.name != RANGE and bool(ATTENTION_NAME.search(e.name))
        )
        secs = sum(e.cpu_time_total for e in named) / 1e6
    out["attention_kernels"] = measure(
        secs, len(named), f"not attributable: no {'kernel' if cuda else 'operator'} named as attention"
    )
    return out


def safe_profile_step(step: Callable[[], Any], modules: list[nn.Module], device: torch.device, ranges: bool) -> dict:
    """:func:`profile_step`, or {"error": why} when profiling itself fails."""
    try:
        return profile_step(step, modules, device, ranges)
    except Exception as exc:  # noqa: BLE001 - a profiler failure is reported, never fatal
        return {"error": describe(exc, 160)}


def share_text(share: dict | None, key: str) -> str:
    """'37%' or 'not attributable: ...' / 'not profiled: ...' for a table cell."""
    if not share:
        return "–"
    if "error" in share:
        return f"profiler failed: {share['error']}"
    if "skipped" in share:
        return f"not profiled ({share['skipped']})"
    m = share.get(key) or {}
    if "share" in m:
        return f"{m['share']:.1%}" if m["share"] < 0.1 else f"{m['share']:.0%}"
    return m.get("reason", "–")


@torch.no_grad()
def max_difference(a: torch.Tensor, b: torch.Tensor) -> dict:
    """How far the compiled output `a` is from the eager `b`: max |a - b|, relative to max |b|."""
    a, b = a.detach().float(), b.detach().float()
    diff = (a - b).abs().max().item()
    scale = b.abs().max().item()
    return {
        "max_abs": diff,
        "ref_max_abs": scale,
        "relative": diff / scale if scale else diff,
        "finite": bool(torch.isfinite(a).all().item()),
    }


# The compiled output's largest difference from eager, relative to the output's largest
# value, that still counts as the same result: fusion reorders sums (fp32 ~1e-6; 16-bit
# rounds every intermediate differently, through a dozen layers).
COMPILED_TOLERANCE = {torch.float32: 1e-3, torch.float16: 3e-2, torch.bfloat16: 1e-1}


def check_text(check: dict | None) -> str:
    """What a table says about a compiled row's output against eager."""
    if not check:
        return "–"
    if "error" in check:
        return f"check failed: {check['error']}"
    rel = check.get("relative")
    if check.get("lossy"):
        return f"lossy: max rel. diff {rel:.1e} against {check.get('against', 'exact attention')}" + (
            "" if check.get("finite", True) else ", NOT FINITE"
        )
    return f"{'matches' if check.get('matches') else 'DIFFERS'} (max rel. diff {rel:.1e})"
