"""launch.call_key and plan_key: the one key of what the kernels keep per call (the launch
plans of the exact and int8 kernels by plan_key; the input and shared-memory checks by
call_key). Every tensor's shape, strides, dtype, device and alignment, the call's
arguments, and for a plan the interpreter's switches and the two environment variables a
plan is built from are in it: a change of any of them is a new plan, never one built
under the old value."""

from __future__ import annotations

import importlib

import pytest
import torch

from attnkit import testing
from attnkit.testing import assert_close_to_reference

triton = pytest.importorskip("triton")

from attnkit.kernels import flash_attention  # noqa: E402

fl = importlib.import_module("attnkit.kernels.flash.launch")
tr = importlib.import_module("attnkit.kernels.tile_records")


def _qkv(dtype=torch.float32, d=16):
    return testing.make_qkv(1, 2, 9, 7, d, dtype)


def test_every_switch_and_environment_variable_is_in_the_key(monkeypatch):
    q, k, v = _qkv()
    monkeypatch.delenv("ATTNKIT_TRITON_AUTOTUNE", raising=False)
    monkeypatch.delenv("ATTNKIT_TILE_RECORDS", raising=False)
    base = fl.plan_key("fwd", (q, k, v, None), 0.25)
    for name, value in (
        ("INTERPRET_ARCH", "sm80" if fl.INTERPRET_ARCH != "sm80" else "sm90"),
        ("INTERPRET_SHIPPED_TILES", not fl.INTERPRET_SHIPPED_TILES),
        ("INTERPRET_GPU", "some-gpu"),
        ("POISON_OUTPUTS", not fl.POISON_OUTPUTS),
    ):
        with monkeypatch.context() as m:
            m.setattr(fl, name, value)
            assert fl.plan_key("fwd", (q, k, v, None), 0.25) != base, name
    for var in ("ATTNKIT_TRITON_AUTOTUNE", "ATTNKIT_TILE_RECORDS"):
        with monkeypatch.context() as m:
            m.setenv(var, "0")
            assert fl.plan_key("fwd", (q, k, v, None), 0.25) != base, var
    assert fl.plan_key("fwd", (q, k, v, None), 0.25) == base


def test_every_tensor_field_and_argument_is_in_the_key():
    q, k, v = _qkv()
    base = fl.plan_key("fwd", (q, k, v, None), 0.25)
    flat = torch.randn(1 + v.numel())
    variants = {
        "another kind": fl.plan_key("bwd", (q, k, v, None), 0.25),
        "another argument": fl.plan_key("fwd", (q, k, v, None), 0.5),
        "v's head dim": fl.plan_key("fwd", (q, k, _qkv(d=8)[2], None), 0.25),
        "v's dtype": fl.plan_key("fwd", (q, k, v.double(), None), 0.25),
        "v's strides": fl.plan_key("fwd", (q, k, v.transpose(1, 2).contiguous().transpose(1, 2), None), 0.25),
        "v's alignment": fl.plan_key("fwd", (q, k, flat[1:].view(v.shape), None), 0.25),
        "a bias": fl.plan_key("fwd", (q, k, v, torch.zeros(1, 1, 1, 7)), 0.25),
        "v's device": fl.plan_key("fwd", (q, k, v.to("meta"), None), 0.25),
    }
    assert all(key != base for key in variants.values()), [n for n, key in variants.items() if key == base]
    assert fl.plan_key("fwd", (q, k, v.clone(), None), 0.25) == base  # the same layout, another tensor


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter paths (INTERPRET_GPU)")
def test_turning_the_tile_rules_off_builds_a_new_plan_without_clear_plans(monkeypatch, seed):
    """A plan built while a GPU's recorded rule applied is not served once
    ATTNKIT_TILE_RECORDS=0 is set: the next call builds its own, with the shipped default."""
    h100 = "nvidia-h100-80gb-hbm3"
    monkeypatch.setattr(fl, "INTERPRET_GPU", h100)
    monkeypatch.setattr(fl, "INTERPRET_ARCH", "sm90")
    monkeypatch.setattr(fl, "INTERPRET_SHIPPED_TILES", True)
    monkeypatch.delenv("ATTNKIT_TILE_RECORDS", raising=False)
    rule = tr.TileRule(
        h100, "sm90", "fwd", "16bit", 64, "none", False, "tma", "float16", "M128-N64-w8-s3", "M128-N128-w8-s2",
        1, 1, 1.3, "made-up",
    )  # fmt: skip
    monkeypatch.setattr(fl, "TILE_RULES", (rule,))
    ran = []
    real = fl._kernel_for

    def spy(kernel, *args):
        fn, cfg = real(kernel, *args)
        ran.append(str(cfg))
        return fn, cfg

    monkeypatch.setattr(fl, "_kernel_for", spy)
    q, k, v = testing.make_qkv(1, 2, 150, 140, 64, torch.float16, layout="bnhd")
    with torch.no_grad():
        first = flash_attention(q, k, v)
        monkeypatch.setenv("ATTNKIT_TILE_RECORDS", "0")
        second = flash_attention(q, k, v)
    shipped = str(fl.configs_for("fwd", 64, torch.float16, "sm90", "none", False, True)[0])
    assert ran == ["M128-N64-w8-s3", shipped]
    assert_close_to_reference(first, q, k, v)
    assert_close_to_reference(second, q, k, v)
