"""How the ranks agree on a context-parallel call before computing it.

Every rank describes its call in one small row of numbers (lengths, shapes, dtype,
options, fingerprints of k and v, whether it refuses the call); the rows are exchanged
and every rank checks every other's, so a refusal, a mismatch between ranks or a bad
argument on one rank makes every rank raise the same error at the same point. The same
exchange gives each rank the layout of the whole sequence (every shard's length).

This module holds the exchange itself, in two stages over a 2-D mesh; what a rank checks
alone is in :mod:`.arguments`, the row and the checks across rows in :mod:`.rows`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .comm import all_gather_rows, group_rank
from .rows import (
    _IDX,
    _STAGE_RING,
    _STAGE_ULYSSES,
    _auto_whole,
    _bias_rows_mode,
    _check_rows,
    _disagreement,
    _row,
    _same,
    _same_kv,
)

logger = logging.getLogger("attnkit.parallel")


@dataclass
class _Layout:
    """Where this rank's shard sits, from the exchanged rows."""

    u_size: int
    u_rank: int
    r_size: int
    r_rank: int
    q_lens_u: list[int]  # query / key lengths of the ulysses group's members
    k_lens_u: list[int]
    q_lens_r: list[int]  # query / key lengths of the ring chunks (each a ulysses group's total)
    k_lens_r: list[int]
    bias_rows_mode: bool  # some rank passes a row per query
    kv_replicated: bool  # k and v are whole on every rank: no exchange at all

    @property
    def q_offset(self) -> int:
        """Global position of this rank's first query."""
        return sum(self.q_lens_r[: self.r_rank]) + sum(self.q_lens_u[: self.u_rank])

    @property
    def n_total(self) -> int:
        return sum(self.k_lens_r)


def _exchange(call, problem, q, k, causal, kv_sharded, return_lse, bias_sharding, ring_group, ulysses_group) -> _Layout:
    """Exchange and check the ranks' descriptions of the call: over the ulysses group, then
    over the ring group (a refusal found in the first travels in the second, so every rank
    of the mesh raises). Raises ValueError on every rank, or returns the layout."""
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    U = dist.get_world_size(ulysses_group) if ulysses_group is not None else 1
    R = dist.get_world_size(ring_group) if ring_group is not None else 1
    u_rank = group_rank(ulysses_group) if ulysses_group is not None else 0
    r_rank = group_rank(ring_group) if ring_group is not None else 0
    if problem is None and ulysses_group is not None and ring_group is not None:
        ring_ranks = set(dist.get_process_group_ranks(ring_group))
        uly_ranks = set(dist.get_process_group_ranks(ulysses_group))
        if ring_ranks & uly_ranks != {dist.get_rank()}:
            problem = (
                f"ring_group {sorted(ring_ranks)} and ulysses_group {sorted(uly_ranks)} do not form a 2-D mesh: "
                "they must share exactly this rank. Build them as the rows and columns of one mesh, e.g. "
                "torch.distributed.device_mesh.init_device_mesh(device, (ring, ulysses), mesh_dim_names=('ring', "
                "'ulysses')) and its get_group('ring') / get_group('ulysses')"
            )
    M = q.shape[2] if call is not None else 0
    N = k.shape[2] if call is not None else 0
    own = problem

    # Stage 1: the ulysses group
    row = _row(
        _STAGE_ULYSSES,
        call,
        problem is not None,
        causal,
        kv_sharded,
        return_lse,
        bias_sharding,
        M,
        N,
        u_rank,
        U,
        device,
    )
    rows_u = (
        all_gather_rows(row, ulysses_group, "exchanging the call's description (ulysses group)")
        if U > 1
        else row.view(1, -1)
    )
    if problem is None:
        problem = _check_rows(rows_u, "ulysses group", kv_sharded, bias_sharding)
    q_lens_u = [int(x) for x in rows_u[:, _IDX["M"]].tolist()]
    k_lens_u = [int(x) for x in rows_u[:, _IDX["N"]].tolist()]
    rows_mode = bool(call is not None and call.bias is not None and _bias_rows_mode(rows_u))

    # Stage 2: the ring group; its rows describe the ulysses groups' totals
    call2 = call if problem is None else None
    row = _row(
        _STAGE_RING,
        call2,
        problem is not None,
        causal,
        kv_sharded,
        return_lse,
        bias_sharding,
        sum(q_lens_u),
        sum(k_lens_u),
        u_rank,
        U,
        device,
    )
    if call2 is not None:
        row[_IDX["H"]] = row[_IDX["H"]] // U if kv_sharded is not False else row[_IDX["H"]]
        # with kv_sharded='auto': whether this rank's ulysses group all hold the same k, v,
        # and the same key-sharded mask
        row[_IDX["kv_uniform"]] = float(_same_kv(rows_u))
        row[_IDX["key_bias_uniform"]] = float(_same(rows_u, "bias_sum"))
    rows_r = (
        all_gather_rows(row, ring_group, "exchanging the call's description (ring group)") if R > 1 else row.view(1, -1)
    )
    if problem is None:
        problem = _check_rows(rows_r, "ring group", kv_sharded, bias_sharding) or _disagreement(
            rows_r, ("ulysses_index",), "ring group"
        )
    # k and v whole on every rank: said (kv_sharded=False, checked above), or found
    # ('auto', from the exchanged rows only: the same answer on every rank of the mesh)
    replicated = kv_sharded is False
    if kv_sharded == "auto" and problem is None:
        replicated, problem = _auto_whole(rows_r, causal, return_lse, R * U)
    layout = _Layout(
        U,
        u_rank,
        R,
        r_rank,
        q_lens_u,
        k_lens_u,
        [int(x) for x in rows_r[:, _IDX["M"]].tolist()],
        [int(x) for x in rows_r[:, _IDX["N"]].tolist()],
        rows_mode,
        replicated,
    )
    if problem is None and U > 1 and not replicated:
        H = call.q.shape[1]
        if H % U:
            divisors = [d for d in range(2, U + 1) if H % d == 0 and U % d == 0]
            way = (
                f"a 2-D mesh with ulysses degree {max(divisors)} and ring degree {U // max(divisors)}"
                if divisors
                else "ring_attention"
            )
            problem = (
                f"Ulysses splits the heads across its group: {H} heads do not divide among {U} ranks. "
                f"Use {way} (context_parallel_attention(ring_group=..., ulysses_group=...)), or ring_attention, "
                "which takes any number of heads"
            )
    if problem is None and call is not None and call.bias is not None and (bias_sharding == "query" or replicated):
        n_total = k.shape[2] if replicated else layout.n_total
        if call.bias.shape[3] != n_total:
            problem = (
                f"attn_bias has {call.bias.shape[3]} key columns but the sequence has {n_total} keys: with "
                "bias_sharding='query' each rank passes its query rows against every key (B|1, H|1, M_rank|1, N); "
                "a mask of this rank's keys only goes with bias_sharding='key'"
            )
    if problem is not None:
        raise ValueError(own if own is not None else problem)
    return layout
