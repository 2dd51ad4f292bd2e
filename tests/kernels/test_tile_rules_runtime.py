"""The launcher runs a GPU's recorded default tile (attnkit/kernels/tile_rules.py)
where a rule covers the call: that GPU, the list, the dtype, lengths at least the rule's;
everything else keeps the shipped default, and ATTNKIT_TILE_RECORDS=0 turns the rules off.
In the interpreter the GPU is launcher.settings().gpu and the target settings().arch."""

from __future__ import annotations

import importlib

import pytest
import torch

from attnkit import testing
from attnkit.testing import assert_close_to_reference

triton = pytest.importorskip("triton")

from attnkit.kernels import flash_attention  # noqa: E402

launcher = importlib.import_module("attnkit.kernels.launcher")
select = importlib.import_module("attnkit.kernels.flash.select")
tr = importlib.import_module("attnkit.kernels.tile_rules")

H100 = "nvidia-h100-80gb-hbm3"
CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter paths (settings().gpu)")
H100_SETTINGS = dict(gpu=H100, arch="sm90", shipped_tiles=True)


@pytest.fixture
def h100(monkeypatch):
    monkeypatch.delenv("ATTNKIT_TILE_RECORDS", raising=False)
    with launcher.override(**H100_SETTINGS):
        yield


def _tile(kernel="fwd", d=64, dtype=torch.float16, variant="none", causal=False, tma=True, lengths=(4096, 4096)):
    return str(select.kernel_for(kernel, d, dtype, CPU, variant, causal, tma, lengths)[1])


def test_a_recorded_gpu_runs_its_recorded_default_where_the_rule_covers_the_call(h100, monkeypatch):
    assert _tile() == _tile(d=40) == _tile(lengths=(8192, 4096)) == "M128-N64-w8-s3"
    assert _tile("dkdv") == "M32-N64-w4-s2" and _tile("dq") == "M64-N64-w4-s2"
    shipped = str(select.configs_for("fwd", 64, torch.float16, "sm90", "none", False, True)[0])
    assert shipped == "M128-N128-w8-s2"
    # what the rules do not cover keeps the shipped default
    assert _tile(lengths=(4096, 77)) == shipped  # shorter than any timed call
    assert _tile(dtype=torch.bfloat16) == shipped  # only fp16 was timed
    assert _tile(variant="keypad") == str(
        select.configs_for("fwd", 64, torch.float16, "sm90", "keypad", False, True)[0]
    )
    assert _tile(causal=True) == str(select.configs_for("fwd", 64, torch.float16, "sm90", "none", True, True)[0])
    assert _tile(d=128) == str(select.configs_for("fwd", 128, torch.float16, "sm90", "none", False, True)[0])
    with launcher.override(gpu="nvidia-h200"):  # a GPU whose records logged no choices
        assert _tile() == shipped
    monkeypatch.setenv("ATTNKIT_TILE_RECORDS", "0")
    assert _tile() == shipped


def test_a_recorded_default_runs_and_matches_float64(h100, monkeypatch, seed):
    """A rule made up to cover a call small enough for the interpreter: the launch plan
    runs the recorded tile, and the answer is right."""
    rule = tr.TileRule(
        H100,
        "sm90",
        "fwd",
        "16bit",
        64,
        "none",
        False,
        "tma",
        "float16",
        "M128-N64-w8-s3",
        "M128-N128-w8-s2",
        1,
        1,
        1.3,
        "made-up",
    )
    q, k, v = testing.make_qkv(1, 2, 150, 140, 64, torch.float16, layout="bnhd")
    with torch.no_grad(), launcher.override(tile_rules=(rule,)), launcher.recording() as launches:
        out = flash_attention(q, k, v)
    assert [(x.kernel, x.description["tile_name"]) for x in launches] == [("fwd", "M128-N64-w8-s3")]
    assert_close_to_reference(out, q, k, v)
