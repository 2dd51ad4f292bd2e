"""The jobs of a run: which (kernel, head dim, dtype, target, bias, causal, loads, tile,
launch) rows it compiles, from the shipped tile lists or --config, and in what order."""

from __future__ import annotations

from .build import _select
from .compile import DBIAS_KERNELS, Job
from .consumer import CONSUMER_ARCHS, is_consumer, tile_target, wanted
from .sparse import SPARSE_DTYPES, SPARSE_HEAD_DIMS, SPARSE_KERNELS, sparse_tile

HEAD_DIMS = (40, 64, 80, 96, 128, 160, 256, 320, 384, 512)
DTYPES = ("fp16", "bf16", "fp32")
ARCHS = (80, 90)
# A full run also compiles a few rows for the consumer targets (consumer.py: sm_75, sm_86,
# sm_89, with the sm80 lists' default tiles); ARCHS are the targets of the whole matrix.
ALL_ARCHS = ARCHS + CONSUMER_ARCHS
KERNELS = ("fwd", "dkdv", "dq", "fwd_lo", "dkdv_dbias", "dq_dbias", "int8", *SPARSE_KERNELS)
BIASES = ("none", "keypad", "full", "full16")
# The int8 forward (attnkit/kernels/int8): 16-bit inputs, float32 biases only (none, key
# padding, full), pointer loads only, one tile per target, head dim and bias (int8/ops.py's
# TILES, no autotuning).
INT8_DTYPES = ("fp16", "bf16")
INT8_BIASES = ("none", "keypad", "full")


def int8_tile(arch: int, head_dim: int, bias: str) -> tuple[int, int, int, int, int]:
    """(block_m, block_n, num_warps, num_stages, reload) of the int8 forward for a target,
    head dim and bias: ops.py's tile_for."""
    from attnkit.kernels.int8 import ops

    return (*ops.tile_for(tile_target(arch), head_dim, bias), 0)


def _variants(kernel: str, dtype: str, arch: int, biases, causals) -> list[tuple[str, bool, bool]]:
    """(bias, causal, tma) combinations a kernel compiles to on a target. A full bias in
    the inputs' 16-bit dtype ("full16") is read as it is by the inference forward only
    (a call that needs gradients converts it to float32, as every other bias). The int8
    forward: float32 biases, pointer loads."""
    if kernel == "int8":
        return [(bias, causal, False) for bias in biases if bias in INT8_BIASES for causal in causals]
    if kernel in SPARSE_KERNELS:  # the block table is the mask: no bias, no causality; pointer loads
        return [("none", False, False)] if "none" in biases and False in causals else []
    tmas = (True, False) if arch == 90 and dtype != "fp32" else (False,)
    return [
        (bias, causal, tma)
        for bias in biases
        if not (bias == "none" and kernel in DBIAS_KERNELS)
        and not (bias == "full16" and (kernel != "fwd" or dtype == "fp32"))
        for causal in causals
        for tma in tmas
    ]


def launches(kernel: str, head_dim: int) -> list[tuple[int, str]]:
    """(PIECE, GRADS) of each launch of a kernel at a head dim (attnkit/kernels/flash/
    launch.py, BackwardPlan): above 256 the backward runs once per head-dim piece, dK/dV also once
    per gradient; the bias gradient comes with the first dK (or dQ) launch."""
    if kernel.startswith(("fwd", "sparse_")) or kernel == "int8" or head_dim <= 256:
        return [(-1, "dkdv")]
    if kernel == "dq":
        return [(0, "dkdv"), (1, "dkdv")]
    if kernel == "dq_dbias":
        return [(0, "dkdv")]
    if kernel == "dkdv":
        return [(p, g) for p in (0, 1) for g in ("dk", "dv")]
    return [(0, "dk")]  # dkdv_dbias


def jobs_for(
    kernels, head_dims, dtypes, archs, biases, causals, quick: bool, configs=None, tmas=None, budget=None
) -> list[Job]:
    import torch

    fl = _select()
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    jobs = []
    for kernel in kernels:
        for d in head_dims:
            for dtype in dtypes:
                if kernel == "fwd_lo" and dtype == "fp32":
                    continue  # fp32 outputs are not rounded: no residual
                if kernel == "int8" and dtype not in INT8_DTYPES:
                    continue  # 16-bit inputs only
                if kernel in SPARSE_KERNELS and (dtype not in SPARSE_DTYPES or d not in SPARSE_HEAD_DIMS):
                    continue  # 16-bit inputs, a few head dims (sparse.py)
                for arch in archs:
                    for bias, causal, tma in _variants(kernel, dtype, arch, biases, causals):
                        if tmas is not None and tma not in tmas:
                            continue
                        if is_consumer(arch) and not wanted(kernel, d, dtype, arch, bias, causal, tma):
                            continue
                        if configs:
                            cands = [(c[:5], (c[5] if len(c) > 5 else 0) or None, False, budget) for c in configs]
                        elif kernel == "int8":
                            cands = [(int8_tile(arch, d, bias), None, True, None)]  # its tile, not gated
                        elif kernel in SPARSE_KERNELS:
                            cands = [(sparse_tile(d, kernel), None, True, None)]  # its one tile, not gated
                        else:
                            shipped = fl.configs_for(kernel, d, tdt[dtype], tile_target(arch), bias, causal, tma)
                            if quick or is_consumer(arch):  # a consumer target: the default only
                                shipped = shipped[:1]
                            cands = [
                                (
                                    (c.block_m, c.block_n, c.num_warps, c.num_stages, int(c.reload)),
                                    c.maxnreg,
                                    i == 0,
                                    None if is_consumer(arch) else c.budget,  # no budget there
                                )
                                for i, c in enumerate(shipped)
                            ]
                        for cfg, maxnreg, default, budget in cands:
                            for piece, grads in launches(kernel, d):
                                jobs.append(
                                    Job(
                                        kernel,
                                        d,
                                        dtype,
                                        tuple(cfg),
                                        arch,
                                        bias,
                                        causal,
                                        tma,
                                        default,
                                        budget,
                                        piece=piece,
                                        grads=grads,
                                        maxnreg=maxnreg,
                                    )
                                )
    return order_jobs(jobs)


def priority(j: Job) -> int:
    """Rows the targets read first, so an interrupted run still evaluates them: sm_90
    16-bit TMA defaults of the target variants, then the full-bias candidates, then the
    sm_80 defaults compared with the baseline, then everything else (fp32 and head dims
    above 256 last: the slowest to compile)."""
    from . import targets

    sixteen = j.dtype in ("fp16", "bf16")
    if (
        j.arch == 90
        and sixteen
        and j.tma
        and not j.causal
        and j.bias in ("none", "keypad")
        and j.default
        and (
            (j.kernel == "fwd" and j.head_dim in targets.FWD_EXACT + targets.FWD_NEAR)
            or (j.kernel in ("dkdv", "dq") and j.head_dim in targets.BWD_HEAD_DIMS)
        )
    ):
        return 0
    if j.arch == 90 and sixteen and j.tma and not j.causal and j.bias == "full":
        return 1
    if j.arch == 80 and j.default and not j.causal and not j.tma:
        return 2
    return 3 if sixteen and j.head_dim <= 256 else 4


def order_jobs(jobs: list[Job]) -> list[Job]:
    """jobs, the targets' rows first (stable within a priority)."""
    return sorted(jobs, key=priority)


def row_order(results: list) -> list:
    """Rows (Results) in the order jobs_for makes them: the targets' rows first, then
    by kernel, head dim, dtype, target, bias, causality and loads; rows that agree on
    all of these (a list's tiles, a backward's launches) keep their order. A report is
    written in this order, and read back in it from its row files."""

    def key(r):
        j = r.job
        return (
            priority(j),
            KERNELS.index(j.kernel) if j.kernel in KERNELS else len(KERNELS),
            j.head_dim,
            DTYPES.index(j.dtype) if j.dtype in DTYPES else len(DTYPES),
            j.arch,
            BIASES.index(j.bias) if j.bias in BIASES else len(BIASES),
            j.causal,
            not j.tma,
        )

    return sorted(results, key=key)
