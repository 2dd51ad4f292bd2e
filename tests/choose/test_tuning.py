"""auto(tune=True) and its cache file: timing, persistence, and never destroying a file
attnkit did not write (each case below failed before the cache was made careful)."""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from diffusers.models.attention_processor import Attention

import attnkit
from attnkit.backends import AttentionCall
from attnkit.choose import cache_files, tune_cache, tune_check
from attnkit.choose.policy import CANDIDATES
from attnkit.testing import assert_close_to_reference, make_bias, make_qkv


@pytest.fixture(autouse=True)
def _no_forced_backend(monkeypatch):
    monkeypatch.delenv("ATTNKIT_BACKEND", raising=False)


def qkv(m=24, mask=False):
    q, k, v = make_qkv(2, 2, m, 24, 16, layout="bnhd")
    return q, k, v, make_bias("key_padding" if mask else "none", 2, 2, m, 24)


def module():
    return Attention(query_dim=32, heads=2, dim_head=16)


def run(proc, m=24, mask=False):
    q, k, v, bias = qkv(m, mask)
    out = proc.chooser.attention(module(), q, k, v, bias, None, False)
    assert_close_to_reference(out, q, k, v, bias)
    return q, k, v, bias


def tuned(path, **kw):
    return attnkit.auto(tune=True, cache_path=path, order=["sdpa", "vanilla"], tune_iters=1, **kw)


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_default_cache_path_honours_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tune_cache.default_cache_path() == tmp_path / "attnkit" / "autotune.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert tune_cache.default_cache_path() == Path(os.path.expanduser("~")) / ".cache" / "attnkit" / "autotune.json"


def test_tune_times_candidates_and_round_trips(seed, tmp_path, monkeypatch):
    path = tmp_path / "tune.json"
    proc = tuned(path)
    run(proc, mask=True)
    record = proc.decisions[0]
    assert record.how == "tuned" and set(record.ms) == {"sdpa", "vanilla"} and record.priority == "sdpa"
    # vanilla only by the margin (tests/choose/test_tune_checks.py times fake backends)
    assert record.backend == ("vanilla" if record.gain["vanilla"] >= tune_check.DEFAULT_MARGIN else "sdpa")
    entries, others = tune_cache.read_cache(path, CANDIDATES)
    assert others == 0 and len(entries) == 1
    ((key, entry),) = entries.items()
    assert "mask=key_padding" in key and entry["backend"] == record.backend

    # a new process (processor) reads it back and does not time again
    _never_time(monkeypatch)
    again = tuned(path)
    run(again, mask=True)
    assert again.decisions[0].how == "tune cache" and again.decisions[0].backend == record.backend


def _no_timing(*args, **kwargs):
    raise AssertionError("timed again although the cache has this signature")


def _never_time(monkeypatch):
    monkeypatch.setattr(tune_check, "time_backend", _no_timing)
    monkeypatch.setattr(tune_check, "time_rounds", _no_timing)


def test_one_candidate_times_and_writes_nothing(seed, tmp_path, monkeypatch, caplog):
    """On the CPU only sdpa is a tuning candidate: nothing to time, no file, no promise."""
    path = tmp_path / "tune.json"
    _never_time(monkeypatch)
    proc = attnkit.auto(tune=True, cache_path=path)
    with caplog.at_level(logging.INFO, logger="attnkit"):
        run(proc)
        run(proc, m=9)
    assert not path.exists()
    messages = [r.getMessage() for r in caplog.records]
    assert not any("will be" in m or "saved" in m for m in messages), messages
    assert sum("nothing to time" in m for m in messages) == 1
    assert proc.decisions[0].how == "priority"


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[1, 2, 3]",
        '{"entries": {}}',
        '{"version": 1, "entries": []}',
        "\udcff",
        "[" * 100_000 + "]" * 100_000,
    ],
    ids=["not-json", "list", "no-version", "entries-list", "not-utf8", "deeply-nested"],
)
def test_a_file_that_is_not_a_cache_is_moved_aside(seed, tmp_path, caplog, content):
    path = tmp_path / "tune.json"
    original = content.encode("utf-8", "surrogateescape")
    path.write_bytes(original)
    proc = tuned(path)
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        for m in (8, 9, 10):
            run(proc, m=m)
    warnings = warnings_of(caplog)
    assert len(warnings) == 2, warnings  # cannot use it (once); moved aside (once)
    assert "cannot use the tuning cache" in warnings[0]
    assert "moved to" in warnings[1] and "tune.json.bad" in warnings[1]
    assert (tmp_path / "tune.json.bad").read_bytes() == original  # kept, byte for byte
    entries, others = tune_cache.read_cache(path, CANDIDATES)  # rewritten, valid
    assert len(entries) == 3 and others == 0


def test_an_earlier_bad_file_is_not_overwritten(seed, tmp_path):
    path = tmp_path / "tune.json"
    (tmp_path / "tune.json.bad").write_text("the first one")
    path.write_text("the second one")
    run(tuned(path))
    assert (tmp_path / "tune.json.bad").read_text() == "the first one"
    assert (tmp_path / "tune.json.bad.1").read_text() == "the second one"


def test_entries_this_version_cannot_use_are_kept(seed, tmp_path, caplog):
    path = tmp_path / "tune.json"
    q, k, v, _ = qkv()
    key = tune_cache.cache_key(AttentionCall.from_tensors(q, k, v))
    foreign = {
        "newer": {"backend": "flash_attn4", "ms": {"flash_attn4": 0.1}},  # a newer attnkit's backend
        "odd": {"backend": "sdpa", "ms": {"sdpa": "fast"}},
    }
    path.write_text(json.dumps({"version": 1, "entries": {**foreign, key: {"backend": "xformers", "ms": {}}}}))
    entries, others = tune_cache.read_cache(path, CANDIDATES)
    assert list(entries) == [key] and others == 2
    proc = tuned(path)
    with caplog.at_level(logging.INFO, logger="attnkit"):
        run(proc)
    # xformers cannot run on this CPU: re-tuned, and the unusable entries are still there
    assert proc.decisions[0].backend in ("sdpa", "vanilla") and proc.decisions[0].how == "tuned"
    raw = tune_cache.read_raw(path)
    assert raw["newer"] == foreign["newer"] and raw["odd"] == foreign["odd"]
    assert raw[key]["backend"] in ("sdpa", "vanilla")


def test_a_newer_format_is_left_alone(seed, tmp_path, caplog):
    path = tmp_path / "tune.json"
    text = json.dumps({"version": 2, "entries": {"x": "whatever version 2 holds"}})
    path.write_text(text)
    proc = tuned(path)
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        run(proc)
        run(proc, m=9)
    assert path.read_text() == text and not (tmp_path / "tune.json.bad").exists()
    warnings = warnings_of(caplog)
    assert any("version 2" in w and "left as it is" in w for w in warnings), warnings


def test_writes_go_through_a_symlink(seed, tmp_path):
    real = tmp_path / "shared" / "autotune.json"
    real.parent.mkdir()
    real.write_text(json.dumps({"version": 1, "entries": {}}))
    link = tmp_path / "link.json"
    link.symlink_to(real)
    run(tuned(link))
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert len(tune_cache.read_cache(real, CANDIDATES)[0]) == 1


def test_the_mode_is_kept(seed, tmp_path):
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({"version": 1, "entries": {}}))
    path.chmod(0o644)
    run(tuned(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert len(tune_cache.read_cache(path, CANDIDATES)[0]) == 1


def test_a_read_only_file_is_left_alone_with_one_warning(seed, tmp_path, caplog):
    """No write bit is a statement, even to root (whom os.access would let write)."""
    _read_only_case(tmp_path, caplog)


def _read_only_case(tmp_path, caplog):
    path = tmp_path / "tune.json"
    text = json.dumps({"version": 1, "entries": {}})
    path.write_text(text)
    path.chmod(0o444)
    proc = tuned(path)
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        run(proc)
        run(proc, m=9)
    assert path.read_text() == text and stat.S_IMODE(path.stat().st_mode) == 0o444
    warnings = warnings_of(caplog)
    assert len(warnings) == 1 and "read-only" in warnings[0], warnings


def test_unknown_top_level_fields_are_kept(seed, tmp_path):
    """A version-1 file may carry fields a newer attnkit added next to 'entries'."""
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({"version": 1, "entries": {}, "written_by": "attnkit 9", "stats": {"hits": 3}}))
    run(tuned(path))
    data = json.loads(path.read_text())
    assert data["written_by"] == "attnkit 9" and data["stats"] == {"hits": 3}
    assert data["version"] == 1 and len(data["entries"]) == 1


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="only root can give a file away")
def test_another_users_file_keeps_its_owner_and_group(seed, tmp_path):
    """Root rewriting a user's cache must not take it over, nor the lock file it makes
    beside it: either way the user could no longer save."""
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({"version": 1, "entries": {}}))
    path.chmod(0o644)
    os.chown(path, 4321, 4322)
    run(tuned(path))
    st = path.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (4321, 4322, 0o644)
    lock = tmp_path / "tune.json.lock"
    if lock.exists():  # filelock keeps it on POSIX
        assert (lock.stat().st_uid, lock.stat().st_gid) == (4321, 4322)
    assert len(tune_cache.read_cache(path, CANDIDATES)[0]) == 1


def _within(seconds, fn, fifo=None):
    """``fn()`` in a thread: a regression that opens a FIFO and waits for a writer fails
    the test instead of hanging the suite (the FIFO is then given a writer, so that the
    thread, and the lock it holds, are let go)."""
    outcome = {}

    def target():
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # handed to the test below
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        deadline = time.monotonic() + seconds
        while fifo is not None and thread.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(OSError):  # each open of the FIFO waits for a writer
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            thread.join(0.05)
        pytest.fail(f"still running after {seconds} s: a FIFO was opened and waited on")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _left_alone_with_one_warning(path, kind, caplog, fifo=None):
    """Tuning works in memory; ``path`` is neither read, moved nor replaced; one warning
    names it, says what it is and what to do."""
    proc = tuned(path)
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        _within(20, lambda: (run(proc), run(proc, m=9)), fifo=fifo)
    assert [d.how for d in proc.decisions] == ["tuned", "tuned"]
    warnings = warnings_of(caplog)
    assert len(warnings) == 1, warnings
    assert str(path) in warnings[0] and kind in warnings[0] and "not a regular file" in warnings[0]
    assert "cache_path=" in warnings[0], warnings  # what to do
    return warnings[0]


needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this OS")


@needs_fifo
def test_a_fifo_is_never_opened_moved_or_replaced(seed, tmp_path, caplog):
    path = tmp_path / "tune.json"
    os.mkfifo(path)
    _left_alone_with_one_warning(path, "FIFO", caplog, fifo=path)
    assert stat.S_ISFIFO(os.lstat(path).st_mode)
    assert os.listdir(tmp_path) == ["tune.json"]  # no .bad, no lock, no temporary file


@needs_fifo
def test_a_symlink_to_a_fifo_is_left_alone(seed, tmp_path, caplog):
    """A symlink is judged by what it points to: to a regular file it is written through
    (test_writes_go_through_a_symlink), to anything else it is left alone."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "tune.json"
    link.symlink_to(fifo)
    _left_alone_with_one_warning(link, "FIFO", caplog, fifo=fifo)
    assert os.readlink(link) == str(fifo) and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["pipe", "tune.json"]


@needs_fifo
def test_a_fifo_that_appears_after_the_check_is_not_waited_on(tmp_path, monkeypatch):
    """Between the check and the open a FIFO may appear: the open does not wait for a
    writer, and what was opened is checked again."""
    path = tmp_path / "tune.json"
    os.mkfifo(path)
    # The check saw a file: patched where _read_bytes calls it (a patch elsewhere would
    # leave the real check to refuse the FIFO before the open, and test nothing).
    monkeypatch.setattr(cache_files, "refuse_special", lambda p: None)
    opened = []
    real_open = os.open
    monkeypatch.setattr(
        cache_files.os,
        "open",
        lambda p, flags, *a: (opened.append(p) if os.fspath(p) == os.fspath(path) else None) or real_open(p, flags, *a),
    )
    with pytest.raises(tune_cache.NotRegularFile, match="FIFO"):
        _within(10, lambda: tune_cache.read_raw(path), fifo=path)
    assert opened, "the FIFO was refused before the open: the open's own safeguards went untested"
    assert _within(10, lambda: tune_cache.read_cache(path, CANDIDATES), fifo=path) == ({}, 0)
    assert stat.S_ISFIFO(os.lstat(path).st_mode)


def test_a_directory_is_not_moved_aside(seed, tmp_path, caplog):
    path = tmp_path / "tune.json"
    path.mkdir()
    (path / "theirs.txt").write_text("kept")
    message = _left_alone_with_one_warning(path, "directory", caplog)
    assert "tune.json/autotune.json" in message  # the file they probably meant
    assert os.listdir(path) == ["theirs.txt"] and (path / "theirs.txt").read_text() == "kept"
    assert os.listdir(tmp_path) == ["tune.json"]


def test_a_device_node_is_not_moved_or_replaced(seed, tmp_path, caplog):
    """A null device of our own (mknod needs root): the real one is in the next test."""
    path = tmp_path / "tune.json"
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (AttributeError, PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here ({exc})")
    before = os.lstat(path)
    _left_alone_with_one_warning(path, "character device", caplog)
    after = os.lstat(path)
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)
    assert os.listdir(tmp_path) == ["tune.json"]


def test_os_devnull_is_left_untouched(seed, caplog, monkeypatch):
    """cache_path=os.devnull: as root the old code moved the real null device aside (and
    made /dev/null.lock). Should that come back, the guards below fail the test first."""
    devnull = os.path.realpath(os.devnull)
    if not stat.S_ISCHR(os.stat(devnull).st_mode):
        pytest.skip(f"{devnull} is not a character device here")
    real_replace, real_rename = os.replace, os.rename

    def guarded(real):
        def move(src, dst, *args, **kwargs):
            for p in (src, dst):
                if os.path.realpath(p).startswith(devnull):
                    raise AssertionError(f"attnkit tried to move {src} to {dst}")
            return real(src, dst, *args, **kwargs)

        return move

    real_lock = tune_cache.lock

    def lock(path):
        if os.path.realpath(path).startswith(devnull):
            raise AssertionError(f"attnkit tried to make a lock file beside {path}")
        return real_lock(path)

    monkeypatch.setattr(os, "replace", guarded(real_replace))
    monkeypatch.setattr(os, "rename", guarded(real_rename))
    monkeypatch.setattr(tune_cache, "lock", lock)
    neighbours = {devnull + suffix: os.path.lexists(devnull + suffix) for suffix in (".bad", ".lock")}
    before = os.stat(devnull)
    _left_alone_with_one_warning(os.devnull, "character device", caplog)
    after = os.stat(devnull)
    assert stat.S_ISCHR(after.st_mode)
    assert (after.st_ino, after.st_rdev, after.st_mode) == (before.st_ino, before.st_rdev, before.st_mode)
    assert {p: os.path.lexists(p) for p in neighbours} == neighbours


def test_unwritable_folder_warns_once_and_still_runs(seed, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = tuned(blocker / "tune.json")
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        run(proc)
        run(proc, m=9)
    warnings = warnings_of(caplog)
    assert len(warnings) == 1 and "cannot write the tuning cache" in warnings[0]


def _writer(path, worker, count):
    for i in range(count):
        tune_cache.update_cache(path, {f"w{worker}-{i}": {"backend": "sdpa", "ms": {"sdpa": float(i)}}}, CANDIDATES)


def test_concurrent_writers_do_not_corrupt_the_cache(tmp_path):
    path = tmp_path / "sub" / "tune.json"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(path), w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    entries, others = tune_cache.read_cache(path, CANDIDATES)
    assert others == 0
    assert set(entries) == {f"w{w}-{i}" for w in range(4) for i in range(15)}
    assert not [p for p in path.parent.iterdir() if p.suffix == ".tmp"]


_KILLED_WRITER = r"""
import os, sys, time, tempfile
from pathlib import Path
from attnkit.choose import tune_cache
path = Path(sys.argv[1])
fd, tmp = tempfile.mkstemp(prefix=tune_cache.tmp_prefix(path), suffix=".tmp", dir=path.parent)
os.write(fd, b'{"version": 1, "entries": {"half": ')
print(tmp, flush=True)
time.sleep(60)
"""


def test_temporary_files_of_a_killed_writer_are_removed(tmp_path):
    path = tmp_path / "tune.json"
    child = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        tmp = Path(child.stdout.readline().strip())
        assert tmp.exists()
        # while its writer lives, the file is someone's work in progress: kept
        tune_cache.update_cache(path, {"a": {"backend": "sdpa", "ms": {}}}, CANDIDATES)
        assert tmp.exists()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    tune_cache.update_cache(path, {"b": {"backend": "sdpa", "ms": {}}}, CANDIDATES)
    assert not tmp.exists()
    assert set(tune_cache.read_cache(path, CANDIDATES)[0]) == {"a", "b"}


def test_the_lock_works_on_every_os():
    """filelock, not fcntl: the lock is not POSIX-only."""
    import inspect

    assert "fcntl" not in inspect.getsource(tune_cache)
    from filelock import FileLock  # noqa: F401  (a declared dependency)
