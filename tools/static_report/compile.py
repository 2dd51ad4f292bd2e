"""One row of the static report: a tile configuration compiled for its target, its cubin
read (Job, analyse, Result, and the figures they gate on).

What a row is compiled from, its code key and compile_job are in build.py. The functions
and classes named in key.ROW_FUNCTIONS are found by name in this package and hashed into
the source key (key.source_key): a change of their code makes every row stale; a comment
or a docstring does not.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

from attnkit.kernels import devices, limits

from . import sass

# Shared memory per block (opt-in maximum) of each target, bytes.
# A100: 163 KiB, H100: 227 KiB; the consumer targets (consumer.py): T4 64 KiB (opt-in),
# RTX 30xx / 40xx 99 KiB.
SMEM_LIMIT = {80: 166912, 90: 232448, 75: 65536, 86: 101376, 89: 101376}
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
# The consumer targets' dense 16-bit tensor FLOPs per clock per SM (consumer.py): 1024 on
# sm_75 (T4: 65 TFLOP/s, 40 SMs, 1.59 GHz), sm_86 and sm_89 (A10 / L4 / L40 and the RTX
# 30xx / 40xx with 16-bit accumulation; GeForce cards halve it with float32 accumulation,
# which the kernels use: their tensor-bound limit is then twice the one reported).
# Added apart from the literal above, which the sm_80 / sm_90 rows' code keys hash
# (key.ANALYSIS): these are in the consumer rows' code keys only (build.code_key).
CONSUMER_TENSOR_FLOPS = {75: 1024, 86: 1024, 89: 1024}
TENSOR_FLOPS_PER_CLOCK.update(CONSUMER_TENSOR_FLOPS)
# Dense int8 tensor-core operations per clock against 16-bit FLOPs: twice as many on
# sm_80-89 (A100: 624 TOPS against 312 TFLOP/s) and on sm_90 (H100: 1979 against 989).
INT8_RATE = 2
ISSUE_PER_CLOCK = 4
# MUFU (exp2) results per clock per SM: 16 (4 per scheduler).
EXP_PER_CLOCK = 16

DBIAS_KERNELS = ("dkdv_dbias", "dq_dbias")  # with a bias only
# Matmuls per score, by kernel: forward q k^T and p v; dQ recomputes s, dP = dO v^T and
# dS k; dK/dV recomputes s, dP, dV = p^T dO and dK = dS^T q.
# The int8 forward (attnkit/kernels/int8) has the forward's two: q8 k8^T in int8 (the
# first, on integer tensor cores at INT8_RATE x), p v in 16 bits.
MATMULS = {"fwd": 2, "fwd_lo": 2, "dq": 3, "dq_dbias": 3, "dkdv": 4, "dkdv_dbias": 4, "int8": 2}
# The block-sparse kernels (tools/static_report/sparse.py) have their dense kernels' matmuls.
MATMULS.update(sparse_fwd=2, sparse_dq=3, sparse_dkdv=4)
# Exponentials one iteration needs per score: one per score, plus the forward's
# per-row rescale alpha (1 / BLOCK_N per score, added below).
DUPLICATION_LIMIT = 1.05  # above this, a loop issues more matrix FLOPs than its matmuls need
EXP_DUPLICATION = 1.5  # above this times the least, exponentials are computed twice


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
    # "wgmma" (HGMMA), "mma" (HMMA), "fma" (no tensor cores); a kernel with integer
    # matrix instructions (the int8 forward's Q.K): "igmma" (IGMMA) or "imma" (IMMA).
    matrix: str = "?"
    tma_loads: bool = False  # UTMALDG in the kernel
    loop_length: int = 0  # instructions in the main loop (NOPs excluded)
    loops: int = 0  # loops holding matrix instructions
    mma_mix: dict = field(default_factory=dict)  # matrix instruction shape -> count per warp
    instr_per_score: float = float("nan")
    exp_per_score: float = float("nan")
    exp_least: float = float("nan")
    # The int8 forward: its Q.K matmul's FLOPs are counted at its padded width (DQ0 + DQ1)
    # and at INT8_RATE x the 16-bit rate, its P.V matmul's as any 16-bit matmul's.
    mma_duplication: float = float("nan")
    tensor_limit: float = float("nan")
    loop_mix: dict = field(default_factory=dict)  # base mnemonic -> count, main loop
    sass_digest: str = ""  # of the instruction text (addresses and encodings left out)
    seconds: float = 0.0
    error: str = ""
    # What the figures are a function of (build.code_key): the kernel's Triton IR, its
    # target, compile options and analysis; "" for a row compiled before code keys.
    code: str = ""

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
        elif (
            j.default
            and j.arch == 80
            and self.smem > SMEM_LIMIT_SM86
            and self.smem > devices.NEEDS.get(needs_key(j), 0)
        ):
            out.append(
                f"default config needs {self.smem} B > sm_86's {SMEM_LIMIT_SM86} B, and "
                "devices.NEEDS does not refuse the call on such GPUs"
            )
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
    above SMEM_LIMIT_SM86, the most bytes per key. The int8 forward is not the flash
    backend's, whose calls devices.NEEDS refuses: its rows above that are reported as
    problems, not listed; nor are the block-sparse kernels' (flash/sparse.py launches them
    without consulting devices.NEEDS)."""
    needs: dict = {}
    for r in results:
        j = r.job
        if (
            j.default
            and j.arch == 80
            and r.smem > SMEM_LIMIT_SM86
            and not r.error
            and j.kernel != "int8"
            and not j.kernel.startswith("sparse_")
        ):
            needs[needs_key(j)] = max(needs.get(needs_key(j), 0), r.smem)
    return needs


def _compile(src, arch: int, warps: int, stages: int, options: dict):
    import triton
    from triton.backends.compiler import GPUTarget

    return triton.compile(
        src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps, "num_stages": stages, **options}
    )


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _read_cubin(kernel) -> tuple[str, str]:
    """(resource usage, SASS) of a compiled kernel, through cuobjdump."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        usage = subprocess.run(
            [_tool("cuobjdump"), "--dump-resource-usage", path], capture_output=True, text=True, check=True
        ).stdout
        listing = subprocess.run(
            [_tool("cuobjdump"), "--dump-sass", path], capture_output=True, text=True, check=True
        ).stdout
    return usage, listing


def analyse(
    res: Result, kernel, warps: int, scores: int, padded: int, matmuls: int, exp_least: float, int8_padded: int = 0
) -> Result:
    """Fill res from a compiled kernel: resources, and the main loop's figures.
    int8_padded: the padded width of one int8 matmul among the matmuls (the int8
    forward's Q.K), run at INT8_RATE x the 16-bit rate; 0: every matmul in 16 bits."""
    usage, listing = _read_cubin(kernel)
    if os.environ.get("ATTNKIT_INSPECT_SASS"):
        # A folder to keep each listing in (for reading the loops by hand).
        j = res.job
        name = (
            f"{j.kernel}-d{j.head_dim}-{j.dtype}-{j.bias}{'-causal' if j.causal else ''}-"
            f"{'tma' if j.tma else 'ptr'}-{j.config_name}-sm{j.arch}.sass"
        )
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
    res.matrix = (
        "igmma"
        if sass.kernel_uses(instrs, "IGMMA")
        else "imma"
        if sass.kernel_uses(instrs, "IMMA")
        else "wgmma"
        if sass.kernel_uses(instrs, "HGMMA")
        else "mma"
        if sass.kernel_uses(instrs, "HMMA")
        else "fma"
    )
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
    wide = matmuls - (1 if int8_padded else 0)  # the 16-bit matmuls
    needed = wide * 2.0 * scores * padded + 2.0 * scores * int8_padded
    res.mma_duplication = loop.mma_flops(warps) / needed if res.matrix != "fma" else 1.0
    flops = TENSOR_FLOPS_PER_CLOCK[res.job.arch] if res.matrix != "fma" else float("nan")
    res.tensor_limit = (wide * 2 * padded + 2 * int8_padded / INT8_RATE) * ISSUE_PER_CLOCK / flops
    return res
