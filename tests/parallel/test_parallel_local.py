"""The pieces of context parallelism that run in one process: the math local attention
(the contract every local attention keeps), the merge of partial results, the ring's
schedule, and the refusals that need no peer."""

from __future__ import annotations

import pytest
import torch

from attnkit.parallel import context_parallel_attention, math_attention, merge_partials
from attnkit.parallel.local import check_local_attention
from attnkit.parallel.ring import RingSchedule
from attnkit.testing import make_bias, make_qkv, reference_attention, rel_error, tolerance
from tests._masks import additive, causal_bias

DTYPES = {"f64": torch.float64, "f32": torch.float32, "bf16": torch.bfloat16}


def reference_lse(q, k, bias=None, scale=None) -> torch.Tensor:
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = torch.matmul(q.double(), k.double().transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias.double()
    return torch.logsumexp(s, dim=-1)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("kind", ["none", "key_padding", "full", "bool", "2d"])
def test_math_attention_matches_reference(dtype, kind, seed):
    dt = DTYPES[dtype]
    q, k, v = make_qkv(2, 3, 17, 29, 40, dt, layout="bnhd")
    bias = make_bias(kind, 2, 3, 17, 29, dt if kind != "bool" else torch.float32)
    out, lse = math_attention(q, k, v, bias)
    assert out.dtype == dt and out.shape == (2, 3, 17, 40)
    assert lse.dtype == (torch.float64 if dt == torch.float64 else torch.float32) and lse.shape == (2, 3, 17)
    ref = reference_attention(q, k, v, additive(bias))
    assert rel_error(out, ref) <= tolerance(q, k, v, additive(bias), ref=ref)
    lse_ref = reference_lse(q, k, additive(bias))
    # lse is computed in float32 (float64): hold it to that precision
    assert rel_error(lse, lse_ref) <= (1e-13 if dt == torch.float64 else 1e-5)


@pytest.mark.parametrize("offset", [0, 5, -3, 40])
def test_math_attention_causal_offset(offset, seed):
    q, k, v = make_qkv(1, 2, 9, 14, 16, torch.float64)
    out, lse = math_attention(q, k, v, None, None, causal_offset=offset)
    bias = causal_bias(9, 14, offset)
    ref = reference_attention(q, k, v, bias)
    assert rel_error(out, ref) <= 1e-13
    dead = torch.isneginf(bias).all(-1)  # rows i with i + offset < 0
    assert torch.equal(torch.isneginf(lse), dead.expand_as(lse))
    assert torch.all(out[..., dead, :] == 0)
    if (~dead).any():
        assert torch.allclose(lse[..., ~dead], reference_lse(q, k, bias)[..., ~dead], rtol=0, atol=1e-12)


def test_math_attention_dead_rows_have_zero_output_and_finite_gradients(seed):
    """A row whose keys are all -inf: out 0, lse -inf, and no NaN anywhere in backward,
    through out and through lse."""
    q, k, v = make_qkv(2, 2, 6, 7, 8, torch.float32, requires_grad=True)
    bias = torch.randn(2, 2, 6, 7)
    bias[0, :, 2] = float("-inf")
    bias[1, 1, 5] = float("-inf")
    out, lse = math_attention(q, k, v, bias)
    assert torch.all(out[0, :, 2] == 0) and torch.all(out[1, 1, 5] == 0)
    assert torch.isneginf(lse[0, :, 2]).all() and torch.isneginf(lse[1, 1, 5])
    finite_lse = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    loss = (out * torch.randn_like(out)).sum() + (finite_lse * torch.randn_like(lse)).sum()
    dq, dk, dv = torch.autograd.grad(loss, (q, k, v))
    for g in (dq, dk, dv):
        assert torch.isfinite(g).all()
    assert torch.all(dq[0, :, 2] == 0) and torch.all(dq[1, 1, 5] == 0)
    # The gradient through out matches the float64 reference's
    do = torch.randn_like(out)
    got = torch.autograd.grad(math_attention(q, k, v, bias)[0], (q, k, v), do)
    ins = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(reference_attention(*ins, bias), ins, do.double())
    for g, r in zip(got, ref):
        assert rel_error(g, r) <= 1e-5


def test_math_attention_gradients_in_float64(seed):
    """Through out and lse together, against autograd of the float64 reference."""
    q, k, v = make_qkv(2, 2, 11, 13, 24, torch.float64, layout="bnhd", requires_grad=True)
    bias = make_bias("full", 2, 2, 11, 13, torch.float64)
    do, dl = torch.randn(2, 2, 11, 24, dtype=torch.float64), torch.randn(2, 2, 11, dtype=torch.float64)
    out, lse = math_attention(q, k, v, bias)
    got = torch.autograd.grad((out, lse), (q, k, v), (do, dl))
    ins = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref_loss = (reference_attention(*ins, bias) * do).sum() + (reference_lse(ins[0], ins[1], bias) * dl).sum()
    ref = torch.autograd.grad(ref_loss, ins)
    for g, r in zip(got, ref):
        assert rel_error(g, r) <= 1e-12


@pytest.mark.parametrize("dtype", ["f64", "f32"])
def test_merge_of_disjoint_key_sets_is_attention_over_their_union(dtype, seed):
    """Split the keys in two, one part fully masked for some rows: merging the halves
    through lse gives attention over all keys, and rows dead on both sides stay 0."""
    dt = DTYPES[dtype]
    q, k, v = make_qkv(2, 3, 10, 21, 16, dt)
    bias = torch.randn(2, 3, 10, 21, dtype=dt)
    bias[:, :, 1, :8] = float("-inf")  # dead in the first part only
    bias[:, :, 4, 8:] = float("-inf")  # dead in the second part only
    bias[0, :, 7, :] = float("-inf")  # dead everywhere
    o1, l1 = math_attention(q, k[:, :, :8], v[:, :, :8], bias[..., :8])
    o2, l2 = math_attention(q, k[:, :, 8:], v[:, :, 8:], bias[..., 8:])
    out, lse = merge_partials(o1, l1, o2, l2)
    ref = reference_attention(q, k, v, bias)
    assert rel_error(out, ref) <= (1e-13 if dt == torch.float64 else 1e-5)
    assert torch.all(out[0, :, 7] == 0) and torch.isneginf(lse[0, :, 7]).all()
    whole_lse = math_attention(q, k, v, bias)[1]
    assert torch.equal(torch.isneginf(lse), torch.isneginf(whole_lse))
    alive = ~torch.isneginf(whole_lse)
    assert torch.allclose(
        lse[alive], whole_lse[alive].to(lse.dtype), rtol=0, atol=1e-12 if dt == torch.float64 else 1e-5
    )


def test_large_finite_negative_mask_follows_float64_math(seed):
    """A row masked with a finite -1e9 is not a dead row: float64 math gives a softmax
    over those scores, and so does the local attention in float64."""
    q, k, v = make_qkv(1, 1, 5, 9, 8, torch.float64)
    bias = torch.zeros(1, 1, 5, 9, dtype=torch.float64)
    bias[..., 2, :] = -1e9
    out, lse = math_attention(q, k, v, bias)
    ref = reference_attention(q, k, v, bias)
    assert rel_error(out, ref) <= 1e-12
    assert torch.isfinite(lse).all() and out[..., 2, :].abs().sum() > 0


# -- the ring's schedule ------------------------------------------------------------------


def schedule(rank, lens, causal, k_lens=None):
    k_lens = k_lens or lens
    offs = lambda ls: tuple(sum(ls[:i]) for i in range(len(ls)))  # noqa: E731
    return RingSchedule(len(lens), rank, tuple(lens), tuple(k_lens), offs(lens), offs(k_lens), causal)


def test_ring_schedule_non_causal_passes_every_block_all_the_way():
    s = schedule(0, [4, 4, 4, 4], False)
    assert s.reach == (3, 3, 3, 3)
    assert [s.sends(i) for i in range(4)] == [True, True, True, False]
    assert [s.receives(i) for i in range(4)] == [True, True, True, False]


def test_ring_schedule_causal_skips_blocks_above_the_diagonal():
    # block b is needed by ranks b..3 only: it travels 3 - b hops
    for r in range(4):
        s = schedule(r, [4, 4, 4, 4], True)
        assert s.reach == (3, 2, 1, 0)
        for src in range(4):
            assert s.needs(r, src) == (src <= r)
        # the diagonal block is masked; blocks below it are whole
        assert s.causal_offset(r, r) == 0
        assert all(s.causal_offset(r, src) is None for src in range(r))
    # sends per rank: blocks still needed further along the ring
    sends = [sum(schedule(r, [4] * 4, True).sends(i) for i in range(4)) for r in range(4)]
    assert sends == [1, 2, 3, 0]


def test_ring_schedule_uneven_and_empty_shards():
    # Rank 1 holds no token: its empty block never travels, it needs no block, but it
    # passes on blocks that ranks after it need (block 0 goes through it to ranks 2, 3);
    # block 2 stops at rank 0, since rank 1 after it needs nothing.
    s = schedule(0, [3, 0, 5, 1], False)
    assert s.reach == (3, 0, 2, 3)
    assert not any(s.needs(1, src) for src in range(4)) and not any(s.needs(r, 1) for r in range(4))
    c = schedule(2, [3, 0, 5, 1], True)
    assert c.causal_offset(2, 2) == 0 and c.causal_offset(2, 0) is None


def test_ring_schedule_every_send_has_a_receipt():
    for lens, causal in (([4, 4, 4, 4], True), ([3, 0, 5, 1], True), ([1, 7, 0, 2, 6], True), ([2, 2, 2], False)):
        P = len(lens)
        for s in range(P):
            for r in range(P):
                assert schedule(r, lens, causal).sends(s) == schedule((r + 1) % P, lens, causal).receives(s)


# -- refusals that need no peer -----------------------------------------------------------


def test_local_attention_without_lse_is_named():
    def out_only(q, k, v, attn_bias=None, scale=None, causal_offset=None):
        return math_attention(q, k, v, attn_bias, scale, causal_offset)[0]

    msg = check_local_attention(out_only, torch.float32, torch.device("cpu"), 8, 8)
    assert msg and "not (out, lse)" in msg and "out_only" in msg
    assert check_local_attention(math_attention, torch.float32, torch.device("cpu"), 8, 8) is None


def test_groups_are_required():
    q, k, v = make_qkv(1, 2, 4, 4, 8)
    with pytest.raises(ValueError, match="ring_group, ulysses_group or both"):
        context_parallel_attention(q, k, v)


def test_uninitialised_distributed_is_named():
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("torch.distributed is initialised in this process")
    q, k, v = make_qkv(1, 2, 4, 4, 8)
    with pytest.raises(ValueError, match="init_process_group"):
        context_parallel_attention(q, k, v, ring_group=object())
