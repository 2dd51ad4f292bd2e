"""What a FlexAttention BlockMask means, for the zoo's stock references.

Eager FlexAttention (what diffusers' flex backend runs on a CPU without torch.compile)
evaluates a BlockMask's mask_mod over the whole score matrix and ignores its block
lists, so a mask built from block lists alone (Kandinsky 6 SR's NABLA mask, made with
``BlockMask.from_kv_blocks(..., mask_mod=None)``) is read as no mask at all. Compiled
FlexAttention computes the mask's meaning: ``full_kv_*`` blocks seen whole, ``kv_*``
blocks through mask_mod, every other block hidden. :func:`flex_meaning` makes diffusers'
flex backend compute that meaning, densely and in the inputs' dtype (float64 for the
reference), with its own code: the reference never runs attnkit's block_mask_attention.
"""

from __future__ import annotations

import contextlib
import math

import torch


def dense_mask(block_mask, b: int, h: int, m: int, n: int) -> torch.Tensor:
    """The (B, H, M, N) boolean mask ``block_mask`` means (True = attend)."""
    qb, kb = block_mask.BLOCK_SIZE if isinstance(block_mask.BLOCK_SIZE, tuple) else (block_mask.BLOCK_SIZE,) * 2

    def blocks(num, idx):  # (B', H', QB, KB) boolean: the listed blocks
        nq, nk = num.shape[-1], -(-n // kb)
        out = torch.zeros(*num.shape, nk + 1, dtype=torch.bool)
        slot = torch.arange(idx.shape[-1])
        listed = slot < num[..., None]
        target = torch.where(listed, idx.long(), torch.full_like(idx.long(), nk))
        out.scatter_(-1, target, True)
        assert out.shape[-2] == nq
        return out[..., :nk]

    def expand(block):  # block level to elements, (B', H', M, N)
        return block.repeat_interleave(qb, -2).repeat_interleave(kb, -1)[..., :m, :n]

    partial = expand(blocks(block_mask.kv_num_blocks, block_mask.kv_indices))
    full = torch.zeros_like(partial)
    if block_mask.full_kv_num_blocks is not None:
        full = expand(blocks(block_mask.full_kv_num_blocks, block_mask.full_kv_indices))
    q_idx = torch.arange(m)[:, None]
    kv_idx = torch.arange(n)[None, :]
    inner = torch.ones(b, h, m, n, dtype=torch.bool)
    if block_mask.mask_mod is not None:
        for bi in range(b):
            for hi in range(h):
                inner[bi, hi] = block_mask.mask_mod(torch.tensor(bi), torch.tensor(hi), q_idx, kv_idx)
    return full.expand(b, h, m, n) | (partial.expand(b, h, m, n) & inner)


def meaning_attention(query, key, value, block_mask, scale=None) -> torch.Tensor:
    """softmax over the keys ``block_mask`` shows each query, on (B, S, H, D) tensors as
    diffusers passes them; a query that sees no key gives zeros (as FlexAttention)."""
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    b, h, m, d = q.shape
    keep = dense_mask(block_mask, b, h, m, k.shape[2])
    scores = (q @ k.transpose(-1, -2)) * (d**-0.5 if scale is None else scale)
    scores = scores.masked_fill(~keep, -math.inf)
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (p @ v).transpose(1, 2)


@contextlib.contextmanager
def flex_meaning():
    """diffusers' flex backend computing a BlockMask's meaning (see the module's doc);
    any other call goes to diffusers' own flex function, as before."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    member = AttentionBackendName.FLEX
    real = _AttentionBackendRegistry._backends[member]

    def flex(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, **kwargs):
        if (
            type(attn_mask).__name__ == "BlockMask"
            and not is_causal
            and not enable_gqa
            and not kwargs.get("return_lse")
        ):
            return meaning_attention(query, key, value, attn_mask, scale)
        return real(
            query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, **kwargs
        )

    _AttentionBackendRegistry._backends[member] = flex
    try:
        yield
    finally:
        _AttentionBackendRegistry._backends[member] = real
