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

from attnkit.bench import markdown, markdown_dit, markdown_sd, plots
from attnkit.bench.measure import Config, Deadline, measure_interleaved, ranking, separated
from attnkit.bench.models import LoopTiming
from attnkit.bench.published import LADDER_TITAN_RTX


def _cell(name: str, samples: list[float], status: str = "ok", reason: str = "") -> dict:
    """A table-1 cell as Cell.to_dict writes it."""
    out = {
        "name": name,
        "status": status,
        "reason": reason,
        "samples": len(samples),
        "it_per_s": samples,
        "warmup_seconds": 1.0,
    }
    for key, values in (("it_per_s", samples), ("loop_it_per_s", samples), ("seconds", [3 / v for v in samples])):
        out[key] = values
        out[f"{key}_median"] = sorted(values)[len(values) // 2] if values else None
        out[f"{key}_min"] = min(values) if values else None
        out[f"{key}_max"] = max(values) if values else None
    return out


def _table1(cells: dict[str, dict]) -> dict:
    base = cells["vanilla"]["it_per_s_median"]
    return {
        "cells": cells,
        "published": None,
        "speedup_vs_vanilla": {n: c["it_per_s_median"] / base for n, c in cells.items() if c["status"] == "ok"},
        "setting": {
            "resolution": 128,
            "steps": 3,
            "batch": 1,
            "dtype": "fp32",
            "compile": False,
            "repeats": 5,
            "steady_state_skips_first_steps": 1,
        },
    }


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

    cells = measure_interleaved(
        [make("auto"), make("sdpa"), make("vanilla")], repeats=4, skip_steps=1, progress=False, deadline=TwoRounds(None)
    )
    dicts = {n: c.to_dict() for n, c in cells.items()}
    assert all(d["samples"] == len(d["it_per_s"]) == len(d["seconds"]) == 2 for d in dicts.values()), dicts
    md = markdown_sd.render_table1(_table1(dicts), {"device_name": "cpu"})
    rows = [line for line in md.splitlines() if line.startswith("| auto |")]
    assert rows and rows[0].split(" | ")[2] == "2", rows
    assert "median of its n samples" in md and "up to 5 rounds" in md


@pytest.mark.parametrize(
    "a, b, noise, expected",
    [
        ([1.10], [1.40], None, None),  # one sample each, the run's spread unknown: not established
        ([1.10], [1.40], 0.30, False),  # one sample each, the run's spread (30%) larger than the difference
        ([1.10], [1.40], 0.05, True),
        ([1.0, 1.3], [1.2, 1.5], None, False),  # ranges overlap
        ([1.0, 1.1], [1.2, 1.5], None, True),
    ],
    ids=["one-sample", "one-sample-noisy-run", "one-sample-quiet-run", "overlap", "apart"],
)
def test_a_difference_is_separated_only_beyond_the_noise(a, b, noise, expected):
    assert separated(a, b, noise) is expected


def test_the_table_flags_a_spread_wider_than_the_difference():
    cells = {
        "auto": _cell("auto", [1.0, 1.3, 1.2]),
        "sdpa": _cell("sdpa", [1.1, 1.5, 1.4]),
        "vanilla": _cell("vanilla", [0.5, 0.52, 0.51]),
    }
    md = markdown_sd.render_table1(_table1(cells), {"device_name": "cpu"})
    assert "x2.75 (sdpa; auto x2.35 within noise)" in md, md
    assert "Fastest first: sdpa 1.40 ≈ auto 1.20 > vanilla 0.51" in md, md
    one_each = {"auto": _cell("auto", [1.10]), "sdpa": _cell("sdpa", [1.40]), "vanilla": _cell("vanilla", [1.0])}
    md = markdown_sd.render_table1(_table1(one_each), {"device_name": "cpu"})
    assert "(sdpa; auto x1.10: one sample, not established)" in md, md
    assert "sdpa 1.40 ? auto 1.10 ? vanilla 1.00" in md and "spread is unknown" in md, md
    assert ranking({"a": [2.0, 2.2], "b": [2.1, 2.3], "c": [1.0, 1.1]}, "{:.1f}".format) == "b 2.2 ≈ a 2.1 > c 1.1"


LONG_DEVICE = "CPU: Intel(R) Xeon(R) Platinum 8480+ Processor @ 2.00GHz with a long name (2 threads)"


def _results() -> dict:
    t1 = _table1(
        {
            "auto": _cell("auto", [0.62, 0.65]),
            "sdpa": _cell("sdpa", [0.6, 0.66]),
            "xformers": _cell("xformers", [], "n/a", "xformers is not installed; device=cpu (supported: cuda)"),
            "vanilla": _cell("vanilla", [0.7, 0.72]),
        }
    )
    ladder_rows = [
        {**_cell("fp32", [0.5]), "speedup_vs_fp32": 1.0},
        {**_cell("bf16", [0.4]), "speedup_vs_fp32": 1.25},
        {**_cell("bf16 + sdpa", [], "n/a", "not here"), "speedup_vs_fp32": None},
    ]
    for r in ladder_rows:
        r["seconds_median"] = r["seconds_min"] = r["seconds_max"] = r["it_per_s_median"]
    gib = 1 << 30
    mem = {
        n: {
            "name": n,
            "status": "ok",
            "peak_bytes": int(4.13 * gib) + extra,
            "baseline_bytes": int(3.98 * gib),
            "activation_bytes": int(0.15 * gib) + extra,
        }
        for n, extra in (("auto", 3 << 20), ("sdpa", 2 << 20), ("vanilla", 0))
    }
    mem["xformers"] = {"name": "xformers", "status": "n/a", "reason": "not installed"}
    one_batch = {
        "batch": 1,
        "cells": {"sdpa": {"status": "ok", "it_per_s_median": 1.0}},
        "speedup_vs_vanilla": {},
        "speedup_vs_xformers": {},
    }
    return {
        "environment": {"device_name": LONG_DEVICE},
        "tables": {
            "1": t1,
            "2": {"rows": ladder_rows, "setting": {"includes": "denoising loop only"}},
            "3": {"setting": {"repeats": 1}, "runs": [{"dtype": "fp32", "compile": False, "batches": [one_batch]}]},
            "4": {
                "method": "peak resident memory (VmHWM) of the denoising loop, each processor in its own process",
                "cells": mem,
            },
        },
    }


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
    assert texts == ["0.5 s (x1.00 vs fp32, n=1)", "0.4 s (x1.25 vs fp32, one sample: not established, n=1)"], texts
    assert "not measured: n/a (not here): bf16 + sdpa" in fig.axes[0].get_xlabel()
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
        rc = main(
            [
                "--preset",
                "tiny",
                "--tables",
                "1",
                "--processors",
                "sdpa,vanilla",
                "--repeats",
                "1",
                "--steps",
                "2",
                "--threads",
                "1",
                "--out",
                str(tmp_path),
            ]
        )
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


# -- what the plots say, against what the tables say --------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _steps(name: str, samples: list[float], status: str = "ok", reason: str = "") -> dict:
    """A ladder row (seconds per image) or a table-5 cell (seconds per step)."""
    out = {"name": name, "status": status, "reason": reason, "samples": len(samples)}
    for key in ("seconds", "step_seconds"):
        out[key] = samples
        out[f"{key}_median"] = sorted(samples)[len(samples) // 2] if samples else None
        out[f"{key}_min"] = min(samples) if samples else None
        out[f"{key}_max"] = max(samples) if samples else None
    return out


def _ladder(rows: list[dict]) -> dict:
    fp32 = rows[0]["seconds_median"]
    for r in rows:
        r["speedup_vs_fp32"] = fp32 / r["seconds_median"] if r["seconds_median"] else None
    return {
        "rows": rows,
        "setting": {"resolution": 128, "steps": 3, "repeats": 3, "includes": "denoising loop only"},
        "published": {
            "device": "NVIDIA TITAN RTX",
            "rows": [
                {"step": step, "seconds": seconds, "speedup": speedup} for step, seconds, speedup in LADDER_TITAN_RTX
            ],
        },
    }


def _transformer(cells: dict[str, dict], repeats: int = 7) -> dict:
    ok = {n: c for n, c in cells.items() if c["status"] == "ok"}
    ratio_vs = {
        b: {n: c["step_seconds_median"] / ok[b]["step_seconds_median"] for n, c in ok.items()}
        for b in ("native", "stock")
        if b in ok
    }
    tokens = {"image": 1024, "text": 128}
    return {
        "models": [
            {
                "preset": "flux-cpu",
                "label": "Flux-like transformer for the CPU",
                "route": "route 1",
                "source": "random weights",
                "cells": cells,
                "ratio_vs": ratio_vs,
                "setting": {
                    "width": 512,
                    "height": 512,
                    "tokens": tokens,
                    "batch": 1,
                    "dtype": "fp32",
                    "attention_modules": 3,
                    "steps": 4,
                    "steady_state_skips_first_steps": 1,
                    "repeats": repeats,
                },
            }
        ]
    }


def test_plots_mark_a_ratio_within_noise_as_the_tables_do():
    plt = _plt()
    # auto's range overlaps vanilla's: x1.05 is within noise; sdpa's is apart: x1.91 is not
    cells = {
        "vanilla": _cell("vanilla", [1.0, 1.1]),
        "auto": _cell("auto", [1.05, 1.15]),
        "sdpa": _cell("sdpa", [2.0, 2.1]),
    }
    t1 = _table1(cells)
    md = markdown_sd.render_table1(t1, {"device_name": "cpu"})
    assert "| auto | 1.15 | 2 |" in md and "| x1.05 (within noise) |" in md, md
    assert "1.15 (x1.05, within noise)" in md and "2.10 (x1.91) |" in md, md
    fig = plots.plot_it_per_s(plt, t1, "cpu")
    labels = {t.get_text().split("\n")[0]: t.get_text() for t in fig.axes[0].texts}
    assert "x1.05\nwithin noise" in labels["1.15"] and labels["2.1"].endswith("x1.91"), labels
    assert "sdpa 2.05 > auto 1.1 ≈ vanilla 1.05" in fig.axes[0].get_xlabel()  # the ranking: true medians
    plt.close(fig)

    # the ladder: bf16 within noise of fp32, channels_last beyond it
    t2 = _ladder([_steps("fp32", [2.0, 2.2]), _steps("bf16", [1.9, 2.1]), _steps("bf16 + channels_last", [1.0, 1.1])])
    md = markdown_sd.render_table2(t2, {})
    assert "| bf16 | 2.100 | 2 | 1.900–2.100 | x1.05 (within noise) |" in md, md
    assert "| bf16 + channels_last | 1.100 | 2 | 1.000–1.100 | x2.00 |" in md, md
    fig = plots.plot_ladder(plt, t2, "cpu")
    assert [t.get_text() for t in fig.axes[0].texts] == [
        "2.2 s (x1.00 vs fp32, n=2)",
        "2.1 s (x1.05 vs fp32, within noise, n=2)",
        "1.1 s (x2.00 vs fp32, n=2)",
    ]
    plt.close(fig)

    # table 5: stock against native
    t5 = _transformer({"native": _steps("native", [0.19, 0.2, 0.21]), "stock": _steps("stock", [0.2, 0.205, 0.22])})
    md = markdown_dit.render_table5(t5, {})
    assert "| x1.02 (within noise) | x1.00 |" in md, md
    fig = plots.plot_transformers(plt, t5, "cpu")
    assert [t.get_text() for t in fig.axes[0].texts][1] == "0.205 s (x1.025 of native, within noise, n=3)"
    plt.close(fig)


def test_reasons_are_cut_at_a_word_or_wrapped_never_inside_one():
    from attnkit.bench.measure import cell_text, clip

    reason = (
        "ValueError: `backend='attnkit'` must be one of the following: _native_cudnn, _native_xla, "
        "_native_efficient, flash_varlen, _flash_varlen_3, sage_hub, flash, native"
    )
    words = reason.split()
    for limit in range(12, len(reason) + 5):
        text = clip(reason, limit)
        assert len(text) <= limit, (limit, text)
        if text != reason:
            shown = text[:-1].split()  # whole words only (a trailing ':' or ',' dropped before the "…")
            k = len(shown)
            assert text.endswith("…") and shown[:-1] == words[: k - 1], (limit, text)
            assert shown[-1] == words[k - 1].rstrip(",;:"), (limit, text)
    # a record written before this cut holds reasons cut inside a word: shown to the last whole word
    assert clip("must be one of: native, _f…", 200) == "must be one of: native…"
    assert (
        cell_text("n/a", "device=cpu: Triton kernels run on CUDA (its CPU interpreter is for debugging)", 60)
        == "n/a (device=cpu: Triton kernels run on CUDA (its CPU interpreter…)"
    )

    plt = _plt()
    t5 = _transformer(
        {
            "native": _steps("native", [0.2, 0.21]),
            "attnkit": _steps("attnkit", [], "n/a", reason),
            "stock": _steps("stock", [0.2, 0.22]),
        }
    )
    fig = plots.plot_transformers(plt, t5, "cpu")
    text = fig.axes[0].texts[1].get_text()
    assert text.startswith("n/a (ValueError") and text.count("\n") <= 1, text
    shown = text.replace("\n", " ")[len("n/a (") :].rstrip(")").rstrip("…").split()
    assert shown == words[: len(shown)] and len(shown) > 8, text
    plt.close(fig)


def test_no_speedup_over_vanilla_is_promised_where_vanilla_was_not_measured():
    plt = _plt()
    cells = {
        "auto": _cell("auto", [0.13]),
        "sdpa": _cell("sdpa", [0.10]),
        "vanilla": _cell("vanilla", [], "skipped", "time budget"),
    }
    t1 = {**_table1({**cells, "vanilla": _cell("vanilla", [1.0])}), "cells": cells, "speedup_vs_vanilla": {}}
    fig = plots.plot_it_per_s(plt, t1, "cpu")
    ax = fig.axes[0]
    title = ax.get_title().replace("\n", " ")
    assert "speedup over vanilla" not in title and "no speedup shown: vanilla not measured" in title, title
    assert not any("x" in t.get_text().split("n=")[-1] for t in ax.texts)
    assert "vanilla: skipped (time budget)" in ax.get_xlabel()
    plt.close(fig)
    md = markdown_sd.render_table1(t1, {"device_name": "cpu"})
    assert "(xN) = speedup over vanilla" not in md
    assert "no speedup over vanilla (vanilla not measured: skipped (time budget))" in md, md


def test_the_ladder_names_its_unmeasured_steps_once_per_reason_in_table_and_plot():
    plt = _plt()
    cl = "bf16 + channels_last"
    rows = [
        _steps("fp32", [5.4]),
        _steps("bf16", [6.8]),
        _steps(cl, [2.9]),
        _steps(f"{cl} + torch.compile", [], "skipped", "compile off (--compile)"),
        *(_steps(f"{cl} + {n}", [], "skipped", "time budget") for n in ("auto", "sdpa")),
        _steps(f"{cl} + xformers", [], "n/a", "xformers is not installed"),
        _steps(f"{cl} + sliced", [], "skipped", "time budget"),
    ]
    t2 = _ladder(rows)
    md = markdown_sd.render_table2(t2, {})
    table = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| step")]
    assert [line.split(" | ")[0][2:] for line in table] == ["fp32", "bf16", cl], table  # no empty rows
    expected = [
        "skipped (compile off (--compile)): bf16 + channels_last + torch.compile",
        "skipped (time budget): bf16 + channels_last + (auto, sdpa, sliced)",
        "n/a (xformers is not installed): bf16 + channels_last + xformers",
    ]
    assert "Not measured (5 of 8 steps):\n" + "\n".join(f"- {e}" for e in expected) in md, md
    assert "traced UNet: 3.21 s, x2.96; memory efficient attention: 2.63 s, x3.61" in md  # published, still shown

    fig = plots.plot_ladder(plt, t2, "cpu")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["fp32", "bf16", cl] and len(ax.patches) == 3
    assert "not measured: " + "; ".join(expected) in " ".join(ax.get_xlabel().split("\n")[1:])
    plt.close(fig)


def _label_ends(fig, ax, along: str) -> list[float]:
    """Where each value label ends, in data units of the value axis."""
    renderer = fig.canvas.get_renderer()
    inv = ax.transData.inverted()
    ends = []
    for t in ax.texts:
        box = t.get_window_extent(renderer)
        ends.append(inv.transform((box.x1, box.y1))[0 if along == "x" else 1])
    return ends


def test_the_value_axis_ends_just_past_the_furthest_bar_whisker_or_label():
    plt = _plt()
    # the flux-cpu record: one slow first round puts native's whisker at 8x its median
    t5 = _transformer(
        {
            "native": _steps("native", [0.196, 0.2, 0.202, 0.21, 0.22, 0.3, 1.666]),
            "flash": _steps(
                "flash",
                [],
                "n/a",
                "RuntimeError: Flash Attention backend 'flash' is not "
                "usable because of missing package or the version is too old.",
            ),
            "stock": _steps("stock", [0.195, 0.2, 0.207, 0.21, 0.22, 0.25, 1.15]),
        }
    )
    fig = plots.plot_transformers(plt, t5, "cpu")
    plots.finish(fig)
    ax = fig.axes[0]
    right = ax.get_xlim()[1]
    furthest = max(_label_ends(fig, ax, "x") + [1.666])
    assert furthest <= right <= furthest * 1.08, (furthest, right)  # no longer x1.7 of the whisker
    plt.close(fig)

    # labels far past short bars (memory: MiB over baseline) and above vertical bars (it/s)
    fig = plots.plot_memory(plt, _results()["tables"]["4"], "cpu")
    plots.finish(fig)
    ax = fig.axes[0]
    furthest = max(_label_ends(fig, ax, "x"))
    assert furthest <= ax.get_xlim()[1] <= furthest * 1.08
    plt.close(fig)
    fig = plots.plot_it_per_s(plt, _results()["tables"]["1"], "cpu")
    plots.finish(fig)
    ax = fig.axes[0]
    top, legend = ax.get_ylim()[1], ax.get_legend().get_window_extent(fig.canvas.get_renderer())
    furthest = max(_label_ends(fig, ax, "y"))
    assert furthest <= top and ax.transData.transform((0, furthest))[1] <= legend.y0 + 1  # under the legend
    assert top <= 1.6 * max(c["it_per_s_max"] for c in _results()["tables"]["1"]["cells"].values() if c["samples"])
    plt.close(fig)


def _record(tables: dict, budget: float | None = 120.0) -> dict:
    return {
        "environment": {"device_name": "cpu", "versions": {}, "date": "d", "command": "c"},
        "preset": {"name": "flux-cpu", "label": "flux"},
        "model": {"source": "s"},
        "tables": tables,
        "budget_seconds": budget,
        "elapsed_seconds": 34.0,
    }


def test_fewer_samples_than_asked_is_never_reported_as_nothing_skipped():
    full = _steps("native", [0.2] * 7)
    md = markdown.render_markdown(_record({"5": _transformer({"native": full, "stock": _steps("stock", [0.2] * 7)})}))
    assert "nothing was skipped for it, and every cell has the samples asked" in md, md

    short = _transformer({"native": _steps("native", [0.2] * 6), "stock": _steps("stock", [0.2] * 7)})
    md = markdown.render_markdown(_record({"5": short}))
    assert "nothing was skipped" not in md, md
    assert (
        "1 cell(s) with fewer samples than asked (the budget ended their rounds): "
        "table 5 (flux-cpu): native n=6 of 7 asked"
    ) in md, md
    merged = {**_record({"5": short}, None), "parts": [{"command": "c", "elapsed_seconds": 34.0}]}
    assert "native n=6 of 7 asked" in markdown.render_markdown(merged)
