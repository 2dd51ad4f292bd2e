"""PNG plots of the tables (matplotlib, from the ``attnkit[bench]`` extra).

Every bar carries its value; what was not measured is named with its reason under the
axes, never drawn as a zero bar; titles are wrapped, never cut. :func:`write_plots`
returns what it drew and, for what it did not, why (matplotlib missing, a sweep with a
single batch size: its table says all there is).
"""

from __future__ import annotations

import os
import textwrap

from .measure import cell_text
from .progress import EXTRA_HINT

WIDTH = 9.0  # inches; text is wrapped to fit


def _wrap(text: str, chars: int = 110) -> str:
    return "\n".join(textwrap.wrap(" ".join(str(text).split()), chars)) or ""


def _ok(cell: dict, key: str) -> bool:
    return cell.get("status") == "ok" and bool(cell.get(f"{key}_median"))


def _not_measured(cells: dict[str, dict], key: str) -> str:
    """'not measured: name: why; ...' for the cells without a `key` median (memory: `key`)."""
    gone = [f"{n}: {cell_text(c.get('status'), c.get('reason', ''), 70)}" for n, c in cells.items()
            if not (_ok(c, key) or c.get(key))]
    return _wrap("not measured: " + "; ".join(gone)) if gone else ""


def _size(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def _save(plt, fig, out_dir: str, name: str) -> str:
    fig.tight_layout()
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _hbars(ax, labels: list[str], values: list[float], texts: list[str], color: str,
           spread: list[tuple[float, float]] | None = None) -> None:
    """Horizontal bars, first label on top, each with its text past the bar's end (and
    past its min-max whisker when `spread` gives one)."""
    ys = list(range(len(labels)))[::-1]
    ax.barh(ys, values, color=color)
    ax.set_yticks(ys, labels)
    ends = [max(v, hi) for v, (_, hi) in zip(values, spread)] if spread is not None else values
    top = max(ends) if ends and max(ends) > 0 else 1.0
    for y, v, (lo, hi) in zip(ys, values, spread or []):
        if hi > lo:  # one sample has no spread: no whisker that could read as a digit
            ax.errorbar(v, y, xerr=[[v - lo], [hi - v]], fmt="none", ecolor="black", capsize=3)
    for y, end, text in zip(ys, ends, texts):
        ax.text(end + top * 0.02, y, text, va="center", fontsize=8)
    ax.set_xlim(0, top * 1.7)  # room for the longest label


def plot_it_per_s(plt, t1: dict, device: str):
    cells = t1["cells"]
    names = [n for n in cells if _ok(cells[n], "it_per_s")]
    if not names:
        return None
    med = [cells[n]["it_per_s_median"] for n in names]
    lo = [m - cells[n]["it_per_s_min"] for n, m in zip(names, med)]
    hi = [cells[n]["it_per_s_max"] - m for n, m in zip(names, med)]
    speed = t1.get("speedup_vs_vanilla", {})
    fig, ax = plt.subplots(figsize=(WIDTH, 5))
    xs = list(range(len(names)))
    ax.bar(xs, med, yerr=[lo, hi], capsize=4, color="tab:blue", label="this run: median, min–max of n samples")
    for x, n, m, h in zip(xs, names, med, hi):
        label = f"{m:.3g}\nn={cells[n].get('samples', len(cells[n].get('it_per_s') or []))}"
        if speed.get(n) and n != "vanilla":
            label += f"\nx{speed[n]:.2f}"
        ax.text(x, m + h + max(med) * 0.02, label, ha="center", va="bottom", fontsize=8)
    pub = t1.get("published")
    if pub:
        pv = [pub["it_per_s"].get(n) for n in names]
        ax.scatter([x for x, v in zip(xs, pv) if v], [v for v in pv if v], marker="D", color="tab:orange",
                   zorder=3, label=f"published ({pub['device']})")
    ax.set_xticks(xs, names)
    ax.set_ylim(0, max(med + [v for v in (pub or {}).get("it_per_s", {}).values()]) * 1.3)
    ax.set_ylabel("it/s (denoising steps per second)")
    ax.set_xlabel(_not_measured(cells, "it_per_s"), fontsize=7.5, loc="left")
    s = t1["setting"]
    ax.set_title(_wrap(f"{device}: it/s per processor, {s['resolution']}px, {s['dtype']}, batch {s['batch']} "
                       "(xN: speedup over vanilla)", 90), fontsize=9)
    ax.legend(fontsize=8, loc="upper right")
    return fig


def plot_ladder(plt, t2: dict, device: str):
    rows = t2["rows"]
    if not any(_ok(r, "seconds") for r in rows):
        return None
    fig, ax = plt.subplots(figsize=(WIDTH, 0.45 * len(rows) + 1.8))
    values = [r["seconds_median"] if _ok(r, "seconds") else 0.0 for r in rows]
    spread = [(r["seconds_min"], r["seconds_max"]) if _ok(r, "seconds") else (0.0, 0.0) for r in rows]
    texts = [f"{r['seconds_median']:.3g} s (x{r['speedup_vs_fp32']:.2f} vs fp32, n={r.get('samples', 0)})"
             if _ok(r, "seconds") and r.get("speedup_vs_fp32") else
             (f"{r['seconds_median']:.3g} s" if _ok(r, "seconds") else cell_text(r.get("status"), r.get("reason", ""), 60))
             for r in rows]
    _hbars(ax, [r["name"] for r in rows], values, texts, "tab:green", spread)
    ax.set_xlabel("seconds per image (median, whiskers: min–max of n samples)")
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
    ax.set_xlabel(_wrap(f"MiB the denoising loop adds over the baseline (weights and inputs: "
                        f"{_size(min(base))}–{_size(max(base))}, about the same for every "
                        "processor)") + ("\n" + gone if gone else ""), fontsize=7.5, loc="left")
    ax.set_title(_wrap(f"{device}: peak memory per processor — {t4['method']}", 90), fontsize=9)
    return fig


def plot_sweep(plt, t3: dict, device: str):
    runs = [r for r in t3.get("runs", []) if len(r.get("batches", [])) >= 2]
    if not runs:
        return None
    fig, axes = plt.subplots(len(runs), 2, figsize=(WIDTH + 2, 3.8 * len(runs)), squeeze=False)
    for row, run in zip(axes, runs):
        names = list(run["batches"][0]["cells"])
        for n in names:
            pts = [(e["batch"], e["cells"][n]["it_per_s_median"] * e["batch"]) for e in run["batches"]
                   if n in e["cells"] and e["cells"][n].get("it_per_s_median")]
            sp = [(e["batch"], e["speedup_vs_vanilla"][n]) for e in run["batches"] if e["speedup_vs_vanilla"].get(n)]
            if pts:
                row[0].plot(*zip(*pts), marker="o", label=n)
            if sp:
                row[1].plot(*zip(*sp), marker="o", label=n)
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
    noise = "one sample per point: its noise unknown" if repeats == 1 else f"median of up to {repeats} samples per point"
    fig.suptitle(_wrap(f"{device}: batch sweep ({noise})", 110), fontsize=9)
    return fig


def plot_transformers(plt, t5: dict, device: str):
    models = [m for m in t5.get("models", []) if any(_ok(c, "step_seconds") for c in m["cells"].values())]
    if not models:
        return None
    heights = [0.45 * len(m["cells"]) + 1.6 for m in models]
    fig, axes = plt.subplots(len(models), 1, figsize=(WIDTH, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for (ax,), m in zip(axes, models):
        cells = m["cells"]
        vs = m.get("ratio_vs", {}).get("native", {})
        values = [c["step_seconds_median"] if _ok(c, "step_seconds") else 0.0 for c in cells.values()]
        spread = [(c["step_seconds_min"], c["step_seconds_max"]) if _ok(c, "step_seconds") else (0.0, 0.0)
                  for c in cells.values()]
        texts = [f"{c['step_seconds_median']:.3g} s (" + (f"x{vs[n]:.3f} of native, " if n in vs else "")
                 + f"n={c.get('samples', 0)})" if _ok(c, "step_seconds")
                 else cell_text(c.get("status"), c.get("reason", ""), 60) for n, c in cells.items()]
        _hbars(ax, list(cells), values, texts, "tab:cyan", spread)
        ax.set_xlabel("seconds per forward step (median, whiskers: min–max of n samples)")
        ax.set_title(_wrap(f"{device}: {m['label']}", 90), fontsize=9)
    return fig


PLOTS = (("1", "it_per_s.png", plot_it_per_s), ("2", "ladder.png", plot_ladder),
         ("3", "batch_sweep.png", plot_sweep), ("4", "memory.png", plot_memory),
         ("5", "transformers.png", plot_transformers))


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
        return [], [f"no plots: matplotlib is not installed ({EXTRA_HINT} installs it); "
                    "results.json and table.md hold every number"]
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
