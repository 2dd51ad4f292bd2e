"""Table 5's `attnkit int8` row: set_attention_backend("attnkit_int8") on a tiny bf16 Flux,
timed beside the others, its output compared with the `attnkit` row's (exact) in the
row's check. The int8 kernel runs in Triton's interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch

from attnkit.bench import markdown_dit
from attnkit.bench.context import Context
from attnkit.bench.dit import attention_modules, transformer_table
from attnkit.bench.dit_model import build_transformer
from attnkit.bench.presets import ROUTE_1, TransformerPreset

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter paths")

FLUX = (
    "flux_dev_transformer.json",
    {
        "num_layers": 1,
        "num_single_layers": 1,
        "num_attention_heads": 2,
        "attention_head_dim": 64,
        "axes_dims_rope": [16, 24, 24],
        "joint_attention_dim": 32,
        "pooled_projection_dim": 32,
    },
)


def test_the_int8_row_is_timed_and_says_how_far_it_is_from_exact():
    config, reduce = FLUX
    preset = TransformerPreset(
        name="flux-tiny-bf16",
        label="tiny flux bf16",
        family="flux",
        config=config,
        height=64,
        width=64,
        text_tokens=8,
        route=ROUTE_1,
        reduce=reduce,
        dtype="bfloat16",
        steps=2,
        repeats=2,
        warmup_steps=1,
    )
    model = build_transformer(preset, "cpu", seed=0)
    stock = {m: m.processor for m in attention_modules(model.transformer)}
    ctx = Context(
        model=model,
        preset=preset,
        processors=["attnkit", "attnkit int8"],
        device=torch.device("cpu"),
        device_name="cpu",
        progress=False,
    )
    table = transformer_table(ctx)
    cells = table["models"][0]["cells"]
    cell = cells["attnkit int8"]
    assert cell["status"] == "ok", cell
    check = cell["check"]
    assert check["lossy"] and check["finite"] and 0 < check["relative"] < 0.05, check
    assert "set_attention_backend('attnkit')" in check["against"]
    md = markdown_dit.render_table5(table, {"device_name": "cpu"})
    assert "lossy: max rel. diff" in md and "attnkit_int8" in md
    assert all(module.processor is proc for module, proc in stock.items())
