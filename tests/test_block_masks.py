"""attnkit.block_masks.block_mask_attention against float64 attention under the
BlockMask's meaning (what compiled FlexAttention computes): its element mask where it has
a mask_mod, its block lists where it has none (eager FlexAttention ignores those, so it is
never the reference here), forward and gradients, block sizes that do not divide the
lengths, and rows that see no key."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask
from torch.utils._python_dispatch import TorchDispatchMode

from attnkit.block_masks import block_mask_attention
from attnkit.testing import EPSILON, reference_attention, rel_error, torch_math_attention


def _dense_from_lists(bm: BlockMask, b: int, h: int, m: int, n: int) -> torch.Tensor:
    """The visible (B, H, M, N) keys of a BlockMask from its block lists, by loops (an
    independent reading): full blocks whole, partial blocks through mask_mod."""
    qb, kb = (bm.BLOCK_SIZE, bm.BLOCK_SIZE) if isinstance(bm.BLOCK_SIZE, int) else bm.BLOCK_SIZE
    seen = torch.zeros(b, h, m, n, dtype=torch.bool)
    for bi in range(b):
        for hi in range(h):
            sb, sh = min(bi, bm.kv_num_blocks.shape[0] - 1), min(hi, bm.kv_num_blocks.shape[1] - 1)
            for i in range(bm.kv_num_blocks.shape[2]):
                rows = range(i * qb, min(m, (i + 1) * qb))
                lists = [(bm.kv_indices, bm.kv_num_blocks, True)]
                if bm.full_kv_num_blocks is not None:
                    lists.append((bm.full_kv_indices, bm.full_kv_num_blocks, False))
                for idx, num, partial in lists:
                    for j in idx[sb, sh, i, : int(num[sb, sh, i])].tolist():
                        for r in rows:
                            for c in range(j * kb, min(n, (j + 1) * kb)):
                                ok = True
                                if partial and bm.mask_mod is not None:
                                    t = torch.tensor
                                    ok = bool(bm.mask_mod(t(bi), t(hi), t(r), t(c)))
                                seen[bi, hi, r, c] = ok
    return seen


def _bias(seen: torch.Tensor) -> torch.Tensor:
    return torch.zeros(seen.shape, dtype=torch.float64).masked_fill(~seen, float("-inf"))


def _check(q, k, v, bm, seen, attend=block_mask_attention):
    """Forward and gradients of ``attend(q, k, v, bm)`` against float64 under ``seen``,
    by the rule of attnkit.testing (twice plain torch math's error in the same dtype)."""
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = attend(qg, kg, vg, bm)
    assert not out.isnan().any()
    bias = _bias(seen)
    ref_in = [t.double().requires_grad_() for t in (q, k, v)]
    ref = reference_attention(*ref_in, bias)
    base_in = [t.clone().requires_grad_() for t in (q, k, v)]
    base = torch_math_attention(*base_in, bias.to(q.dtype))
    err, tol = rel_error(out, ref), 2.0 * rel_error(base, ref) + EPSILON[q.dtype]
    assert err <= tol, f"forward: {err:.3e} > {tol:.3e}"
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (qg, kg, vg), do)
    refs = torch.autograd.grad(ref, ref_in, do.double())
    bases = torch.autograd.grad(base, base_in, do)
    for name, g, r, bb in zip("qkv", grads, refs, bases):
        err, tol = rel_error(g, r), 2.0 * rel_error(bb, r) + EPSILON[q.dtype]
        assert err <= tol, f"d{name}: {err:.3e} > {tol:.3e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_mask_mod_is_its_element_mask(seed, dtype):
    """Causal and document masks from create_block_mask (full, partial and hidden blocks),
    lengths that are not multiples of the block."""
    b, h, m, n, d = 2, 2, 90, 90, 16
    doc = torch.randint(0, 3, (n,)).sort().values

    def mask_mod(bi, hi, qi, ki):
        return (qi >= ki) & (doc[qi] == doc[ki])

    bm = create_block_mask(mask_mod, b, None, m, n, device="cpu", BLOCK_SIZE=32)
    q, k, v = (torch.randn(b, h, s, d).to(dtype) for s in (m, n, n))
    qi, ki = torch.arange(m)[:, None], torch.arange(n)[None, :]
    _check(q, k, v, bm, mask_mod(None, None, qi, ki).expand(b, h, m, n))


def test_block_lists_without_a_mask_mod_are_what_compiled_flex_attention_sees(seed):
    """Kandinsky 5's NABLA form: random key-block lists per (batch, head, query block),
    no mask_mod, partial and full lists, one query block that sees nothing."""
    b, h, m, n, d, blk = 1, 3, 96, 160, 16, 32
    nq, nk = m // blk, n // blk
    num = torch.randint(0, nk + 1, (b, h, nq), dtype=torch.int32)
    num[0, 1, 2] = 0
    idx = torch.stack([torch.randperm(nk) for _ in range(b * h * nq)]).reshape(b, h, nq, nk).to(torch.int32)
    full_num = torch.zeros_like(num)
    bm = BlockMask.from_kv_blocks(num, idx, full_num, idx.clone(), BLOCK_SIZE=blk, seq_lengths=(m, n))
    seen = _dense_from_lists(bm, b, h, m, n)
    assert 0 < seen.float().mean() < 1
    q, k, v = (torch.randn(b, h, s, d) for s in (m, n, n))
    _check(q, k, v, bm, seen)
    out = block_mask_attention(q, k, v, bm)
    assert torch.equal(out[0, 1, 64:96], torch.zeros(32, d)), "a row that sees no key gives zeros"


def test_partial_and_full_lists_together_and_a_sliding_window(seed):
    b, h, m, n, d = 2, 1, 100, 130, 8

    def window(bi, hi, qi, ki):
        return (ki - qi).abs() <= 48

    bm = create_block_mask(window, 1, 1, m, n, device="cpu", BLOCK_SIZE=(16, 32))
    assert bm.full_kv_num_blocks.sum() > 0 and bm.kv_num_blocks.sum() > 0
    q, k, v = (torch.randn(b, h, s, d) for s in (m, n, n))
    _check(q, k, v, bm, _dense_from_lists(bm, b, h, m, n))


def test_the_wrong_lengths_are_refused():
    bm = create_block_mask(lambda b, h, q, k: q >= k, 1, 1, 64, 64, device="cpu", BLOCK_SIZE=32)
    q = torch.randn(1, 1, 48, 8)
    with pytest.raises(ValueError, match="for 64 queries and 64 keys, the call has 48 queries"):
        block_mask_attention(q, q, q, bm)
    two = create_block_mask(lambda b, h, q, k: q >= k, 2, 1, 64, 64, device="cpu", BLOCK_SIZE=32)
    q = torch.randn(3, 1, 64, 8)
    with pytest.raises(ValueError, match="for batch 2 and 1 heads, the call has batch 3 and 1 heads"):
        block_mask_attention(q, q, q, two)


class _Largest(TorchDispatchMode):
    """The most elements any operation inside the block produced."""

    def __init__(self):
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.most = max(self.most, t.numel())
        return out


def test_memory_follows_the_visited_blocks_not_the_score_matrix(seed):
    """A 2,048-token sliding window: no tensor of the forward or backward holds more than
    a sixteenth of one (M, N) score matrix (eager FlexAttention holds it whole)."""
    m = n = 2048

    def window(bi, hi, qi, ki):
        return (ki - qi).abs() <= 64

    bm = create_block_mask(window, 1, 1, m, n, device="cpu", BLOCK_SIZE=64)
    q, k, v = (torch.randn(1, 1, s, 8, requires_grad=True) for s in (m, n, n))
    with _Largest() as seen:
        out = block_mask_attention(q, k, v, bm)
        out.sum().backward()
    assert seen.most <= m * n // 16, f"a tensor of {seen.most:,} elements; the score matrix has {m * n:,}"


def test_a_block_mask_that_hides_nothing_is_recognised_once(seed):
    """Every key block visited whole by every query block (full blocks, or partial ones
    under from_kv_blocks' noop mask_mod): read once per mask object."""
    from attnkit.block_masks import hides_nothing

    # (create_block_mask marks the blocks a length ends inside partial: whole lengths here)
    everything = create_block_mask(lambda b, h, q, k: q >= 0, 2, 1, 64, 96, device="cpu", BLOCK_SIZE=32)
    causal = create_block_mask(lambda b, h, q, k: q >= k, 2, 1, 70, 90, device="cpu", BLOCK_SIZE=32)
    every_block = torch.arange(3, dtype=torch.int32).expand(1, 1, 3, 3).contiguous()
    listed = BlockMask.from_kv_blocks(
        torch.full((1, 1, 3), 3, dtype=torch.int32), every_block, BLOCK_SIZE=32, seq_lengths=(70, 90)
    )
    one_short = BlockMask.from_kv_blocks(
        torch.tensor([[[3, 3, 2]]], dtype=torch.int32), every_block, BLOCK_SIZE=32, seq_lengths=(70, 90)
    )
    assert hides_nothing(everything) and hides_nothing(listed)
    assert not hides_nothing(causal) and not hides_nothing(one_short)

    class Reads(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                Reads.count += 1
            return func(*args, **(kwargs or {}))

    with Reads():
        for _ in range(3):
            assert hides_nothing(everything)
    assert Reads.count == 0, "read once per mask object, before"
