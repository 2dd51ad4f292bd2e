"""Compile every shipped configuration of the flash-attention kernels for real GPUs.

    python -m attnkit.kernels.inspect            # everything, for sm_80 and sm_90
    python -m attnkit.kernels.inspect --quick    # one config per kernel, head dims 40 / 128
    python -m attnkit.kernels.inspect --kernel fwd --head-dim 80 --dtype bf16 --arch 90

No GPU is needed: Triton compiles for a named target and ships ptxas and cuobjdump.
For each (kernel, head dim, dtype, tile config, target) it prints registers per thread,
stack bytes (a non-zero stack is register spilling), shared memory, and the matrix
instructions in the machine code (mma = HMMA, Ampere's; wgmma = HGMMA, Hopper's
warp-group MMA; fma = no tensor cores). It exits with status 1 if a configuration spills,
needs more shared memory than its target has, or fails to compile. Configurations that
fail are removed from flash_attention.CONFIGS rather than shipped. Each target has its
own lists there (CONFIGS["sm80"], CONFIGS["sm90"]); each is compiled for its target.

Each configuration is compiled for the bias variants the kernels specialise on: none,
key padding (one row per tile) and a full (B, H, M, N) fp32 bias; none is reliably the
heaviest. The kernels dkdv_dbias and dq_dbias are dkdv and dq when they also write the
gradient of the bias (the first sums dS over the queries in registers, the second
stores dS tiles), with their own candidates; they run only with a bias. fwd_lo is the
forward that also stores its rounding residual for the backward (16-bit only). --quick
compiles the full bias only.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

# Shared memory per block (opt-in maximum) of each target, bytes.
SMEM_LIMIT = {80: 166912, 90: 232448}  # A100: 163 KiB, H100: 227 KiB
# The sm80 lists also serve sm_86 / sm_89 (RTX 30xx / 40xx, A10, L4, L40) with 99 KiB:
# the autotuner skips candidates that do not fit there, and the first candidate of each
# list (the one used when autotuning is off) must fit.
SMEM_LIMIT_SM86 = 101376
# Registers per thread the hardware allows (255 usable); above it ptxas spills.
MAX_REGS = 255

HEAD_DIMS = (40, 64, 80, 128, 160, 256)
DTYPES = ("fp16", "bf16", "fp32")
ARCHS = (80, 90)
KERNELS = ("fwd", "dkdv", "dq", "fwd_lo", "dkdv_dbias", "dq_dbias")
DBIAS_KERNELS = ("dkdv_dbias", "dq_dbias")  # with a bias only
BIASES = ("none", "keypad", "full")


@dataclass(frozen=True)
class Job:
    kernel: str
    head_dim: int
    dtype: str
    config: tuple  # (block_m, block_n, num_warps, num_stages, reload)
    arch: int
    bias: str
    default: bool = False  # first of its list: used when autotuning is off


@dataclass
class Result:
    job: Job
    regs: int = -1
    stack: int = -1
    smem: int = -1
    matrix: str = "?"
    seconds: float = 0.0
    error: str = ""

    @property
    def problems(self) -> list[str]:
        if self.error:
            return [self.error]
        out = []
        if self.stack > 0:
            out.append(f"spills ({self.stack} B stack)")
        if self.smem > SMEM_LIMIT[self.job.arch]:
            out.append(f"shared memory {self.smem} B > {SMEM_LIMIT[self.job.arch]} B")
        elif self.job.default and self.job.arch == 80 and self.smem > SMEM_LIMIT_SM86:
            out.append(f"default config needs {self.smem} B > sm_86's {SMEM_LIMIT_SM86} B")
        if self.job.dtype != "fp32" and self.matrix == "fma":
            out.append("no tensor-core instructions")
        return out


def _fa():
    """The kernel module (the package attribute `flash_attention` is the function)."""
    import importlib

    return importlib.import_module(__package__ + ".flash_attention")


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


_PTR = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32"}


def _signature(fn, dtype: str, pointer_types: dict[str, str]) -> dict[str, str]:
    sig = {}
    for p in fn.params:
        if p.is_constexpr:
            sig[p.name] = "constexpr"
        elif p.name in pointer_types:
            sig[p.name] = pointer_types[p.name]
        elif p.name in ("qk_scale", "sm_scale"):
            sig[p.name] = "fp32"
        elif p.name[0].isupper() and p.name not in ("H", "M", "N", "M_KEY", "N_KEY"):
            sig[p.name] = _PTR[dtype]  # Q, K, V, Out, DO, DQ, DK, DV
        else:
            sig[p.name] = "i32"
    return sig


def compile_job(job: Job) -> Result:
    """Compile one configuration for its target and read its resources from the cubin."""
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fa = _fa()

    res = Result(job)
    t0 = time.time()
    try:
        fn = fa._KERNELS[job.kernel]
        pointer_types = {"Bias": "*fp32", "Lse": "*fp32", "Delta": "*fp32", "DBias": "*fp32"}
        # OutLo, like Out, has the inputs' dtype (from _PTR below).
        sig = _signature(fn, job.dtype, pointer_types)
        d0, d1 = fa.split_head_dim(job.head_dim)
        bm, bn, warps, stages, reload = job.config
        constexprs = dict(
            HEAD_DIM=job.head_dim, D0=d0, D1=d1, BLOCK_M=bm, BLOCK_N=bn, RELOAD=bool(reload),
            HAS_BIAS=job.bias != "none", BIAS_PER_KEY=job.bias == "keypad",
            # A (B, N, H, D) layout: head stride D, row stride H * D.
            ALIGN=fa._align(job.head_dim), BIAS_ALIGN=1, BIAS_CONTIG=True,
            PRECISION="tf32" if job.dtype != "fp32" else "ieee", EMULATE_BF16=False,
        )
        if job.kernel.startswith("fwd"):
            constexprs["STORE_LO"] = job.kernel == "fwd_lo"
        else:
            constexprs["BIAS_GRAD"] = job.kernel in DBIAS_KERNELS
        # Pointers are 16-byte aligned (torch allocations are); Triton's runtime
        # specialises them the same way.
        attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params)
                 if sig[p.name].startswith("*")}
        src = ASTSource(fn, sig, constexprs, attrs)
        kernel = triton.compile(src, target=GPUTarget("cuda", job.arch, 32),
                                options={"num_warps": warps, "num_stages": stages, **fa._COMPILE_OPTIONS})
        res.smem = int(kernel.metadata.shared)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "k.cubin")
            with open(path, "wb") as f:
                f.write(kernel.asm["cubin"])
            usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", path],
                                   capture_output=True, text=True, check=True).stdout
            sass = subprocess.run([_tool("cuobjdump"), "--dump-sass", path],
                                  capture_output=True, text=True, check=True).stdout
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
        res.regs = int(m.group(1))
        res.stack = int(m.group(2)) + int(m.group(4))
        res.smem += int(m.group(3))
        if "HGMMA" in sass:
            res.matrix = "wgmma"
        elif "HMMA" in sass:
            res.matrix = "mma"
        else:
            res.matrix = "fma"
    except Exception as e:  # noqa: BLE001 - any failure is a failed configuration
        msg = str(e).strip().splitlines()
        res.error = f"compile failed: {type(e).__name__}: {msg[0] if msg else ''}"[:200]
    res.seconds = time.time() - t0
    return res


def jobs_for(kernels, head_dims, dtypes, archs, biases, quick: bool, configs=None) -> list[Job]:
    import torch

    fa = _fa()

    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    jobs = []
    for kernel in kernels:
        for d in head_dims:
            for dtype in dtypes:
                if kernel == "fwd_lo" and dtype == "fp32":
                    continue  # fp32 outputs are not rounded: no residual
                if configs:
                    cands = configs
                else:
                    cands = None
                for arch in archs:
                    if cands is None:
                        shipped = fa.configs_for(kernel, d, tdt[dtype], f"sm{arch}")
                        if quick:
                            shipped = shipped[:1]
                        arch_cands = [(c.block_m, c.block_n, c.num_warps, c.num_stages, int(c.reload))
                                      for c in shipped]
                    else:
                        arch_cands = cands
                    for i, cfg in enumerate(arch_cands):
                        for bias in biases:
                            if bias == "none" and kernel in DBIAS_KERNELS:
                                continue
                            jobs.append(Job(kernel, d, dtype, tuple(cfg), arch, bias,
                                            default=cands is None and i == 0))
    return jobs


def _row(r: Result) -> str:
    j = r.job
    cfg = "M{}-N{}-w{}-s{}".format(*j.config[:4]) + ("-r" if j.config[4] else "") + ("*" if j.default else "")
    probs = r.problems
    status = "ok" if not probs else "FAIL: " + "; ".join(probs)
    return (f"{j.kernel:10} {j.head_dim:4} {j.dtype:5} {j.bias:6} {cfg:18} sm_{j.arch}  "
            f"{r.regs:4} {max(r.stack, 0):6} {r.smem:7} {r.matrix:6} {r.seconds:6.1f}  {status}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnkit.kernels.inspect", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="first config of each kernel, head dims 40 and 128, fp16 (a CI-sized check)")
    ap.add_argument("--kernel", action="append", choices=KERNELS, help="repeatable; default all")
    ap.add_argument("--head-dim", action="append", type=int, help="repeatable; default 40 64 80 128 160 256")
    ap.add_argument("--dtype", action="append", choices=("fp16", "bf16", "fp32"),
                    help="repeatable; default fp16 bf16 fp32")
    ap.add_argument("--arch", action="append", type=int, choices=ARCHS, help="repeatable; default 80 90")
    ap.add_argument("--bias", action="append", choices=BIASES,
                    help="repeatable; default none keypad full (full only with --quick)")
    ap.add_argument("--config", action="append", metavar="BM,BN,WARPS,STAGES[,RELOAD]",
                    help="compile this tile configuration instead of the shipped ones (repeatable)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compilations")
    args = ap.parse_args(argv)

    fa = _fa()

    if fa.INTERPRET:
        # The kernels were defined for Triton's interpreter; compile them in a fresh
        # interpreter-free process instead.
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        argv = sys.argv[1:] if argv is None else list(argv)
        return subprocess.run([sys.executable, "-m", "attnkit.kernels.inspect", *argv], env=env).returncode

    kernels = args.kernel or list(KERNELS)
    head_dims = args.head_dim or ([40, 128] if args.quick else list(HEAD_DIMS))
    dtypes = args.dtype or (["fp16"] if args.quick else list(DTYPES))
    archs = args.arch or list(ARCHS)
    biases = args.bias or (["full"] if args.quick else list(BIASES))
    configs = [tuple(int(x) for x in c.split(",")) for c in (args.config or [])]
    if any(len(c) not in (4, 5) for c in configs):
        ap.error("--config takes BLOCK_M,BLOCK_N,NUM_WARPS,NUM_STAGES[,RELOAD (0 or 1)]")
    configs = [c if len(c) == 5 else (*c, 0) for c in configs]
    jobs = jobs_for(kernels, head_dims, dtypes, archs, biases, args.quick, configs)

    print(f"{len(jobs)} compilations ({args.jobs} at a time); * = default config; "
          f"stack > 0 means spilled registers; "
          f"shared-memory limits: " + ", ".join(f"sm_{a} {SMEM_LIMIT[a]} B" for a in archs))
    print(f"{'kern':10} {'D':>4} {'dtype':5} {'bias':6} {'config':18} {'arch':5}  "
          f"{'regs':>4} {'stack':>6} {'smem':>7} {'matrix':6} {'secs':>6}  status")
    t0 = time.time()
    failed = 0
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            results = pool.map(compile_job, jobs)
            for r in results:
                print(_row(r), flush=True)
                failed += bool(r.problems)
    else:
        for job in jobs:
            r = compile_job(job)
            print(_row(r), flush=True)
            failed += bool(r.problems)
    print(f"{len(jobs) - failed} ok, {failed} failed, {time.time() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
