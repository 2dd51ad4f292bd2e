"""Rows of the block-sparse flash kernels (attnkit/kernels/flash/sparse_kernels.py): kernels
"sparse_fwd" (_sparse_fwd), "sparse_dq" (_sparse_bwd_dq) and "sparse_dkdv" (_sparse_bwd_dkdv),
launched by flash/sparse.py with its tile per kernel and head dim (sparse.launch_config:
tile, num_warps and num_stages), pointer loads, no bias, no causality (the block
table is the mask), no autotuner.

Each kernel walks its block table in two loops: the full tiles first (no mask inside), then
the partial ones (the element mask read from the table's store). The row's figures (the
columns every row has) are those of the first, the full-tile loop, as sass.main_loop finds
it; SparseResult adds the second, the partial-tile loop: its length, instr/score,
exp/score and matrix work, read from the same SASS (analyse_partial).

This module is hashed whole into the source key (key._ROW_MODULES) and into the code key of
the sparse rows only (sparse_analysis_key): the dense rows' code keys do not see it, so
adding or changing these rows recompiles none of theirs.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
from dataclasses import dataclass

from attnkit.kernels import limits

from . import sass
from .compile import DUPLICATION_LIMIT, EXP_DUPLICATION, Job, Result, _read_cubin

SPARSE_KERNELS = ("sparse_fwd", "sparse_dq", "sparse_dkdv")
# The dense kernel each sparse one is compared with (targets.compare_sparse).
DENSE_OF = {"sparse_fwd": "fwd", "sparse_dq": "dq", "sparse_dkdv": "dkdv"}
# A small representative set: each kernel's tile per head-dim band (sparse.CONFIGS).
SPARSE_HEAD_DIMS = (64, 128, 256)
SPARSE_DTYPES = ("fp16", "bf16")


def sparse_tile(head_dim: int, kernel: str = "sparse_fwd") -> tuple[int, int, int, int, int]:
    """(block_m, block_n, num_warps, num_stages, reload) of a sparse kernel at a head dim,
    on a GPU: flash/sparse.py's launch_config."""
    from attnkit.kernels import launcher
    from attnkit.kernels.flash import sparse

    with launcher.override(interpret=False):  # the GPU's tile, also under the interpreter
        bm, bn, warps, stages = sparse.launch_config(kernel, head_dim)
    return (bm, bn, warps, stages, 0)


def sparse_source(job: Job):
    """What a sparse row is compiled from, as flash/sparse.py launches it: Q, K, V and the
    outputs in the inputs' dtype, Lse and Delta float32, the table int32, its store uint8;
    strides, H, M, N int32, the scales float32; ALIGN of a (B, N, H, D) layout as the dense
    rows take it."""
    from triton.compiler import ASTSource

    from attnkit.kernels.flash import abi, sparse_kernels

    from .build import Build, _signature
    from .compile import MATMULS

    fn = sparse_kernels.SPARSE_KERNELS[job.kernel]
    d0, d1 = limits.split_head_dim(job.head_dim)
    bm, bn, warps, stages, _ = job.config
    pointer_types = {
        "Lse": "*fp32",
        "Delta": "*fp32",
        "FullNum": "*i32",
        "FullIdx": "*i32",
        "PartNum": "*i32",
        "PartIdx": "*i32",
        "PartSlot": "*i32",
        "Store": "*u8",
    }
    sig = _signature(fn, job.dtype, pointer_types, {})
    constexprs = dict(
        HEAD_DIM=job.head_dim,
        D0=d0,
        D1=d1,
        BLOCK_M=bm,
        BLOCK_N=bn,
        ALIGN=abi.align(job.head_dim),
        PRECISION="tf32" if job.dtype != "fp32" else "ieee",
        EMULATE_BF16=False,
    )
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params) if sig[p.name].startswith("*")}
    options = {**abi.COMPILE_OPTIONS, **({"maxnreg": job.maxnreg} if job.maxnreg else {})}
    exp_least = 1.0 + (1.0 / bn if job.kernel == "sparse_fwd" else 0.0)
    src = ASTSource(fn, sig, constexprs, attrs)
    return Build(src, job.arch, warps, stages, options, bm * bn, d0 + d1, MATMULS[job.kernel], exp_least)


@functools.lru_cache(maxsize=None)
def sparse_analysis_key() -> str:
    """A hash of this module's code (docstrings and comments left out): what a sparse row's
    figures are read with besides the dense rows' analysis (build.analysis_key)."""
    from .key import _code

    with open(os.path.abspath(__file__)) as f:
        return hashlib.sha256(ast.dump(_code(f.read())).encode()).hexdigest()


@dataclass
class SparseResult(Result):
    """A sparse row: Result's figures (the full-tile loop) and the partial-tile loop's."""

    partial_loop_length: int = 0
    partial_instr_per_score: float = float("nan")
    partial_exp_per_score: float = float("nan")
    partial_mma_duplication: float = float("nan")
    partial_mma_mix: dict | None = None

    @property
    def problems(self) -> list[str]:
        out = list(Result.problems.fget(self))
        if self.error or self.loop_length == 0:
            return out
        if self.partial_loop_length == 0:
            out.append("no partial-tile loop found in the SASS")
            return out
        if self.partial_mma_duplication > DUPLICATION_LIMIT:
            out.append(f"partial-tile loop: duplicated matrix work ({self.partial_mma_duplication:.2f}x the FLOPs)")
        if self.partial_exp_per_score > EXP_DUPLICATION * self.exp_least:
            out.append(f"partial-tile loop: duplicated exponentials ({self.partial_exp_per_score:.2f} per score)")
        return out


def table_loops(instrs) -> list:
    """The kernel's tile loops in program order: the innermost loops holding matrix
    instructions (no loop inside them holds any) with the most of them. The sparse kernels
    have two, the full-tile walk and the partial-tile walk, whose matmuls are the same."""
    with_mma = [lp for lp in sass.loops(instrs) if lp.matrix_instrs]
    innermost = [
        lp for lp in with_mma if not any(o is not lp and lp.start <= o.start and o.end <= lp.end for o in with_mma)
    ]
    if not innermost:
        return []
    most = max(lp.matrix_instrs for lp in innermost)
    return sorted((lp for lp in innermost if lp.matrix_instrs == most), key=lambda lp: lp.start)


def analyse_partial(res: SparseResult, kernel, warps: int, scores: int, padded: int, matmuls: int) -> SparseResult:
    """The partial-tile loop's figures: the second of table_loops (the first is the row's
    main loop, which compile.analyse read)."""
    _, listing = _read_cubin(kernel)
    walks = table_loops(sass.parse(listing))
    if len(walks) < 2:
        return res
    loop = walks[1]
    res.partial_loop_length = loop.length
    res.partial_instr_per_score = loop.length * warps / scores
    res.partial_exp_per_score = loop.count("MUFU.EX2") * 32 * warps / scores
    res.partial_mma_mix = dict(loop.mma_shapes())
    res.partial_mma_duplication = loop.mma_flops(warps) / (matmuls * 2.0 * scores * padded)
    return res
