"""auto(tune=True)'s check and timing of the candidates of a signature (the Tuned mixin of
:mod:`attnkit.choose.tuning` runs them; the cache file is :mod:`attnkit.choose.tune_cache`'s).

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
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Mapping, Sequence, TypeGuard

import torch

from ..backends import Backend
from ..testing import EPSILON, reference_attention, torch_math_attention
from .fixed import run_backend
from .guard import sample_inputs, sample_rows

# auto(tune_margin=): the median per-round gain a candidate needs to replace the priority choice.
DEFAULT_MARGIN = 0.05
# The version of the output check an entry's figures come from (its "checked" field).
CHECKED = 1
# The output check's bound comes from plain torch math on a sample: up to this many query
# rows of up to two batch items and two heads (the first and the last).
CHECK_ROWS = 64
# The tolerance rule's factor: a backend may be this many times plain torch's error.
FACTOR = 2.0


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
        raise TypeError(
            f"tune_margin={value!r}: use a number in [0, 1), the gain a candidate needs over the "
            f"priority choice (0.05: 5% faster)"
        )
    value = float(value)
    if not math.isfinite(value) or not 0.0 <= value < 1.0:
        raise ValueError(
            f"tune_margin={value!r}: use a number in [0, 1), the gain a candidate needs over the "
            f"priority choice (0.05: 5% faster); it must be at least 0 and below 1"
        )
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
        x, y = a[start : start + step], b[start : start + step]
        same = x == y
        if not bool((torch.isfinite(x) & torch.isfinite(y) | same).all()):
            return math.inf
        diff = torch.where(same, torch.zeros_like(x), x - y)
        y = torch.where(torch.isfinite(y), y, torch.zeros_like(y))
        figures = torch.stack(
            [torch.linalg.vector_norm(diff, dim=1).max(), torch.linalg.vector_norm(y).square()]
        ).tolist()
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

        out_bound = bound(
            worst_row_error(
                torch_math_attention(q_s, k, v, bias_s, scale, upcast=upcast),
                reference_attention(q_s, k, v, bias_s, scale),
            )
        )
        lse_bound = None
        if return_lse:
            lse, lse_ref = (x.unsqueeze(-1) for x in _torch_math_lse(q_s, k, bias_s, scale, upcast))
            lse_bound = bound(worst_row_error(lse, lse_ref))
    return out_bound, lse_bound


def output_difference(out, ref, bounds: tuple[float, float | None]) -> float:
    """``out``'s :func:`worst_row_error` against ``ref`` as a fraction of its bound (the
    larger of the output's and the LSE's where the call returns one): above 1, it differs."""
    out_bound, lse_bound = bounds
    if lse_bound is None:
        return worst_row_error(out, ref) / out_bound
    if not (isinstance(out, tuple) and isinstance(ref, tuple) and len(out) == len(ref) == 2):
        return math.inf
    return max(
        worst_row_error(out[0], ref[0]) / out_bound,
        worst_row_error(out[1].unsqueeze(-1), ref[1].unsqueeze(-1)) / lse_bound,
    )


# The timer of the CPU rounds (the tests make it a clock of their own).
clock = time.perf_counter


def time_rounds(
    backends: Mapping[str, Backend],
    args: tuple,
    rounds: int = 7,
    warmup: int = 2,
    failed: dict[str, BaseException] | None = None,
) -> dict[str, list[float]]:
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
                t0 = clock()
                run_backend(backends[label], *args)
                return (clock() - t0) * 1e3
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


def _number(x: Any) -> TypeGuard[float]:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)


def choose_tuned(
    priority: str, gain: Mapping[str, Any], diff: Mapping[str, Any], margin: float, labels: Sequence[str]
) -> str:
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


def describe_tuning(
    backend: str, priority: str, gain: Mapping[str, Any], diff: Mapping[str, Any], margin: float
) -> str:
    """What tuning decided, in words (explain() and the INFO line)."""
    differs = [label for label, d in diff.items() if d == "differs"]
    failed = [label for label, d in diff.items() if d == "failed"]
    timed = {label: g for label, g in gain.items() if _number(g)}
    if backend != priority:
        text = (
            f"{backend} replaces the priority choice {priority}: median gain {_percent(timed[backend])} over "
            f"interleaved rounds, margin {_percent(margin)}"
        )
    elif timed:
        text = (
            f"the priority choice {priority} kept: no candidate faster by the {_percent(margin)} margin ("
            + ", ".join(f"{label} {_percent(g)}" for label, g in timed.items())
            + ")"
        )
    else:
        text = f"the priority choice {priority} kept: no other candidate was timed"
    if differs:
        text += f"; output differs from {priority}'s, never chosen: {', '.join(differs)}"
    if failed:
        text += f"; failed: {', '.join(failed)}"
    return text


__all__ = [
    "CHECKED",
    "CHECK_ROWS",
    "DEFAULT_MARGIN",
    "FACTOR",
    "check_margin",
    "choose_tuned",
    "describe_tuning",
    "output_bound",
    "output_difference",
    "round_gains",
    "time_backend",
    "time_rounds",
    "trusted",
    "worst_row_error",
]
