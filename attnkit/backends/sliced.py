"""sliced: vanilla attention computed a few (batch*head) rows at a time.

Peak attention memory is slice_size * M * N scores instead of B*H*M*N: the way to fit
large images (or the VAE's 4096x4096 single-head attention) in little memory.
"""

from __future__ import annotations

import torch

from .base import Backend
from .tensors import fix_dead_rows
from .vanilla import (
    MATH_CAPABILITIES,
    bmm_attention,
    flatten_bias,
    flatten_heads,
    math_attention_with_lse,
    math_bias,
)


def resolve_slice_size(slice_size: int | str, heads: int, rows: int) -> int:
    """Rows of (batch*heads) per slice. "auto": half the heads; "max": one at a time."""
    if slice_size == "auto":
        return max(1, heads // 2)
    if slice_size == "max":
        return 1
    return max(1, min(int(slice_size), rows))  # at least 1: an empty batch has 0 rows


class SlicedBackend(Backend):
    name = "sliced"
    capabilities = MATH_CAPABILITIES

    def __init__(self, slice_size: int | str = "auto"):
        if isinstance(slice_size, str):
            if slice_size not in ("auto", "max"):
                raise ValueError(
                    f"slice_size={slice_size!r}: use a positive int, 'auto' (half the heads) "
                    "or 'max' (one head at a time)"
                )
        elif isinstance(slice_size, bool) or not isinstance(slice_size, int) or slice_size < 1:
            raise ValueError(
                f"slice_size={slice_size!r}: use a positive int, 'auto' (half the heads) or 'max' (one head at a time)"
            )
        self.slice_size = slice_size

    def __repr__(self) -> str:
        return f"SlicedBackend(slice_size={self.slice_size!r})"

    def _slices(self, b: int, h: int):
        """(start, end) row ranges of the (B*H) rows: ceil division, the last slice
        shorter."""
        rows = b * h
        step = resolve_slice_size(self.slice_size, h, rows)
        return [(start, min(start + step, rows)) for start in range(0, rows, step)]

    def forward(self, q, k, v, attn_bias=None, scale=None, upcast=False, *, causal_offset=None, dropout_p=0.0):
        b, h, m, d = q.shape
        scale = d**-0.5 if scale is None else scale
        q3, k3, v3 = flatten_heads(q), flatten_heads(k), flatten_heads(v)
        attn_bias, dead = math_bias(attn_bias, q.dtype, upcast)
        bias = flatten_bias(attn_bias, b, h)
        out = torch.empty(b * h, m, v.shape[-1], dtype=q.dtype, device=q.device)
        for start, end in self._slices(b, h):
            sl_bias = None
            if bias is not None:
                sl_bias = bias if bias.shape[0] == 1 else bias[start:end]
            out[start:end] = bmm_attention(
                q3[start:end], k3[start:end], v3[start:end], sl_bias, scale, upcast, causal_offset, dropout_p
            )
        return fix_dead_rows(out.view(b, h, m, v.shape[-1]), v, dead)

    def forward_with_lse(self, q, k, v, attn_bias=None, scale=None, upcast=False, *, causal_offset=None):
        b, h, m, d = q.shape
        q3, k3, v3 = (x.reshape(b * h, 1, *x.shape[-2:]) for x in (q, k, v))
        bias = None
        if attn_bias is not None:
            bias = attn_bias.expand(b, h, *attn_bias.shape[-2:]).reshape(b * h, 1, *attn_bias.shape[-2:])
        outs, lses = [], []
        for start, end in self._slices(b, h):
            o, lse = math_attention_with_lse(
                q3[start:end],
                k3[start:end],
                v3[start:end],
                None if bias is None else bias[start:end],
                scale,
                causal_offset,
            )
            outs.append(o)
            lses.append(lse)
        out = torch.cat(outs).reshape(b, h, m, v.shape[-1])
        return out, torch.cat(lses).reshape(b, h, m)
