"""Measuring configurations honestly: interleaved repeats, warm-up apart, errors kept in cells.

Every table is a list of configurations (a processor, a precision, a compiled UNet...)
measured the same way: one warm-up run each (excluded), then ``repeats`` rounds in which
every configuration runs once, in an order that rotates from round to round, so drift
(clocks, thermals, other processes) falls on all of them alike. A configuration that
cannot run shows why in its cell ("n/a (reason)", "failed: error", "out of memory") and
the others go on.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from .models import LoopTiming
from .progress import progress_bar

STATUS_OK = "ok"
STATUS_NA = "n/a"
STATUS_FAILED = "failed"
STATUS_OOM = "oom"
STATUS_SKIPPED = "skipped"


def short(text: str, limit: int = 90) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def is_oom(exc: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError, MemoryError, or an allocator's out-of-memory RuntimeError.

    The RuntimeErrors: CUDA's and oneDNN's "out of memory", torch's CPU allocator ("can't
    allocate memory ... Error code 12 (Cannot allocate memory)") and a C++ ``new`` that
    failed inside an operator, which torch passes on as "std::bad_alloc".
    """
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    if isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        sign in text for sign in ("out of memory", "can't allocate memory", "cannot allocate memory", "bad_alloc")
    )


def unavailable_reasons(exc: BaseException) -> str:
    """The reasons of a BackendUnavailable message, without the module label and advice."""
    text = " ".join(str(exc).split())
    if " cannot serve " in text and ": " in text:
        text = text.split(": ", 1)[1]
    for tail in (". Choose another processor", ". Choose another"):
        if tail in text:
            text = text.split(tail, 1)[0]
    return text


def classify_error(exc: BaseException) -> tuple[str, str]:
    """(status, reason) for a configuration that raised."""
    from attnkit import BackendUnavailable, UnsupportedModule

    if isinstance(exc, (BackendUnavailable, UnsupportedModule)):
        return STATUS_NA, unavailable_reasons(exc)
    if is_oom(exc):
        return STATUS_OOM, short(f"{type(exc).__name__}: {exc}", 160)
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return STATUS_FAILED, short(f"{type(exc).__name__}: {first_line}", 160)


def free_memory(device: torch.device | None = None) -> None:
    gc.collect()
    if torch.cuda.is_available() and (device is None or device.type == "cuda"):
        torch.cuda.empty_cache()


class Deadline:
    """A time budget: work that would start after it is recorded as skipped."""

    def __init__(self, seconds: float | None):
        self.end = None if seconds is None else time.monotonic() + seconds

    def expired(self) -> bool:
        return self.end is not None and time.monotonic() > self.end

    def left(self) -> float | None:
        return None if self.end is None else self.end - time.monotonic()


@dataclass
class Cell:
    """One configuration's result: its samples (one per repeat) or why there are none."""

    name: str
    status: str = STATUS_OK
    reason: str = ""
    it_per_s: list[float] = field(default_factory=list)  # steady state, one per repeat
    loop_it_per_s: list[float] = field(default_factory=list)  # whole loop (progress-bar rate)
    seconds: list[float] = field(default_factory=list)  # seconds per run (loop + decode if any)
    warmup_seconds: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK and bool(self.it_per_s)

    def median(self, key: str = "it_per_s") -> float | None:
        values = getattr(self, key)
        return statistics.median(values) if values else None

    def spread(self, key: str = "it_per_s") -> tuple[float, float] | None:
        values = getattr(self, key)
        return (min(values), max(values)) if values else None

    def text(self) -> str:
        """What the table shows when there is no number."""
        if self.status == STATUS_NA:
            return f"n/a ({short(self.reason, 60)})"
        if self.status == STATUS_OOM:
            return "out of memory"
        if self.status == STATUS_FAILED:
            return f"failed: {short(self.reason, 60)}"
        if self.status == STATUS_SKIPPED:
            return f"skipped ({short(self.reason, 60)})"
        return ""

    def to_dict(self) -> dict:
        out = {
            "name": self.name,
            "status": self.status,
            "reason": self.reason,
            "it_per_s": self.it_per_s,
            "loop_it_per_s": self.loop_it_per_s,
            "seconds": self.seconds,
            "warmup_seconds": self.warmup_seconds,
        }
        for key in ("it_per_s", "loop_it_per_s", "seconds"):
            values = getattr(self, key)
            out[f"{key}_median"] = statistics.median(values) if values else None
            out[f"{key}_min"] = min(values) if values else None
            out[f"{key}_max"] = max(values) if values else None
        out["repeats"] = len(self.it_per_s)
        out.update(self.extra)
        return out

    @staticmethod
    def from_dict(d: dict) -> "Cell":
        known = {"name", "status", "reason", "it_per_s", "loop_it_per_s", "seconds", "warmup_seconds"}
        derived = {f"{k}_{s}" for k in ("it_per_s", "loop_it_per_s", "seconds") for s in ("median", "min", "max")}
        extra = {k: v for k, v in d.items() if k not in known | derived | {"repeats"}}
        return Cell(
            name=d["name"], status=d.get("status", STATUS_OK), reason=d.get("reason", ""),
            it_per_s=list(d.get("it_per_s") or []), loop_it_per_s=list(d.get("loop_it_per_s") or []),
            seconds=list(d.get("seconds") or []), warmup_seconds=d.get("warmup_seconds"), extra=extra,
        )


@dataclass
class Config:
    """A configuration to measure: `run()` does one timed run; `setup()` readies it first."""

    name: str
    run: Callable[[bool], LoopTiming] | None  # run(warmup) -> timing
    setup: Callable[[], None] | None = None
    status: str = STATUS_OK  # pre-set to n/a / skipped when known before running
    reason: str = ""
    extra: dict = field(default_factory=dict)


def measure_interleaved(
    configs: Iterable[Config],
    repeats: int,
    skip_steps: int = 0,
    desc: str = "bench",
    progress: bool = True,
    deadline: Deadline | None = None,
    device: torch.device | None = None,
    strict: bool = False,
) -> dict[str, Cell]:
    """Warm up each configuration, then `repeats` rounds over all of them, rotating the order.

    With a deadline, no new round starts after it, but the first round always completes
    (every configuration gets one sample). With ``strict``, the deadline also holds inside
    the first round: each configuration is warmed up right before its first timed run, and
    those not reached are marked skipped.
    """
    configs = list(configs)
    cells = {c.name: Cell(c.name, c.status, c.reason, extra=dict(c.extra)) for c in configs}
    live = [c for c in configs if c.status == STATUS_OK and c.run is not None]
    bar = progress_bar(len(live) * (repeats + 1), desc, progress)

    def expired() -> bool:
        return deadline is not None and deadline.expired()

    def attempt(config: Config, warmup: bool) -> LoopTiming | None:
        cell = cells[config.name]
        failure = None
        try:
            if config.setup is not None:
                config.setup()
            return config.run(warmup)
        except Exception as exc:  # noqa: BLE001 - every failure is reported in its cell
            failure = classify_error(exc)
        if failure is not None:
            cell.status, cell.reason = failure
            cell.it_per_s.clear(), cell.loop_it_per_s.clear(), cell.seconds.clear()
            free_memory(device)  # after the except block: the traceback no longer pins tensors
        return None

    def warm_up(config: Config) -> None:
        bar.set_postfix_str(f"warm-up {config.name}")
        start = time.perf_counter()
        if attempt(config, True) is not None:
            cells[config.name].warmup_seconds = time.perf_counter() - start
        bar.update(1)

    def timed(config: Config, rep: int) -> None:
        bar.set_postfix_str(f"round {rep + 1}/{repeats} {config.name}")
        timing = attempt(config, False)
        if timing is not None:
            cell = cells[config.name]
            cell.it_per_s.append(timing.it_per_s(skip_steps))
            cell.loop_it_per_s.append(timing.it_per_s(0))
            cell.seconds.append(timing.image_seconds)
        bar.update(1)

    def skip(config: Config) -> None:
        cells[config.name].status, cells[config.name].reason = STATUS_SKIPPED, "time budget"

    if strict:
        for config in live:
            if expired():
                skip(config)
                continue
            warm_up(config)
            if cells[config.name].status == STATUS_OK:
                timed(config, 0)
        first_round = 1
    else:
        for config in live:
            if expired():
                skip(config)
                continue
            warm_up(config)
        first_round = 0

    for rep in range(first_round, repeats):
        active = [c for c in live if cells[c.name].status == STATUS_OK]
        if not active or (rep > 0 and expired()):
            break
        shift = rep % len(active)
        for config in active[shift:] + active[:shift]:
            timed(config, rep)
    bar.close()
    return cells
