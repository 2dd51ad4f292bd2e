"""The context-parallel benchmark and its traffic model."""

from __future__ import annotations

import json

import pytest

from attnkit.parallel import bench, model


def test_bench_quick_run_measures_bytes_the_model_predicts(tmp_path, capsys):
    out = tmp_path / "cp.json"
    assert bench.main(["--quick", "--ranks", "1,2", "--repeats", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "[2 rank(s)] starting" in text and "MODEL, not a measurement" in text
    data = json.loads(out.read_text())
    rows = {(r["ranks"], r["strategy"], r["shape"]): r for r in data["measured"]}
    assert {s for _, s, _ in rows} == {"one device", "ring 2", "ulysses 2"}
    for (ranks, strategy, shape), r in rows.items():
        assert r["seconds"] > 0
        if ranks > 1:
            # counted by the transfers, uneven shards (257 tokens) included
            assert r["bytes_mean"] > 0
            assert r["model_bytes"] == pytest.approx(r["bytes_mean"], rel=1e-9), (strategy, shape)


def test_bench_refuses_what_it_cannot_measure():
    with pytest.raises(SystemExit):
        bench.main(["--ranks", "3"])
    with pytest.raises(SystemExit):
        bench.main(["--shapes", "sd15-1024"])


def test_model_formulas():
    s = model.Shape(batch=2, heads=8, q_len=4096, kv_len=4096, head_dim=40, elem_bytes=2)
    # ring: each rank's block (N/R keys, k and v) to the R - 1 others
    assert model.ring_bytes(s, 8) == 2 * 8 * 512 * 80 * 2 * 7
    assert model.ring_bytes(s, 8, causal=True) == model.ring_bytes(s, 8) / 2
    # Ulysses: (U - 1) / U^2 of q, k, v and out
    assert model.ulysses_bytes(s, 8) == pytest.approx(7 / 64 * 2 * 8 * (4096 + 4096) * 80 * 2)
    # a mesh: the all-to-all inside 1 / ring of the sequence, the ring over H / U heads
    assert model.mesh_bytes(s, 2, 4) == pytest.approx(model.ulysses_bytes(s, 4, 0.5) + model.ring_bytes(s, 2, heads=2))
    one = model.estimate(s, model.H100_NVLINK)
    assert one.bytes_per_rank == 0 and one.total_s == pytest.approx(s.flops() / model.H100_NVLINK.flops)
    # long sequences: compute grows as N^2, ring traffic as N: the ring hides under compute
    long = model.Shape(1, 24, 118800, 118800, 128, 2)
    e = model.estimate(long, model.H100_NVLINK, ring=8)
    assert e.bytes_per_flop < model.H100_NVLINK.balance and e.total_s == pytest.approx(e.compute_s)
