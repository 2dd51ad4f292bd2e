"""The static report's rows of the block-sparse flash kernels (tools/static_report/sparse.py):
the jobs of a full run hold them for both targets, with the launcher's tile; their module
stays out of the other rows' code keys (adding them recompiles none of those); the committed
report has them, both tile loops read, beside the dense kernels'."""

from __future__ import annotations

import json
import os

import pytest

from tests.static_report._compiled import compiled_run

pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPARSE = ("sparse_fwd", "sparse_dq", "sparse_dkdv")


def test_a_full_run_has_the_sparse_kernels_on_both_targets():
    from attnkit.kernels.flash import sparse_kernels
    from attnkit.kernels.flash.sparse import CONFIGS
    from tools.static_report import jobs

    assert set(SPARSE) <= set(jobs.KERNELS) and set(SPARSE) == set(sparse_kernels.SPARSE_KERNELS)
    every = jobs.jobs_for(
        jobs.KERNELS, jobs.HEAD_DIMS, jobs.DTYPES, jobs.ARCHS, jobs.BIASES, (False, True), quick=False
    )
    rows = [j for j in every if j.kernel in SPARSE]
    assert {(j.kernel, j.arch, j.head_dim, j.dtype) for j in rows} == {
        (k, a, d, dt) for k in SPARSE for a in (80, 90) for d in (64, 128, 256) for dt in ("fp16", "bf16")
    }
    assert len(rows) == 3 * 2 * 3 * 2  # one row each: one tile, no bias, not causal, pointer loads
    for j in rows:
        # flash/sparse.py's CONFIGS, as the launcher runs them
        tile = (*CONFIGS[j.head_dim][j.kernel], 0)
        assert j.config == tile and j.default and j.budget is None, j
        assert (j.bias, j.causal, j.tma, j.piece) == ("none", False, False, -1), j
    # The dense kernels' jobs are what they were without the sparse ones.
    assert len(every) - len(rows) == len(
        jobs.jobs_for(
            [k for k in jobs.KERNELS if k not in SPARSE],
            jobs.HEAD_DIMS,
            jobs.DTYPES,
            jobs.ARCHS,
            jobs.BIASES,
            (False, True),
            quick=False,
        )
    )


_KEYS = r"""
import json
from tools.static_report import build, sparse
from tools.static_report.compile import Job

dense = Job("fwd", 64, "fp16", (128, 64, 8, 2, 0), 90, "none", default=True)
sparse_job = Job("sparse_fwd", 64, "fp16", sparse.sparse_tile(64, "sparse_fwd"), 90, "none", default=True)
before = (build.code_key(dense), build.code_key(sparse_job))
sparse.sparse_analysis_key = lambda: "another sparse analysis"
after = (build.code_key(dense), build.code_key(sparse_job))
print(json.dumps([before, after]))
"""


def test_the_sparse_module_is_in_the_sparse_rows_code_keys_only():
    out = compiled_run("-c", _KEYS, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (dense, sparse), (dense2, sparse2) = json.loads(out.stdout.strip().splitlines()[-1])
    assert dense and sparse and dense != sparse
    assert dense2 == dense  # a dense row does not see sparse.py
    assert sparse2 != sparse  # a sparse row does


def test_the_committed_report_has_the_sparse_rows_beside_the_dense_ones():
    from tools.static_report import store

    record = store.read_record(os.path.join(ROOT, store.REPORT_DIR))
    rows = [r for r in record["rows"] if r["kernel"] in SPARSE]
    assert {(r["kernel"], r["arch"], r["head_dim"], r["dtype"]) for r in rows} == {
        (k, a, d, dt) for k in SPARSE for a in (80, 90) for d in (64, 128, 256) for dt in ("fp16", "bf16")
    }
    for r in rows:
        assert not r["error"] and r["loop_length"] > 0 and r["loops"] >= 2, r
        # both walks read: the partial-tile loop also reads the element mask, so it is longer
        assert r["partial_loop_length"] > r["loop_length"], r
        assert r["matrix"] in ("mma", "wgmma"), r
    verdicts = {v["id"]: v for v in record["targets"] if v["id"].startswith("sparse-vs-dense-")}
    assert len(verdicts) == len(rows)
    for v in verdicts.values():
        assert v["dense_instr_per_score"] > 0 and v["partial_instr_per_score"] > 0, v
        assert v["met"] == (not v["problems"]), v
        if v["arch"] == 90:
            assert v["dense_tma_instr_per_score"] > 0, v
    with open(os.path.join(ROOT, store.REPORT_DIR, "report.md")) as f:
        assert "## Block-sparse kernels beside the dense ones" in f.read()
