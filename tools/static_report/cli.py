"""The command line of the static report: `python -m tools.static_report [options]`, and
`python -m tools.static_report tiles ...` (tiles.py). What it does, the definitions of
its figures, how rows are resumed and how the report is stored: the package docstring
(tools/static_report/__init__.py)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from . import __doc__ as _DOC
from .build import code_job, compile_job
from .compile import SMEM_LIMIT, Job, Result
from .consumer import gated
from .jobs import ALL_ARCHS, ARCHS, BIASES, DTYPES, HEAD_DIMS, KERNELS, jobs_for
from .key import source_key
from .reference import compile_reference
from .store import (
    CHECKPOINT,
    REPORT_DIR,
    render,
    resumable_reference,
    resumable_rows,
    retire_checkpoint,
    rows_by_code,
    source_state,
    to_record,
    write_report,
)
from .warpspec import check_warp_specialization


def _row(r: Result) -> str:
    j = r.job
    cfg = j.config_name + ("*" if j.default else "")
    probs = r.problems
    status = "ok" if not probs else "FAIL: " + "; ".join(probs)
    budget = f"{j.budget:.3f}" if j.budget is not None and r.gated else "-"
    kernel = j.kernel + (f"/{j.piece}" if j.piece >= 0 else "") + (f"/{j.grads}" if j.grads != "dkdv" else "")
    return (
        f"{kernel:10} {j.head_dim:4} {j.dtype:5} {j.bias:6} {'c' if j.causal else '-':1} "
        f"{'tma' if j.tma else 'ptr':3} {cfg:24} sm_{j.arch}  {r.regs:4} {max(r.stack, 0):6} {r.smem:7} "
        f"{r.matrix:5} {r.instr_per_score:6.3f} {budget:>6} {r.tensor_limit:6.3f} {r.exp_per_score:5.2f} "
        f"{r.mma_duplication:5.2f} {r.seconds:5.1f}  {status}"
    )


HEADER = (
    f"{'kern':10} {'D':>4} {'dtype':5} {'bias':6} c {'ld':3} {'config':24} {'arch':5}  "
    f"{'regs':>4} {'stack':>6} {'smem':>7} {'mma':5} {'i/sc':>6} {'budget':>6} {'limit':>6} "
    f"{'exp':>5} {'dup':>5} {'secs':>5}  status"
)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["tiles"]:
        from . import tiles

        return tiles.main(argv[1:])
    ap = argparse.ArgumentParser(
        prog="python -m tools.static_report",
        description=" ".join(_DOC.split("\n\n")[0].split()) + " The tile table: "
        "python -m tools.static_report tiles --help.",
        epilog="Resuming, storage and the figures' definitions: tools/static_report/__init__.py.",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="the default config of each list only, head dims 40 and 128 (a CI-sized check)",
    )
    ap.add_argument("--kernel", action="append", choices=KERNELS, help="repeatable; default all")
    ap.add_argument(
        "--head-dim", action="append", type=int, help="repeatable; default " + " ".join(map(str, HEAD_DIMS))
    )
    ap.add_argument("--dtype", action="append", choices=DTYPES, help="repeatable; default fp16 bf16 fp32")
    ap.add_argument(
        "--arch",
        action="append",
        type=int,
        choices=ALL_ARCHS,
        help="repeatable; default 80 90, and a few rows of 75 86 89 (tools/static_report/consumer.py)",
    )
    ap.add_argument("--bias", action="append", choices=BIASES, help="repeatable; default none keypad full full16")
    ap.add_argument("--causal", action="append", type=int, choices=(0, 1), help="repeatable; default 0 1")
    ap.add_argument(
        "--loads", action="append", choices=("tma", "ptr"), help="repeatable; default both where a target has TMA"
    )
    ap.add_argument(
        "--config",
        action="append",
        metavar="BM,BN,WARPS,STAGES[,RELOAD[,MAXNREG]]",
        help="compile this tile configuration instead of the shipped ones (repeatable)",
    )
    ap.add_argument("--budget", type=float, help="with --config: the instr/score budget to gate it on")
    ap.add_argument(
        "--reference",
        metavar="FILE",
        help="also compile Triton's tutorial fused attention (a copy of "
        "python/tutorials/06-fused-attention.py) the same way, at head dims 64 and 128",
    )
    ap.add_argument(
        "--out",
        metavar="DIR",
        help=f"write the report here: report.md, report.json, rows/*.jsonl (the full run: {REPORT_DIR})",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows of the report already in the output folder and of its checkpoint "
        f"({CHECKPOINT}, a killed run's) compiled from this source key (the same kernels and "
        "analysis) and the same tile, or from another source key where the row's job builds to "
        "the same code (Triton's front end, a few hundredths of a second a row), and compile only the rest",
    )
    ap.add_argument(
        "--render",
        metavar="DIR",
        help="only write DIR's report again (report.md, the targets of "
        "report.json, the row files) from its rows, with this checkout's targets and notes (no "
        "compiling); a report in the single-file layout is rewritten in the split one",
    )
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compilations")
    args = ap.parse_args(argv)

    if args.render:
        print("wrote " + " and ".join(render(args.render)))
        return 0
    from attnkit.kernels.launcher import INTERPRETED

    if INTERPRETED:
        # The kernels were defined for Triton's interpreter; compile them in a fresh
        # interpreter-free process instead.
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        return subprocess.run([sys.executable, "-m", "tools.static_report", *argv], env=env).returncode

    full = not any(
        (args.quick, args.kernel, args.head_dim, args.dtype, args.arch, args.bias, args.causal, args.loads, args.config)
    )
    out_dir = args.out or (REPORT_DIR if full else None)
    kernels = args.kernel or list(KERNELS)
    head_dims = args.head_dim or ([40, 128] if args.quick else list(HEAD_DIMS))
    dtypes = args.dtype or list(DTYPES)
    archs = args.arch or list(ARCHS if args.quick else ALL_ARCHS)  # --quick: sm_80 and sm_90
    biases = args.bias or list(BIASES)
    causals = [bool(c) for c in (args.causal or (0, 1))]
    tmas = None if not args.loads else [x == "tma" for x in args.loads]
    configs = [tuple(int(x) for x in c.split(",")) for c in (args.config or [])]
    if any(len(c) not in (4, 5, 6) for c in configs):
        ap.error(
            "--config takes BLOCK_M,BLOCK_N,NUM_WARPS,NUM_STAGES[,RELOAD (0 or 1)[,MAXNREG (registers per "
            "thread, up to 255)]]"
        )
    configs = [c if len(c) >= 5 else (*c, 0) for c in configs]
    jobs = jobs_for(kernels, head_dims, dtypes, archs, biases, causals, args.quick, configs, tmas, args.budget)
    key = source_key()
    kept: dict[Job, Result] = {}
    if args.resume and not out_dir:
        # make inspect passes --resume; a subset without --out writes no report to resume from.
        print("not resuming: no report folder (a subset writes none without --out DIR)")
    elif args.resume:
        kept, why = resumable_rows(out_dir, jobs, key)
        print(f"resuming: {len(kept)} of {len(jobs)} rows kept ({why})")
    by_code = _check_codes(out_dir, jobs, kept, args.jobs) if args.resume and out_dir else {}
    kept.update(by_code)
    todo = [j for j in jobs if j not in kept]
    source = source_state()
    checkpoint = None
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        checkpoint = open(os.path.join(out_dir, CHECKPOINT), "a")
        for r in by_code.values():  # kept under this key now: a killed run keeps them too
            checkpoint.write(json.dumps(dict(to_record(r), key=key), separators=(",", ":")) + "\n")
        checkpoint.flush()

    print(
        f"{len(jobs)} compilations ({args.jobs} at a time); * = default config; c = causal; "
        f"ld = loads (tma / ptr); i/sc = main-loop warp instructions per score; limit = tensor-bound "
        f"i/sc; exp = exp2 per score; dup = matrix FLOPs issued / needed; stack > 0 means spilled "
        f"registers; shared-memory limits: " + ", ".join(f"sm_{a} {SMEM_LIMIT[a]} B" for a in archs)
    )
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
                checkpoint.write(json.dumps(dict(to_record(r), key=key), separators=(",", ":")) + "\n")
                checkpoint.flush()
            print(_row(r), flush=True)
            if i % 50 == 0 and i < len(todo):
                print(_progress(i, len(todo), t0), file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print(
            f"interrupted: {len(results)} of {len(todo)} compilations done; "
            + ("writing a partial report" if out_dir else "no report written"),
            flush=True,
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
        if checkpoint:
            checkpoint.close()
        if pool:
            pool.shutdown(wait=not interrupted, cancel_futures=True)
    if kept:  # in the order of the jobs
        fresh = {r.job: r for r in results}
        results = [kept.get(j) or fresh[j] for j in jobs if j in kept or j in fresh]
    failed = sum(bool(r.problems) for r in results if gated(r))  # consumer.NOT_CLEAN's rows: reported
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
                + ("; the tutorial's rows kept from it" if reference and not args.reference else "")
                + ")"
            ]
        paths = write_report(results, reference, out_dir, argv, warp_spec, partial=partial, source=source, key=key)
        print("wrote " + " and ".join(paths))
        if not interrupted:
            retire_checkpoint(out_dir, results, key)  # its rows are in the report now
    if interrupted:
        return 130
    return 1 if failed else 0


def _check_codes(out_dir: str, jobs: list[Job], kept: dict, workers: int) -> dict:
    """{job: Result} of the rows of out_dir compiled from another source key whose job
    this checkout builds to the same code key (build.code_key: the same Triton IR,
    target, options and analysis): the same figures, kept without compiling. Also fills
    in the code key of kept rows that have none (a report from before code keys: the
    same source key builds the same code). Triton's front end only, a few hundredths of
    a second a row."""
    candidates = rows_by_code(out_dir, [j for j in jobs if j not in kept])
    unkeyed = [j for j, r in kept.items() if not r.code]
    todo = list(candidates) + unkeyed
    if not todo:
        return {}
    print(
        f"checking {len(candidates)} rows of another source key by the code they build to "
        f"(Triton's front end only)" + (f"; and the code key of {len(unkeyed)} kept rows" if unkeyed else ""),
        flush=True,
    )
    t0 = time.time()
    same = {}
    pool = ProcessPoolExecutor(max_workers=workers) if workers > 1 else None
    try:
        codes = pool.map(code_job, todo, chunksize=16) if pool else map(code_job, todo)
        for i, (j, code) in enumerate(zip(todo, codes), 1):
            if j in kept:
                kept[j].code = code
            elif code and code == candidates[j].code:
                same[j] = candidates[j]
            if i % 500 == 0 and i < len(todo):
                print(_progress(i, len(todo), t0, "checked"), file=sys.stderr, flush=True)
    finally:
        if pool:
            pool.shutdown()
    print(
        f"by code: {len(same)} of {len(candidates)} rows kept (the same code), "
        f"{len(candidates) - len(same)} to compile ({time.time() - t0:.0f} s)",
        flush=True,
    )
    return same


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _progress(done: int, total: int, t0: float, what: str = "compiled") -> str:
    """done/total, and the minutes left at this run's pace (the slowest rows come last)."""
    left = (time.time() - t0) / done * (total - done) / 60
    return f"[{done}/{total} {what}, at least ~{left:.0f} min left]"


if __name__ == "__main__":
    sys.exit(main())
