"""What auto() decided for a call signature, and the words it is told in: the record kept
for ``explain()``, the INFO line logged once per decision, and the table ``explain()`` prints.

A Decision is kept apart from the chooser that makes it because it is data: it is logged,
printed, pickled with a processor, and read back by callers (``processor.decisions``),
none of which needs the walk, the fall-back or the tuning that produced it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..backends import AttentionCall
from .policy import describe_call


@dataclass
class Decision:
    """One row of ``explain()``: what auto() chose for a call signature, and why."""

    call: AttentionCall
    backend: str
    table: dict[str, list[str]]
    order: str  # the hardware class, "order=a>b" or "ATTNKIT_BACKEND=x"
    module: str
    how: str  # "priority", "tuned", "tune cache", "forced", "fallback", "compile"
    ms: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    # Tuned ("tuned", "tune cache"): the priority choice (backend == priority: it was kept,
    # no candidate faster by the margin), each timed candidate's median gain over it, each
    # candidate's output difference as a fraction of the bound ("differs", "failed"), and
    # the decision in words. Plain defaults: a Decision pickled before them has them.
    priority: str = ""
    gain: Mapping[str, float] | None = None
    diff: Mapping[str, float | str] | None = None
    note: str = ""


def log_line(record: Decision) -> str:
    """The INFO line of a decision: what was chosen for which call, and why the
    candidates before it were skipped."""
    skipped = []
    for label, reasons in record.table.items():
        if label == record.backend:
            break
        skipped.append(f"{label}: {', '.join(reasons)}")
    timing = ""
    if record.ms:
        timing = " [" + ", ".join(f"{k} {v:.3f} ms" for k, v in sorted(record.ms.items(), key=lambda kv: kv[1])) + "]"
    why = f" ({'; '.join(skipped)})" if skipped else ""
    note = f" ({record.note})" if record.note else ""
    return (
        f"attnkit.auto: {record.module}: {record.backend} for {describe_call(record.call)}"
        f"{why}{timing}{note} [{record.how}, {record.order}]"
    )


def format_decision(record: Decision) -> str:
    """A decision as an indented table: one row per candidate with its state."""
    head = (
        f"{describe_call(record.call)} -> {record.backend}  "
        f"[{record.how}; order: {record.order}; first seen: {record.module}]"
    )
    width = max((len(x) for x in record.table), default=0)
    rows = [head]
    if record.note:
        rows.append(f"    tuning: {record.note}")
    gain, diff = record.gain or {}, record.diff or {}
    for label, reasons in record.table.items():
        if label == record.backend:
            state = "chosen"
        elif not reasons:
            state = "can run"
        else:
            state = "; ".join(reasons)
        figures = []
        if label in record.ms:
            figures.append(f"{record.ms[label]:.3f} ms")
        if label in gain:
            figures.append(f"{gain[label] * 100:+.1f}% vs {record.priority}")
        if diff.get(label) == "differs":
            figures.append(f"output differs from {record.priority}'s: never chosen")
        elif diff.get(label) == "failed":
            figures.append("failed while tuning")
        if figures:
            state += f"  ({', '.join(figures)})"
        rows.append(f"    {label:<{width}}  {state}")
    return "\n".join(rows)


__all__ = ["Decision", "format_decision", "log_line"]
