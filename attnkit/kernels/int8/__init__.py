"""INT8 attention for inference: the query-key products on integer tensor cores, K smoothed
by its mean over tokens, P.V in the inputs' 16-bit dtype (lossy; docs/int8.md).

    kernels.py       the @triton.jit code
    quant.py         the smoothing and the quantisation of Q (per token) and K (per block of keys)
    quant_kernel.py  the same in Triton, one fused pass per tensor (bit for bit quant.py's)
    ops.py           int8_attention: checks, quantisation, launch

    from attnkit.kernels.int8 import int8_attention
"""

from .ops import int8_attention

__all__ = ["int8_attention"]
