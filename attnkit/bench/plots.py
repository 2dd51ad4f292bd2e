"""PNG plots of the tables (matplotlib, from the ``attnkit[bench]`` extra).

Every bar carries its value, and every ratio the same noise verdict as its table
("within noise", "one sample: not established"); what was not measured is named with
its reason, never drawn as a zero bar; reasons and titles are wrapped or cut at a word,
never inside one; the value axis ends a small margin past the furthest bar, whisker or
label (:func:`finish`). :func:`write_plots` returns what it drew and, for what it did
not, why (matplotlib missing, a sweep with a single batch size: its table says all there
is).
"""

from __future__ import annotations

import os
import textwrap

from .measure import cell_text, ranking
from .progress import EXTRA_HINT
from .wording import is_measured, not_measured, ratio_verdict, run_noise

WIDTH = 9.0  # inches; text is wrapped to fit
MARGIN = 0.03  # of the value axis, past the furthest bar end, whisker or label
LABEL = "bar-label"  # gid of a value label: finish() fits the axis to it
OFFSET = 4  # points between a bar's end (or whisker) and its label


def _wrap(text: str, chars: int = 110, lines: int | None = None) -> str:
    """Wrapped at `chars`; with `lines`, cut at a word after that many lines, with "…"."""
    return "\n".join(textwrap.wrap(" ".join(str(text).split()), chars, max_lines=lines, placeholder="…")) or ""


def _reason(cell: dict) -> str:
    """A cell's status and reason beside where its bar would be: two lines at most."""
    return _wrap(cell_text(cell.get("status"), cell.get("reason", ""), 200), 80, lines=2)


def _not_measured(cells: dict[str, dict], key: str) -> str:
    """'not measured: name: why; ...' for the cells without a `key` median (memory: `key`)."""
    gone = [
        f"{n}: {cell_text(c.get('status'), c.get('reason', ''), 70)}"
        for n, c in cells.items()
        if not (is_measured(c, key) or c.get(key))
    ]
    return _wrap("not measured: " + "; ".join(gone)) if gone else ""


def _with_verdict(ratio: str, verdict: str) -> str:
    return f"{ratio}, {verdict}" if verdict else ratio


def _size(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def _label(ax, text: str, x: float, y: float, along: str, **kw) -> None:
    """A value label `OFFSET` points past (x, y) along the value axis ("x" or "y")."""
    off = (OFFSET, 0) if along == "x" else (0, OFFSET)
    ann = ax.annotate(
        text,
        (x, y),
        xytext=off,
        textcoords="offset points",
        fontsize=8,
        gid=f"{LABEL}-{along}",
        annotation_clip=False,
        **kw,
    )
    ann.set_in_layout(False)  # fitted inside the axes by finish(), not by tight_layout


def _fit(ax, renderer) -> None:
    """The value axis from 0 to a small margin past its furthest bar, whisker or label.

    A label of w pixels at value v, `OFFSET` points past it, on an axis of L pixels from
    0 to X ends at v / X * L + offset + w: X = v * L / ((1 - MARGIN) * L - offset - w).
    """
    dpi = ax.figure.dpi
    for along in ("x", "y"):
        labels = [t for t in ax.texts if t.get_gid() == f"{LABEL}-{along}"]
        if not labels:
            continue
        box = ax.get_window_extent(renderer)
        length = box.width if along == "x" else box.height
        legend = ax.get_legend()
        reserve = legend.get_window_extent(renderer).height if legend is not None and along == "y" else 0.0
        data = ax.dataLim.x1 if along == "x" else ax.dataLim.y1
        top = max(data, 0.0) * (1 + MARGIN)
        for t in labels:
            ext = t.get_window_extent(renderer)
            size = ext.width if along == "x" else ext.height
            value = t.xy[0] if along == "x" else t.xy[1]
            room = (1 - MARGIN) * length - OFFSET * dpi / 72 - size - reserve
            top = max(top, value * length / max(room, 0.2 * length))
        top = top if top > 0 else 1.0
        (ax.set_xlim if along == "x" else ax.set_ylim)(0, top)


def finish(fig) -> None:
    """Lay the figure out and fit each value axis to its bars and labels (twice more:
    fitting changes the tick labels, which moves the axes)."""
    renderer = fig.canvas.get_renderer()
    for _ in range(3):
        fig.tight_layout()
        for ax in fig.axes:
            _fit(ax, renderer)


def _save(plt, fig, out_dir: str, name: str) -> str:
    finish(fig)
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _hbars(
    ax,
    labels: list[str],
    values: list[float],
    texts: list[str],
    color: str,
    spread: list[tuple[float, float]] | None = None,
) -> None:
    """Horizontal bars, first label on top, each with its text past the bar's end (and
    past its min-max whisker when `spread` gives one)."""
    ys = list(range(len(labels)))[::-1]
    ax.barh(ys, values, color=color)
    ax.set_yticks(ys, labels)
    ends = [max(v, hi) for v, (_, hi) in zip(values, spread)] if spread is not None else values
    for y, v, (lo, hi) in zip(ys, values, spread or []):
        if hi > lo:  # one sample has no spread: no whisker that could read as a digit
            ax.errorbar(v, y, xerr=[[v - lo], [hi - v]], fmt="none", ecolor="black", capsize=3)
    for y, end, text in zip(ys, ends, texts):
        _label(ax, text, end, y, "x", va="center")
    ax.set_ylim(-0.6, len(labels) - 0.4)


def plot_it_per_s(plt, t1: dict, device: str):
    cells = t1["cells"]
    names = [n for n in cells if is_measured(cells[n], "it_per_s")]
    if not names:
        return None
    med = [cells[n]["it_per_s_median"] for n in names]
    lo = [m - cells[n]["it_per_s_min"] for n, m in zip(names, med)]
    hi = [cells[n]["it_per_s_max"] - m for n, m in zip(names, med)]
    speed = t1.get("speedup_vs_vanilla", {})
    noise = run_noise(cells.values(), "it_per_s")
    fig, ax = plt.subplots(figsize=(WIDTH, 5))
    xs = list(range(len(names)))
    ax.bar(xs, med, yerr=[lo, hi], capsize=4, color="tab:blue", label="this run: median, min–max of n samples")
    ratios = False
    for x, n, m, h in zip(xs, names, med, hi):
        label = f"{m:.3g}\nn={cells[n].get('samples', len(cells[n].get('it_per_s') or []))}"
        if speed.get(n) and n != "vanilla":
            ratios = True
            verdict = ratio_verdict(cells[n], cells.get("vanilla"), "it_per_s", noise)
            label += f"\nx{speed[n]:.2f}" + (f"\n{_wrap(verdict, 14)}" if verdict else "")
        _label(ax, label, x, m + h, "y", ha="center", va="bottom")
    pub = t1.get("published")
    if pub:
        pv = [pub["it_per_s"].get(n) for n in names]
        ax.scatter(
            [x for x, v in zip(xs, pv) if v],
            [v for v in pv if v],
            marker="D",
            color="tab:orange",
            zorder=3,
            label=f"published ({pub['device']})",
        )
    ax.set_xticks(xs, names)
    ax.set_ylabel("it/s (denoising steps per second)")
    samples = {n: cells[n].get("it_per_s") or [] for n in names}
    order = (
        (f"fastest first: {ranking(samples, '{:.3g}'.format)} ('≈': within noise; '?': one sample, not established)")
        if len(names) > 1
        else ""
    )
    ax.set_xlabel("\n".join(x for x in (_wrap(order), _not_measured(cells, "it_per_s")) if x), fontsize=7.5, loc="left")
    s = t1["setting"]
    # the ratio is promised only where it is drawn: not when vanilla was not measured
    legend = (
        "xN: speedup over vanilla"
        if ratios
        else f"no speedup shown: vanilla {'not measured' if 'vanilla' in cells else 'not in this run'}"
    )
    ax.set_title(
        _wrap(f"{device}: it/s per processor, {s['resolution']}px, {s['dtype']}, batch {s['batch']} ({legend})", 90),
        fontsize=9,
    )
    ax.legend(fontsize=8, loc="upper right")
    return fig


def plot_ladder(plt, t2: dict, device: str):
    """The measured steps only; the others named under the axes, once per reason (as in
    table 2)."""
    measured = [r for r in t2["rows"] if is_measured(r, "seconds")]
    if not measured:
        return None
    base = next((r for r in t2["rows"] if r["name"] == "fp32"), None)
    noise = run_noise(measured, "seconds")
    gone = not_measured(t2["rows"], "seconds", 90)
    footer = _wrap("not measured: " + "; ".join(gone)) if gone else ""
    fig, ax = plt.subplots(figsize=(WIDTH, 0.45 * len(measured) + 1.8 + 0.14 * footer.count("\n")))
    texts = []
    for r in measured:
        ratio = (
            _with_verdict(f"x{r['speedup_vs_fp32']:.2f} vs fp32", ratio_verdict(r, base, "seconds", noise)) + ", "
            if r.get("speedup_vs_fp32")
            else ""
        )
        texts.append(f"{r['seconds_median']:.3g} s ({ratio}n={r.get('samples', len(r.get('seconds') or []))})")
    _hbars(
        ax,
        [r["name"] for r in measured],
        [r["seconds_median"] for r in measured],
        texts,
        "tab:green",
        [(r["seconds_min"], r["seconds_max"]) for r in measured],
    )
    ax.set_xlabel(
        "seconds per image (median, whiskers: min–max of n samples)" + ("\n" + footer if footer else ""),
        fontsize=8,
        loc="left",
    )
    ax.set_title(_wrap(f"{device}: latency ladder, {t2['setting'].get('includes', '')}", 90), fontsize=9)
    return fig


def plot_memory(plt, t4: dict, device: str):
    cells = t4["cells"]
    names = [n for n, c in cells.items() if c.get("peak_bytes")]
    if not names:
        return None
    mib = 1 << 20
    over = [cells[n].get("activation_bytes", 0) / mib for n in names]
    fig, ax = plt.subplots(figsize=(WIDTH, 0.5 * len(names) + 2.2))
    texts = [f"{o:.0f} MiB over baseline (peak {_size(cells[n]['peak_bytes'])})" for n, o in zip(names, over)]
    _hbars(ax, names, over, texts, "tab:purple")
    base = [cells[n].get("baseline_bytes") or 0 for n in names]
    gone = _not_measured(cells, "peak_bytes")
    ax.set_xlabel(
        _wrap(
            f"MiB the denoising loop adds over the baseline (weights and inputs: "
            f"{_size(min(base))}–{_size(max(base))}, about the same for every "
            "processor)"
        )
        + ("\n" + gone if gone else ""),
        fontsize=7.5,
        loc="left",
    )
    ax.set_title(_wrap(f"{device}: peak memory per processor — {t4['method']}", 90), fontsize=9)
    return fig


def plot_sweep(plt, t3: dict, device: str):
    runs = [r for r in t3.get("runs", []) if len(r.get("batches", [])) >= 2]
    if not runs:
        return None
    fig, axes = plt.subplots(len(runs), 2, figsize=(WIDTH + 2, 3.8 * len(runs)), squeeze=False)
    for row, run in zip(axes, runs):
        names = list(run["batches"][0]["cells"])
        ratios = False
        for n in names:
            pts = [
                (e["batch"], e["cells"][n]["it_per_s_median"] * e["batch"])
                for e in run["batches"]
                if n in e["cells"] and e["cells"][n].get("it_per_s_median")
            ]
            sp = [(e["batch"], e["speedup_vs_vanilla"][n]) for e in run["batches"] if e["speedup_vs_vanilla"].get(n)]
            if pts:
                row[0].plot(*zip(*pts), marker="o", label=n)
            if sp:
                ratios = True
                row[1].plot(*zip(*sp), marker="o", label=n)
        if not ratios:  # an empty panel must not read as a speedup of nothing
            row[1].text(
                0.5,
                0.5,
                "vanilla not measured in this run:\nno speedup over it",
                ha="center",
                va="center",
                transform=row[1].transAxes,
                fontsize=9,
            )
            row[1].set_yticks([])
        batches = [e["batch"] for e in run["batches"]]
        for ax, ylabel in zip(row, ("images/s", "speedup over vanilla")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.minorticks_off()
            ax.set_xlabel("batch size")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{run['dtype']}{' + compile' if run['compile'] else ''}", fontsize=9)
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=7)
    repeats = t3.get("setting", {}).get("repeats")
    noise = (
        "one sample per point: its noise unknown" if repeats == 1 else f"median of up to {repeats} samples per point"
    )
    fig.suptitle(_wrap(f"{device}: batch sweep ({noise})", 110), fontsize=9)
    return fig


def plot_transformers(plt, t5: dict, device: str):
    models = [m for m in t5.get("models", []) if any(is_measured(c, "step_seconds") for c in m["cells"].values())]
    if not models:
        return None
    heights = [0.45 * len(m["cells"]) + 1.6 for m in models]
    fig, axes = plt.subplots(
        len(models), 1, figsize=(WIDTH, sum(heights)), squeeze=False, gridspec_kw={"height_ratios": heights}
    )
    for (ax,), m in zip(axes, models):
        cells = m["cells"]
        vs = m.get("ratio_vs", {}).get("native", {})
        values = [c["step_seconds_median"] if is_measured(c, "step_seconds") else 0.0 for c in cells.values()]
        spread = [
            (c["step_seconds_min"], c["step_seconds_max"]) if is_measured(c, "step_seconds") else (0.0, 0.0)
            for c in cells.values()
        ]
        noise = run_noise(cells.values(), "step_seconds")
        texts = []
        for n, c in cells.items():
            if not is_measured(c, "step_seconds"):
                texts.append(_reason(c))
                continue
            ratio = (
                _with_verdict(f"x{vs[n]:.3f} of native", ratio_verdict(c, cells.get("native"), "step_seconds", noise))
                + ", "
                if n in vs
                else ""
            )
            texts.append(f"{c['step_seconds_median']:.3g} s ({ratio}n={c.get('samples', 0)})")
        _hbars(ax, list(cells), values, texts, "tab:cyan", spread)
        ax.set_xlabel("seconds per forward step (median, whiskers: min–max of n samples)")
        ax.set_title(_wrap(f"{device}: {m['label']}", 90), fontsize=9)
    return fig


PLOTS = (
    ("1", "it_per_s.png", plot_it_per_s),
    ("2", "ladder.png", plot_ladder),
    ("3", "batch_sweep.png", plot_sweep),
    ("4", "memory.png", plot_memory),
    ("5", "transformers.png", plot_transformers),
)


def write_plots(results: dict, out_dir: str) -> tuple[list[str], list[str]]:
    """PNG plots of the tables present: (paths written, what was not drawn and why)."""
    tables = {k: t for k, t in results["tables"].items() if "error" not in t and "skipped" not in t}
    if not tables:
        return [], []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], [
            f"no plots: matplotlib is not installed ({EXTRA_HINT} installs it); "
            "results.json and table.md hold every number"
        ]
    device = results["environment"]["device_name"]
    written, problems = [], []
    for key, name, draw in PLOTS:
        if key not in tables:
            continue
        fig = draw(plt, tables[key], device)
        if fig is None:
            what = "one batch size per run" if key == "3" else "nothing measured"
            problems.append(f"{name} not drawn: {what} (table {key} in table.md has it)")
            continue
        written.append(_save(plt, fig, out_dir, name))
    return written, problems
