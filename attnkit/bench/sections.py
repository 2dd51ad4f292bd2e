"""Sections: what a step other than `attnkit bench` measured, in a record's results.json and
table.md (the kernel microbenchmarks, bench/overhead.py, a check script).

A section file is JSON: ``{"section": {"key", "title", "command", "markdown", "data"},
"environment": {...}}``. ``python -m attnkit.bench.report --merge DIR a.json ...`` takes
section files beside the tables' results.json files: results.json gets them under
"sections" (by key), table.md after the tables.

    python -m attnkit.bench.sections kernels kernels.json --out s.json [--command CMD]
        # a pytest-benchmark JSON (pytest bench/ --benchmark-json): one row per benchmark
    python -m attnkit.bench.sections text OUT.txt --out s.json --key overhead --title T [--json DATA.json]
        # a script's printed output (and its JSON, if it wrote one), as they are
"""

from __future__ import annotations

import argparse
import json
import sys

from .wording import fmt_num, md_table


def section(
    key: str, title: str, markdown: str, data: object = None, command: str = "", environment: dict | None = None
) -> dict:
    """A section file's content."""
    out: dict = {"section": {"key": key, "title": title, "command": command, "markdown": markdown, "data": data}}
    if environment is not None:
        out["environment"] = environment
    return out


def render_sections(sections: dict) -> list[str]:
    """Each section as markdown: its title, the command that made it, its text."""
    out = []
    for sec in sections.values():
        head = f"### {sec.get('title') or sec.get('key')}"
        cmd = f"\n\n`{sec['command']}`" if sec.get("command") else ""
        out.append(f"{head}{cmd}\n\n{(sec.get('markdown') or '(nothing recorded)').rstrip()}")
    return out


def kernels_section(bench: dict, command: str = "") -> dict:
    """A pytest-benchmark JSON as a section: per benchmark its shape, backend, median and TFLOP/s."""
    rows, data = [], []
    for b in bench.get("benchmarks", []):
        info = b.get("extra_info") or {}
        stats = b.get("stats") or {}
        shape = info.get("shape") or {}
        median = stats.get("median")
        entry = {
            "name": b.get("name"),
            "group": b.get("group"),
            "backend": info.get("backend"),
            "mode": info.get("mode"),
            "shape": shape,
            "dtype": info.get("dtype"),
            "median_s": median,
            "iqr_s": stats.get("iqr"),
            "rounds": stats.get("rounds"),
            "tflops": info.get("tflops"),
        }
        data.append(entry)
        dims = "x".join(str(shape.get(k, "?")) for k in ("B", "H", "M", "N", "D"))
        rows.append(
            [
                b.get("group") or "",
                info.get("backend") or b.get("name") or "",
                dims,
                info.get("dtype") or "",
                "–" if median is None else f"{median * 1e6:.0f}",
                fmt_num(info.get("tflops")),
                str(stats.get("rounds") or ""),
            ]
        )
    text = (
        md_table(["shape, mode", "backend", "B x H x M x N x D", "dtype", "median us", "TFLOP/s", "rounds"], rows)
        if rows
        else "no benchmark ran (each skipped one says why in kernels.md)"
    )
    machine = bench.get("machine_info") or {}
    title = "Attention-kernel microbenchmarks (pytest bench/ --benchmark-only)"
    return section("kernels", title, text, {"benchmarks": data, "machine": machine.get("node")}, command)


def text_section(key: str, title: str, text: str, data: object = None, command: str = "") -> dict:
    """A script's printed output as it is (in a code block), with its JSON if any."""
    body = "```\n" + text.rstrip() + "\n```" if text.strip() else "(no output)"
    return section(key, title, body, data, command)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m attnkit.bench.sections", description="make a record's section file from a step's output"
    )
    ap.add_argument("kind", choices=["kernels", "text"])
    ap.add_argument("input", help="kernels: pytest-benchmark JSON; text: the printed output")
    ap.add_argument("--out", required=True, help="the section file to write")
    ap.add_argument("--key", default=None)
    ap.add_argument("--title", default=None)
    ap.add_argument("--command", default="", help="the command that produced the input")
    ap.add_argument("--json", default=None, help="text: the JSON the script wrote, kept as the section's data")
    args = ap.parse_args(argv)
    try:
        with open(args.input) as f:
            raw = f.read()
    except OSError as exc:
        raw, problem = "", f"{args.input}: {exc.strerror}"
    else:
        problem = ""
    if args.kind == "kernels":
        try:
            out = kernels_section(json.loads(raw) if raw else {}, args.command)
        except ValueError as exc:
            out = section(
                "kernels", "Attention-kernel microbenchmarks", f"unreadable benchmark JSON: {exc}", command=args.command
            )
    else:
        data = None
        if args.json:
            try:
                with open(args.json) as f:
                    data = json.load(f)
            except (OSError, ValueError) as exc:
                data = {"error": f"{args.json}: {exc}"}
        out = text_section(args.key or "text", args.title or args.key or "output", raw or problem, data, args.command)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2, default=str)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
