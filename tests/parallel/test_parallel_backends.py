"""attnkit's backends as the local attention of context parallelism: the choosers' LSE
path keeps attnkit.parallel's contract (out and lse, differentiable through both,
causal offsets including negative ones, rows that see no key) as math_attention does."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit.backends import BackendUnavailable
from attnkit.diffusers.context_parallel import local_attention_for
from attnkit.parallel import math_attention
from attnkit.testing import make_bias, make_qkv, rel_error

CHOOSERS = {
    "auto": lambda: attnkit.auto().chooser,
    "vanilla": lambda: attnkit.processor("vanilla").chooser,
    "sliced": lambda: attnkit.processor("sliced", slice_size=1).chooser,
}


@pytest.fixture(autouse=True)
def _no_forced_backend(monkeypatch):
    monkeypatch.delenv("ATTNKIT_BACKEND", raising=False)


@pytest.mark.parametrize("offset", [None, 0, 3, -2, -9], ids=lambda o: f"causal{o}")
@pytest.mark.parametrize("name", list(CHOOSERS))
def test_local_attention_from_a_chooser(seed, name, offset):
    local = local_attention_for(CHOOSERS[name]())
    q, k, v = make_qkv(2, 2, 7, 9, 16, torch.float64, layout="bnhd", requires_grad=True)
    bias = make_bias("key_padding", 2, 2, 7, 9, torch.float64)
    out, lse = local(q, k, v, bias, 0.25, offset)
    ref_out, ref_lse = math_attention(*(t.detach().requires_grad_() for t in (q, k, v)), bias, 0.25, offset)
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))  # rows that see no key
    alive = torch.isfinite(ref_lse)
    assert rel_error(out, ref_out) <= 1e-12 and rel_error(lse[alive], ref_lse[alive]) <= 1e-12
    # gradients through both out and lse
    go, gl = torch.randn_like(out), torch.randn_like(lse).masked_fill(~alive, 0.0)
    got = torch.autograd.grad((out * go).sum() + (lse.nan_to_num(0.0, neginf=0.0) * gl).sum(), (q, k, v))
    q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
    o2, l2 = math_attention(q2, k2, v2, bias, 0.25, offset)
    want = torch.autograd.grad((o2 * go).sum() + (l2.nan_to_num(0.0, neginf=0.0) * gl).sum(), (q2, k2, v2))
    for g, w in zip(got, want):
        assert torch.isfinite(g).all() and rel_error(g, w) <= 1e-10


@pytest.mark.parametrize("offset", [None, 0, 2, -3], ids=lambda o: f"causal{o}")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_sdpa_lse_for_inference(seed, dtype, offset):
    """Without gradients (inference), torch's CPU flash kernel serves the local attention
    with its log-sum-exp; with them, SDPA refuses and auto() walks on to sliced."""
    local = local_attention_for(attnkit.SDPAProcessor().chooser)
    q, k, v = make_qkv(2, 2, 7, 9, 16, dtype, layout="bnhd")
    bias = make_bias("key_padding", 2, 2, 7, 9, dtype)
    bias[1] = float("-inf")  # batch item 1 sees no key
    with torch.no_grad():
        out, lse = local(q, k, v, bias, 0.25, offset)
    ref_out, ref_lse = math_attention(q.double(), k.double(), v.double(), bias.double(), 0.25, offset)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    alive = torch.isfinite(ref_lse)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    assert rel_error(out, ref_out) <= tol and rel_error(lse[alive], ref_lse[alive]) <= tol
    q.requires_grad_(True)
    with pytest.raises(BackendUnavailable, match="no gradient"):
        local(q, k, v, bias, 0.25, offset)
    auto = local_attention_for(attnkit.auto().chooser)
    auto(q, k, v, bias, 0.25, offset)  # with gradients: sliced


@pytest.mark.parametrize("offset", [None, 0, 3, -2], ids=lambda o: f"causal{o}")
def test_triton_as_the_local_attention(seed, offset):
    """attnkit's Triton kernel (run by Triton's interpreter here) through the chooser:
    out and lse, causal offsets included, and gradients through both, within the
    tolerance rule of float32 math against float64."""
    local = local_attention_for(attnkit.TritonProcessor().chooser)
    q, k, v = make_qkv(1, 2, 9, 11, 16, torch.float32, layout="bnhd", requires_grad=True)
    bias = make_bias("key_padding", 1, 2, 9, 11, torch.float32)
    out, lse = local(q, k, v, bias, 0.3, offset)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_out, ref_lse = math_attention(q64, k64, v64, bias.double(), 0.3, offset)
    base_out, base_lse = math_attention(*(t.detach() for t in (q, k, v)), bias, 0.3, offset)
    alive = torch.isfinite(ref_lse)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    assert rel_error(out, ref_out) <= 2 * rel_error(base_out, ref_out) + 1e-6
    assert rel_error(lse[alive], ref_lse[alive]) <= 2 * rel_error(base_lse[alive], ref_lse[alive]) + 1e-6
    go = torch.randn(out.shape, dtype=torch.float64)
    gl = torch.randn(lse.shape, dtype=torch.float64).masked_fill(~alive, 0.0)

    def grads(out, lse, leaves, dtype):
        loss = (out * go.to(dtype)).sum() + (lse.masked_fill(~alive, 0.0) * gl.to(dtype)).sum()
        return torch.autograd.grad(loss, leaves)

    got = grads(out, lse, (q, k, v), torch.float32)
    want = grads(ref_out, ref_lse, (q64, k64, v64), torch.float64)
    q32, k32, v32 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    base = grads(*math_attention(q32, k32, v32, bias, 0.3, offset), (q32, k32, v32), torch.float32)
    for g, w, b in zip(got, want, base):  # the tolerance rule: 2x float32 math's error
        assert torch.isfinite(g).all() and rel_error(g, w) <= 2 * rel_error(b, w) + 1e-6
