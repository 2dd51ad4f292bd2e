"""Running diffusers' test files under pytest, in chunks of files, one process a chunk,
with every result read back from the record plugin's JSON lines (record.py).

A chunk whose pytest process dies in a test (a segfault, pytest-timeout's own limit
missed, the watchdog's kill) is resumed: the test that was running is recorded as
``crashed`` or ``hung``, and a new process runs the chunk's tests that had no result yet.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .selection import file_of

logger = logging.getLogger("tools.diffusers_tests")

ROOT = Path(__file__).resolve().parents[2]  # the attnkit checkout: tools.diffusers_tests imports from here
RECORD_PLUGIN = "tools.diffusers_tests.record"
ATTNKIT_PLUGIN = "tools.diffusers_tests.plugin"
WATCHDOG_GRACE_S = 120  # beyond pytest-timeout's limit: pytest-timeout had its chance to fail the test
MAX_RESTARTS = 25  # per chunk


@dataclass
class Settings:
    checkout: Path  # diffusers' repository root: tests/ (and src/) under it
    python: str  # the interpreter of .venv-diffusers-tests
    out_dir: Path  # JSON lines and pytest's output, per phase and chunk
    src: Path | None  # diffusers' source put first on PYTHONPATH (None: the installed diffusers)
    timeout_s: int = 300  # per test (pytest-timeout)
    chunk_files: int = 20
    jobs: int = 1
    pytest_args: tuple[str, ...] = ()


@dataclass
class FileDone:
    """What the progress line of one finished file says."""

    phase: str
    file: str
    counts: Counter
    seconds: float
    done: int  # files finished in this phase so far
    total: int
    elapsed_s: float


@dataclass
class PhaseResult:
    name: str
    files: list[str] = field(default_factory=list)  # the test files it ran (paths under tests/)
    results: dict[str, dict] = field(default_factory=dict)  # nodeid -> the record's `result`
    collect_errors: dict[str, str] = field(default_factory=dict)  # file -> reason
    versions: dict = field(default_factory=dict)
    attnkit_sources: list[str] = field(default_factory=list)  # digests of attnkit's code, one per version met
    extra: dict = field(default_factory=dict)  # the plugins' session totals, summed over processes
    command: str = ""  # the command line, date and attnkit commit of the run (the report's header)
    date: str = ""
    attnkit_commit: str = ""
    processes: int = 0
    restarts: int = 0
    wall_s: float = 0.0


def environment(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    path = [str(settings.src)] if settings.src is not None else []
    path.append(str(ROOT))
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path)
    # nothing from the hub: what a test would download fails at once instead of waiting
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if settings.jobs > 1:  # processes at once share the cores: torch's threads too, not each all of them
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // settings.jobs)))
    return env


def chunks(files: list[str], size: int) -> list[list[str]]:
    return [files[i : i + size] for i in range(0, len(files), size)]


class _Progress:
    def __init__(self, phase: str, files: list[str], on_file: Callable[[FileDone], None] | None):
        self.phase, self.on_file = phase, on_file
        self.total = len(files)
        self.expected: Counter = Counter()  # file -> items to wait for (from `collected`)
        self._expected_ids: set[str] = set()
        self.counts: dict[str, Counter] = {}
        self.seconds: Counter = Counter()
        self.finished: set[str] = set()
        self.start = time.monotonic()
        self.lock = threading.Lock()

    def expect(self, nodeids: list[str]) -> None:
        with self.lock:
            for nodeid in nodeids:  # a resumed process collects again what is left: counted once
                if nodeid not in self._expected_ids:
                    self._expected_ids.add(nodeid)
                    self.expected[file_of(nodeid)] += 1

    def result(self, nodeid: str, outcome: str, seconds: float) -> None:
        self._add(file_of(nodeid), outcome, seconds)

    def _add(self, f: str, outcome: str, seconds: float) -> None:
        with self.lock:
            self.counts.setdefault(f, Counter())[outcome] += 1
            self.seconds[f] += seconds
            if f not in self.finished and sum(self.counts[f].values()) >= self.expected.get(f, 0):
                self._finish(f)

    def file_ended(self, f: str) -> None:
        """A file with nothing (more) to run: collected no item, or its process ended."""
        with self.lock:
            if f not in self.finished:
                self._finish(f)

    def _finish(self, f: str) -> None:
        self.finished.add(f)
        if self.on_file is not None:
            self.on_file(
                FileDone(
                    self.phase,
                    f,
                    self.counts.get(f, Counter()),
                    self.seconds[f],
                    len(self.finished),
                    self.total,
                    time.monotonic() - self.start,
                )
            )


def run_phase(
    name: str,
    files: list[str],
    settings: Settings,
    *,
    attnkit: bool,
    only: set[str] | None = None,
    on_file: Callable[[FileDone], None] | None = None,
) -> PhaseResult:
    """Run ``files`` (paths under tests/) in chunks; with ``only``, just those node ids
    (files without one are not started). With ``attnkit``, the plugin that sets
    ``attnkit.auto()`` at construction is loaded."""
    if only is not None:
        files = [f for f in files if any(file_of(n) == f for n in only)]
    phase = PhaseResult(name, files=list(files))
    out = settings.out_dir / name
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("chunk-*"):
        stale.unlink()
    progress = _Progress(name, files, on_file)
    lock = threading.Lock()
    start = time.monotonic()

    def run(index_chunk):
        index, chunk = index_chunk
        wanted = None if only is None else [n for n in sorted(only) if file_of(n) in set(chunk)]
        _run_chunk(name, index, chunk, wanted, settings, attnkit, phase, lock, progress)

    parts = list(enumerate(chunks(files, settings.chunk_files), 1))
    if settings.jobs > 1:
        with ThreadPoolExecutor(settings.jobs) as pool:
            list(pool.map(run, parts))
    else:
        for part in parts:
            run(part)
    phase.wall_s = time.monotonic() - start
    return phase


def _command(settings: Settings, files: list[str], record: Path, only: Path | None, attnkit: bool) -> list[str]:
    # Paths only in --opt=value form: pytest takes a bare argument that exists for a test
    # path, and looks for its rootdir and ini file (attnkit's pyproject.toml) above it.
    cmd = [
        settings.python,
        "-m",
        "pytest",
        f"--rootdir={settings.checkout}",
        "-p",
        "no:cacheprovider",
        "-q",
        "--tb=native",
        "-p",
        RECORD_PLUGIN,
        f"--dt-record={record}",
        "--continue-on-collection-errors",
        f"--timeout={settings.timeout_s}",
        "-W",
        "ignore::DeprecationWarning",
    ]
    if attnkit:
        cmd += ["-p", ATTNKIT_PLUGIN]
    if only is not None:
        cmd += [f"--dt-only={only}"]
    return cmd + list(settings.pytest_args) + [f"tests/{f}" for f in files]


def _run_chunk(
    phase_name: str,
    index: int,
    files: list[str],
    wanted: list[str] | None,
    settings: Settings,
    attnkit: bool,
    phase: PhaseResult,
    lock: threading.Lock,
    progress: _Progress,
) -> None:
    out = settings.out_dir / phase_name
    env = environment(settings)
    remaining = wanted  # None: every item of the files
    for attempt in range(1, MAX_RESTARTS + 2):
        stem = f"chunk-{index:03d}" + (f".{attempt}" if attempt > 1 else "")
        record = out / f"{stem}.jsonl"
        only = None
        if remaining is not None:
            only = out / f"{stem}.only"
            only.write_text("".join(n + "\n" for n in remaining), encoding="utf-8")
        run_files = files if remaining is None else sorted({file_of(n) for n in remaining})
        cmd = _command(settings, run_files, record, only, attnkit)
        logger.debug("%s chunk %d attempt %d: %s", phase_name, index, attempt, " ".join(cmd))
        state = _watch(cmd, settings, env, record, out / f"{stem}.log", progress)
        with lock:
            phase.processes += 1
            phase.restarts += attempt > 1
            phase.results.update(state.results)
            phase.collect_errors.update(state.collect_errors)
            if state.versions and not phase.versions:
                phase.versions = state.versions
            digest = state.versions.get("attnkit_source")
            if digest and digest not in phase.attnkit_sources:
                if phase.attnkit_sources:
                    logger.warning(
                        "%s: attnkit's source changed during the run (%s, now %s)",
                        phase_name,
                        ", ".join(phase.attnkit_sources),
                        digest,
                    )
                phase.attnkit_sources.append(digest)
            _merge_extra(phase.extra, state.extra)
        for f in state.collect_errors:
            progress.file_ended(f)
        if state.collected is None:
            reason = f"pytest ended (exit code {state.returncode}) before collecting; see {stem}.log"
            logger.warning("%s chunk %d: %s", phase_name, index, reason)
            for f in run_files:
                if f not in state.collect_errors:
                    with lock:
                        phase.collect_errors[f] = reason
                    progress.file_ended(f)
            return
        missing = [n for n in state.collected if n not in state.results]
        if not missing:
            for f in run_files:
                progress.file_ended(f)
            return
        # the process ended (or was killed) in the first item without a result
        culprit = missing[0]
        outcome = "hung" if state.killed else "crashed"
        reason = (
            f"no result within {settings.timeout_s + WATCHDOG_GRACE_S} s; the process was killed"
            if state.killed
            else f"the pytest process ended (exit code {state.returncode}) during this test"
        )
        logger.warning(
            "%s: %s %s: %s; resuming the %d test(s) after it", phase_name, culprit, outcome, reason, len(missing) - 1
        )
        with lock:
            phase.results[culprit] = {
                "nodeid": culprit,
                "outcome": outcome,
                "reason": reason,
                "duration": 0.0,
                "properties": {},
            }
        progress.result(culprit, outcome, 0.0)
        remaining = missing[1:]
        if not remaining:
            for f in run_files:
                progress.file_ended(f)
            return
    logger.error("%s chunk %d: gave up after %d restarts", phase_name, index, MAX_RESTARTS)


@dataclass
class _State:
    collected: list[str] | None = None
    results: dict[str, dict] = field(default_factory=dict)
    collect_errors: dict[str, str] = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    returncode: int | None = None
    killed: bool = False


def _watch(cmd: list[str], settings: Settings, env: dict, record: Path, log: Path, progress: _Progress) -> _State:
    """Run one pytest process, reading its record as it grows; kill it (its whole process
    group) when no line came for longer than a test may take."""
    state = _State()
    record.touch()
    limit = settings.timeout_s + WATCHDOG_GRACE_S
    with open(log, "w", encoding="utf-8") as log_file, open(record, encoding="utf-8") as reader:
        proc = subprocess.Popen(
            cmd, cwd=settings.checkout, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            _follow(proc, reader, state, progress, limit)
        finally:
            if proc.poll() is None:  # interrupted (Ctrl-C, SIGTERM): take pytest and its children along
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return state


def _follow(proc: subprocess.Popen, reader, state: _State, progress: _Progress, limit: float) -> None:
    """Read the record as it grows until the process ends, or kill it when no line came
    for ``limit`` seconds."""
    last = time.monotonic()
    buffer = ""
    while True:
        returncode = proc.poll()
        chunk = reader.read()
        if chunk:
            buffer += chunk
            *lines, buffer = buffer.split("\n")
            for line in lines:
                if line.strip():
                    _take(json.loads(line), state, progress)
            last = time.monotonic()
        if returncode is not None:
            state.returncode = returncode
            break
        if time.monotonic() - last > limit:
            logger.warning("no result for %d s: killing pytest (pid %d)", limit, proc.pid)
            state.killed = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            state.returncode = proc.returncode
            break
        time.sleep(0.5)
    rest = buffer + reader.read()
    for line in rest.split("\n"):
        if line.strip():
            try:
                _take(json.loads(line), state, progress)
            except json.JSONDecodeError:  # a line cut by the kill
                pass


def _take(record: dict, state: _State, progress: _Progress) -> None:
    event = record.get("event")
    if event == "session":
        state.versions = record.get("versions", {})
    elif event == "collected":
        state.collected = record["nodeids"]
        progress.expect(state.collected)
    elif event == "collect_error":
        state.collect_errors[file_of(record["nodeid"])] = record["reason"]
    elif event == "result":
        state.results[record["nodeid"]] = {
            k: record[k] for k in ("nodeid", "outcome", "reason", "duration", "properties")
        }
        progress.result(record["nodeid"], record["outcome"], record.get("duration", 0.0))
    elif event == "finish":
        state.extra.update(record.get("extra", {}))


def _merge_extra(total: dict, extra: dict) -> None:
    """Sum the plugins' totals of several processes: numbers add, dicts merge by adding."""
    for key, value in extra.items():
        if key.startswith("_"):
            continue
        if isinstance(value, dict):
            _merge_extra(total.setdefault(key, {}), value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            total[key] = total.get(key, 0) + value
        else:
            total.setdefault(key, value)
