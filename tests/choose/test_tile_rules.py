"""attnkit/kernels/tile_rules.py, the default tiles per GPU, is generated from the
committed GPU records (`python -m tools.records`): where a record timed a case with the
shipped default tile and with the autotuner's choice, in the same run, and the choice was
ahead by the threshold, the choice becomes that GPU's default for the lists the case ran,
for calls at least as long, in the dtype timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnkit.kernels import limits, tile_rules
from attnkit.kernels.flash.tiles import CONFIGS
from tools.records import generate as gen

ROOT = Path(__file__).resolve().parents[2]
H100 = "nvidia-h100-80gb-hbm3"


def test_the_module_is_what_the_generator_writes():
    assert gen.TILE_OUTPUT.read_text() == gen.generate_tiles(), (
        "attnkit/kernels/tile_rules.py differs from what the records under bench/results give: run "
        "`python -m tools.records` (never edit it by hand)"
    )


def test_check_fails_on_a_hand_edit(tmp_path, capsys):
    records, tiles = tmp_path / "gpu_rules.py", tmp_path / "tile_rules.py"
    records.write_text(gen.OUTPUT.read_text())
    tiles.write_text(gen.TILE_OUTPUT.read_text())
    args = ["--check", "--file", str(records), "--tiles-file", str(tiles)]
    assert gen.main(args) == 0
    tiles.write_text(tiles.read_text().replace("M128-N64-w8-s3", "M64-N64-w4-s2", 1))
    assert gen.main(args) == 1
    assert "tile_rules.py is not what the records" in capsys.readouterr().out


def test_every_rule_names_a_shipped_candidate_that_serves_its_list():
    """So the static report compiles every recorded default (it compiles every shipped
    candidate), and `replaces` is the list's default today."""
    assert tile_rules.TILE_RULES
    for r in tile_rules.TILE_RULES:
        cands = [
            c
            for c in CONFIGS[r.target][r.kernel][r.width][r.band]
            if r.variant in c.variants and r.causal in c.causal and r.loads in c.loads
        ]
        names = [str(c) for c in cands if c.dims is None or c.dims[0] <= limits.padded_head_dim(r.band) <= c.dims[1]]
        assert r.tile in names and names[0] == r.replaces != r.tile, r
        assert r.gain >= tile_rules.THRESHOLD


def test_the_h100_rules_carry_the_records_figures():
    """The H100's timing/timing.json: SD1.5's D=40 forward 0.286 ms with the default tile,
    0.204 ms autotuned (M128-N64-w8-s3); D=64 0.939 against 0.712; D=64 forward and
    backward 3.161 against 2.781 ms. Head dim 128's autotuned forward was slower (1.306
    against 1.250 ms): no rule there."""
    rows = json.loads((ROOT / "bench" / "results" / H100 / "timing" / "timing.json").read_text())
    by = {(r.kernel, r.band): r for r in tile_rules.TILE_RULES if r.gpu == H100}
    assert set(by) == {("fwd", 64), ("fwd_lo", 64), ("dkdv", 64), ("dq", 64)}
    fwd = by["fwd", 64]
    assert (fwd.tile, fwd.replaces, fwd.min_q, fwd.min_kv, fwd.dtype) == (
        "M128-N64-w8-s3",
        "M128-N128-w8-s2",
        4096,
        4096,
        "float16",
    )
    row = rows[int(fwd.record.split("#")[1])]
    off = next(r for r in rows if r["case"] == row["case"] and r.get("autotune") is False)
    assert row["autotune"] is True and round(off["attnkit_ms"] / row["attnkit_ms"], 3) == fwd.gain == 1.318
    assert by["dkdv", 64].gain == by["dq", 64].gain == by["fwd_lo", 64].gain == 1.137
    assert not [r for r in tile_rules.TILE_RULES if r.band == 128]


# -- the generator on records made up for the test ------------------------------------------
LIST = "sm90/fwd/16bit/64/none/False/True"


def _choice(d, m, n, tile):
    bm, bn, w, s = tile
    key = str((d, m, n, False, True, "torch.float16"))
    return key, (
        f"BLOCK_M: {bm}, BLOCK_N: {bn}, RELOAD: False, num_warps: {w}, num_ctas: 1, num_stages: {s}, maxnreg: None"
    )


def _run(case, ms_off, ms_on, d=64, m=4096, n=4096, backward=False):
    base = {
        "case": case,
        "shape": [2, 8, m, n, d],
        "causal": False,
        "bias": "none",
        "backward": backward,
        "speedup_vs_sdpa": 1.0,
    }
    return [dict(base, autotune=False, attnkit_ms=ms_off), dict(base, autotune=True, attnkit_ms=ms_on)]


def _write(tmp_path, rows):
    gpu = tmp_path / "nvidia-x1"
    (gpu / "t").mkdir(parents=True)
    (gpu / "results.json").write_text(
        json.dumps({"environment": {"device": "cuda", "device_name": "NVIDIA X1", "capability": [9, 0]}})
    )
    (gpu / "t" / "timing.json").write_text(json.dumps(rows))
    (gpu / "t" / "summary.md").write_text("# x\n\n2026-01-01 10:00 UTC\n\n## Speed beside torch's SDPA (fp16)\n")


def _rules(tmp_path):
    namespace: dict = {}
    exec(gen.generate_tiles(tmp_path), namespace)
    return namespace["TILE_RULES"]


def test_a_choice_ahead_by_the_threshold_becomes_the_default_of_its_region(tmp_path):
    rows = _run("a", 1.0, 0.8) + _run("short", 1.0, 0.8, m=1024, n=77) + _run("b", 1.0, 0.99, d=40, m=2048)
    rows.append(
        {
            "case": "autotuner choices",
            "choices": {
                LIST: dict(
                    [
                        _choice(64, 4096, 4096, (128, 64, 8, 3)),
                        _choice(64, 1024, 128, (128, 64, 8, 3)),
                        _choice(40, 2048, 4096, (128, 64, 8, 3)),
                    ]
                )
            },
        }
    )
    _write(tmp_path, rows)
    (rule,) = _rules(tmp_path)
    # "short" won too, but its region (q >= 1024, kv >= 77) holds "b", which did not
    assert (rule.kernel, rule.band, rule.tile, rule.replaces, rule.min_q, rule.min_kv, rule.gain, rule.record) == (
        "fwd",
        64,
        "M128-N64-w8-s3",
        "M128-N128-w8-s2",
        4096,
        4096,
        1.25,
        "t/timing.json#1",
    )


def test_each_case_is_its_own_region(tmp_path):
    """Two winners at (8192, 128) and (128, 8192) give two rules, not one from (128, 128):
    a corner no record timed."""
    rows = _run("wide", 1.0, 0.8, m=8192, n=128) + _run("tall", 1.0, 0.8, m=128, n=8192)
    rows.append(
        {
            "case": "autotuner choices",
            "choices": {LIST: dict([_choice(64, 8192, 128, (128, 64, 8, 3)), _choice(64, 128, 8192, (128, 64, 8, 3))])},
        }
    )
    _write(tmp_path, rows)
    assert sorted((r.min_q, r.min_kv) for r in _rules(tmp_path)) == [(128, 8192), (8192, 128)]


def test_no_rule_where_a_case_in_the_region_lost_disagreed_or_kept_the_default(tmp_path):
    # "slow", inside "a"'s region, ran slower with the same choice: no rule at all
    rows = _run("a", 1.0, 0.8, m=1024, n=1024) + _run("slow", 1.0, 1.6, m=8192, n=8192)
    rows.append(
        {
            "case": "autotuner choices",
            "choices": {
                LIST: dict([_choice(64, 1024, 1024, (128, 64, 8, 3)), _choice(64, 8192, 8192, (128, 64, 8, 3))])
            },
        }
    )
    _write(tmp_path, rows)
    assert _rules(tmp_path) == ()
    # "c" chose another tile (the default) inside "a"'s region: a's region loses its rule
    rows = _run("a", 1.0, 0.8, m=1024, n=1024) + _run("c", 1.0, 0.8, m=4096, n=4096)
    rows.append(
        {
            "case": "autotuner choices",
            "choices": {
                LIST: dict([_choice(64, 1024, 1024, (128, 64, 8, 3)), _choice(64, 4096, 4096, (128, 128, 8, 2))])
            },
        }
    )
    _write(tmp_path / "again", rows)
    assert _rules(tmp_path / "again") == ()


def test_a_choice_the_lists_no_longer_hold_is_an_error_naming_it(tmp_path):
    rows = _run("a", 1.0, 0.5) + [
        {"case": "autotuner choices", "choices": {LIST: dict([_choice(64, 4096, 4096, (256, 16, 2, 9))])}}
    ]
    _write(tmp_path, rows)
    with pytest.raises(gen.RecordError, match=r"chose M256-N16-w2-s9 for sm90/fwd/16bit/64/none/False/True"):
        gen.generate_tiles(tmp_path)


def test_info_names_the_record_behind_each_default_tile():
    from attnkit import info
    from attnkit.backends import DeviceInfo
    from attnkit.choose.auto import AutoChooser

    data = info.record_rules(DeviceInfo("cuda", (9, 0), "NVIDIA H100 80GB HBM3"), AutoChooser(), {})
    rows = data["tiles"]
    assert len(rows) == len([r for r in tile_rules.TILE_RULES if r.gpu == H100]) == 4
    text = info.report({**info.collect(), "records": data})
    for row in rows:
        assert (ROOT / row["source"].split("#")[0]).is_file()
        assert f"{row['tile']} instead of {row['replaces']}" in text and row["source"] in text
    fwd = next(r for r in rows if r["list"].startswith("sm90 fwd "))
    assert fwd["calls"] == "float16, q_len >= 4096, kv_len >= 4096" and "1.32x" in fwd["source"]
    assert info.record_rules(DeviceInfo("cuda", (9, 0), "NVIDIA H200"), AutoChooser(), {})["tiles"] == []


def test_the_launcher_names_a_gpus_record_as_the_records_do():
    from attnkit.choose import record_rules
    from attnkit.kernels import devices

    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB"):
        assert devices.record_folder(name) == record_rules.device_folder(name) == gen.device_folder(name)
    assert devices.record_folder("NVIDIA H100 80GB HBM3") == H100
