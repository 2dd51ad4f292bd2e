"""The README states every backend limit and auto()'s order; it must say what the code
declares."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnkit.backends import limits_table
from attnkit.policy import priority_table

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.parametrize(
    "marker, generate, source",
    [("limits-table", limits_table, "attnkit.backends.limits_table()"),
     ("priority-table", priority_table, "attnkit.policy.priority_table()")],
    ids=["limits", "priorities"],
)
def test_readme_tables_are_generated_from_the_code(marker, generate, source):
    text = README.read_text(encoding="utf-8")
    found = re.search(rf"<!-- {marker} -->\n(.*?)\n<!-- /{marker} -->", text, re.S)
    assert found, f"README.md lost its <!-- {marker} --> markers"
    assert found.group(1).strip() == generate().strip(), (
        f"the README's table between the {marker} markers differs from the code; paste {source} there"
    )


def test_readme_opens_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert "make test" in text and "make bench" in text
    assert "set_attn_processor(attnkit.auto())" in text
