"""int8_attention: attention with the query-key products in INT8 (int8/kernels.py), for
inference. Lossy: docs/int8.md says what it costs in accuracy and when to use it.

    from attnkit.kernels.int8 import int8_attention
    out = int8_attention(q, k, v, attn_bias=None, scale=None, causal=False, causal_offset=0)

The arguments are flash_attention's: q (B, H, M, D), k and v (B, H, N, D), 16-bit, head
dims 8-512, any strides with a contiguous last dim; attn_bias None, additive float or bool
(True = attend), broadcastable to (B, H, M, N), read as the exact kernel reads it (a key
bias as lengths, padded key tiles skipped); causal with an offset. A call that needs
gradients is refused (ValueError): the kernel has no backward, and a quantised
gradient would be a silent loss of a different kind. fp32 inputs are refused too: a
caller who chose fp32 asked for accuracy.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..flash import launch as fl
from ..flash import ops as fo
from .kernels import _attn_fwd_int8
from .quant import quantize_qk

# One tile for every call in this first version (no autotuning): 64 queries x 64 keys,
# 4 warps; under the interpreter the exact kernel's small tile, so that tests cross tiles.
BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES = 64, 64, 4, 2


def _check(q, k, v, attn_bias) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
            raise ValueError(f"{name}.dtype=torch.float32: the int8 attention takes float16 or bfloat16 inputs "
                             "(an fp32 model asked for accuracy: use an exact backend)")
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in (q, k, v, attn_bias)):
        raise ValueError("int8 attention is forward only: a call that needs gradients (an input requires grad "
                         "under autograd) is refused; run it under torch.no_grad() or use an exact backend")


def int8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_bias: Optional[torch.Tensor] = None,
                   scale: Optional[float] = None, *, causal: bool = False, causal_offset: int = 0) -> torch.Tensor:
    """softmax(q8 k8^T (dequantised) + attn_bias) v: see the module docstring."""
    _check(q, k, v, attn_bias)
    causal, causal_offset = fo._check_causal(causal, causal_offset)
    attn_bias, scale = fo._prepare(q, k, v, attn_bias, scale)
    if attn_bias is not None and attn_bias.dtype != torch.float32:
        attn_bias = fo._float32_bias(attn_bias)  # the int8 kernel reads float32 biases only
    B, H, M, D = q.shape
    N = k.shape[2]
    out = torch.empty_like(q)
    if out.numel() == 0:
        return out
    # The scale folds into qs, of either sign: the scores are taken in natural units.
    q8, qs, k8, ks, (dq0, dq1) = quantize_qk(q, k, scale)
    v = fl._kernel_layout(v)
    o = out if fl._addressable(out) else torch.empty(out.shape, dtype=out.dtype, device=out.device)
    bias, sb, lens, plain, sl, bias_constexprs, _ = fl._bias_args(attn_bias, q, (B, H, M, N))
    causal, off = fl._causal_args(causal, causal_offset, M, N)
    d0, d1 = fl._pieces(D)
    align = fl._align(*v.stride()[:3], *o.stride()[:3])
    bm, bn = (fl.INTERPRET_CONFIG.block_m, fl.INTERPRET_CONFIG.block_n) if fl.INTERPRET else (BLOCK_M, BLOCK_N)
    grid = (math.ceil(M / bm), H, B)
    _attn_fwd_int8[grid](
        q8, k8, qs, ks, v, bias, lens, plain, o,
        *v.stride()[:3], *sb, *sl, *o.stride()[:3],
        H, M, N, off,
        HEAD_DIM=D, D0=d0, D1=d1, DQ0=dq0, DQ1=dq1, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, ALIGN=align,
        EMULATE_BF16=fl.INTERPRET and q.dtype == torch.bfloat16, **bias_constexprs,
        **({} if fl.INTERPRET else {"num_warps": NUM_WARPS, "num_stages": NUM_STAGES}),
    )
    if o is not out:
        out.copy_(o)
    return out
