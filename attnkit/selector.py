"""auto(): one processor that picks, per call, the first backend that can serve it.

    unet.set_attn_processor(attnkit.auto())

How a backend is chosen
-----------------------
A call is described by its device (type and CUDA compute capability), dtype, head dim,
query and key lengths, mask kind (none, key padding, arbitrary bias), whether gradients
are needed and which optional packages are installed (an :class:`AttentionCall`). The
device's hardware class (:func:`hardware_class`) names a priority list
(:data:`PRIORITIES`, each written down with the reason for its order), and
:func:`choose` takes the first backend of that list whose ``not_supported_reasons`` is
empty. :func:`choose` is a pure function of the described call, so the choice for an
H100 with flash-attn installed can be asked for (and tested) on a laptop.

The processor caches the decision per call signature (device, dtype, head dim, query
length, key length, mask kind, grad), so a call costs one tuple and one dict lookup
more than the backend itself. Each decision is logged once at INFO on the "attnkit"
logger, naming the first module that needed it and why the backends before the chosen
one were skipped; ``processor.explain()`` returns every decision as a table.

Overrides
---------
* ``ATTNKIT_BACKEND=name`` in the environment (read when auto() is called) forces one
  backend: auto() then behaves as that named processor and raises
  :class:`BackendUnavailable` with its reasons for a call it cannot serve.
* ``auto(order=[...])`` replaces the per-hardware lists with your own order;
  ``auto(exclude=[...])`` never picks the named backends;
  ``auto(backend_options={"sliced": {"slice_size": 2}})`` passes constructor options.

Failures at run time
--------------------
If the chosen backend raises (out of memory, a kernel that does not build, a package
broken at import), auto() logs a warning once, remembers the failure for that signature
and runs the next candidate: the result is still correct. (Inside a torch.compile'd
graph, errors are raised as they are: a graph cannot re-run a different backend.)

Tuning
------
``auto(tune=True)``: on the first call of a signature, every candidate that can serve
it is timed on the real inputs (CUDA events, warm-up, median of several runs; wall
clock on other devices) and the fastest is kept. Tuned decisions persist in a JSON file,
by default ``$XDG_CACHE_HOME/attnkit/autotune.json`` (``~/.cache/attnkit/...``), or
``auto(tune=True, cache_path=...)``. Entries are keyed by device name, capability and
torch version. A missing file is normal; an unreadable or corrupt one is ignored with one
warning; entries naming unknown backends or of the wrong types are dropped, and a cached
backend that can no longer serve the call (package removed) is re-tuned. Writers take a
file lock and replace the file atomically, so concurrent processes never corrupt it.

torch.compile
-------------
Under ``torch.compile`` the decision is made while tracing (in plain Python, outside
the graph, by the same rules) per (device, dtype, head dim, mask kind, grad): query and
key lengths may be symbolic there. Only the chosen backend's computation is traced, so
``fullgraph=True`` works and the selection costs nothing at run time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import torch

from .backends import AttentionCall, Backend, BackendUnavailable, DeviceInfo, get_backend, mask_kind
from .backends.base import dtype_name, package_version
from .processor import AttnkitProcessor, _is_compiling, describe_module, mark_compile_constant

logger = logging.getLogger("attnkit")

ENV_VAR = "ATTNKIT_BACKEND"
CACHE_VERSION = 1

# What auto() can choose: label -> (registered backend name, constructor options).
CANDIDATES: dict[str, tuple[str, dict[str, Any]]] = {
    "flash_attn3": ("flash_attn", {"version": 3}),
    "flash_attn": ("flash_attn", {}),
    "sdpa": ("sdpa", {}),
    "triton": ("triton", {}),
    "xformers": ("xformers", {}),
    "sliced": ("sliced", {}),
    "vanilla": ("vanilla", {}),
}

# Never a first choice: they hold the whole score matrix (per slice). Last in every list
# so that auto() can always run; sliced before vanilla because a fused kernel that fails
# at run time has most often run out of memory, and sliced needs the least.
LAST_RESORT = ("sliced", "vanilla")

# Every package a backend may need (distribution names), for the installed snapshot.
PACKAGES = ("xformers", "flash_attn", "flash_attn_3", "flashattn-hopper", "triton")


@dataclass(frozen=True)
class Priority:
    """One hardware class's order of backends and why it is that order."""

    order: tuple[str, ...]
    why: str


_HOST = Priority(
    ("sdpa",) + LAST_RESORT,
    "torch's SDPA has fused kernels here for every float dtype, head dim and mask, with "
    "memory linear in the sequence. triton, xformers and flash_attn have no kernel for "
    "this device (triton's CPU interpreter is for tests only and never chosen).",
)

PRIORITIES: dict[str, Priority] = {
    "sm_90": Priority(
        ("flash_attn3", "flash_attn", "sdpa", "triton", "xformers") + LAST_RESORT,
        "Hopper (H100/H200/H20/GH200). FlashAttention-3 is written for Hopper's TMA and "
        "warpgroup MMA and is the fastest maskless kernel there; FlashAttention-2 as "
        "installed is at least as new as the copy torch vendors. SDPA next: its cuDNN / "
        "flash / memory-efficient kernels take every dtype and mask. attnkit's triton "
        "kernel comes after SDPA until the benchmark measures it ahead on this class "
        "(tune=True times it on your shapes). xformers last of the fused kernels: on "
        "sm_80+ it dispatches to the same FlashAttention-2/CUTLASS kernels SDPA vendors, "
        "behind an extra layout and bias conversion.",
    ),
    "sm_80": Priority(
        ("flash_attn", "sdpa", "triton", "xformers") + LAST_RESORT,
        "A100/A800/A30 (164 KB shared memory per SM). FlashAttention-2 is at home here; "
        "SDPA's flash kernel is a vendored FlashAttention-2, so it is a close second and "
        "also takes masks and fp32. triton after SDPA until measured on this class (this is "
        "the first class to reorder once the benchmark shows it ahead). xformers as on "
        "sm_90.",
    ),
    "sm_86-89": Priority(
        ("flash_attn", "sdpa", "xformers", "triton") + LAST_RESORT,
        "Consumer and inference Ampere/Ada (RTX 30xx/40xx, A10, A40, L4, L40): 100 KB of "
        "shared memory per SM instead of A100's 164 KB. FlashAttention-2 and SDPA ship "
        "tiles tuned for it; xformers' CUTLASS kernel too. attnkit's triton tiles fit the "
        "99 KB (the inspector checks the first sm_80 candidate against it) but are "
        "unmeasured on these GPUs, so it comes last of the fused kernels.",
    ),
    "sm_75-": Priority(
        ("xformers", "sdpa", "triton") + LAST_RESORT,
        "Turing, Volta, Pascal (T4, V100, P100, RTX 20xx): no FlashAttention (it needs "
        "sm_80). xformers' CUTLASS memory-efficient kernel was written for these GPUs "
        "(sm_50+) and is what SDPA's memory-efficient kernel vendors, usually in an older "
        "version, so xformers first where installed, SDPA otherwise; triton last of the "
        "fused kernels (its tensor-core code targets sm_80+).",
    ),
    "sm_100+": Priority(
        ("sdpa", "flash_attn", "triton", "xformers") + LAST_RESORT,
        "Blackwell and newer (B200, RTX 50xx): torch's SDPA (cuDNN) has native kernels; "
        "FlashAttention-2/3 and attnkit's triton tiles were built and tuned for sm_80/sm_90.",
    ),
    "cuda": Priority(
        ("sdpa", "flash_attn", "xformers", "triton") + LAST_RESORT,
        "CUDA device of unknown compute capability: SDPA, which chooses its own kernel "
        "per call, first.",
    ),
    "rocm": Priority(
        ("sdpa",) + LAST_RESORT,
        "AMD GPUs (ROCm): SDPA runs AOTriton/CK flash kernels; attnkit's triton kernel and "
        "the xformers/flash_attn backends are tested on NVIDIA GPUs only.",
    ),
    "cpu": _HOST,
    "mps": _HOST,
    "xpu": _HOST,
    "other": _HOST,
}


def hardware_class(device: DeviceInfo) -> str:
    """The key of :data:`PRIORITIES` for a device."""
    if device.type != "cuda":
        return device.type if device.type in ("cpu", "mps", "xpu") else "other"
    name = (device.name or "").lower()
    if any(word in name for word in ("amd", "radeon", "instinct")):
        return "rocm"
    cap = device.capability
    if cap is None:
        return "cuda"
    cap = tuple(cap)
    if cap >= (10, 0):
        return "sm_100+"
    if cap >= (9, 0):
        return "sm_90"
    if cap == (8, 0):
        return "sm_80"
    if cap >= (8, 0):
        return "sm_86-89"
    return "sm_75-"


def priority_for(device: DeviceInfo) -> tuple[str, Priority]:
    cls = hardware_class(device)
    return cls, PRIORITIES[cls]


# -- installed packages and backend instances -------------------------------------------
_PACKAGES_SNAPSHOT: dict[str, str | None] | None = None
_DEFAULT_BACKENDS: dict[str, Backend | Exception] = {}
_LOCK = threading.RLock()


def installed_packages(refresh: bool = False) -> dict[str, str | None]:
    """Versions of the optional packages (None: not installed), looked up once."""
    global _PACKAGES_SNAPSHOT
    if _PACKAGES_SNAPSHOT is None or refresh:
        _PACKAGES_SNAPSHOT = {name: package_version(name) for name in PACKAGES}
    return dict(_PACKAGES_SNAPSHOT)


def _make_backend(label: str, options: Mapping[str, Any] | None = None) -> Backend | Exception:
    name, base = CANDIDATES[label]
    try:
        return get_backend(name, **{**base, **(options or {})})
    except Exception as e:  # a module that does not import (triton missing), bad options
        return e


def _default_backend(label: str) -> Backend | Exception:
    with _LOCK:
        backend = _DEFAULT_BACKENDS.get(label)
        if backend is None:
            backend = _DEFAULT_BACKENDS[label] = _make_backend(label)
        return backend


def _reasons(backend: Backend | Exception, call: AttentionCall) -> list[str]:
    if isinstance(backend, Exception):
        return [f"could not be loaded ({type(backend).__name__}: {backend})"]
    try:
        return list(backend.not_supported_reasons(call))
    except Exception as e:  # a backend's own check must never take auto() down
        return [f"its capability check raised {type(e).__name__}: {e}"]


def _validate_labels(labels: Iterable[str], what: str) -> tuple[str, ...]:
    labels = tuple(labels)
    unknown = [x for x in labels if x not in CANDIDATES]
    if unknown:
        raise ValueError(
            f"{what}: unknown backend(s) {', '.join(map(repr, unknown))}; "
            f"choose from {', '.join(CANDIDATES)}"
        )
    return labels


def choose(
    call: AttentionCall,
    order: Sequence[str] | None = None,
    exclude: Iterable[str] = (),
    backends: Mapping[str, Backend | Exception] | None = None,
) -> tuple[str, dict[str, list[str]]]:
    """The backend auto() picks for ``call``, and why every candidate can or cannot run.

    Returns (label, table): table maps each candidate of the order, in order, to its
    reasons (empty: it can run). ``order`` defaults to the call's hardware class list;
    ``exclude`` removes candidates ("excluded" in the table); ``backends`` supplies
    instances (default: each backend with default options).
    Raises BackendUnavailable, listing every reason, when no candidate can run.
    """
    if order is None:
        order = priority_for(call.device)[1].order
    excluded = set(exclude)
    table: dict[str, list[str]] = {}
    chosen = None
    for label in order:
        if label in excluded:
            table[label] = ["excluded"]
            continue
        backend = backends.get(label) if backends is not None else None
        if backend is None:
            backend = _default_backend(label)
        table[label] = _reasons(backend, call)
        if chosen is None and not table[label]:
            chosen = label
    if chosen is None:
        raise BackendUnavailable(
            f"no attention backend can serve {describe_call(call)}: "
            + "; ".join(f"{k}: {', '.join(v)}" for k, v in table.items())
        )
    return chosen, table


def describe_call(call: AttentionCall) -> str:
    dev = call.device.type
    if call.device.capability is not None:
        dev += " sm_" + "".join(map(str, call.device.capability))
    return (
        f"{dev} {dtype_name(call.dtype)} D={call.head_dim} M={call.q_len} N={call.kv_len} "
        f"mask={call.mask}" + (" grad" if call.requires_grad else "")
    )


# -- the tuning cache --------------------------------------------------------------------
def default_cache_path() -> Path:
    """$XDG_CACHE_HOME/attnkit/autotune.json, or ~/.cache/attnkit/autotune.json."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attnkit" / "autotune.json"


class CacheError(ValueError):
    """The tuning cache file exists but cannot be used."""


def _valid_entry(value: Any) -> bool:
    if not isinstance(value, dict) or value.get("backend") not in CANDIDATES:
        return False
    ms = value.get("ms", {})
    if not isinstance(ms, dict):
        return False
    for k, v in ms.items():
        if k not in CANDIDATES or isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        if not math.isfinite(v) or v < 0:
            return False
    return True


def read_cache(path: str | os.PathLike) -> tuple[dict[str, dict], int]:
    """The valid entries of a cache file and how many invalid ones were dropped.

    Raises FileNotFoundError if it does not exist and CacheError if it is not a cache
    (unreadable, not JSON, another version, wrong structure).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as e:
        raise CacheError(f"cannot read it ({e})") from e
    try:
        data = json.loads(text)
    except ValueError as e:
        raise CacheError(f"it is not valid JSON ({e})") from e
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        raise CacheError(f"it is not an attnkit tuning cache of version {CACHE_VERSION}")
    entries = data.get("entries")
    if not isinstance(entries, dict):
        raise CacheError("its 'entries' is not a mapping")
    good = {k: v for k, v in entries.items() if isinstance(k, str) and _valid_entry(v)}
    return good, len(entries) - len(good)


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive lock on ``path``.lock between processes (no-op where unsupported)."""
    lock_path = path.with_name(path.name + ".lock")
    try:
        import fcntl
    except ImportError:  # Windows: os.replace keeps the file whole; updates may race
        yield
        return
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def update_cache(path: str | os.PathLike, entries: Mapping[str, dict]) -> None:
    """Merge ``entries`` into the cache file: under a file lock, written to a temporary
    file in the same folder and moved over the old one (readers never see half a file).
    An unreadable or corrupt existing file is replaced."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(path):
        try:
            current, _ = read_cache(path)
        except (FileNotFoundError, CacheError):
            current = {}
        current.update({k: v for k, v in entries.items() if _valid_entry(v)})
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"version": CACHE_VERSION, "entries": current}, fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def _cache_key(call: AttentionCall) -> str:
    dev = call.device
    cap = "sm_" + "".join(map(str, dev.capability)) if dev.capability else "-"
    return "|".join(
        (
            dev.type, dev.name or "-", cap, f"torch={torch.__version__}", dtype_name(call.dtype),
            f"D={call.head_dim}", f"M={call.q_len}", f"N={call.kv_len}", f"mask={call.mask}",
            f"grad={int(call.requires_grad)}",
        )
    )


def time_backend(
    backend: Backend, q, k, v, attn_bias, scale, upcast, warmup: int = 2, iters: int = 7
) -> float:
    """Median milliseconds of one forward on these inputs (CUDA events on CUDA)."""
    with torch.no_grad():
        for _ in range(warmup):
            backend.forward(q, k, v, attn_bias, scale, upcast)
        times = []
        if q.device.type == "cuda":
            torch.cuda.synchronize(q.device)
            for _ in range(iters):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                backend.forward(q, k, v, attn_bias, scale, upcast)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
        else:
            for _ in range(iters):
                t0 = time.perf_counter()
                backend.forward(q, k, v, attn_bias, scale, upcast)
                times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


# -- the processor ---------------------------------------------------------------------
@dataclass
class Decision:
    """One row of ``explain()``: what auto() chose for a call signature, and why."""

    call: AttentionCall
    backend: str
    table: dict[str, list[str]]
    hardware: str
    module: str
    how: str  # "priority", "tuned", "tune cache", "forced", "fallback"
    ms: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


class _Slot:
    """A fixed holder for one candidate's instance, filled on first use (the compiled
    path reads instances through these so the dict it sees never changes)."""

    __slots__ = ("backend",)

    def __init__(self) -> None:
        self.backend: Backend | Exception | None = None


class AutoProcessor(AttnkitProcessor):
    """The diffusers attention processor that picks a backend per call (see module doc).

    Options: tune (bool), cache_path (JSON file for tune=True), order (your priority
    list for every device), exclude (backends never to pick), backend_options
    ({label: constructor options}), tune_iters (timed runs per candidate).
    """

    def __init__(
        self,
        *,
        tune: bool = False,
        cache_path: str | os.PathLike | None = None,
        order: Sequence[str] | None = None,
        exclude: Iterable[str] = (),
        backend_options: Mapping[str, Mapping[str, Any]] | None = None,
        tune_iters: int = 7,
    ) -> None:
        # No single backend: AttnkitProcessor.__init__ is not called on purpose.
        self.backend = None
        self._reasons = {}
        self.tune = bool(tune)
        self.cache_path = Path(cache_path) if cache_path is not None else default_cache_path()
        self.order = None if order is None else _validate_labels(order, "order")
        self.exclude = frozenset(_validate_labels(exclude, "exclude"))
        backend_options = dict(backend_options or {})
        _validate_labels(backend_options, "backend_options")
        self.backend_options = {label: dict(opts) for label, opts in backend_options.items()}
        if not isinstance(tune_iters, int) or tune_iters < 1:
            raise ValueError(f"tune_iters={tune_iters!r}: use a positive int")
        self.tune_iters = tune_iters
        forced = os.environ.get(ENV_VAR, "").strip()
        if forced in ("", "auto"):
            forced = None
        elif forced not in CANDIDATES:
            raise ValueError(
                f"{ENV_VAR}={forced!r} is not a backend; set it to one of "
                f"{', '.join(CANDIDATES)} (or unset it to let auto() choose)"
            )
        self.forced: str | None = forced
        self._slots = {label: _Slot() for label in CANDIDATES}
        self._decisions: dict[tuple, Backend] = {}  # signature -> backend: the hot path
        self._records: dict[tuple, Decision] = {}  # signature -> Decision: explain()
        self._compiled: dict[tuple, str] = {}  # signature without lengths -> label
        self._warned: set = set()
        self._disk: dict[str, dict] | None = None
        for label, opts in self.backend_options.items():
            # bad options are the caller's mistake: say so now, not as a skipped backend
            backend = _make_backend(label, opts)
            if isinstance(backend, (TypeError, ValueError)):
                raise ValueError(f"backend_options[{label!r}]: {backend}") from backend
            self._slots[label].backend = backend
        mark_compile_constant(_compiled_choice)

    def __repr__(self) -> str:
        opts = []
        if self.tune:
            opts.append(f"tune=True, cache_path={str(self.cache_path)!r}")
        if self.order is not None:
            opts.append(f"order={list(self.order)!r}")
        if self.exclude:
            opts.append(f"exclude={sorted(self.exclude)!r}")
        if self.forced:
            opts.append(f"forced by {ENV_VAR}={self.forced!r}")
        return f"AutoProcessor({', '.join(opts)})"

    # -- the per-call path ----------------------------------------------------------
    def attention(self, attn, q, k, v, attn_bias, scale, upcast):
        if _is_compiling():
            return self._compiled_attention(q, k, v, attn_bias, scale, upcast)
        dev = q.device
        key = (
            dev.type, dev.index, q.dtype, q.shape[-1], q.shape[-2], k.shape[-2],
            "none" if attn_bias is None else mask_kind(attn_bias),
            torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad),
        )
        backend = self._decisions.get(key)
        if backend is None:
            backend = self._decide(key, attn, q, k, v, attn_bias, scale, upcast)
        try:
            return backend.forward(q, k, v, attn_bias, scale, upcast)
        except Exception as exc:
            return self._fall_back(key, exc, attn, q, k, v, attn_bias, scale, upcast)

    def _compiled_attention(self, q, k, v, attn_bias, scale, upcast):
        dev = q.device
        key = (
            dev.type, dev.index, q.dtype, q.shape[-1],
            "none" if attn_bias is None else mask_kind(attn_bias),
            torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad),
        )
        label = _compiled_choice(self, key)
        return self._slots[label].backend.forward(q, k, v, attn_bias, scale, upcast)

    # -- deciding -------------------------------------------------------------------
    def _backend(self, label: str) -> Backend | Exception:
        slot = self._slots[label]
        if slot.backend is None:
            slot.backend = _default_backend(label)
        return slot.backend

    def _order(self, device: DeviceInfo) -> tuple[str, tuple[str, ...]]:
        if self.forced is not None:
            return f"{ENV_VAR}={self.forced}", (self.forced,)
        if self.order is not None:
            return "order=", self.order
        cls, priority = priority_for(device)
        return cls, priority.order

    def _call(self, q, k, v, attn_bias) -> AttentionCall:
        return replace(AttentionCall.from_tensors(q, k, v, attn_bias), packages=installed_packages())

    def _table(self, call: AttentionCall, order, failed: Mapping[str, str] = ()) -> dict[str, list[str]]:
        table = {}
        for label in order:
            if label in self.exclude and self.forced is None:
                table[label] = ["excluded"]
            elif label in failed:
                table[label] = [f"failed at run time ({failed[label]})"]
            else:
                table[label] = _reasons(self._backend(label), call)
        return table

    def _raise_unavailable(self, call: AttentionCall, table, module: str):
        if self.forced is not None:
            raise BackendUnavailable(
                f"{ENV_VAR}={self.forced} forces attnkit backend {self.forced!r}, which cannot "
                f"serve {module} ({describe_call(call)}): {'; '.join(table[self.forced])}. "
                f"Unset {ENV_VAR} to let auto() choose (`attnkit info` lists every backend)."
            )
        raise BackendUnavailable(
            f"attnkit.auto() found no backend for {module} ({describe_call(call)}): "
            + "; ".join(f"{k}: {', '.join(v)}" for k, v in table.items())
        )

    def _decide(self, key, attn, q, k, v, attn_bias, scale, upcast) -> Backend:
        with _LOCK:
            backend = self._decisions.get(key)
            if backend is not None:
                return backend
            call = self._call(q, k, v, attn_bias)
            hw, order = self._order(call.device)
            table = self._table(call, order)
            ok = [label for label, reasons in table.items() if not reasons]
            module = describe_module(attn)
            if not ok:
                self._raise_unavailable(call, table, module)
            label, how, ms = ok[0], ("forced" if self.forced else "priority"), {}
            if self.tune and self.forced is None:
                label, how, ms = self._tuned(call, hw, ok, q, k, v, attn_bias, scale, upcast)
            record = Decision(call, label, table, hw, module, how, ms)
            self._records[key] = record
            backend = self._decisions[key] = self._backend(label)
            logger.info("%s", _log_line(record))
            return backend

    def _tuned(self, call, hw, ok, q, k, v, attn_bias, scale, upcast):
        candidates = ok
        if self.order is None:
            # the last resorts are timed only when nothing else can run
            candidates = [x for x in ok if x not in LAST_RESORT] or ok[:1]
        cache_key = _cache_key(call)
        disk = self._load_disk()
        cached = disk.get(cache_key)
        if cached is not None and cached["backend"] in candidates:
            return cached["backend"], "tune cache", dict(cached.get("ms", {}))
        if len(candidates) == 1:
            return candidates[0], "priority", {}
        ms: dict[str, float] = {}
        for label in candidates:
            try:
                ms[label] = time_backend(
                    self._backend(label), q, k, v, attn_bias, scale, upcast, iters=self.tune_iters
                )
            except Exception as exc:
                logger.warning("attnkit.auto(tune=True): %s failed while timing %s (%s); skipped",
                               label, describe_call(call), _short(exc))
        if not ms:
            return candidates[0], "priority", {}
        best = min(ms, key=ms.get)
        entry = {"backend": best, "ms": {k2: round(v2, 6) for k2, v2 in ms.items()}}
        disk[cache_key] = entry
        try:
            update_cache(self.cache_path, {cache_key: entry})
        except OSError as exc:
            self._warn_once(("write", str(self.cache_path)),
                            "attnkit.auto(tune=True): cannot write the tuning cache %s (%s); "
                            "tuned choices will not persist", self.cache_path, exc)
        return best, "tuned", ms

    def _load_disk(self) -> dict[str, dict]:
        if self._disk is None:
            try:
                self._disk, dropped = read_cache(self.cache_path)
                if dropped:
                    self._warn_once(("dropped", str(self.cache_path)),
                                    "attnkit.auto(tune=True): ignored %d invalid entries of the tuning "
                                    "cache %s", dropped, self.cache_path)
            except FileNotFoundError:
                logger.info("attnkit.auto(tune=True): no tuning cache at %s yet; it will be created",
                            self.cache_path)
                self._disk = {}
            except CacheError as exc:
                self._warn_once(("corrupt", str(self.cache_path)),
                                "attnkit.auto(tune=True): ignoring the tuning cache %s: %s. It will "
                                "be rewritten with new measurements.", self.cache_path, exc)
                self._disk = {}
        return self._disk

    def _warn_once(self, what, msg, *args) -> None:
        if what not in self._warned:
            self._warned.add(what)
            logger.warning(msg, *args)

    # -- failures at run time -------------------------------------------------------
    def _fall_back(self, key, exc, attn, q, k, v, attn_bias, scale, upcast):
        if self.forced is not None:
            raise exc
        first = exc
        with _LOCK:
            record = self._records[key]
        while True:
            failed_label = record.backend
            record.failed[failed_label] = _short(exc)
            table = self._table(record.call, self._order(record.call.device)[1], record.failed)
            ok = [label for label, reasons in table.items() if not reasons]
            if not ok:
                raise first
            label = ok[0]
            self._warn_once(
                ("failed", key, failed_label),
                "attnkit.auto(): %s failed on %s (%s) in %s; falling back to %s for this signature",
                failed_label, describe_call(record.call), _short(exc), describe_module(attn), label,
            )
            backend = self._backend(label)
            record = replace(record, backend=label, table=table, how="fallback", failed=dict(record.failed))
            with _LOCK:
                self._records[key] = record
                self._decisions[key] = backend
            try:
                return backend.forward(q, k, v, attn_bias, scale, upcast)
            except Exception as e:
                exc = e

    # -- under torch.compile ------------------------------------------------------------
    def _choose_for_compile(self, key) -> str:
        with _LOCK:
            label = self._compiled.get(key)
            if label is not None:
                return label
            dev_type, index, dtype, head_dim, mask, grad = key
            # Reuse what eager calls of this signature decided (tuned, or after a failure).
            seen = Counter(
                r.backend for k, r in self._records.items()
                if (k[0], k[1], k[2], k[3], k[6], k[7]) == key
            )
            call = AttentionCall(
                device=_device_info(dev_type, index), dtype=dtype, head_dim=head_dim,
                q_len=1, kv_len=1, mask=mask, requires_grad=grad, packages=installed_packages(),
            )
            hw, order = self._order(call.device)
            table = self._table(call, order)
            ok = [x for x in table if not table[x]]
            if seen and seen.most_common(1)[0][0] in ok:
                label = seen.most_common(1)[0][0]
            elif ok:
                label = ok[0]
            else:
                self._raise_unavailable(call, table, "a compiled attention module")
            self._backend(label)
            self._compiled[key] = label
            logger.info("%s", _log_line(Decision(call, label, table, hw, "torch.compile graph", "compile")))
            return label

    # -- explaining -----------------------------------------------------------------
    @property
    def decisions(self) -> list[Decision]:
        """Every decision so far, in the order they were made."""
        return list(self._records.values())

    def explain(self, call: AttentionCall | None = None) -> str:
        """The decision table: per call signature, the chosen backend and, for every
        candidate in priority order, why it can or cannot run (and timings if tuned).

        With ``call``, the table for that one (possibly hypothetical) call instead.
        """
        if call is not None:
            if call.packages is None:
                call = replace(call, packages=installed_packages())
            hw, order = self._order(call.device)
            table = self._table(call, order)
            ok = [x for x in table if not table[x]]
            label = ok[0] if ok else "(none)"
            return _format_decision(Decision(call, label, table, hw, "-", "priority"))
        lines = [f"{self!r}: {len(self._records)} call signature(s)"]
        if not self._records and not self._compiled:
            lines.append("  no attention call yet: run the model once, or pass an AttentionCall")
        for record in self._records.values():
            lines.append(_format_decision(record))
        for (dev_type, index, dtype, d, mask, grad), label in self._compiled.items():
            lines.append(
                f"[compiled] {dev_type} {dtype_name(dtype)} D={d} mask={mask}"
                + (" grad" if grad else "") + f" -> {label}"
            )
        return "\n".join(lines)


def _compiled_choice(proc: AutoProcessor, key: tuple) -> str:
    """Run by torch.compile while tracing, in plain Python: the label of the backend for
    a signature. The result is a constant of the graph; no selection code is traced."""
    return proc._choose_for_compile(key)


def _device_info(kind: str, index: int | None) -> DeviceInfo:
    return DeviceInfo.of(torch.device(kind, index) if index is not None else torch.device(kind))


def _short(exc: BaseException, limit: int = 200) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _log_line(record: Decision) -> str:
    skipped = []
    for label, reasons in record.table.items():
        if label == record.backend:
            break
        skipped.append(f"{label}: {', '.join(reasons)}")
    timing = ""
    if record.ms:
        timing = " [" + ", ".join(f"{k} {v:.3f} ms" for k, v in sorted(record.ms.items(), key=lambda kv: kv[1])) + "]"
    why = f" ({'; '.join(skipped)})" if skipped else ""
    what = describe_call(record.call)
    if record.how == "compile":  # lengths may be symbolic: the choice is for any length
        what = what.replace(f" M={record.call.q_len} N={record.call.kv_len}", " any M, N")
    return (
        f"attnkit.auto: {record.module}: {record.backend} for {what}"
        f"{why}{timing} [{record.how}, {record.hardware}]"
    )


def _format_decision(record: Decision) -> str:
    head = (
        f"{describe_call(record.call)} -> {record.backend}  "
        f"[{record.how}; order: {record.hardware}; first seen: {record.module}]"
    )
    width = max((len(x) for x in record.table), default=0)
    rows = [head]
    for label, reasons in record.table.items():
        if label == record.backend:
            state = "chosen"
        elif not reasons:
            state = "can run"
        else:
            state = "; ".join(reasons)
        if label in record.ms:
            state += f"  ({record.ms[label]:.3f} ms)"
        rows.append(f"    {label:<{width}}  {state}")
    return "\n".join(rows)


def auto(**options: Any) -> AutoProcessor:
    """A processor for ``set_attn_processor`` / ``attnkit.apply`` that picks, per call,
    the first backend of the device's priority list that can serve it.

    Options: ``tune=True`` (time candidates on first sight, keep the fastest, persist
    to ``cache_path``), ``order=[...]``, ``exclude=[...]``, ``backend_options={...}``.
    ``ATTNKIT_BACKEND=name`` forces one backend. ``processor.explain()`` shows every
    decision and why. See :mod:`attnkit.selector`.
    """
    return AutoProcessor(**options)


__all__ = [
    "AutoProcessor",
    "CANDIDATES",
    "Decision",
    "ENV_VAR",
    "LAST_RESORT",
    "PRIORITIES",
    "Priority",
    "auto",
    "choose",
    "default_cache_path",
    "describe_call",
    "hardware_class",
    "installed_packages",
    "priority_for",
    "read_cache",
    "update_cache",
]
