"""Table 5 of `attnkit bench`: transformer models, one column per way of setting attention.

Tiny versions of the presets' model classes (seconds on the CPU). What is promised: every
column is measured or says why not (never a crash, never a silent stock run under another
name), the model gets its stock processors back, diffusers' process-wide backend is left
as it was, and the shipped configs are the real models'.
"""

from __future__ import annotations

import json

import pytest
import torch

from attnkit.bench import markdown_dit
from attnkit.bench.context import Context
from attnkit.bench.dit import attention_modules, transformer_table
from attnkit.bench.dit_model import build_transformer
from attnkit.bench.dit_settings import SETTINGS
from attnkit.bench.models import load_config
from attnkit.bench.presets import ROUTE_1, ROUTE_2, TransformerPreset, get_preset

TINY = {
    "flux": (
        "flux_dev_transformer.json",
        {
            "num_layers": 1,
            "num_single_layers": 1,
            "num_attention_heads": 2,
            "attention_head_dim": 16,
            "axes_dims_rope": [4, 6, 6],
            "joint_attention_dim": 32,
            "pooled_projection_dim": 32,
        },
        {},
    ),
    "sd3": (
        "sd3_medium_transformer.json",
        {
            "num_layers": 1,
            "num_attention_heads": 2,
            "attention_head_dim": 16,
            "caption_projection_dim": 32,
            "joint_attention_dim": 32,
            "pooled_projection_dim": 32,
            "pos_embed_max_size": 16,
            "sample_size": 8,
        },
        {},
    ),
    "wan": (
        "wan21_t2v_1.3b_transformer.json",
        {
            "num_layers": 1,
            "num_attention_heads": 2,
            "attention_head_dim": 16,
            "ffn_dim": 32,
            "text_dim": 32,
            "freq_dim": 32,
            "rope_max_seq_len": 32,
        },
        {"frames": 5},
    ),
}


def _tiny(family: str) -> TransformerPreset:
    config, reduce, extra = TINY[family]
    return TransformerPreset(
        name=f"{family}-tiny",
        label=f"tiny {family}",
        family=family,
        config=config,
        height=64,
        width=64,
        text_tokens=8,
        route=ROUTE_2 if family == "sd3" else ROUTE_1,
        reduce=reduce,
        dtype="float32",
        steps=2,
        repeats=2,
        warmup_steps=1,
        **extra,
    )


def _active_backend():
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    return _AttentionBackendRegistry.get_active_backend()


@pytest.fixture(scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("family", ["flux", "wan", "sd3"])
def test_every_column_is_measured_or_says_why(family, one_thread):
    preset = _tiny(family)
    model = build_transformer(preset, "cpu", seed=0)
    out = model.forward(model.latents, 1.0)
    assert out.shape == model.latents.shape and torch.isfinite(out).all() and out.abs().sum() > 0
    stock = {m: m.processor for m in attention_modules(model.transformer)}
    active = _active_backend()
    ctx = Context(
        model=model,
        preset=preset,
        processors=list(SETTINGS),
        device=torch.device("cpu"),
        device_name="cpu",
        progress=False,
    )
    table = transformer_table(ctx)
    (m,) = table["models"]
    cells = m["cells"]
    assert list(cells) == list(SETTINGS)
    for name, cell in cells.items():
        if cell["status"] == "ok":
            assert cell["samples"] == len(cell["step_seconds"]) == 2 and cell["where"], (name, cell)
        else:
            assert cell["status"] in ("n/a", "failed") and cell["reason"], (name, cell)
    assert cells["stock"]["status"] == "ok"
    if family == "sd3":  # JointAttnProcessor2_0 calls SDPA itself: set_attention_backend reaches nothing
        assert m["route"] == ROUTE_2
        assert (
            cells["native"]["status"] == "n/a"
            and "reaches none of the 1 attention modules" in cells["native"]["reason"]
        )
    else:
        assert m["route"] == ROUTE_1
        assert cells["native"]["status"] == "ok"
        assert cells["native"]["where"] == f"{len(stock)} of {len(stock)} attention modules"
        assert set(m["ratio_vs"]["native"]) >= {"native", "stock"}
    # diffusers' own kernels are not installed here (or cannot run on the CPU): said, not timed as stock
    for name in ("flash", "sage"):
        assert cells[name]["status"] != "ok" or torch.cuda.is_available(), cells[name]
    # the model is handed back as it was built, and diffusers' active backend is untouched
    assert all(module.processor is proc for module, proc in stock.items())
    assert all(getattr(p, "_attention_backend", None) is None for p in stock.values())
    assert _active_backend() == active
    md = markdown_dit.render_table5(table, {"device_name": "cpu"})
    assert f"### 5. Transformer forward per step: tiny {family}" in md
    assert "Target: attnkit at most x1.02 of diffusers' native per step." in md


def test_transformer_presets_are_checked_on_the_command_line():
    from attnkit.bench.cli import main

    for argv in (
        ["--preset", "flux-cpu", "--processors", "sdpa"],
        ["--preset", "wan-cpu", "--tables", "1"],
        ["--preset", "cpu-small", "--attention", "native"],
        ["--preset", "sd3", "--attention", "nope"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2, argv
    assert get_preset("flux", "cuda").name == "flux-dev" and get_preset("flux", "cpu").name == "flux-cpu"


@pytest.mark.parametrize(
    "name, billions", [("flux-dev", (11.8, 12.0)), ("sd3-medium", (2.0, 2.1)), ("wan-1.3b", (1.3, 1.45))]
)
def test_full_size_presets_are_the_published_models(name, billions):
    """The shipped configs build the published sizes (on the meta device: no memory)."""
    import diffusers

    preset = get_preset(name)
    config = load_config(preset.config)
    assert config["_source"].endswith("config.json (public)") and not preset.reduce
    with torch.device("meta"):
        model = getattr(diffusers, config["_class_name"]).from_config(
            {k: v for k, v in config.items() if not k.startswith("_")}
        )
    count = sum(p.numel() for p in model.parameters()) / 1e9
    assert billions[0] <= count <= billions[1], count
    json.dumps(preset.to_dict())  # results.json holds it


@pytest.mark.parametrize("compile_", [True, False])
def test_the_compiled_row_is_measured_and_matches_eager_or_says_why(compile_, one_thread):
    """Table 5's compiled row: fullgraph first (saying which was used), its first call apart,
    its output against the same model eager, attention's share of a forward; with compile
    off, a reason. aot_eager: torch.compile's tracing without inductor's minutes."""
    preset = _tiny("flux")
    model = build_transformer(preset, "cpu", seed=0)
    names = ["native", "attnkit", "attnkit + torch.compile"]
    ctx = Context(
        model=model,
        preset=preset,
        processors=names,
        device=torch.device("cpu"),
        device_name="cpu",
        progress=False,
        compile=compile_,
        compile_backend="aot_eager",
    )
    table = transformer_table(ctx)
    cells = table["models"][0]["cells"]
    assert list(cells) == names
    row = cells["attnkit + torch.compile"]
    md = markdown_dit.render_table5(table, {"device_name": "cpu"})
    if not compile_:
        assert row["status"] == "skipped" and row["reason"] == "compile off (--compile)"
        assert "skipped (compile off (--compile))" in md
        return
    for name in ("native", "attnkit"):  # eager rows: the processors' calls and the kernels inside them
        share = cells[name]["attention"]
        assert 0 < share["attention_kernels"]["share"] <= share["processor_calls"]["share"] < 1, share
    if row["status"] != "ok":  # a compile that fails is a row that says why
        assert row["status"] == "failed" and row["reason"], row
        assert row["compile"]["fullgraph"] is False and row["compile"]["fullgraph_error"]
        return
    assert row["samples"] == 2 and row["first_call_seconds"] > 0
    assert row["compile"]["fullgraph"] in (True, False)
    assert row["compile"]["fullgraph"] or row["compile"]["fullgraph_error"]
    assert row["check"]["matches"] is True, row["check"]
    assert "not attributable" in row["attention"]["processor_calls"]["reason"]
    assert 0 < row["attention"]["attention_kernels"]["share"] < 1
    assert "| first call s | attention: processor calls | attention kernels | compiled vs eager |" in md
    # the model is handed back as built (the compiled row set attnkit's backend on it)
    assert all(getattr(m.processor, "_attention_backend", None) is None for m in attention_modules(model.transformer))
