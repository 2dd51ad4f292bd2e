"""attnkit's Triton kernel against SDPA, forward, 16-bit: a full (B, H, M, N) bias, and plain
calls at head dims 40, 64 and 128 against cuDNN's SDPA; attnkit's lossy INT8 attention
(attnkit-int8) beside them, its rel. diff against SDPA being what it costs in accuracy,
and with its quality guard at the default cadence (attnkit-int8-guard-default) and
checking every call (attnkit-int8-guard-every-call): what the guard costs.

    python bench/checks/kernels16/kernels16.py --section OUT.json [--seconds 30]
    python bench/checks/kernels16/kernels16.py --small --section OUT.json   # CPU: the plumbing only

Shapes are the models': SD1.5 at 512x512 (2 x 8 heads x 4096 tokens, D=40), SDXL (2 x 10 x
4096, D=64), Flux at 1024x1024 (1 x 24 x 4608, D=128), Wan 2.1 1.3B at 480p, 81 frames
(1 x 12 x 32760, D=128). The bias is an additive float
tensor of the inputs' dtype in its full (B, H, M, N) shape (Flux's: 1 GB in 16 bits).
Each implementation runs once untimed (its first call: compilation, autotuning, cuDNN's
plan; reported as "first call s"), then `--reps` times between CUDA events; the median is
the figure, TFLOP/s from attnkit.kernels.limits.attention_flops (forward: 4 B H M N D).
SDPA pinned to a kernel (sdpa_kernel) that cannot take the call is a row with torch's
reason. Cases are measured in the order below until `--seconds` is spent; the rest are
listed as not reached. The result is a section file (attnkit.bench.sections) that
bench/gpu_suite.sh merges into the record's results.json and table.md; stdout has the
same table. Needs a CUDA GPU (with --small, the CPU: tiny shapes, no Triton).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from attnkit.bench.env import environment
from attnkit.bench.measure import describe
from attnkit.bench.sections import section
from attnkit.bench.wording import fmt_num, md_table
from attnkit.kernels.limits import attention_flops

# (name, B, H, M, N, D, what)
PLAIN = [
    ("d40", 2, 8, 4096, 4096, 40, "SD1.5 512x512 self-attention"),
    ("d64", 2, 10, 4096, 4096, 64, "SDXL 1024x1024, 64x64 level"),
    ("d128", 1, 24, 4608, 4608, 128, "Flux 1024x1024, 4096 image + 512 text tokens"),
    ("wan-d128", 1, 12, 32760, 32760, 128, "Wan 2.1 1.3B 480x832, 81 frames (21 x 30 x 52 tokens)"),
]
# (name, B, H, M, N, D, dtype, what): fp16 at SDXL's shape, bf16 (Flux's dtype) at Flux's
BIASED = [
    ("bias-d64", 2, 10, 4096, 4096, 64, torch.float16, "SDXL shape, full (B, H, M, N) additive bias"),
    ("bias-d128", 1, 24, 4608, 4608, 128, torch.bfloat16, "Flux shape, full (B, H, M, N) additive bias"),
]


def sdpa(kernel: str | None):
    """F.scaled_dot_product_attention, pinned to one of its kernels where `kernel` names one."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }

    def call(q, k, v, bias):
        if kernel is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        with sdpa_kernel(backends[kernel]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    return call


def attnkit_kernel():
    from attnkit.kernels import flash_attention

    def call(q, k, v, bias):
        return flash_attention(q, k, v, bias)

    return call


def attnkit_int8():
    """attnkit's INT8 attention (lossy; docs/int8.md): its rel. diff is its error."""
    from attnkit.kernels.int8 import int8_attention

    def call(q, k, v, bias):
        return int8_attention(q, k, v, bias)

    return call


def attnkit_int8_guard_default():
    """auto(lossy="int8") with its quality guard at the default cadence (the first call of
    a signature and one in 64 after it): what a user who turns int8 on gets."""
    from attnkit.choose.auto import AutoChooser

    chooser = AutoChooser(lossy="int8")

    def call(q, k, v, bias):
        return chooser.attention("kernels16", q, k, v, bias, None, False)

    return call


def attnkit_int8_guarded():
    """auto(lossy="int8") with its quality guard checking every call (every=1): against
    attnkit-int8, what one check costs (32 query rows exactly, one host sync). The
    default checks one call in 64."""
    from attnkit.choose.auto import AutoChooser

    chooser = AutoChooser(lossy="int8", guard={"every": 1})

    def call(q, k, v, bias):
        return chooser.attention("kernels16", q, k, v, bias, None, False)

    return call


def implementations(device: torch.device, biased: bool) -> dict:
    # SDPA as it dispatches first: the reference of the others' "rel. diff"
    cuda = device.type == "cuda"
    impls = {
        "sdpa": lambda: sdpa(None),
        "attnkit": attnkit_kernel if cuda else None,
        "attnkit-int8": attnkit_int8 if cuda else None,
        "attnkit-int8-guard-default": attnkit_int8_guard_default if cuda else None,
        "attnkit-int8-guard-every-call": attnkit_int8_guarded if cuda else None,
        "sdpa-cudnn": lambda: sdpa("cudnn"),
        "sdpa-efficient": lambda: sdpa("efficient"),
    }
    if not biased:
        impls["sdpa-flash"] = lambda: sdpa("flash")
    return impls


def timed(fn, args: tuple, reps: int, device: torch.device) -> tuple[float, float, torch.Tensor]:
    """(first call seconds, median seconds of `reps` calls after it, the first call's output)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    out = fn(*args)
    sync()
    first = time.perf_counter() - start
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(*args)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - t)
    return first, statistics.median(times), out


def run(args) -> dict:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    deadline = time.monotonic() + args.seconds
    cases = [(name, B, H, M, N, D, torch.float16, what, False) for name, B, H, M, N, D, what in PLAIN]
    cases += [(*c, True) for c in BIASED]
    results: list[dict] = []
    try:
        _cases(cases, results, args, device, deadline)
    except KeyboardInterrupt:  # a time limit's SIGINT: what was measured is kept, the rest named
        done = {r["case"] for r in results}
        results += [
            {
                "case": f"{c[0]} {str(c[6]).replace('torch.', '')}",
                "what": c[7],
                "skipped": "interrupted (the step's time limit)",
            }
            for c in cases
            if f"{c[0]} {str(c[6]).replace('torch.', '')}" not in done
        ]
    return {"device": str(device), "reps": args.reps, "cases": results}


def _cases(cases: list, results: list, args, device: torch.device, deadline: float) -> None:
    """Each case in turn, its entry in `results` before its first call (an interrupt keeps
    the implementations already measured)."""
    for name, B, H, M, N, D, dtype, what, biased in cases:
        if args.small:
            B, H, M, N = 1, 2, min(M, 128), min(N, 128)
        label = f"{name} {str(dtype).replace('torch.', '')}"
        if time.monotonic() > deadline:
            results.append({"case": label, "what": what, "skipped": f"time budget ({args.seconds:.0f} s) spent"})
            continue
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, n, D, generator=gen).to(device, dtype) for n in (M, N, N))
        bias = torch.randn(B, H, M, N, generator=gen).to(device, dtype) if biased else None
        flops = attention_flops(B, H, M, N, D)
        rows: dict = {}
        results.append(
            {
                "case": label,
                "what": what,
                "shape": {"B": B, "H": H, "M": M, "N": N, "D": D},
                "bias": "full (B, H, M, N), additive" if biased else None,
                "impls": rows,
            }
        )
        ref = None
        for impl, make in implementations(device, biased).items():
            if make is None:
                rows[impl] = {"reason": "Triton kernels run on CUDA"}
                continue
            try:
                call = make()
                with torch.inference_mode():
                    first, median, out = timed(call, (q, k, v, bias), args.reps, device)
                entry = {"first_call_s": first, "median_s": median, "tflops": flops / median / 1e12}
                if impl == "sdpa":
                    ref = out.float()
                elif ref is not None:
                    entry["rel_diff_vs_sdpa"] = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                rows[impl] = entry
                del out
            except Exception as exc:  # noqa: BLE001 - a kernel that cannot take the call is a row
                rows[impl] = {"reason": describe(exc, 100)}
        del q, k, v, bias, ref
        if device.type == "cuda":
            torch.cuda.empty_cache()


def markdown(data: dict) -> str:
    rows = []
    for case in data["cases"]:
        if "skipped" in case:
            rows.append([case["case"], "–", "–", "–", "–", "–", f"not reached: {case['skipped']}"])
            continue
        s = case["shape"]
        dims = f"{s['B']}x{s['H']}x{s['M']}x{s['N']}x{s['D']}"
        impls = case["impls"]
        cudnn = impls.get("sdpa-cudnn", {}).get("median_s")
        best = min((r["median_s"] for n, r in impls.items() if n != "attnkit" and "median_s" in r), default=None)
        for impl, r in impls.items():
            if "median_s" not in r:
                rows.append([case["case"], impl, dims, "–", "–", "–", r.get("reason", "")])
                continue
            vs = [
                f"x{r['median_s'] / cudnn:.2f} of cuDNN" if cudnn else "",
                f"x{r['median_s'] / best:.2f} of the best SDPA" if best and impl == "attnkit" else "",
            ]
            diff = f"rel. diff vs sdpa {r['rel_diff_vs_sdpa']:.1e}" if "rel_diff_vs_sdpa" in r else ""
            rows.append(
                [
                    case["case"],
                    impl,
                    dims,
                    f"{r['median_s'] * 1e6:.0f}",
                    fmt_num(r["tflops"]),
                    fmt_num(r["first_call_s"], 2),
                    "; ".join(x for x in (*vs, diff) if x),
                ]
            )
    return (
        f"Forward, median of {data['reps']} calls between CUDA events after a first call (its seconds "
        "apart); time ratio to cuDNN's SDPA (below 1: faster).\n\n"
        + md_table(
            ["case", "implementation", "B x H x M x N x D", "median us", "TFLOP/s", "first call s", "vs / note"], rows
        )
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--section", help="write the section file here (for the record's results.json)")
    ap.add_argument("--seconds", type=float, default=30.0, help="stop starting cases after this many seconds")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--device", default=None)
    ap.add_argument("--small", action="store_true", help="tiny shapes (a CPU check of the plumbing)")
    args = ap.parse_args(argv)
    data = run(args)
    text = markdown(data)
    print(text)
    if args.section:
        command = "python bench/checks/kernels16/kernels16.py " + " ".join(argv if argv is not None else sys.argv[1:])
        out = section(
            "kernels16",
            "16-bit kernels against SDPA: full bias, and head dims 40/64/128 against cuDNN",
            text,
            data,
            command,
            environment(torch.device(data["device"]), []),
        )
        with open(args.section, "w") as f:
            json.dump(out, f, indent=2, default=str)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
