"""bench/gpu_suite.sh, what can be checked without a GPU: the --quick plan (each step, its
hard cap, their sum within 8 minutes), and one step's result reaching the record's
results.json and table.md as a section (the 16-bit kernel check at CPU size)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "bench" / "gpu_suite.sh"
pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and coreutils' timeout"
)


def _plan(*args: str, **env: str) -> tuple[list[tuple[str, int]], int, str]:
    run = subprocess.run(
        ["bash", str(SUITE), *args, "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], "PYTHON": "false", **env},
    )
    assert run.returncode == 0, run.stderr
    steps = [(m[1], int(m[2])) for m in re.finditer(r"^  (\S+)\s+(\d+)\s+hard cap$", run.stdout, re.M)]
    total = re.search(r"^  sum\s+(\d+)", run.stdout, re.M)
    return steps, int(total[1]), run.stdout


def test_the_quick_plan_measures_what_the_issue_asks_within_8_minutes():
    steps, total, out = _plan("--quick")
    names = [n for n, _ in steps]
    # the ladder's compiled and CUDA-graph rows (sdpa; attnkit's auto and triton), Flux's
    # compiled table 5, the 16-bit kernel check, the kernel's default tiles beside the
    # autotuner's choice (what per-GPU default tiles are made from), host time per call, the
    # microbenchmarks; the BlockMask kernel against FlexAttention (bench/block_sparse.py)
    assert names == [
        "table1",
        "sparse",
        "table2-sdpa",
        "table2-attnkit",
        "table5-flux",
        "kernels16",
        "tile-timing",
        "overhead",
        "launch",
        "kernels",
    ]
    assert all(cap >= 30 for _, cap in steps)
    assert total == sum(cap for _, cap in steps) <= 480, out
    # a subset is planned as asked
    steps, total, _ = _plan("--quick", ATTNKIT_SUITE_STEPS="table2-sdpa,overhead")
    assert [n for n, _ in steps] == ["table2-sdpa", "overhead"] and total == sum(c for _, c in steps)


def test_the_quick_tile_timing_step_records_default_and_autotuned_timings_into_the_record():
    """tile-timing runs gpu_tiles.py's timing alone (no tile sweep, no host time) on cases
    TIMING names, with the step's own budget, into the record's tiles/ (as the full plan's
    tiles step), which the record's README then lists."""
    steps, _, out = _plan("--quick", ATTNKIT_SUITE_STEPS="tile-timing")
    assert steps == [("tile-timing", 35)], out
    text = SUITE.read_text()
    call = re.search(r"^\s*run_step tile-timing (.*?[^\\])$", text, re.M | re.S)
    assert call, "no tile-timing step"
    cmd = call[1].replace("\\\n", " ")
    assert '"$PY" "$REPO/bench/gpu_tiles.py" "$RECORD/tiles"' in cmd
    assert all(f in cmd for f in ("--skip-tiles", "--no-host", "--timing-seconds @INNER@")), cmd
    cases = re.findall(r'--timing-case (?:"([^"]+)"|(\S+))', cmd)
    spec = importlib.util.spec_from_file_location("bench_gpu_tiles_suite", ROOT / "bench" / "gpu_tiles.py")
    gpu_tiles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_tiles)
    assert [a or b for a, b in cases] == ["sd15 d40", "d64", "d128"]
    assert {a or b for a, b in cases} <= set(gpu_tiles.TIMING_NAMES)
    assert '[ -d "$RECORD/tiles" ]' in text  # the README's table names the folder


def test_the_script_runs_its_steps_in_the_plans_order():
    """The dry run prints the plan; the script must run the steps in that order."""
    text = SUITE.read_text()
    called = re.findall(r"^\s*(?:STDOUT=\S+ \\\n)?\s*run_step ([a-z0-9-]+)", text, re.M)
    steps, _, _ = _plan("--quick")
    order = [n for n in called if n in {s for s, _ in steps}]
    assert order == [s for s, _ in steps], order


@pytest.mark.skipif(sys.platform != "linux", reason="stat -c")
def test_a_step_writes_into_the_records_results_and_table(tmp_path):
    """The smoke run of one step: its section lands in results.json and table.md of the
    record folder, the logs stay in OUTDIR/logs."""
    run = subprocess.run(
        ["bash", str(SUITE), str(tmp_path), "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHON": sys.executable, "ATTNKIT_SUITE_STEPS": "kernels16"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    (record,) = (tmp_path / "results").iterdir()
    assert record.name.endswith("-smoke")
    assert {"README.md", "results.json", "table.md"} <= {p.name for p in record.iterdir()}
    data = json.loads((record / "results.json").read_text())
    cases = data["sections"]["kernels16"]["data"]["cases"]
    assert [c["case"] for c in cases][:3] == ["d40 float16", "d64 float16", "d128 float16"]
    assert any(c.get("bias") for c in cases)
    assert "16-bit kernels against SDPA" in (record / "table.md").read_text()
    assert "kernels16 (exit 0)" in (record / "README.md").read_text()
    assert (tmp_path / "logs" / "suite.log").is_file() and not list(record.rglob("*.log"))
