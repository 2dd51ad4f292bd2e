"""Numbers and verdicts in words, shared by the tables (:mod:`.markdown`) and the plots
(:mod:`.plots`): how a number, a ratio or a size is written, whether a cell was measured,
and what a ratio or a ranking says about the run's noise.
"""

from __future__ import annotations

from .measure import NOISE_LEGEND, cell_text, noise_verdict, ranking, typical_spread


def fmt_num(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "–"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.{digits}f}"


def fmt_x(x: float | None) -> str:
    return "–" if x is None else f"x{x:.2f}"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "–"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    return f"{n / (1 << 20):.0f} MiB"


def cell_words(cell: dict, limit: int = 40) -> str:
    return cell_text(cell.get("status"), cell.get("reason", ""), limit)


def is_measured(cell: dict | None, key: str = "it_per_s") -> bool:
    return bool(cell) and cell.get("status") == "ok" and bool(cell.get(f"{key}_median"))


def md_table(header: list[str], rows: list[list[str]]) -> str:
    def esc(s: str) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(esc(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def run_noise(cells, key: str) -> float | None:
    """The typical spread of the measured cells' `key` samples (:func:`typical_spread`)."""
    return typical_spread(c.get(key) or [] for c in cells if is_measured(c, key))


def ratio_verdict(cell: dict, base: dict | None, key: str, noise: float | None) -> str:
    """'' where `cell` and `base` differ beyond the noise by their `key` samples (or are the
    same cell), else 'within noise' / 'one sample: not established'."""
    if base is None or base is cell or base.get("name") == cell.get("name"):
        return ""
    return noise_verdict(cell.get(key) or [], base.get(key) or [], noise)


def marked_ratio(x: float | None, cell: dict, base: dict | None, key: str, noise: float | None, digits: int = 2) -> str:
    """'x1.14', or 'x1.01 (within noise)' / 'x1.31 (one sample: not established)': what
    tables write beside a ratio, and plots too (:mod:`.plots`)."""
    if x is None:
        return "–"
    verdict = ratio_verdict(cell, base, key, noise)
    return f"x{x:.{digits}f}" + (f" ({verdict})" if verdict else "")


def name_list(names: list[str]) -> str:
    """Names joined with '; ', those sharing a first part (up to their last ' + ') once:
    'bf16 + channels_last + (auto, sdpa)'."""
    groups: dict[str, list[str]] = {}
    for n in names:
        head, _, tail = n.rpartition(" + ")
        groups.setdefault(head, []).append(tail if head else n)
    return "; ".join(
        f"{head} + ({', '.join(tails)})"
        if head and len(tails) > 1
        else (f"{head} + {tails[0]}" if head else "; ".join(tails))
        for head, tails in groups.items()
    )


def not_measured(rows: list[dict], key: str, limit: int) -> list[str]:
    """'status (reason): names' for the rows without a `key` median, one per distinct
    status and reason, in the rows' order."""
    groups: dict[str, list[str]] = {}
    for r in rows:
        if not is_measured(r, key):
            groups.setdefault(cell_text(r.get("status"), r.get("reason", ""), limit), []).append(r["name"])
    return [f"{what}: {name_list(names)}" for what, names in groups.items()]


def noise_lines(cells: dict[str, dict], key: str, fmt, higher_is_faster: bool = True) -> list[str]:
    """The measured cells ranked with '>', '≈' or '?' between neighbours, and the run's noise."""
    samples = {n: c.get(key) or [] for n, c in cells.items() if is_measured(c, key)}
    if len(samples) < 2:
        return []
    spread = typical_spread(samples.values())
    noise = (
        f"typical spread (max-min)/median of a cell: {spread:.1%}"
        if spread is not None
        else "one sample per cell: the run's spread is unknown"
    )
    return [f"Fastest first: {ranking(samples, fmt, higher_is_faster)} ({noise}; {NOISE_LEGEND})."]
