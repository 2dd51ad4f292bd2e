"""Measurements that need a process of their own (CPU memory; a sweep under a memory cap).

The parent sends a JSON spec on stdin; the child answers one line on stdout, starting
with RESULT_MARKER. With ``mem_cap_bytes`` the child caps its own address space
(RLIMIT_AS) at its footprint after imports plus that, so an allocation beyond it raises
"can't allocate memory" in torch instead of swapping or waking the OOM killer. The tasks
themselves live with their tables (:data:`TASKS`).

    python -m attnkit.bench.child < spec.json
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from typing import Any

from .env import cap_address_space, quiet_diffusers
from .measure import classify_error
from .models import build_model, load_model
from .presets import preset_from_dict

RESULT_MARKER = "ATTNKIT-BENCH-RESULT "

# task name -> "module:function" (imported in the child only)
TASKS = {"memory": "attnkit.bench.memory:task_memory", "sweep": "attnkit.bench.sweep:task_sweep"}


# -- the parent's side -------------------------------------------------------------------
def run_child(spec: dict, timeout: float | None = None) -> dict:
    """Run one task in a fresh interpreter; its result, or why there is none."""
    env = dict(os.environ)
    env.setdefault("PYTHONWARNINGS", "ignore")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "attnkit.bench.child"],
            input=json.dumps(spec),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"status": "skipped", "reason": f"subprocess ran past {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER) :])
    tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
    if proc.returncode in (-9, 137):
        return {"status": "oom", "reason": f"subprocess killed (signal 9, likely the OOM killer): {tail}"[:300]}
    return {"status": "failed", "reason": f"subprocess exited {proc.returncode}: {tail}"[:300]}


# -- the child's side --------------------------------------------------------------------
def build_model_from_spec(spec: dict):
    """(preset, model) as the parent described them: its preset, seed and --model path."""
    import torch

    preset = preset_from_dict(spec["preset"])
    torch.manual_seed(spec.get("seed", 0))
    device = torch.device(spec.get("device", "cpu"))
    if spec.get("model_path"):
        return preset, load_model(spec["model_path"], device, preset.dtype)
    return preset, build_model(preset, device, preset.dtype, seed=spec.get("seed", 0))


def main() -> int:
    spec = json.loads(sys.stdin.read())
    import warnings

    warnings.filterwarnings("ignore")
    import diffusers  # noqa: F401
    import torch  # imported before the cap: its libraries are not the budget

    quiet_diffusers()
    threads = spec.get("threads")
    if threads:
        torch.set_num_threads(int(threads))
    limit = None
    if spec.get("mem_cap_bytes"):
        limit = cap_address_space(spec["mem_cap_bytes"])
    result: Any
    try:
        module, func = TASKS[spec["task"]].split(":")
        result = getattr(importlib.import_module(module), func)(spec)
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
