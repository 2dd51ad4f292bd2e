"""Table 5 as markdown: a transformer's forward per step, one column per way of setting
its attention (:mod:`.dit`).

A block per model: its setting and source, the table of seconds per step with ratios to
diffusers' native backend and to stock, and the line that says whether attnkit met its
target against native, within the run's noise.
"""

from __future__ import annotations

from .markdown_sd import compile_words, first_call_words
from .measure import separated, typical_spread
from .share import check_text, share_text
from .wording import cell_words, fmt_num, fmt_x, is_measured, marked_ratio, md_table, noise_lines, run_noise


def render_table5(t: dict, env: dict) -> str:
    out = []
    for m in t["models"]:
        s, cells = m["setting"], m["cells"]
        vs = m.get("ratio_vs", {})
        tok = s["tokens"]
        frames = f", {s['frames']} frames" if s.get("frames") else ""
        out += [
            f"### 5. Transformer forward per step: {m['label']}",
            f"{m['route']}. {s['width']}x{s['height']}{frames}: {tok['image']} image + {tok['text']} text tokens, "
            f"batch {s['batch']}, {s['dtype']}, {s['attention_modules']} attention modules; {s['steps']} forward steps "
            f"per run (first {s['steady_state_skips_first_steps']} excluded); each cell is the median of its n "
            f"interleaved samples (up to {s['repeats']}); ratio = seconds per step / the named column's (x1.02: 2% slower).",
            f"Model: {m['source']}.",
            "",
        ]
        rows = []
        noise = run_noise(cells.values(), "step_seconds")
        probed = any("attention" in c or "compile" in c for c in cells.values())
        for n, c in cells.items():
            extra = (
                [
                    first_call_words(c),
                    share_text(c.get("attention"), "processor_calls"),
                    share_text(c.get("attention"), "attention_kernels"),
                    check_text(c.get("check")),
                ]
                if probed
                else []
            )
            if is_measured(c, "step_seconds"):
                ratios = [
                    marked_ratio(vs.get(base, {}).get(n), c, cells.get(base), "step_seconds", noise)
                    for base in ("native", "stock")
                ]
                rows.append(
                    [
                        n,
                        c.get("how", ""),
                        fmt_num(c["step_seconds_median"], 3),
                        str(c.get("samples", 0)),
                        f"{fmt_num(c['step_seconds_min'], 3)}–{fmt_num(c['step_seconds_max'], 3)}",
                        *ratios,
                        *extra,
                        c.get("where", ""),
                    ]
                )
            else:
                rows.append(
                    [
                        n,
                        c.get("how", ""),
                        "–",
                        "0",
                        "–",
                        "–",
                        "–",
                        *(["–"] * len(extra)),
                        cell_words(c, 200) + (f"; {compile_words(c, 200)}" if compile_words(c) else ""),
                    ]
                )
        head = ["attention", "set by", "s / step", "n", "min–max", "vs native", "vs stock"]
        if probed:
            head += ["first call s", "attention: processor calls", "attention kernels", "compiled vs eager"]
            compiled = any("compile" in c for c in cells.values())
            out += [
                (
                    "torch.compile: default mode, of the repeated blocks where the model declares them, else of "
                    "the model; fullgraph=True first. "
                    if compiled
                    else ""
                )
                + "First call, attention and compiled vs eager as in table 2 (one forward profiled after the "
                "timed runs).",
                "",
            ]
        out.append(md_table(head + ["where it went / status"], rows))
        lines = noise_lines(cells, "step_seconds", lambda v: fmt_num(v, 3), higher_is_faster=False)
        out += ["", *lines] if lines else []
        out += ["", _target_line(cells, vs.get("native", {})), ""]
    return "\n".join(out).rstrip()


def _target_line(cells: dict, vs_native: dict) -> str:
    """attnkit's backend against native: the issue's target is at most x1.02 per step."""
    parts = []
    for name in ("attnkit", "attnkit.apply"):
        c = cells.get(name)
        if c is None:
            continue
        if not is_measured(c, "step_seconds") or "native" not in vs_native:
            why = cell_words(c, 80) if not is_measured(c, "step_seconds") else "native not measured"
            parts.append(f"{name} not measured: {why}")
            continue
        sep = separated(
            c["step_seconds"],
            cells["native"]["step_seconds"],
            typical_spread(x["step_seconds"] for x in cells.values() if is_measured(x, "step_seconds")),
        )
        verdict = {True: "a difference beyond noise", False: "within noise", None: "one sample: not established"}[sep]
        parts.append(f"{name} {fmt_x(vs_native[name])} of native ({verdict})")
    return "Target: attnkit at most x1.02 of diffusers' native per step. " + "; ".join(parts) + "." if parts else ""
