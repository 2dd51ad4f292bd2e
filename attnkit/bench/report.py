"""Results as a markdown table, results.json and PNG plots.

Everything here works from the results dict alone, so ``table.md`` and the plots can be
redrawn from a ``results.json`` (``python -m attnkit.bench.report results.json``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from . import published

SCHEMA = 1
REQUIRED_FIELDS = ("schema", "environment", "preset", "model", "processors", "tables", "elapsed_seconds")
REQUIRED_ENVIRONMENT = ("device", "device_name", "capability", "versions", "date", "command")
REQUIRED_VERSIONS = ("torch", "diffusers", "triton", "xformers", "flash-attn")


def _num(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "–"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.{digits}f}"


def _x(x: float | None) -> str:
    return "–" if x is None else f"x{x:.2f}"


def _bytes(n: float | None) -> str:
    if n is None:
        return "–"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    return f"{n / (1 << 20):.0f} MiB"


def _short(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def first_reason(reason: str) -> str:
    """The first of "; "-separated reasons, without its parenthesised advice."""
    import re

    first = str(reason).split("; ")[0]
    return re.sub(r"\s*\((pip|conda|install|upgrade|supported)[^)]*(\)|$)", "", first).strip() or first


def cell_text(cell: dict, limit: int = 40) -> str:
    """What a table shows for a configuration without a number."""
    status, reason = cell.get("status"), cell.get("reason", "")
    if status == "n/a":
        return f"n/a ({_short(first_reason(reason) if limit < 100 else reason, limit)})"
    if status == "oom":
        return "out of memory"
    if status == "failed":
        return f"failed: {_short(reason, limit)}"
    if status == "skipped":
        return f"skipped ({_short(reason, limit)})"
    return "–"


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    def esc(s: str) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(esc(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# -- the four tables -------------------------------------------------------------------
def render_table1(t: dict, env: dict) -> str:
    cells = t["cells"]
    names = list(cells)
    speed = t.get("speedup_vs_vanilla", {})
    s = t["setting"]
    ours = []
    for n in names:
        c = cells[n]
        if c.get("status") == "ok" and c.get("it_per_s_median"):
            ours.append(f"{_num(c['it_per_s_median'])}" + (f" ({_x(speed.get(n))})" if n != "vanilla" and speed.get(n) else ""))
        else:
            ours.append(cell_text(c, 28))
    best = max(((v, n) for n, v in speed.items() if n != "vanilla" and v), default=None)
    label = f"**this run**: {env['device_name']}, {s['dtype']}" + (", compiled" if s.get("compile") else "")
    rows = [[label, *ours, f"{_x(best[0])} ({best[1]})" if best else "–"]]
    pub = t.get("published")
    if pub:
        its = pub["it_per_s"]
        pv = its.get("vanilla")
        prow = [f"{_num(its[n])}" + (f" ({_x(its[n] / pv)})" if n != "vanilla" and pv else "") if n in its else "–" for n in names]
        pbest = max(((its[n] / pv, n) for n in its if n != "vanilla"), default=None) if pv else None
        rows.append([f"published: {pub['device']} (diffusers docs v0.18)", *prow,
                     f"{_x(pbest[0])} ({pbest[1]})" if pbest else "–"])
    head = ["device"] + [f"{n} ({published_name(n)})" if published_name(n) else n for n in names] + ["best vs vanilla"]
    out = [
        "### 1. Denoising-loop it/s per attention processor",
        f"{s['resolution']}x{s['resolution']}, {s['steps']} DDIM steps, batch {s['batch']} "
        f"(UNet batch {2 * s['batch']}: classifier-free guidance), {s['dtype']}; steady-state it/s "
        f"(first {s['steady_state_skips_first_steps']} steps excluded), median of {s['repeats']} interleaved runs "
        "after a warm-up; (xN) = speedup over vanilla.",
        "",
        _md_table(head, rows),
    ]
    if not pub:
        out += ["", f"(no published row: the seed table did not measure {env['device_name']})"]
    detail = []
    for n in names:
        c = cells[n]
        if c.get("status") == "ok" and c.get("it_per_s_median"):
            detail.append([n, _num(c["it_per_s_median"]), f"{_num(c['it_per_s_min'])}–{_num(c['it_per_s_max'])}",
                           _num(c.get("loop_it_per_s_median")), _num(c.get("seconds_median")),
                           _x(speed.get(n)), _num(c.get("warmup_seconds"), 1)])
        else:
            detail.append([n, "–", "–", "–", "–", "–", cell_text(c, 200)])
    out += ["", _md_table(["processor", "it/s (median)", "min–max", "whole-loop it/s", "s per loop", "vs vanilla",
                           "warm-up s / status"], detail)]
    return "\n".join(out)


def published_name(name: str) -> str:
    from .availability import SEED_NAMES

    return SEED_NAMES.get(name, "")


def render_table2(t: dict, env: dict) -> str:
    s = t["setting"]
    pub = t.get("published", {})
    prow = pub.get("rows", [])
    rows = []
    for i, r in enumerate(t["rows"]):
        if r.get("status") == "ok" and r.get("seconds_median"):
            ours = [_num(r["seconds_median"], 3), f"{_num(r['seconds_min'], 3)}–{_num(r['seconds_max'], 3)}",
                    _x(r.get("speedup_vs_fp32"))]
        else:
            ours = [cell_text(r, 50), "–", "–"]
        ref = ""
        if i < 4 and i < len(prow):
            ref = f"{prow[i]['step']}: {prow[i]['seconds']:.2f} s, x{prow[i]['speedup']:.2f}"
        elif r["name"].endswith("+ xformers") and len(prow) > 4:
            ref = f"{prow[4]['step']}: {prow[4]['seconds']:.2f} s, x{prow[4]['speedup']:.2f}"
        rows.append([r["name"], *ours, ref])
    return "\n".join([
        "### 2. Latency ladder: seconds per image, cumulative speedup",
        f"One image, {s['resolution']}x{s['resolution']}, {s['steps']} DDIM steps; timed: {s.get('includes', '')}; "
        f"median of {s['repeats']} interleaved runs; the published column is the seed's ladder "
        f"({pub.get('device', '')}, 512x512, 50 DDIM steps, traced UNet where we compile).",
        "",
        _md_table(["step", "s / image", "min–max", "speedup vs fp32", f"published ({pub.get('device', '')})"], rows),
    ])


def render_table3(t: dict, env: dict) -> str:
    s = t["setting"]
    out = [
        "### 3. Batch-size sweep: images/s and speedup over vanilla / xformers",
        f"{s['resolution']}x{s['resolution']}, {s['steps_per_run']} steps per run, median of {s['repeats']} "
        "interleaved runs per batch, batch 1, 2, 4, ... until out of memory "
        f"(or batch {s['max_batch']}); cell: images/s (x vs vanilla / x vs xformers).",
    ]
    for run in t["runs"]:
        title = f"**{run['dtype']}{', torch.compile' if run['compile'] else ''}**"
        if not run["batches"]:
            out += ["", f"{title}: {run.get('stopped', 'no data')}"]
            continue
        names = list(run["batches"][0]["cells"])
        rows = []
        for entry in run["batches"]:
            b = entry["batch"]
            row = [str(b)]
            for n in names:
                c = entry["cells"].get(n)
                if c is None:
                    row.append("–")
                elif c.get("status") == "ok" and c.get("it_per_s_median"):
                    img = c["it_per_s_median"] * b
                    sv = entry["speedup_vs_vanilla"].get(n)
                    sx = entry["speedup_vs_xformers"].get(n)
                    extra = " / ".join(x for x in (_x(sv) if sv and n != "vanilla" else "", _x(sx) + " xf" if sx and n != "xformers" else "") if x)
                    row.append(f"{_num(img)}" + (f" ({extra})" if extra else ""))
                else:
                    row.append(cell_text(c, 24))
            rows.append(row)
        def largest_text(n: str) -> str:
            fit = run["max_batch"].get(n)
            if n in run.get("oom_at", {}):
                return f"{fit if fit else 'none'} (OOM at {run['oom_at'][n]})"
            if fit is None:
                return "–"
            return f"≥ {fit} (no OOM)" if fit == s["max_batch"] else str(fit)

        largest = ["largest batch"] + [largest_text(n) for n in names]
        rows.append(largest)
        out += ["", title + (f" — {run['stopped']}" if run.get("stopped") else ""), "",
                _md_table(["batch"] + names, rows)]
    if t.get("mem_cap_bytes"):
        out += ["", f"(CPU: the sweep ran in its own process with its address space capped at {_bytes(t['mem_cap_bytes'])} over its start)"]
    return "\n".join(out)


def render_table4(t: dict, env: dict) -> str:
    s = t["setting"]
    rows = []
    for n, c in t["cells"].items():
        if c.get("status") == "ok":
            rows.append([n, _bytes(c.get("peak_bytes")), _bytes(c.get("activation_bytes")), _bytes(c.get("baseline_bytes"))])
        else:
            rows.append([n, cell_text(c, 60), "–", "–"])
    out = [
        "### 4. Peak memory per processor",
        f"{t['method']}; {s['resolution']}x{s['resolution']}, batch {s['batch']}, {s['dtype']}, {s['steps']} steps.",
        "",
        _md_table(["processor", "peak", "over baseline", "baseline (weights, inputs)"], rows),
    ]
    dec = t.get("vae_decode") or {}
    if dec.get("peak_bytes"):
        out += ["", f"VAE decode (diffusers' own attention, the same for every row): peak {_bytes(dec['peak_bytes'])}."]
    return "\n".join(out)


RENDERERS = {"1": render_table1, "2": render_table2, "3": render_table3, "4": render_table4}


def render_markdown(results: dict) -> str:
    env = results["environment"]
    preset = results["preset"]
    v = env["versions"]
    cap = f", capability {'.'.join(map(str, env['capability']))}" if env.get("capability") else ""
    head = [
        f"## attnkit bench — {env['device_name']}{cap}",
        "",
        f"- preset **{preset['name']}**: {preset['label']}",
        f"- model: {results['model']['source']}",
        "- versions: " + ", ".join(f"{k} {v.get(k) or 'not installed'}" for k in ("torch", "diffusers", "triton", "xformers", "flash-attn")),
        f"- date: {env['date']}; command: `{env['command']}`; took {results.get('elapsed_seconds', 0):.0f} s",
    ]
    for note in preset.get("notes") or ():
        head.append(f"- note: {note}")
    for note in results.get("notes") or ():
        head.append(f"- note: {note}")
    parts = ["\n".join(head)]
    for key in ("1", "2", "3", "4"):
        t = results["tables"].get(key)
        if t is None:
            continue
        if "error" in t:
            parts.append(f"### {key}. {t.get('title', '')}\n\nfailed: {t['error']}")
            continue
        parts.append(RENDERERS[key](t, env))
    return "\n\n".join(parts) + "\n"


# -- JSON ---------------------------------------------------------------------------------
def missing_fields(results: dict) -> list[str]:
    """Required fields absent from a results dict (empty when it is complete)."""
    missing = [k for k in REQUIRED_FIELDS if k not in results]
    env = results.get("environment", {})
    missing += [f"environment.{k}" for k in REQUIRED_ENVIRONMENT if k not in env]
    missing += [f"environment.versions.{k}" for k in REQUIRED_VERSIONS if k not in env.get("versions", {})]
    return missing


def write_json(results: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(results, f, indent=2, sort_keys=False, default=str)
        f.write("\n")


# -- plots --------------------------------------------------------------------------------
def _save(plt, fig, out_dir: str, name: str) -> str:
    """Lay out, write and close one figure; returns its path."""
    fig.tight_layout()
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(results: dict, out_dir: str) -> list[str]:
    """PNG plots of the tables present; the paths written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    env = results["environment"]
    t1 = results["tables"].get("1")
    if t1 and "cells" in t1:
        names = list(t1["cells"])
        med = [t1["cells"][n].get("it_per_s_median") or 0.0 for n in names]
        lo = [m - (t1["cells"][n].get("it_per_s_min") or m) for n, m in zip(names, med)]
        hi = [(t1["cells"][n].get("it_per_s_max") or m) - m for n, m in zip(names, med)]
        fig, ax = plt.subplots(figsize=(8, 4.5))
        xs = list(range(len(names)))
        ax.bar(xs, med, yerr=[lo, hi], capsize=4, color="tab:blue", label="this run (median, min–max)")
        pub = t1.get("published")
        if pub:
            pv = [pub["it_per_s"].get(n) for n in names]
            ax.scatter([x for x, v in zip(xs, pv) if v], [v for v in pv if v], marker="D", color="tab:orange",
                       zorder=3, label=f"published ({pub['device']})")
        for x, n, m in zip(xs, names, med):
            if not m:
                ax.text(x, 0, cell_text(t1["cells"][n], 18), rotation=90, ha="center", va="bottom", fontsize=7)
        ax.set_xticks(xs, names)
        ax.set_ylabel("it/s (denoising steps per second)")
        s = t1["setting"]
        ax.set_title(f"{env['device_name'][:60]}\n{s['resolution']}px, {s['dtype']}, batch {s['batch']}", fontsize=9)
        ax.legend(fontsize=8)
        written.append(_save(plt, fig, out_dir, "it_per_s.png"))
    t3 = results["tables"].get("3")
    if t3 and t3.get("runs"):
        runs = [r for r in t3["runs"] if r.get("batches")]
        if runs:
            fig, axes = plt.subplots(len(runs), 2, figsize=(10, 3.6 * len(runs)), squeeze=False)
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
                label = f"{run['dtype']}{' + compile' if run['compile'] else ''}"
                batches = [e["batch"] for e in run["batches"]]
                for ax, ylabel in zip(row, ("images/s", "speedup over vanilla")):
                    ax.set_xscale("log", base=2)
                    ax.set_xticks(batches, [str(b) for b in batches])
                    ax.minorticks_off()
                    ax.set_xlabel("batch size")
                    ax.set_ylabel(ylabel)
                    ax.set_title(label, fontsize=9)
                    ax.grid(alpha=0.3)
                row[0].legend(fontsize=7)
            fig.suptitle(env["device_name"][:80], fontsize=9)
            written.append(_save(plt, fig, out_dir, "batch_sweep.png"))
    t2 = results["tables"].get("2")
    if t2 and t2.get("rows"):
        rows = [r for r in t2["rows"] if r.get("seconds_median")]
        if rows:
            fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
            ax.barh([r["name"] for r in rows][::-1], [r["seconds_median"] for r in rows][::-1], color="tab:green")
            ax.set_xlabel("seconds per image")
            ax.set_title(env["device_name"][:80], fontsize=9)
            written.append(_save(plt, fig, out_dir, "ladder.png"))
    t4 = results["tables"].get("4")
    if t4 and t4.get("cells"):
        items = [(n, c.get("peak_bytes")) for n, c in t4["cells"].items() if c.get("peak_bytes")]
        if items:
            fig, ax = plt.subplots(figsize=(8, 4))
            ax.bar([n for n, _ in items], [b / (1 << 30) for _, b in items], color="tab:purple")
            ax.set_ylabel("peak memory (GiB)")
            ax.set_title(f"{env['device_name'][:60]}: {t4['method'][:60]}", fontsize=8)
            written.append(_save(plt, fig, out_dir, "memory.png"))
    return written


def write_all(results: dict, out_dir: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "results.json"), os.path.join(out_dir, "table.md")]
    write_json(results, paths[0])
    with open(paths[1], "w") as f:
        f.write(render_markdown(results))
    return paths + write_plots(results, out_dir)


def merge(parts: list[dict]) -> dict:
    """One results dict from several runs (e.g. one per table): later tables win.

    The environment, model and preset shown are the first part's; every part's command,
    preset and timing are kept under "parts".
    """
    if not parts:
        raise ValueError("nothing to merge")
    merged = json.loads(json.dumps(parts[0]))
    merged["tables"] = {}
    merged["parts"] = []
    merged["notes"] = list(parts[0].get("notes") or [])
    for part in parts:
        merged["tables"].update(part.get("tables", {}))
        merged["parts"].append({
            "tables": sorted(part.get("tables", {})), "command": part["environment"]["command"],
            "preset": part.get("preset", {}).get("name"), "elapsed_seconds": part.get("elapsed_seconds"),
            "compile": part.get("compile"), "date": part["environment"].get("date"),
        })
        for note in part.get("notes") or []:
            if note not in merged["notes"]:
                merged["notes"].append(note)
    merged["elapsed_seconds"] = sum(p.get("elapsed_seconds") or 0.0 for p in parts)
    merged["environment"]["command"] = " && ".join(p["command"] for p in merged["parts"])
    return merged


USAGE = (
    "usage: python -m attnkit.bench.report RESULTS.json [OUT_DIR]      redraw table.md and plots\n"
    "       python -m attnkit.bench.report --merge OUT_DIR A.json B.json ...   one record from several runs"
)


def main(argv: list[str] | None = None) -> int:
    """Redraw table.md and the plots from a results.json, or merge several."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 0 if argv else 2
    if argv[0] == "--merge":
        if len(argv) < 3:
            print(USAGE, file=sys.stderr)
            return 2
        parts = []
        for path in argv[2:]:
            try:
                with open(path) as f:
                    parts.append(json.load(f))
            except (OSError, ValueError) as exc:
                print(f"skipping {path}: {exc}", file=sys.stderr)
        if not parts:
            print("no results to merge", file=sys.stderr)
            return 1
        results = merge(parts)
        write_all(results, argv[1])
        print(render_markdown(results))
        return 0
    with open(argv[0]) as f:
        results: dict[str, Any] = json.load(f)
    out_dir = argv[1] if len(argv) > 1 else os.path.dirname(os.path.abspath(argv[0]))
    print(render_markdown(results))
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(render_markdown(results))
    write_plots(results, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["render_markdown", "write_all", "write_json", "write_plots", "missing_fields", "published"]
