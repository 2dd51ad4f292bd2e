"""launcher.plan_key: the one key of what the kernels keep per call (the eager calls'
CallPlans, the proof of their input checks, and the launch plans of the exact and int8
kernels, the proof of the shared-memory check). Every tensor's shape, strides, dtype, device and alignment, the call's
arguments, and for a plan the settings (launcher.settings(): the interpreter's and the two
environment variables a plan is built from) are in it: a change of any of them is a new
plan, never one built under the old value."""

from __future__ import annotations

import dataclasses
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
TileConfig = importlib.import_module("attnkit.kernels.flash.tile_config").TileConfig


def _qkv(dtype=torch.float32, d=16):
    return testing.make_qkv(1, 2, 9, 7, d, dtype)


def test_every_setting_and_environment_variable_is_in_the_key(monkeypatch):
    q, k, v = _qkv()
    monkeypatch.delenv("ATTNKIT_TRITON_AUTOTUNE", raising=False)
    monkeypatch.delenv("ATTNKIT_TILE_RECORDS", raising=False)
    base = launcher.plan_key("fwd", (q, k, v, None), 0.25)
    now = launcher.settings()
    changed = dict(
        interpret=not now.interpret,
        arch="sm80" if now.arch != "sm80" else "sm90",
        gpu="some-gpu",
        shipped_tiles=not now.shipped_tiles,
        interpret_tile=TileConfig(16, 16, 4, 1),
        candidates=lambda kernel, cands, tma: cands[:1],
        poison_outputs=not now.poison_outputs,
        allocate=lambda t, **kw: t.new_empty(t.shape),
        autotune=not now.autotune,
        tile_records=not now.tile_records,
        tile_rules=(),
        launch_through=lambda fn, grid, kwargs: None,
        direct_launch=lambda compiled, grid, stream, values: None,
    )
    fields = {f.name for f in dataclasses.fields(launcher.Settings)}
    assert set(changed) == fields, "a new setting: add it here"
    for name, value in changed.items():
        with launcher.override(**{name: value}):
            assert launcher.plan_key("fwd", (q, k, v, None), 0.25) != base, name
    for var in ("ATTNKIT_TRITON_AUTOTUNE", "ATTNKIT_TILE_RECORDS"):
        with monkeypatch.context() as m:
            m.setenv(var, "0")
            assert launcher.plan_key("fwd", (q, k, v, None), 0.25) != base, var
    assert launcher.plan_key("fwd", (q, k, v, None), 0.25) == base


def test_every_tensor_field_and_argument_is_in_the_key():
    q, k, v = _qkv()
    base = launcher.plan_key("fwd", (q, k, v, None), 0.25)
    flat = torch.randn(1 + v.numel())
    variants = {
        "another kind": launcher.plan_key("bwd", (q, k, v, None), 0.25),
        "another argument": launcher.plan_key("fwd", (q, k, v, None), 0.5),
        "v's head dim": launcher.plan_key("fwd", (q, k, _qkv(d=8)[2], None), 0.25),
        "v's dtype": launcher.plan_key("fwd", (q, k, v.double(), None), 0.25),
        "v's strides": launcher.plan_key("fwd", (q, k, v.transpose(1, 2).contiguous().transpose(1, 2), None), 0.25),
        "v's alignment": launcher.plan_key("fwd", (q, k, flat[1:].view(v.shape), None), 0.25),
        "a bias": launcher.plan_key("fwd", (q, k, v, torch.zeros(1, 1, 1, 7)), 0.25),
        "v's device": launcher.plan_key("fwd", (q, k, v.to("meta"), None), 0.25),
    }
    assert all(key != base for key in variants.values()), [n for n, key in variants.items() if key == base]
    assert launcher.plan_key("fwd", (q, k, v.clone(), None), 0.25) == base  # the same layout, another tensor


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter paths (settings().gpu)")
def test_turning_the_tile_rules_off_builds_a_new_plan_without_clear_plans(monkeypatch, seed):
    """A plan built while a GPU's recorded rule applied is not served once
    ATTNKIT_TILE_RECORDS=0 is set: the next call builds its own, with the shipped default."""
    h100 = "nvidia-h100-80gb-hbm3"
    monkeypatch.delenv("ATTNKIT_TILE_RECORDS", raising=False)
    rule = tr.TileRule(
        h100, "sm90", "fwd", "16bit", 64, "none", False, "tma", "float16", "M128-N64-w8-s3", "M128-N128-w8-s2",
        1, 1, 1.3, "made-up",
    )  # fmt: skip
    q, k, v = testing.make_qkv(1, 2, 150, 140, 64, torch.float16, layout="bnhd")
    settings = dict(gpu=h100, arch="sm90", shipped_tiles=True, tile_rules=(rule,))
    with torch.no_grad(), launcher.override(**settings), launcher.recording() as launches:
        first = flash_attention(q, k, v)
        monkeypatch.setenv("ATTNKIT_TILE_RECORDS", "0")
        second = flash_attention(q, k, v)
    ran = [x.description["tile_name"] for x in launches]
    shipped = str(select.configs_for("fwd", 64, torch.float16, "sm90", "none", False, True)[0])
    assert ran == ["M128-N64-w8-s3", shipped]
    assert_close_to_reference(first, q, k, v)
    assert_close_to_reference(second, q, k, v)
