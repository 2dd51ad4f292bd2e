"""Ulysses: one all-to-all trades sequence shards for head shards, attention runs on the
whole sequence for H / U heads, and a second all-to-all trades back.

The shards may have any lengths (the all-to-all has uneven splits; a rank may hold 0
tokens); the heads must divide evenly. The exchange is linear, so its gradient is the
exchange the other way round: both directions are autograd Functions whose backward is
the other one. q, k and v (and out with lse) go in one all-to-all each way.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .comm import Spec, all_to_all_bytes, pack, packed_size, unpack


def _heads(t: torch.Tensor, j: int, h: int) -> torch.Tensor:
    return t[:, j * h : (j + 1) * h]


def seq_to_heads(tensors: Sequence[torch.Tensor], lens: Sequence[Sequence[int]], group, me: int, what: str):
    """Each tensor (B, H, S_me, X), sequence-sharded -> (B, H / U, sum(S), X), head-sharded.

    lens[i][j]: length of tensor i's shard on group rank j. Rank j receives heads
    [j * H / U, (j + 1) * H / U) of every rank's shard, concatenated in rank order.
    """
    U = len(lens[0])
    h = tensors[0].shape[1] // U
    send = [pack([_heads(t, j, h) for t in tensors]) for j in range(U)]

    def specs(j: int) -> list[Spec]:
        return [Spec((t.shape[0], h, lens[i][j], t.shape[3]), t.dtype) for i, t in enumerate(tensors)]

    chunks = all_to_all_bytes(send, [packed_size(specs(j)) for j in range(U)], group, what)
    parts = [unpack(chunks[j], specs(j)) for j in range(U)]
    return [torch.cat([parts[j][i] for j in range(U)], dim=2) for i in range(len(tensors))]


def heads_to_seq(tensors: Sequence[torch.Tensor], lens: Sequence[Sequence[int]], group, me: int, what: str):
    """The inverse of :func:`seq_to_heads`: each (B, H / U, sum(S), X) -> (B, H, S_me, X)."""
    U = len(lens[0])
    send = []
    for j in range(U):
        pieces = []
        for i, t in enumerate(tensors):
            start = sum(lens[i][:j])
            pieces.append(t[:, :, start : start + lens[i][j]])
        send.append(pack(pieces))

    def specs(j: int) -> list[Spec]:
        return [Spec((t.shape[0], t.shape[1], lens[i][me], t.shape[3]), t.dtype) for i, t in enumerate(tensors)]

    chunks = all_to_all_bytes(send, [packed_size(specs(j)) for j in range(U)], group, what)
    parts = [unpack(chunks[j], specs(j)) for j in range(U)]
    return [torch.cat([parts[j][i] for j in range(U)], dim=1) for i in range(len(tensors))]


class SeqToHeads(torch.autograd.Function):
    """Differentiable :func:`seq_to_heads`; backward is :func:`heads_to_seq`."""

    @staticmethod
    def forward(ctx, lens, group, me, *tensors):
        ctx.lens, ctx.group, ctx.me = lens, group, me
        return tuple(seq_to_heads(tensors, lens, group, me, "Ulysses all-to-all (sequence -> heads)"))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        out = heads_to_seq(grads, ctx.lens, ctx.group, ctx.me, "Ulysses all-to-all backward (heads -> sequence)")
        return (None, None, None, *out)


class HeadsToSeq(torch.autograd.Function):
    """Differentiable :func:`heads_to_seq`; backward is :func:`seq_to_heads`."""

    @staticmethod
    def forward(ctx, lens, group, me, *tensors):
        ctx.lens, ctx.group, ctx.me = lens, group, me
        return tuple(heads_to_seq(tensors, lens, group, me, "Ulysses all-to-all (heads -> sequence)"))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        out = seq_to_heads(grads, ctx.lens, ctx.group, ctx.me, "Ulysses all-to-all backward (sequence -> heads)")
        return (None, None, None, *out)


def gather_bias(
    bias: Optional[torch.Tensor], mode: str, per_head: bool, lens: Sequence[int], group, me: int, U: int, H: int
) -> Optional[torch.Tensor]:
    """This rank's bias after the exchange, for its H / U heads (or still broadcast over
    heads when ``per_head`` is False).

    mode "rows": bias (B', H'|1, M_me, N) holds this rank's query rows against every key:
    every rank receives every rank's rows (for its heads) -> (B', h, sum(M), N).
    mode "broadcast": (B', H'|1, 1, N) holds for every query: no exchange, only the
    heads slice. mode "keys": (B', H'|1, 1, N_me) holds this rank's keys: gathered
    -> (B', h, 1, sum(N)).
    lens: per rank, the query count ("rows") or key count ("keys").
    """
    if bias is None:
        return None
    h = H // U if per_head else 1
    if mode == "broadcast":
        return _heads(bias, me, h) if per_head else bias
    send = [pack([_heads(bias, j, h) if per_head else bias]) for j in range(U)]
    if mode == "rows":
        specs = [[Spec((bias.shape[0], h, lens[j], bias.shape[3]), bias.dtype)] for j in range(U)]
        dim = 2
    else:
        specs = [[Spec((bias.shape[0], h, 1, lens[j]), bias.dtype)] for j in range(U)]
        dim = 3
    chunks = all_to_all_bytes(
        send, [packed_size(s) for s in specs], group, "Ulysses exchange of attn_bias", kind="bias"
    )
    return torch.cat([unpack(chunks[j], specs[j])[0] for j in range(U)], dim=dim)
