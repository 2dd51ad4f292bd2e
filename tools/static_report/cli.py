"""Compile every shipped configuration of the flash-attention kernels for real GPUs and
read their machine code: a static performance report, and a gate.

    python -m tools.static_report            # everything, sm_80 and sm_90; writes the report
    python -m tools.static_report --quick    # the default config of each kernel at head dims 40 / 128
    python -m tools.static_report --kernel fwd --head-dim 80 --dtype bf16 --arch 90 --bias none
    python -m tools.static_report --reference 06-fused-attention.py   # beside Triton's tutorial kernel

No GPU is needed: Triton compiles for a named target and ships ptxas and cuobjdump.
For each (kernel, head dim, dtype, bias variant, causal or not, TMA or pointer loads,
tile config, target) it reads from the cubin: registers per thread, stack bytes (a
non-zero stack is register spilling), shared memory; and from the SASS of the main loop
(sass.py says how it is found): its length, the matrix instructions it issues,
its exponentials. Every figure is static: instructions in the program text.

Definitions (written into the report too):

* scores per iteration: BLOCK_M x BLOCK_N, the query-key pairs one iteration of the
  main loop computes;
* instr/score = (main-loop length x warps) / scores: warp instructions issued per score;
* exp/score = (MUFU.EX2 in the loop x 32 x warps) / scores; one per score plus the
  row rescales of the forward (1 / BLOCK_N) is the least; twice that is duplication;
* MMA duplication = matrix FLOPs the loop issues / the FLOPs its matmuls need
  (2 x scores x padded head dim per matmul: 2 matmuls forward, 3 for dQ, 4 for dK/dV);
* tensor-bound limit: the tensor cores are the limit while the warp schedulers can
  issue the loop's instructions in the time its matrix work takes. An H100 SM issues 4
  warp instructions and 4096 dense fp16/bf16 FLOPs per clock (989 TFLOP/s at 1.83 GHz
  boost over 132 SMs), an A100 SM 4 and 2048 (312 TFLOP/s, 1.41 GHz, 108 SMs), so the
  limit is instr/score <= matmuls x 2 x padded head dim x 4 / FLOPs per clock: D/256
  for the forward on H100 (D = padded head dim), D/128 on A100.

It exits with status 1 if a configuration spills, needs more shared memory than its
target has, issues no tensor-core instruction in 16 bits, duplicates matrix work or
exponentials, compiles to more instr/score than the budget written next to it in
flash_attention.CONFIGS, or fails to compile. One exception, reported but not gated:
exact fp32 (dots on the FMA units) shows about 2 exp/score: in Triton's FMA layout 16
threads share each row, and each computes the row's rescale exp2 itself, which at 16-32
keys per tile costs about as many exponentials again as the scores' own (the TTGIR has
one exp2 per score). That loop is issue-bound at about 6 instr/score, of which the extra
exponential is one; 16-bit inputs and tf32 run on tensor cores, where the gate holds,
and on GPUs auto() sends fp32 to SDPA first.

Compiled variants. The kernels specialise on the bias (none, key padding, a full
(B, H, M, N) fp32 bias), on causality, and on Hopper on TMA or pointer loads (TMA where
the tensors are 16-byte aligned; both can run). The budget gates the variant a target
runs for aligned inputs: TMA loads on sm_90 (16-bit), pointer loads elsewhere; the
pointer variant on sm_90 is gated for spills, shared memory and duplication, and its
instr/score is reported. The kernels dkdv_dbias and dq_dbias are dkdv and dq when they
also write the gradient of the bias (the first sums dS over the queries in registers,
the second stores dS tiles), with their own candidates; they run only with a bias.
fwd_lo is the forward that also stores its rounding residual for the backward (16-bit
only). --quick compiles the default (first) configuration of each list only.

The full run writes bench/results/static/report.json (every figure, with the triton
version, the commit and the date) and report.md (the tables).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, fields

from attnkit.kernels import devices, limits

from . import sass

# Shared memory per block (opt-in maximum) of each target, bytes.
SMEM_LIMIT = {80: 166912, 90: 232448}  # A100: 163 KiB, H100: 227 KiB
# The sm80 lists also serve sm_86 / sm_89 / sm_120 (RTX 30xx / 40xx / 50xx, A10, L4, L40)
# with 99 KiB: the autotuner skips candidates that do not fit there, and the first
# candidate of each list (the one used when autotuning is off) must fit, or the call be
# refused up front on those GPUs (devices.NEEDS).
SMEM_LIMIT_SM86 = devices.SM80_LEAST
# Registers per thread the hardware allows (255 usable); above it ptxas spills.
MAX_REGS = 255
# Dense 16-bit tensor-core FLOPs per clock per SM, and warp instructions issued per clock
# per SM (4 schedulers, one instruction each), by target (see the module docstring).
TENSOR_FLOPS_PER_CLOCK = {80: 2048, 90: 4096}
ISSUE_PER_CLOCK = 4
# MUFU (exp2) results per clock per SM: 16 (4 per scheduler).
EXP_PER_CLOCK = 16

HEAD_DIMS = (40, 64, 80, 96, 128, 160, 256, 320, 384, 512)
DTYPES = ("fp16", "bf16", "fp32")
ARCHS = (80, 90)
KERNELS = ("fwd", "dkdv", "dq", "fwd_lo", "dkdv_dbias", "dq_dbias")
DBIAS_KERNELS = ("dkdv_dbias", "dq_dbias")  # with a bias only
BIASES = ("none", "keypad", "full")
# Matmuls per score, by kernel: forward q k^T and p v; dQ recomputes s, dP = dO v^T and
# dS k; dK/dV recomputes s, dP, dV = p^T dO and dK = dS^T q.
MATMULS = {"fwd": 2, "fwd_lo": 2, "dq": 3, "dq_dbias": 3, "dkdv": 4, "dkdv_dbias": 4}
# Exponentials one iteration needs per score: one per score, plus the forward's
# per-row rescale alpha (1 / BLOCK_N per score, added below).
DUPLICATION_LIMIT = 1.05  # above this, a loop issues more matrix FLOPs than its matmuls need
EXP_DUPLICATION = 1.5  # above this times the least, exponentials are computed twice

REPORT_DIR = os.path.join("bench", "results", "static")


@dataclass(frozen=True)
class Job:
    kernel: str
    head_dim: int
    dtype: str
    config: tuple  # (block_m, block_n, num_warps, num_stages, reload)
    arch: int
    bias: str
    causal: bool = False
    tma: bool = False
    default: bool = False  # first of its list: used when autotuning is off
    budget: float | None = None  # instr/score this variant may not exceed (None: not gated)
    warp_specialize: bool = False  # the forward's WARP_SPEC (see check_warp_specialization)
    piece: int = -1  # the backward's PIECE: above head dim 256, one launch per head-dim piece
    grads: str = "dkdv"  # the dK/dV kernel's GRADS: above head dim 256, one launch per gradient
    maxnreg: int | None = None  # the tile's register cap (TileConfig.maxnreg)

    @property
    def band(self) -> int:
        """The head-dim band of the candidate list this job comes from."""
        return devices.band(limits.padded_head_dim(self.head_dim))

    @property
    def config_name(self) -> str:
        bm, bn, w, s, r = self.config
        return f"M{bm}-N{bn}-w{w}-s{s}" + ("-r" if r else "") + (f"-reg{self.maxnreg}" if self.maxnreg else "")


@dataclass
class Result:
    job: Job
    regs: int = -1
    stack: int = -1
    smem: int = -1
    matrix: str = "?"  # "wgmma" (HGMMA), "mma" (HMMA), "fma" (no tensor cores)
    tma_loads: bool = False  # UTMALDG in the kernel
    loop_length: int = 0  # instructions in the main loop (NOPs excluded)
    loops: int = 0  # loops holding matrix instructions
    mma_mix: dict = field(default_factory=dict)  # matrix instruction shape -> count per warp
    instr_per_score: float = float("nan")
    exp_per_score: float = float("nan")
    exp_least: float = float("nan")
    mma_duplication: float = float("nan")
    tensor_limit: float = float("nan")
    loop_mix: dict = field(default_factory=dict)  # base mnemonic -> count, main loop
    sass_digest: str = ""  # of the instruction text (addresses and encodings left out)
    seconds: float = 0.0
    error: str = ""

    @property
    def exp_limit(self) -> float:
        """The instr/score at which issuing takes as long as the exponentials: MUFU
        computes EXP_PER_CLOCK exp2 per clock per SM against ISSUE_PER_CLOCK
        instructions, so below exp/score x ISSUE / EXP the exponentials are the limit."""
        return self.exp_per_score * ISSUE_PER_CLOCK / EXP_PER_CLOCK

    @property
    def clocks_per_score(self) -> float:
        """Static estimate of the SM clocks one score costs in the main loop: the
        largest of issue (instr/score / 4), tensor work (FLOPs / FLOPs per clock) and
        exponentials (exp/score / 16). A lower bound: latency, memory and occupancy are
        not in it. The candidate lists are ordered by it."""
        issue = self.instr_per_score / ISSUE_PER_CLOCK
        if self.matrix == "fma":
            return issue
        tensor = self.tensor_limit / ISSUE_PER_CLOCK
        return max(issue, tensor, self.exp_per_score / EXP_PER_CLOCK)

    @property
    def gated(self) -> bool:
        """Whether the budget applies: the variant this target runs for aligned inputs."""
        j = self.job
        return j.budget is not None and (j.tma or j.arch != 90 or j.dtype == "fp32")

    @property
    def problems(self) -> list[str]:
        if self.error:
            return [self.error]
        j = self.job
        out = []
        if self.stack > 0:
            out.append(f"spills ({self.stack} B stack)")
        if self.smem > SMEM_LIMIT[j.arch]:
            out.append(f"shared memory {self.smem} B > {SMEM_LIMIT[j.arch]} B")
        elif j.default and j.arch == 80 and self.smem > SMEM_LIMIT_SM86 and self.smem > devices.NEEDS.get(
                needs_key(j), 0):
            out.append(f"default config needs {self.smem} B > sm_86's {SMEM_LIMIT_SM86} B, and "
                       "devices.NEEDS does not refuse the call on such GPUs")
        if j.dtype != "fp32" and self.matrix == "fma":
            out.append("no tensor-core instructions")
        if self.loop_length == 0:
            out.append("no main loop found in the SASS")
        else:
            if self.mma_duplication > DUPLICATION_LIMIT:
                out.append(f"duplicated matrix work ({self.mma_duplication:.2f}x the FLOPs)")
            if self.exp_per_score > EXP_DUPLICATION * self.exp_least and self.matrix != "fma":
                out.append(f"duplicated exponentials ({self.exp_per_score:.2f} per score)")
            if self.gated and self.instr_per_score > j.budget + 1e-9:
                out.append(f"instr/score {self.instr_per_score:.3f} > budget {j.budget}")
        return out


def needs_key(j: Job) -> tuple:
    """The devices.NEEDS key of a row."""
    return (f"sm{j.arch}", j.kernel, "32bit" if j.dtype == "fp32" else "16bit", j.band, j.bias, j.causal)


def shared_memory_needs(results) -> dict:
    """What devices.NEEDS must hold for these rows: the default tiles of the sm80 lists
    above SMEM_LIMIT_SM86, the most bytes per key."""
    needs: dict = {}
    for r in results:
        j = r.job
        if j.default and j.arch == 80 and r.smem > SMEM_LIMIT_SM86 and not r.error:
            needs[needs_key(j)] = max(needs.get(needs_key(j), 0), r.smem)
    return needs


def _flash():
    """(kernels, launch): the Triton code of the flash-attention kernels and its host side."""
    from attnkit.kernels.flash import kernels, launch

    return kernels, launch


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


_PTR = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32"}
_TORCH_NAME = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
_INTS = ("H", "M", "N", "OFF", "M_KEY", "N_KEY")


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


def _compile(src, arch: int, warps: int, stages: int, options: dict):
    import triton
    from triton.backends.compiler import GPUTarget

    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": warps, "num_stages": stages, **options})


def _read_cubin(kernel) -> tuple[str, str]:
    """(resource usage, SASS) of a compiled kernel, through cuobjdump."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", path],
                               capture_output=True, text=True, check=True).stdout
        listing = subprocess.run([_tool("cuobjdump"), "--dump-sass", path],
                                 capture_output=True, text=True, check=True).stdout
    return usage, listing


def analyse(res: Result, kernel, warps: int, scores: int, padded: int, matmuls: int, exp_least: float) -> Result:
    """Fill res from a compiled kernel: resources, and the main loop's figures."""
    usage, listing = _read_cubin(kernel)
    if os.environ.get("ATTNKIT_INSPECT_SASS"):
        # A folder to keep each listing in (for reading the loops by hand).
        j = res.job
        name = (f"{j.kernel}-d{j.head_dim}-{j.dtype}-{j.bias}{'-causal' if j.causal else ''}-"
                f"{'tma' if j.tma else 'ptr'}-{j.config_name}-sm{j.arch}.sass")
        os.makedirs(os.environ["ATTNKIT_INSPECT_SASS"], exist_ok=True)
        with open(os.path.join(os.environ["ATTNKIT_INSPECT_SASS"], name), "w") as f:
            f.write(listing)
    res.smem = int(kernel.metadata.shared)
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    res.regs = int(m.group(1))
    res.stack = int(m.group(2)) + int(m.group(4))
    res.smem += int(m.group(3))
    instrs = sass.parse(listing)
    res.sass_digest = hashlib.sha256("\n".join(i.text for i in instrs).encode()).hexdigest()[:16]
    res.matrix = "wgmma" if sass.kernel_uses(instrs, "HGMMA") else "mma" if sass.kernel_uses(instrs, "HMMA") else "fma"
    res.tma_loads = sass.kernel_uses(instrs, "UTMALDG")
    res.loops = sum(1 for lp in sass.loops(instrs) if lp.matrix_instrs)
    loop = sass.main_loop(instrs)
    if loop is None and res.matrix == "fma":
        # Exact fp32 dots: FFMA, no matrix instructions; the main loop is the
        # innermost loop with the most exponentials.
        cands = [lp for lp in sass.loops(instrs) if lp.count("MUFU.EX2")]
        loop = min(cands, key=lambda lp: (-lp.count("MUFU.EX2"), lp.start)) if cands else None
    res.exp_least = exp_least
    if loop is None:
        return res
    res.loop_length = loop.length
    res.loop_mix = dict(loop.mix().most_common())
    res.mma_mix = dict(loop.mma_shapes())
    res.instr_per_score = loop.length * warps / scores
    res.exp_per_score = loop.count("MUFU.EX2") * 32 * warps / scores
    needed = matmuls * 2.0 * scores * padded
    res.mma_duplication = loop.mma_flops(warps) / needed if res.matrix != "fma" else 1.0
    flops = TENSOR_FLOPS_PER_CLOCK[res.job.arch] if res.matrix != "fma" else float("nan")
    res.tensor_limit = matmuls * 2 * padded * ISSUE_PER_CLOCK / flops
    return res


def compile_job(job: Job) -> Result:
    """Compile one configuration for its target and read its cubin."""
    os.environ.pop("TRITON_INTERPRET", None)
    from triton.compiler import ASTSource

    fk, fl = _flash()
    res = Result(job)
    t0 = time.time()
    try:
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
        pointer_types = {"Bias": "*fp32", "Lse": "*fp32", "LseShift": "*fp32", "Delta": "*fp32",
                         "DBias": "*fp32", "Lens": "*i32", "Plain": "*i32"}
        sig = _signature(fn, job.dtype, pointer_types, descriptors)
        constexprs = dict(
            HEAD_DIM=job.head_dim, D0=d0, D1=d1, BLOCK_M=bm, BLOCK_N=bn, RELOAD=bool(reload),
            BIAS={"none": fk.NO_BIAS, "keypad": fk.KEY_BIAS, "full": fk.FULL_BIAS}[job.bias],
            CAUSAL=job.causal, TMA=job.tma,
            # A (B, N, H, D) layout: head stride D, row stride H * D.
            ALIGN=fl._align(job.head_dim), BIAS_ALIGN=1, BIAS_CONTIG=True,
            PRECISION="tf32" if job.dtype != "fp32" else "ieee", EMULATE_BF16=False,
        )
        if base == "fwd":
            constexprs["STORE_LO"] = job.kernel == "fwd_lo"
            constexprs["WARP_SPEC"] = job.warp_specialize
        else:
            constexprs["BIAS_GRAD"] = job.kernel in DBIAS_KERNELS
            constexprs["PIECE"] = job.piece
            if base == "dkdv":
                constexprs["GRADS"] = job.grads
        # Pointers are 16-byte aligned (torch allocations are); Triton's runtime
        # specialises them the same way.
        attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params)
                 if sig[p.name].startswith("*")}
        options = {**fl._COMPILE_OPTIONS, **({"maxnreg": job.maxnreg} if job.maxnreg else {})}
        kernel = _compile(ASTSource(fn, sig, constexprs, attrs), job.arch, warps, stages, options)
        exp_least = 1.0 + (1.0 / bn if base == "fwd" else 0.0)
        analyse(res, kernel, warps, bm * bn, d0 + d1, MATMULS[job.kernel], exp_least)
    except Exception as e:  # noqa: BLE001 - any failure is a failed configuration
        msg = str(e).strip().splitlines()
        res.error = f"compile failed: {type(e).__name__}: {msg[0] if msg else ''}"[:200]
    res.seconds = time.time() - t0
    return res


def _variants(kernel: str, dtype: str, arch: int, biases, causals) -> list[tuple[str, bool, bool]]:
    """(bias, causal, tma) combinations a kernel compiles to on a target."""
    tmas = (True, False) if arch == 90 and dtype != "fp32" else (False,)
    return [(bias, causal, tma) for bias in biases if not (bias == "none" and kernel in DBIAS_KERNELS)
            for causal in causals for tma in tmas]


def launches(kernel: str, head_dim: int) -> list[tuple[int, str]]:
    """(PIECE, GRADS) of each launch of a kernel at a head dim (flash_attention's
    _backward_impl): above 256 the backward runs once per head-dim piece, dK/dV also once
    per gradient; the bias gradient comes with the first dK (or dQ) launch."""
    if kernel.startswith("fwd") or head_dim <= 256:
        return [(-1, "dkdv")]
    if kernel == "dq":
        return [(0, "dkdv"), (1, "dkdv")]
    if kernel == "dq_dbias":
        return [(0, "dkdv")]
    if kernel == "dkdv":
        return [(p, g) for p in (0, 1) for g in ("dk", "dv")]
    return [(0, "dk")]  # dkdv_dbias


def jobs_for(kernels, head_dims, dtypes, archs, biases, causals, quick: bool, configs=None,
             tmas=None, budget=None) -> list[Job]:
    import torch

    _, fl = _flash()
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    jobs = []
    for kernel in kernels:
        for d in head_dims:
            for dtype in dtypes:
                if kernel == "fwd_lo" and dtype == "fp32":
                    continue  # fp32 outputs are not rounded: no residual
                for arch in archs:
                    for bias, causal, tma in _variants(kernel, dtype, arch, biases, causals):
                        if tmas is not None and tma not in tmas:
                            continue
                        if configs:
                            cands = [(c[:5], (c[5] if len(c) > 5 else 0) or None, False, budget) for c in configs]
                        else:
                            shipped = fl.configs_for(kernel, d, tdt[dtype], f"sm{arch}", bias, causal, tma)
                            if quick:
                                shipped = shipped[:1]
                            cands = [((c.block_m, c.block_n, c.num_warps, c.num_stages, int(c.reload)), c.maxnreg,
                                      i == 0, c.budget) for i, c in enumerate(shipped)]
                        for cfg, maxnreg, default, budget in cands:
                            for piece, grads in launches(kernel, d):
                                jobs.append(Job(kernel, d, dtype, tuple(cfg), arch, bias, causal, tma, default, budget,
                                                piece=piece, grads=grads, maxnreg=maxnreg))
    return order_jobs(jobs)


def _priority(j: Job) -> int:
    """Rows the targets read first, so an interrupted run still evaluates them: sm_90
    16-bit TMA defaults of the target variants, then the full-bias candidates, then the
    sm_80 defaults compared with the baseline, then everything else (fp32 and head dims
    above 256 last: the slowest to compile)."""
    from . import targets

    sixteen = j.dtype in ("fp16", "bf16")
    if j.arch == 90 and sixteen and j.tma and not j.causal and j.bias in ("none", "keypad") and j.default and (
            (j.kernel == "fwd" and j.head_dim in targets.FWD_EXACT + targets.FWD_NEAR)
            or (j.kernel in ("dkdv", "dq") and j.head_dim in targets.BWD_HEAD_DIMS)):
        return 0
    if j.arch == 90 and sixteen and j.tma and not j.causal and j.bias == "full":
        return 1
    if j.arch == 80 and j.default and not j.causal and not j.tma:
        return 2
    return 3 if sixteen and j.head_dim <= 256 else 4


def order_jobs(jobs: list[Job]) -> list[Job]:
    """jobs, the targets' rows first (stable within a priority)."""
    return sorted(jobs, key=_priority)


def _row(r: Result) -> str:
    j = r.job
    cfg = j.config_name + ("*" if j.default else "")
    probs = r.problems
    status = "ok" if not probs else "FAIL: " + "; ".join(probs)
    budget = f"{j.budget:.3f}" if j.budget is not None and r.gated else "-"
    kernel = j.kernel + (f"/{j.piece}" if j.piece >= 0 else "") + (f"/{j.grads}" if j.grads != "dkdv" else "")
    return (f"{kernel:10} {j.head_dim:4} {j.dtype:5} {j.bias:6} {'c' if j.causal else '-':1} "
            f"{'tma' if j.tma else 'ptr':3} {cfg:24} sm_{j.arch}  {r.regs:4} {max(r.stack, 0):6} {r.smem:7} "
            f"{r.matrix:5} {r.instr_per_score:6.3f} {budget:>6} {r.tensor_limit:6.3f} {r.exp_per_score:5.2f} "
            f"{r.mma_duplication:5.2f} {r.seconds:5.1f}  {status}")


HEADER = (f"{'kern':10} {'D':>4} {'dtype':5} {'bias':6} c {'ld':3} {'config':24} {'arch':5}  "
          f"{'regs':>4} {'stack':>6} {'smem':>7} {'mma':5} {'i/sc':>6} {'budget':>6} {'limit':>6} "
          f"{'exp':>5} {'dup':>5} {'secs':>5}  status")


# -- Triton's tutorial kernel, compiled the same way -------------------------------------


def load_reference(path: str):
    """The @triton.jit functions of a copy of Triton's tutorial 06-fused-attention.py,
    as a module (its autotune decorators and host code left out: they need a GPU at
    import). The file is not part of attnkit; pass where you keep one."""
    with open(path) as f:
        source = f.read()
    tree = ast.parse(source)
    parts = ["import triton\nimport triton.language as tl\n"]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            body = ast.get_source_segment(source, node)
            parts.append("@triton.jit\n" + body)
    tmp = tempfile.NamedTemporaryFile("w", suffix="_reference_attention.py", delete=False)
    tmp.write("\n\n".join(parts))
    tmp.close()
    spec = importlib.util.spec_from_file_location("attnkit_reference_attention", tmp.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The tutorial's tiles: its forward autotunes over these on sm_90 (128 x 64 on 4 warps,
# 128 x 128 on 8, TMA loads); its backward has one fixed configuration.
REFERENCE_FWD = ((128, 64, 4, 3), (128, 128, 8, 3), (128, 128, 4, 3))
REFERENCE_BWD = dict(BLOCK_M1=32, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=32, BLK_SLICE_FACTOR=2, warps=4, stages=5)


def compile_reference(path: str, head_dim: int, arch: int = 90) -> list[dict]:
    """Rows for the tutorial's forward (_attn_fwd_tma, not causal) and backward
    (_attn_bwd, which is always causal: its unmasked dK/dV and dQ loops are read) at one
    head dim, fp16, compiled like ours."""
    os.environ.pop("TRITON_INTERPRET", None)
    from triton.compiler import ASTSource

    mod = load_reference(path)
    rows = []
    for bm, bn, warps, stages in REFERENCE_FWD:
        if bn > head_dim:
            continue  # the tutorial asserts BLOCK_N <= HEAD_DIM
        fn = mod._attn_fwd_tma
        sig = {"sm_scale": "fp32", "M": "*fp32", "Z": "i32", "H": "i32", "N_CTX": "i32"}
        for name, r in (("desc_q", bm), ("desc_k", bn), ("desc_v", bn), ("desc_o", bm)):
            sig[name] = f"tensordesc<fp16[{r},{head_dim}]>"
        for p in fn.params:
            sig.setdefault(p.name, "constexpr")
        consts = dict(HEAD_DIM=head_dim, BLOCK_M=bm, BLOCK_N=bn, FP8_OUTPUT=False, STAGE=1)
        attrs = {(fn.arg_names.index("M"),): [["tt.divisibility", 16]]}
        res = Result(Job("ref_fwd", head_dim, "fp16", (bm, bn, warps, stages, 0), arch, "none", tma=True))
        try:
            kernel = _compile(ASTSource(fn, sig, consts, attrs), arch, warps, stages, {"enable_fp_fusion": True})
            analyse(res, kernel, warps, bm * bn, head_dim, 2, 1.0 + 1.0 / bn)
        except Exception as e:  # noqa: BLE001
            res.error = f"compile failed: {type(e).__name__}: {str(e).splitlines()[0][:150]}"
        rows.append(res)
    # Backward: one kernel, four loops (dK/dV masked and unmasked, dQ masked and
    # unmasked); each is told apart by its matrix FLOPs per iteration.
    fn = mod._attn_bwd
    cfg = REFERENCE_BWD
    sig = {p.name: ("constexpr" if p.is_constexpr else "*fp16") for p in fn.params}
    sig.update(sm_scale="fp32", M="*fp32", D="*fp32", stride_z="i32", stride_h="i32", stride_tok="i32", H="i32",
               N_CTX="i32", stride_d="constexpr")
    consts = {k: v for k, v in cfg.items() if k not in ("warps", "stages")}
    consts.update(HEAD_DIM=head_dim, stride_d=1)  # Triton specialises a stride of 1 into a constant
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params) if sig[p.name].startswith("*")}
    kernel = _compile(ASTSource(fn, sig, consts, attrs), arch, cfg["warps"], cfg["stages"], {"enable_fp_fusion": True})
    usage, listing = _read_cubin(kernel)
    instrs = sass.parse(listing)
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    for name, bm, bn, mm in (("ref_dkdv", cfg["BLOCK_M1"], cfg["BLOCK_N1"], 4),
                             ("ref_dq", cfg["BLOCK_M2"], cfg["BLOCK_N2"], 3)):
        need = mm * 2.0 * bm * bn * head_dim
        loop = next((lp for lp in sass.loops(instrs) if lp.matrix_instrs
                     and abs(lp.mma_flops(cfg["warps"]) / need - 1) < 0.01), None)
        res = Result(Job(name, head_dim, "fp16", (bm, bn, cfg["warps"], cfg["stages"], 0), arch, "none", True))
        res.regs, res.stack, res.smem = int(m.group(1)), int(m.group(2)), int(kernel.metadata.shared)
        res.matrix = "wgmma" if sass.kernel_uses(instrs, "HGMMA") else "mma"
        res.tma_loads = sass.kernel_uses(instrs, "UTMALDG")
        if loop is not None:
            res.loop_length = loop.length
            res.mma_mix = dict(loop.mma_shapes())
            res.loop_mix = dict(loop.mix().most_common())
            res.instr_per_score = loop.length * cfg["warps"] / (bm * bn)
            res.exp_per_score = loop.count("MUFU.EX2") * 32 * cfg["warps"] / (bm * bn)
            res.exp_least = 1.0
            res.mma_duplication = loop.mma_flops(cfg["warps"]) / need
            res.tensor_limit = mm * 2 * head_dim * ISSUE_PER_CLOCK / TENSOR_FLOPS_PER_CLOCK[arch]
        rows.append(res)
    return rows


# -- warp specialization -----------------------------------------------------------------


def check_warp_specialization(jobs: int) -> list[dict]:
    """Compile the sm_90 forward's default tiles (no bias, TMA, head dims 64 and 128)
    and a 4-warp tile with the unmasked loop marked for Triton's automatic warp
    specialization (tl.range(..., warp_specialize=True)), and compare with the plain
    compile: whether this Triton specialises anything on Hopper."""
    import torch

    _, fl = _flash()
    pairs = []
    for d in (64, 128):
        c = fl.configs_for("fwd", d, torch.float16, "sm90", "none")[0]
        for cfg in ((c.block_m, c.block_n, c.num_warps, c.num_stages, int(c.reload)), (64, 64, 4, 2, 0)):
            pairs.append([Job("fwd", d, "fp16", cfg, 90, "none", tma=True, warp_specialize=ws) for ws in (False, True)])
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(compile_job, [j for pair in pairs for j in pair]))
    out = []
    for plain, spec in zip(results[::2], results[1::2]):
        j = spec.job
        if spec.error:
            verdict = spec.error
        elif spec.sass_digest == plain.sass_digest:
            verdict = "the same machine code"
        else:
            verdict = (f"different machine code: instr/score {spec.instr_per_score:.3f} against "
                       f"{plain.instr_per_score:.3f}, {spec.regs} registers against {plain.regs}")
        out.append({"head_dim": j.head_dim, "config": j.config_name, "verdict": verdict})
    return out


# -- the report ------------------------------------------------------------------------


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=_ROOT).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _record(r: Result) -> dict:
    out = asdict(r.job)
    out.update({k: v for k, v in asdict(r).items() if k != "job"})
    out["config"] = r.job.config_name
    out["block_m"], out["block_n"], out["num_warps"], out["num_stages"], out["reload"] = r.job.config
    out["gated"] = r.gated
    out["exp_limit"] = r.exp_limit
    out["clocks_per_score"] = r.clocks_per_score
    for k in ("loop_mix", "sass_digest", "warp_specialize"):
        out.pop(k, None)  # kept out of the record: its size (rerun with ATTNKIT_INSPECT_SASS to read loops)
    out["problems"] = r.problems
    for k, v in list(out.items()):
        if isinstance(v, float) and v != v:
            out[k] = None
    return out


def source_state() -> tuple[str, bool]:
    """(commit, whether the working tree has changes) when a run starts: a label of the
    report; what keys its rows is source_key()."""
    return _git("rev-parse", "--short", "HEAD"), bool(_git("status", "--porcelain", "--", "attnkit/kernels",
                                                            "tools/static_report"))


def write_report(results: list[Result], reference: list[Result], out_dir: str, argv: list[str],
                 warp_spec: list[dict] | None = None, partial: str | None = None,
                 source: tuple[str, bool] | None = None, key: str | None = None) -> tuple[str, str]:
    """report.json (every row) and report.md (the tables, the targets) under out_dir.
    partial: what an interrupted run compiled, said at the top of both. source: the
    run's source_state() (default: now)."""
    import triton

    from . import targets

    os.makedirs(out_dir, exist_ok=True)
    for name in ("report.json", "report.md"):  # the last report is kept, never lost to a shorter run
        if os.path.exists(os.path.join(out_dir, name)):
            os.replace(os.path.join(out_dir, name), os.path.join(out_dir, name.replace("report.", "report.previous.")))
    commit, dirty = source or source_state()
    meta = {
        "what": "static figures read from SASS; no kernel was run",
        "triton": triton.__version__,
        "commit": commit,
        "dirty": dirty,
        "source_key": key or source_key(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m tools.static_report " + " ".join(argv),
        "partial": partial,
        "definitions": __doc__.split("Definitions (written into the report too):")[1].split("It exits")[0].strip(),
    }
    verdicts = targets.evaluate(results)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump({**meta, "targets": verdicts, "warp_specialization": warp_spec or [],
                   "rows": [_record(r) for r in results], "reference": [_record(r) for r in reference]}, f,
                  separators=(",", ":"))
    md = targets.markdown(meta, results, reference, verdicts, warp_spec or [])
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(md)
    return os.path.join(out_dir, "report.json"), os.path.join(out_dir, "report.md")


def _from_record(rec: dict) -> Result:
    """A row of report.json back as a Result (the loop's mix and digest are not kept)."""
    job_fields = {f.name for f in fields(Job)}
    job = Job(**{k: (tuple(v) if k == "config" else v) for k, v in rec.items() if k in job_fields and k != "config"},
              config=(rec["block_m"], rec["block_n"], rec["num_warps"], rec["num_stages"], rec["reload"]))
    res_fields = {f.name for f in fields(Result)} - {"job", "loop_mix", "sass_digest"}
    return Result(job, **{k: (float("nan") if v is None else v) for k, v in rec.items() if k in res_fields})


def render(out_dir: str) -> tuple[str, str]:
    """Write report.md (and the targets of report.json) again from the rows of
    out_dir/report.json, with the targets and notes of this checkout: for a change of
    wording or of a target, without compiling anything again. The run's own commit,
    date and command are kept."""
    import triton

    from . import targets

    path = os.path.join(out_dir, "report.json")
    with open(path) as f:
        record = json.load(f)
    if record.get("triton") != triton.__version__:
        raise SystemExit(f"{path} was compiled with triton {record.get('triton')}, this is {triton.__version__}: "
                         "rerun python -m tools.static_report instead")
    results = [_from_record(r) for r in record["rows"]]
    reference = [_from_record(r) for r in record.get("reference", [])]
    record["targets"] = targets.evaluate(results)
    with open(path, "w") as f:
        json.dump(record, f, separators=(",", ":"))
    md = targets.markdown(record, results, reference, record["targets"], record.get("warp_specialization", []))
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(md)
    return path, os.path.join(out_dir, "report.md")


# What a row's figures depend on besides triton and the row's own tile: the kernels'
# code, the limits that split the head dim, the SASS analysis, and the functions of this
# tool that compile and read a row. A row is kept (--resume) while this key is the same.
_ROW_MODULES = ("attnkit/kernels/flash/kernels.py", "attnkit/kernels/limits.py", "tools/static_report/sass.py")
_ROW_FUNCTIONS = ("compile_job", "analyse", "_read_cubin", "_compile", "_signature", "_tool", "Result", "Job")
# The host helpers of attnkit/kernels/flash/launch.py that compile_job reads.
_ROW_HELPERS = ("_align", "_COMPILE_OPTIONS")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _NoDocstrings(ast.NodeTransformer):
    """Docstrings left out: like comments, they cannot change a compiled kernel."""

    def _strip(self, node):
        self.generic_visit(node)
        body = getattr(node, "body", None)
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        return node

    visit_Module = visit_FunctionDef = visit_ClassDef = visit_AsyncFunctionDef = _strip


def _code(source: str) -> ast.Module:
    return _NoDocstrings().visit(ast.parse(source))


def _named(tree: ast.Module, names) -> list[str]:
    out = []
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names:
            out.append(ast.dump(n))
        elif isinstance(n, (ast.Assign, ast.AnnAssign)) and _assigned(n) & set(names):
            out.append(ast.dump(n))
    return out


def _assigned(node: ast.AST) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {x.id for t in targets for x in ast.walk(t) if isinstance(x, ast.Name)}  # a, b = ... too


def source_key(root: str = _ROOT) -> str:
    """A hash of what every row is compiled and analysed from (see _ROW_MODULES): the code
    only, so a comment, a docstring, a line moved or an edit of the host code elsewhere
    keeps it; the tile lists are not in it (each row carries its own tile)."""
    import triton

    h = hashlib.sha256(f"triton {triton.__version__}\n".encode())
    for rel in _ROW_MODULES:
        with open(os.path.join(root, rel)) as f:
            h.update(ast.dump(_code(f.read())).encode())
    with open(os.path.join(root, "attnkit/kernels/flash/launch.py")) as f:
        h.update("".join(_named(_code(f.read()), _ROW_HELPERS)).encode())
    here = os.path.join(root, "tools", "static_report")
    found = {}
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name)) as f:
                tree = _code(f.read())
            for n in tree.body:
                if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in _ROW_FUNCTIONS:
                    found[n.name] = ast.dump(n)
    missing = set(_ROW_FUNCTIONS) - set(found)
    if missing:
        raise RuntimeError(f"source_key: {sorted(missing)} not found in tools/static_report")
    for name in _ROW_FUNCTIONS:
        h.update(found[name].encode())
    return h.hexdigest()[:16]


def compile_spec(job: Job) -> tuple:
    """What a row is compiled from besides the source: its tile and its variant (not its
    budget or whether it is a list's default, which only gate or label it)."""
    return (job.kernel, job.head_dim, job.dtype, tuple(job.config), job.arch, job.bias, job.causal, job.tma,
            job.warp_specialize, job.piece, job.grads, job.maxnreg)


CHECKPOINT = "rows.partial.jsonl"  # rows appended as they compile; a killed run resumes from it


def _read_rows(path: str, key: str) -> dict:
    """compile_spec -> record of the rows of a report (report.json) or a checkpoint
    (jsonl) compiled from this source key."""
    if not os.path.exists(path):
        return {}
    rows = []
    with open(path) as f:
        if path.endswith(".jsonl"):
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # the line a killed run was writing
        else:
            record = json.load(f)
            rows = [dict(r, key=r.get("key", record.get("source_key"))) for r in record.get("rows", [])]
    return {compile_spec(_from_record(r).job): r for r in rows if r.get("key") == key}


def resumable_rows(out_dir: str, jobs: list[Job], key: str) -> tuple[dict, str]:
    """{job: Result} of the jobs an earlier run in out_dir compiled from the same source key
    (its report.json, and the checkpoint of a run that was stopped), each with this run's
    budget and default; and what was found."""
    found = _read_rows(os.path.join(out_dir, "report.json"), key)
    found.update(_read_rows(os.path.join(out_dir, CHECKPOINT), key))
    kept = {}
    for j in jobs:
        rec = found.get(compile_spec(j))
        if rec is not None:
            r = _from_record(rec)
            r.job = j
            kept[j] = r
    return kept, f"{len(found)} rows compiled from source key {key} in {out_dir}"


def resumable_reference(out_dir: str) -> list[Result]:
    """The tutorial kernel's rows (--reference) of out_dir/report.json, where the same
    triton compiled them."""
    import triton

    path = os.path.join(out_dir, "report.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        record = json.load(f)
    if record.get("triton") != triton.__version__:
        return []
    return [_from_record(r) for r in record.get("reference", [])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.static_report", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="the default config of each list only, head dims 40 and 128 (a CI-sized check)")
    ap.add_argument("--kernel", action="append", choices=KERNELS, help="repeatable; default all")
    ap.add_argument("--head-dim", action="append", type=int,
                    help="repeatable; default " + " ".join(map(str, HEAD_DIMS)))
    ap.add_argument("--dtype", action="append", choices=DTYPES, help="repeatable; default fp16 bf16 fp32")
    ap.add_argument("--arch", action="append", type=int, choices=ARCHS, help="repeatable; default 80 90")
    ap.add_argument("--bias", action="append", choices=BIASES, help="repeatable; default none keypad full")
    ap.add_argument("--causal", action="append", type=int, choices=(0, 1), help="repeatable; default 0 1")
    ap.add_argument("--loads", action="append", choices=("tma", "ptr"),
                    help="repeatable; default both where a target has TMA")
    ap.add_argument("--config", action="append", metavar="BM,BN,WARPS,STAGES[,RELOAD[,MAXNREG]]",
                    help="compile this tile configuration instead of the shipped ones (repeatable)")
    ap.add_argument("--budget", type=float, help="with --config: the instr/score budget to gate it on")
    ap.add_argument("--reference", metavar="FILE",
                    help="also compile Triton's tutorial fused attention (a copy of "
                         "python/tutorials/06-fused-attention.py) the same way, at head dims 64 and 128")
    ap.add_argument("--out", metavar="DIR", help=f"write report.json and report.md here (the full run: {REPORT_DIR})")
    ap.add_argument("--resume", action="store_true",
                    help="keep the rows of the report already in the output folder (a partial run's) when they "
                         "were compiled from the same kernels and analysis, and compile only the rest")
    ap.add_argument("--render", metavar="DIR", help="only write DIR/report.md again from DIR/report.json, "
                    "with this checkout's targets and notes (no compiling)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compilations")
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)

    if args.render:
        print("wrote " + " and ".join(render(args.render)))
        return 0
    _, fl = _flash()
    if fl.INTERPRET:
        # The kernels were defined for Triton's interpreter; compile them in a fresh
        # interpreter-free process instead.
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        return subprocess.run([sys.executable, "-m", "tools.static_report", *argv], env=env).returncode

    full = not any((args.quick, args.kernel, args.head_dim, args.dtype, args.arch, args.bias, args.causal,
                    args.loads, args.config))
    out_dir = args.out or (REPORT_DIR if full else None)
    kernels = args.kernel or list(KERNELS)
    head_dims = args.head_dim or ([40, 128] if args.quick else list(HEAD_DIMS))
    dtypes = args.dtype or list(DTYPES)
    archs = args.arch or list(ARCHS)
    biases = args.bias or list(BIASES)
    causals = [bool(c) for c in (args.causal or (0, 1))]
    tmas = None if not args.loads else [x == "tma" for x in args.loads]
    configs = [tuple(int(x) for x in c.split(",")) for c in (args.config or [])]
    if any(len(c) not in (4, 5, 6) for c in configs):
        ap.error("--config takes BLOCK_M,BLOCK_N,NUM_WARPS,NUM_STAGES[,RELOAD (0 or 1)[,MAXNREG (registers per "
                 "thread, up to 255)]]")
    configs = [c if len(c) >= 5 else (*c, 0) for c in configs]
    jobs = jobs_for(kernels, head_dims, dtypes, archs, biases, causals, args.quick, configs, tmas, args.budget)
    key = source_key()
    kept: dict[Job, Result] = {}
    if args.resume:
        if not out_dir:
            ap.error("--resume needs the report folder: the full run's, or --out DIR")
        kept, why = resumable_rows(out_dir, jobs, key)
        print(f"resuming: {len(kept)} of {len(jobs)} rows kept ({why})")
    todo = [j for j in jobs if j not in kept]
    source = source_state()
    checkpoint = None
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        checkpoint = open(os.path.join(out_dir, CHECKPOINT), "a")

    print(f"{len(jobs)} compilations ({args.jobs} at a time); * = default config; c = causal; "
          f"ld = loads (tma / ptr); i/sc = main-loop warp instructions per score; limit = tensor-bound "
          f"i/sc; exp = exp2 per score; dup = matrix FLOPs issued / needed; stack > 0 means spilled "
          f"registers; shared-memory limits: " + ", ".join(f"sm_{a} {SMEM_LIMIT[a]} B" for a in archs))
    print(HEADER)
    t0 = time.time()
    results = []
    # An interrupted run (Ctrl-C, or SIGTERM from a job scheduler) keeps what it compiled:
    # the report is written for those rows and says it is partial. Rerunning recompiles
    # nothing that Triton's cache holds.
    interrupted = False
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    pool = ProcessPoolExecutor(max_workers=args.jobs) if args.jobs > 1 else None
    try:
        rows = pool.map(compile_job, todo) if pool else map(compile_job, todo)
        for i, r in enumerate(rows, 1):
            results.append(r)  # before it is shown: a row on screen is a row in the report
            if checkpoint:
                checkpoint.write(json.dumps(dict(_record(r), key=key), separators=(",", ":")) + "\n")
                checkpoint.flush()
            print(_row(r), flush=True)
            if i % 50 == 0 and i < len(todo):
                print(_progress(i, len(todo), t0), file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print(f"interrupted: {len(results)} of {len(todo)} compilations done; "
              + ("writing a partial report" if out_dir else "no report written"), flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if checkpoint:
            checkpoint.close()
        if pool:
            pool.shutdown(wait=not interrupted, cancel_futures=True)
    if kept:  # in the order of the jobs
        fresh = {r.job: r for r in results}
        results = [kept.get(j) or fresh[j] for j in jobs if j in kept or j in fresh]
    failed = sum(bool(r.problems) for r in results)
    reference = []
    if out_dir and not args.reference:
        # The tutorial's rows of the report in out_dir, compiled by the same triton: the
        # tutorial's file need not be at hand again (its kernel is not ours: our source
        # key does not concern it).
        reference = resumable_reference(out_dir)
    if args.reference and not interrupted:
        for d in (64, 128):
            for r in compile_reference(args.reference, d):
                print(_row(r), flush=True)
                reference.append(r)
    print(f"{len(results) - failed} ok, {failed} failed, {time.time() - t0:.0f} s")
    if out_dir:
        warp_spec = check_warp_specialization(args.jobs) if full and not interrupted else []
        for w in warp_spec:
            print(f"warp specialization, fwd D={w['head_dim']} {w['config']} sm_90: {w['verdict']}")
        partial = f"{len(results)} of {len(jobs)} compilations (interrupted)" if interrupted else None
        if kept:
            argv = [a for a in argv if a != "--resume"] + [
                f"(resumed: {len(kept)} rows from an earlier run"
                + ("; the tutorial's rows kept from it" if reference and not args.reference else "") + ")"]
        paths = write_report(results, reference, out_dir, argv, warp_spec, partial=partial, source=source,
                             key=key)
        print("wrote " + " and ".join(paths))
        if not interrupted:
            os.remove(os.path.join(out_dir, CHECKPOINT))  # every row is in the report now
    if interrupted:
        return 130
    return 1 if failed else 0


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _progress(done: int, total: int, t0: float) -> str:
    """done/total, and the minutes left at this run's pace (the slowest rows come last)."""
    left = (time.time() - t0) / done * (total - done) / 60
    return f"[{done}/{total} compiled, at least ~{left:.0f} min left]"


if __name__ == "__main__":
    sys.exit(main())
