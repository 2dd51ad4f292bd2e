"""Tables 1 to 4 as markdown: the Stable Diffusion tables (it/s per processor, the latency
ladder, the batch-size sweep, peak memory).

Each renderer takes its table's dict from results.json and the run's environment, and
states the samples behind every cell and the noise verdict beside every ratio. How a
compiled row compiled (:func:`compile_words`, :func:`first_call_words`) is worded here
once, for table 2 and for table 5 (:mod:`.markdown_dit`).
"""

from __future__ import annotations

from .measure import clip, separated, typical_spread
from .published import PUBLISHED_NAMES
from .share import check_text, share_text
from .wording import (
    cell_words,
    fmt_bytes,
    fmt_num,
    fmt_x,
    is_measured,
    marked_ratio,
    md_table,
    noise_lines,
    not_measured,
    run_noise,
)


def _best(speed: dict[str, float | None], cells: dict[str, dict], base: str) -> str:
    """The best speedup over `base`, and whether the runner-up is separable from it."""
    ranked = sorted(((v, n) for n, v in speed.items() if n != base and v), reverse=True)
    if not ranked:
        return "–"
    text = f"{fmt_x(ranked[0][0])} ({ranked[0][1]}"
    if len(ranked) > 1:
        a, b = cells[ranked[0][1]].get("it_per_s") or [], cells[ranked[1][1]].get("it_per_s") or []
        noise = typical_spread(c.get("it_per_s") or [] for c in cells.values() if is_measured(c))
        sep = separated(a, b, noise)
        if sep is False:
            text += f"; {ranked[1][1]} {fmt_x(ranked[1][0])} within noise"
        elif sep is None:
            text += f"; {ranked[1][1]} {fmt_x(ranked[1][0])}: one sample, not established"
    return text + ")"


def render_table1(t: dict, env: dict) -> str:
    cells = t["cells"]
    names = list(cells)
    speed = t.get("speedup_vs_vanilla", {})
    vs_sdpa = t.get("speedup_vs_sdpa", {})
    noise = run_noise(cells.values(), "it_per_s")

    def vs(n: str, base: str, ratios: dict) -> str:
        return marked_ratio(ratios.get(n), cells[n], cells.get(base), "it_per_s", noise)

    def headline(n: str) -> str:
        if not is_measured(cells[n]):
            return cell_words(cells[n], 28)
        if n == "vanilla" or not speed.get(n):
            return fmt_num(cells[n]["it_per_s_median"])
        ratio, _, verdict = vs(n, "vanilla", speed).partition(" (")
        return f"{fmt_num(cells[n]['it_per_s_median'])} ({ratio}" + (f", {verdict}" if verdict else ")")

    s = t["setting"]
    ours = [headline(n) for n in names]
    label = f"**this run**: {env['device_name']}, {s['dtype']}" + (", compiled" if s.get("compile") else "")
    rows = [[label, *ours, _best(speed, cells, "vanilla")]]
    pub = t.get("published")
    if pub:
        its = pub["it_per_s"]
        pv = its.get("vanilla")
        prow = [
            f"{fmt_num(its[n])}" + (f" ({fmt_x(its[n] / pv)})" if n != "vanilla" and pv else "") if n in its else "–"
            for n in names
        ]
        pbest = max(((its[n] / pv, n) for n in its if n != "vanilla"), default=None) if pv else None
        rows.append(
            [
                f"published: {pub['device']} (diffusers docs v0.18)",
                *prow,
                f"{fmt_x(pbest[0])} ({pbest[1]})" if pbest else "–",
            ]
        )
    head = (
        ["device"] + [f"{n} ({PUBLISHED_NAMES[n]})" if n in PUBLISHED_NAMES else n for n in names] + ["best vs vanilla"]
    )
    out = [
        "### 1. Denoising-loop it/s per attention processor",
        f"{s['resolution']}x{s['resolution']}, {s['steps']} DDIM steps, batch {s['batch']} "
        f"(UNet batch {2 * s['batch']}: classifier-free guidance), {s['dtype']}; steady-state it/s "
        f"(first {s['steady_state_skips_first_steps']} steps excluded); each cell is the median of its n "
        f"samples (column n below), one per interleaved round after a warm-up: up to {s['repeats']} rounds, "
        f"fewer where the time budget ended them; {_speedup_legend(cells)}.",
        "",
        md_table(head, rows),
    ]
    if not pub:
        out += ["", f"(no published row: the published table did not measure {env['device_name']})"]
    detail = []
    for n in names:
        c = cells[n]
        if is_measured(c):
            detail.append(
                [
                    n,
                    fmt_num(c["it_per_s_median"]),
                    str(c.get("samples", len(c.get("it_per_s") or []))),
                    f"{fmt_num(c['it_per_s_min'])}–{fmt_num(c['it_per_s_max'])}",
                    fmt_num(c.get("loop_it_per_s_median")),
                    fmt_num(c.get("seconds_median")),
                    vs(n, "vanilla", speed),
                    vs(n, "sdpa", vs_sdpa),
                    fmt_num(c.get("warmup_seconds"), 1),
                ]
            )
        else:
            detail.append([n, "–", "0", "–", "–", "–", "–", "–", cell_words(c, 200)])
    out += [
        "",
        md_table(
            [
                "processor",
                "it/s (median)",
                "n",
                "min–max",
                "whole-loop it/s",
                "s per loop",
                "vs vanilla",
                "vs sdpa",
                "warm-up s / status",
            ],
            detail,
        ),
    ]
    lines = noise_lines(cells, "it_per_s", fmt_num)
    return "\n".join(out + (["", *lines] if lines else []))


def _speedup_legend(cells: dict[str, dict]) -> str:
    """What (xN) means in table 1, or why there is none: a ratio over vanilla is promised
    only where vanilla was measured."""
    van = cells.get("vanilla")
    if is_measured(van):
        return "(xN) = speedup over vanilla"
    why = "not in this run" if van is None else f"not measured: {cell_words(van, 80)}"
    return f"no speedup over vanilla (vanilla {why})"


def compile_words(r: dict, limit: int = 60) -> str:
    """How a compiled row compiled: 'fullgraph' or 'graph breaks (fullgraph: <why>)'."""
    info = r.get("compile") or {}
    if not info or info.get("fullgraph") is None:
        return ""
    if info["fullgraph"]:
        return "fullgraph"
    return f"not fullgraph ({clip(info.get('fullgraph_error') or 'fullgraph=True failed', limit)})"


def first_call_words(r: dict) -> str:
    """The first call's seconds (compilation included), and how it compiled."""
    first = r.get("first_call_seconds")
    how = compile_words(r)
    text = "–" if first is None else fmt_num(first, 2)
    return f"{text} ({how})" if how else text


def render_table2(t: dict, env: dict) -> str:
    """The ladder's measured steps; the others after the table, once per reason."""
    s = t["setting"]
    pub = t.get("published", {})
    prow = pub.get("rows", [])
    base = next((r for r in t["rows"] if r["name"] == "fp32"), None)
    noise = run_noise(t["rows"], "seconds")

    def published_index(i: int, r: dict) -> int | None:
        if "published_step" in r:  # the row says which published step it stands beside
            j = r["published_step"]
            return j if j is not None and j < len(prow) else None
        if i < 4 and i < len(prow):
            return i
        return 4 if r["name"].endswith("+ xformers") and len(prow) > 4 else None

    def step(j: int) -> str:
        return f"{prow[j]['step']}: {prow[j]['seconds']:.2f} s, x{prow[j]['speedup']:.2f}"

    probed = any("attention" in r or "compile" in r for r in t["rows"])
    rows, shown = [], set()
    for i, r in enumerate(t["rows"]):
        if not is_measured(r, "seconds"):
            continue
        j = published_index(i, r)
        shown.add(j)
        cols = [
            r["name"],
            fmt_num(r["seconds_median"], 3),
            str(r.get("samples", len(r.get("seconds") or []))),
            f"{fmt_num(r['seconds_min'], 3)}–{fmt_num(r['seconds_max'], 3)}",
            marked_ratio(r.get("speedup_vs_fp32"), r, base, "seconds", noise),
            fmt_num(r.get("it_per_s_median")),
        ]
        if probed:
            cols += [
                first_call_words(r),
                share_text(r.get("attention"), "processor_calls"),
                share_text(r.get("attention"), "attention_kernels"),
                check_text(r.get("check")),
            ]
        rows.append(cols + ["" if j is None else step(j)])
    out = [
        "### 2. Latency ladder: seconds per image, cumulative speedup",
        f"One image, {s['resolution']}x{s['resolution']}, {s['steps']} DDIM steps; timed: {s.get('includes', '')}; "
        f"median of n interleaved samples per row (up to {s['repeats']}); it/s: the denoising loop's steps per "
        f"second in the same runs; the published column is the "
        f"ladder of the diffusers docs ({pub.get('device', '')}, 512x512, 50 DDIM steps, traced UNet where we compile).",
    ]
    if probed:
        out.append(
            f"{COMPILE_LABEL_TEXT} First call: the warm-up's first step, compilation included (never a sample). "
            "Attention: one more step under torch.profiler, after the timed runs: 'processor calls' is the "
            "attention modules' forward (projections to output projection), 'attention kernels' the operators "
            "(CPU) or kernels (CUDA) named as attention; as a share of the step's wall time on the CPU, of its "
            "kernels' device time on CUDA (docs/benchmarks.md). Compiled vs eager: one UNet call through the "
            "compiled copy against the same module eager, the largest difference relative to the output's largest value."
        )
    if rows:
        head = ["step", "s / image", "n", "min–max", "speedup vs fp32", "it/s"]
        if probed:
            head += ["first call s", "attention: processor calls", "attention kernels", "compiled vs eager"]
        out += ["", md_table(head + [f"published ({pub.get('device', '')})"], rows)]
    gone = not_measured(t["rows"], "seconds", 200)
    if gone:
        out += [
            "",
            f"Not measured ({len(t['rows']) - len(rows)} of {len(t['rows'])} steps):",
            *(f"- {line}" for line in gone),
        ]
    best = fastest_per_processor(t["rows"])
    if best:
        out += [
            "",
            "Fastest row of each processor, it/s of the denoising loop (SD1.5 at 512x512 in fp16 on an H100: "
            "the goal is 100 or more through attnkit): " + "; ".join(best) + ".",
        ]
    broken = [
        f"{r['name']}: {compile_words(r, 200)}"
        for r in t["rows"]
        if not is_measured(r, "seconds") and (r.get("compile") or {}).get("fullgraph") is False
    ]
    if broken:
        out += ["", "Of those, fullgraph=True failed first:", *(f"- {line}" for line in broken)]
    left = [step(j) for j in range(len(prow)) if j not in shown]
    if left:
        out += ["", f"Published steps without a measured step here ({pub.get('device', '')}): {'; '.join(left)}."]
    return "\n".join(out)


KIND_WORDS = {"eager": "eager", "compile": "torch.compile", "cudagraphs": "CUDA graphs"}


def fastest_per_processor(rows: list[dict]) -> list[str]:
    """'sdpa 112 (CUDA graphs)' per processor with a measured row of its own kind, fastest first."""
    best: dict[str, dict] = {}
    for r in rows:
        name, kind = r.get("processor"), r.get("kind")
        if not name or kind not in KIND_WORDS or not is_measured(r):
            continue
        if name not in best or r["it_per_s_median"] > best[name]["it_per_s_median"]:
            best[name] = r
    order = sorted(best.values(), key=lambda r: r["it_per_s_median"], reverse=True)
    return [f"{r['processor']} {fmt_num(r['it_per_s_median'])} ({KIND_WORDS[r['kind']]})" for r in order]


COMPILE_LABEL_TEXT = (
    "torch.compile: default mode; CUDA graphs: torch.compile(mode='reduce-overhead'); "
    "fullgraph=True first, without it where that fails (the first-call column says which)."
)


def render_table3(t: dict, env: dict) -> str:
    s = t["setting"]
    out = [
        "### 3. Batch-size sweep: images/s and speedup over vanilla / xformers",
        f"{s['resolution']}x{s['resolution']}, {s['steps_per_run']} steps per run, median of up to {s['repeats']} "
        "interleaved samples per cell, batch 1, 2, 4, ... until out of memory "
        f"(or batch {s['max_batch']}); cell: images/s (x vs vanilla / x vs xformers).",
    ]
    if s["repeats"] == 1:
        out.append("One sample per cell: a speedup here is a single measurement, its noise unknown.")
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
                elif is_measured(c):
                    sv = entry["speedup_vs_vanilla"].get(n)
                    sx = entry["speedup_vs_xformers"].get(n)
                    extra = " / ".join(
                        x
                        for x in (
                            fmt_x(sv) if sv and n != "vanilla" else "",
                            fmt_x(sx) + " xf" if sx and n != "xformers" else "",
                        )
                        if x
                    )
                    row.append(f"{fmt_num(c['it_per_s_median'] * b)}" + (f" ({extra})" if extra else ""))
                else:
                    row.append(cell_words(c, 24))
            rows.append(row)

        def largest_text(n: str) -> str:
            fit = run["max_batch"].get(n)
            if n in run.get("oom_at", {}):
                return f"{fit if fit else 'none'} (OOM at {run['oom_at'][n]})"
            if fit is None:
                return "–"
            return f"≥ {fit} (no OOM)" if fit == s["max_batch"] else str(fit)

        rows.append(["largest batch"] + [largest_text(n) for n in names])
        out += [
            "",
            title + (f" — {run['stopped']}" if run.get("stopped") else ""),
            "",
            md_table(["batch"] + names, rows),
        ]
    if t.get("mem_cap_bytes"):
        out += [
            "",
            f"(CPU: the sweep ran in its own process with its address space capped at {fmt_bytes(t['mem_cap_bytes'])} over its start)",
        ]
    return "\n".join(out)


def render_table4(t: dict, env: dict) -> str:
    s = t["setting"]
    rows = []
    for n, c in t["cells"].items():
        if c.get("status") == "ok":
            rows.append(
                [
                    n,
                    fmt_bytes(c.get("peak_bytes")),
                    fmt_bytes(c.get("activation_bytes")),
                    fmt_bytes(c.get("baseline_bytes")),
                ]
            )
        else:
            rows.append([n, cell_words(c, 60), "–", "–"])
    out = [
        "### 4. Peak memory per processor",
        f"{t['method']}; {s['resolution']}x{s['resolution']}, batch {s['batch']}, {s['dtype']}, {s['steps']} steps. "
        "One measurement per processor; 'over baseline' is what the loop adds to the weights and inputs.",
        "",
        md_table(["processor", "peak", "over baseline", "baseline (weights, inputs)"], rows),
    ]
    dec = t.get("vae_decode") or {}
    if dec.get("peak_bytes"):
        out += [
            "",
            f"VAE decode (diffusers' own attention, the same for every row): peak {fmt_bytes(dec['peak_bytes'])}.",
        ]
    return "\n".join(out)
