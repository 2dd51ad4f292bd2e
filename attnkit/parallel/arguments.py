"""This rank's side of a context-parallel call, checked before the ranks compare theirs.

Every argument error a rank can see alone (shapes, dtypes, devices, the mask's form, a
local attention that cannot run the call) is found here, so that the exchange in
:mod:`.agree` has only what the ranks must agree on left to check. The probe of a local
attention is cached, as it costs a call of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..masks import to_additive_bias
from .local import check_local_attention

BIAS_SHARDINGS = ("query", "key")


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

# What the probe of each (local attention, dtype, device type, head dims) said: probed once;
# at most _PROBED_MAX entries (cleared when full); never stale (a callable's answer is fixed).
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
