"""`python -m attnkit.kernels.inspect` compiles the shipped kernel configurations for
sm_80 and sm_90 without a GPU and fails on register spills or shared-memory overflow.

The full table (every autotuning config x head dims 40/64/80/128/160/256 x fp16/bf16/fp32
x three bias variants x six kernels (forward, dK/dV, dQ, and the variants that keep the
forward's rounding residual or write the bias gradient) x two targets, about 1030
compilations) takes about 20 minutes on two cores without Triton's cache: run it with
`make inspect`. Here the quick subset: the first (default) config of each kernel at head
dims 40 (two head-dim pieces) and 128 with a full bias, fp16, bf16 and fp32 for the
forward, fp16 and fp32 for the backward, on both targets.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    # A process of its own, without TRITON_INTERPRET: the kernels must be defined for the
    # compiler, not the interpreter.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-m", "attnkit.kernels.inspect", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


def _rows(stdout: str) -> list[list[str]]:
    kernels = ("fwd", "dkdv", "dq", "fwd_lo", "dkdv_dbias", "dq_dbias")
    return [line.split() for line in stdout.splitlines() if line.split()[:1] and line.split()[0] in kernels]


def test_quick_subset_compiles_without_spills_for_sm80_and_sm90():
    res = _run("--quick", "--dtype", "fp16", "--dtype", "bf16", "--dtype", "fp32", "--kernel", "fwd",
               "--kernel", "fwd_lo")
    res_bwd = _run("--quick", "--dtype", "fp16", "--dtype", "fp32", "--kernel", "dkdv", "--kernel", "dq",
                   "--kernel", "dkdv_dbias", "--kernel", "dq_dbias")
    for r in (res, res_bwd):
        assert r.returncode == 0, r.stdout + r.stderr
    rows = _rows(res.stdout) + _rows(res_bwd.stdout)
    # fwd: 2 head dims x 3 dtypes x 2 targets, and the forward that keeps its rounding
    # residual (16-bit only) 2 x 2 x 2; backward: 4 kernels (dK/dV and dQ, without and
    # with the bias gradient) x 2 head dims x 2 dtypes x 2 targets
    assert len(rows) == 12 + 8 + 32
    for row in rows:
        kernel, d, dtype, bias, cfg, arch, regs, stack, smem, matrix = row[:10]
        assert row[-1] == "ok", row
        assert int(stack) == 0 and int(regs) <= 255
        # Tensor cores: Ampere's mma.sync on sm_80, Hopper's warp-group MMA on sm_90;
        # exact fp32 dots run on FMA units.
        expected = "fma" if dtype == "fp32" else {"sm_80": "mma", "sm_90": "wgmma"}[arch]
        assert matrix == expected, row


def test_a_failing_configuration_makes_it_exit_nonzero():
    """A tile that does not fit in registers (forward, head dim 40, 128 x 64 tiles on 4
    warps: it spills on sm_90) must be reported and fail the run: the check is not a
    formality."""
    res = _run("--kernel", "fwd", "--head-dim", "40", "--dtype", "fp16", "--arch", "90", "--bias", "full",
               "--config=128,64,4,2")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAIL" in res.stdout
