"""Context parallelism: attention over a sequence split across ranks of torch.distributed
process groups (gloo on the CPU, NCCL on GPUs).

    ring_attention(q, k, v, attn_bias=None, scale=None, *, group, causal=False, local=math_attention)
    ulysses_attention(q, k, v, ..., group=...)
    context_parallel_attention(q, k, v, ..., ring_group=..., ulysses_group=...)

q, k, v are this rank's shard of the sequence, (B, H, S_rank, D), any lengths. See
:func:`context_parallel_attention` for masks, cross-attention and causal attention, and
:mod:`attnkit.parallel.local` for the local attention each rank runs.
"""

from .api import context_parallel_attention, ring_attention, ulysses_attention
from .comm import CommCounter, ContextParallelError, count_bytes
from .local import LocalAttention, math_attention, merge_partials

__all__ = [
    "CommCounter",
    "ContextParallelError",
    "LocalAttention",
    "context_parallel_attention",
    "count_bytes",
    "math_attention",
    "merge_partials",
    "ring_attention",
    "ulysses_attention",
]
