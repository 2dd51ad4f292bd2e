"""Run the flash-attention kernels where every offset above a tile passes 2**31 elements.

    TRITON_INTERPRET=1 python tests/kernels/_large_offsets.py

Run as a process of its own by tests/kernels/test_kernel_flash.py: a kernel that computed these
offsets in 32 bits would wrap to a negative offset and read or write outside its tensors,
which can kill the process rather than fail an assertion.

A problem with more than 2**31 elements is far too slow for Triton's interpreter, but
the kernels' 64-bit arithmetic is the same whether the elements in between exist or
not. So every tensor here is a small problem laid out in a sparse storage of about
2**32 elements (allocated lazily by the OS; only the touched pages become memory):

* batch and head strides of 2**30 + a little, so that b * stride_b + h * stride_h
  passes 2**31 for the last batch and head;
* a row stride of 2**25 + 16 and lengths past 64 rows, so that the start of the third
  32-row tile (64 * stride) passes 2**31, while offsets inside a tile stay below it
  (the kernels keep those 32-bit by design, see flash/launch.py, addressable).

q, k, v, dO and a full bias are read this way, and the output, dQ, dK and dV written this
way (the allocator of the kernels' outputs is replaced by one that returns such views).
The results are compared with the float64 reference; it exits 1 on a mismatch.
"""

from __future__ import annotations

import importlib
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from attnkit.testing import (  # noqa: E402
    EPSILON,
    assert_close_to_reference,
    reference_attention,
    rel_error,
    torch_math_attention,
)

fl = importlib.import_module("attnkit.kernels.flash.launch")
fo = importlib.import_module("attnkit.kernels.flash.ops")
launcher = importlib.import_module("attnkit.kernels.launcher")

STRIDE_B = 2**30 + 64
STRIDE_H = 2**30 + 128
STRIDE_ROW = 2**25 + 16
B, H, M, N, D = 2, 2, 67, 70, 40


def sparse(shape, dtype, row_stride=STRIDE_ROW, fill=None):
    """A (B, H, L, D) view whose elements lie beyond 2**31 from its first one."""
    b, h, length, d = shape
    strides = (STRIDE_B, STRIDE_H, row_stride, 1)
    numel = 1 + sum((n - 1) * st for n, st in zip(shape, strides))
    assert numel > 2**31, numel
    x = torch.empty(numel, dtype=dtype).as_strided(shape, strides)
    if fill is None:
        x.copy_(torch.randn(shape, dtype=torch.float32))
    else:
        x.fill_(fill)
    return x


def main() -> int:
    if not launcher.INTERPRETED:
        print("needs TRITON_INTERPRET=1 (CPU tensors)", file=sys.stderr)
        return 2
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    dtype = torch.float16
    q = sparse((B, H, M, D), dtype)
    k = sparse((B, H, N, D), dtype)
    v = sparse((B, H, N, D), dtype)
    do = sparse((B, H, M, D), dtype)
    bias = sparse((B, H, M, N), torch.float32, row_stride=N)  # only b, h offsets are huge
    for t in (q, k, v):
        assert fl.addressable(t), "the views must reach the kernels as they are"

    # Outputs (O, dQ, dK, dV) in the same kind of layout, poisoned with NaN.
    allocate = (
        lambda t, **kw: sparse(tuple(t.shape), t.dtype, fill=float("nan"))
        if t.dim() == 4
        else torch.full_like(t, float("nan"), **kw)
    )
    # For the rest of this process (kept referenced: a context manager collected early
    # would restore the settings).
    global _FORCED
    _FORCED = launcher.override(allocate=allocate, poison_outputs=True)
    _FORCED.__enter__()

    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    out = fo.flash_attention(q, k, v, bias)
    assert out.stride() == (STRIDE_B, STRIDE_H, STRIDE_ROW, 1), out.stride()
    grads = torch.autograd.grad(out, (q, k, v), do)
    assert all(g.stride()[0] == STRIDE_B for g in grads), [g.stride() for g in grads]

    q, k, v = (t.detach() for t in (q, k, v))
    assert_close_to_reference(out.detach(), q, k, v, bias)
    # Gradients: the rule of attnkit.testing (twice plain torch math's error in the same
    # dtype, plus rounding), as in test_kernel_flash.py.
    ref_in = [t.to(torch.float64).requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(reference_attention(*ref_in, bias.to(torch.float64)), ref_in, do.double())
    base_in = [t.contiguous().requires_grad_() for t in (q, k, v)]
    base = torch.autograd.grad(torch_math_attention(*base_in, bias), base_in, do.contiguous())
    for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref, base):
        err, tol = rel_error(g, r), 2.0 * rel_error(b, r) + EPSILON[dtype]
        assert err <= tol, f"{name}: relative error {err:.3e} > tolerance {tol:.3e}"
    print("ok: forward and backward with offsets beyond 2**31 elements")
    return 0


_FORCED = None

if __name__ == "__main__":
    sys.exit(main())
