"""The consumer targets of the static report: sm_75 (T4, Colab's free GPU), sm_86 (RTX
30xx, A10) and sm_89 (RTX 40xx, L4, L40), the GPUs most diffusion users own.

Each runs the sm80 tile lists (devices.target), with less shared memory per block than
A100 (compile.SMEM_LIMIT: 64 KiB on sm_75, 99 KiB on sm_86 / sm_89). A few rows per
target, not the whole matrix: the default tile (the one used when autotuning is off) of
the exact forward and backward (fwd, dq, dkdv) at HEAD_DIMS, no bias and key padding, not
causal, pointer loads, fp16 and (sm_86 / sm_89: sm_75 has no bf16 tensor cores) bf16;
and the int8 forward's tile (int8/ops.py's sm80 TILES) at the same head dims and dtypes,
no bias. Their section of report.md puts each row's instr/score beside sm_80's same row.

The rows of sm_86 and sm_89 are gated as sm_80's are (spills, shared memory over the
target's limit, no tensor-core instructions, duplicated work); those of a (target,
kernel) in NOT_CLEAN are reported with its reason and not gated: what Triton cannot do
there is not a regression of the kernels. The backends serve no target without clean rows
(attnkit/backends: min_capability 8.0; tests/static_report/test_consumer_rows.py).
"""

from __future__ import annotations

CONSUMER_ARCHS = (75, 86, 89)
HEAD_DIMS = (40, 64, 80, 128, 160, 256)
KERNELS = ("fwd", "dq", "dkdv", "int8")
EXACT_BIASES = ("none", "keypad")
INT8_BIASES = ("none",)
# The 16-bit dtypes whose matmuls the target's tensor cores run (Turing: fp16 only).
DTYPES = {75: ("fp16",), 86: ("fp16", "bf16"), 89: ("fp16", "bf16")}

_SM75_NO_MMA = (
    "Triton {triton} emits no tensor-core instruction for sm_75: its matmul layouts (mma v2, "
    "HMMA.16816) start at sm_80 and tl.dot falls back to FMA on the CUDA cores, whose fp32 operands "
    "and accumulators crowd the registers (most tiles spill)"
)
# Why the rows of a (target, kernel) are not clean: reported beside them, not gated.
NOT_CLEAN = {
    (75, "fwd"): _SM75_NO_MMA,
    (75, "dq"): _SM75_NO_MMA,
    (75, "dkdv"): _SM75_NO_MMA,
    (75, "int8"): (
        "Triton {triton} does not compile an int8 tl.dot for sm_75: with no integer MMA layout "
        "below sm_80 (IMMA.8816 exists on Turing, Triton does not emit it) its FMA fallback "
        "converts the int8 operands with a float extension, which fails verification"
    ),
}


def is_consumer(arch: int) -> bool:
    return arch in CONSUMER_ARCHS


def tile_target(arch: int) -> str:
    """The tile lists a target runs: "sm80" for the consumer targets (devices.target)."""
    return "sm80" if is_consumer(arch) else f"sm{arch}"


def wanted(kernel: str, head_dim: int, dtype: str, arch: int, bias: str, causal: bool, tma: bool) -> bool:
    """Whether a consumer target compiles this variant (the module docstring's rows)."""
    return (
        kernel in KERNELS
        and head_dim in HEAD_DIMS
        and dtype in DTYPES[arch]
        and bias in (INT8_BIASES if kernel == "int8" else EXACT_BIASES)
        and not causal
        and not tma
    )


def gated(r) -> bool:
    """Whether a row's problems fail the run: every row but those NOT_CLEAN explains."""
    return (r.job.arch, r.job.kernel) not in NOT_CLEAN


def reason(arch: int, kernel: str) -> str:
    import triton

    text = NOT_CLEAN.get((arch, kernel), "")
    return text.format(triton=triton.__version__)


def split(results) -> tuple[list, list]:
    """(rows of sm_80 and sm_90, rows of the consumer targets)."""
    main = [r for r in results if not is_consumer(r.job.arch)]
    return main, [r for r in results if is_consumer(r.job.arch)]


def _f(x, digits: int = 3) -> str:
    return "-" if x is None or x != x else f"{x:.{digits}f}"


def _same_sm80(main) -> dict:
    """sm_80's default rows (pointer loads), by the key a consumer row is compared on."""
    return {_key(r.job): r for r in main if r.job.arch == 80 and r.job.default and not r.job.tma}


def _key(j) -> tuple:
    return (j.kernel, j.head_dim, j.dtype, j.bias, j.causal, j.piece, j.grads)


def section(main, consumer) -> list[str]:
    """report.md's section of the consumer targets: every row, clean or not (and why),
    its instr/score beside sm_80's same row (same kernel, head dim, dtype and bias, its
    default tile, pointer loads)."""
    from .compile import SMEM_LIMIT

    if not consumer:
        return []
    sm80 = _same_sm80(main)
    clean = [r for r in consumer if not r.problems]
    archs = sorted({r.job.arch for r in consumer})
    lines = [
        "",
        "## Consumer GPUs and T4 (sm_75, sm_86, sm_89)",
        "",
        "The GPUs most diffusion users own: T4 (sm_75, Colab's free GPU; "
        f"{SMEM_LIMIT[75]:,} B of shared memory per block), RTX 30xx / A10 (sm_86) and RTX 40xx / L4 / "
        f"L40 (sm_89; both {SMEM_LIMIT[86]:,} B). Each runs the sm80 lists; compiled here: the default "
        f"tile of the exact kernels ({', '.join(k for k in KERNELS if k != 'int8')}) at head dims "
        + ", ".join(map(str, HEAD_DIMS))
        + ", no bias and key padding, not causal, pointer loads, fp16 and (not on sm_75: Turing has no "
        "bf16 tensor cores) bf16"
        + (", and the int8 forward's tile, no bias" if "int8" in KERNELS else "")
        + " (tools/static_report/consumer.py). sm_80: the same row for A100 (default tile, pointer loads). "
        f"{len(clean)} of {len(consumer)} rows clean (no spills, shared memory within the target's "
        "limit, tensor-core instructions, no duplicated work).",
        "",
    ]
    for arch in archs:
        rows = [r for r in consumer if r.job.arch == arch]
        n = sum(not r.problems for r in rows)
        kernels = sorted({r.job.kernel for r in rows}, key=KERNELS.index)
        lines.append(
            f"- sm_{arch}: {n} of {len(rows)} clean ("
            + ", ".join(
                f"{k} {sum(not r.problems for r in rows if r.job.kernel == k)}/{sum(r.job.kernel == k for r in rows)}"
                for k in kernels
            )
            + ")."
        )
    notes = sorted({(r.job.arch, r.job.kernel) for r in consumer if r.problems and not gated(r)})
    if notes:
        lines += ["", "Not clean, and why (reported, not gated):", ""]
        by_reason: dict[str, list[str]] = {}
        for a, k in sorted(notes, key=lambda n: (n[0], KERNELS.index(n[1]))):
            by_reason.setdefault(reason(a, k), []).append(f"sm_{a} {k}")
        lines += [f"- {', '.join(what)}: {text}." for text, what in by_reason.items()]
    lines += [
        "",
        "Served: neither the Triton backend nor the int8 one serves sm_75 (min_capability 8.0): its "
        "rows are not clean, so auto() sends T4 calls to SDPA or xFormers. sm_86 and sm_89 run the "
        "sm80 lists as before.",
        "",
        "| target | kernel | D | dtype | bias | tile | regs | spills (B) | smem (B) | MMA | instr/score "
        "| sm_80 instr/score | / sm_80 | clean |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def order(r):
        j = r.job
        return (j.arch, KERNELS.index(j.kernel), j.head_dim, DTYPES[86].index(j.dtype), EXACT_BIASES.index(j.bias))

    for r in sorted(consumer, key=order):
        j = r.job
        ref = sm80.get(_key(j))
        theirs = ref.instr_per_score if ref is not None and not ref.error else None
        ratio = r.instr_per_score / theirs if theirs and not r.error else None
        kernel = j.kernel + (f"/{j.piece}" if j.piece >= 0 else "") + (f"/{j.grads}" if j.grads != "dkdv" else "")
        lines.append(
            f"| sm_{j.arch} | {kernel} | {j.head_dim} | {j.dtype} | {j.bias} | {j.config_name} | "
            f"{r.regs if not r.error else '-'} | {max(r.stack, 0) if not r.error else '-'} | "
            f"{r.smem if not r.error else '-'} | {r.matrix if not r.error else '-'} | "
            f"{_f(None if r.error else r.instr_per_score)} | {_f(theirs)} | {_f(ratio, 2)} | "
            f"{'yes' if not r.problems else '**no**: ' + '; '.join(r.problems)} |"
        )
    return lines
