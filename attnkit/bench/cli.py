"""`attnkit bench`: Stable Diffusion speed and memory per attention processor.

    attnkit bench                         # the device's default preset, tables 1-4
    attnkit bench --preset sd15-512 --tables 1 --out results/
    attnkit bench --processors vanilla,sdpa --steps 20 --dtype fp16 --compile off

Prints markdown tables on stdout; with --out DIR also writes results.json, table.md and
PNG plots there. Exit status 0 when the run completed (cells may still say n/a or
failed: that is a result), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

PROG = "attnkit bench"


def build_parser() -> argparse.ArgumentParser:
    from .presets import DEFAULT_CPU_PRESET, DEFAULT_CUDA_PRESET, PRESETS

    ap = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Stable Diffusion it/s, latency ladder, batch sweep and peak memory per attention "
            "processor, as in the published diffusers/PyTorch 2.0 tables."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="presets:\n" + "\n".join(f"  {n:10s} {p.label}" for n, p in PRESETS.items())
        + f"\n\ndefault preset: {DEFAULT_CUDA_PRESET} on CUDA, {DEFAULT_CPU_PRESET} on CPU.",
    )
    ap.add_argument("--preset", choices=list(PRESETS), help="standard setting (default: by device)")
    ap.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available)")
    ap.add_argument("--tables", default="1,2,3,4", help="which tables, e.g. 1,4 (default: 1,2,3,4)")
    ap.add_argument("--processors", default="all", help="comma-separated processor names, or all (default)")
    ap.add_argument("--steps", type=int, help="denoising steps (table 1)")
    ap.add_argument("--resolution", type=int, help="image side in pixels (latents are /8)")
    ap.add_argument("--batch", type=int, help="prompts per run (tables 1 and 4)")
    ap.add_argument("--dtype", choices=["float32", "fp32", "float16", "fp16", "bfloat16", "bf16"], help="precision of tables 1 and 4")
    ap.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                    help="torch.compile the UNet. auto (default): the ladder's compile row and the sweep's compiled "
                         "runs on CUDA, table 1 eager as the published table; off on the CPU. on: also table 1, "
                         "and on the CPU. off: nowhere")
    ap.add_argument("--compile-mode", default=None, help="torch.compile mode (default: torch's default)")
    ap.add_argument("--repeats", type=int, help="timed runs per configuration")
    ap.add_argument("--warmup-steps", type=int, help="steps of the (untimed) warm-up run")
    ap.add_argument("--skip-steps", type=int, help="first steps left out of the steady-state it/s")
    ap.add_argument("--ladder-steps", type=int, help="steps per image in the ladder (table 2)")
    ap.add_argument("--sweep-max-batch", type=int, help="largest batch of the sweep (table 3)")
    ap.add_argument("--sweep-dtypes", help="precisions of the sweep, e.g. float32,float16")
    ap.add_argument("--sweep-steps", type=int, help="steps per sweep run")
    ap.add_argument("--sweep-repeats", type=int, help="timed runs per processor and batch in the sweep")
    ap.add_argument("--model", metavar="PATH_OR_ID",
                    help="load real weights from a local directory or the local Hugging Face cache (no download)")
    ap.add_argument("--out", metavar="DIR", help="write results.json, table.md and plots here")
    ap.add_argument("--mem-cap", type=float, metavar="GIB",
                    help="CPU: address-space cap of the sweep's subprocess beyond its start (default: 75%% of available memory)")
    ap.add_argument("--budget", type=float, metavar="SECONDS",
                    help="time budget of the whole run (default: the preset's; cpu-small 170 s); each table gets a "
                         "share of what is left when it starts, and work past it is skipped and marked")
    ap.add_argument("--seed", type=int, default=0, help="seed of weights, latents and embeddings")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    return ap


def _available_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def quiet_diffusers() -> None:
    """diffusers' info/warning logs (e.g. on casting a model) would bury the tables."""
    try:
        from diffusers.utils import logging as dlogging

        dlogging.set_verbosity_error()
    except Exception:  # noqa: BLE001
        pass


def parse_tables(spec: str) -> list[str]:
    tables = [t.strip() for t in spec.split(",") if t.strip()]
    bad = [t for t in tables if t not in ("1", "2", "3", "4")]
    if bad or not tables:
        raise ValueError(f"--tables takes numbers 1-4 separated by commas, got {spec!r}")
    return list(dict.fromkeys(tables))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = build_parser()
    args = ap.parse_args(argv)

    import torch

    from . import report
    from .child import preset_to_spec, run_child
    from .env import environment
    from .models import build_model, dtype_label, load_model
    from .presets import DEFAULT_CPU_PRESET, DEFAULT_CUDA_PRESET, get_preset
    from .availability import resolve_names
    from .measure import Deadline
    from .tables import Context, it_per_s, ladder, memory_cuda, sweep

    warnings.filterwarnings("ignore", category=FutureWarning)
    quiet_diffusers()
    try:
        tables = parse_tables(args.tables)
        processors = resolve_names(args.processors)
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda, but torch sees no CUDA device")
    except ValueError as exc:
        ap.error(str(exc))
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    preset = get_preset(args.preset or (DEFAULT_CUDA_PRESET if device.type == "cuda" else DEFAULT_CPU_PRESET))
    sweep_dtypes = tuple(s.strip() for s in args.sweep_dtypes.split(",")) if args.sweep_dtypes else None
    preset = preset.with_overrides(
        steps=args.steps, resolution=args.resolution, batch=args.batch, dtype=args.dtype, repeats=args.repeats,
        warmup_steps=args.warmup_steps, skip_steps=args.skip_steps, ladder_steps=args.ladder_steps,
        sweep_max_batch=args.sweep_max_batch, sweep_dtypes=sweep_dtypes, sweep_steps=args.sweep_steps,
        sweep_repeats=args.sweep_repeats, budget=args.budget,
    )
    if args.compile == "auto":
        compile_, compile_t1 = preset.compile and device.type == "cuda", False
    else:
        compile_ = compile_t1 = args.compile == "on"
    progress = not args.no_progress

    start = time.perf_counter()
    run_deadline = Deadline(preset.budget)
    env = environment(device, argv)
    notes: list[str] = []
    if device.type == "cuda":
        # As the PyTorch 2.0 post: fast fp32 matmuls (TF32) where the GPU has them.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        notes.append("TF32 matmuls on (torch.backends.cuda.matmul.allow_tf32), as in the PyTorch 2.0 post")
    print(f"{PROG}: {env['device_name']} | preset {preset.name} | processors {','.join(processors)} | "
          f"tables {','.join(tables)} | compile {'on' if compile_ else 'off'}"
          f"{' (table 1 too)' if compile_t1 else ''}", file=sys.stderr)

    build_start = time.perf_counter()
    if args.model:
        model = load_model(args.model, device, preset.dtype)
    else:
        model = build_model(preset, device, preset.dtype, seed=args.seed)
    model_info = {
        "source": model.source, "family": model.family, "dtype": dtype_label(model.dtype),
        "unet_parameters": sum(p.numel() for p in model.unet.parameters()),
        "build_seconds": time.perf_counter() - build_start,
    }
    print(f"{PROG}: model ready in {model_info['build_seconds']:.1f} s ({model.source})", file=sys.stderr)
    device_name = env["device_name"] if device.type == "cuda" else "cpu"
    ctx = Context(model=model, preset=preset, processors=processors, device=device, device_name=device_name,
                  compile=compile_, compile_table1=compile_t1, progress=progress, seed=args.seed, budget=None,
                  compile_mode=args.compile_mode)

    results: dict = {
        "schema": report.SCHEMA, "environment": env, "preset": preset.to_dict(), "model": model_info,
        "processors": processors, "compile": {"tables_2_3": compile_, "table_1": compile_t1}, "tables": {}, "notes": notes, "elapsed_seconds": 0.0,
        "table_seconds": {},
    }
    child_base = {"preset": preset_to_spec(preset), "seed": args.seed, "device": "cpu",
                  "model_path": args.model, "threads": torch.get_num_threads()}
    cap = int(args.mem_cap * (1 << 30)) if args.mem_cap else int((_available_memory_bytes() or 8 << 30) * 0.75)

    def table3():
        if device.type == "cuda":
            return sweep(ctx)
        out = run_child({**child_base, "task": "sweep", "processors": processors, "compile": compile_,
                         "mem_cap_bytes": cap, "device_name": device_name,
                         "deadline_epoch": None if ctx.budget is None else time.time() + ctx.budget}, timeout=1800)
        if "runs" not in out:
            raise RuntimeError(f"sweep subprocess: {out.get('status')}: {out.get('reason')}")
        return out

    def table4():
        if device.type == "cuda":
            return memory_cuda(ctx)
        from .availability import availability
        from .progress import progress_bar

        avail = availability(processors, model.unet, device, model.dtype, preset.batch, ctx.tokens)
        deadline = ctx.deadline()
        cells: dict = {}
        todo = []
        for name in processors:
            proc, status, reason = avail[name]
            if proc is None:
                cells[name] = {"name": name, "status": status, "reason": reason}
            else:
                todo.append(name)

        def measure(name: str) -> dict:
            if todo.index(name) >= 2 and deadline.expired():  # the first pair always runs
                return {"name": name, "status": "skipped", "reason": "time budget"}
            # one thread each, two at a time: peak memory does not depend on the speed
            return run_child({**child_base, "task": "memory", "processor": name, "threads": 1}, timeout=1800)

        from concurrent.futures import ThreadPoolExecutor

        with progress_bar(len(todo), "table 4: memory (one process each)", progress) as bar:
            with ThreadPoolExecutor(max_workers=2) as pool:
                for name, result in zip(todo, pool.map(measure, todo)):
                    cells[name] = result
                    bar.update(1)
        cells = {name: cells[name] for name in processors}
        return {
            "title": "peak memory per processor",
            "method": "peak resident memory (VmHWM) of the denoising loop, each processor in its own process",
            "setting": {"resolution": preset.resolution, "steps": preset.memory_steps, "batch": preset.batch,
                        "dtype": dtype_label(model.dtype)},
            "cells": cells,
        }

    runners = {"1": lambda: it_per_s(ctx), "2": lambda: ladder(ctx), "3": table3, "4": table4}
    # Shares of the budget: what each table costs on the CPU preset, roughly.
    weights = {"1": 0.32, "2": 0.25, "3": 0.25, "4": 0.18}
    for i, key in enumerate(tables):
        left = run_deadline.left()
        share = weights[key] / sum(weights[k] for k in tables[i:])
        ctx.budget = None if left is None else max(left, 0.0) * share
        t0 = time.perf_counter()
        interrupted = False
        try:
            results["tables"][key] = runners[key]()
        except KeyboardInterrupt:  # a time limit's SIGINT: keep what the other tables measured
            results["tables"][key] = {"error": "interrupted"}
            interrupted = True
        except Exception as exc:  # noqa: BLE001 - one table's failure must not lose the others
            from .measure import classify_error

            status, reason = classify_error(exc)
            results["tables"][key] = {"error": f"{status}: {reason}"}
        results["table_seconds"][key] = time.perf_counter() - t0
        if interrupted:
            break
        print(f"{PROG}: table {key} done in {results['table_seconds'][key]:.0f} s", file=sys.stderr)

    results["elapsed_seconds"] = time.perf_counter() - start
    print(report.render_markdown(results))
    if args.out:
        paths = report.write_all(results, args.out)
        print(f"{PROG}: wrote {', '.join(os.path.basename(p) for p in paths)} to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
