"""The README states every backend limit; it must say what the code declares."""

from __future__ import annotations

import re
from pathlib import Path

from attnkit.backends import limits_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_limits_table_matches_declared_capabilities():
    text = README.read_text(encoding="utf-8")
    found = re.search(r"<!-- limits-table -->\n(.*?)\n<!-- /limits-table -->", text, re.S)
    assert found, "README.md lost its limits table markers"
    assert found.group(1).strip() == limits_table().strip(), (
        "README's backend limits table differs from the capability declarations; "
        "paste attnkit.backends.limits_table() between the markers"
    )


def test_readme_opens_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert "make test" in text and "make bench" in text
    assert "set_attn_processor(attnkit.auto())" in text
