"""bench/launch_cost.py, the launcher's own host time per call, run with very few
rounds as a smoke test: it runs (in a process of its own, under Triton's interpreter,
the launches replaced by a recorder), every call after a signature's first reaches
the recorder with a full argument list, and it reports finite times. Speed targets
live in the script, never here."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "launch_cost.py"

pytest.importorskip("triton", reason="the launcher is attnkit's Triton kernel's (the triton extra)")


@pytest.fixture(scope="module")
def launch_cost():
    spec = importlib.util.spec_from_file_location("bench_launch_cost", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_launcher_cost_runs_and_reaches_the_recorder(launch_cost):
    rounds, calls = 2, 5
    out = launch_cost.run_in_child("cpu", rounds=rounds, calls=calls)
    assert set(out["us_per_call"]) == {"forward", "forward, key-padding mask", "forward+backward"}
    for name, us in out["us_per_call"].items():
        assert math.isfinite(us) and us > 0, name
    # Each timed call launches directly (the warm-up's first calls go through the
    # recorder's stand-in for Triton): a forward 1 or 2 launches (the key lengths), a
    # backward 3 or 4 more.
    timed = rounds * calls + 3
    assert out["recorded_launches"] >= timed * (1 + 2 + 4) - 7
    assert out["targets_us"] == {"forward": 10.0}
    # What each launch packs: fewer than it declares (constexprs and the arguments it
    # passes as None are not packed); the plain forward packs only Q, K, V, the output,
    # the LSE and the descriptors of K and V (TMA on the interpreter's sm_90).
    packed = out["packed_arguments"]
    assert packed[0]["kernel"] == "_attn_fwd" and packed[0]["tensors"] == 5 + 4
    assert {a["kernel"] for a in packed} >= {"_attn_fwd", "_attn_bwd_dkdv", "_attn_bwd_dq", "_attn_bwd_delta"}
    for a in packed:
        assert 0 < a["tensors"] <= a["packed"] < a["declared"], a
    assert "forward" in launch_cost.format_result(out)


def test_overhead_runs_it_as_part_l(capsys):
    spec = importlib.util.spec_from_file_location("bench_overhead_l", SCRIPT.parent / "overhead.py")
    overhead = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(overhead)
    assert overhead.main(["--parts", "l", "--rounds-l", "2", "--calls-l", "3"]) == 0
    out = capsys.readouterr().out
    assert "(l) launcher host time per call" in out and "forward+backward" in out
