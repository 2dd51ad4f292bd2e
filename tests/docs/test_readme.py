"""The README and docs/ state every backend limit and auto()'s order; they must say what
the code declares. The limits table is in README.md (the user-visible limits); auto()'s
order per hardware class moved to docs/auto.md, and is checked there; the per-GPU
preferences generated from the GPU records are in README.md. Every relative link
in README.md and docs/ leads to a file, and to a heading where it names one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnkit.backends import limits_table
from attnkit.choose.policy import priority_table
from attnkit.choose.record_rules import rules_table

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
AUTO_DOC = ROOT / "docs" / "auto.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize(
    "page, marker, generate, source",
    [
        (README, "limits-table", limits_table, "attnkit.backends.limits_table()"),
        (AUTO_DOC, "priority-table", priority_table, "attnkit.choose.policy.priority_table()"),
        (README, "records-table", rules_table, "attnkit.choose.record_rules.rules_table()"),
    ],
    ids=["limits", "priorities", "records"],
)
def test_tables_are_generated_from_the_code(page, marker, generate, source):
    text = page.read_text(encoding="utf-8")
    name = page.relative_to(ROOT)
    found = re.search(rf"<!-- {marker} -->\n(.*?)\n<!-- /{marker} -->", text, re.S)
    assert found, f"{name} lost its <!-- {marker} --> markers"
    assert found.group(1).strip() == generate().strip(), (
        f"the table between the {marker} markers of {name} differs from the code; paste {source} there"
    )


def test_readme_opens_with_two_commands_and_three_examples():
    text = README.read_text(encoding="utf-8")
    assert "make test" in text and "make bench" in text
    for example in (
        "set_attn_processor(attnkit.auto())",
        "attnkit.apply(pipe.transformer, attnkit.auto())",
        'set_attention_backend("attnkit")',
    ):
        assert example in text, example


def test_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines; move the detail to docs/"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def _links(page: Path):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if not re.match(r"[a-z]+:", target):
            yield target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_lead_somewhere(page):
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: " + ", ".join(broken)
