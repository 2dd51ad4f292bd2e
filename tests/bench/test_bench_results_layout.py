"""bench/results/ holds results only, in one layout (bench/results/README.md): a folder per
device with README.md, results.json and table.md, each sub-result with its own README, no
logs, scripts or wheels, nothing over 1 MB; and bench/gpu_suite.sh, which writes that
layout, never writes into bench/results/ itself."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
OWN_LAYOUT = "static"  # the kernel's static report: its own files (make inspect)
NOT_RESULTS = {".log", ".py", ".sh", ".whl", ".tgz", ".err"}


def _devices() -> list[Path]:
    return sorted(p for p in RESULTS.iterdir() if p.is_dir() and p.name != OWN_LAYOUT)


def test_every_device_folder_is_a_record_with_a_readme():
    assert _devices()
    for device in _devices():
        names = {p.name for p in device.iterdir()}
        assert {"README.md", "results.json", "table.md"} <= names, device.name
        data = json.loads((device / "results.json").read_text())
        assert "tables" in data and "environment" in data, device.name
        for sub in (p for p in device.iterdir() if p.is_dir()):
            assert (sub / "README.md").is_file(), f"{sub.relative_to(ROOT)} has no README.md"


def test_no_logs_scripts_wheels_or_large_files_in_results():
    for path in RESULTS.rglob("*"):
        if not path.is_file() or OWN_LAYOUT in path.relative_to(RESULTS).parts[:1]:
            continue
        rel = path.relative_to(ROOT)
        assert path.suffix not in NOT_RESULTS, f"{rel}: logs go to bench/out/, scripts to bench/checks/"
        assert path.stat().st_size < 1 << 20, f"{rel}: over 1 MB"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("args", [["bench/results/some-gpu"], ["--fast"], ["a", "b"], ["--smoke", "--quick"]])
def test_gpu_suite_refuses_before_running_anything(args, tmp_path):
    """An OUTDIR under bench/results/, an unknown option, two OUTDIRs or two kinds of run
    stop the suite (exit 2) before it creates a folder or imports anything."""
    before = sorted(p.name for p in RESULTS.iterdir())
    run = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_suite.sh"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHON": "false"},
    )
    assert run.returncode == 2, run.stderr
    assert sorted(p.name for p in RESULTS.iterdir()) == before
    assert not (ROOT / "a").exists()
