"""attnkit/kernels/launcher.py: the settings a launch is built under, the launch plans'
table, what a plan says of itself, and the direct launch, checked once per compiled
kernel against Triton's own launch.

Triton compiles nothing on the CPU, so the compiled kernel a first launch returns is a
stand-in: Triton's interpreter runs the kernel for Triton's own launch, and the stand-in's
launcher binds the values of the direct launch to the kernel's arguments by their place,
as Triton's launcher does, and runs it the same way. A stand-in that misorders its
arguments is what a Triton whose launcher signature changed would be."""

from __future__ import annotations

import importlib
import types
import warnings

import pytest
import torch

from attnkit.testing import make_bias, make_qkv, reference_attention, rel_error

triton = pytest.importorskip("triton")

from attnkit.kernels import flash_attention  # noqa: E402

launcher = importlib.import_module("attnkit.kernels.launcher")

pytestmark = pytest.mark.skipif(not launcher.INTERPRETED, reason="runs the kernels in Triton's interpreter")


class _StandIn:
    """A stand-in for the kernel Triton compiles: its launcher takes the kernel's
    arguments in their declared order and runs the interpreted kernel with them, after
    `misorder` (the identity for a faithful one)."""

    def __init__(self, jit, misorder=None, fail=False):
        self.src = types.SimpleNamespace(fn=jit)
        self.function = self.packed_metadata = None
        self.misorder, self.fail, self.runs = misorder, fail, 0

    def run(self, g0, g1, g2, stream, function, metadata, launch_metadata, enter, exit_, *values):
        self.runs += 1
        if self.fail:
            raise TypeError("run() takes 12 positional arguments but 64 were given")
        names = list(self.src.fn.arg_names)
        if self.misorder:
            values = list(values)
            i, j = (names.index(n) for n in self.misorder)
            values[i], values[j] = values[j], values[i]
        self.src.fn[(g0, g1, g2)](**dict(zip(names, values)))


def _through(stand_ins: list, **kw):
    """A stand-in for Triton's own launch: the interpreter runs the kernel; the compiled
    kernel it returns is a _StandIn, one a kernel (as Triton's cache returns the same)."""
    by_kernel: dict = {}

    def launch(fn, grid, kwargs):
        fn[grid](**kwargs)
        if fn not in by_kernel:
            by_kernel[fn] = _StandIn(fn, **kw)
            stand_ins.append(by_kernel[fn])
        return by_kernel[fn]

    return launch


def _calls(n: int, seed: int):
    torch.manual_seed(seed)
    q, k, v = make_qkv(1, 2, 37, 45, 16, torch.float32)
    bias = make_bias("key_padding", 1, 2, 37, 45, torch.float32)
    ref = reference_attention(q.double(), k.double(), v.double(), bias.double())
    return [flash_attention(q, k, v, bias) for _ in range(n)], ref


def test_a_faithful_direct_launch_is_checked_once_and_then_trusted(seed):
    stand_ins: list = []
    with launcher.override(launch_through=_through(stand_ins)), warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning
        outs, ref = _calls(4, seed)
    # The key-lengths pass and the forward: each compiled once, each checked on its first
    # direct launch (call 2) and launched directly from then on (calls 2, 3, 4).
    assert [s.src.fn.fn.__name__ for s in stand_ins] == ["_key_lengths_kernel", "_attn_fwd"]
    assert [s.runs for s in stand_ins] == [3, 3]
    assert all(launcher.direct_checked(s) is True for s in stand_ins)
    for out in outs:
        assert torch.equal(out, outs[0]) and rel_error(out, ref) < 1e-5


@pytest.mark.parametrize("how", ["misordered", "failing"])
def test_a_direct_launch_that_differs_from_tritons_is_dropped_with_one_warning(how, seed):
    """A direct launch whose outputs differ from Triton's own launch of the same call (its
    launcher takes the arguments in another order), or that fails: the call's results are
    Triton's, one warning names the Triton version, and that kernel launches through
    Triton for good."""
    stand_ins: list = []
    kw = dict(misorder=("qk_scale", "sm_scale")) if how == "misordered" else dict(fail=True)
    with launcher.override(launch_through=_through(stand_ins, **kw)):
        with pytest.warns(RuntimeWarning, match=f"Triton {triton.__version__}") as caught:
            outs, ref = _calls(4, seed)
    forward = [s for s in stand_ins if s.src.fn.fn.__name__ == "_attn_fwd"]
    assert len(forward) == 1 and forward[0].runs == 1  # tried once, never again
    assert launcher.direct_checked(forward[0]) is False
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 1 and "any other kernel found so" in said[0], said  # one warning for the launcher
    for out in outs:  # every call's result is Triton's launch's
        assert torch.equal(out, outs[0]) and rel_error(out, ref) < 1e-5


def test_settings_are_changed_only_inside_override_and_key_the_plans(monkeypatch):
    base = launcher.settings()
    assert launcher.settings() is base  # read once, kept while nothing changed
    with launcher.override(arch="sm80", poison_outputs=True) as inside:
        assert inside.arch == "sm80" and inside.poison_outputs and launcher.settings() is inside
        key = launcher.plan_key("k", (torch.zeros(2),), 1)
    assert launcher.settings() == base
    assert launcher.plan_key("k", (torch.zeros(2),), 1) != key  # another plan outside
    with pytest.raises(TypeError, match="no such setting"):
        with launcher.override(interpreter=False):
            pass
    # The two environment variables, read once a call into the settings.
    monkeypatch.setenv("ATTNKIT_TRITON_AUTOTUNE", "0")
    monkeypatch.setenv("ATTNKIT_TILE_RECORDS", "0")
    assert not launcher.settings().autotune and not launcher.settings().tile_records
    with launcher.override(autotune=True):  # a named setting wins over its variable
        assert launcher.settings().autotune
    monkeypatch.delenv("ATTNKIT_TRITON_AUTOTUNE")
    assert launcher.settings().autotune


def test_a_call_records_and_describes_its_launches(seed):
    torch.manual_seed(seed)
    q, k, v = make_qkv(1, 2, 37, 45, 16, torch.float16, requires_grad=True)
    bias = make_bias("key_padding", 1, 2, 37, 45, torch.float32)
    with launcher.override(arch="sm80"), launcher.recording() as seen:
        out = flash_attention(q, k, v, bias, causal=True)
        out.sum().backward()
    kernels = [x.kernel for x in seen]
    assert kernels == ["lengths", "fwd_lo", "delta", "lengths", "dkdv", "dq"], kernels
    fwd = seen[1].description
    assert fwd["tile"] == (32, 32, 4, 1, False) and fwd["causal"] is True and fwd["tma"] is False
    assert fwd["grid"] == (2, 2, 1) and fwd["bias"] == 1  # ceil(37 / 32) row blocks, 2 heads, 1 batch
    assert seen[1].arguments["Q"] is not None and seen[1].arguments["M"] == 37
