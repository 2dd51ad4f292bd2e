"""`attnkit bench`: speed and memory per attention processor, on the model of a preset.

    attnkit bench                         # the device's default preset (Stable Diffusion), tables 1-4
    attnkit bench --preset sd15-512 --tables 1 --out results/
    attnkit bench --processors vanilla,sdpa --steps 20 --dtype fp16 --compile off
    attnkit bench --preset flux           # table 5: Flux, attnkit against diffusers' backends
    attnkit bench --parallel ARGS...      # attnkit.parallel.bench with ARGS

Prints markdown tables on stdout; with --out DIR also writes results.json, table.md and
PNG plots there. Exit status 0 when the run completed (cells may still say n/a or
failed: that is a result), 2 on bad arguments. ``main`` reads as what it does:
parse -> preset -> model -> run -> report.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any

from attnkit.text import describe_exception

from . import report
from .availability import resolve_names
from .context import Context
from .dit_model import build_transformer
from .dit_settings import resolve_settings
from .env import available_memory_bytes, environment, load_average, quiet_diffusers
from .measure import Deadline
from .models import build_model, dtype_label, load_model
from .presets import BY_DEVICE, DEFAULT_CPU_PRESET, DEFAULT_CUDA_PRESET, PRESETS, get_preset
from .progress import EXTRA_HINT, missing_extras
from .tables import ladder_kinds, run_tables

PROG = "attnkit bench"

# Knobs of the Stable Diffusion tables only: refused with a transformer preset.
SD_ONLY = (
    "resolution",
    "ladder_steps",
    "sweep_max_batch",
    "sweep_dtypes",
    "sweep_steps",
    "sweep_repeats",
    "model",
    "mem_cap",
    "compile_mode",
    "processors",
    "ladder_rows",
)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Stable Diffusion it/s, latency ladder, batch sweep and peak memory per attention processor, "
            "as in the published diffusers/PyTorch 2.0 tables (tables 1-4); a transformer's forward per step "
            "with attnkit against diffusers' attention backends (table 5)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="presets:\n"
        + "\n".join(f"  {n:11s} {p.label}" for n, p in PRESETS.items())
        + "\n"
        + "\n".join(f"  {n:11s} {full} on CUDA, {cpu} elsewhere" for n, (full, cpu) in BY_DEVICE.items())
        + f"\n\ndefault preset: {DEFAULT_CUDA_PRESET} on CUDA, {DEFAULT_CPU_PRESET} on CPU.",
    )
    ap.add_argument("--preset", help="standard setting (default: by device); see the list below")
    ap.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available)")
    ap.add_argument("--tables", help="which tables, e.g. 1,4 (default: the preset's: 1,2,3,4 or 5)")
    ap.add_argument(
        "--processors",
        default=None,
        help="tables 1-4: comma-separated processor names, or all (default: all, the references last)",
    )
    ap.add_argument(
        "--attention",
        default=None,
        help="table 5: ways of setting attention (stock, native, flash, sage, attnkit, attnkit.apply), "
        "or all (default)",
    )
    ap.add_argument("--steps", type=int, help="denoising steps (table 1) / forward steps per run (table 5)")
    ap.add_argument("--resolution", type=int, help="image side in pixels (latents are /8)")
    ap.add_argument("--batch", type=int, help="prompts per run (tables 1 and 4) / transformer batch (table 5)")
    ap.add_argument(
        "--dtype",
        choices=["float32", "fp32", "float16", "fp16", "bfloat16", "bf16"],
        help="precision of tables 1, 4 and 5",
    )
    ap.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        default="auto",
        help="torch.compile the model. auto (default): on CUDA the ladder's torch.compile and CUDA-graph "
        "rows, the sweep's compiled runs and table 5's compiled rows, table 1 eager as the published "
        "table; off on the CPU. on: also table 1, and on the CPU. off: nowhere",
    )
    ap.add_argument(
        "--compile-mode",
        default=None,
        help="torch.compile mode of table 1, the sweep and the ladder's torch.compile rows (default: "
        "torch's default; the ladder's CUDA-graph rows are always reduce-overhead)",
    )
    ap.add_argument(
        "--compile-backend",
        default="inductor",
        help="torch.compile backend (default inductor; 'eager' traces without compiling, for tests)",
    )
    ap.add_argument(
        "--ladder-rows",
        default=None,
        help="table 2's kinds of row, in order: base (fp32 -> half -> channels_last -> compile), eager, "
        "compile, cudagraphs (one row per processor each), or all (default)",
    )
    ap.add_argument("--repeats", type=int, help="rounds of timed runs at most (samples per cell)")
    ap.add_argument("--warmup-steps", type=int, help="steps of the (untimed) warm-up run")
    ap.add_argument("--skip-steps", type=int, help="first steps left out of the steady-state rate")
    ap.add_argument("--ladder-steps", type=int, help="steps per image in the ladder (table 2)")
    ap.add_argument("--sweep-max-batch", type=int, help="largest batch of the sweep (table 3)")
    ap.add_argument("--sweep-dtypes", help="precisions of the sweep, e.g. float32,float16")
    ap.add_argument("--sweep-steps", type=int, help="steps per sweep run")
    ap.add_argument("--sweep-repeats", type=int, help="timed runs per processor and batch in the sweep")
    ap.add_argument(
        "--model",
        metavar="PATH_OR_ID",
        help="load real weights from a local directory or the local Hugging Face cache (no download)",
    )
    ap.add_argument("--out", metavar="DIR", help="write results.json, table.md and plots here")
    ap.add_argument(
        "--mem-cap",
        type=float,
        metavar="GIB",
        help="CPU: address-space cap of the sweep's subprocess beyond its start (default: 75%% of available memory)",
    )
    ap.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="time budget of the whole run, model build included (default: the preset's; cpu-small "
        "200 s); each table gets a share of what is left when it starts, and work past it is "
        "skipped and marked",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of weights, latents and embeddings")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument(
        "--parallel",
        nargs=argparse.REMAINDER,
        metavar="ARGS",
        help="first argument only: hand ARGS to attnkit.parallel.bench (the multi-GPU benchmark)",
    )
    return ap


@dataclass
class Request:
    """What the command line asks for, checked and resolved against the device."""

    args: argparse.Namespace
    device: Any  # torch.device
    preset: Any  # Preset | TransformerPreset
    tables: list[str]
    names: list[str]  # processors (tables 1-4) or ways of setting attention (table 5)
    compile: bool
    compile_table1: bool


def run_parallel(argv: list[str]) -> int:
    """`attnkit bench --parallel ARGS`: attnkit.parallel.bench.main(ARGS), or exit 2 saying why not."""

    try:
        from attnkit.parallel.bench import main as parallel_main
    except ImportError as exc:
        missing = getattr(exc, "name", None) or ""
        if missing in ("attnkit.parallel", "attnkit.parallel.bench"):
            print(
                f"{PROG} --parallel: this attnkit has no multi-GPU benchmark (attnkit.parallel.bench is "
                "not installed); install an attnkit that ships attnkit.parallel",
                file=sys.stderr,
            )
        else:
            print(
                f"{PROG} --parallel: attnkit.parallel.bench could not be imported: {describe_exception(exc)}",
                file=sys.stderr,
            )
        return 2
    return int(parallel_main(list(argv)) or 0)


def parse_tables(spec: str, allowed: tuple[str, ...]) -> list[str]:
    tables = [t.strip() for t in spec.split(",") if t.strip()]
    bad = [t for t in tables if t not in allowed]
    if bad or not tables:
        raise ValueError(f"--tables takes {', '.join(allowed)} (separated by commas) with this preset, got {spec!r}")
    return list(dict.fromkeys(tables))


def make_request(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Request:
    """The preset with the command line's overrides; bad arguments exit 2 with the reason."""
    import torch

    try:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda, but torch sees no CUDA device")
        preset = get_preset(
            args.preset or (DEFAULT_CUDA_PRESET if device.type == "cuda" else DEFAULT_CPU_PRESET), device.type
        )
        tables = parse_tables(args.tables or ",".join(preset.tables), preset.tables)
        common = dict(
            steps=args.steps,
            batch=args.batch,
            dtype=args.dtype,
            repeats=args.repeats,
            warmup_steps=args.warmup_steps,
            skip_steps=args.skip_steps,
            budget=args.budget,
        )
        if preset.kind == "transformer":
            given = [f"--{k.replace('_', '-')}" for k in SD_ONLY if getattr(args, k) is not None]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: Stable Diffusion options; preset {preset.name} runs table 5 "
                    "(its options: --attention, --steps, --batch, --dtype, --repeats, --budget, --compile)"
                )
            preset = preset.with_overrides(**common)
            compile_ = device.type == "cuda" if args.compile == "auto" else args.compile == "on"
            return Request(args, device, preset, tables, resolve_settings(args.attention), compile_, False)
        if args.attention is not None:
            raise ValueError(f"--attention is table 5's option; preset {preset.name} runs tables 1-4 (--processors)")
        sweep_dtypes = tuple(s.strip() for s in args.sweep_dtypes.split(",")) if args.sweep_dtypes else None
        preset = preset.with_overrides(
            resolution=args.resolution,
            ladder_steps=args.ladder_steps,
            sweep_max_batch=args.sweep_max_batch,
            sweep_dtypes=sweep_dtypes,
            sweep_steps=args.sweep_steps,
            sweep_repeats=args.sweep_repeats,
            **common,
        )
        names = resolve_names(args.processors)
        ladder_kinds(args.ladder_rows)
    except ValueError as exc:
        ap.error(str(exc))  # exits 2
    if args.compile == "auto":
        compile_, compile_t1 = preset.compile and device.type == "cuda", False
    else:
        compile_ = compile_t1 = args.compile == "on"
    return Request(args, device, preset, tables, names, compile_, compile_t1)


def build(request: Request):
    """The model under test, and what results.json says about it."""
    start = time.perf_counter()
    if request.preset.kind == "transformer":
        model = build_transformer(request.preset, request.device, seed=request.args.seed)
        net = model.transformer
        info = {"source": model.source, "family": model.family}
    else:
        if request.args.model:
            model = load_model(request.args.model, request.device, request.preset.dtype)
        else:
            model = build_model(request.preset, request.device, request.preset.dtype, seed=request.args.seed)
        net = model.unet
        info = {"source": model.source, "family": model.family}

    info.update(
        dtype=dtype_label(model.dtype),
        parameters=sum(p.numel() for p in net.parameters()),
        build_seconds=time.perf_counter() - start,
    )
    return model, info


def run(request: Request, model, model_info: dict, env: dict, deadline) -> dict:
    """Every table asked for, in order, within the budget: the results dict."""

    args = request.args
    notes: list[str] = []
    if request.device.type == "cuda":
        notes.append("TF32 matmuls on (torch.backends.cuda.matmul.allow_tf32), as in the PyTorch 2.0 post")
    device_name = env["device_name"] if request.device.type == "cuda" else "cpu"
    cap = int(args.mem_cap * (1 << 30)) if args.mem_cap else int((available_memory_bytes() or 8 << 30) * 0.75)
    ctx = Context(
        model=model,
        preset=request.preset,
        processors=request.names,
        device=request.device,
        device_name=device_name,
        compile=request.compile,
        compile_table1=request.compile_table1,
        progress=not args.no_progress,
        seed=args.seed,
        compile_mode=args.compile_mode,
        compile_backend=args.compile_backend,
        ladder_rows=ladder_kinds(args.ladder_rows),
        model_path=args.model,
        mem_cap_bytes=cap,
        build_seconds=model_info["build_seconds"],
    )
    results: dict = {
        "schema": report.SCHEMA,
        "environment": env,
        "preset": request.preset.to_dict(),
        "model": model_info,
        "processors": request.names,
        "compile": {"tables_2_3": request.compile, "table_1": request.compile_table1, "backend": args.compile_backend},
        "budget_seconds": request.preset.budget,
        "notes": notes,
        "elapsed_seconds": 0.0,
    }
    results["tables"], results["table_seconds"] = run_tables(
        ctx, request.tables, deadline, lambda text: print(f"{PROG}: {text}", file=sys.stderr)
    )
    env["load_average_end"] = load_average()
    return results


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--parallel"]:
        return run_parallel(argv[1:])
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.parallel is not None:
        ap.error("--parallel hands every argument after it to attnkit.parallel.bench: put it first")

    import torch

    warnings.filterwarnings("ignore", category=FutureWarning)
    quiet_diffusers()
    request = make_request(ap, args)  # parse -> preset
    if args.threads:
        torch.set_num_threads(args.threads)
    if request.device.type == "cuda":  # as the PyTorch 2.0 post: fast fp32 matmuls (TF32) where the GPU has them
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    missing = missing_extras()
    if missing:
        what = " and ".join({"matplotlib": "plots", "tqdm": "progress bars"}[m] for m in missing)
        print(f"{PROG}: no {what}: {' and '.join(missing)} not installed ({EXTRA_HINT} installs them)", file=sys.stderr)
    start = time.perf_counter()
    deadline = Deadline(request.preset.budget)
    env = environment(request.device, argv)
    print(
        f"{PROG}: {env['device_name']} | preset {request.preset.name} | {', '.join(request.names)} | "
        f"tables {','.join(request.tables)} | compile {'on' if request.compile else 'off'}"
        f"{' (table 1 too)' if request.compile_table1 else ''}"
        + (f" | budget {request.preset.budget:.0f} s" if request.preset.budget else ""),
        file=sys.stderr,
    )

    model, model_info = build(request)  # -> model
    print(f"{PROG}: model ready in {model_info['build_seconds']:.1f} s ({model.source})", file=sys.stderr)
    results = run(request, model, model_info, env, deadline)  # -> run
    results["elapsed_seconds"] = time.perf_counter() - start

    print(report.render_markdown(results))  # -> report
    if args.out:
        paths, problems = report.write_all(results, args.out)
        print(f"{PROG}: wrote {', '.join(os.path.basename(p) for p in paths)} to {args.out}", file=sys.stderr)
        for problem in problems:
            print(f"{PROG}: {problem}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
