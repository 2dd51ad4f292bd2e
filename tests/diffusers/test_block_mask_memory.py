"""A 16k-token sliding-window BlockMask through diffusers' dispatcher with the attnkit
backend runs in eager mode on the CPU, forward and backward, in a small part of what one
dense (M, N) score matrix needs (eager FlexAttention holds one per head, 1 GiB each here),
and matches float64 on sampled rows. Measured in a fresh process (_block_mask_memory_run.py),
as the peak resident memory the call adds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).with_name("_block_mask_memory_run.py")


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="measures Linux's VmHWM (/proc/self)")
def test_a_16k_token_window_through_the_dispatcher_stays_far_below_one_score_matrix(seed):
    import torch

    from attnkit.testing import EPSILON

    draw = int(torch.randint(0, 2**31 - 1, ()))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(RUN), str(draw)], capture_output=True, text=True, timeout=600, cwd=root, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["finite_grads"]
    tol = 2 * seen["torch_error"] + EPSILON[torch.float32]
    assert seen["error"] <= tol, f"sampled rows: relative error {seen['error']:.2e} > {tol:.2e} against float64"
    assert seen["peak"] < seen["score_matrix"] / 8, (
        f"the call added {seen['peak'] / 2**20:.0f} MiB at its peak; one score matrix is "
        f"{seen['score_matrix'] / 2**20:.0f} MiB"
    )
