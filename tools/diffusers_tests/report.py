"""The report of a stock and an attnkit run: per family, what was collected, what passed
in each, and every test that passes stock but not with attnkit, with its reason."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

from .run import PhaseResult
from .selection import family_of, file_of, kind_of

PASSED = ("passed", "xpassed")
SKIPPED = ("skipped", "xfailed")
FAILED = ("failed", "error", "crashed", "hung")


def _group_reason(reason: str) -> str:
    """A reason with what varies between tests of one cause (numbers, addresses, shapes)
    taken out, to group by."""
    text = re.sub(r"^\[(setup|teardown)\] |\s*\[xfail: .*\]$", "", reason)  # one cause, wherever it was raised
    text = re.sub(r"0x[0-9a-fA-F]+", "0x…", text)
    text = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", text)
    return text[:200]


def build(files: list[str], stock: PhaseResult, attnkit: PhaseResult | None, header: dict) -> dict:
    families: dict[tuple[str, str], dict] = {}

    def fam(f: str) -> dict:
        key = (kind_of(f), family_of(f))
        if key not in families:
            families[key] = {
                "kind": key[0],
                "family": key[1],
                "files": [],
                "collected": 0,
                "collect_errors": [],
                "stock": Counter(),
                "attnkit": Counter(),
                "attnkit_ran": 0,
                "attnkit_exercised": 0,
                "modules_set": 0,
                "backend_calls": 0,
                "chooser_calls": 0,
                "regressions": [],
            }
        return families[key]

    selected = set(files)  # a stock run reused for some of its files: those only
    for f in files:
        fam(f)["files"].append(f)
    for f, reason in stock.collect_errors.items():
        if f in selected:
            fam(f)["collect_errors"].append({"file": f, "reason": reason})
    stock_results = {n: r for n, r in stock.results.items() if file_of(n) in selected}
    for nodeid, r in stock_results.items():
        entry = fam(file_of(nodeid))
        entry["collected"] += 1
        entry["stock"][r["outcome"]] += 1
    if attnkit is not None:
        candidates = {n for n, r in stock_results.items() if r["outcome"] in PASSED}
        for nodeid in sorted(candidates):
            entry = fam(file_of(nodeid))
            entry["attnkit_ran"] += 1
            r = attnkit.results.get(nodeid)
            if r is None:
                f = file_of(nodeid)
                reason = attnkit.collect_errors.get(f, "no result in the attnkit run")
                r = {"outcome": "error", "reason": reason, "properties": {}}
            entry["attnkit"][r["outcome"]] += 1
            props = r.get("properties") or {}
            entry["modules_set"] += props.get("attnkit_modules_set", 0)
            entry["backend_calls"] += props.get("attnkit_backend_calls", 0)
            entry["chooser_calls"] += props.get("attnkit_chooser_calls", 0)
            if r["outcome"] in PASSED and props.get("attnkit_backend_calls", 0):
                entry["attnkit_exercised"] += 1
            if r["outcome"] not in PASSED:
                entry["regressions"].append({"test": nodeid, "outcome": r["outcome"], "reason": r["reason"]})
    rows = sorted(families.values(), key=lambda e: (e["kind"] != "models", e["family"]))
    for e in rows:
        for key in ("stock", "attnkit"):
            e[key] = dict(e[key])
    by_reason: dict[str, list] = defaultdict(list)
    for e in rows:
        for reg in e["regressions"]:
            by_reason[_group_reason(reg["reason"])].append({**reg, "family": e["family"], "kind": e["kind"]})
    grouped = [
        {"reason": key, "example": tests[0]["reason"], "count": len(tests), "tests": tests}
        for key, tests in sorted(by_reason.items(), key=lambda kv: -len(kv[1]))
    ]
    return {"header": header, "families": rows, "regressions_by_reason": grouped}


def _sum(counter: dict, names) -> int:
    return sum(counter.get(n, 0) for n in names)


def render_markdown(data: dict) -> str:
    h = data["header"]
    lines = ["# diffusers' own tests, stock and with attnkit.auto() at construction", ""]
    lines.append(
        f"- diffusers checkout: {h.get('diffusers_commit') or 'unknown commit'} "
        f"(version {h.get('diffusers_checkout_version', '?')}), tests and source from `{h.get('tests_dir')}`"
    )
    v = h.get("versions", {})
    lines.append(
        f"- imported: diffusers {v.get('diffusers')} from `{v.get('diffusers_file')}`, torch {v.get('torch')}, "
        f"transformers {v.get('transformers')}, accelerate {v.get('accelerate')}, peft {v.get('peft')}, "
        f"Python {v.get('python')}"
    )
    lines.append(f"- attnkit: {h.get('attnkit_commit')} (`{v.get('attnkit_file', '?')}`)")
    lines.append(f"- date: {h.get('date')}; machine: {h.get('machine')}")
    lines.append(f"- command: `{h.get('command')}`")
    for name, p in h.get("phases", {}).items():
        sources = p.get("attnkit_sources") or []
        code = (
            f"; attnkit's source {sources[0]}"
            if len(sources) == 1
            else f"; **attnkit's source changed during the run**: {', '.join(sources)}"
            if sources
            else ""
        )
        lines.append(
            f"- {name} run: {p['files']} files, {p['tests']} tests, {p['wall_s'] / 60:.1f} min, "
            f"{p['processes']} pytest processes ({p['restarts']} resumed after a crash or hang){code}"
        )
    extra = h.get("attnkit_totals")
    if extra:
        lines.append(
            f"- attnkit plugin: {extra.get('modules_set', 0)} attention modules given attnkit.auto() at "
            f"construction ({extra.get('modules_reset', 0)} given it back after their model's __init__ "
            f"set its own; {extra.get('set_errors', 0)} set_processor errors); "
            f"{extra.get('backend_calls', 0)} attention calls computed by attnkit backends "
            f"({_fmt_counter(extra.get('backend_calls_by_backend', {}))}), "
            f"{extra.get('chooser_calls', 0)} through the chooser"
        )
    lines.append("")
    lines.append(
        "Selection and rules: `python -m tools.diffusers_tests --help` (tools/diffusers_tests/__init__.py). "
        "stock failed = failed, error, crashed or hung in the stock run (offline, most pipeline tests "
        "fail fetching a tiny tokenizer from the hub); only what passed stock runs with attnkit. "
        "exercised = passed with attnkit and at least one attention call computed by attnkit."
    )
    lines.append("")
    totals = Counter()
    for kind, title in (("models", "Model tests"), ("pipelines", "Pipeline tests")):
        rows = [e for e in data["families"] if e["kind"] == kind]
        if not rows:
            continue
        lines += [
            f"## {title}",
            "",
            "| family | files | collected | stock passed | stock failed | skipped | collect errors | "
            "attnkit passed | attnkit failed | exercised | modules set | attnkit attention calls |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for e in rows:
            cells = [
                len(e["files"]),
                e["collected"],
                _sum(e["stock"], PASSED),
                _sum(e["stock"], FAILED),
                _sum(e["stock"], SKIPPED),
                len(e["collect_errors"]),
                _sum(e["attnkit"], PASSED),
                e["attnkit_ran"] - _sum(e["attnkit"], PASSED),
                e["attnkit_exercised"],
                e["modules_set"],
                e["backend_calls"],
            ]
            for key, value in zip(("files", "collected", "sp", "sf", "sk", "ce", "ap", "af", "ex", "ms", "bc"), cells):
                totals[(kind, key)] += value
            name = f"**{e['family']}**" if e["regressions"] else e["family"]
            lines.append("| " + " | ".join([name] + [str(c) for c in cells]) + " |")
        keys = ("files", "collected", "sp", "sf", "sk", "ce", "ap", "af", "ex", "ms", "bc")
        lines.append("| **total** | " + " | ".join(str(totals[(kind, k)]) for k in keys) + " |")
        lines.append("")
    groups = data["regressions_by_reason"]
    count = sum(g["count"] for g in groups)
    lines += [f"## Pass stock, fail with attnkit: {count} tests", ""]
    if not groups:
        lines.append("None.")
    for g in groups:
        lines.append(f"### {g['count']} × `{_md(g['example'])}`")
        lines.append("")
        lines.append(f"(the first; grouped as `{_md(g['reason'])}`)" if g["reason"] != g["example"] else "")
        lines.append("")
        for t in g["tests"]:
            lines.append(f"- {t['family']}: `{t['test']}` ({t['outcome']})")
        lines.append("")
    errors = [(e["family"], c) for e in data["families"] for c in e["collect_errors"]]
    if errors:
        lines += ["## Files that could not be collected (stock)", ""]
        for family, c in errors:
            lines.append(f"- {family}: `{c['file']}`: {_md(c['reason'])}")
        lines.append("")
    return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")


def _fmt_counter(counter: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in counter.items()) or "none"


def render_readme(data: dict, report_name: str = "report.md") -> str:
    """The record's front page: what ran, the headline per kind, and where the rest is."""
    h = data["header"]
    lines = [
        "# diffusers' own tests with attnkit.auto()",
        "",
        "diffusers' own model and pipeline tests, run twice on the CPU: stock, then with "
        "`attnkit.auto()` set on every attention module at construction. Only the tests that "
        "pass stock run with attnkit.",
        "",
    ]
    for kind in ("models", "pipelines"):
        rows = [e for e in data["families"] if e["kind"] == kind]
        if not rows:
            continue
        stock = sum(e["attnkit_ran"] for e in rows)
        passed = sum(_sum(e["attnkit"], PASSED) for e in rows)
        exercised = sum(e["attnkit_exercised"] for e in rows)
        lines.append(
            f"- {kind}: {len(rows)} families; {passed} of {stock} tests that pass stock pass with "
            f"attnkit ({exercised} of them computed attention through attnkit)"
        )
    count = sum(g["count"] for g in data["regressions_by_reason"])
    lines.append(f"- pass stock, fail with attnkit: {count}")
    lines.append(
        f"- diffusers {h.get('diffusers_commit') or 'unknown commit'}, attnkit {h.get('attnkit_commit')}, "
        f"{h.get('date')}"
    )
    lines += [
        "",
        f"Per family, the versions, the command and every regression with its reason: "
        f"[{report_name}]({report_name}) (and `{Path(report_name).with_suffix('.json')}`). "
        "Run again with `make diffusers-tests` (tools/diffusers_tests/).",
        "",
    ]
    return "\n".join(lines)


def write(data: dict, path: Path) -> tuple[Path, Path]:
    """The report at `path`, its JSON beside it, and a README.md that sums it up (a record
    under bench/results/ has its README)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_markdown(data), encoding="utf-8")
    if path.name != "README.md":
        (path.parent / "README.md").write_text(render_readme(data, path.name), encoding="utf-8")
    json_path = path.with_suffix(".json")
    json_path.write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
    return path, json_path
