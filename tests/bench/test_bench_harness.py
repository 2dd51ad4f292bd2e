"""The benchmark harness itself, on the CPU with a tiny UNet (seconds).

What `attnkit bench` promises: a row per processor, failures and out-of-memory kept in
their cells, the published rows keyed by device name, a results.json that round-trips
with every required field, and plots on disk.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import attnkit
from attnkit.bench import markdown, markdown_sd, plots, published, report
from attnkit.bench.context import Context
from attnkit.bench.measure import STATUS_FAILED, STATUS_OK, STATUS_OOM, Config, classify_error, measure_interleaved
from attnkit.bench.models import LoopTiming, build_model, denoise, make_conditioning
from attnkit.bench.presets import get_preset
from attnkit.bench.sweep import sweep
from attnkit.bench.tables import it_per_s

# triton is left out on purpose: under the tests' TRITON_INTERPRET=1 it would be timed in
# Triton's interpreter; the harness marks it n/a on the CPU (checked separately).
CPU_NAMES = ["vanilla", "sliced", "sdpa", "xformers", "flash_attn", "auto"]


@pytest.fixture(scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny kernels: threads only add contention
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(one_thread):
    preset = get_preset("tiny").with_overrides(repeats=1, steps=2, warmup_steps=1)
    return preset, build_model(preset, "cpu")


def _ctx(tiny, names=CPU_NAMES, **kw):
    preset, model = tiny
    return Context(
        model=model,
        preset=kw.pop("preset", preset),
        processors=list(names),
        device=torch.device("cpu"),
        device_name="cpu",
        progress=False,
        **kw,
    )


def test_tiny_model_runs_finite(tiny):
    preset, model = tiny
    cond = make_conditioning(model, 1, torch.float32)
    assert cond.prompt_embeds.abs().sum() > 0  # never time on zeros
    timing = denoise(model, cond, 3, preset.resolution, decode=True)
    assert len(timing.step_seconds) == 3 and timing.decode_seconds is not None
    assert all(s > 0 for s in timing.step_seconds)
    t = LoopTiming([1.0, 0.5, 0.5])
    assert t.it_per_s(0) == pytest.approx(1.5) and t.it_per_s(1) == pytest.approx(2.0)


def test_table1_has_a_row_per_processor(tiny):
    t = it_per_s(_ctx(tiny, CPU_NAMES + ["triton"]))
    assert list(t["cells"]) == CPU_NAMES + ["triton"]
    for name in ("vanilla", "sliced", "sdpa", "auto"):
        cell = t["cells"][name]
        assert cell["status"] == STATUS_OK, cell
        assert cell["it_per_s_median"] > 0 and cell["samples"] == len(cell["it_per_s"]) == 1
    assert t["speedup_vs_vanilla"]["vanilla"] == pytest.approx(1.0)
    for name in ("xformers", "flash_attn", "triton"):
        assert t["cells"][name]["status"] == "n/a" and t["cells"][name]["reason"]
    md = markdown_sd.render_table1(t, {"device_name": "cpu"})
    header = md.splitlines()[3]
    for name in CPU_NAMES + ["triton"]:
        assert name in header
    assert "n/a (" in md


def test_failing_processor_is_reported_in_its_cell(tiny, monkeypatch):
    import attnkit.bench.availability as procs
    from attnkit.backends.vanilla import VanillaBackend

    class Exploding(VanillaBackend):
        def forward(self, *args, **kwargs):
            raise RuntimeError("kernel exploded\nwith a long traceback")

    class Broken(attnkit.AttnkitProcessor):
        def __init__(self):
            super().__init__(Exploding())

    real = procs.make_processor
    monkeypatch.setattr(procs, "make_processor", lambda name: (Broken(), "") if name == "sliced" else real(name))
    t = it_per_s(_ctx(tiny, ["vanilla", "sliced", "sdpa"]))
    assert t["cells"]["sliced"]["status"] == STATUS_FAILED
    assert t["cells"]["sliced"]["reason"] == "RuntimeError: kernel exploded"
    assert t["cells"]["vanilla"]["status"] == t["cells"]["sdpa"]["status"] == STATUS_OK
    assert "failed: RuntimeError: kernel exploded" in markdown_sd.render_table1(t, {"device_name": "cpu"})


def test_interleaving_alternates_and_excludes_warmup():
    calls = []

    def make(name):
        def run(warmup):
            calls.append((name, warmup))
            return LoopTiming([0.1, 0.1])

        return Config(name, run)

    cells = measure_interleaved([make("a"), make("b"), make("c")], repeats=3, progress=False)
    assert calls[:3] == [("a", True), ("b", True), ("c", True)]
    rounds = [n for n, w in calls[3:]]
    # forward, backward, forward: over any two rounds each configuration's mean position is
    # the same, so a linear drift in the machine's load falls on all of them alike
    assert rounds == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert all(len(c.it_per_s) == 3 for c in cells.values())


def _fake_denoise(oom_from: dict[str, int]):
    """denoise stand-in: out of memory from a batch size on, per processor class."""

    def fake(model, cond, steps, resolution, unet=None, **kw):
        proc = next(iter((unet or model.unet).attn_processors.values()))
        name = getattr(getattr(proc, "backend", None), "name", "?")
        if cond.batch >= oom_from.get(name, 1 << 30):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
        return LoopTiming([0.01 * cond.batch] * steps)

    return fake


def test_out_of_memory_ends_the_sweep_cleanly(tiny, monkeypatch):
    import attnkit.bench.context as context

    monkeypatch.setattr(context, "denoise", _fake_denoise({"vanilla": 2, "sdpa": 8}))
    preset = tiny[0].with_overrides(sweep_max_batch=64)
    out = sweep(_ctx(tiny, ["vanilla", "sdpa", "xformers"], preset=preset))
    (run,) = out["runs"]
    assert run["max_batch"] == {"vanilla": 1, "sdpa": 4}
    assert run["oom_at"] == {"vanilla": 2, "sdpa": 8}
    assert "out of memory" in run["stopped"]
    assert [e["batch"] for e in run["batches"]] == [1, 2, 4, 8]
    assert run["batches"][1]["cells"]["vanilla"]["status"] == STATUS_OOM
    assert "xformers" in run["not_available"]
    md = markdown_sd.render_table3(out, {})
    assert "out of memory" in md and "OOM at 2" in md


@pytest.mark.parametrize(
    "exc, status",
    [
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                "you tried to allocate 84934656 bytes. Error code 12 (Cannot allocate memory)"
            ),
            STATUS_OOM,
        ),
        (RuntimeError("std::bad_alloc"), STATUS_OOM),
        (MemoryError(), STATUS_OOM),
        (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), STATUS_OOM),
        (RuntimeError("could not create a primitive"), STATUS_FAILED),
        (RuntimeError("Expected all tensors to be on the same device"), STATUS_FAILED),
        (ValueError("batch size out of memory range"), STATUS_FAILED),
    ],
    ids=["cpu-allocator", "bad-alloc", "memory-error", "gpu-allocator", "onednn", "device", "not-a-runtime-error"],
)
def test_out_of_memory_is_told_from_other_failures(exc, status):
    got, reason = classify_error(exc)
    assert got == status, (exc, got)
    assert reason.startswith(type(exc).__name__)


def test_cpu_memory_cap_in_a_subprocess_ends_the_sweep(tmp_path):
    """A real allocation failure under the child's address-space cap, reported, not fatal."""
    import dataclasses

    from attnkit.bench.child import run_child

    # 48x48 latents: vanilla materialises 2 x batch x 2 heads x 2304^2 fp32 scores (and
    # their softmax), ~0.1 GB per image; 600 MB over the child's footprint fits batch 2
    # but not 4, while SDPA's CPU kernel never holds the scores and reaches batch 4.
    preset = get_preset("tiny").with_overrides(resolution=96, sweep_max_batch=4, warmup_steps=1)
    out = run_child(
        {
            "task": "sweep",
            "preset": dataclasses.asdict(preset),
            "processors": ["vanilla", "sdpa"],
            "threads": 1,
            "mem_cap_bytes": 600 << 20,
            "device": "cpu",
        },
        timeout=120,
    )
    assert "runs" in out, out
    (run,) = out["runs"]
    cells = {(e["batch"], n): c for e in run["batches"] for n, c in e["cells"].items()}
    summary = {k: run[k] for k in ("max_batch", "oom_at", "failed", "stopped")}
    summary["not ok"] = {
        f"{n}@{b}": f"{c['status']}: {c.get('reason')}" for (b, n), c in cells.items() if c["status"] != "ok"
    }
    assert run["oom_at"].get("vanilla") in (2, 4), summary
    assert run["max_batch"]["vanilla"] == run["oom_at"]["vanilla"] // 2, summary
    oom_cell = cells[run["oom_at"]["vanilla"], "vanilla"]
    assert oom_cell["status"] == STATUS_OOM and "allocate" in oom_cell["reason"], summary
    # SDPA never holds the scores, so it fits at least what vanilla fits. Where the cap also
    # stops it (the child's footprint varies from machine to machine), the batch it stopped
    # at is recorded with its reason, and the sweep ends cleanly: reported, not fatal.
    assert run["max_batch"].get("sdpa", 0) >= run["max_batch"]["vanilla"], summary
    if run["max_batch"]["sdpa"] < 4:
        cell = cells.get((2 * run["max_batch"]["sdpa"], "sdpa"), {})
        assert cell.get("status") in (STATUS_OOM, STATUS_FAILED) and cell.get("reason"), summary
        assert "sdpa" in (run["oom_at"] if cell["status"] == STATUS_OOM else run["failed"]), summary
        assert run["stopped"].startswith("every processor out of memory or failed"), summary
    assert out["address_space_limit_bytes"]


def test_published_rows_are_keyed_by_device_name():
    cases = {
        "Tesla T4": "NVIDIA Tesla T4",
        "NVIDIA GeForce RTX 3060": "NVIDIA 3060 RTX",
        "NVIDIA A10G": "NVIDIA A10G",
        "NVIDIA RTX A6000": "NVIDIA RTX A6000",
        "NVIDIA TITAN RTX": "NVIDIA TITAN RTX",
        "NVIDIA A100-SXM4-40GB": "A100-SXM4-40GB",
        "NVIDIA A100-SXM4-80GB": "A100-SXM-80GB",
    }
    for torch_name, key in cases.items():
        assert published.match_device(torch_name) == key, torch_name
        assert key in published.IT_PER_S_FP16
    for other in ("NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 3060 Ti", "NVIDIA A100 80GB PCIe", "cpu", None):
        assert published.match_device(other) is None, other
    assert set(published.IT_PER_S_FP16) == set(cases.values())
    row = published.published_row("NVIDIA A10G")
    assert row["it_per_s"] == {"vanilla": 8.88, "xformers": 15.6}
    assert "diffusers" in row["source"]
    assert published.LADDER_TITAN_RTX[0] == ("original (fp32)", 9.50, 1.0)
    assert published.LADDER_TITAN_RTX[-1] == ("memory efficient attention", 2.63, 3.61)


def test_published_row_is_shown_beside_ours():
    cells = {
        n: {
            "name": n,
            "status": STATUS_OK,
            "it_per_s_median": v,
            "it_per_s_min": v,
            "it_per_s_max": v,
            "loop_it_per_s_median": v,
            "seconds_median": 1.0,
            "warmup_seconds": 1.0,
        }
        for n, v in (("vanilla", 9.0), ("xformers", 16.0))
    }
    t = {
        "cells": cells,
        "speedup_vs_vanilla": {"vanilla": 1.0, "xformers": 16 / 9},
        "published": published.published_row("NVIDIA A10G"),
        "setting": {
            "resolution": 512,
            "steps": 50,
            "batch": 1,
            "dtype": "fp16",
            "compile": False,
            "repeats": 3,
            "steady_state_skips_first_steps": 5,
        },
    }
    md = markdown_sd.render_table1(t, {"device_name": "NVIDIA A10G"})
    assert "published: NVIDIA A10G" in md and "8.88" in md and "15.6 (x1.76)" in md


def test_cli_json_round_trips_and_plots_are_written(tmp_path, one_thread, capsys):
    from attnkit.bench.cli import main

    out = tmp_path / "out"
    rc = main(
        [
            "--preset",
            "tiny",
            "--tables",
            "1,4",
            "--processors",
            "vanilla,xformers",
            "--repeats",
            "1",
            "--steps",
            "2",
            "--no-progress",
            "--threads",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    stdout = capsys.readouterr().out
    assert "### 1." in stdout and "### 4." in stdout
    data = json.loads((out / "results.json").read_text())
    assert report.missing_fields(data) == []
    env = data["environment"]
    assert env["device"] == "cpu" and env["versions"]["torch"] and env["date"]
    assert env["command"].startswith("attnkit bench --preset tiny")
    assert set(data["tables"]) == {"1", "4"}
    assert data["tables"]["1"]["cells"]["vanilla"]["status"] == STATUS_OK
    assert data["tables"]["1"]["cells"]["xformers"]["status"] == "n/a"
    mem = data["tables"]["4"]["cells"]["vanilla"]  # measured in its own process
    assert mem["status"] == STATUS_OK and mem["peak_bytes"] >= mem["baseline_bytes"] > 0
    # table.md is a pure function of results.json
    assert report.render_markdown(data) == (out / "table.md").read_text()
    assert json.loads(json.dumps(data)) == data
    for png in ("it_per_s.png", "memory.png"):
        blob = (out / png).read_bytes()
        assert blob[:8] == b"\x89PNG\r\n\x1a\n" and len(blob) > 1000, png


def test_ladder_rows_and_plot(tiny, tmp_path):
    from attnkit.bench.tables import ladder

    t = ladder(_ctx(tiny, ["vanilla", "sdpa", "xformers"]))
    names = [r["name"] for r in t["rows"]]
    cl = "bf16 + channels_last"
    assert names == [
        "fp32",
        "bf16",
        cl,
        f"{cl} + torch.compile",
        f"{cl} + sdpa",
        f"{cl} + xformers",
        f"{cl} + torch.compile + sdpa",
        f"{cl} + torch.compile + xformers",
        f"{cl} + CUDA graphs + vanilla",
        f"{cl} + CUDA graphs + sdpa",
        f"{cl} + CUDA graphs + xformers",
    ]
    rows = {r["name"]: r for r in t["rows"]}
    assert t["rows"][0]["speedup_vs_fp32"] == pytest.approx(1.0)
    assert rows[f"{cl} + torch.compile"]["status"] == "skipped" and rows[f"{cl} + xformers"]["status"] == "n/a"
    assert rows[f"{cl} + torch.compile + sdpa"]["reason"] == "compile off (--compile)"
    assert all(r["seconds_median"] > 0 for r in t["rows"] if r["status"] == STATUS_OK)
    md = markdown_sd.render_table2(t, {})
    assert "original (fp32): 9.50 s" in md and "memory efficient attention: 2.63 s" in md
    # the CUDA-graph rows are not applicable on the CPU: said once, for all of them
    assert md.count("CUDA graphs need CUDA") == 1
    assert "bf16 + channels_last + CUDA graphs + (vanilla, sdpa)" in md
    results = {"environment": {"device_name": "cpu"}, "tables": {"2": t}}
    assert [os.path.basename(p) for p in plots.write_plots(results, str(tmp_path))[0]] == ["ladder.png"]


def _share(row: dict, key: str) -> float:
    measure = row["attention"][key]
    assert "share" in measure, (row["name"], measure)
    return measure["share"]


def test_ladder_compiled_rows_time_apart_profile_attention_and_match_eager(tiny):
    """Each processor gets an eager, a torch.compile and a CUDA-graph row; every row carries a
    number or a reason; compiled rows time their first call apart, say how they compiled,
    and match eager; every share of attention lies in (0, 1). aot_eager: torch.compile's
    tracing and decompositions without inductor's minutes of C++ compilation."""
    from attnkit.bench.tables import ladder

    ctx = _ctx(
        tiny,
        ["sdpa", "auto"],
        compile=True,
        compile_backend="aot_eager",
        ladder_rows=("eager", "compile", "cudagraphs"),
    )
    t = ladder(ctx)
    cl = "bf16 + channels_last"
    rows = {r["name"]: r for r in t["rows"]}
    assert list(rows) == [
        f"{cl} + sdpa",
        f"{cl} + auto",
        f"{cl} + torch.compile + sdpa",
        f"{cl} + torch.compile + auto",
        f"{cl} + CUDA graphs + sdpa",
        f"{cl} + CUDA graphs + auto",
    ]
    for name in ("sdpa", "auto"):
        eager, compiled, graphs = (
            rows[f"{cl} + {name}"],
            rows[f"{cl} + torch.compile + {name}"],
            rows[f"{cl} + CUDA graphs + {name}"],
        )
        assert eager["status"] == compiled["status"] == STATUS_OK, (eager, compiled)
        assert eager["it_per_s_median"] > 0 and compiled["it_per_s_median"] > 0
        assert 0 < _share(eager, "processor_calls") < 1 and 0 < _share(eager, "attention_kernels") < 1
        # the kernels are part of the processors' calls
        assert _share(eager, "attention_kernels") < _share(eager, "processor_calls")
        # compiled: the first call (tracing) is reported, not sampled; the ranges are gone, the ops are not
        assert compiled["first_call_seconds"] > 0 and compiled["samples"] == len(compiled["it_per_s"]) == 1
        assert compiled["compile"]["fullgraph"] is True and compiled["compile"]["backend"] == "aot_eager"
        assert "not attributable" in compiled["attention"]["processor_calls"]["reason"]
        assert 0 < _share(compiled, "attention_kernels") < 1
        assert compiled["check"]["matches"] is True and compiled["check"]["relative"] <= compiled["check"]["tolerance"]
        assert graphs["status"] == "n/a" and "CUDA graphs need CUDA" in graphs["reason"]
    md = markdown_sd.render_table2(t, {})
    assert "| first call s | attention: processor calls | attention kernels | compiled vs eager |" in md
    assert "(fullgraph)" in md and "matches (max rel. diff" in md
    fastest = next(line for line in md.splitlines() if line.startswith("Fastest row of each processor"))
    assert "sdpa " in fastest and "auto " in fastest


def _fake_compile(fail_fullgraph: bool, fail_always: bool = False, offset: float = 0.0):
    """A torch.compile stand-in: raises where asked, else returns the module (shifted by `offset`)."""

    def compile_(module, mode=None, fullgraph=False, backend=None):
        def fn(*args, **kwargs):
            if fail_always or (fullgraph and fail_fullgraph):
                raise RuntimeError(
                    "graph break in forward\n(a long explanation)"
                    if fullgraph
                    else "inductor exploded at codegen time\ntraceback"
                )
            out = module(*args, **kwargs)
            return (out[0] + offset,) + tuple(out[1:]) if offset else out

        return fn

    return compile_


@pytest.mark.parametrize("fail_always", [False, True])
def test_a_failing_compile_is_a_row_that_says_why(tiny, monkeypatch, fail_always):
    """fullgraph=True first; where it fails, without fullgraph (saying so); where that fails
    too, the row says why with the error's first line, and the bench goes on."""
    import attnkit.bench.context as context
    from attnkit.bench.tables import ladder

    monkeypatch.setattr(context.torch, "compile", _fake_compile(True, fail_always))
    t = ladder(_ctx(tiny, ["sdpa"], compile=True, ladder_rows=("compile", "eager")))
    compiled, eager = t["rows"]
    assert eager["status"] == STATUS_OK
    assert compiled["compile"]["fullgraph"] is False
    assert compiled["compile"]["fullgraph_error"] == "RuntimeError: graph break in forward"
    md = markdown_sd.render_table2(t, {})
    if fail_always:
        assert compiled["status"] == STATUS_FAILED
        assert compiled["reason"] == "RuntimeError: inductor exploded at codegen time"
        assert "failed: RuntimeError: inductor exploded at codegen time" in md
        assert "fullgraph=True failed first" in md
    else:
        assert compiled["status"] == STATUS_OK
        assert "not fullgraph (RuntimeError: graph break in forward)" in md


def test_a_compiled_row_that_differs_from_eager_says_so(tiny, monkeypatch):
    import attnkit.bench.context as context
    from attnkit.bench.tables import ladder

    monkeypatch.setattr(context.torch, "compile", _fake_compile(False, offset=1.0))
    t = ladder(_ctx(tiny, ["sdpa"], compile=True, ladder_rows=("compile",)))
    (row,) = t["rows"]
    assert row["check"]["matches"] is False and row["check"]["max_abs"] == pytest.approx(1.0, rel=1e-2)
    assert "DIFFERS" in markdown_sd.render_table2(t, {})


def test_an_interrupt_keeps_what_was_measured():
    def make(name, interrupt=False):
        def run(warmup):
            if interrupt and not warmup:
                raise KeyboardInterrupt
            return LoopTiming([0.1, 0.1])

        return Config(name, run)

    cells = measure_interleaved([make("a"), make("b", interrupt=True)], repeats=2, progress=False, strict=True)
    assert cells.interrupted
    assert cells["a"].status == STATUS_OK and len(cells["a"].it_per_s) == 1
    assert cells["b"].status == "skipped" and "interrupted" in cells["b"].reason


def test_sweep_plot_is_written(tmp_path):
    entry = {
        "batch": 1,
        "cells": {
            "vanilla": {"status": "ok", "it_per_s_median": 2.0},
            "sdpa": {"status": "ok", "it_per_s_median": 3.0},
        },
        "speedup_vs_vanilla": {"vanilla": 1.0, "sdpa": 1.5},
        "speedup_vs_xformers": {},
    }
    entry2 = {**entry, "batch": 2}
    results = {
        "environment": {"device_name": "cpu"},
        "tables": {
            "3": {
                "runs": [
                    {
                        "dtype": "fp32",
                        "compile": False,
                        "batches": [entry, entry2],
                        "max_batch": {"vanilla": 2, "sdpa": 2},
                        "oom_at": {},
                    }
                ]
            }
        },
    }
    paths, problems = plots.write_plots(results, str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ["batch_sweep.png"] and problems == []


def test_bad_arguments_exit_2(capsys):
    from attnkit.bench.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--tables", "5"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["--processors", "vanilla,nope"])
    assert exc.value.code == 2


def test_model_loads_from_a_local_directory(tiny, tmp_path):
    """--model: unet/, vae/ and scheduler/ of a pipeline folder, local files only."""
    from attnkit.bench.models import load_model

    preset, model = tiny
    model.unet.save_pretrained(tmp_path / "unet")
    model.vae.save_pretrained(tmp_path / "vae")
    model.scheduler.save_pretrained(tmp_path / "scheduler")
    loaded = load_model(str(tmp_path), "cpu", "float32")
    assert loaded.family == "sd" and str(tmp_path) in loaded.source
    sd, ld = model.unet.state_dict(), loaded.unet.state_dict()
    assert all(torch.equal(sd[k], ld[k]) for k in sd)
    timing = denoise(loaded, make_conditioning(loaded, 1, torch.float32), 2, preset.resolution)
    assert len(timing.step_seconds) == 2


def test_a_strict_deadline_skips_what_it_does_not_reach():
    from attnkit.bench.measure import Deadline

    calls = []

    def make(name):
        def run(warmup):
            calls.append((name, warmup))
            return LoopTiming([0.1])

        return Config(name, run)

    cells = measure_interleaved([make("a"), make("b")], repeats=3, progress=False, deadline=Deadline(0.0), strict=True)
    assert calls == [] and all(c.status == "skipped" and c.reason == "time budget" for c in cells.values())
    calls.clear()
    cells = measure_interleaved([make("a"), make("b")], repeats=2, progress=False, strict=True)
    assert calls == [("a", True), ("a", False), ("b", True), ("b", False), ("b", False), ("a", False)]
    # without strict: nothing is started past the deadline either, but every configuration
    # warmed up before it gets its first-round sample (test_interleaving_rotates...)
    cells = measure_interleaved([make("a"), make("b")], repeats=3, progress=False, deadline=Deadline(0.0))
    assert all(c.status == "skipped" for c in cells.values())


def test_the_headline_is_measured_first_and_the_references_last():
    from attnkit.bench.availability import resolve_names

    names = resolve_names(None)
    assert names[:2] == ["auto", "sdpa"] and names[-2:] == ["vanilla", "sliced"], names
    assert set(names) == set(attnkit.PROCESSOR_NAMES)
    assert resolve_names("sliced,auto") == ["sliced", "auto"]  # an explicit list keeps its order


def test_a_spent_budget_still_measures_the_headline_pair(tiny):
    """Budget 0: auto and sdpa get their sample, the slow references are marked skipped."""
    from attnkit.bench.availability import resolve_names

    names = [n for n in resolve_names(None) if n not in ("triton", "flash_attn", "xformers")]
    t = it_per_s(_ctx(tiny, names, budget=0.0))
    cells = t["cells"]
    assert list(cells) == ["auto", "sdpa", "vanilla", "sliced"]
    for name in ("auto", "sdpa"):
        assert cells[name]["status"] == STATUS_OK and cells[name]["samples"] == 1, cells[name]
    for name in ("vanilla", "sliced"):
        assert cells[name]["status"] == "skipped" and cells[name]["reason"] == "time budget", cells[name]
        assert cells[name]["samples"] == 0 and cells[name]["it_per_s"] == []
    md = markdown_sd.render_table1(t, {"device_name": "cpu"})
    assert "skipped (time budget)" in md and "best vs vanilla" in md


def test_work_is_admitted_only_where_it_fits_the_budget():
    """Warm-up 1 s and sample 3 s (virtual clock), predictions taken 1.5 times, budget 13 s:
    the first configuration, the second (7 s promised x 1.5 < 12 s left), not the third
    (10 x 1.5 > 11); one round, as the second (6 x 1.5) would not fit in 5 s."""
    from attnkit.bench.measure import MARGIN, Deadline

    assert MARGIN == 1.5

    now = [0.0]
    calls = []

    def make(name):
        def run(warmup):
            calls.append((name, warmup))
            now[0] += 1.0 if warmup else 3.0
            return LoopTiming([0.1])

        return Config(name, run)

    clock = lambda: now[0]  # noqa: E731
    cells = measure_interleaved(
        [make("a"), make("b"), make("c")],
        repeats=3,
        progress=False,
        deadline=Deadline(13.0, clock),
        sample_factor=3.0,
        clock=clock,
    )
    assert calls == [("a", True), ("b", True), ("a", False), ("b", False)], calls
    assert cells["c"].status == "skipped" and cells["c"].reason == "time budget"
    assert [len(cells[n].it_per_s) for n in "ab"] == [1, 1] and now[0] == 8.0
    # a larger budget: every round that fits runs, in alternating order
    now[0], calls[:] = 0.0, []
    cells = measure_interleaved(
        [make("a"), make("b")],
        repeats=3,
        progress=False,
        deadline=Deadline(24.0, clock),
        sample_factor=3.0,
        clock=clock,
    )
    assert [n for n, w in calls if not w] == ["a", "b", "b", "a", "a", "b"]


def test_a_warm_up_whose_first_step_compiles_does_not_inflate_the_prediction():
    """On a GPU the warm-up's first step holds compilation (2 s here) and the others take
    0.1 s: a 30-step timed run is predicted at 0.3 + 30 x 0.1 = 3.3 s, not 10 x 2.5 s, so
    the second configuration is admitted (found on an H200, where table 1 skipped the
    triton processor this way); the third is not, within a 20 s budget."""
    from attnkit.bench.measure import Deadline

    now = [0.0]
    calls = []

    def make(name):
        def run(warmup):
            calls.append((name, warmup))
            if warmup:
                now[0] += 2.5
                return LoopTiming([2.0, 0.1, 0.1])
            now[0] += 3.0
            return LoopTiming([0.1] * 30)

        return Config(name, run)

    clock = lambda: now[0]  # noqa: E731
    cells = measure_interleaved(
        [make("a"), make("b"), make("c")],
        repeats=3,
        progress=False,
        deadline=Deadline(20.0, clock),
        sample_factor=10.0,
        clock=clock,
    )
    # b: 3.3 promised + 2.5 + 3.3 = 9.1, x 1.5 < 17.5 left; c: 6.6 + 2.5 + 3.3 = 12.4, x 1.5 > 15
    assert cells["b"].status == STATUS_OK and cells["b"].warmup_seconds == 2.5
    assert cells["c"].status == "skipped" and cells["c"].reason == "time budget"
    assert [n for n, w in calls if not w][:2] == ["a", "b"]


def test_a_table_predicted_not_to_fit_is_skipped_with_its_reason(tiny):
    """Table 4's processes would rebuild the model (predicted 22 s) in a 5 s budget: skipped,
    not run; after a spent budget, a later table is skipped at its turn (the first still runs)."""
    from attnkit.bench.measure import Deadline
    from attnkit.bench.tables import run_tables

    ctx = _ctx(tiny, ["sdpa", "vanilla"], build_seconds=10.0, step_seconds=1.0)
    tables, _ = run_tables(ctx, ["4"], Deadline(20.0), lambda text: None)  # 22 s x 1.5 > 20 s
    assert tables["4"]["skipped"].startswith("time budget: the first pair of memory processes was predicted"), tables
    tables, _ = run_tables(ctx, ["1", "3"], Deadline(0.0), lambda text: None)
    assert [c["status"] for c in tables["1"]["cells"].values()] == [STATUS_OK, STATUS_OK]  # the headline pair
    assert "skipped" in tables["3"] and "time budget" in tables["3"]["skipped"]
    md = markdown.render_markdown(
        {
            "environment": {"device_name": "cpu", "versions": {}, "date": "d", "command": "c"},
            "preset": {"name": "tiny", "label": "tiny"},
            "model": {"source": "s"},
            "tables": tables,
            "budget_seconds": 1.0,
            "elapsed_seconds": 2.0,
        }
    )
    assert "### 3. batch-size sweep\n\nskipped (time budget" in md and "table(s) 3 skipped for the budget" in md


def test_the_gpu_tile_sweep_plans_every_candidate_once_defaults_first():
    """bench/gpu_tiles.py on a GPU runs a prefix of its plan in its time: the plan must hold
    each (lists, dtype, head dim, variant, causal, loads, candidate) once, every default
    before any other candidate, and --min-index 1 must leave out exactly the defaults."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "bench" / "gpu_tiles.py"
    spec = importlib.util.spec_from_file_location("gpu_tiles", path)
    gt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gt)
    only = dict(dtypes=("fp16", "fp32"), head_dims=(64, 384), variants=("none", "keypad_grad"))
    jobs = gt.plan("sm90", **only)
    keys = [tuple(sorted(j.items())) for j in jobs]
    assert len(keys) == len(set(keys))
    first_other = next(i for i, j in enumerate(jobs) if j["index"] > 0)
    assert all(j["index"] > 0 for j in jobs[first_other:]), "a default after another candidate"
    assert {j["lists"] for j in jobs[:first_other]} == {"sm90", "sm80"}
    # every kind of call, enumerated here, has every candidate of the longest list its
    # kernels use planned (TMA loads: the sm_90 lists, 16-bit only)
    kinds = [
        (lists, dt, D, variant, causal, loads)
        for lists in ("sm90", "sm80")
        for dt in only["dtypes"]
        for D in only["head_dims"]
        for variant in only["variants"]
        for causal in (False, True)
        for loads in (("tma", "ptr") if lists == "sm90" and dt != "fp32" else ("ptr",))
    ]
    for lists, dt, D, variant, causal, loads in kinds:
        n = max(gt.list_lengths(lists, dt, D, variant, causal, loads).values())
        mine = sorted(
            j["index"]
            for j in jobs
            if (j["lists"], j["dtype"], j["D"], j["variant"], j["causal"], j["loads"])
            == (lists, dt, D, variant, causal, loads)
        )
        assert mine == list(range(n))
    rest = gt.plan("sm90", min_index=1, **only)
    assert sorted(tuple(sorted(j.items())) for j in rest) == sorted(k for k in keys if dict(k)["index"] >= 1)
