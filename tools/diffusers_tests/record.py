"""A pytest plugin that writes every result of a run as JSON lines, as they come:
``-p tools.diffusers_tests.record --dt-record FILE [--dt-only IDS]``.

The runner reads the file while pytest runs (progress, a hung or crashed test) and after
(the report). One object a line, by ``event``:

* ``session``: the versions pytest runs with (diffusers' version and the file it was
  imported from: the checkout's source, not the installed package; a digest of attnkit's
  source);
* ``collected``: the node ids of the items that will run, in order (after ``--dt-only``);
* ``collect_error``: a test file that could not be collected, with the reason;
* ``start``: an item starts (the runner names a test that never finished by it);
* ``result``: an item's outcome (passed, failed, error, skipped, xfailed, xpassed), the
  first line of its exception or skip reason, its duration, and its ``user_properties``
  (where the attnkit plugin puts what it counted during the test);
* ``finish``: the session ended, with its exit status and what plugins put in
  :data:`SESSION_EXTRA`.

``--dt-only FILE`` (one node id a line) deselects every other item: the attnkit run takes
the tests that passed stock, and a run resumed after a crash the ones not yet run.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import pytest

SESSION_EXTRA = pytest.StashKey[dict]()  # other plugins' session totals, written with `finish`
REASON_CHARS = 300


def pytest_addoption(parser):
    group = parser.getgroup("diffusers_tests", "attnkit's diffusers-tests runner")
    group.addoption("--dt-record", default=None, help="write every result as a JSON line to this file")
    group.addoption("--dt-only", default=None, help="run only the node ids listed in this file (one a line)")


class Recorder:
    def __init__(self, path: str):
        self._file = open(path, "a", encoding="utf-8", buffering=1)  # line-buffered: read while running
        self._phases: dict[str, list] = {}

    def write(self, **record) -> None:
        record["t"] = round(time.time(), 3)
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    # -- outcomes ------------------------------------------------------------------
    def logreport(self, report) -> None:
        self._phases.setdefault(report.nodeid, []).append(report)

    def finish_item(self, nodeid: str) -> None:
        reports = self._phases.pop(nodeid, [])
        if not reports:
            return
        outcome, reason = _outcome(reports)
        props = {}
        for r in reports:
            props.update(dict(r.user_properties))
        self.write(
            event="result",
            nodeid=nodeid,
            outcome=outcome,
            reason=reason,
            duration=round(sum(r.duration for r in reports), 3),
            properties=props,
        )


def _outcome(reports) -> tuple[str, str]:
    """(outcome, the first line of its exception or skip reason) from an item's setup,
    call and teardown reports (pytest's own rules: a failed setup or teardown is an
    error, a failed call a failure)."""
    by_when = {r.when: r for r in reports}
    for r in reports:  # a failure anywhere decides
        if r.failed:
            if r.when == "call":
                return "failed", _reason(r)
            return "error", f"[{r.when}] {_reason(r)}"
    call = by_when.get("call")
    for r in reports:
        if r.skipped:
            if hasattr(r, "wasxfail"):
                return "xfailed", f"{_reason(r)} [xfail: {_first_line(r.wasxfail)}]"
            return "skipped", _reason(r)
    if call is not None and hasattr(call, "wasxfail"):
        return "xpassed", _first_line(call.wasxfail)
    return "passed", ""


def _reason(report) -> str:
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        return _first_line(str(longrepr[2]).removeprefix("Skipped: "))
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        return _first_line(crash.message)
    text = str(longrepr)
    errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    return _first_line(errors[0] if errors else text.strip().splitlines()[-1] if text.strip() else "")


def _first_line(text: str) -> str:
    line = next((s.strip() for s in str(text).splitlines() if s.strip()), "")
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 3] + "..."


def _versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for name in ("torch", "diffusers", "transformers", "accelerate", "peft", "attnkit"):
        module = sys.modules.get(name)
        if module is None:
            try:
                module = __import__(name)
            except Exception as exc:  # noqa: BLE001 - a version we cannot read is a fact of the run
                out[name] = f"not importable: {type(exc).__name__}"
                continue
        out[name] = getattr(module, "__version__", "?")
        if name in ("diffusers", "attnkit"):
            out[f"{name}_file"] = os.path.dirname(getattr(module, "__file__", "") or "")
    if out.get("attnkit_file"):
        out["attnkit_source"] = source_digest(out["attnkit_file"])
    return out


def source_digest(package_dir: str) -> str:
    """A digest of a package's .py files: which code a process ran, when the package is
    edited while a run goes on (each pytest process imports it anew)."""
    digest = hashlib.sha256()
    for path in sorted(Path(package_dir).rglob("*.py")):
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


# -- hooks ---------------------------------------------------------------------------------
_CONFIG = None  # the hooks that get no config (logstart, logreport, collectreport) read it here


def pytest_configure(config):
    global _CONFIG
    config.stash[SESSION_EXTRA] = {}
    path = config.getoption("--dt-record")
    if path:
        config._dt_recorder = Recorder(path)
        _CONFIG = config


def _recorder(config) -> Recorder | None:
    return getattr(config, "_dt_recorder", None)


def _recorder_from_report() -> Recorder | None:
    return _recorder(_CONFIG) if _CONFIG is not None else None


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    recorder = _recorder(session.config)
    if recorder is not None:
        recorder.write(event="session", pid=os.getpid(), versions=_versions())


def pytest_collectreport(report):
    if report.failed:
        recorder = _recorder_from_report()
        if recorder is not None:
            recorder.write(
                event="collect_error", nodeid=report.nodeid, outcome="error", reason=f"[collect] {_reason(report)}"
            )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    only = config.getoption("--dt-only")
    if only:
        with open(only, encoding="utf-8") as f:
            wanted = {line.strip() for line in f if line.strip()}
        keep = [item for item in items if item.nodeid in wanted]
        dropped = [item for item in items if item.nodeid not in wanted]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    recorder = _recorder(config)
    if recorder is not None:
        recorder.write(event="collected", nodeids=[item.nodeid for item in items])


def pytest_runtest_logstart(nodeid, location):
    recorder = _recorder_from_report()
    if recorder is not None:
        recorder.write(event="start", nodeid=nodeid)


def pytest_runtest_logreport(report):
    recorder = _recorder_from_report()
    if recorder is not None:
        recorder.logreport(report)


def pytest_runtest_logfinish(nodeid, location):
    recorder = _recorder_from_report()
    if recorder is not None:
        recorder.finish_item(nodeid)


def pytest_sessionfinish(session, exitstatus):
    recorder = _recorder(session.config)
    if recorder is not None:
        recorder.write(event="finish", exitstatus=int(exitstatus), extra=session.config.stash.get(SESSION_EXTRA, {}))
        recorder.close()
        session.config._dt_recorder = None
