"""FlexAttention BlockMasks in attnkit against FlexAttention itself: time and peak memory.

    python bench/block_sparse.py                        # CPU: both parts, small sizes
    python bench/block_sparse.py --device cuda          # the GPU record (gpu_suite.sh's step "sparse")
    python bench/block_sparse.py --parts kernel --tokens 16384 --json out.json

(kernel) one attention call per mask, B=1, H heads of D, L tokens, 128-token blocks:
    random key-block lists without a mask_mod (Kandinsky 5's NABLA form) at 10-90% density,
    and a sliding window with a mask_mod. attnkit (attnkit.block_masks.block_mask_attention:
    the block-sparse kernel on CUDA, the chunked route on the CPU) against FlexAttention
    compiled (torch.compile(flex_attention), which honours the block lists) and, where the
    (M, N) scores fit, FlexAttention eager (which ignores a list-only mask's lists: its
    time is full attention's). Dense SDPA without a mask is the 100% line. The goal: time
    proportional to density, at least FlexAttention compiled's speed. Each row also gives
    attnkit's relative error against FlexAttention compiled (the same function).
(model) AnyFlow FAR (AnyFlowFARTransformer3DModel, a small config below): its processor
    builds a frame-causal BlockMask and calls diffusers' flex backend. Stock (eager flex)
    against attnkit.apply(model, attnkit.auto()) (the flex call served by attnkit), one
    forward each: time and peak memory.

Times are medians over rounds after a warm-up, the candidates interleaved per round; peak
memory is torch.cuda.max_memory_allocated on CUDA and the resident peak the call added
(Linux's VmHWM) on the CPU. Inputs are random (standard normal).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import attnkit  # noqa: E402
from attnkit.block_masks import block_mask_attention, route  # noqa: E402

BLOCK = 128
DENSITIES = (0.1, 0.3, 0.5, 0.7, 0.9)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def measure(fn, device, rounds: int) -> tuple[float, int]:
    """(median seconds, peak bytes) of fn() after one warm-up call."""
    fn()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        base = _status("VmRSS")
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else _status("VmHWM") - base
    return statistics.median(times), max(peak, 0)


def list_mask(heads: int, tokens: int, density: float, device):
    """Random key-block lists, no mask_mod: each query block sees about ``density`` of the
    key blocks, its own always (no row is blind)."""
    from torch.nn.attention.flex_attention import BlockMask

    n = -(-tokens // BLOCK)
    seen = torch.rand(1, heads, n, n, device=device) < density
    seen |= torch.eye(n, dtype=torch.bool, device=device)
    order = torch.sort((~seen).to(torch.uint8), dim=-1, stable=True).indices.to(torch.int32)
    num = seen.sum(-1).to(torch.int32)
    return BlockMask.from_kv_blocks(num, order, BLOCK_SIZE=BLOCK, seq_lengths=(tokens, tokens)), float(
        seen.float().mean()
    )


def window_mask(tokens: int, width: int, device):
    from torch.nn.attention.flex_attention import create_block_mask

    def window(b, h, q, k):
        return (q - k).abs() <= width

    bm = create_block_mask(window, None, None, tokens, tokens, device=str(device), BLOCK_SIZE=BLOCK)
    n = -(-tokens // BLOCK)
    visited = bm.kv_num_blocks.sum() + (0 if bm.full_kv_num_blocks is None else bm.full_kv_num_blocks.sum())
    return bm, float(visited) / (n * n)


def kernel_part(args, device, dtype) -> list[dict]:
    from torch.nn.attention.flex_attention import flex_attention

    h, d, tokens = args.heads, args.head_dim, args.tokens
    q, k, v = (torch.randn(1, h, tokens, d, device=device, dtype=dtype) for _ in range(3))
    compiled = torch.compile(flex_attention, dynamic=False) if args.compiled else None
    eager_fits = tokens * tokens * h * 4 * 3 < args.eager_limit_gb * 2**30
    masks = [(f"lists {p:.0%}", *list_mask(h, tokens, p, device)) for p in DENSITIES]
    masks.append((f"window {args.window}", *window_mask(tokens, args.window, device)))
    dense, dense_peak = measure(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), device, args.rounds)
    rows = []
    for name, bm, density in masks:
        row = dict(mask=name, density=density, route=route(q, k, v)[0], sdpa_dense_s=dense)
        row["attnkit_s"], row["attnkit_peak"] = measure(
            lambda bm=bm: block_mask_attention(q, k, v, bm), device, args.rounds
        )
        if compiled is not None:
            row["flex_compiled_s"], row["flex_compiled_peak"] = measure(
                lambda bm=bm: compiled(q, k, v, block_mask=bm), device, args.rounds
            )
            ours, theirs = block_mask_attention(q, k, v, bm).float(), compiled(q, k, v, block_mask=bm).float()
            row["rel_error_vs_flex_compiled"] = float((ours - theirs).norm() / theirs.norm())
        if eager_fits:
            row["flex_eager_s"], row["flex_eager_peak"] = measure(
                lambda bm=bm: flex_attention(q, k, v, block_mask=bm), device, max(1, args.rounds // 2)
            )
        rows.append(row)
        print(_kernel_line(row), flush=True)
    return rows


def _ms(x):
    return "-" if x is None else f"{x * 1e3:.2f}"


def _mib(x):
    return "-" if x is None else f"{x / 2**20:.0f}"


def _kernel_line(r: dict) -> str:
    ratio = r["attnkit_s"] / r["sdpa_dense_s"]
    vs = r.get("flex_compiled_s")
    speedup = "-" if vs is None else f"{vs / r['attnkit_s']:.2f}"
    return (
        f"| {r['mask']} | {r['density']:.2f} | {r['route']} | {_ms(r['attnkit_s'])} | {ratio:.2f} | "
        f"{_ms(vs)} | {speedup} | {_ms(r.get('flex_eager_s'))} | "
        f"{_mib(r['attnkit_peak'])} | {_mib(r.get('flex_compiled_peak'))} | {_mib(r.get('flex_eager_peak'))} | "
        f"{r.get('rel_error_vs_flex_compiled', float('nan')):.1e} |"
    )


KERNEL_HEADER = (
    "| mask | density | attnkit route | attnkit ms | / dense SDPA | flex compiled ms | flex compiled / attnkit "
    "| flex eager ms | attnkit MiB | flex compiled MiB | flex eager MiB | error vs flex compiled |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)

FAR = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=4,
    attention_head_dim=32,
    in_channels=4,
    out_channels=4,
    text_dim=32,
    freq_dim=32,
    ffn_dim=128,
    num_layers=2,
    cross_attn_norm=True,
    rope_max_seq_len=64,
    compressed_patch_size=(1, 4, 4),
    full_chunk_limit=2,
)


def model_part(args, device, dtype) -> list[dict]:
    from diffusers import AnyFlowFARTransformer3DModel

    torch.manual_seed(0)
    model = AnyFlowFARTransformer3DModel(**FAR).to(device=device, dtype=dtype).eval()
    f, side = args.frames, args.latent
    inputs = dict(
        hidden_states=torch.randn(1, f, 4, side, side, device=device, dtype=dtype),
        timestep=torch.rand(1, f, device=device, dtype=dtype) * 1000,
        r_timestep=torch.rand(1, f, device=device, dtype=dtype) * 1000,
        encoder_hidden_states=torch.randn(1, 8, 32, device=device, dtype=dtype),
        chunk_partition=[1] * (f // 2) + [f - f // 2],
    )

    def run():
        with torch.no_grad():
            return model(**inputs, return_dict=False)[0]

    rows = []
    stock_s, stock_peak = measure(run, device, args.rounds)
    reference = run().float()
    applied = attnkit.apply(model, attnkit.auto())
    try:
        ours_s, ours_peak = measure(run, device, args.rounds)
        err = float((run().float() - reference).norm() / reference.norm())
        served = sum(1 for r in applied.routes.values() if r.served)
    finally:
        applied.undo()
    tokens = f * (side // 2) ** 2
    rows.append(
        dict(
            model="AnyFlowFARTransformer3DModel",
            tokens=tokens,
            stock_eager_flex_s=stock_s,
            stock_peak=stock_peak,
            attnkit_s=ours_s,
            attnkit_peak=ours_peak,
            served_modules=served,
            rel_error_vs_stock=err,
        )
    )
    print(
        f"| AnyFlow FAR, {f} frames of {side}x{side} latents ({tokens} tokens) | {_ms(stock_s)} | {_mib(stock_peak)} "
        f"| {_ms(ours_s)} | {_mib(ours_peak)} | {served} | {err:.1e} |",
        flush=True,
    )
    return rows


MODEL_HEADER = (
    "| model | stock (eager flex) ms | stock MiB | attnkit ms | attnkit MiB | modules served | error vs stock |\n"
    "|---|---|---|---|---|---|---|"
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="default: float16 on CUDA, float32 on the CPU")
    ap.add_argument("--parts", default="kernel,model", help="any of kernel, model")
    ap.add_argument("--tokens", type=int, default=None, help="kernel part (default 16384 on CUDA, 2048 on the CPU)")
    ap.add_argument("--heads", type=int, default=None, help="kernel part (default 8 on CUDA, 2 on the CPU)")
    ap.add_argument("--head-dim", type=int, default=None, help="kernel part (default 128 on CUDA, 64 on the CPU)")
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=None, help="default 10 on CUDA, 3 on the CPU")
    ap.add_argument("--frames", type=int, default=8, help="model part: latent frames")
    ap.add_argument("--latent", type=int, default=32, help="model part: latent height and width")
    ap.add_argument(
        "--compiled", action=argparse.BooleanOptionalAction, default=None, help="FlexAttention compiled (CUDA: on)"
    )
    ap.add_argument("--eager-limit-gb", type=float, default=8.0, help="run eager flex where its scores fit this")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.float16 if cuda else torch.float32)
    args.tokens = args.tokens or (16384 if cuda else 2048)
    args.heads = args.heads or (8 if cuda else 2)
    args.head_dim = args.head_dim or (128 if cuda else 64)
    args.rounds = args.rounds or (10 if cuda else 3)
    args.compiled = cuda if args.compiled is None else args.compiled
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - {"kernel", "model"})
    if unknown:
        ap.error(f"--parts: {', '.join(unknown)} is not a part; pick from kernel, model")
    torch.manual_seed(0)
    out: dict = dict(device=str(device), dtype=str(dtype), args=vars(args))
    if "kernel" in parts:
        print(
            f"## BlockMask attention: 1 x {args.heads} heads x {args.tokens} tokens x {args.head_dim}, {dtype}, "
            f"{BLOCK}-token blocks\n\n{KERNEL_HEADER}",
            flush=True,
        )
        out["kernel"] = kernel_part(args, device, dtype)
        print()
    if "model" in parts:
        print(f"## A BlockMask model, one forward, {dtype}\n\n{MODEL_HEADER}", flush=True)
        out["model"] = model_part(args, device, dtype)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
