"""Inputs that once gave a wrong answer without an error, each with the test that caught it.

* Gradients of a query row whose keys are all masked by a large finite value
  (torch.finfo(torch.float32).min, -1e9): torch's CPU flash backward gave them N times
  too large; every backend is held to float64 autograd.
* The same mask in another dtype: a float32 mask given to a float16 / bfloat16 module was
  cast first, turning finfo(float32).min into -inf, so a fully masked row gave zeros in
  half precision and mean(V) in float32 (and in stock diffusers).
* An empty batch through the sliced backend.
* ATTNKIT_CHECK_FINITE=1 stops at the first attention with NaN or inf, naming it.
"""

from __future__ import annotations

import pytest
import torch
from diffusers.models.attention_processor import Attention

import attnkit
from attnkit.backends import get_backend
from attnkit.testing import assert_grads_close_to_reference, make_qkv

CPU_BACKENDS = [("sdpa", {}), ("vanilla", {}), ("sliced", {"slice_size": 2}), ("sdpa", {"kernel": "math"})]
HUGE = [torch.finfo(torch.float32).min, -1e9]


def _masked_rows_bias(b, h, m, n, value, dtype):
    """A random bias where query row 1 of batch 0 is fully masked by ``value`` and batch 1
    keeps only its first half of the keys."""
    bias = torch.randn(b, h, m, n).to(dtype)
    bias[0, :, 1, :] = value
    bias[1, :, :, n // 2 :] = value
    return bias


@pytest.mark.parametrize("value", HUGE, ids=["finfo-min", "-1e9"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("name,opts", CPU_BACKENDS, ids=["sdpa", "vanilla", "sliced", "sdpa-math"])
def test_gradients_of_rows_masked_by_large_finite_values(seed, name, opts, dtype, value):
    backend = get_backend(name, **opts)
    # The float64 reference keeps q.k only to |value| * eps64 next to such a bias: that
    # much (at most 1e-3) is rounding, not a wrong gradient; the defect was errors of N.
    floor = min(1e-3, 8 * abs(value) * torch.finfo(torch.float64).eps)
    for n in (5, 70):
        q, k, v = make_qkv(2, 2, 7, n, 16, dtype)
        bias = _masked_rows_bias(2, 2, 7, n, value, dtype)
        assert_grads_close_to_reference(
            lambda q, k, v, b, s: backend.forward(q, k, v, b, s), q, k, v, bias, floor=floor
        )


def test_auto_gradients_of_a_fully_masked_row(seed):
    """The case as a user meets it: the example of the report, through auto()."""
    proc = attnkit.auto()
    q, k, v = make_qkv(1, 1, 3, 5, 16, torch.float64, requires_grad=True)
    bias = torch.full((1, 1, 1, 5), torch.finfo(torch.float32).min, dtype=torch.float64)
    out = proc.chooser.attention(None, q, k, v, bias, None, False)
    out.sum().backward()
    assert v.grad.sum().item() == pytest.approx(48.0)  # 3 rows x 16 dims, weights summing to 1
    assert_grads_close_to_reference(
        lambda q, k, v, b, s: proc.chooser.attention(None, q, k, v, b, s, False), q, k, v, bias
    )


def _module(dtype):
    return Attention(query_dim=32, heads=2, dim_head=16).to(dtype).eval()


@pytest.mark.parametrize("name", ["sdpa", "vanilla", "sliced", "auto"])
@pytest.mark.parametrize("value", HUGE + [-1e30], ids=["finfo-min", "-1e9", "-1e30"])
def test_a_float32_mask_gives_the_same_answer_in_every_dtype(seed, name, value):
    """Row 1 of batch 0 is masked on every key by a finite value: float32 (and float64,
    and stock diffusers) average V over the keys; so must float16 and bfloat16."""
    attn32 = _module(torch.float32)
    x = torch.randn(2, 6, 32)
    mask = torch.zeros(2, 1, 6)
    mask[0, 0, :] = value  # every key of every query of batch 0...
    mask[1, 0, 3:] = value  # ...and the last keys of batch 1
    proc = attnkit.processor(name)
    attn32.set_processor(proc)
    outs = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        attn = _module(dtype)
        attn.load_state_dict(attn32.state_dict())
        attn.set_processor(proc)
        with torch.no_grad():
            outs[dtype] = attn(x.to(dtype), attention_mask=mask).float()  # the mask stays float32
    for dtype in (torch.float16, torch.bfloat16):
        assert torch.isfinite(outs[dtype]).all()
        err = (outs[dtype] - outs[torch.float32]).abs().max().item()
        scale = outs[torch.float32].abs().max().item()
        limit = {torch.float16: 1e-2, torch.bfloat16: 6e-2}[dtype] * scale  # a few units of rounding
        assert err <= limit, f"{dtype}: differs from float32 by {err:.3g} (limit {limit:.3g})"
        # and not the all-zero rows a -inf would give
        assert outs[dtype][0].abs().amax() > 0.1 * scale


@pytest.mark.parametrize(
    "name,opts",
    CPU_BACKENDS + [("sliced", {"slice_size": "max"})],
    ids=["sdpa", "vanilla", "sliced", "sdpa-math", "sliced-max"],
)
def test_an_empty_batch_gives_an_empty_output(name, opts):
    backend = get_backend(name, **opts)
    q, k, v = make_qkv(0, 2, 5, 7, 16)
    out = backend.forward(q, k, v)
    assert out.shape == (0, 2, 5, 16)
    proc = attnkit.processor(name, **opts)
    attn = _module(torch.float32)
    attn.set_processor(proc)
    assert attn(torch.randn(0, 5, 32)).shape == (0, 5, 32)


def test_check_finite_names_the_module(monkeypatch):
    monkeypatch.setenv("ATTNKIT_CHECK_FINITE", "1")
    proc = attnkit.auto()
    attn = _module(torch.float32)
    attn._attnkit_name = "transformer_blocks.3.attn1"
    attn.set_processor(proc)
    x = torch.randn(1, 6, 32)
    assert torch.isfinite(attn(x)).all()  # fine inputs pass
    x[0, 2, :] = float("nan")
    with pytest.raises(FloatingPointError, match=r"q of transformer_blocks\.3\.attn1 .* holds 32 non-finite"):
        attn(x)
    # a -inf mask is how masks say "ignore": not an error
    mask = torch.zeros(1, 1, 6)
    mask[..., 3:] = float("-inf")
    assert torch.isfinite(attn(torch.randn(1, 6, 32), attention_mask=mask)).all()


def test_check_finite_is_off_by_default(monkeypatch):
    monkeypatch.delenv("ATTNKIT_CHECK_FINITE", raising=False)
    attn = _module(torch.float32)
    attn.set_processor(attnkit.VanillaProcessor())
    x = torch.randn(1, 6, 32)
    x[0, 2, :] = float("nan")
    assert torch.isnan(attn(x)).any()  # propagated, not raised: the check costs a sync
