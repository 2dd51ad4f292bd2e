"""One row's build: what a row is compiled from (source_of: the kernel, its signature,
constants, target and options, as the launcher compiles them at run time), its code key
(code_key: a hash of the Triton IR that source compiles to, and of everything else the
row's figures depend on), and compile_job (compile it, read its cubin).

The code key is what lets a row outlive a change of the source that compiles to the same
code: Triton's front end (the kernel's AST to its TTIR, a few hundredths of a second) is
run, not the back end (LLVM, ptxas: seconds to a minute a row), nor the SASS analysis.
Two rows with the same code key are compiled from the same IR, by the same Triton, for
the same target, with the same options, and analysed by the same code with the same
parameters: the same figures.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import time
from dataclasses import dataclass

from attnkit.kernels import limits

from .compile import CONSUMER_TENSOR_FLOPS, DBIAS_KERNELS, MATMULS, Job, Result, _compile, analyse

_PTR = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32"}
_INTS = ("H", "M", "N", "OFF")


def flash_modules():
    """(kernels, abi): the Triton code of the flash-attention kernels and their calling
    convention (what every launch is compiled with and passed besides its tensors)."""
    from attnkit.kernels.flash import abi, kernels

    return kernels, abi


def _select():
    """The flash kernels' tile selection (configs_for: the shipped candidate lists)."""
    from attnkit.kernels.flash import select

    return select


def _int8():
    """(kernels, quant): the Triton code of the int8 forward and its quantisation's
    head-dim split (qk_pieces)."""
    from attnkit.kernels.int8 import kernels, quant

    return kernels, quant


@dataclass
class Build:
    """What one row is compiled from (src: a triton ASTSource) and the figures of its
    analysis (scores per iteration, padded head dim, matmuls, least exp/score, the int8
    matmul's padded width)."""

    src: object
    arch: int
    warps: int
    stages: int
    options: dict
    scores: int
    padded: int
    matmuls: int
    exp_least: float
    int8_padded: int = 0


def _signature(fn, dtype: str, pointer_types: dict[str, str], descriptors: dict[str, str]) -> dict[str, str]:
    sig = {}
    for p in fn.params:
        if p.is_constexpr:
            sig[p.name] = "constexpr"
        elif p.name in descriptors:
            sig[p.name] = descriptors[p.name]
        elif p.name in pointer_types:
            sig[p.name] = pointer_types[p.name]
        elif p.name in ("qk_scale", "sm_scale"):
            sig[p.name] = "fp32"
        elif p.name[0].isupper() and p.name not in _INTS:
            sig[p.name] = _PTR[dtype]  # Q, K, V, Out, DO, DQ, DK, DV, placeholders
        else:
            sig[p.name] = "i32"
    return sig


def source_of(job: Job) -> Build:
    """What a row is compiled from: its kernel's ASTSource, target and options."""
    if job.kernel.startswith("sparse_"):  # the block-sparse kernels: sparse.py
        from .sparse import sparse_source

        return sparse_source(job)
    return _int8_source(job) if job.kernel == "int8" else _flash_source(job)


def _flash_source(job: Job) -> Build:
    from triton.compiler import ASTSource

    from attnkit.kernels.bias_form import BIAS_16BIT_ALIGN

    fk, fl = flash_modules()
    fn = fk.KERNELS[job.kernel]
    d0, d1 = limits.split_head_dim(job.head_dim)
    bm, bn, warps, stages, reload = job.config
    base = job.kernel.split("_")[0]
    descriptors = {}
    if job.tma:
        t = _PTR[job.dtype][1:]
        for names, rows_key in fk.DESCRIPTORS[job.kernel]:
            rows = bm if rows_key == "BLOCK_M" else bn
            for name in names:
                width = d1 if name.endswith("1") and d1 else d0
                descriptors[name] = f"tensordesc<{t}[1,1,{rows},{width}]>"
    # "full16": a full bias in the inputs' 16-bit dtype, read as it is, at the least
    # alignment the launcher reads one at (BIAS_16BIT_ALIGN); every other bias in float32.
    bias16 = job.bias == "full16"
    pointer_types = {
        "Bias": _PTR[job.dtype] if bias16 else "*fp32",
        "Lse": "*fp32",
        "LseShift": "*fp32",
        "Delta": "*fp32",
        "DBias": "*fp32",
        "Lens": "*i32",
        "Plain": "*i32",
    }
    sig = _signature(fn, job.dtype, pointer_types, descriptors)
    constexprs = dict(
        HEAD_DIM=job.head_dim,
        D0=d0,
        D1=d1,
        BLOCK_M=bm,
        BLOCK_N=bn,
        RELOAD=bool(reload),
        BIAS={"none": fk.NO_BIAS, "keypad": fk.KEY_BIAS, "full": fk.FULL_BIAS, "full16": fk.FULL_BIAS}[job.bias],
        CAUSAL=job.causal,
        TMA=job.tma,
        # A (B, N, H, D) layout: head stride D, row stride H * D.
        ALIGN=fl.align(job.head_dim),
        BIAS_ALIGN=BIAS_16BIT_ALIGN if bias16 else 1,
        BIAS_CONTIG=True,
        PRECISION="tf32" if job.dtype != "fp32" else "ieee",
        EMULATE_BF16=False,
    )
    if base == "fwd":
        constexprs["STORE_LO"] = job.kernel == "fwd_lo"
        constexprs["WARP_SPEC"] = job.warp_specialize
    else:
        constexprs["BIAS_GRAD"] = job.kernel in DBIAS_KERNELS
        constexprs["PIECE"] = job.piece
        if base == "dkdv":
            constexprs["GRADS"] = job.grads
    # The arguments the launcher passes as None for this launch: constants, as Triton
    # compiles them at run time.
    for name in fl.absent_arguments(fn, constexprs):
        sig[name] = "constexpr"
        constexprs[name] = None
    # Pointers are 16-byte aligned (torch allocations are); Triton's runtime
    # specialises them the same way.
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params) if sig[p.name].startswith("*")}
    options = {**fl.COMPILE_OPTIONS, **({"maxnreg": job.maxnreg} if job.maxnreg else {})}
    exp_least = 1.0 + (1.0 / bn if base == "fwd" else 0.0)
    src = ASTSource(fn, sig, constexprs, attrs)
    return Build(src, job.arch, warps, stages, options, bm * bn, d0 + d1, MATMULS[job.kernel], exp_least)


def _int8_source(job: Job) -> Build:
    """The int8 forward (attnkit/kernels/int8/kernels.py): q8 and k8 int8, their scales
    and a bias float32, V and the output 16-bit; pointer loads only."""
    from triton.compiler import ASTSource

    fk, fl = flash_modules()
    ik, iq = _int8()
    fn = ik._attn_fwd_int8
    d0, d1 = limits.split_head_dim(job.head_dim)
    dq0, dq1 = iq.qk_pieces(job.head_dim)
    bm, bn, warps, stages, _ = job.config
    pointer_types = {
        "Q8": "*i8",
        "K8": "*i8",
        "QS": "*fp32",
        "KS": "*fp32",
        "Bias": "*fp32",
        "Lens": "*i32",
        "Plain": "*i32",
    }
    sig = _signature(fn, job.dtype, pointer_types, {})
    constexprs = dict(
        HEAD_DIM=job.head_dim,
        D0=d0,
        D1=d1,
        DQ0=dq0,
        DQ1=dq1,
        KB=iq.K_BLOCK,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BIAS={"none": fk.NO_BIAS, "keypad": fk.KEY_BIAS, "full": fk.FULL_BIAS}[job.bias],
        CAUSAL=job.causal,
        ALIGN=fl.align(job.head_dim),
        BIAS_ALIGN=1,
        BIAS_CONTIG=True,
        EMULATE_BF16=False,
        PV16=False,
    )
    for name in fl.absent_arguments(fn, constexprs):  # passed as None: constants
        sig[name] = "constexpr"
        constexprs[name] = None
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params) if sig[p.name].startswith("*")}
    options = {**fl.COMPILE_OPTIONS, **({"maxnreg": job.maxnreg} if job.maxnreg else {})}
    src = ASTSource(fn, sig, constexprs, attrs)
    return Build(
        src, job.arch, warps, stages, options, bm * bn, d0 + d1, MATMULS[job.kernel], 1.0 + 1.0 / bn, dq0 + dq1
    )


def _front(b: Build) -> tuple[str, str]:
    """(TTIR without locations, the parsed options' hash) of a build: Triton's front end
    only, as triton.compile runs it (the source's IR, then the TTIR stage's passes)."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    target = GPUTarget("cuda", b.arch, 32)
    backend = make_backend(target)
    options = backend.parse_options({"num_warps": b.warps, "num_stages": b.stages, **b.options})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    codegen = backend.get_codegen_implementation(options)
    module = b.src.make_ir(target, options, codegen, backend.get_module_map(), context)
    stages: dict = {}
    backend.add_stages(stages, options, b.src.language)
    module = stages["ttir"](module, {})
    return module.str_nodebug(), options.hash()


@functools.lru_cache(maxsize=None)
def analysis_key() -> str:
    """A hash of the code that reads a cubin into a row's figures: sass.py and the
    definitions named in key.ANALYSIS, found by name in any module of the tool
    (docstrings and comments left out)."""
    from .key import _code, analysis_definitions

    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "sass.py")) as f:
        h = hashlib.sha256(ast.dump(_code(f.read())).encode())
    h.update(analysis_definitions(here).encode())
    return h.hexdigest()


def code_key(job: Job, b: Build | None = None) -> str:
    """What a row's figures are a function of: the Triton version, the target, the
    parsed compile options, the kernel's TTIR (locations left out: a comment or a line
    moved does not change it), the analysis code (analysis_key) and the row's analysis
    parameters. "" where the source does not build (such a row is compiled again)."""
    try:
        b = b or source_of(job)
        ttir, options = _front(b)
    except Exception:  # noqa: BLE001 - a row that does not build has no code key
        return ""
    analysis = analysis_key()
    if job.kernel.startswith("sparse_"):
        # The sparse rows are also read by sparse.py (their partial-tile loop); the other
        # rows' keys do not see that module.
        from .sparse import sparse_analysis_key

        analysis += sparse_analysis_key()
    if job.arch in CONSUMER_TENSOR_FLOPS:
        # The consumer targets' tensor rate (compile.py), in their rows' keys only.
        analysis += f" tensor FLOPs per clock {CONSUMER_TENSOR_FLOPS[job.arch]}"
    return code_hash(b, ttir, options, analysis)


def code_hash(b: Build, ttir: str, options: str, analysis: str) -> str:
    """code_key's hash of a built job's TTIR and options under an analysis key."""
    import triton
    from triton.compiler.compiler import get_cache_invalidating_env_vars

    h = hashlib.sha256()
    for part in (
        f"triton {triton.__version__}",
        f"sm_{b.arch}",
        options,
        repr(sorted(get_cache_invalidating_env_vars().items())),
        analysis,
        repr((b.warps, b.scores, b.padded, b.matmuls, b.exp_least, b.int8_padded)),
        ttir,
    ):
        h.update(part.encode() + b"\n")
    return h.hexdigest()[:24]


def compile_job(job: Job) -> Result:
    """Compile one configuration for its target and read its cubin."""
    os.environ.pop("TRITON_INTERPRET", None)
    sparse_row = job.kernel.startswith("sparse_")
    if sparse_row:
        from .sparse import SparseResult, analyse_partial
    res = SparseResult(job) if sparse_row else Result(job)
    t0 = time.time()
    try:
        b = source_of(job)
        res.code = code_key(job, b)
        kernel = _compile(b.src, b.arch, b.warps, b.stages, b.options)
        analyse(res, kernel, b.warps, b.scores, b.padded, b.matmuls, b.exp_least, int8_padded=b.int8_padded)
        if sparse_row:
            analyse_partial(res, kernel, b.warps, b.scores, b.padded, b.matmuls)
    except Exception as e:  # noqa: BLE001 - any failure is a failed configuration
        msg = str(e).strip().splitlines()
        res.error = f"compile failed: {type(e).__name__}: {msg[0] if msg else ''}"[:200]
    res.seconds = time.time() - t0
    return res


def code_job(job: Job) -> str:
    """code_key of a job, in a worker process (TRITON_INTERPRET unset, as compile_job)."""
    os.environ.pop("TRITON_INTERPRET", None)
    return code_key(job)
