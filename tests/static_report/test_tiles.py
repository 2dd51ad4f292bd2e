"""The tile table attnkit/kernels/flash/tiles.py is generated (tools/static_report/tiles.py,
`python -m tools.static_report tiles`): the file in the tree is what the generator writes
for its entries, and --add / --remove / --budgets / --check edit a copy as documented.
The real file is never rewritten here."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.static_report._compiled import compiled_run

pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tiles(*args: str) -> subprocess.CompletedProcess:
    return compiled_run("-m", "tools.static_report", "tiles", *args, timeout=300)


@pytest.fixture
def copy(tmp_path):
    from tools.static_report import tiles

    path = tmp_path / "tiles.py"
    path.write_text(open(os.path.join(ROOT, tiles.TILES_PATH)).read())
    return path


def test_the_tile_table_is_generated_not_edited_by_hand():
    from attnkit.kernels.flash import tiles as table
    from tools.static_report import tiles

    with open(os.path.join(ROOT, tiles.TILES_PATH)) as f:
        text = f.read()
    assert text == tiles.render(tiles.entries_of(table.CONFIGS)), (
        f"{tiles.TILES_PATH} is not what tools/static_report/tiles.py writes: do not edit it by hand; "
        "make the change with `python -m tools.static_report tiles --add SPEC / --remove SPEC / --budgets`, "
        "or run `python -m tools.static_report tiles` to write it in its canonical form"
    )
    # Read from its text (no import), the entries are the module's.
    assert tiles.read_entries() == list(table.ENTRIES) == tiles.entries_of(table.CONFIGS)


def test_check_fails_on_a_hand_edit(copy):
    res = _tiles("--check")
    assert res.returncode == 0, res.stdout + res.stderr
    copy.write_text(copy.read_text().replace("budget=0.31)", "budget=0.32)", 1))
    assert _tiles("--check", "--file", str(copy)).returncode == 0  # still canonical: a budget is data
    copy.write_text(copy.read_text().replace("T(", "T( ", 1))
    res = _tiles("--check", "--file", str(copy))
    assert res.returncode == 1 and "python -m tools.static_report tiles" in res.stdout, res.stdout + res.stderr


def test_add_and_remove(copy):
    from tools.static_report import tiles
    from tools.static_report.tiles import parse_tile

    before = tiles.read_entries(str(copy))
    key = ("sm90", "fwd", "16bit", 128)
    names = [str(e[4]) for e in before if e[:4] == key]
    res = _tiles(
        "--file", str(copy), "--add", "sm90 fwd 16bit 128 T(64, 64, 4, 2, variants=NK, budget=0.7)", "--position", "1"
    )
    assert res.returncode == 0, res.stdout + res.stderr
    after = tiles.read_entries(str(copy))
    assert [str(e[4]) for e in after if e[:4] == key] == names[:1] + ["M64-N64-w4-s2"] + names[1:]
    assert parse_tile("T(64, 64, 4, 2, variants=NK, budget=0.7)") in [e[4] for e in after]
    assert len(after) == len(before) + 1 and copy.read_text() == tiles.render(after)
    # Appended to its list without --position; a new list goes after the smaller bands.
    added = tiles.add(after, "sm90 fwd 16bit 128 T(64, 32, 4, 2)")
    assert [str(e[4]) for e in added if e[:4] == key][-1] == "M64-N32-w4-s2"
    two = [
        ("sm80", "fwd", "16bit", 64, parse_tile("T(64, 64, 4, 2)")),
        ("sm80", "fwd", "16bit", 128, parse_tile("T(64, 32, 4, 2)")),
    ]
    assert [e[3] for e in tiles.add(two, "sm80 fwd 16bit 96 T(16, 16, 4, 1)")] == [64, 96, 128]
    # Removed by the name the report shows.
    res = _tiles("--file", str(copy), "--remove", "sm90 fwd 16bit 128 M64-N64-w4-s2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert tiles.read_entries(str(copy)) == before
    # Errors name what exists: not found, ambiguous (two tiles share a name), bad specs.
    res = _tiles("--file", str(copy), "--remove", "sm90 fwd 16bit 128 M16-N16-w4-s1")
    assert res.returncode == 2 and "not found" in res.stderr and "holds: T(" in res.stderr, res.stderr
    dup = [e for e in before if e[:4] == ("sm90", "fwd", "16bit", 96) and str(e[4]) == "M128-N128-w8-s2"]
    assert len(dup) == 2
    with pytest.raises(ValueError, match="2 tiles of the list are M128-N128-w8-s2"):
        tiles.remove(before, "sm90 fwd 16bit 96 M128-N128-w8-s2")
    assert len(tiles.remove(before, "sm90 fwd 16bit 96 " + tiles.tile_source(dup[1][4]))) == len(before) - 1
    with pytest.raises(ValueError, match="already there"):
        tiles.add(before, f"sm90 fwd 16bit 96 {tiles.tile_source(dup[0][4])}")
    with pytest.raises(ValueError, match="target 'sm91'.*band '100'"):
        tiles.add(before, "sm91 fwd 16bit 100 T(64, 64, 4, 2)")
    with pytest.raises(ValueError, match="only numbers"):
        tiles.add(before, "sm90 fwd 16bit 128 T(64, 64, 4, __import__('os'))")
    assert tiles.read_entries(str(copy)) == before


def _result(kernel, d, dtype, config, arch, bias, causal, tma, isc, maxnreg=None):
    from tools.static_report.compile import Job, Result

    job = Job(kernel, d, dtype, config, arch, bias, causal, tma, maxnreg=maxnreg)
    return Result(job, loop_length=100, instr_per_score=isc)


def test_budgets_are_5_percent_above_the_worst_gated_row(copy, tmp_path):
    """--budgets: for each entry with a budget, the worst instr/score of the rows it
    gates (its target, kernel, band, width's dtypes, tile, a variant / causality / loads
    / head dim it serves, the gated loads), x 1.05, rounded up to 0.01."""
    from tools.static_report import store, tiles
    from tools.static_report.tiles import parse_tile

    tile = (128, 128, 8, 2, 0)
    entry = ("sm90", "fwd", "16bit", 128, parse_tile("T(128, 128, 8, 2, loads=TMA, budget=0.43)"))
    rows = [
        _result("fwd", 128, "fp16", tile, 90, "none", False, True, 0.41),
        _result("fwd", 128, "bf16", tile, 90, "keypad", True, True, 0.5),  # the worst that counts
        _result("fwd", 128, "fp16", tile, 90, "none", False, False, 0.9),  # pointer loads on sm_90: not gated
        _result("fwd", 128, "fp16", (128, 64, 8, 2, 0), 90, "none", False, True, 2.0),  # another tile
        _result("fwd", 128, "fp16", tile, 90, "none", False, True, 2.0, maxnreg=255),  # another register cap
        _result("fwd", 128, "fp32", tile, 90, "none", False, False, 3.0),  # another width
        _result("fwd", 64, "fp16", tile, 90, "none", False, True, 4.0),  # another band
        _result("fwd_lo", 128, "fp16", tile, 90, "none", False, True, 5.0),  # another kernel
        _result("fwd", 128, "fp16", tile, 80, "none", False, False, 6.0),  # another target
    ]
    unbudgeted = ("sm90", "fwd", "16bit", 128, parse_tile("T(128, 128, 8, 2, loads=TMA)"))
    unmeasured = ("sm90", "fwd", "16bit", 192, parse_tile("T(128, 128, 8, 2, loads=TMA, budget=0.4)"))
    out, notes = tiles.budgets([entry, unbudgeted, unmeasured], rows)
    assert out[0][4].budget == tiles.budget_for(0.5) == 0.53
    assert out[1:] == [unbudgeted, unmeasured] and any("no rows" in n for n in notes)
    assert tiles.budget_for(0.4) == 0.42 and tiles.budget_for(1.0) == 1.05
    # The command: the rows of a report folder, the budgets written into the table.
    report = tmp_path / "report"
    report.mkdir()
    store.write_layout(str(report), {"triton": "x", "source_key": "k", "rows": [store.to_record(r) for r in rows]})
    before = [e for e in tiles.read_entries(str(copy)) if e[:4] == entry[:4] and str(e[4]) == "M128-N128-w8-s2"]
    assert before and before[0][4].loads == entry[4].loads
    res = _tiles("--file", str(copy), "--budgets", "--report", str(report))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "budget 0.43 -> 0.53" in res.stdout and "was not compiled from this code" in res.stdout
    after = {(e[:4], str(e[4]), e[4].variants): e[4] for e in tiles.read_entries(str(copy))}
    assert after[(entry[:4], "M128-N128-w8-s2", before[0][4].variants)].budget == 0.53
