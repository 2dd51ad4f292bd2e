"""bench/overhead.py's part (e), the dispatch route's small and tiny calls, run with very few rounds:
it runs and reports finite ratios (speed targets live in the script, never here)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "overhead.py"


@pytest.fixture(scope="module")
def overhead():
    spec = importlib.util.spec_from_file_location("bench_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_part_e_reports_finite_ratios(overhead):
    out = overhead.part_e(torch.device("cpu"), torch.float32, rounds=2, calls=3)
    assert set(out) == {f"{size}, {mask}" for size in ("small", "tiny") for mask in ("no mask", "key-padding mask")}
    for r in out.values():
        assert r["rounds"] == 2
        for key in ("ratio_median", "ratio_min", "ratio_max", "ratio_of_minimums"):
            assert math.isfinite(r[key]) and r[key] > 0, key
        assert set(r["seconds_per_call"]) == {"attnkit", "native"}
    assert "e" in overhead.TARGETS


def test_the_command_line_runs_part_e(overhead, capsys):
    assert overhead.main(["--parts", "e", "--rounds-e", "2", "--calls-e", "2"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("(e)")]
    assert len(lines) == 4 and all("ratio" in x and "target <= 1.1" in x for x in lines)
