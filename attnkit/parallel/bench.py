"""Benchmark of context parallelism: ring, Ulysses and a 2-D mesh on 1, 2 and 4 gloo
ranks on this machine (measured), and the same strategies on 8 GPUs on NVLink (a MODEL,
from attnkit.parallel.model; not a measurement).

    python -m attnkit.parallel.bench                 # SD and video shapes, 1/2/4 ranks
    python -m attnkit.parallel.bench --quick         # tiny shapes: under a minute on 2 CPU cores
    python -m attnkit.parallel.bench --out cp.json   # also write the rows as JSON

Per strategy and shape: the median time of one forward call (the slowest rank's, each
call started together after a barrier), and the bytes each rank sent, counted by the
transfers themselves, next to the model's count for the same shape. Ranks run one
thread each and share this machine's cores: with more ranks than cores the times
include waiting for a core.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from . import model
from .api import context_parallel_attention
from .comm import count_bytes
from .local import math_attention


@dataclass(frozen=True)
class BenchShape:
    name: str
    batch: int
    heads: int
    tokens: int
    head_dim: int
    what: str


# Measured on the CPU: real models' attention, shortened where a CPU would take minutes.
SHAPES = {
    # SD1.5 at 512x512: the first UNet level's self-attention, 64x64 latents = 4096 tokens,
    # 8 heads of 40
    "sd15-512": BenchShape("sd15-512", 1, 8, 4096, 40, "SD1.5 512x512, first-level self-attention"),
    # Wan2.1 1.3B at 480x832: 12 heads of 128; latents 60x104 patched 2x2 = 30x52 tokens a
    # frame; 2 latent frames here (3120 tokens), 21 for an 81-frame clip (32760)
    "wan-480p-2f": BenchShape("wan-480p-2f", 1, 12, 3120, 128, "Wan2.1 1.3B 480x832, 2 latent frames"),
}
QUICK = {
    "tiny": BenchShape("tiny", 1, 4, 256, 16, "tiny (a smoke run)"),
    "tiny-odd": BenchShape("tiny-odd", 1, 4, 257, 16, "tiny, uneven shards"),
}

# Modelled on 8 GPUs, bf16: the shapes the measured ones stand for, at full size.
MODEL_SHAPES = [
    model.Shape(2, 8, 4096, 4096, 40, 2),  # SD1.5 512x512, batch 2 (guidance)
    model.Shape(1, 12, 32760, 32760, 128, 2),  # Wan2.1 1.3B 480x832, 81 frames
    model.Shape(1, 40, 75600, 75600, 128, 2),  # Wan2.1 14B 720x1280, 81 frames (21x45x80)
    model.Shape(1, 24, 118800, 118800, 128, 2),  # HunyuanVideo 720x1280, 129 frames (33x45x80)
]
MODEL_NAMES = ["sd15-512 (B=2)", "wan1.3b-480p-81f", "wan14b-720p-81f", "hunyuan-720p-129f"]


def strategies(ranks: int) -> list[tuple[str, int, int]]:
    """(name, ring degree, ulysses degree) measured on this many ranks."""
    if ranks == 1:
        return [("one device", 1, 1)]
    out = [(f"ring {ranks}", ranks, 1), (f"ulysses {ranks}", 1, ranks)]
    if ranks == 4:
        out.append(("mesh 2x2", 2, 2))
    return out


# -- one rank --------------------------------------------------------------------------------


def _groups(ranks: int, ring: int, ulysses: int):
    """(ring_group, ulysses_group) of this rank on a ring x ulysses mesh (ring major).
    Every rank creates every group, in the same order."""
    import torch.distributed as dist

    rank = dist.get_rank()
    if ring == ranks:
        return dist.group.WORLD, None
    if ulysses == ranks:
        return None, dist.group.WORLD
    mine_u = mine_r = None
    for r in range(ring):
        g = dist.new_group([r * ulysses + u for u in range(ulysses)])
        if rank // ulysses == r:
            mine_u = g
    for u in range(ulysses):
        g = dist.new_group([r * ulysses + u for r in range(ring)])
        if rank % ulysses == u:
            mine_r = g
    return mine_r, mine_u


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _measure(shape: BenchShape, ranks: int, ring: int, ulysses: int, repeats: int, groups) -> dict:
    import torch.distributed as dist

    rank = dist.get_rank() if ranks > 1 else 0
    n = _split(shape.tokens, ranks)[rank]
    g = torch.Generator().manual_seed(1234 + rank)
    q, k, v = (torch.randn(shape.batch, n, shape.heads, shape.head_dim, generator=g).transpose(1, 2) for _ in range(3))
    if ranks > 1 and shape.heads % ulysses:
        return {"skipped": f"{shape.heads} heads do not divide among {ulysses} ranks"}

    def call():
        if ranks == 1:
            return math_attention(q, k, v)[0]
        return context_parallel_attention(q, k, v, ring_group=groups[0], ulysses_group=groups[1])

    call()  # warm-up
    times, sent = [], []
    for _ in range(repeats):
        if ranks > 1:
            dist.barrier()
        with count_bytes() as c:
            t0 = time.perf_counter()
            call()
            t = time.perf_counter() - t0
        times.append(t)
        sent.append(c.bytes_sent - c.by_kind.get("meta", 0))
    if ranks > 1:
        stats = torch.tensor([[statistics.median(times), float(sent[-1])]], dtype=torch.float64)
        everyone = [torch.zeros_like(stats) for _ in range(ranks)]
        dist.all_gather(everyone, stats)
        slowest = max(float(s[0, 0]) for s in everyone)
        per_rank = [float(s[0, 1]) for s in everyone]
    else:
        slowest, per_rank = statistics.median(times), [0.0]
    mshape = model.Shape(shape.batch, shape.heads, shape.tokens, shape.tokens, shape.head_dim, 4)
    modelled = model.estimate(mshape, model.H100_NVLINK, ring, ulysses).bytes_per_rank if ranks > 1 else 0.0
    return {
        "seconds": slowest,
        "bytes_mean": sum(per_rank) / len(per_rank),
        "bytes_max": max(per_rank),
        "model_bytes": modelled,
        "spread": (max(times) - min(times)) if len(times) > 1 else 0.0,
    }


def _rank_main(rank: int, ranks: int, rdzv: str, out_path: str, shapes: list, repeats: int, timeout_s: float):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{rdzv}", rank=rank, world_size=ranks, timeout=datetime.timedelta(seconds=timeout_s)
    )
    rows = []
    for name, ring, ulysses in strategies(ranks):
        groups = _groups(ranks, ring, ulysses)
        for shape in shapes:
            res = _measure(shape, ranks, ring, ulysses, repeats, groups)
            row = {"ranks": ranks, "strategy": name, "shape": shape.name, **res}
            rows.append(row)
            if rank == 0:
                print(f"  [{ranks} ranks] {name:<11} {shape.name:<13} " + _brief(row), flush=True)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def _brief(row: dict) -> str:
    if "skipped" in row:
        return f"skipped: {row['skipped']}"
    return f"{row['seconds'] * 1e3:9.1f} ms  {row['bytes_mean'] / 2**20:8.2f} MiB sent per rank"


def _run_ranks(ranks: int, shapes: list, repeats: int, timeout_s: float) -> list[dict]:
    if ranks == 1:
        torch.set_num_threads(1)
        rows = []
        for shape in shapes:
            row = {
                "ranks": 1,
                "strategy": "one device",
                "shape": shape.name,
                **_measure(shape, 1, 1, 1, repeats, (None, None)),
            }
            print(f"  [1 rank ] one device  {shape.name:<13} " + _brief(row), flush=True)
            rows.append(row)
        return rows
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="attnkit-cp-bench-") as tmp:
        out_path = os.path.join(tmp, "rows.json")
        procs = [
            ctx.Process(
                target=_rank_main, args=(r, ranks, os.path.join(tmp, "rdzv"), out_path, shapes, repeats, timeout_s)
            )
            for r in range(ranks)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.exitcode is None]
        for r in hung:
            procs[r].kill()
        failed = [r for r, p in enumerate(procs) if p.exitcode not in (0, None)]
        if hung or failed or not os.path.exists(out_path):
            raise RuntimeError(f"{ranks} ranks: still running after {timeout_s:.0f} s: {hung}; failed: {failed}")
        with open(out_path) as f:
            return json.load(f)


# -- output ----------------------------------------------------------------------------------


def measured_table(rows: list[dict]) -> str:
    lines = [
        "| ranks | strategy | shape | ms per call | MiB sent per rank (mean / max) | model bytes / measured |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['ranks']} | {r['strategy']} | {r['shape']} | – | {r['skipped']} | – |")
            continue
        ratio = f"{r['model_bytes'] / r['bytes_mean']:.3f}" if r["bytes_mean"] else "–"
        lines.append(
            f"| {r['ranks']} | {r['strategy']} | {r['shape']} | {r['seconds'] * 1e3:.1f} | "
            f"{r['bytes_mean'] / 2**20:.2f} / {r['bytes_max'] / 2**20:.2f} | {ratio} |"
        )
    return "\n".join(lines)


def model_table(machine: model.Machine = model.H100_NVLINK, ranks: int = 8) -> str:
    lines = [
        f"MODEL, not a measurement: {machine.name}; forward, bf16; compute at "
        f"{machine.attn_efficiency:.0%} of {machine.peak_flops / 1e12:.0f} TFLOP/s, links at "
        f"{machine.bandwidth / 1e9:.0f} GB/s per direction, {machine.latency_s * 1e6:.0f} us per transfer; "
        f"the link moves {machine.balance * 1e3:.2f} bytes per 1000 FLOP (attnkit/parallel/model.py).",
        "",
        "| shape | strategy | ms per call | MiB sent per rank | bytes per 1000 FLOP | speed-up over one GPU |",
        "|---|---|---|---|---|---|",
    ]
    layouts = [(1, 1), (ranks, 1), (1, ranks), (2, ranks // 2), (ranks // 2, 2)]
    for name, shape in zip(MODEL_NAMES, MODEL_SHAPES):
        one = model.estimate(shape, machine)
        for ring, ulysses in layouts:
            if shape.heads % ulysses:
                label = "ulysses" if ring == 1 else f"mesh {ring}x{ulysses}"
                lines.append(f"| {name} | {label} | – | {shape.heads} heads do not divide among {ulysses} | – | – |")
                continue
            e = model.estimate(shape, machine, ring, ulysses)
            lines.append(
                f"| {name} | {e.strategy} | {e.total_s * 1e3:.2f} | {e.bytes_per_rank / 2**20:.1f} | "
                f"{e.bytes_per_flop * 1e3:.3f} | {one.total_s / e.total_s:.2f}x |"
            )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="attnkit bench --parallel", description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1,2,4", help="rank counts to measure, comma-separated (default 1,2,4)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"measured shapes: {', '.join(SHAPES)}")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny shapes: under a minute on two CPU cores "
        "(24 s idle, about 40 s busy), nearly all of it starting the rank processes",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per measurement (median reported)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before the ranks are stopped")
    parser.add_argument("--out", help="write the measured rows and the model table as JSON here")
    parser.add_argument("--no-model", action="store_true", help="leave out the 8-GPU model")
    args = parser.parse_args(argv)

    table = QUICK if args.quick else SHAPES
    names = list(QUICK) if args.quick else [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [n for n in names if n not in table]
    if unknown:
        parser.error(f"unknown shape(s) {unknown}; choose from {', '.join(table)}")
    shapes = [table[n] for n in names]
    ranks = [int(r) for r in args.ranks.split(",")]
    bad = [r for r in ranks if r not in (1, 2, 4)]
    if bad:
        parser.error(f"--ranks {bad}: measured on 1, 2 or 4 ranks (4 adds the 2x2 mesh)")

    print(
        f"attnkit context parallelism, measured on this machine ({os.cpu_count()} CPUs, gloo, "
        f"torch {torch.__version__}, float32, math local attention)",
        flush=True,
    )
    for s in shapes:
        print(f"  {s.name}: {s.what}: B={s.batch}, H={s.heads}, {s.tokens} tokens, head dim {s.head_dim}", flush=True)
    rows = []
    for r in ranks:
        start = time.monotonic()
        print(f"[{r} rank(s)] starting", flush=True)
        rows.extend(_run_ranks(r, shapes, args.repeats, args.timeout))
        print(f"[{r} rank(s)] done in {time.monotonic() - start:.1f} s", flush=True)
    print()
    print(measured_table(rows))
    mt = "" if args.no_model else model_table()
    if mt:
        print()
        print(mt)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "measured": rows,
                    "model": mt,
                    "date": datetime.date.today().isoformat(),
                    "torch": torch.__version__,
                    "cpus": os.cpu_count(),
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
