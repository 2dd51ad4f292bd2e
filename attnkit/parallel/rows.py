"""A context-parallel call as one row of numbers, and the checks of the gathered rows.

Each rank describes its call in a fixed row (lengths, shapes, dtype, options, fingerprints
of k and v, whether it refuses); numbers gather in one collective, where objects would need
pickling. This module holds the row's fields, how a row is made from a call, and what the
rows of a group must share: every rank runs the same checks on the same rows, so every rank
reaches the same verdict and the same words for it.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from .arguments import BIAS_SHARDINGS, _Call

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
