"""bench/block_sparse.py runs end to end on the CPU at tiny sizes (the GPU suite's step
"sparse" runs it with its defaults): a row per mask with attnkit's route and time, and the
BlockMask model's row with every flex module served and its output within float32 noise
of the stock model's (parity itself is the zoo's test: 1e-5 here is 50x the float32 difference seen)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_block_mask_benchmark_runs_on_the_cpu(tmp_path):
    out = tmp_path / "sparse.json"
    args = ["--tokens", "384", "--rounds", "1", "--frames", "2", "--latent", "8", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "block_sparse.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [r["mask"] for r in data["kernel"]] == [
        "lists 10%",
        "lists 30%",
        "lists 50%",
        "lists 70%",
        "lists 90%",
        "window 1024",
    ]
    assert all(r["route"] == "chunked" and r["attnkit_s"] > 0 for r in data["kernel"])
    (model,) = data["model"]
    assert model["served_modules"] >= 2 and model["rel_error_vs_stock"] < 1e-5
    assert "| lists 10% |" in done.stdout and "| AnyFlow FAR" in done.stdout
