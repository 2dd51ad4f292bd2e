"""Results as files: results.json, table.md (:mod:`.markdown`) and PNG plots (:mod:`.plots`).

Everything here works from the results dict alone, so ``table.md`` and the plots can be
redrawn from a ``results.json`` (``python -m attnkit.bench.report results.json``), and
several runs merged into one record (``--merge``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from .markdown import render_markdown
from .plots import write_plots

SCHEMA = 2
REQUIRED_FIELDS = ("schema", "environment", "preset", "model", "processors", "tables", "elapsed_seconds")
REQUIRED_ENVIRONMENT = ("device", "device_name", "capability", "versions", "date", "command")
REQUIRED_VERSIONS = ("torch", "diffusers", "triton", "xformers", "flash-attn")


# -- JSON and files ------------------------------------------------------------------------
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


def write_all(results: dict, out_dir: str) -> tuple[list[str], list[str]]:
    """results.json, table.md and the plots; (paths written, what could not be drawn and why)."""

    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "results.json"), os.path.join(out_dir, "table.md")]
    write_json(results, paths[0])
    with open(paths[1], "w") as f:
        f.write(render_markdown(results))
    plots, problems = write_plots(results, out_dir)
    return paths + plots, problems


def merge(parts: list[dict]) -> dict:
    """One results dict from several runs (e.g. one per table): later tables win, except
    table 5, whose models (one per transformer preset) are collected, and table 2, whose
    rows are (a later row of the same name replaces the earlier). Section files
    (:mod:`.sections`: a step other than `attnkit bench`) go under "sections", by key.

    The environment, model and preset shown are the first run's; every run's command,
    preset and timing are kept under "parts".
    """
    if not parts:
        raise ValueError("nothing to merge")
    runs = [p for p in parts if "tables" in p]
    sections = [p["section"] for p in parts if "section" in p]
    if runs:
        merged = json.loads(json.dumps(runs[0]))
    else:  # sections only: the environment of the first that has one
        env = next((p["environment"] for p in parts if p.get("environment")), {})
        merged = {
            "schema": SCHEMA,
            "environment": json.loads(json.dumps(env)) or {"device_name": "?"},
            "processors": [],
            "elapsed_seconds": 0.0,
        }
    merged["tables"] = {}
    merged["parts"] = []
    merged["notes"] = list(merged.get("notes") or [])
    for part in runs:
        for key, table in part.get("tables", {}).items():
            table = json.loads(json.dumps(table))
            have = merged["tables"].get(key, {})
            if key == "5" and "models" in have and "models" in table:
                have["models"] += table["models"]
            elif key == "2" and "rows" in have and "rows" in table:
                names = {r["name"] for r in table["rows"]}
                have["rows"] = [r for r in have["rows"] if r["name"] not in names] + table["rows"]
                have["setting"]["rows"] = list(
                    dict.fromkeys([*have["setting"].get("rows", []), *table["setting"].get("rows", [])])
                )
            else:
                merged["tables"][key] = table
        env = part["environment"]
        merged["parts"].append(
            {
                "tables": sorted(part.get("tables", {})),
                "command": env["command"],
                "preset": part.get("preset", {}).get("name"),
                "elapsed_seconds": part.get("elapsed_seconds"),
                "budget_seconds": part.get("budget_seconds"),
                "compile": part.get("compile"),
                "date": env.get("date"),
                "load_average_start": env.get("load_average_start"),
                "load_average_end": env.get("load_average_end"),
            }
        )
        for note in part.get("notes") or []:
            if note not in merged["notes"]:
                merged["notes"].append(note)
    if sections:
        merged["sections"] = {s["key"]: s for s in sections}
    merged["elapsed_seconds"] = sum(p.get("elapsed_seconds") or 0.0 for p in runs)
    merged["budget_seconds"] = None
    if runs:
        merged["environment"]["command"] = " && ".join(p["command"] for p in merged["parts"])
        merged["environment"]["load_average_end"] = runs[-1]["environment"].get("load_average_end")
    return merged


USAGE = (
    "usage: python -m attnkit.bench.report RESULTS.json [OUT_DIR]      redraw table.md and plots\n"
    "       python -m attnkit.bench.report --merge OUT_DIR A.json B.json ...   one record from several runs\n"
    "         (results.json files of attnkit bench, and section files of attnkit.bench.sections)"
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
        _, problems = write_all(results, argv[1])
    else:
        with open(argv[0]) as f:
            results: dict[str, Any] = json.load(f)
        out_dir = argv[1] if len(argv) > 1 else os.path.dirname(os.path.abspath(argv[0]))

        with open(os.path.join(out_dir, "table.md"), "w") as f:
            f.write(render_markdown(results))
        _, problems = write_plots(results, out_dir)
    print(render_markdown(results))
    for problem in problems:
        print(problem, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
