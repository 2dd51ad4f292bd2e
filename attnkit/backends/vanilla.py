"""vanilla: baddbmm + softmax + bmm, as diffusers' AttnProcessor computes it.

The readable reference path, and the "Base Attention" of the published tables. It holds
the full (B*H, M, N) score matrix in memory.
"""

from __future__ import annotations

import torch

from .base import Backend, Capabilities, fix_dead_rows, narrow_bias

_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


def _softmax(scores: torch.Tensor, masked: bool) -> torch.Tensor:
    # A row whose keys are all masked (-inf) gives 0, not NaN (the FlashAttention and
    # SDPA convention); only a masked call can produce such a row.
    # The aten op (unlike the torch._safe_softmax binding) is traceable by torch.compile.
    if masked and _SAFE_SOFTMAX is not None:
        return _SAFE_SOFTMAX(scores, -1)
    return scores.softmax(dim=-1)


_SAFE_SOFTMAX = getattr(getattr(torch.ops.aten, "_safe_softmax", None), "default", None)


def bmm_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: torch.Tensor | None,
    scale: float,
    upcast: bool,
) -> torch.Tensor:
    """Attention on 3-D (batch*heads, tokens, D) tensors; attn_bias broadcastable to
    (batch*heads, M, N). Scores in float32 when upcast is set."""
    out_dtype = q.dtype
    # upcast only widens: float32/float64 inputs are already "upcast".
    upcast = upcast and q.dtype in (torch.float16, torch.bfloat16)
    if upcast:
        q = q.float()
        k = k.float()
    if attn_bias is None:
        # zeros, not torch.empty: with beta=0 the input is ignored on CPU and CUDA, but
        # uninitialised memory has propagated NaN on MPS.
        base = torch.zeros(1, 1, 1, dtype=q.dtype, device=q.device).expand(
            q.shape[0], q.shape[1], k.shape[1]
        )
        scores = torch.baddbmm(base, q, k.transpose(-1, -2), beta=0, alpha=scale)
    else:
        scores = torch.baddbmm(attn_bias, q, k.transpose(-1, -2), beta=1, alpha=scale)
    if upcast:
        scores = scores.float()
    probs = _softmax(scores, attn_bias is not None).to(v.dtype)
    return torch.bmm(probs, v).to(out_dtype)


def prepare_bias(attn_bias, dtype: torch.dtype, upcast: bool):
    """The bias in the dtype the scores are computed in (float32 when upcast widens half
    inputs), and the rows the cast cannot keep (see narrow_bias)."""
    if attn_bias is None:
        return None, None
    if upcast and dtype in (torch.float16, torch.bfloat16):
        dtype = torch.float32
    return narrow_bias(attn_bias, dtype)


def flatten_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, N, D) -> (B*H, N, D); copies only if the layout needs it."""
    b, h, n, d = x.shape
    return x.reshape(b * h, n, d)


def flatten_bias(attn_bias: torch.Tensor | None, b: int, h: int) -> torch.Tensor | None:
    """A bias broadcastable to (B, H, M, N) as one broadcastable to (B*H, M, N).

    Materialises B*H*m*N elements, m being the bias's own query extent (1 for key
    padding), which is what diffusers' prepare_attention_mask does too.
    """
    if attn_bias is None:
        return None
    m, n = attn_bias.shape[-2:]
    if attn_bias.shape[0] == 1 and attn_bias.shape[1] == 1:
        return attn_bias.reshape(1, m, n)
    return attn_bias.expand(b, h, m, n).reshape(b * h, m, n)


class VanillaBackend(Backend):
    name = "vanilla"
    capabilities = Capabilities(
        devices=frozenset({"cpu", "cuda", "mps", "xpu"}),
        dtypes=_FLOATS,
        deterministic=True,
    )

    def forward(self, q, k, v, attn_bias=None, scale=None, upcast=False):
        b, h, m, d = q.shape
        scale = d**-0.5 if scale is None else scale
        attn_bias, dead = prepare_bias(attn_bias, q.dtype, upcast)
        out = bmm_attention(
            flatten_heads(q), flatten_heads(k), flatten_heads(v), flatten_bias(attn_bias, b, h),
            scale, upcast,
        )
        return fix_dead_rows(out.view(b, h, m, v.shape[-1]), v, dead)
