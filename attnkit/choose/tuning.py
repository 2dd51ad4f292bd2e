"""auto(tune=True): checking and timing the candidates, and the JSON file that keeps what
was measured.

On the first call of a signature, the priority choice (the walk's first backend that can
serve it) is the incumbent:

* every other candidate's output is compared with the priority choice's on the same
  inputs (:func:`output_bound`, :func:`worst_row_error`): one whose worst query row is
  further from it than the project's tolerance rule allows (twice plain torch's error in
  that dtype against float64, plus a few units of rounding: each of the two may be that
  far from the exact result, so twice that apart), or that gives NaN or inf where the
  priority choice does not, is never chosen, and a warning names it, once per backend and
  signature;
* the priority choice and the candidates that passed are timed in interleaved rounds
  (``tune_iters`` of them, each timing every backend once, the order rotated per round:
  :func:`time_rounds`); a candidate replaces the priority choice only when its median
  per-round gain (priority ms / candidate ms - 1) is at least ``tune_margin`` (5% by
  default); among several, the one with the largest median gain.

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
import logging
import math
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from .._text import describe_exception
from ..backends import AttentionCall, Backend
from ..backends.base import dtype_name
from ..testing import EPSILON, reference_attention, torch_math_attention
from ._files import (  # noqa: F401  (CacheNotWritten and NotRegularFile: raised to this module's callers)
    CacheNotWritten,
    NotRegularFile,
    _free_name,
    _keep_owner,
    _not_regular,
    _pid_alive,
    _read_bytes,
    _refuse_special,
    _umask,
)
from .fixed import run_backend
from .guard import sample_inputs, sample_rows
from .policy import CANDIDATES, LAST_RESORT, describe_call

logger = logging.getLogger("attnkit")

CACHE_VERSION = 1
LOCK_TIMEOUT_S = 30.0
# A temporary file older than this whose writer is gone is a leftover of a killed writer.
STALE_TMP_S = 600.0
# auto(tune_margin=): the median per-round gain a candidate needs to replace the priority choice.
DEFAULT_MARGIN = 0.05
# The version of the output check an entry's figures come from (its "checked" field).
CHECKED = 1
# The output check's bound comes from plain torch math on a sample: up to this many query
# rows of up to two batch items and two heads (the first and the last).
CHECK_ROWS = 64
# The tolerance rule's factor: a backend may be this many times plain torch's error.
FACTOR = 2.0


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
            f"it is an attnkit tuning cache of version {data['version']!r}, this attnkit "
            f"reads version {CACHE_VERSION}", foreign=False,
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


def _lock(path: Path):
    from filelock import FileLock

    return FileLock(_lock_path(path), timeout=LOCK_TIMEOUT_S)


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
        _refuse_special(link)
    target = Path(os.path.realpath(link))  # write through a symlink, never replace it
    target.parent.mkdir(parents=True, exist_ok=True)
    with _lock(target):
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
            _refuse_special(target)  # only a regular file is ever moved aside
            os.replace(target, bad)
            notes.append(f"{link} was not a tuning cache ({e}); it was moved to {bad}")
            st, document = None, {}
        current = document.setdefault("entries", {})
        current.update({k: v for k, v in entries.items() if valid_entry(v, known)})
        document["version"] = CACHE_VERSION
        fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(target), suffix=".tmp", dir=target.parent)
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
                _refuse_special(target)
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


def check_margin(value: Any) -> float:
    """auto(tune_margin=)'s value as a float: a finite number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"tune_margin={value!r}: use a number in [0, 1), the gain a candidate needs over the "
                        f"priority choice (0.05: 5% faster)")
    value = float(value)
    if not math.isfinite(value) or not 0.0 <= value < 1.0:
        raise ValueError(f"tune_margin={value!r}: use a number in [0, 1), the gain a candidate needs over the "
                         f"priority choice (0.05: 5% faster); it must be at least 0 and below 1")
    return value


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as (rows, width), in float32 at least (a 16-bit difference is exact there)."""
    x = x.detach()
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    return x.reshape(-1, x.shape[-1] if x.dim() else 1)


def worst_row_error(out: torch.Tensor, ref: torch.Tensor, chunk: int = 1 << 22) -> float:
    """The largest distance of one row of ``out`` (a vector along the last dim; pass an
    LSE unsqueezed, one element a row) from the same row of ``ref``, over the root mean
    square of ``ref``'s row norms. A few wrong rows count in full: an
    average over the tensor would dilute them. Where both hold the same value (the -inf
    LSE of a row that sees no key) the row is not off; NaN or inf anywhere else gives inf.
    Computed in chunks of rows, in float32 (float64 for float64)."""
    if out.shape != ref.shape:
        return math.inf
    a, b = _rows(out), _rows(ref)
    step = max(1, chunk // max(1, a.shape[1]))
    worst, squares, count = 0.0, 0.0, 0
    for start in range(0, a.shape[0], step):
        x, y = a[start:start + step], b[start:start + step]
        same = x == y
        if not bool((torch.isfinite(x) & torch.isfinite(y) | same).all()):
            return math.inf
        diff = torch.where(same, torch.zeros_like(x), x - y)
        y = torch.where(torch.isfinite(y), y, torch.zeros_like(y))
        figures = torch.stack([torch.linalg.vector_norm(diff, dim=1).max(),
                               torch.linalg.vector_norm(y).square()]).tolist()
        worst, squares, count = max(worst, figures[0]), squares + figures[1], count + x.shape[0]
    rms = math.sqrt(squares / count) if count else 0.0
    if not math.isfinite(worst):
        return math.inf
    return worst / rms if rms > 0 else (0.0 if worst == 0 else math.inf)


def _spread(n: int, most: int, device) -> torch.Tensor:
    return torch.linspace(0, n - 1, min(n, most), device=device).round().long().unique()


def _torch_math_lse(q, k, bias, scale, upcast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(plain torch's row log-sum-exp in the inputs' dtype, the float64 one)."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    dtype = torch.float32 if upcast and q.dtype != torch.float64 else q.dtype
    scores = torch.matmul(q.to(dtype), k.to(dtype).transpose(-1, -2)) * scale
    exact = torch.matmul(q.double(), k.double().transpose(-1, -2)) * scale
    if bias is not None:
        scores, exact = scores + bias.to(dtype), exact + bias.double()
    return torch.logsumexp(scores, -1), torch.logsumexp(exact, -1)


def output_bound(args: tuple, rows: int = CHECK_ROWS) -> tuple[float, float | None]:
    """(the output's bound, the LSE's bound or None) for :func:`worst_row_error` of a
    candidate against the priority choice on ``args`` (run_backend's arguments).

    The project's tolerance rule (attnkit.testing) holds a backend to FACTOR times plain
    torch math's error in the inputs' dtype against float64, plus EPSILON (a few units of
    the dtype's rounding); two backends each that close to the exact result are at most
    twice that apart: bound = 2 * (FACTOR * torch's error + EPSILON). Torch's error is
    measured here as :func:`worst_row_error` on a sample (up to ``rows`` query rows of up
    to two batch items and two heads), so that the check costs a few rows, not a float64
    attention of the whole call.
    """
    q, k, v, attn_bias, scale, upcast, causal_offset, _, return_lse = args
    with torch.no_grad():
        b, h = _spread(q.shape[0], 2, q.device), _spread(q.shape[1], 2, q.device)
        q, k, v = (t.detach().index_select(0, b).index_select(1, h) for t in (q, k, v))
        bias = None
        if attn_bias is not None:
            bias = attn_bias.detach().reshape((1,) * (4 - attn_bias.dim()) + tuple(attn_bias.shape))
            bias = bias.index_select(0, b) if bias.shape[0] != 1 else bias
            bias = bias.index_select(1, h) if bias.shape[1] != 1 else bias
        q_s, bias_s = sample_inputs(q, k, v, bias, causal_offset, sample_rows(q.shape[2], rows, q.device))
        floor = EPSILON.get(q.dtype, 1e-3)

        def bound(error: float) -> float:
            return 2.0 * (FACTOR * (error if math.isfinite(error) else 0.0) + floor)

        out_bound = bound(worst_row_error(torch_math_attention(q_s, k, v, bias_s, scale, upcast=upcast),
                                          reference_attention(q_s, k, v, bias_s, scale)))
        lse_bound = None
        if return_lse:
            lse_bound = bound(worst_row_error(*(x.unsqueeze(-1) for x in _torch_math_lse(q_s, k, bias_s, scale,
                                                                                        upcast))))
    return out_bound, lse_bound


def output_difference(out, ref, bounds: tuple[float, float | None]) -> float:
    """``out``'s :func:`worst_row_error` against ``ref`` as a fraction of its bound (the
    larger of the output's and the LSE's where the call returns one): above 1, it differs."""
    out_bound, lse_bound = bounds
    if lse_bound is None:
        return worst_row_error(out, ref) / out_bound
    if not (isinstance(out, tuple) and isinstance(ref, tuple) and len(out) == len(ref) == 2):
        return math.inf
    return max(worst_row_error(out[0], ref[0]) / out_bound,
               worst_row_error(out[1].unsqueeze(-1), ref[1].unsqueeze(-1)) / lse_bound)


# The timer of the CPU rounds (the tests make it a clock of their own).
_clock = time.perf_counter


def time_rounds(backends: Mapping[str, Backend], args: tuple, rounds: int = 7, warmup: int = 2,
                failed: dict[str, BaseException] | None = None) -> dict[str, list[float]]:
    """Milliseconds of one forward on ``args`` per backend and round: after ``warmup``
    calls of each, ``rounds`` rounds that each time every backend once, in an order rotated
    by one per round (none is always first or last), so that a change of clock, another
    process or a warm cache falls on all of them alike. CUDA events on CUDA.

    With ``failed`` (a dict), a backend that raises, other than the first, is left out
    of the result and its error put there; the first one's error is raised.
    """
    labels = list(backends)
    times: dict[str, list[float]] = {label: [] for label in labels}
    q = args[0]
    cuda = q.device.type == "cuda"

    def once(label: str) -> float | None:
        try:
            if not cuda:
                t0 = _clock()
                run_backend(backends[label], *args)
                return (_clock() - t0) * 1e3
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            run_backend(backends[label], *args)
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        except Exception as exc:
            if failed is None or label == labels[0]:
                raise
            failed[label] = exc
            del times[label]
            return None

    with torch.no_grad():
        for label in labels:
            for _ in range(warmup):
                if label in times:
                    once(label)
        if cuda:
            torch.cuda.synchronize(q.device)
        for r in range(rounds):
            shift = r % len(labels)
            for label in labels[shift:] + labels[:shift]:
                if label in times:
                    ms = once(label)
                    if ms is not None:
                        times[label].append(ms)
    return times


def round_gains(times: Mapping[str, list[float]], priority: str) -> dict[str, float]:
    """Each candidate's median over the rounds of (the priority choice's ms / its ms - 1),
    rounded as the cache keeps it."""
    base = times[priority]
    gains = {}
    for label, mine in times.items():
        if label != priority:
            per_round = [p / max(c, 1e-9) - 1.0 for p, c in zip(base, mine)]
            gains[label] = round(statistics.median(per_round), 6)
    return gains


def _number(x: Any) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)


def choose_tuned(priority: str, gain: Mapping[str, Any], diff: Mapping[str, Any], margin: float,
                 labels: Sequence[str]) -> str:
    """The tuned choice among ``labels`` (in priority order): the candidate whose output
    passed the check (``diff`` a number at most 1) with the largest median gain, if that
    gain is at least ``margin``; else the priority choice. The same rule decides a fresh
    tuning and whether a cache entry is trusted."""
    best, best_gain = priority, None
    for label in labels:
        g, d = gain.get(label), diff.get(label)
        if label == priority or not (_number(g) and _number(d) and d <= 1.0):
            continue
        if g >= margin and (best_gain is None or g > best_gain):
            best, best_gain = label, g
    return best


def trusted(entry: Mapping[str, Any], labels: Sequence[str], priority: str, margin: float) -> bool:
    """Whether a cache entry may stand for a fresh tuning: its outputs were checked
    against this priority choice, and its own figures give its choice under ``margin``."""
    checked, gain, diff = entry.get("checked"), entry.get("gain"), entry.get("diff")
    if isinstance(checked, bool) or not isinstance(checked, int) or checked < CHECKED:
        return False
    if entry.get("priority") != priority or entry.get("backend") not in labels:
        return False
    if not isinstance(gain, dict) or not isinstance(diff, dict):
        return False
    return choose_tuned(priority, gain, diff, margin, labels) == entry["backend"]


def _percent(x: float) -> str:
    return f"{x * 100:+.1f}%"


def describe_tuning(backend: str, priority: str, gain: Mapping[str, Any], diff: Mapping[str, Any],
                    margin: float) -> str:
    """What tuning decided, in words (explain() and the INFO line)."""
    differs = [label for label, d in diff.items() if d == "differs"]
    failed = [label for label, d in diff.items() if d == "failed"]
    timed = {label: g for label, g in gain.items() if _number(g)}
    if backend != priority:
        text = (f"{backend} replaces the priority choice {priority}: median gain {_percent(timed[backend])} over "
                f"interleaved rounds, margin {_percent(margin)}")
    elif timed:
        text = (f"the priority choice {priority} kept: no candidate faster by the {_percent(margin)} margin ("
                + ", ".join(f"{label} {_percent(g)}" for label, g in timed.items()) + ")")
    else:
        text = f"the priority choice {priority} kept: no other candidate was timed"
    if differs:
        text += f"; output differs from {priority}'s, never chosen: {', '.join(differs)}"
    if failed:
        text += f"; failed: {', '.join(failed)}"
    return text


# -- auto(tune=True): what the AutoChooser does with the timings and the cache file --------------------
class Tuned:
    """The AutoChooser's tuning (a mixin: it reads the chooser's ``order``,
    ``cache_path``, ``tune_iters``, ``tune_margin``, ``backend()`` and its warn-once
    notes): on the first call of a signature, the candidates that can serve it are checked
    against the priority choice's output and timed with it on the real inputs, or the
    cache file's entry for it is taken; what was measured is kept in the file."""

    _disk: dict[str, dict] | None = None
    tune_margin: float = DEFAULT_MARGIN  # what a chooser pickled before the option existed has

    def _tuned(self, call, table, args) -> tuple[str, str, dict[str, float], dict[str, Any]]:
        """(label, how, ms, the Decision's tuning fields) for the first call of a signature."""
        ok = [label for label, reasons in table.items() if not reasons]
        priority = ok[0]
        candidates = ok
        if self.order is None:
            # the last resorts are timed only when nothing else can run
            candidates = [x for x in ok if x not in LAST_RESORT] or ok[:1]
        if priority not in candidates:
            candidates = [priority] + candidates
        if len(candidates) == 1:
            self._note_once(
                ("single", candidates[0]),
                "attnkit.auto(tune=True): only %s can serve calls like %s here; nothing to time",
                candidates[0], describe_call(call),
            )
            return candidates[0], "priority", {}, {}
        margin = self.tune_margin
        key = cache_key(call)
        cached = self._load_disk().get(key)
        if cached is not None and trusted(cached, candidates, priority, margin):
            gain, diff = cached["gain"], cached["diff"]
            info = {"priority": priority, "gain": dict(gain), "diff": dict(diff),
                    "note": describe_tuning(cached["backend"], priority, gain, diff, margin)}
            return cached["backend"], "tune cache", dict(cached.get("ms", {})), info
        what = describe_call(call)
        diff: dict[str, float | str] = {}
        # the check: every candidate's output against the priority choice's, on these inputs
        check_args = args if args[7] == 0.0 else args[:7] + (0.0,) + args[8:]  # dropout is random: none here
        try:
            with torch.no_grad():
                reference = run_backend(self.backend(priority), *check_args)
                bounds = output_bound(check_args)
        except Exception as exc:
            logger.warning("attnkit.auto(tune=True): %s, the priority choice, failed on %s while tuning (%s); "
                           "nothing is tuned for this signature", priority, what, describe_exception(exc))
            return priority, "priority", {}, {}
        passed = [priority]
        for label in candidates:
            if label == priority:
                continue
            try:
                with torch.no_grad():
                    fraction = output_difference(run_backend(self.backend(label), *check_args), reference, bounds)
            except Exception as exc:
                logger.warning("attnkit.auto(tune=True): %s failed on %s while tuning (%s); skipped",
                               label, what, describe_exception(exc))
                diff[label] = "failed"
                continue
            if fraction <= 1.0:
                diff[label] = round(fraction, 6)
                passed.append(label)
                continue
            diff[label] = "differs"
            self._warn_once(
                ("differs", label, key),
                "attnkit.auto(tune=True): %s's output differs from that of %s (the priority choice) on %s: %s; "
                "it is never chosen for this signature",
                label, priority, what,
                "it has NaN or inf where the priority choice's has none, or another shape" if math.isinf(fraction)
                else f"its worst query row is {fraction:.3g} times the bound of {bounds[0]:.3g} allowed in "
                     f"{dtype_name(call.dtype)} (twice the tolerance rule: {FACTOR:g}x plain torch's error "
                     f"against float64, plus rounding, relative to the output's rms row norm)",
            )
        del reference
        ms: dict[str, float] = {}
        gain: dict[str, float] = {}
        if len(passed) > 1:
            failed: dict[str, BaseException] = {}
            try:
                times = time_rounds({label: self.backend(label) for label in passed}, args, rounds=self.tune_iters,
                                    failed=failed)
            except Exception as exc:
                logger.warning("attnkit.auto(tune=True): %s, the priority choice, failed on %s while tuning (%s); "
                               "nothing is tuned for this signature", priority, what, describe_exception(exc))
                return priority, "priority", {}, {}
            for label, exc in failed.items():
                logger.warning("attnkit.auto(tune=True): %s failed while timing %s (%s); skipped",
                               label, what, describe_exception(exc))
                diff[label] = "failed"
            ms = {label: round(statistics.median(t), 6) for label, t in times.items()}
            gain = round_gains(times, priority)
        best = choose_tuned(priority, gain, diff, margin, candidates)
        entry = {"backend": best, "ms": ms, "priority": priority, "margin": margin, "rounds": self.tune_iters,
                 "gain": gain, "diff": diff, "checked": CHECKED}
        self._disk[key] = entry
        self._save(key, entry)
        info = {"priority": priority, "gain": dict(gain), "diff": dict(diff),
                "note": describe_tuning(best, priority, gain, diff, margin)}
        return best, "tuned", ms, info

    def _load_disk(self) -> dict[str, dict]:
        if self._disk is None:
            self._disk = {}
            try:
                self._disk, others = read_cache(self.cache_path, CANDIDATES)
                if others:
                    logger.info("attnkit.auto(tune=True): %s holds %d entries this attnkit does not use "
                                "(kept)", self.cache_path, others)
            except FileNotFoundError:
                logger.info("attnkit.auto(tune=True): no tuning cache at %s yet; timings will be saved there",
                            self.cache_path)
            except CacheError as exc:
                self._warn_once(("read", str(self.cache_path)),
                                "attnkit.auto(tune=True): cannot use the tuning cache %s: %s", self.cache_path, exc)
            except Exception as exc:  # a cache problem never fails a model call
                self._warn_once(("read", str(self.cache_path)),
                                "attnkit.auto(tune=True): cannot read the tuning cache %s (%s)",
                                self.cache_path, describe_exception(exc))
        return self._disk

    def _save(self, key: str, entry: dict) -> None:
        try:
            for note in update_cache(self.cache_path, {key: entry}, CANDIDATES):
                logger.warning("attnkit.auto(tune=True): %s", note)
        except CacheNotWritten as exc:
            self._warn_once(("write", str(self.cache_path)),
                            "attnkit.auto(tune=True): %s; tuned choices are not saved", exc)
        except Exception as exc:  # a cache problem never fails a model call
            self._warn_once(("write", str(self.cache_path)),
                            "attnkit.auto(tune=True): cannot write the tuning cache %s (%s); tuned "
                            "choices are not saved", self.cache_path, describe_exception(exc))


__all__ = [
    "CACHE_VERSION",
    "CHECKED",
    "DEFAULT_MARGIN",
    "CacheError",
    "CacheNotWritten",
    "NotRegularFile",
    "Tuned",
    "cache_key",
    "check_margin",
    "choose_tuned",
    "default_cache_path",
    "describe_tuning",
    "output_bound",
    "output_difference",
    "read_cache",
    "read_raw",
    "round_gains",
    "time_backend",
    "time_rounds",
    "trusted",
    "update_cache",
    "worst_row_error",
]
