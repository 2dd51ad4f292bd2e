"""int8: attnkit's INT8 attention (attnkit.kernels.int8), lossy, for inference.

Never in auto()'s priority orders: a lossy backend runs only where asked for,
``attnkit.auto(lossy="int8")`` or ``set_attention_backend("attnkit_int8")``, and then
under the quality guard (attnkit/choose/guard.py) that compares a sample of its rows with
an exact backend and falls back by itself. It takes what the exact Triton kernel takes,
except gradients (forward only), fp32 inputs (a caller who chose fp32 asked for
accuracy) and the log-sum-exp.
"""

from __future__ import annotations

import torch

import attnkit.kernels.limits as limits

from .base import MASK_KINDS, Capabilities
from .triton import TritonBackend


class Int8Backend(TritonBackend):
    name = "int8"
    lossy = True  # what explain() and the guard go by
    capabilities = Capabilities(
        devices=frozenset({"cuda"}),
        dtypes=frozenset({torch.float16, torch.bfloat16}),
        min_head_dim=limits.MIN_HEAD_DIM,
        max_head_dim=limits.MAX_HEAD_DIM,
        # integer tensor-core MMA (mma.sync s8) from Ampere; the kernel is compiled and
        # checked for sm_80 and sm_90 (the static report's int8 rows); Triton does not compile
        # an int8 tl.dot for sm_75 (Turing's IMMA.8816 is not emitted)
        min_capability=(8, 0),
        masks=frozenset(MASK_KINDS),
        backward=False,
        causal=True,
        lse=False,
        deterministic=True,
        package="triton",
        min_version="3.0",
        install_hint="pip install 'attnkit[triton]' (Linux; triton ships with CUDA builds of torch)",
    )

    def __init__(self) -> None:
        super().__init__(allow_tf32=False)

    def __repr__(self) -> str:
        return "Int8Backend()"

    def extra_reasons(self, call):
        d = min(max(call.head_dim, limits.MIN_HEAD_DIM), limits.MAX_HEAD_DIM)
        return limits.input_problems(
            d, call.batch or 1, call.heads or 1, call.q_len or 1, 1 if call.kv_len is None else call.kv_len
        )

    def forward(self, q, k, v, attn_bias=None, scale=None, upcast=False, *, causal_offset=None, dropout_p=0.0):
        from attnkit.kernels.int8 import int8_attention

        return int8_attention(
            q, k, v, attn_bias, scale, causal=causal_offset is not None, causal_offset=causal_offset or 0
        )

    def forward_with_lse(self, *args, **kwargs):
        raise NotImplementedError("the int8 backend does not return the log-sum-exp")
