"""Run a function on N spawned ranks (gloo on the CPU) and collect what each returns.

    results = run_ranks("tests.parallel._parallel_cases:attention_batch", world=2, payload={...}, timeout=60)

Each rank initialises torch.distributed with a file rendezvous and the given group
timeout, calls ``fn(rank, world, payload)`` and writes its return value (or the exception
it raised, as type name and message) to a file the parent reads back. A rank that has not
finished when ``timeout`` passes is killed and the call fails: no test waits for ever.
"""

from __future__ import annotations

import datetime
import importlib
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

# the repository root: a rank imports its target as tests.parallel.<module>
ROOT = Path(__file__).resolve().parents[2]


def _worker(rank: int, world: int, rdzv: str, out_dir: str, target: str, payload_path: str, group_timeout: float):
    os.environ.setdefault("TRITON_INTERPRET", "1")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    torch.set_num_threads(1)  # ranks share two cores: one thread each
    import torch.distributed as dist

    result: dict
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{rdzv}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=group_timeout),
        )
        module, name = target.split(":")
        fn = getattr(importlib.import_module(module), name)
        payload = torch.load(payload_path, weights_only=False)
        result = {"ok": True, "value": fn(rank, world, payload)}
    except BaseException as exc:  # reported to the parent, which decides
        result = {"ok": False, "type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    try:
        if result["ok"] and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass
    # a rank that raised exits at once, with an error status (its peers see it go)
    os._exit(0 if result["ok"] else 1)


class RanksTimedOut(AssertionError):
    pass


def run_ranks(target: str, world: int, payload, timeout: float = 60.0, group_timeout: float = 20.0) -> list[dict]:
    """Spawn ``world`` ranks running ``target`` ("module:function"); returns, per rank,
    {"ok": True, "value": ...} or {"ok": False, "type", "message", "traceback"}, plus
    "exitcode" and "seconds". Fails (and kills the ranks) past ``timeout`` seconds."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="attnkit-cp-") as tmp:
        payload_path = os.path.join(tmp, "payload.pt")
        torch.save(payload, payload_path)
        rdzv = os.path.join(tmp, "rdzv")
        procs = [
            ctx.Process(target=_worker, args=(r, world, rdzv, tmp, target, payload_path, group_timeout), daemon=True)
            for r in range(world)
        ]
        start = time.monotonic()
        for p in procs:
            p.start()
        ended = [None] * world
        while time.monotonic() - start < timeout and any(p.exitcode is None for p in procs):
            for r, p in enumerate(procs):
                p.join(timeout=0.05)
                if p.exitcode is not None and ended[r] is None:
                    ended[r] = time.monotonic() - start
        for r, p in enumerate(procs):  # ended while the loop waited on another rank
            if p.exitcode is not None and ended[r] is None:
                ended[r] = time.monotonic() - start
        hung = [r for r, p in enumerate(procs) if p.exitcode is None]
        for r in hung:
            procs[r].kill()
            procs[r].join(5)
        if hung:
            raise RanksTimedOut(f"rank(s) {hung} of {world} still running after {timeout:.0f} s: killed")
        results = []
        for r, p in enumerate(procs):
            path = os.path.join(tmp, f"rank{r}.pt")
            res = (
                torch.load(path, weights_only=False)
                if os.path.exists(path)
                else {
                    "ok": False,
                    "type": "NoResult",
                    "message": f"rank {r} exited with {p.exitcode} and wrote nothing",
                    "traceback": "",
                }
            )
            res["exitcode"] = p.exitcode
            res["seconds"] = ended[r]
            results.append(res)
        return results


def values(results: list[dict]) -> list:
    """The ranks' return values; fails with the first rank's traceback if one raised."""
    for r, res in enumerate(results):
        if not res["ok"]:
            raise AssertionError(f"rank {r} raised {res['type']}: {res['message']}\n{res['traceback']}")
    return [res["value"] for res in results]
