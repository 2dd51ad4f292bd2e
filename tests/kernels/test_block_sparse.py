"""The block-sparse flash kernel (attnkit/kernels/flash/sparse.py) in Triton's interpreter,
against float64 attention under the BlockMask's meaning (its element mask where it has a
mask_mod, its block lists where it has none: what compiled FlexAttention computes),
forward and gradients, by the suite's rule (twice plain torch's error in the same
dtype): kv block lists (Kandinsky 5's NABLA form), causal and document masks with a
mask_mod, sliding windows, random block patterns at 10-90% density, block sizes that are
not the kernel's tile, rows that see no key, head dims 8-512, broadcast and per-head
masks, strided layouts. And the table itself: the tiles the kernel visits are exactly
those with a visible key, the full ones need no mask, and the store holds the partial
tiles only."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from attnkit.kernels import launcher
from attnkit.kernels.flash import sparse
from attnkit.kernels.flash.sparse import block_sparse_attention, block_table, tile_for
from tests.test_block_masks import _check, _dense_from_lists

TILE = tile_for(64)  # the interpreter's tile


def _lists_mask(b, h, m, n, blk, density, full_share=0.5):
    """Random kv block lists without a mask_mod, about ``density`` of the blocks listed,
    some as full blocks: the NABLA form."""
    nq, nk = -(-m // blk), -(-n // blk)
    listed = torch.rand(b, h, nq, nk) < density
    full = listed & (torch.rand(b, h, nq, nk) < full_share)
    part = listed & ~full

    def lists(sel):
        order = torch.sort((~sel).to(torch.uint8), dim=-1, stable=True).indices.to(torch.int32)
        return sel.sum(-1).to(torch.int32), order

    num, idx = lists(part)
    full_num, full_idx = lists(full)
    return BlockMask.from_kv_blocks(num, idx, full_num, full_idx, BLOCK_SIZE=blk, seq_lengths=(m, n))


def _qkv(b, h, m, n, d, dtype=torch.float32):
    return tuple(torch.randn(b, h, s, d).to(dtype) for s in (m, n, n))


@pytest.mark.parametrize("density", [0.1, 0.5, 0.9])
def test_random_block_lists_at_each_density(seed, density):
    b, h, m, n = 1, 2, 96, 128
    bm = _lists_mask(b, h, m, n, 32, density)
    seen = _dense_from_lists(bm, b, h, m, n)
    _check(*_qkv(b, h, m, n, 32), bm, seen, attend=block_sparse_attention)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_causal_document_mask_with_a_mask_mod(seed, dtype):
    b, h, m, n = 2, 2, 90, 90
    doc = torch.randint(0, 3, (n,)).sort().values

    def mask_mod(bi, hi, qi, ki):
        return (qi >= ki) & (doc[qi] == doc[ki])

    bm = create_block_mask(mask_mod, b, None, m, n, device="cpu", BLOCK_SIZE=32)
    qi, ki = torch.arange(m)[:, None], torch.arange(n)[None, :]
    seen = mask_mod(None, None, qi, ki).expand(b, h, m, n)
    _check(*_qkv(b, h, m, n, 40, dtype), bm, seen, attend=block_sparse_attention)


@pytest.mark.parametrize("block", [16, 24, (48, 20), 128])
def test_block_sizes_that_are_not_the_kernel_tile(seed, block):
    """A mask block smaller than the tile, one that does not divide it, one larger: tiles
    covering blocks of different states are partial, a tile inside one takes its state."""
    b, h, m, n = 1, 2, 100, 150

    def window(bi, hi, qi, ki):
        return ((ki - qi).abs() <= 40) | ((hi == 1) & (ki < 8))

    bm = create_block_mask(window, 1, h, m, n, device="cpu", BLOCK_SIZE=block)
    _check(*_qkv(b, h, m, n, 16), bm, _dense_from_lists(bm, b, h, m, n), attend=block_sparse_attention)


def test_rows_that_see_no_key_give_zeros_and_no_nan(seed):
    b, h, m, n, blk = 1, 2, 96, 96, 32
    num = torch.tensor([[[1, 0, 2], [0, 0, 3]]], dtype=torch.int32)
    idx = torch.arange(3, dtype=torch.int32).expand(1, 2, 3, 3).contiguous()
    bm = BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=blk, seq_lengths=(m, n))
    seen = _dense_from_lists(bm, b, h, m, n)
    q, k, v = (t.requires_grad_() for t in _qkv(b, h, m, n, 16))
    out = block_sparse_attention(q, k, v, bm)
    assert torch.equal(out[0, 0, 32:64], torch.zeros(32, 16)) and torch.equal(out[0, 1, :64], torch.zeros(64, 16))
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.equal(q.grad[0, 1, :64], torch.zeros(64, 16))
    _check(q.detach(), k.detach(), v.detach(), bm, seen, attend=block_sparse_attention)


@pytest.mark.parametrize("d", [8, 72, 160, 512])
def test_head_dims(seed, d):
    b, h, m, n = 1, 1, 40, 70

    def mask_mod(bi, hi, qi, ki):
        return (ki // 16 + qi // 16) % 3 != 0

    bm = create_block_mask(mask_mod, 1, 1, m, n, device="cpu", BLOCK_SIZE=16)
    qi, ki = torch.arange(m)[:, None], torch.arange(n)[None, :]
    seen = mask_mod(None, None, qi, ki).expand(b, h, m, n)
    _check(*_qkv(b, h, m, n, d), bm, seen, attend=block_sparse_attention)


def test_strided_inputs_and_a_per_batch_mask(seed):
    """diffusers' (B, S, H, D) layout read through its strides (no copy), gradients
    written back in it; a mask per batch item and head."""
    b, h, m, n, d = 2, 3, 64, 80, 32
    bm = _lists_mask(b, h, m, n, 16, 0.4)
    seen = _dense_from_lists(bm, b, h, m, n)
    q, k, v = (torch.randn(b, s, h, d).transpose(1, 2) for s in (m, n, n))
    assert not q.is_contiguous()
    _check(q, k, v, bm, seen, attend=block_sparse_attention)
    qg = q.clone().requires_grad_()
    out = block_sparse_attention(qg, k, v, bm)
    out.sum().backward()
    assert out.stride() == q.stride() and qg.grad.stride() == q.stride()


def _tile_states(seen: torch.Tensor, tile, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(visited, full) per (B, H, query tile, key tile) from the dense element mask: a tile
    is visited where any of its scores is seen, full where all are (and no key of it is
    past N)."""
    b, h, m, _ = seen.shape
    tq, tk = -(-m // tile[0]), -(-n // tile[1])
    padded = torch.zeros(b, h, tq * tile[0], tk * tile[1], dtype=torch.int8)
    padded[..., m:, :] = -1  # rows past M: no state of their own
    padded[:, :, :m, :n] = seen.to(torch.int8)
    cells = padded.view(b, h, tq, tile[0], tk, tile[1])
    visited = (cells == 1).any(5).any(3)
    full = ((cells == 1) | (cells == -1)).all(5).all(3) & visited
    if n % tile[1]:
        full[..., -1] = False
    return visited, full


def test_the_table_visits_exactly_the_tiles_with_a_visible_key(seed):
    """The work the kernel skips: every listed tile has a visible score, every tile with
    one is listed, and only partial tiles carry an element mask (the store holds them
    alone: P x tile bytes, not M x N)."""
    b, h, m, n = 2, 2, 200, 230
    bm = _lists_mask(b, h, m, n, 16, 0.3)
    seen = _dense_from_lists(bm, b, h, m, n)
    table = block_table(bm, m, n, TILE, torch.device("cpu"))
    visited, full = _tile_states(seen, TILE, n)
    rows = table.rows
    listed = torch.zeros_like(visited)
    listed_full = torch.zeros_like(visited)
    for bi in range(b):
        for hi in range(h):
            for i in range(visited.shape[2]):
                f = rows.full_idx[bi, hi, i, : rows.full_num[bi, hi, i]].long()
                p = rows.part_idx[bi, hi, i, : rows.part_num[bi, hi, i]].long()
                assert not set(f.tolist()) & set(p.tolist())
                listed[bi, hi, i, f] = True
                listed[bi, hi, i, p] = True
                listed_full[bi, hi, i, f] = True
    assert torch.equal(listed, visited)
    assert torch.equal(listed_full, full)
    assert table.store.shape == (table.partial_tiles, *TILE)
    assert table.full_tiles == int(full.sum()) and table.partial_tiles == int((visited & ~full).sum())
    assert table.density == pytest.approx(visited.float().mean().item()) and table.density < 1


def test_a_broadcast_mask_keeps_one_table_for_every_batch_and_head(seed):
    b, h, m, n = 3, 4, 64, 64
    bm = create_block_mask(lambda bi, hi, qi, ki: qi >= ki, None, None, m, n, device="cpu", BLOCK_SIZE=32)
    table = block_table(bm, m, n, TILE, torch.device("cpu"))
    assert table.rows.full_num.shape[:2] == (1, 1)
    assert table.rows.strides()["stride_tb"] == 0 and table.rows.strides()["stride_th"] == 0
    qi, ki = torch.arange(m)[:, None], torch.arange(n)[None, :]
    _check(*_qkv(b, h, m, n, 16), bm, (qi >= ki).expand(b, h, m, n), attend=block_sparse_attention)


def test_the_table_is_built_once_per_mask_and_leaves_with_it(seed):
    m = n = 64
    bm = create_block_mask(lambda bi, hi, qi, ki: qi >= ki, None, None, m, n, device="cpu", BLOCK_SIZE=32)
    q, k, v = _qkv(1, 1, m, n, 16)
    before = sparse.table_count()
    first = block_table(bm, m, n, TILE, torch.device("cpu"))
    block_sparse_attention(q, k, v, bm)
    assert block_table(bm, m, n, TILE, torch.device("cpu")) is first, "the second call builds nothing"
    assert sparse.table_count() == before + 1
    del bm, first
    import gc

    gc.collect()
    assert sparse.table_count() == before


def test_one_launch_each_forward_and_backward_kernel(seed):
    m = n = 64
    bm = create_block_mask(lambda bi, hi, qi, ki: qi >= ki, None, None, m, n, device="cpu", BLOCK_SIZE=32)
    q, k, v = (t.requires_grad_() for t in _qkv(1, 1, m, n, 16))
    with launcher.recording() as seen:
        block_sparse_attention(q, k, v, bm).sum().backward()
    assert [x.kernel for x in seen] == ["sparse_fwd", "sparse_dq", "sparse_dkdv"]


def test_what_the_kernel_does_not_take_is_refused_by_name():
    bm = create_block_mask(lambda bi, hi, qi, ki: qi >= ki, None, None, 32, 32, device="cpu", BLOCK_SIZE=32)
    q = torch.randn(1, 1, 32, 16)
    with pytest.raises(ValueError, match="one head dim for q, k and v; got 16, 16, 32.*block_mask_attention"):
        block_sparse_attention(q, q, torch.randn(1, 1, 32, 32), bm)
    with pytest.raises(ValueError, match="for 32 queries and 32 keys, the call has 16 queries"):
        block_sparse_attention(q[:, :, :16], q, q, bm)


def test_block_mask_attention_takes_the_kernel_where_it_can_run_and_says_why_not(seed):
    """On the CPU the chunked route (the interpreter is never chosen on its own); asked
    for, the kernel runs under the interpreter and gives the chunked route's answer."""
    from attnkit.block_masks import block_mask_attention, route

    m, n = 64, 96
    bm = create_block_mask(lambda bi, hi, qi, ki: (ki - qi).abs() < 40, None, None, m, n, device="cpu", BLOCK_SIZE=32)
    q, k, v = _qkv(2, 2, m, n, 16)
    assert route(q, k, v) == ("chunked", "device=cpu: the block-sparse kernel runs on CUDA")
    assert route(q, k, v[..., :8])[0] == "chunked"
    wide = torch.randn(2, 2, m, 320)
    assert route(wide, wide, wide, interpreter=True)[1].startswith(
        "head dim 320: the block-sparse kernel takes 8 to 256"
    )
    with launcher.recording() as seen:
        chunked = block_mask_attention(q, k, v, bm)
    assert not seen
    with launcher.recording() as seen:
        kernel = block_mask_attention(q, k, v, bm, via="kernel")
    assert [x.kernel for x in seen] == ["sparse_fwd"]
    torch.testing.assert_close(kernel, chunked, atol=2e-6, rtol=2e-6)
    with pytest.raises(ValueError, match="cannot run this call: head dims 16, 16, 8"):
        block_mask_attention(q, k, v[..., :8], bm, via="kernel")
    with pytest.raises(ValueError, match="via='fast': pass 'kernel', 'chunked' or None"):
        block_mask_attention(q, k, v, bm, via="fast")


@pytest.mark.parametrize("via", ["kernel", "chunked"])
@pytest.mark.parametrize("base", ["lists", "mask_mod"])
def test_key_padding_and_causality_combine_with_a_block_mask(seed, via, base):
    """A text padding mask (B, N) and torch's is_causal with a BlockMask, on both routes:
    the restricted mask hides what any of the three hides (a list-only mask's listed
    blocks whole), built once per mask and key mask (by its bits: a model may build it
    afresh per call) and again for other bits."""
    from attnkit.block_masks import block_mask_attention

    b, h, m, n = 2, 2, 70, 90
    if base == "lists":
        bm = _lists_mask(1, h, m, n, 16, 0.6)
        seen = _dense_from_lists(bm, 1, h, m, n).expand(b, h, m, n)
    else:

        def window(bi, hi, qi, ki):
            return (ki - qi).abs() <= 30

        bm = create_block_mask(window, None, None, m, n, device="cpu", BLOCK_SIZE=16)
        qi, ki = torch.arange(m)[:, None], torch.arange(n)[None, :]
        seen = window(None, None, qi, ki).expand(b, h, m, n)
    keys = torch.arange(n)[None, :] < torch.tensor([[n - 23], [n]])
    causal = torch.arange(n)[None, :] <= torch.arange(m)[:, None]
    expected = seen & keys[:, None, None, :] & causal

    def attend(q, k, v, mask):
        return block_mask_attention(q, k, v, mask, keys=keys, causal=True, via=via)

    _check(*_qkv(b, h, m, n, 16), bm, expected, attend=attend)
    from attnkit.block_masks import restricted

    first = restricted(bm, keys, True, b, m, n)
    assert restricted(bm, keys.clone(), True, b, m, n) is first, "the same key mask, built afresh"
    keys[1, -5:] = False
    assert restricted(bm, keys, True, b, m, n) is not first
    with pytest.raises(ValueError, match=r"keys must be a \(2, 90\) boolean key mask"):
        block_mask_attention(*_qkv(b, h, m, n, 16), bm, keys=keys.float())
