"""auto(lossy="int8"): the INT8 backend first where it can serve a call, under the quality
guard (attnkit/choose/guard.py), which checks sampled rows against an exact backend and
falls back by itself. The kernels run in Triton's interpreter (tests/conftest.py)."""

from __future__ import annotations

import logging

import pytest
import torch

import attnkit
from attnkit.choose.auto import AutoChooser
from attnkit.choose.guard import DEFAULTS, compare, sample_inputs, sample_rows
from attnkit.testing import make_bias, make_qkv, reference_attention, rel_error

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter paths")


def _attend(chooser, who, q, k, v, bias=None, causal_offset=None):
    with torch.no_grad():
        return chooser.attention(who, q, k, v, bias, None, False, causal_offset=causal_offset)


def _state(chooser, module):
    (state,) = [s for s in chooser.guard_states() if s.module == module]
    return state


def test_lossy_serves_well_behaved_calls_and_explain_marks_it(seed):
    chooser = AutoChooser(lossy="int8")
    q, k, v = make_qkv(1, 2, 64, 80, 64, torch.float16)
    out = _attend(chooser, "blocks.0.attn1", q, k, v)
    assert rel_error(out, reference_attention(q, k, v)) < 0.03
    state = _state(chooser, "blocks.0.attn1")
    assert (state.calls, state.checks, state.fallen_back) == (1, 1, False) and state.error < 0.03
    text = chooser.explain()
    assert "LOSSY: INT8" in text and "blocks.0.attn1" in text and "relative L2 error" in text
    assert "lossy='int8'" in chooser.describe()


def test_auto_without_lossy_never_runs_int8(monkeypatch, seed):
    import attnkit.kernels.int8.ops as int8_ops

    def boom(*a, **k):
        raise AssertionError("int8 ran without being asked for")

    monkeypatch.setattr(int8_ops, "int8_attention", boom)
    chooser = AutoChooser()
    q, k, v = make_qkv(1, 2, 16, 16, 64, torch.float16)
    _attend(chooser, "m", q, k, v)
    assert chooser.guard_states() == [] and "LOSSY" not in chooser.explain()


def test_a_call_int8_cannot_serve_runs_exactly_and_says_why(seed):
    chooser = AutoChooser(lossy="int8")
    q, k, v = make_qkv(1, 2, 16, 16, 64, torch.float16, requires_grad=True)
    out = chooser.attention("m", q, k, v, None, None, False)  # under autograd
    assert out.requires_grad and chooser.guard_states() == []
    assert "int8 cannot serve" in chooser.explain() and "backward is not supported" in chooser.explain()
    q32, k32, v32 = make_qkv(1, 2, 16, 16, 64, torch.float32)
    _attend(chooser, "m", q32, k32, v32)
    assert chooser.guard_states() == []


def _outlier_queries(q, k):
    """Q with one channel 2000 wide and K constant on it: the exact attention does not see
    that channel (it shifts every score of a row alike), but Q's per-token scale becomes
    2000/127, and the other channels round to 0."""
    q = q.clone()
    k = k.clone()
    q[..., 3] = 2000.0
    k[..., 3] = 1.0
    return q, k


def _huge_key(q, k):
    """One key 3000 wide on a channel no query uses: the exact attention treats it as any
    other key (its score is 0), but K's mean over tokens, which the smoothing takes out,
    is then mostly that key, and every other key's scale covers it."""
    q, k = q.clone(), k.clone()
    k[:, :, 5, 7] = 3000.0
    q[..., 7] = 0.0
    return q, k


def _near_ties(q, k):
    """Scores at large magnitude (q 40 times wider) between keys in near-tied pairs (each
    odd key its even neighbour plus 2% noise): the int8 step moves scores by more than
    the pairs differ, and at that magnitude the softmax weighs them very differently."""
    k = k.clone()
    k[:, :, 1::2] = (k[:, :, 0::2].float() + 0.02 * torch.randn(k[:, :, 0::2].shape)).to(k.dtype)
    return (q.float() * 40).to(q.dtype), k


@pytest.mark.parametrize(
    "make", [_outlier_queries, _huge_key, _near_ties], ids=["outlier-channel", "huge-key", "near-ties"]
)
def test_inputs_that_int8_gets_wrong_trip_the_guard(make, caplog, seed):
    chooser = AutoChooser(lossy="int8")
    q, k, v = make_qkv(1, 2, 64, 96, 64, torch.float16)
    q, k = make(q, k)
    exact = reference_attention(q, k, v)
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        out = _attend(chooser, "blocks.3.attn2", q, k, v)
    state = _state(chooser, "blocks.3.attn2")
    assert state.fallen_back, state.describe()
    # this call's output is the exact backend's, not the int8 one the guard refused
    assert rel_error(out, exact) < 0.01
    warnings = [r for r in caplog.records if "int8 attention in blocks.3.attn2" in r.getMessage()]
    assert len(warnings) == 1 and "relative L2 error" in warnings[0].getMessage()
    assert state.row_error >= state.error
    # later calls of that module and signature run exactly, with no check and no warning
    caplog.clear()
    again = _attend(chooser, "blocks.3.attn2", q, k, v)
    assert torch.equal(again, out) and state.calls == 1 and not caplog.records
    assert "fell back to exact" in chooser.explain()


def test_the_guard_checks_the_first_call_and_one_in_every(seed):
    chooser = AutoChooser(lossy="int8", guard={"every": 3})
    q, k, v = make_qkv(1, 1, 16, 16, 64, torch.float16)
    for _ in range(7):
        _attend(chooser, "m", q, k, v)
    state = _state(chooser, "m")
    assert state.calls == 7 and [c for c, *_ in state.history] == [1, 3, 6]
    unguarded = AutoChooser(lossy="int8", guard=False)
    _attend(unguarded, "m", q, k, v)
    assert _state(unguarded, "m").checks == 0 and "without a quality guard" in unguarded.explain()


def test_modules_are_guarded_apart(seed):
    chooser = AutoChooser(lossy="int8")
    q, k, v = make_qkv(1, 2, 64, 96, 64, torch.float16)
    bad_q, bad_k = _outlier_queries(q, k)
    _attend(chooser, "good", q, k, v)
    _attend(chooser, "bad", bad_q, bad_k, v)
    assert not _state(chooser, "good").fallen_back and _state(chooser, "bad").fallen_back


@pytest.mark.parametrize("kind,causal", [("key_padding", False), ("full", False), ("none", True), ("bool", True)])
def test_the_sampled_rows_see_what_the_call_sees(kind, causal, seed):
    """The guard's exact rows: the bias rows of the sample and the causal mask folded in,
    against the exact attention of the whole call."""
    q, k, v = make_qkv(2, 2, 40, 50, 64, torch.float32)
    bias = make_bias(kind, 2, 2, 40, 50, torch.float32)
    off = 10 if causal else None
    rows = sample_rows(40, 7, q.device)
    q_s, bias_s = sample_inputs(q, k, v, bias, off, rows)
    got = reference_attention(q_s, k, v, bias_s)
    full = (
        None
        if bias is None
        else (bias if bias.dtype != torch.bool else torch.zeros(bias.shape).masked_fill(~bias, float("-inf")))
    )
    if causal:
        hidden = torch.arange(50)[None, :] > torch.arange(40)[:, None] + off
        c = torch.zeros(40, 50).masked_fill(hidden, float("-inf"))
        full = c if full is None else full + c
    want = reference_attention(q, k, v, full).index_select(2, rows)
    assert torch.allclose(got, want, atol=1e-12, rtol=0)
    assert rows[0] == 0 and rows[-1] == 39


def test_compare_fails_nan_and_measures_error_cosine_and_the_worst_row():
    a = torch.tensor([[1.0, 0.0]])
    assert compare(a, a) == (0.0, 1.0, 0.0)
    err, cos, row = compare(torch.tensor([[0.0, 1.0]]), a)
    assert err == pytest.approx(2**0.5) and cos == 0.0 and row == pytest.approx(2**0.5)
    assert compare(torch.tensor([[float("nan"), 0.0]]), a) == (float("inf"), -1.0, float("inf"))
    # 1 of 10 rows wrong by 100%: about 32% overall, the worst row 100%
    exact = torch.randn(10, 8)
    lossy = exact.clone()
    lossy[7] = 0.0
    err, _, row = compare(lossy, exact)
    assert row == pytest.approx(1.0) and err < 0.6
    # a row near zero is judged against a tenth of the rows' RMS norm, not its own noise
    exact[3] = 1e-6
    lossy = exact.clone()
    lossy[3] = 2e-6
    assert compare(lossy, exact)[2] < 1e-4


def _few_wide_tokens(q, k, rows):
    """Tokens of one wide query channel (that channel multiplied out of scale, the
    others three times larger), the keys blind to that channel, at ``rows``: their
    scores lose most of their precision under per-token quantisation."""
    q, k = q.clone(), k.clone() * 2
    k[..., 5] = 0.0
    for r in rows:
        q[:, :, r] *= 3
        q[:, :, r, 5] = 300.0
    return q, k


def test_a_few_corrupted_tokens_away_from_the_even_sample_trip_the_guard(caplog, seed):
    """Five of 96 query rows tens of percent wrong (up to 90%), none of them in the even
    sample: the overall error of the even sample stays near 1%, under max_error; the
    rows at risk are checked and judged one by one."""
    q, k, v = make_qkv(1, 2, 96, 96, 64, torch.float16)
    even = set(sample_rows(96, 32, q.device).tolist())
    bad = [r for r in (1, 13, 40, 58, 77, 91, 94) if r not in even][:5]
    q, k = _few_wide_tokens(q, k, bad)
    exact = reference_attention(q, k, v)
    with torch.no_grad():
        lossy = AutoChooser(lossy="int8", guard=False).attention("x", q, k, v, None, None, False)
    rows = torch.arange(96)
    row_errors = (lossy.double() - exact).norm(dim=-1) / exact.norm(dim=-1)
    assert row_errors[..., bad].amax() > 0.3, "the construction corrupts those tokens"
    even_rows = torch.tensor(sorted(even))
    assert compare(lossy.index_select(2, even_rows), exact.index_select(2, even_rows))[0] < 0.05, (
        "an even sample alone would have passed it"
    )
    assert rows.numel() == 96
    chooser = AutoChooser(lossy="int8")
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        out = _attend(chooser, "blocks.7.attn1", q, k, v)
    state = _state(chooser, "blocks.7.attn1")
    assert state.fallen_back and state.row_error > DEFAULTS["max_row_error"], state.describe()
    assert rel_error(out, exact) < 0.01
    assert any("worst row's relative L2 error" in r.getMessage() for r in caplog.records)
    # the same module on well-behaved inputs stays lossy, with its worst row well under
    q2, k2, v2 = make_qkv(1, 2, 96, 96, 64, torch.float16)
    calm = AutoChooser(lossy="int8")
    _attend(calm, "blocks.7.attn1", q2, k2, v2)
    state = _state(calm, "blocks.7.attn1")
    assert not state.fallen_back and state.row_error < 0.1, state.describe()


def test_options_are_checked():
    with pytest.raises(ValueError, match="lossy='fp4': the lossy backend attnkit has is 'int8'"):
        AutoChooser(lossy="fp4")
    with pytest.raises(ValueError, match="guard= sets the quality guard of a lossy backend"):
        AutoChooser(guard={"every": 2})
    with pytest.raises(ValueError, match="guard has no option 'often'"):
        AutoChooser(lossy="int8", guard={"often": 2})
    with pytest.raises(ValueError, match="guard every=0: use a positive int"):
        AutoChooser(lossy="int8", guard={"every": 0})
    with pytest.raises(ValueError, match="guard risky_rows=-1: use an int >= 0"):
        AutoChooser(lossy="int8", guard={"risky_rows": -1})
    with pytest.raises(ValueError, match="guard max_row_error=0: use a positive number"):
        AutoChooser(lossy="int8", guard={"max_row_error": 0})
    processor = attnkit.auto(lossy="int8", guard={"every": 8})
    assert processor.chooser.lossy == "int8" and processor.chooser.guard["every"] == 8


def test_the_diffusers_backend_name(seed):
    pytest.importorskip("diffusers")
    from attnkit.diffusers import backend as diffusers_backend

    assert "attnkit_int8" in diffusers_backend.registered_names()
