"""vanilla: baddbmm + softmax + bmm, as diffusers' AttnProcessor computes it.

The readable reference path, and the "Base Attention" of the published tables. It holds
the full (B*H, M, N) score matrix in memory.
"""

from __future__ import annotations

import torch

from .base import Backend, Capabilities
from .tensors import causal_mask, fix_dead_rows, narrow_bias

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
    causal_offset: int | None = None,
    dropout_p: float = 0.0,
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
        base = torch.zeros(1, 1, 1, dtype=q.dtype, device=q.device).expand(q.shape[0], q.shape[1], k.shape[1])
        scores = torch.baddbmm(base, q, k.transpose(-1, -2), beta=0, alpha=scale)
    else:
        scores = torch.baddbmm(attn_bias, q, k.transpose(-1, -2), beta=1, alpha=scale)
    if upcast:
        scores = scores.float()
    if causal_offset is not None:
        scores = scores.masked_fill(causal_mask(q.shape[1], k.shape[1], causal_offset, q.device), float("-inf"))
    probs = _softmax(scores, attn_bias is not None or causal_offset is not None).to(v.dtype)
    if dropout_p > 0.0:
        probs = torch.nn.functional.dropout(probs, p=dropout_p, training=True)
    return torch.bmm(probs, v).to(out_dtype)


def math_attention_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: torch.Tensor | None = None,
    scale: float | None = None,
    causal_offset: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q @ k^T * scale + attn_bias) @ v and its row log-sum-exp, in plain torch.

    q: (B, H, M, D); k: (B, H, N, D); v: (B, H, N, Dv); attn_bias: additive float (or
    bool, True = attend) broadcastable to (B, H, M, N); scale defaults to D ** -0.5;
    causal_offset as in Backend.forward. Returns out (B, H, M, Dv) in q's dtype and lse
    (B, H, M) in float32 (float64 for float64 inputs).

    Scores are computed in float32 (float64 for float64 inputs) and held whole. A row
    with no visible key gives out = 0, lse = -inf, and zero gradients, forward and
    backward free of NaN: the row maximum is a detached constant (the result does not
    depend on it) and every division and log sees a safe denominator.
    """
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    scores = torch.matmul(q.to(cdt), k.to(cdt).transpose(-1, -2)) * scale
    if attn_bias is not None:
        if attn_bias.dtype == torch.bool:
            scores = scores.masked_fill(~attn_bias, float("-inf"))
        else:
            scores = scores + attn_bias.to(cdt)
    if causal_offset is not None:
        hidden = causal_mask(q.shape[-2], k.shape[-2], int(causal_offset), q.device)
        scores = scores.masked_fill(hidden, float("-inf"))
    row_max = scores.detach().amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isneginf(row_max), torch.zeros_like(row_max), row_max)
    p = torch.exp(scores - row_max)
    denom = p.sum(dim=-1, keepdim=True)
    dead = denom == 0
    safe = torch.where(dead, torch.ones_like(denom), denom)
    out = torch.matmul(p / safe, v.to(cdt))
    lse = torch.where(dead, torch.full_like(denom, float("-inf")), row_max + torch.log(safe))
    return out.to(q.dtype), lse.squeeze(-1)


def math_bias(attn_bias, dtype: torch.dtype, upcast: bool):
    """The bias of the math backends (vanilla, sliced) in the dtype their scores are
    computed in (float32 when upcast widens half inputs), and the rows the cast cannot keep
    (see narrow_bias). Not diffusers' mask made a bias (protocol.prepare_bias)."""
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


# What plain torch math serves: every device and float dtype, and everything else.
MATH_CAPABILITIES = Capabilities(
    devices=frozenset({"cpu", "cuda", "mps", "xpu"}),
    dtypes=_FLOATS,
    causal=True,
    dropout=True,
    lse=True,
    deterministic=True,
)


class VanillaBackend(Backend):
    name = "vanilla"
    capabilities = MATH_CAPABILITIES

    def forward(self, q, k, v, attn_bias=None, scale=None, upcast=False, *, causal_offset=None, dropout_p=0.0):
        b, h, m, d = q.shape
        scale = d**-0.5 if scale is None else scale
        attn_bias, dead = math_bias(attn_bias, q.dtype, upcast)
        out = bmm_attention(
            flatten_heads(q),
            flatten_heads(k),
            flatten_heads(v),
            flatten_bias(attn_bias, b, h),
            scale,
            upcast,
            causal_offset,
            dropout_p,
        )
        return fix_dead_rows(out.view(b, h, m, v.shape[-1]), v, dead)

    def forward_with_lse(self, q, k, v, attn_bias=None, scale=None, upcast=False, *, causal_offset=None):
        # scores are float32 here whatever the inputs: upcast is the case already
        return math_attention_with_lse(q, k, v, attn_bias, scale, causal_offset)
