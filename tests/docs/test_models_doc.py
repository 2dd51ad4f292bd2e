"""docs/models.md has a row for every diffusers model class of the test zoo: those with
attention in the per-class route table, those without in the table after it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.zoo._zoo import CASES, NO_ATTENTION

MODELS_DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"


def _rows() -> set[str]:
    text = MODELS_DOC.read_text(encoding="utf-8")
    section = text[text.index("\n## Per class\n") :]
    return set(re.findall(r"^\| `(\w+)` \|", section, re.M))


def test_every_zoo_class_has_a_row():
    zoo = {case.name for case in CASES} | set(NO_ATTENTION)
    rows = _rows()
    assert not zoo - rows, f"docs/models.md has no row for {sorted(zoo - rows)}"
    assert not rows - zoo, f"docs/models.md has rows for classes the zoo no longer has: {sorted(rows - zoo)}"
