"""The command line: ``python -m tools.diffusers_tests TESTS [options]`` (the package
docstring says what runs and what the report holds)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from . import __doc__ as _DOC
from .report import PASSED, build, write
from .run import ROOT, PhaseResult, Settings, run_phase
from .selection import DEFAULT_GLOBS, file_of, select_files

COMMAND = "python -m tools.diffusers_tests"
REPORT = ROOT / "bench" / "results" / "cpu" / "diffusers-tests" / "report.md"
OUT = ROOT / "bench" / "out" / "diffusers-tests"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=COMMAND, description=_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tests", type=Path, help="diffusers' tests/ folder (of a checkout of its repository)")
    p.add_argument(
        "--files",
        nargs="+",
        default=list(DEFAULT_GLOBS),
        metavar="GLOB",
        help="test files under tests/ to run, as globs (default: the model and pipeline tests)",
    )
    p.add_argument("--installed", action="store_true", help="run against the installed diffusers, not TESTS/../src")
    p.add_argument(
        "--report",
        type=Path,
        default=REPORT,
        help="the markdown report; the JSON goes beside it (default: %(default)s)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=OUT,
        help="results as JSON lines and pytest's output, per run (default: %(default)s)",
    )
    p.add_argument("--timeout", type=int, default=300, help="seconds one test may take (default: %(default)s)")
    p.add_argument("--chunk-files", type=int, default=20, help="test files per pytest process (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=1, help="pytest processes at once (default: %(default)s)")
    p.add_argument("--stock-only", action="store_true", help="the stock run only")
    p.add_argument(
        "--reuse-stock",
        action="store_true",
        help="take the stock run from --out (the last run's), run only the attnkit one",
    )
    p.add_argument("--render", action="store_true", help="run nothing: write the report again from the runs in --out")
    p.add_argument(
        "--diffusers-commit",
        default="",
        help="the checkout's commit, for the report (read with git when TESTS is in a work tree)",
    )
    p.add_argument("--python", default=sys.executable, help="the interpreter that runs pytest (default: this one)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # SIGTERM as Ctrl-C: the runner's finally blocks then kill the pytest processes it started
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s")
    tests = args.tests.resolve()
    if not (tests / "conftest.py").is_file():
        print(f"{tests}: not diffusers' tests folder (no conftest.py)", file=sys.stderr)
        return 2
    checkout = tests.parent
    src = None if args.installed else (checkout / "src" if (checkout / "src" / "diffusers").is_dir() else None)
    files = select_files(tests, args.files)
    if not files:
        print(f"no test file under {tests} matches {args.files}", file=sys.stderr)
        return 2
    settings = Settings(
        checkout=checkout,
        python=args.python,
        out_dir=args.out.resolve(),
        src=src,
        timeout_s=args.timeout,
        chunk_files=args.chunk_files,
        jobs=args.jobs,
    )
    print(
        f"{len(files)} test files from {tests}; diffusers from {src or 'the installed package'}; "
        f"output in {settings.out_dir}"
    )

    if args.render:
        stock, attnkit = (_load(settings.out_dir / name / "phase.json") for name in ("stock", "attnkit"))
        if stock is None:
            print(f"--render: no stock run in {settings.out_dir / 'stock'}", file=sys.stderr)
            return 2
        files = [f for f in files if f in set(stock.files)]
        return _report(args, argv, tests, checkout, files, stock, attnkit)
    if args.reuse_stock:
        stock = _load(settings.out_dir / "stock" / "phase.json")
        if stock is None:
            print(f"--reuse-stock: no stock run in {settings.out_dir / 'stock'}", file=sys.stderr)
            return 2
        known = set(stock.files)
        files = [f for f in files if f in known]
        print(f"stock run reused for {len(files)} files")
    else:
        stock = run_phase("stock", files, settings, attnkit=False, on_file=_print_file)
        _save(stock, settings.out_dir / "stock" / "phase.json", argv)
        _print_phase(stock)
    attnkit = None
    if not args.stock_only:
        passed = {n for n, r in stock.results.items() if r["outcome"] in PASSED and file_of(n) in set(files)}
        attnkit = run_phase("attnkit", files, settings, attnkit=True, only=passed, on_file=_print_file)
        _save(attnkit, settings.out_dir / "attnkit" / "phase.json", argv)
        _print_phase(attnkit)

    return _report(args, argv, tests, checkout, files, stock, attnkit)


def _report(
    args, argv, tests: Path, checkout: Path, files: list[str], stock: PhaseResult, attnkit: PhaseResult | None
) -> int:
    header = _header(args, argv, tests, checkout, stock, attnkit)
    data = build(files, stock, attnkit, header)
    md, js = write(data, args.report)
    regressions = sum(g["count"] for g in data["regressions_by_reason"])
    print(f"report: {md} and {js}")
    if attnkit is not None:
        print(
            f"{regressions} test(s) pass stock and fail with attnkit, in {len(data['regressions_by_reason'])} reason(s)"
        )
    return 0


def _print_file(done) -> None:
    counts = ", ".join(f"{n} {k}" for k, n in sorted(done.counts.items(), key=lambda kv: -kv[1])) or "no test"
    minutes, seconds = divmod(int(done.elapsed_s), 60)
    print(
        f"{done.phase:7s} [{done.done:3d}/{done.total}] {minutes:3d}:{seconds:02d} {done.file}: {counts} "
        f"({done.seconds:.0f} s)",
        flush=True,
    )


def _print_phase(phase: PhaseResult) -> None:
    from collections import Counter

    counts = Counter(r["outcome"] for r in phase.results.values())
    print(
        f"{phase.name} run: {len(phase.results)} tests in {phase.wall_s / 60:.1f} min: "
        + ", ".join(f"{n} {k}" for k, n in counts.most_common())
        + f"; {len(phase.collect_errors)} files not collected",
        flush=True,
    )


def _save(phase: PhaseResult, path: Path, argv) -> None:
    phase.command = _command_line(argv)
    phase.date = _now()
    phase.attnkit_commit = _attnkit_commit()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = dataclasses.asdict(phase)
    path.write_text(json.dumps(data, default=str) + "\n", encoding="utf-8")


def _load(path: Path) -> PhaseResult | None:
    if not path.is_file():
        return None
    return PhaseResult(**json.loads(path.read_text(encoding="utf-8")))


def _command_line(argv) -> str:
    return " ".join([COMMAND] + [shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)])


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def _attnkit_commit() -> str:
    ours = _git("rev-parse", "--short", "HEAD", cwd=ROOT)
    if ours and _git("status", "--porcelain", "--", "attnkit", cwd=ROOT):
        ours += " with uncommitted changes in attnkit/"
    return ours


def _git(*args: str, cwd: Path) -> str:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _header(args, argv, tests: Path, checkout: Path, stock: PhaseResult, attnkit: PhaseResult | None) -> dict:
    commit = args.diffusers_commit or _git("rev-parse", "HEAD", cwd=checkout)
    if commit and not args.diffusers_commit:
        commit += (
            " (work tree)"
            if not _git("status", "--porcelain", "--", "src", "tests", cwd=checkout)
            else " (work tree, with uncommitted changes)"
        )
    init = checkout / "src" / "diffusers" / "__init__.py"
    match = re.search(r'__version__ = "([^"]+)"', init.read_text(encoding="utf-8")) if init.is_file() else None
    last = attnkit if attnkit is not None else stock  # --render: what the runs noted, not what is here now
    phases = {}
    for phase in (stock, attnkit):
        if phase is not None:
            phases[phase.name] = {
                "files": len(phase.files),
                "tests": len(phase.results),
                "wall_s": round(phase.wall_s, 1),
                "processes": phase.processes,
                "restarts": phase.restarts,
                "attnkit_sources": phase.attnkit_sources,
            }
    versions = attnkit.versions if attnkit is not None and attnkit.versions else stock.versions
    return {
        "diffusers_commit": commit,
        "diffusers_checkout_version": match.group(1) if match else None,
        "tests_dir": str(tests),
        "versions": versions,
        "attnkit_commit": last.attnkit_commit or _attnkit_commit(),
        "date": last.date or _now(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.platform()}",
        "command": (
            stock.command
            if attnkit is None or attnkit.command == stock.command
            else f"{stock.command}; then {attnkit.command}"
        )
        or _command_line(argv),
        "phases": phases,
        "attnkit_totals": attnkit.extra.get("attnkit", {}) if attnkit is not None else {},
    }
