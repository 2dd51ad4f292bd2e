"""The README's backend limits beyond the generated table: every name auto() can choose
has its row, and the hand-written one (flash_attn3, a variant of a registered backend)
says what its declaration says."""

from __future__ import annotations

from pathlib import Path

from attnkit.backends import BACKEND_NAMES, capability_columns
from attnkit.backends.flash_attn import FA3_DISTRIBUTIONS, FlashAttnBackend
from attnkit.choose.policy import CANDIDATES

README = Path(__file__).resolve().parents[2] / "README.md"


def _limits_rows() -> dict[str, dict[str, str]]:
    """{backend: {column: value}} from every table of the README's "Backend limits" section."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Backend limits") :]
    section = section[: section.index("\n## ")]
    rows, header = {}, None
    for line in section.splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if cells[0] == "backend":
            header = cells
            continue
        rows[cells[0].strip("`")] = dict(zip(header[1:], cells[1:]))
    return rows


def test_every_name_auto_can_choose_has_a_limits_row():
    rows = _limits_rows()
    assert set(BACKEND_NAMES) | set(CANDIDATES) <= set(rows), sorted(set(CANDIDATES) - set(rows))


def test_the_flash_attn3_row_says_what_its_declaration_says():
    assert CANDIDATES["flash_attn3"] == ("flash_attn", {"version": 3})
    row = _limits_rows()["flash_attn3"]
    declared = capability_columns(FlashAttnBackend(version=3).capabilities)
    # the package is checked in extra_reasons (two distribution names), and so is the
    # upper bound of the capability: the declaration alone leaves those two columns short
    extended = ("min CUDA capability", "needs")
    assert {k: v for k, v in row.items() if k not in extended} == {
        k: v for k, v in declared.items() if k not in extended
    }
    assert row["min CUDA capability"].startswith(declared["min CUDA capability"])
    assert "Hopper only" in row["min CUDA capability"]
    assert all(name in row["needs"] for name in FA3_DISTRIBUTIONS) and "flash_attn_interface" in row["needs"]
