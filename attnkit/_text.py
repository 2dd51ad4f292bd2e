"""Small text helpers shared by logs, errors, `attnkit info` and the benchmark."""

from __future__ import annotations


def short(text: object, limit: int = 90) -> str:
    """``text`` on one line (whitespace collapsed), cut to ``limit`` characters with "…"."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def describe_exception(exc: BaseException, limit: int = 200) -> str:
    """"Type: first line of the message", cut to ``limit``: how a failure is named in a log
    line or a table cell."""
    lines = str(exc).strip().splitlines()
    return short(f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__, limit)
