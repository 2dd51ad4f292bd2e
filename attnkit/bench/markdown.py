"""The tables as markdown: what table.md and stdout show (the words for numbers and
noise verdicts, which the plots share, are in :mod:`.wording`).

Every table states how many samples each cell holds and says where a difference it
shows is within the noise of the run; the header gives the time budget and the
machine's load. Works from the results dict alone.

This module writes the whole of table.md: the header, the run's budget and load, each
table by its renderer (tables 1 to 4 in :mod:`.markdown_sd`, table 5 in
:mod:`.markdown_dit`), then the sections.
"""

from __future__ import annotations

from .markdown_dit import render_table5
from .markdown_sd import render_table1, render_table2, render_table3, render_table4
from .sections import render_sections

RENDERERS = {"1": render_table1, "2": render_table2, "3": render_table3, "4": render_table4, "5": render_table5}


def _cells_of(t: dict) -> list[dict]:
    out = list((t.get("cells") or {}).values()) + list(t.get("rows") or [])
    for run in t.get("runs") or []:
        for entry in run.get("batches", []):
            out += list(entry["cells"].values())
    for m in t.get("models") or []:
        out += list(m["cells"].values())
    return out


def short_cells(results: dict) -> tuple[int, list[str]]:
    """The measured cells holding fewer samples than their table asked for (the time
    budget ended their rounds; a cell that fails in a later round is marked failed, not
    shortened): (how many, ['table 5 (flux-cpu): native n=6, stock n=6 of 7 asked', ...])."""
    count, out = 0, []
    for key in sorted(results["tables"]):
        t = results["tables"][key]
        if "error" in t or "skipped" in t:
            continue
        asked = (t.get("setting") or {}).get("repeats")
        groups: list[tuple[str, int | None, dict[str, dict]]] = []
        if key == "1":
            groups.append(("", asked, t.get("cells") or {}))
        elif key == "2":
            groups.append(("", asked, {r["name"]: r for r in t.get("rows", [])}))
        elif key == "3":
            for run in t.get("runs") or []:
                for entry in run.get("batches", []):
                    compiled = ", compiled" if run.get("compile") else ""
                    groups.append((f" ({run['dtype']}{compiled}, batch {entry['batch']})", asked, entry["cells"]))
        elif key == "5":
            for m in t.get("models") or []:
                groups.append((f" ({m.get('preset') or m.get('label', '')})", m["setting"].get("repeats"), m["cells"]))
        for where, want, cells in groups:
            few = [
                f"{n} n={c['samples']}"
                for n, c in cells.items()
                if want and c.get("status") == "ok" and 0 < (c.get("samples") or 0) < want
            ]
            if few:
                count += len(few)
                out.append(f"table {key}{where}: {', '.join(few)} of {want} asked")
    return count, out


def run_lines(results: dict) -> list[str]:
    """The budget and the machine's load: how far this run's numbers can be trusted."""
    env = results["environment"]
    n_short, short = short_cells(results)
    few = (
        (f"{n_short} cell(s) with fewer samples than asked (the budget ended their rounds): " + "; ".join(short))
        if short
        else ""
    )
    if results.get("parts"):  # a merged record: each run's own budget and load
        return (
            [
                f"- run `{p['command']}`: "
                + (f"budget {p['budget_seconds']:.0f} s, " if p.get("budget_seconds") else "")
                + f"took {p.get('elapsed_seconds') or 0:.0f} s"
                + (
                    f", load average {p['load_average_start'][0]:.1f} at the start"
                    + (f", {p['load_average_end'][0]:.1f} at the end" if p.get("load_average_end") else "")
                    if p.get("load_average_start")
                    else ""
                )
                for p in results["parts"]
            ]
            + [
                f"- load average: runnable processes over the last minute, on {env.get('cpu_count') or '?'} CPUs: a load "
                "above the CPU count means a run waited for cores, and its timings are slower and noisier than on an "
                "idle machine"
            ]
            + ([f"- {few}"] if few else [])
        )
    skipped = sum(
        1
        for t in results["tables"].values()
        for c in _cells_of(t)
        if c.get("status") == "skipped" and c.get("reason") == "time budget"
    )
    budget = results.get("budget_seconds")
    took = results.get("elapsed_seconds", 0.0)
    line = (
        f"- time budget: {budget:.0f} s for the whole run, model build included; it took {took:.0f} s"
        if budget
        else f"- no time budget; the run took {took:.0f} s"
    )
    if budget:
        gone = [k for k, t in results["tables"].items() if "skipped" in t]
        cut = (
            [
                (
                    f"{skipped} measurement(s)" + (f" and table(s) {', '.join(gone)}" if gone else "")
                    if skipped
                    else f"table(s) {', '.join(gone)}"
                )
                + " skipped for the budget"
            ]
            if skipped or gone
            else []
        )
        cut += [few] if few else []
        line += ("; " + "; ".join(cut)) if cut else "; nothing was skipped for it, and every cell has the samples asked"
    elif few:
        line += "; " + few
    lines = [line]
    start, end = env.get("load_average_start"), env.get("load_average_end")
    if start:
        cpus = env.get("cpu_count") or "?"
        lines.append(
            f"- machine load (1-minute load average, runnable processes): {start[0]:.1f} at the start, "
            + (f"{end[0]:.1f} at the end" if end else "end not recorded")
            + f", on {cpus} CPUs: a load above the CPU count means this run waited for cores, "
            "and its timings are slower and noisier than on an idle machine"
        )
    return lines


def render_markdown(results: dict) -> str:
    env = results["environment"]
    preset = results.get("preset") or {}
    v = env.get("versions") or {}
    cap = f", capability {'.'.join(map(str, env['capability']))}" if env.get("capability") else ""
    head = [f"## attnkit bench — {env.get('device_name', '?')}{cap}", ""]
    if preset:
        head.append(f"- preset **{preset['name']}**: {preset['label']}")
    if results.get("model"):
        head.append(f"- model: {results['model']['source']}")
    head += [
        "- versions: "
        + ", ".join(
            f"{k} {v.get(k) or 'not installed'}" for k in ("torch", "diffusers", "triton", "xformers", "flash-attn")
        ),
        f"- date: {env.get('date', '?')}; command: `{env.get('command', '')}`",
        *(run_lines(results) if results.get("tables") else []),
    ]
    for note in [*(preset.get("notes") or ()), *(results.get("notes") or ())]:
        head.append(f"- note: {note}")
    parts = ["\n".join(head)]
    for key in sorted(results["tables"]):
        t = results["tables"][key]
        if "error" in t or "skipped" in t:
            what = f"failed: {t['error']}" if "error" in t else f"skipped ({t['skipped']})"
            parts.append(f"### {key}. {t.get('title', '')}\n\n{what}")
            continue
        parts.append(RENDERERS[key](t, env))
    parts += render_sections(results.get("sections") or {})
    return "\n\n".join(parts) + "\n"
