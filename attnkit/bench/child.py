"""Measurements that need a process of their own (CPU memory; a sweep under a memory cap).

The parent sends a JSON spec on stdin; the child answers one line on stdout, starting
with RESULT_MARKER. On the CPU the child caps its own address space (RLIMIT_AS) at its
footprint after imports plus ``mem_cap_bytes``, so an allocation beyond the cap raises
"can't allocate memory" in torch, which ends a sweep cleanly instead of swapping or
waking the kernel's OOM killer.

    python -m attnkit.bench.child < spec.json
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys
from typing import Any

RESULT_MARKER = "ATTNKIT-BENCH-RESULT "


# -- the parent's side -------------------------------------------------------------------
def preset_to_spec(preset) -> dict:
    return dataclasses.asdict(preset)


def preset_from_spec(d: dict):
    from .presets import Preset

    d = dict(d)
    for key in ("sweep_dtypes", "notes"):
        if key in d and d[key] is not None:
            d[key] = tuple(d[key])
    return Preset(**d)


def run_child(spec: dict, timeout: float | None = None) -> dict:
    """Run one task in a fresh interpreter; its result, or why there is none."""
    env = dict(os.environ)
    env.setdefault("PYTHONWARNINGS", "ignore")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "attnkit.bench.child"],
            input=json.dumps(spec), capture_output=True, text=True, timeout=timeout, env=env,
        )
    except subprocess.TimeoutExpired:
        return {"status": "skipped", "reason": f"subprocess ran past {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER):])
    tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
    if proc.returncode in (-9, 137):
        return {"status": "oom", "reason": f"subprocess killed (signal 9, likely the OOM killer): {tail}"[:300]}
    return {"status": "failed", "reason": f"subprocess exited {proc.returncode}: {tail}"[:300]}


# -- the child's side --------------------------------------------------------------------
def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def cap_address_space(extra_bytes: int) -> int | None:
    """Limit this process's address space to its current size + extra_bytes. The limit."""
    vm_kb = _status_kb("VmSize")
    if vm_kb is None:
        return None
    limit = vm_kb * 1024 + int(extra_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limit


def reset_peak_rss() -> bool:
    """Reset VmHWM (peak RSS) so that it covers only what runs next (Linux 4.0+)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _build(spec: dict):
    import torch

    from .models import build_model, load_model

    preset = preset_from_spec(spec["preset"])
    torch.manual_seed(spec.get("seed", 0))
    device = torch.device(spec.get("device", "cpu"))
    if spec.get("model_path"):
        return preset, load_model(spec["model_path"], device, preset.dtype)
    return preset, build_model(preset, device, preset.dtype, seed=spec.get("seed", 0))


def task_memory(spec: dict) -> dict:
    """Peak RSS of the denoising loop with one processor."""
    from .models import denoise, make_conditioning
    from .availability import availability, set_processor
    from .measure import classify_error

    preset, model = _build(spec)
    name = spec["processor"]
    tokens = (preset.resolution // model.vae_scale_factor) ** 2
    proc, status, reason = availability([name], model.unet, model.device, model.dtype, preset.batch, tokens)[name]
    if proc is None:
        return {"name": name, "status": status, "reason": reason}
    set_processor(model.unet, proc)
    cond = make_conditioning(model, preset.batch, model.dtype, spec.get("seed", 0))
    rss_before = (_status_kb("VmRSS") or 0) * 1024
    reset = reset_peak_rss()
    failure = None
    try:
        denoise(model, cond, preset.memory_steps, preset.resolution, seed=spec.get("seed", 0))
    except Exception as exc:  # noqa: BLE001
        failure = classify_error(exc)
    if failure is not None:
        return {"name": name, "status": failure[0], "reason": failure[1]}
    peak = (_status_kb("VmHWM") or 0) * 1024 if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "name": name, "status": "ok", "reason": "",
        "peak_bytes": peak, "baseline_bytes": rss_before, "activation_bytes": max(peak - rss_before, 0),
        "peak_covers": "denoising loop only" if reset else "whole process (VmHWM could not be reset)",
    }


def task_sweep(spec: dict) -> dict:
    import torch

    from .tables import Context, sweep

    import time

    preset, model = _build(spec)
    budget = spec.get("budget")
    if spec.get("deadline_epoch") is not None:
        budget = max(spec["deadline_epoch"] - time.time(), 0.0)
    ctx = Context(
        model=model, preset=preset, processors=spec["processors"], device=model.device,
        device_name=spec.get("device_name", "cpu"), compile=spec.get("compile", False),
        progress=False, seed=spec.get("seed", 0), budget=budget,
    )
    out = sweep(ctx, spec.get("dtypes"), spec.get("max_batch"))
    out["mem_cap_bytes"] = spec.get("mem_cap_bytes")
    del torch
    return out


TASKS = {"memory": task_memory, "sweep": task_sweep}


def main() -> int:
    spec = json.loads(sys.stdin.read())
    import warnings

    warnings.filterwarnings("ignore")
    import torch  # noqa: F401  (imported before the cap: its libraries are not the budget)
    import diffusers  # noqa: F401

    from .cli import quiet_diffusers
    from .measure import classify_error

    quiet_diffusers()
    threads = spec.get("threads")
    if threads:
        torch.set_num_threads(int(threads))
    limit = None
    if spec.get("mem_cap_bytes"):
        limit = cap_address_space(spec["mem_cap_bytes"])
    result: Any
    try:
        result = TASKS[spec["task"]](spec)
    except Exception as exc:  # noqa: BLE001 - the parent shows it in the cell
        status, reason = classify_error(exc)
        result = {"status": status, "reason": reason}
    if isinstance(result, dict):
        result.setdefault("address_space_limit_bytes", limit)
    sys.stdout.write(RESULT_MARKER + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
