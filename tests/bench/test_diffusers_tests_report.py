"""tools/diffusers_tests' report: built from a stock and an attnkit run, it counts per family,
lists what passes stock and fails with attnkit, and writes the record's README beside
report.md and report.json (a folder under bench/results/ has its README)."""

from __future__ import annotations

import json

from tools.diffusers_tests import report
from tools.diffusers_tests.run import PhaseResult

FLUX = "models/transformers/test_models_transformer_flux.py"
SD = "pipelines/stable_diffusion/test_stable_diffusion.py"


def _phase(name: str, outcomes: dict[str, str]) -> PhaseResult:
    results = {
        f"tests/{nodeid}": {
            "outcome": outcome,
            "reason": f"{outcome} in {name}",
            "properties": {"attnkit_backend_calls": 3} if name == "attnkit" else {},
        }
        for nodeid, outcome in outcomes.items()
    }
    return PhaseResult(name=name, files=[FLUX, SD], results=results)


def _data() -> dict:
    stock = _phase(
        "stock",
        {
            f"{FLUX}::T::test_a": "passed",
            f"{FLUX}::T::test_b": "passed",
            f"{FLUX}::T::test_c": "failed",
            f"{SD}::P::test_d": "passed",
        },
    )
    attnkit = _phase(
        "attnkit", {f"{FLUX}::T::test_a": "passed", f"{FLUX}::T::test_b": "failed", f"{SD}::P::test_d": "passed"}
    )
    header = {"diffusers_commit": "abc", "attnkit_commit": "def", "date": "today"}
    return report.build([FLUX, SD], stock, attnkit, header)


def test_build_counts_only_what_passed_stock_and_names_each_regression():
    data = _data()
    flux = next(e for e in data["families"] if e["family"] == "flux")
    assert flux["collected"] == 3 and flux["attnkit_ran"] == 2 and flux["attnkit"] == {"passed": 1, "failed": 1}
    assert [g["count"] for g in data["regressions_by_reason"]] == [1]
    assert data["regressions_by_reason"][0]["tests"][0]["test"].endswith("test_b")


def test_write_gives_the_record_its_readme(tmp_path):
    md, js = report.write(_data(), tmp_path / "report.md")
    assert {p.name for p in tmp_path.iterdir()} == {"README.md", "report.md", "report.json"}
    readme = (tmp_path / "README.md").read_text()
    assert "- models: 1 families; 1 of 2 tests that pass stock pass with attnkit" in readme
    assert "- pipelines: 1 families; 1 of 1 tests" in readme
    assert "pass stock, fail with attnkit: 1" in readme and "[report.md](report.md)" in readme
    assert "test_b" in md.read_text() and json.loads(js.read_text())["header"]["attnkit_commit"] == "def"
