"""attnkit's backends as the local attention of context parallelism: the choosers' LSE
path keeps attnkit.parallel's contract (out and lse, differentiable through both,
causal offsets including negative ones, rows that see no key) as math_attention does."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit.backends import BackendUnavailable
from attnkit.parallel import math_attention
from attnkit.parallel.diffusers_cp import local_attention_for
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


def test_a_backend_without_lse_is_refused_with_its_reason(seed):
    local = local_attention_for(attnkit.SDPAProcessor().chooser)
    q, k, v = make_qkv(1, 1, 4, 4, 8)
    with pytest.raises(BackendUnavailable, match="cannot return the log-sum-exp"):
        local(q, k, v, None, None, None)
