"""The JSON file that keeps what auto(tune=True) measured, shared by every process.

Timing a signature's candidates costs several runs of each, so what was measured is
written down once and every later process reads it instead; the tuning itself (the Tuned
mixin of :mod:`attnkit.choose.tuning`) only asks this module for an entry and hands it a
new one. The careful file operations underneath (non-blocking opens, owner and mode kept)
are in :mod:`attnkit.choose.cache_files`.

The file (``$XDG_CACHE_HOME/attnkit/autotune.json``, ``~/.cache/...`` by default) is
shared by every process on the machine and may be shared between attnkit versions, so:

* a cache problem never fails a model call: every error here becomes a warning, once;
* attnkit never destroys what it did not write: entries and top-level fields it does
  not understand (written by a newer attnkit) are kept; a file that is not a cache at all
  is moved aside to ``autotune.json.bad`` with a warning saying so; a file of a newer
  format version is left alone (tuned choices are then not saved); a read-only file is
  left alone with one warning; a symlinked path is written through (the link stays a
  link); the file's mode, owner and group are kept;
* a path that is not a regular file (a FIFO, a device such as ``os.devnull``, a
  directory, a socket; or a symlink to one) is never opened, moved or replaced: it holds
  no entries, and the writer refuses it with one warning saying what it is. It is judged
  by ``stat`` before anything is opened, and opened without blocking and checked again
  with ``fstat``, so a FIFO that appears in between cannot stall a model call;
* writers hold a lock (``filelock``, every OS) and replace the file atomically: readers
  never see half a file; temporary files left by a killed writer are removed by the next
  one.

An entry (one per :func:`cache_key`) holds ``backend`` (the choice) and ``ms`` (each timed
backend's median milliseconds), as it always did, and the figures of the check and the
margin: ``priority`` (the incumbent), ``margin``, ``rounds``, ``gain`` (each timed
candidate's median gain over the priority choice), ``diff`` (each candidate's difference
from the priority choice's output as a fraction of the bound, or ``"differs"``, or
``"failed"``) and ``checked`` (1: the outputs were compared). An entry without ``checked``
(written before the check existed), of another priority choice, or whose choice its own
figures do not give under this chooser's margin, is not trusted: the signature is tuned
again and the entry replaced.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import torch

from ..backends import AttentionCall
from ..backends.base import dtype_name
from .cache_files import (  # noqa: F401  (CacheNotWritten and NotRegularFile: raised to this module's callers)
    CacheNotWritten,
    NotRegularFile,
    _free_name,
    _keep_owner,
    _not_regular,
    _pid_alive,
    _read_bytes,
    _umask,
    refuse_special,
)

CACHE_VERSION = 1
LOCK_TIMEOUT_S = 30.0
# A temporary file older than this whose writer is gone is a leftover of a killed writer.
STALE_TMP_S = 600.0


def default_cache_path() -> Path:
    """$XDG_CACHE_HOME/attnkit/autotune.json, or ~/.cache/attnkit/autotune.json."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attnkit" / "autotune.json"


class CacheError(ValueError):
    """The tuning cache file exists but is not a cache (unreadable, not JSON, wrong
    structure). ``foreign`` is False when it is a cache of another format version."""

    def __init__(self, message: str, foreign: bool = True):
        super().__init__(message)
        self.foreign = foreign


def valid_entry(value: Any, known: Mapping[str, Any]) -> bool:
    """An entry this attnkit can use: its backend is one of ``known`` and its timings
    are finite non-negative numbers."""
    if not isinstance(value, dict) or value.get("backend") not in known:
        return False
    ms = value.get("ms", {})
    if not isinstance(ms, dict):
        return False
    for k, v in ms.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        if not math.isfinite(v) or v < 0:
            return False
    return True


def read_raw(path: str | os.PathLike) -> dict[str, Any]:
    """Every entry of the cache file, usable or not (what a writer must keep).

    Raises FileNotFoundError if there is no file, NotRegularFile if the path is not a
    regular file (nothing is opened but regular files), CacheError if it is not a cache.
    """
    return _read_document(path)["entries"]


def _read_document(path: str | os.PathLike) -> dict[str, Any]:
    """The whole cache file: ``version``, ``entries`` and any field a newer attnkit added
    (a writer keeps them all). Raises as :func:`read_raw`."""
    try:
        text = _read_bytes(path).decode("utf-8")
    except (FileNotFoundError, NotRegularFile):
        raise
    except NotADirectoryError as e:  # a file where its folder should be: no cache there
        raise FileNotFoundError(str(e)) from e
    except (OSError, UnicodeDecodeError) as e:
        raise CacheError(f"cannot read it ({type(e).__name__}: {e})") from e
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: absurdly deep nesting
        raise CacheError(f"it is not valid JSON ({type(e).__name__}: {str(e)[:100]})") from e
    if not isinstance(data, dict) or "version" not in data:
        raise CacheError("it is not an attnkit tuning cache (no version field)")
    if data["version"] != CACHE_VERSION:
        raise CacheError(
            f"it is an attnkit tuning cache of version {data['version']!r}, this attnkit reads version {CACHE_VERSION}",
            foreign=False,
        )
    if not isinstance(data.get("entries"), dict):
        raise CacheError("its 'entries' is not a mapping")
    return data


def read_cache(path: str | os.PathLike, known: Mapping[str, Any]) -> tuple[dict[str, dict], int]:
    """The usable entries of the cache file and how many others it holds (kept in the
    file, not used). Raises as :func:`read_raw`, except that a path that is not a regular
    file holds nothing: ``({}, 0)``, with nothing opened. Saying so is left to
    :func:`update_cache` (CacheNotWritten), so that a user is told once, not at every read.
    """
    try:
        entries = read_raw(path)
    except NotRegularFile:
        return {}, 0
    good = {k: v for k, v in entries.items() if isinstance(k, str) and valid_entry(v, known)}
    return good, len(entries) - len(good)


def _lock_path(path: Path) -> str:
    return str(path) + ".lock"


def lock(path: Path):
    from filelock import FileLock

    return FileLock(_lock_path(path), timeout=LOCK_TIMEOUT_S)


def tmp_prefix(path: Path) -> str:
    return f"{path.name}.{os.getpid()}."


_TMP = re.compile(r"\.(\d+)\.[^.]*\.tmp$")


def _remove_stale_tmp(path: Path) -> None:
    """Temporary files of writers that were killed (their pid is gone, or they are old)."""
    now = time.time()
    for tmp in path.parent.glob(path.name + ".*.tmp"):
        m = _TMP.search(tmp.name)
        if m is None:
            continue
        pid = int(m.group(1))
        alive = pid != os.getpid() and _pid_alive(pid)
        try:
            old = now - tmp.stat().st_mtime > STALE_TMP_S
        except OSError:
            continue
        if not alive or old:
            with contextlib.suppress(OSError):
                tmp.unlink()


def update_cache(path: str | os.PathLike, entries: Mapping[str, dict], known: Mapping[str, Any]) -> list[str]:
    """Merge ``entries`` into the cache file, keeping everything else it holds.

    Returns what a user should be told (a foreign file moved aside). Raises
    CacheNotWritten when the file is left alone on purpose (read-only, newer version;
    NotRegularFile for a FIFO, a device, a directory...) and OSError when it cannot be
    written.
    """
    notes: list[str] = []
    link = Path(path)
    # before the folder or the lock is touched: for cache_path=os.devnull, no /dev/null.lock
    with contextlib.suppress(FileNotFoundError):
        refuse_special(link)
    target = Path(os.path.realpath(link))  # write through a symlink, never replace it
    target.parent.mkdir(parents=True, exist_ok=True)
    with lock(target):
        _remove_stale_tmp(target)
        st = None
        try:
            st = target.stat()
            refusal = _not_regular(link, st.st_mode)  # it may have changed since the check
            if refusal is not None:
                raise refusal
            # no write bit for anyone is a statement, even to root (whom os.access lets write)
            if not (st.st_mode & 0o222) or not os.access(target, os.W_OK):
                raise CacheNotWritten(f"{link} is read-only; it is left as it is")
            _give_lock_to_owner(target, st)
            document = _read_document(target)
        except FileNotFoundError:
            st, document = None, {}
        except CacheError as e:
            if not e.foreign:
                raise CacheNotWritten(f"{link}: {e}; it is left as it is") from e
            bad = _free_name(target.with_name(target.name + ".bad"))
            refuse_special(target)  # only a regular file is ever moved aside
            os.replace(target, bad)
            notes.append(f"{link} was not a tuning cache ({e}); it was moved to {bad}")
            st, document = None, {}
        current = document.setdefault("entries", {})
        current.update({k: v for k, v in entries.items() if valid_entry(v, known)})
        document["version"] = CACHE_VERSION
        fd, tmp = tempfile.mkstemp(prefix=tmp_prefix(target), suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(document, fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            if st is not None:
                _keep_owner(tmp, st)
            os.chmod(tmp, st.st_mode & 0o7777 if st is not None else 0o666 & ~_umask())
            # the last look before the replace: a FIFO or folder made meanwhile is not replaced
            with contextlib.suppress(FileNotFoundError):
                refuse_special(target)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return notes


def _give_lock_to_owner(target: Path, st: os.stat_result) -> None:
    """A lock file that root has just made beside a user's cache goes to that user: left
    root's (0644), it would stop the user's next save at the lock."""
    if not hasattr(os, "geteuid"):  # Windows
        return
    lock = _lock_path(target)
    with contextlib.suppress(OSError):
        if os.stat(lock, follow_symlinks=False).st_uid == os.geteuid() != st.st_uid:
            _keep_owner(lock, st)


def cache_key(call: AttentionCall) -> str:
    """The tuning cache's key for a call: device, torch version and the call's signature."""
    dev = call.device
    cap = "sm_" + "".join(map(str, dev.capability)) if dev.capability else "-"
    parts = [
        dev.type,
        dev.name or "-",
        cap,
        f"torch={torch.__version__}",
        dtype_name(call.dtype),
        f"D={call.head_dim}",
        f"M={call.q_len}",
        f"N={call.kv_len}",
        f"mask={call.mask}",
        f"grad={int(call.requires_grad)}",
    ]
    for flag in ("causal", "dropout", "lse"):
        if getattr(call, flag):
            parts.append(flag)
    return "|".join(parts)


__all__ = [
    "CACHE_VERSION",
    "CacheError",
    "CacheNotWritten",
    "LOCK_TIMEOUT_S",
    "NotRegularFile",
    "STALE_TMP_S",
    "cache_key",
    "default_cache_path",
    "read_cache",
    "read_raw",
    "update_cache",
    "valid_entry",
]
