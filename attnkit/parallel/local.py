"""The local attention that context parallelism runs on each shard, and how partial
results over disjoint key sets are merged.

A *local attention* is any callable

    local(q, k, v, attn_bias, scale, causal_offset=None) -> (out, lse)

q: (B, H, M, D), k: (B, H, N, D), v: (B, H, N, Dv), any strides; attn_bias None or an
additive float tensor broadcastable to (B, H, M, N) (broadcast dims may have stride 0; it
may hold -inf); scale a float; causal_offset None (not causal) or an int: query row i sees
key j iff j <= i + causal_offset (0 is the top-left convention of torch's SDPA
``is_causal``; a negative offset leaves rows with no visible key). It returns out
(B, H, M, Dv) in q's dtype and lse (B, H, M), the natural-log log-sum-exp of the scaled,
biased scores, in float32 (float64 for float64 inputs). A row with no visible key gives
out = 0 and lse = -inf. It is differentiable in q, k and v through both out and lse.

:func:`math_attention` is the plain-torch implementation of that contract: the fallback,
and what the tests hold the distributed paths to.
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

import torch

from ..backends.vanilla import math_attention_with_lse


class LocalAttention(Protocol):
    """The contract of a local attention (see the module docstring)."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_bias: Optional[torch.Tensor],
        scale: float,
        causal_offset: Optional[int] = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def accum_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision partial results are merged and accumulated in: float64 for float64
    inputs, float32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# the plain-torch contract is the vanilla backend's LSE path (one implementation)
math_attention = math_attention_with_lse


# A row whose largest bias is below this sees no key at an ordinary weight: it is a row
# masked everywhere with a finite value (-1e4, -1e9, finfo.min ...).
MASKED_ROW_BIAS = -1e3


def recenter_masked_rows(bias: torch.Tensor, row_max: torch.Tensor) -> torch.Tensor:
    """Subtract from each row masked everywhere with a finite value (row_max below
    MASKED_ROW_BIAS) its largest value; other rows are left as they are, bit for bit.

    bias: (B', H', M', N) additive; row_max: broadcastable to (B', H', M', 1), the row's
    max over ALL keys of the sequence. A constant per row cancels in the softmax, so the
    answer is unchanged; but partial results merge through lse, and an lse near -1e9
    (float32 steps of 64) or -3e38 cannot carry the log of a block's size: without this,
    such a row's blocks would be averaged with wrong weights.
    """
    shift = torch.where(torch.isfinite(row_max) & (row_max < MASKED_ROW_BIAS), row_max, torch.zeros_like(row_max))
    if not bool((shift != 0).any()):
        return bias
    wide = torch.promote_types(bias.dtype, torch.float32)
    return (bias.to(wide) - shift.to(wide)).to(bias.dtype)


def merge_partials(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine attention over two disjoint key sets into attention over their union.

    out_*: (B, H, M, Dv); lse_*: (B, H, M). Computed in the wider of the two lse dtypes
    (float32 at least); rows where both sides saw no key stay out = 0, lse = -inf.
    Returns (out, lse) in that dtype.
    """
    dt = torch.promote_types(torch.promote_types(lse_a.dtype, lse_b.dtype), torch.float32)
    la, lb = lse_a.to(dt), lse_b.to(dt)
    top = torch.maximum(la, lb)
    top = torch.where(torch.isneginf(top), torch.zeros_like(top), top)
    wa, wb = torch.exp(la - top), torch.exp(lb - top)
    total = wa + wb
    alive = total > 0
    safe = torch.where(alive, total, torch.ones_like(total))
    out = (out_a.to(dt) * wa.unsqueeze(-1) + out_b.to(dt) * wb.unsqueeze(-1)) / safe.unsqueeze(-1)
    lse = torch.where(alive, top + torch.log(safe), torch.full_like(top, float("-inf")))
    return out, lse


def check_local_attention(
    local: Callable, dtype: torch.dtype, device: torch.device, head_dim: int, v_dim: int
) -> Optional[str]:
    """Call ``local`` once on a (1, 1, 2, D) problem and say what is wrong with what it
    returns, or None if it keeps the contract's shapes: (out (1, 1, 2, Dv), lse (1, 1, 2)
    floating). Context parallelism merges partial results through lse, so a local
    attention that returns only the output cannot be used."""
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k = (torch.randn(1, 1, 2, head_dim, generator=g).to(device=device, dtype=dtype) for _ in range(2))
    v = torch.randn(1, 1, 2, v_dim, generator=g).to(device=device, dtype=dtype)
    name = getattr(local, "__qualname__", None) or type(local).__name__
    try:
        got = local(q, k, v, None, head_dim**-0.5, None)
    except Exception as exc:  # the probe reports, the caller refuses
        return f"local attention {name} failed on a (1, 1, 2, {head_dim}) {dtype} probe: {type(exc).__name__}: {exc}"
    if not isinstance(got, (tuple, list)) or len(got) != 2 or not all(isinstance(t, torch.Tensor) for t in got):
        kind = type(got).__name__
        return (
            f"local attention {name} returned {kind}, not (out, lse): context parallelism merges "
            "partial results through the row log-sum-exp, so the local attention must return it "
            "(attnkit.parallel.math_attention does; a backend's *_with_lse function does)"
        )
    out, lse = got
    if tuple(out.shape) != (1, 1, 2, v_dim) or tuple(lse.shape) != (1, 1, 2):
        return (
            f"local attention {name} returned out {tuple(out.shape)} and lse {tuple(lse.shape)} for "
            f"q (1, 1, 2, {head_dim}), v (1, 1, 2, {v_dim}); expected out (1, 1, 2, {v_dim}) and lse (1, 1, 2)"
        )
    if not lse.dtype.is_floating_point:
        return f"local attention {name} returned lse of dtype {lse.dtype}; expected float32 (or float64)"
    return None
