"""auto(tune=True): timing the candidates, and the JSON file that keeps what was measured.

The file (``$XDG_CACHE_HOME/attnkit/autotune.json``, ``~/.cache/...`` by default) is
shared by every process on the machine and may be shared between attnkit versions, so:

* a cache problem never fails a model call: every error here becomes a warning, once;
* attnkit never destroys what it did not write: entries it does not understand (written
  by a newer attnkit) are kept; a file that is not a cache at all is moved aside to
  ``autotune.json.bad`` with a warning saying so; a file of a newer format version is
  left alone (tuned choices are then not saved); a read-only file is left alone with one
  warning; a symlinked path is written through (the link stays a link); the file's mode
  is kept;
* writers hold a lock (``filelock``, every OS) and replace the file atomically: readers
  never see half a file; temporary files left by a killed writer are removed by the next
  one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import torch

from .backends import AttentionCall, Backend
from .backends.base import dtype_name

logger = logging.getLogger("attnkit")

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

    Raises FileNotFoundError if there is no file, CacheError if it is not a cache.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
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
            f"it is an attnkit tuning cache of version {data['version']!r}, this attnkit "
            f"reads version {CACHE_VERSION}", foreign=False,
        )
    entries = data.get("entries")
    if not isinstance(entries, dict):
        raise CacheError("its 'entries' is not a mapping")
    return entries


def read_cache(path: str | os.PathLike, known: Mapping[str, Any]) -> tuple[dict[str, dict], int]:
    """The usable entries of the cache file and how many others it holds (kept in the
    file, not used). Raises as :func:`read_raw`."""
    entries = read_raw(path)
    good = {k: v for k, v in entries.items() if isinstance(k, str) and valid_entry(v, known)}
    return good, len(entries) - len(good)


class CacheNotWritten(OSError):
    """The cache was left as it is, on purpose; the message says why."""


def _lock(path: Path):
    from filelock import FileLock

    return FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S)


def _tmp_prefix(path: Path) -> str:
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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def update_cache(path: str | os.PathLike, entries: Mapping[str, dict], known: Mapping[str, Any]) -> list[str]:
    """Merge ``entries`` into the cache file, keeping everything else it holds.

    Returns what a user should be told (a foreign file moved aside). Raises
    CacheNotWritten when the file is left alone on purpose (read-only, newer version)
    and OSError when it cannot be written.
    """
    notes: list[str] = []
    link = Path(path)
    target = Path(os.path.realpath(link))  # write through a symlink, never replace it
    target.parent.mkdir(parents=True, exist_ok=True)
    with _lock(target):
        _remove_stale_tmp(target)
        mode = None
        try:
            st = target.stat()
            mode = st.st_mode & 0o7777
            # no write bit for anyone is a statement, even to root (whom os.access lets write)
            if not (mode & 0o222) or not os.access(target, os.W_OK):
                raise CacheNotWritten(f"{link} is read-only; it is left as it is")
            current = read_raw(target)
        except FileNotFoundError:
            current = {}
        except CacheError as e:
            if not e.foreign:
                raise CacheNotWritten(f"{link}: {e}; it is left as it is") from e
            bad = _free_name(target.with_name(target.name + ".bad"))
            os.replace(target, bad)
            notes.append(f"{link} was not a tuning cache ({e}); it was moved to {bad}")
            current = {}
        current.update({k: v for k, v in entries.items() if valid_entry(v, known)})
        fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(target), suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"version": CACHE_VERSION, "entries": current}, fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, mode if mode is not None else 0o666 & ~_umask())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return notes


def _free_name(path: Path) -> Path:
    """``path``, or ``path.1``, ``path.2``... : a name no file has (an earlier .bad stays)."""
    candidate, n = path, 0
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def cache_key(call: AttentionCall) -> str:
    """The tuning cache's key for a call: device, torch version and the call's signature."""
    dev = call.device
    cap = "sm_" + "".join(map(str, dev.capability)) if dev.capability else "-"
    parts = [
        dev.type, dev.name or "-", cap, f"torch={torch.__version__}", dtype_name(call.dtype),
        f"D={call.head_dim}", f"M={call.q_len}", f"N={call.kv_len}", f"mask={call.mask}",
        f"grad={int(call.requires_grad)}",
    ]
    for flag in ("causal", "dropout", "lse"):
        if getattr(call, flag):
            parts.append(flag)
    return "|".join(parts)


def time_backend(backend: Backend, args: tuple, warmup: int = 2, iters: int = 7) -> float:
    """Median milliseconds of one forward on ``args`` (run_backend's arguments after the
    backend: q, k, v, bias, scale, upcast, causal_offset, dropout_p, return_lse), with
    CUDA events on CUDA."""
    from .processor import run_backend

    q = args[0]
    with torch.no_grad():
        for _ in range(warmup):
            run_backend(backend, *args)
        times = []
        if q.device.type == "cuda":
            torch.cuda.synchronize(q.device)
            for _ in range(iters):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                run_backend(backend, *args)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
        else:
            for _ in range(iters):
                t0 = time.perf_counter()
                run_backend(backend, *args)
                times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


__all__ = [
    "CACHE_VERSION",
    "CacheError",
    "CacheNotWritten",
    "cache_key",
    "default_cache_path",
    "read_cache",
    "read_raw",
    "time_backend",
    "update_cache",
]
