"""The key lengths of a key bias, in one launch: per (batch, head) of a bias that does not
depend on the query, one past its last key that is not -inf (the kernels skip the key
tiles from there on), and whether the bias is 0 on every key before that (a padding
mask: the kernels then never load it). Ten torch operations did this before, some
70 us of host time per call on a GPU, more than the attention of a small call.

Not an attention kernel: a reduction over the bias's keys, launched through the same
launch plans (launcher.Launch) as the attention kernels, so after its first call it is a
direct launch of a compiled kernel. The static report does not compile it.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _key_lengths_kernel(Bias, Lens, Plain, stride_b, stride_h, stride_n, H_OWN, N, BLOCK_N: tl.constexpr):
    """One program per (batch, head) of the bias's own shape (B|1, H|1): Lens and Plain
    are int32, contiguous in that shape. A NaN counts as a live key that is not 0."""
    h = tl.program_id(1)
    b = tl.program_id(2)
    row = Bias + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    last_live = -1
    first_dead = N
    live_value = 0
    for start in range(0, N, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        inside = offs < N
        x = tl.load(row + offs.to(tl.int64) * stride_n, mask=inside, other=0.0).to(tl.float32)
        dead = (x == float("-inf")) & inside
        live = (x != float("-inf")) & inside
        last_live = tl.maximum(last_live, tl.max(tl.where(live, offs, -1), 0))
        first_dead = tl.minimum(first_dead, tl.min(tl.where(dead, offs, N), 0))
        live_value = tl.maximum(live_value, tl.max((live & (x != 0.0)).to(tl.int32), 0))
    plain = (live_value == 0) & (first_dead > last_live)
    out = b * H_OWN + h
    tl.store(Lens + out, last_live + 1)
    tl.store(Plain + out, plain.to(tl.int32))
