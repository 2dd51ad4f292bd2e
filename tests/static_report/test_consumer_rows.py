"""The static report's rows of the consumer targets (tools/static_report/consumer.py: sm_75,
sm_86, sm_89): a full run holds them, with the sm80 lists' default tiles; the other rows'
jobs and code keys are what they were without them; the committed report has them, each
clean or not clean for a reason it gives, in their own section; and no backend promises a
target whose rows are not clean."""

from __future__ import annotations

import json
import os

import pytest

from tests.static_report._compiled import compiled_run

pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What each backend runs, by the static report's kernels.
BACKEND_KERNELS = {"triton": ("fwd", "dq", "dkdv"), "int8": ("int8",)}


def _expected() -> set:
    """(arch, kernel, head dim, dtype, bias) of every consumer row."""
    from tools.static_report import consumer

    return {
        (a, k, d, dt, b)
        for a in consumer.CONSUMER_ARCHS
        for k in consumer.KERNELS
        for d in consumer.HEAD_DIMS
        for dt in consumer.DTYPES[a]
        for b in (consumer.INT8_BIASES if k == "int8" else consumer.EXACT_BIASES)
    }


def _every(archs):
    from tools.static_report import jobs

    return jobs.jobs_for(jobs.KERNELS, jobs.HEAD_DIMS, jobs.DTYPES, archs, jobs.BIASES, (False, True), quick=False)


def test_a_full_run_has_the_consumer_rows_with_the_sm80_defaults():
    import torch

    from attnkit.kernels.flash import select
    from tools.static_report import consumer, jobs

    every = _every(jobs.ALL_ARCHS)
    rows = [j for j in every if consumer.is_consumer(j.arch)]
    assert {(j.arch, j.kernel, j.head_dim, j.dtype, j.bias) for j in rows} == _expected()
    assert len(rows) == len(_expected())  # one row each: the default tile, one launch
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}
    for j in rows:
        assert j.default and j.budget is None and not j.causal and not j.tma and j.piece == -1, j
        if j.kernel == "int8":
            assert j.config == jobs.int8_tile(80, j.head_dim, j.bias), j
        else:
            first = select.configs_for(j.kernel, j.head_dim, tdt[j.dtype], "sm80", j.bias, False, False)[0]
            assert j.config == (first.block_m, first.block_n, first.num_warps, first.num_stages, int(first.reload))
            assert j.maxnreg == first.maxnreg, j
    # sm_80 and sm_90: the same jobs as without the consumer targets.
    assert [j for j in every if not consumer.is_consumer(j.arch)] == _every(jobs.ARCHS)


_KEYS = r"""
import json
from tools.static_report import build, compile
from tools.static_report.compile import Job

a100 = Job("fwd", 64, "fp16", (64, 64, 4, 3, 0), 80, "none", default=True)
ada = Job("fwd", 64, "fp16", (64, 64, 4, 3, 0), 89, "none", default=True)
before = (build.code_key(a100), build.code_key(ada))
compile.CONSUMER_TENSOR_FLOPS[89] = 512
after = (build.code_key(a100), build.code_key(ada))
print(json.dumps([before, after]))
"""


def test_the_consumer_tensor_rate_is_in_the_consumer_rows_code_keys_only():
    out = compiled_run("-c", _KEYS, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (a100, ada), (a100_2, ada_2) = json.loads(out.stdout.strip().splitlines()[-1])
    assert a100 and ada and a100 != ada
    assert a100_2 == a100  # an sm_80 row does not see the consumer targets' constants
    assert ada_2 != ada


def _committed():
    from tools.static_report import store

    return store.read_record(os.path.join(ROOT, store.REPORT_DIR))


def test_the_committed_report_has_the_consumer_rows_clean_or_with_a_reason():
    from tools.static_report import consumer

    record = _committed()
    rows = [r for r in record["rows"] if consumer.is_consumer(r["arch"])]
    assert {(r["arch"], r["kernel"], r["head_dim"], r["dtype"], r["bias"]) for r in rows} == _expected()
    for r in rows:
        assert r["default"] and not r["causal"] and not r["tma"], r
        if r["problems"]:
            assert (r["arch"], r["kernel"]) in consumer.NOT_CLEAN, r
    # sm_86 and sm_89 compile as sm_80 does: every row clean, on 16-bit tensor cores
    # (integer ones for the int8 forward's Q.K), within 99 KiB.
    for r in rows:
        if r["arch"] in (86, 89):
            assert not r["problems"] and r["stack"] == 0 and r["smem"] <= 101_376, r
            assert r["matrix"] == ("imma" if r["kernel"] == "int8" else "mma"), r
    with open(os.path.join(ROOT, "bench", "results", "static", "report.md")) as f:
        text = f.read()
    assert "## Consumer GPUs and T4 (sm_75, sm_86, sm_89)" in text
    # Not in the targets' verdicts: the section is theirs.
    assert not any(str(v.get("arch", "")) in ("75", "86", "89") for v in record["targets"])
    # The row files are by target, as sm_80's and sm_90's.
    for a in consumer.CONSUMER_ARCHS:
        for k in consumer.KERNELS:
            assert f"sm{a}-{k}" in record["row_files"], (a, k)


def test_no_backend_promises_a_consumer_target_without_clean_rows():
    """A backend's min_capability admits a consumer target only where every row of the
    kernels it runs there is clean: auto() never routes a call to one without."""
    import torch

    from attnkit.backends import AttentionCall, DeviceInfo, get_backend
    from attnkit.backends.int8 import Int8Backend  # opt-in (attnkit.choose.lossy), not registered
    from tools.static_report import consumer

    rows = [r for r in _committed()["rows"] if consumer.is_consumer(r["arch"])]
    for name, kernels in BACKEND_KERNELS.items():
        if not set(kernels) <= set(consumer.KERNELS):
            continue  # not compiled for the consumer targets (consumer.KERNELS says why)
        backend = Int8Backend() if name == "int8" else get_backend(name)
        for arch in consumer.CONSUMER_ARCHS:
            capability = divmod(arch, 10)
            mine = [r for r in rows if r["arch"] == arch and r["kernel"] in kernels]
            clean = bool(mine) and not any(r["problems"] for r in mine)
            served = capability >= backend.capabilities.min_capability
            assert clean or not served, (name, arch)
            if not served:
                call = AttentionCall(DeviceInfo("cuda", capability, f"sm_{arch}"), torch.float16, 64)
                assert backend.not_supported_reasons(call), (name, arch)
