"""Measuring configurations honestly: interleaved rounds, warm-up apart, errors kept in
cells, and the noise stated beside every difference.

Every table is a list of configurations (a processor, a precision, a compiled UNet, an
attention backend...) measured the same way: one warm-up run each (excluded), then up to
``repeats`` rounds in which every configuration runs once. The order alternates from
round to round (a b c, c b a, a b c, ...): over any two rounds each configuration's mean
position is the same, so a load that drifts linearly falls on all of them alike, and
neighbours in the list (auto and sdpa, which run the same kernel on the CPU) are measured
next to each other. Each round adds one sample per configuration; a cell holds exactly
the samples it shows. A configuration that cannot run says why in its cell ("n/a
(reason)", "failed: error", "out of memory", "skipped (time budget)") and the others go on.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import torch

from attnkit import BackendUnavailable, UnsupportedModule
from attnkit.text import describe_exception

from .env import free_memory
from .models import LoopTiming
from .progress import progress_bar

STATUS_OK = "ok"
STATUS_NA = "n/a"
STATUS_FAILED = "failed"
STATUS_OOM = "oom"
STATUS_SKIPPED = "skipped"


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


def unavailable_reason(exc: BaseException) -> str:
    """Why a backend refused: its reasons as data (``BackendUnavailable.reasons``,
    {backend: [reason, ...]}), else the message as it came. Never parsed."""
    reasons: Mapping[str, list[str]] = getattr(exc, "reasons", None) or {}
    if len(reasons) == 1:
        return "; ".join(next(iter(reasons.values())))
    if reasons:
        return "; ".join(f"{label}: {', '.join(rs)}" for label, rs in reasons.items())
    return " ".join(str(exc).split())


def classify_error(exc: BaseException) -> tuple[str, str]:
    """(status, reason) for a configuration that raised."""

    if isinstance(exc, (BackendUnavailable, UnsupportedModule)):
        return STATUS_NA, unavailable_reason(exc)
    if is_oom(exc):
        return STATUS_OOM, clip(f"{type(exc).__name__}: {exc}", 160)
    return STATUS_FAILED, describe(exc, 160)


def describe(exc: BaseException, limit: int = 200) -> str:
    """ "Type: first line of the message", cut at a word to ``limit`` characters."""
    return clip(describe_exception(exc, 1 << 16), limit)


def clip(text: object, limit: int) -> str:
    """``text`` on one line, cut at a word boundary to at most ``limit`` characters with "…".

    A text that arrives already cut (ending in "…", as records written before this cut
    hold) loses its last, possibly partial, word: a reason reads to its last whole word.

    >>> clip("device=cpu: Triton kernels run on CUDA", 30)
    'device=cpu: Triton kernels…'
    >>> clip("one of: native, _flash_3, _f…", 100)
    'one of: native, _flash_3…'
    """
    text = " ".join(str(text).split())
    if text.endswith("…"):  # cut before, perhaps inside a word
        text = text[:-1].rstrip()
        text = text.rsplit(" ", 1)[0] if " " in text else text
        if len(text) < limit:
            return text.rstrip(" ,;:-(/") + "…"
    elif len(text) <= limit:
        return text
    head = text[: limit - 1]
    if text[limit - 1] != " " and " " in head:  # inside a word: back to its start (one word: cut it)
        head = head.rsplit(" ", 1)[0]
    return head.rstrip(" ,;:-(/") + "…"


def cell_text(status: str | None, reason: str = "", limit: int = 40) -> str:
    """What a table shows for a configuration without a number (its reason cut at a word)."""
    if status == STATUS_NA:
        return f"n/a ({clip(reason, limit)})"
    if status == STATUS_OOM:
        return "out of memory"
    if status == STATUS_FAILED:
        return f"failed: {clip(reason, limit)}"
    if status == STATUS_SKIPPED:
        return f"skipped ({clip(reason, limit)})"
    return "–"


# Predictions of what fits are taken this many times: on a machine shared with other work
# the pace of one run is a poor guide to the next (seen: 6 s warm-up steps, then 15 s steps).
MARGIN = 1.5


class OverBudget(Exception):
    """A table (or its first unit) predicted not to fit in what is left of the budget."""


class Deadline:
    """A time budget: work that would start after it is recorded as skipped."""

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self.clock = clock
        self.end = None if seconds is None else clock() + seconds

    def expired(self) -> bool:
        return self.end is not None and self.clock() > self.end

    def left(self) -> float | None:
        return None if self.end is None else self.end - self.clock()


# -- noise -----------------------------------------------------------------------------
def relative_spread(values: Sequence[float]) -> float | None:
    """(max - min) / median of two or more samples; None for fewer."""
    if len(values) < 2:
        return None
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else None


def typical_spread(sample_lists: Iterable[Sequence[float]]) -> float | None:
    """The run's noise: the median relative spread of the cells with two or more samples."""
    spreads = [s for s in map(relative_spread, sample_lists) if s is not None]
    return statistics.median(spreads) if spreads else None


def separated(a: Sequence[float], b: Sequence[float], noise: float | None) -> bool | None:
    """Whether two cells differ by more than the noise.

    Two or more samples each: their min-max ranges do not overlap. Otherwise the
    difference of the medians against the run's noise (:func:`typical_spread`); None
    when that is unknown too (one sample each): the difference is not established.
    """
    if not a or not b:
        return None
    if len(a) >= 2 and len(b) >= 2:
        return max(a) < min(b) or max(b) < min(a)
    if noise is None:
        return None
    ma, mb = statistics.median(a), statistics.median(b)
    return abs(ma - mb) / min(ma, mb) > noise


# How a ratio between two cells reads beside the noise (:func:`separated`): tables and
# plots write the same words.
VERDICTS = {True: "", False: "within noise", None: "one sample: not established"}


def noise_verdict(a: Sequence[float], b: Sequence[float], noise: float | None) -> str:
    """'' when cells `a` and `b` differ beyond the noise, else what the ratio is worth."""
    return VERDICTS[separated(a, b, noise)]


NOISE_LEGEND = (
    "'>': faster beyond the noise (min-max ranges apart); '≈': within noise (the ranges "
    "overlap, or the difference is below the run's typical spread); '?': one sample, "
    "spread unknown: the difference is not established"
)


def ranking(samples: Mapping[str, Sequence[float]], fmt: Callable[[float], str], higher_is_faster: bool = True) -> str:
    """The measured configurations, fastest first, each joined to the next by '>', '≈' or '?'.

    >>> ranking({"a": [2.0, 2.2], "b": [2.1, 2.3], "c": [1.0, 1.1]}, "{:.1f}".format)
    'b 2.2 ≈ a 2.1 > c 1.1'
    """
    measured = {n: list(v) for n, v in samples.items() if v}
    if not measured:
        return ""
    noise = typical_spread(measured.values())
    order = sorted(measured, key=lambda n: statistics.median(measured[n]), reverse=higher_is_faster)
    parts = [f"{order[0]} {fmt(statistics.median(measured[order[0]]))}"]
    for prev, cur in zip(order, order[1:]):
        sep = separated(measured[prev], measured[cur], noise)
        op = ">" if sep else ("≈" if sep is False else "?")
        parts.append(f"{op} {cur} {fmt(statistics.median(measured[cur]))}")
    return " ".join(parts)


# -- cells and configurations -----------------------------------------------------------
@dataclass
class Cell:
    """One configuration's result: its samples (one per round) or why there are none."""

    name: str
    status: str = STATUS_OK
    reason: str = ""
    it_per_s: list[float] = field(default_factory=list)  # steady state, one per round
    loop_it_per_s: list[float] = field(default_factory=list)  # whole loop (progress-bar rate)
    seconds: list[float] = field(default_factory=list)  # seconds per run (loop + decode if any)
    step_seconds: list[float] = field(default_factory=list)  # steady-state seconds per step
    warmup_seconds: float | None = None
    first_call_seconds: float | None = None  # the warm-up's first step: compilation, autotuning, caches
    extra: dict = field(default_factory=dict)

    SERIES = ("it_per_s", "loop_it_per_s", "seconds", "step_seconds")

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK and bool(self.it_per_s)

    def median(self, key: str = "it_per_s") -> float | None:
        values = getattr(self, key)
        return statistics.median(values) if values else None

    def add(self, timing: LoopTiming, skip_steps: int) -> None:
        rate = timing.it_per_s(skip_steps)
        self.it_per_s.append(rate)
        self.step_seconds.append(1.0 / rate)
        self.loop_it_per_s.append(timing.it_per_s(0))
        self.seconds.append(timing.image_seconds)

    def clear(self) -> None:
        for key in self.SERIES:
            getattr(self, key).clear()

    def to_dict(self) -> dict:
        out = {
            "name": self.name,
            "status": self.status,
            "reason": self.reason,
            "samples": len(self.it_per_s),
            "warmup_seconds": self.warmup_seconds,
            "first_call_seconds": self.first_call_seconds,
        }
        for key in self.SERIES:
            values = getattr(self, key)
            out[key] = values
            out[f"{key}_median"] = statistics.median(values) if values else None
            out[f"{key}_min"] = min(values) if values else None
            out[f"{key}_max"] = max(values) if values else None
        out.update(self.extra)
        return out


@dataclass
class Config:
    """A configuration to measure: `run(warmup)` does one timed run; `setup()` readies it first.

    ``keep`` holds what must live as long as the configuration (a compiled copy of a UNet).
    """

    name: str
    run: Callable[[bool], LoopTiming] | None
    setup: Callable[[], None] | None = None
    status: str = STATUS_OK  # pre-set to n/a / skipped when known before running
    reason: str = ""
    extra: dict = field(default_factory=dict)
    keep: dict = field(default_factory=dict)
    # Warm-ups are predicted from earlier warm-ups of the same group where there are some
    # (a compiled configuration's warm-up compiles: seconds to minutes, unlike an eager one's).
    group: str = ""


class Cells(dict):
    """{name: Cell}, in the configurations' order; ``interrupted`` when a SIGINT (a time
    limit) ended the measuring: what was measured is kept and the table still written."""

    interrupted = False


def probe_cells(configs: Iterable[Config], cells: Mapping[str, Cell], deadline: Deadline | None = None) -> None:
    """After the timing, each configuration's ``keep["probe"](profile)`` (attention's share
    of a step, a compiled copy's output against eager: :func:`.context.unet_config`), its
    result merged into the cell's extra. A measured cell is profiled only while the deadline
    leaves room for a few of its runs; the others get what needs no run (how they compiled)."""
    for config in configs:
        probe = config.keep.get("probe")
        if probe is None:
            continue
        cell = cells[config.name]
        profile = cell.ok and not getattr(cells, "interrupted", False)
        left = deadline.left() if deadline is not None else None
        if profile and left is not None and left < MARGIN * 3 * (cell.median("seconds") or 0.0):
            profile = False
            cell.extra["attention"] = {"skipped": "time budget"}
        try:
            cell.extra.update(probe(profile))
        except Exception as exc:  # noqa: BLE001 - a probe's failure is reported, never fatal
            cell.extra["attention"] = {"error": describe(exc, 160)}
        except KeyboardInterrupt:  # a time limit's SIGINT: the measured table is kept, unprofiled
            if isinstance(cells, Cells):
                cells.interrupted = True
            cell.extra["attention"] = {"skipped": "interrupted (the run's time limit)"}


def measure_interleaved(
    configs: Iterable[Config],
    repeats: int,
    skip_steps: int = 0,
    desc: str = "bench",
    progress: bool = True,
    deadline: Deadline | None = None,
    device: torch.device | None = None,
    strict: bool = False,
    always: int = 0,
    sample_factor: float = 1.0,
    clock: Callable[[], float] = time.perf_counter,
    first_warmup: float | None = None,
) -> dict[str, Cell]:
    """Warm up each configuration, then up to `repeats` rounds over all of them, the
    order alternating forward and backward.

    With a deadline, work is admitted only where it is predicted to end before it: a
    configuration is warmed up only if its warm-up, its first sample and the first
    samples already promised to the others fit in what is left (a sample is predicted
    as ``sample_factor`` times a warm-up: the ratio of their steps, until one is timed);
    a round starts only if its samples, as last timed, fit. The first round always
    completes, so every configuration warmed up gets one sample; the first ``always``
    configurations that can run are warmed up whatever the budget (a table's headline
    pair). ``first_warmup`` predicts a warm-up before any has run (seconds; from what the
    run measured before). What is not admitted is marked "skipped (time budget)". With
    ``strict``, each configuration is warmed up right before its first timed run.
    """
    configs = list(configs)
    cells = Cells((c.name, Cell(c.name, c.status, c.reason, extra=dict(c.extra))) for c in configs)
    live = [c for c in configs if c.status == STATUS_OK and c.run is not None]
    bar = progress_bar(len(live) * (repeats + 1), desc, progress)
    sample_cost: dict[str, float] = {}  # seconds of a configuration's last timed run (predicted before it)
    warmups: list[float] = []
    group_warmups: dict[str, list[float]] = {}
    predicted: list[float] = []  # a timed run's seconds, as each warm-up predicted it

    def predict_sample(seconds: float, timing: LoopTiming) -> float:
        """A timed run's seconds from its warm-up's: sample_factor times them, or less where
        the warm-up has steps after its first. The first step carries the one-time work
        (Triton's compilation, cuDNN's search: seconds on a GPU, where a step takes
        milliseconds), so the warm-up's other time plus its fastest later step for each step
        of the timed run is nearer; never more than the plain ratio."""
        rough = seconds * sample_factor
        steps = timing.step_seconds
        if len(steps) < 2:
            return rough
        return min(rough, seconds - sum(steps) + sample_factor * len(steps) * min(steps[1:]))

    def fits(seconds: float) -> bool:
        left = deadline.left() if deadline is not None else None
        return left is None or left > MARGIN * seconds

    def attempt(config: Config, warmup: bool) -> LoopTiming | None:
        cell = cells[config.name]
        failure = None
        try:
            if config.setup is not None:
                config.setup()
            return config.run(warmup)
        except Exception as exc:  # noqa: BLE001 - every failure is reported in its cell
            failure = classify_error(exc)
        cell.status, cell.reason = failure
        cell.clear()
        free_memory(device)  # after the except block: the traceback no longer pins tensors
        return None

    def warm_up(config: Config) -> None:
        bar.set_postfix_str(f"warm-up {config.name}")
        start = clock()
        timing = attempt(config, True)
        if timing is not None:
            cells[config.name].warmup_seconds = seconds = clock() - start
            cells[config.name].first_call_seconds = timing.step_seconds[0] if timing.step_seconds else None
            warmups.append(seconds)
            group_warmups.setdefault(config.group, []).append(seconds)
            sample_cost[config.name] = predict_sample(seconds, timing)
            predicted.append(sample_cost[config.name])
        bar.update(1)

    def timed(config: Config, rnd: int) -> None:
        bar.set_postfix_str(f"round {rnd + 1}/{repeats} {config.name}")
        start = clock()
        timing = attempt(config, False)
        if timing is not None:
            cells[config.name].add(timing, skip_steps)
            sample_cost[config.name] = clock() - start
        bar.update(1)

    def rounds() -> None:
        first_round = 0
        for i, config in enumerate(live):
            if i >= always and deadline is not None:
                same = group_warmups.get(config.group)
                warm = statistics.median(same or warmups) if (same or warmups) else (first_warmup or 0.0)
                sample = statistics.median(predicted) if predicted else warm * sample_factor
                promised = (
                    0.0
                    if strict
                    else sum(sample_cost.get(c.name, 0.0) for c in live[:i] if cells[c.name].status == STATUS_OK)
                )
                if deadline.expired() or not fits(promised + warm + sample):
                    cells[config.name].status, cells[config.name].reason = STATUS_SKIPPED, "time budget"
                    continue
            warm_up(config)
            if strict and cells[config.name].status == STATUS_OK:
                timed(config, 0)
                first_round = 1
        for rnd in range(first_round, repeats):
            active = [c for c in live if cells[c.name].status == STATUS_OK]
            if not active or (rnd > 0 and not fits(sum(sample_cost.get(c.name, 0.0) for c in active))):
                break
            for config in active if rnd % 2 == 0 else active[::-1]:
                timed(config, rnd)

    try:
        rounds()
    except KeyboardInterrupt:  # a time limit's SIGINT: what was measured is kept, the rest named
        cells.interrupted = True
        for c in live:
            cell = cells[c.name]
            if cell.status == STATUS_OK and not cell.it_per_s:
                cell.status, cell.reason = STATUS_SKIPPED, "interrupted (the run's time limit)"
    bar.close()
    return cells
