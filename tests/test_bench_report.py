"""What `attnkit bench` reports: true sample counts, noise beside every difference, plots
that show their values, a run without the `attnkit[bench]` extra, and `--parallel`.

Synthetic results and fake configurations: no model runs here except the one CLI run
without matplotlib (a tiny UNet, seconds).
"""

from __future__ import annotations

import json
import sys
import types

import pytest

from attnkit.bench import markdown, plots
from attnkit.bench.measure import Config, Deadline, measure_interleaved, ranking, separated
from attnkit.bench.models import LoopTiming


def _cell(name: str, samples: list[float], status: str = "ok", reason: str = "") -> dict:
    """A table-1 cell as Cell.to_dict writes it."""
    out = {"name": name, "status": status, "reason": reason, "samples": len(samples), "it_per_s": samples,
           "warmup_seconds": 1.0}
    for key, values in (("it_per_s", samples), ("loop_it_per_s", samples), ("seconds", [3 / v for v in samples])):
        out[key] = values
        out[f"{key}_median"] = sorted(values)[len(values) // 2] if values else None
        out[f"{key}_min"] = min(values) if values else None
        out[f"{key}_max"] = max(values) if values else None
    return out


def _table1(cells: dict[str, dict]) -> dict:
    base = cells["vanilla"]["it_per_s_median"]
    return {"cells": cells, "published": None,
            "speedup_vs_vanilla": {n: c["it_per_s_median"] / base for n, c in cells.items() if c["status"] == "ok"},
            "setting": {"resolution": 128, "steps": 3, "batch": 1, "dtype": "fp32", "compile": False, "repeats": 5,
                        "steady_state_skips_first_steps": 1}}


def test_cells_hold_exactly_the_samples_the_table_counts():
    """A budget that ends after two of four rounds: two samples per cell, and the table says 2."""
    timed = []

    class TwoRounds(Deadline):
        def left(self) -> float | None:
            return -1.0 if len(timed) >= 2 * 3 else None

        def expired(self) -> bool:
            return self.left() is not None

    def make(name: str) -> Config:
        def run(warmup: bool) -> LoopTiming:
            if not warmup:
                timed.append(name)
            return LoopTiming([0.1, 0.1 + 0.01 * len(timed)])

        return Config(name, run)

    cells = measure_interleaved([make("auto"), make("sdpa"), make("vanilla")], repeats=4, skip_steps=1,
                                progress=False, deadline=TwoRounds(None))
    dicts = {n: c.to_dict() for n, c in cells.items()}
    assert all(d["samples"] == len(d["it_per_s"]) == len(d["seconds"]) == 2 for d in dicts.values()), dicts
    md = markdown.render_table1(_table1(dicts), {"device_name": "cpu"})
    rows = [line for line in md.splitlines() if line.startswith("| auto |")]
    assert rows and rows[0].split(" | ")[2] == "2", rows
    assert "median of its n samples" in md and "up to 5 rounds" in md


@pytest.mark.parametrize("a, b, noise, expected", [
    ([1.10], [1.40], None, None),  # one sample each, the run's spread unknown: not established
    ([1.10], [1.40], 0.30, False),  # one sample each, the run's spread (30%) larger than the difference
    ([1.10], [1.40], 0.05, True),
    ([1.0, 1.3], [1.2, 1.5], None, False),  # ranges overlap
    ([1.0, 1.1], [1.2, 1.5], None, True),
], ids=["one-sample", "one-sample-noisy-run", "one-sample-quiet-run", "overlap", "apart"])
def test_a_difference_is_separated_only_beyond_the_noise(a, b, noise, expected):
    assert separated(a, b, noise) is expected


def test_the_table_flags_a_spread_wider_than_the_difference():
    cells = {"auto": _cell("auto", [1.0, 1.3, 1.2]), "sdpa": _cell("sdpa", [1.1, 1.5, 1.4]),
             "vanilla": _cell("vanilla", [0.5, 0.52, 0.51])}
    md = markdown.render_table1(_table1(cells), {"device_name": "cpu"})
    assert "x2.75 (sdpa; auto x2.35 within noise)" in md, md
    assert "Fastest first: sdpa 1.40 ≈ auto 1.20 > vanilla 0.51" in md, md
    one_each = {"auto": _cell("auto", [1.10]), "sdpa": _cell("sdpa", [1.40]), "vanilla": _cell("vanilla", [1.0])}
    md = markdown.render_table1(_table1(one_each), {"device_name": "cpu"})
    assert "(sdpa; auto x1.10: one sample, not established)" in md, md
    assert "sdpa 1.40 ? auto 1.10 ? vanilla 1.00" in md and "spread is unknown" in md, md
    assert ranking({"a": [2.0, 2.2], "b": [2.1, 2.3], "c": [1.0, 1.1]}, "{:.1f}".format) == "b 2.2 ≈ a 2.1 > c 1.1"


LONG_DEVICE = "CPU: Intel(R) Xeon(R) Platinum 8480+ Processor @ 2.00GHz with a long name (2 threads)"


def _results() -> dict:
    t1 = _table1({"auto": _cell("auto", [0.62, 0.65]), "sdpa": _cell("sdpa", [0.6, 0.66]),
                  "xformers": _cell("xformers", [], "n/a", "xformers is not installed; device=cpu (supported: cuda)"),
                  "vanilla": _cell("vanilla", [0.7, 0.72])})
    ladder_rows = [{**_cell("fp32", [0.5]), "speedup_vs_fp32": 1.0}, {**_cell("bf16", [0.4]), "speedup_vs_fp32": 1.25},
                   {**_cell("bf16 + sdpa", [], "n/a", "not here"), "speedup_vs_fp32": None}]
    for r in ladder_rows:
        r["seconds_median"] = r["seconds_min"] = r["seconds_max"] = r["it_per_s_median"]
    gib = 1 << 30
    mem = {n: {"name": n, "status": "ok", "peak_bytes": int(4.13 * gib) + extra, "baseline_bytes": int(3.98 * gib),
               "activation_bytes": int(0.15 * gib) + extra}
           for n, extra in (("auto", 3 << 20), ("sdpa", 2 << 20), ("vanilla", 0))}
    mem["xformers"] = {"name": "xformers", "status": "n/a", "reason": "not installed"}
    one_batch = {"batch": 1, "cells": {"sdpa": {"status": "ok", "it_per_s_median": 1.0}},
                 "speedup_vs_vanilla": {}, "speedup_vs_xformers": {}}
    return {"environment": {"device_name": LONG_DEVICE},
            "tables": {"1": t1, "2": {"rows": ladder_rows, "setting": {"includes": "denoising loop only"}},
                       "3": {"setting": {"repeats": 1}, "runs": [{"dtype": "fp32", "compile": False,
                                                                  "batches": [one_batch]}]},
                       "4": {"method": "peak resident memory (VmHWM) of the denoising loop, each processor in its own "
                                       "process", "cells": mem}}}


def test_plots_show_their_values_and_name_what_was_not_measured(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = _results()
    fig = plots.plot_memory(plt, results["tables"]["4"], LONG_DEVICE)
    ax = fig.axes[0]
    widths = sorted(round(p.get_width()) for p in ax.patches)
    assert widths == [154, 156, 157], widths  # MiB over the baseline: the differences, not 4 GiB each
    assert all("MiB over baseline" in t.get_text() for t in ax.texts)
    assert "xformers: n/a" in ax.get_xlabel()
    assert LONG_DEVICE in ax.get_title().replace("\n", " ")  # wrapped, not cut
    plt.close(fig)

    fig = plots.plot_it_per_s(plt, results["tables"]["1"], LONG_DEVICE)
    ax = fig.axes[0]
    assert len(ax.patches) == 3  # no zero-height bar for the processor that did not run
    assert "not measured: xformers: n/a (xformers is not installed" in ax.get_xlabel()
    assert all("n=2" in t.get_text() for t in ax.texts)
    plt.close(fig)

    fig = plots.plot_ladder(plt, results["tables"]["2"], LONG_DEVICE)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts[0] == "0.5 s (x1.00 vs fp32, n=1)" and texts[2].startswith("n/a (not here)"), texts
    plt.close(fig)

    written, problems = plots.write_plots(results, str(tmp_path))
    assert sorted(p.rsplit("/", 1)[1] for p in written) == ["it_per_s.png", "ladder.png", "memory.png"]
    assert problems == ["batch_sweep.png not drawn: one batch size per run (table 3 in table.md has it)"]


def test_without_the_bench_extra_results_and_table_are_still_written(tmp_path, monkeypatch, capsys):
    """A plain `pip install attnkit`: no matplotlib, no tqdm."""
    import torch
    from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel  # noqa: F401 (import tqdm first)

    from attnkit.bench.cli import main

    for name in ("matplotlib", "matplotlib.pyplot", "tqdm", "tqdm.auto"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    before = torch.get_num_threads()
    try:
        rc = main(["--preset", "tiny", "--tables", "1", "--processors", "sdpa,vanilla", "--repeats", "1",
                   "--steps", "2", "--threads", "1", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(before)
    assert rc == 0
    err = capsys.readouterr().err
    assert "no plots and progress bars: matplotlib and tqdm not installed (pip install 'attnkit[bench]'" in err, err
    assert "no plots: matplotlib is not installed (pip install 'attnkit[bench]' installs it)" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "table.md"]
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["tables"]["1"]["cells"]["sdpa"]["status"] == "ok"


def test_parallel_hands_its_arguments_over_or_says_why_not(monkeypatch, capsys):
    from attnkit.bench.cli import main

    monkeypatch.setitem(sys.modules, "attnkit.parallel.bench", None)
    assert main(["--parallel", "--world-size", "2"]) == 2
    err = capsys.readouterr().err
    assert "--parallel" in err and "attnkit.parallel" in err

    seen = []
    parent, child = types.ModuleType("attnkit.parallel"), types.ModuleType("attnkit.parallel.bench")
    child.main = lambda argv: seen.append(argv) or 0
    parent.bench = child
    monkeypatch.setitem(sys.modules, "attnkit.parallel", parent)
    monkeypatch.setitem(sys.modules, "attnkit.parallel.bench", child)
    assert main(["--parallel", "--world-size", "2", "--out", "x"]) == 0
    assert seen == [["--world-size", "2", "--out", "x"]]

    with pytest.raises(SystemExit) as exc:  # after other options it would drop them: refused
        main(["--tables", "1", "--parallel", "--world-size", "2"])
    assert exc.value.code == 2 and "put it first" in capsys.readouterr().err
