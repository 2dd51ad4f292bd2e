"""How the ranks agree on a context-parallel call before computing it.

Every rank describes its call in one small row of numbers (lengths, shapes, dtype,
options, fingerprints of k and v, whether it refuses the call); the rows are exchanged
and every rank checks every other's, so a refusal, a mismatch between ranks or a bad
argument on one rank makes every rank raise the same error at the same point. The same
exchange gives each rank the layout of the whole sequence (every shard's length).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

from ..masks import to_additive_bias
from .comm import all_gather_rows, group_rank
from .local import check_local_attention

logger = logging.getLogger("attnkit.parallel")

BIAS_SHARDINGS = ("query", "key")

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool)

# The row of numbers each rank contributes; the names are used in error messages.
_FIELDS = (
    "stage",
    "refused",
    "global_rank",
    "B",
    "H",
    "D",
    "Dv",
    "dtype",
    "device",
    "causal",
    "scale",
    "kv_sharded",
    "return_lse",
    "grad",
    "bias",
    "bias_B",
    "bias_H",
    "bias_rows",
    "bias_N",
    "bias_dtype",
    "M",
    "N",
    "ulysses_index",
    "ulysses_size",
    "k_sum",
    "v_sum",
    "bias_sum",
    "n_local",
    "kv_uniform",
    "key_bias_uniform",
)
_IDX = {name: i for i, name in enumerate(_FIELDS)}
_LABELS = {
    "stage": "which function they called (ring / Ulysses stage of the call)",
    "B": "batch size",
    "H": "number of heads",
    "D": "head dim of q and k",
    "Dv": "head dim of v",
    "dtype": "dtype",
    "device": "device type",
    "causal": "causal",
    "scale": "scale",
    "kv_sharded": "kv_sharded (True / False / 'auto')",
    "return_lse": "return_lse",
    "grad": "whether gradients are needed (q, k or v requires grad); a backward on some ranks only would wait for ever",
    "bias": "attn_bias (None / bias_sharding='query' / bias_sharding='key')",
    "bias_B": "attn_bias's batch dim",
    "bias_H": "attn_bias's head dim",
    "bias_N": (
        "attn_bias's key dim: with bias_sharding='query' every rank passes its query rows against every key "
        "of the sequence; a mask of each rank's own keys goes with bias_sharding='key'"
    ),
    "bias_dtype": "attn_bias's dtype",
    "ulysses_size": "the size of their ulysses_group",
    "ulysses_index": "their rank in their ulysses_group (ring peers must hold the same heads)",
    "k_sum": "k (kv_sharded=False: every rank must pass the same, whole k)",
    "v_sum": "v (kv_sharded=False: every rank must pass the same, whole v)",
    "n_local": "the number of keys (kv_sharded=False: every rank must pass the same, whole k and v)",
}
_STAGE_ULYSSES, _STAGE_RING = 1.0, 2.0
# kv_sharded as a number: the ranks must agree on it
_KV_MODES = {True: 1.0, False: 0.0, "auto": 2.0}


@dataclass
class _Call:
    """This rank's side of the call, checked locally."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    bias: Optional[torch.Tensor]  # 4-D, additive float, or None
    scale: float
    grad: bool


# -- local checks ---------------------------------------------------------------------------

# What the probe of each (local attention, dtype, device type, head dims) said: probed once.
_PROBED: dict = {}
_PROBED_MAX = 256  # a caller that makes a new callable per call is probed every call


def _probe(local: Callable, dtype: torch.dtype, device: torch.device, D: int, Dv: int) -> Optional[str]:
    key = (local, dtype, device.type, D, Dv)
    try:
        if key in _PROBED:
            return _PROBED[key]
    except TypeError:  # unhashable: probed every call
        return check_local_attention(local, dtype, device, D, Dv)
    if len(_PROBED) >= _PROBED_MAX:
        _PROBED.clear()
    _PROBED[key] = check_local_attention(local, dtype, device, D, Dv)
    return _PROBED[key]


def _prepare(q, k, v, attn_bias, scale, bias_sharding, kv_sharded, local) -> _Call:
    """Check this rank's arguments; ValueError names what is wrong and what to do."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor (B, H, S, D); got {shape}")
    if not (q.dtype == k.dtype == v.dtype) or not q.dtype.is_floating_point:
        raise ValueError(f"q, k, v must share one floating dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    B, H, M, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {B}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != H or v.shape[1] != H:
        raise ValueError(
            f"q has {H} heads, k {k.shape[1]}, v {v.shape[1]}: grouped-query attention is not supported "
            "under context parallelism; repeat k and v to q's heads (k.repeat_interleave(H // H_kv, dim=1))"
        )
    if k.shape[3] != D:
        raise ValueError(f"q's head dim is {D} but k's is {k.shape[3]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k has {k.shape[2]} keys but v has {v.shape[2]} values")
    if bias_sharding not in BIAS_SHARDINGS:
        raise ValueError(f"bias_sharding={bias_sharding!r}: choose 'query' or 'key'")
    problem = _probe(local, q.dtype, q.device, D, v.shape[3])
    if problem:
        raise ValueError(problem)
    bias = attn_bias
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise ValueError(f"attn_bias must be a tensor or None; got {type(bias).__name__}")
        if bias.requires_grad and torch.is_grad_enabled():
            raise ValueError(
                "attn_bias requires grad: its gradient is not implemented under context parallelism. "
                "Pass attn_bias.detach() for a fixed mask, or compute a learned bias's gradient on one device"
            )
        if bias.dim() > 4:
            raise ValueError(f"attn_bias has {bias.dim()} dims; at most 4, broadcastable to (B, H, M, N)")
        if bias.device != q.device:
            raise ValueError(f"attn_bias is on {bias.device}, q on {q.device}")
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
        # True = attend; -inf and 0 are exact in every float dtype
        bias = to_additive_bias(
            bias, q.dtype, dtype_error="attn_bias must be additive float or bool (True = attend); got {dtype}"
        )
        bb, bh, bm, bn = bias.shape
        if bb not in (1, B) or bh not in (1, H):
            raise ValueError(f"attn_bias {tuple(attn_bias.shape)} does not broadcast to batch {B}, heads {H}")
        if bias_sharding == "key":
            if bm != 1 or bn != k.shape[2]:
                raise ValueError(
                    f"bias_sharding='key': attn_bias must be this rank's key columns, broadcast over queries, "
                    f"(B|1, H|1, 1, N_rank) = (.., 1, {k.shape[2]}); got {tuple(attn_bias.shape)}. A bias that "
                    "varies with the query row goes by query rows: bias_sharding='query'"
                )
        elif bm not in (1, M):
            raise ValueError(
                f"attn_bias has {bm} query rows but this rank holds {M} queries: with bias_sharding='query' each rank "
                "passes the rows of its own queries (or 1 row, broadcast)"
            )
    scale = D**-0.5 if scale is None else float(scale)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return _Call(q, k, v, bias, scale, grad)


# -- the exchange of call descriptions --------------------------------------------------------


def _row(
    stage,
    call: Optional[_Call],
    refused: bool,
    causal,
    kv_sharded,
    return_lse,
    bias_sharding,
    M,
    N,
    u_index,
    u_size,
    device,
):
    r = [0.0] * len(_FIELDS)
    r[_IDX["stage"]] = stage
    r[_IDX["refused"]] = float(refused)
    r[_IDX["global_rank"]] = float(dist.get_rank())
    r[_IDX["causal"]] = float(bool(causal))
    r[_IDX["kv_sharded"]] = _KV_MODES[kv_sharded]
    r[_IDX["return_lse"]] = float(bool(return_lse))
    r[_IDX["ulysses_index"]] = float(u_index)
    r[_IDX["ulysses_size"]] = float(u_size)
    if call is not None and not refused:
        q, k, v = call.q, call.k, call.v
        r[_IDX["B"]], r[_IDX["H"]], r[_IDX["D"]], r[_IDX["Dv"]] = q.shape[0], q.shape[1], q.shape[3], v.shape[3]
        r[_IDX["dtype"]] = _DTYPES.index(q.dtype) if q.dtype in _DTYPES else -1
        r[_IDX["device"]] = {"cpu": 0, "cuda": 1}.get(q.device.type, 2)
        r[_IDX["scale"]] = call.scale
        r[_IDX["grad"]] = float(call.grad)
        r[_IDX["M"]], r[_IDX["N"]] = float(M), float(N)
        if call.bias is not None:
            bb, bh, bm, bn = call.bias.shape
            r[_IDX["bias"]] = 1.0 + BIAS_SHARDINGS.index(bias_sharding)
            r[_IDX["bias_B"]], r[_IDX["bias_H"]], r[_IDX["bias_N"]] = bb, bh, bn
            # 0: one row broadcast to every query; 1: a row per query; 2: either (<= 1 query)
            r[_IDX["bias_rows"]] = 2.0 if q.shape[2] <= 1 else (0.0 if bm == 1 else 1.0)
            r[_IDX["bias_dtype"]] = _DTYPES.index(call.bias.dtype) if call.bias.dtype in _DTYPES else -1
            if bm == 1:  # one row for every query: Ulysses may keep it without an exchange
                r[_IDX["bias_sum"]] = _fingerprint_small(call.bias)
        r[_IDX["n_local"]] = float(k.shape[2])
        if kv_sharded is not True:
            r[_IDX["k_sum"]] = _fingerprint(k)
            r[_IDX["v_sum"]] = _fingerprint(v)
    return torch.tensor(r, dtype=torch.float64, device=device)


def _weights(n: int, device, dtype=torch.float64) -> torch.Tensor:
    # irrational steps: a different weight at every position, all in [0.5, 1.5)
    return (torch.arange(1, n + 1, dtype=torch.float64, device=device) * 0.6180339887498949 % 1.0 + 0.5).to(dtype)


def _fingerprint_small(t: torch.Tensor) -> float:
    """A number that differs, short of a crafted collision, between tensors of the same
    shape with different values or the same values in different places (-inf included).
    For small tensors: one float64 copy."""
    x = torch.nan_to_num(t.detach().double(), nan=1.5e11, posinf=2.5e11, neginf=-3.5e11).reshape(-1)
    return float((x * _weights(x.numel(), x.device)).sum())


def _fingerprint(t: torch.Tensor) -> float:
    """The same for k or v of any size, without a copy: each row (last dim) projected
    on fixed weights in t's dtype (a matrix-vector product, the same bits for the same
    tensor), then the rows weighted by position in float64. Memory: one number a row."""
    x = t.detach()
    if x.numel() == 0:
        return 0.0
    rows = torch.matmul(x, _weights(x.shape[-1], x.device, x.dtype))
    return float((rows.double().reshape(-1) * _weights(rows.numel(), x.device)).sum())


def _same_kv(rows: torch.Tensor) -> bool:
    """Every row's k and v: the same count and the same fingerprints."""
    cols = rows[:, [_IDX["n_local"], _IDX["k_sum"], _IDX["v_sum"]]]
    return bool((cols == cols[0]).all())


def _same(rows: torch.Tensor, field: str) -> bool:
    col = rows[:, _IDX[field]]
    return bool((col == col[0]).all())


def _auto_whole(rows: torch.Tensor, causal, return_lse, world: int) -> tuple[bool, Optional[str]]:
    """kv_sharded='auto': (whether k and v are whole on every rank, or a refusal).

    k or v that differ between ranks are shards. k and v the same on every rank (N keys)
    are either the whole key sequence, or ``world`` equal shards of a sequence of
    world * N keys; only what else the call says can tell them apart, and it is used
    only where it does:

    - a mask by query rows has a column per key of the sequence: N columns, whole;
      world * N, shards;
    - a mask by key columns (bias_sharding='key') that differs between ranks masks
      different keys: shards;
    - otherwise (no mask, or the same key mask on every rank) both readings give the
      same output, and the keys are taken as whole (no transfer); but causal attention
      (a query sees keys up to its position among N or among world * N) and the
      log-sum-exp (larger by log(world) over the copies) differ, so those are refused.
    """
    if not (bool((rows[:, _IDX["kv_uniform"]] == 1).all()) and _same_kv(rows)):
        return False, None
    n = int(rows[0, _IDX["n_local"]])
    kind = int(rows[0, _IDX["bias"]])
    said = (
        f"kv_sharded='auto': k and v are the same {n} keys on every rank, either the whole key sequence on "
        f"every rank or {world} equal shards of a sequence of {world * n} keys"
    )
    say_which = (
        "Say which: kv_sharded=False (every rank holds the whole k and v) or kv_sharded=True (each rank its shard)"
    )
    if kind == 1 + BIAS_SHARDINGS.index("query"):
        columns = int(rows[0, _IDX["bias_N"]])
        if columns == n:
            return True, None
        if columns == world * n:
            return False, None
        return False, (
            f"{said}; attn_bias (bias_sharding='query') has {columns} key columns, which fits neither ({n} whole, "
            f"{world * n} sharded). Pass a mask with a column per key of the sequence; {say_which}"
        )
    if kind == 1 + BIAS_SHARDINGS.index("key") and not (
        bool((rows[:, _IDX["key_bias_uniform"]] == 1).all()) and _same(rows, "bias_sum")
    ):
        return False, None  # a different mask on each rank: different keys
    if causal:
        return False, (
            f"{said}, and with causal=True they give different answers (a query sees the keys up to its position "
            f"among {n} or among {world * n}). {say_which}"
        )
    if return_lse:
        return False, (
            f"{said}; both give the same output but not the same log-sum-exp (larger by log({world}) over "
            f"{world} copies), and return_lse=True asks for it. {say_which}"
        )
    return True, None


def _bias_rows_mode(rows: torch.Tensor) -> bool:
    """Whether Ulysses must exchange the bias's query rows: yes if some rank passes a row
    per query, or the ranks' one-row biases are not the same row (or every rank holds at
    most one query, where the two readings cannot be told apart and rows are always right)."""
    codes = [int(x) for x in rows[:, _IDX["bias_rows"]].tolist()]
    if 1 in codes or all(c == 2 for c in codes):
        return True
    sums = rows[:, _IDX["bias_sum"]].tolist()
    return any(x != sums[0] for x in sums)


def _show(field: str, value: float):
    if field == "dtype" or field == "bias_dtype":
        return str(_DTYPES[int(value)]) if 0 <= value < len(_DTYPES) else "?"
    if field == "device":
        return {0: "cpu", 1: "cuda"}.get(int(value), "other")
    if field == "bias":
        return ("None", "query", "key")[int(value)]
    if field == "kv_sharded":
        return {1.0: True, 0.0: False, 2.0: "auto"}.get(value, value)
    if field in ("causal", "return_lse", "grad"):
        return bool(value)
    if field == "stage":
        return {1: "Ulysses", 2: "ring"}.get(int(value), "?")
    if field in ("scale", "k_sum", "v_sum"):
        return value
    return int(value)


def _disagreement(rows: torch.Tensor, fields: Sequence[str], who: str) -> Optional[str]:
    ranks = [int(x) for x in rows[:, _IDX["global_rank"]].tolist()]
    for f in fields:
        col = rows[:, _IDX[f]].tolist()
        same = all(c == col[0] or (math.isnan(c) and math.isnan(col[0])) for c in col)
        if not same:
            by = "; ".join(f"rank {r}: {_show(f, c)}" for r, c in zip(ranks, col))
            return f"the ranks of the {who} disagree on {_LABELS.get(f, f)} ({by})"
    return None


def _refusal(rows: torch.Tensor, who: str) -> Optional[str]:
    refused = [int(r) for r, x in zip(rows[:, _IDX["global_rank"]].tolist(), rows[:, _IDX["refused"]].tolist()) if x]
    if refused:
        return (
            f"rank(s) {', '.join(map(str, refused))} of the {who} refused this context-parallel call "
            "(their own error names the problem); every rank stops here"
        )
    return None


_AGREE = (
    "stage",
    "B",
    "H",
    "D",
    "Dv",
    "dtype",
    "device",
    "causal",
    "scale",
    "kv_sharded",
    "return_lse",
    "grad",
    "bias",
    "bias_B",
    "bias_H",
    "bias_dtype",
    "ulysses_size",
)


def _check_rows(rows: torch.Tensor, who: str, kv_sharded, bias_sharding: str) -> Optional[str]:
    problem = _refusal(rows, who) or _disagreement(rows, _AGREE, who)
    if problem is None and kv_sharded is False:
        problem = _disagreement(rows, ("n_local", "k_sum", "v_sum"), who)
    if problem is None and rows[0, _IDX["bias"]] == 1.0:
        problem = _disagreement(rows, ("bias_N",), who)
    if problem is None and rows[0, _IDX["bias"]] != 0.0:
        modes = {int(x) for x in rows[:, _IDX["bias_rows"]].tolist()} - {2}
        if len(modes) > 1:
            problem = (
                f"the ranks of the {who} pass attn_bias differently: some one row broadcast to every query, "
                "some a row per query; pass the same kind on every rank"
            )
    return problem


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


# -- the public functions ---------------------------------------------------------------------
