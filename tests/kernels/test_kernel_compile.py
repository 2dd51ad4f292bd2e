"""torch.compile(fullgraph=True) over code that calls the Triton flash attention.

The kernel is a torch.library custom op with a fake (shape) implementation and a
registered autograd formula, so Dynamo traces it as one opaque node: no graph break,
forward or backward. On the CPU the graphs run with backend="aot_eager" (no C++ or
Triton code generation needed; the op itself runs in Triton's interpreter); on a GPU
with inductor.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit.testing import assert_close_to_reference, rel_error

pytest.importorskip("triton")

from attnkit.kernels import flash_attention  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKEND = "inductor" if DEVICE == "cuda" else "aot_eager"


class CrossAttention(nn.Module):
    """The shape of a diffusers attention block: projections, (B, N, H, D) views, the
    kernel on (B, H, N, D) views of them, and back."""

    def __init__(self, dim=80, context_dim=48, heads=2):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(context_dim, dim, bias=False)
        self.to_v = nn.Linear(context_dim, dim, bias=False)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x, context, attn_bias=None):
        B, M, C = x.shape
        N = context.shape[1]
        H, D = self.heads, C // self.heads
        q = self.to_q(x).view(B, M, H, D).transpose(1, 2)
        k = self.to_k(context).view(B, N, H, D).transpose(1, 2)
        v = self.to_v(context).view(B, N, H, D).transpose(1, 2)
        out = flash_attention(q, k, v, attn_bias)
        return self.to_out(out.transpose(1, 2).reshape(B, M, C)) + x


def test_fullgraph_no_graph_break_forward_and_backward(seed):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    model = CrossAttention().to(DEVICE)
    x = torch.randn(2, 19, 80, device=DEVICE)
    ctx = torch.randn(2, 33, 48, device=DEVICE)
    bias = torch.zeros(2, 1, 1, 33, device=DEVICE)
    bias[1, ..., 20:] = float("-inf")  # key padding

    counter = CompileCounterWithBackend(BACKEND)
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    out = compiled(x, ctx, bias)
    assert counter.frame_count == 1  # one graph: fullgraph=True would have raised on a break

    eager = model(x, ctx, bias)
    assert rel_error(out, eager) < 1e-6

    # ... and the kernel on these projections against the float64 reference.
    with torch.no_grad():
        q = model.to_q(x).view(2, 19, 2, 40).transpose(1, 2)
        k = model.to_k(ctx).view(2, 33, 2, 40).transpose(1, 2)
        v = model.to_v(ctx).view(2, 33, 2, 40).transpose(1, 2)
        assert_close_to_reference(flash_attention(q, k, v, bias), q, k, v, bias)

    # Backward through the compiled graph matches eager autograd.
    grads_c = torch.autograd.grad(out.square().sum(), list(model.parameters()))
    grads_e = torch.autograd.grad(eager.square().sum(), list(model.parameters()))
    for gc, ge in zip(grads_c, grads_e):
        assert rel_error(gc, ge) < 1e-5


def test_dynamic_shapes_trace_through_the_fake_implementation(seed):
    """With symbolic lengths the fake implementation gives the output shapes; a second
    length reuses the graph."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()

    def attend(q, k, v):
        return flash_attention(q, k, v) * 2.0

    counter = CompileCounterWithBackend(BACKEND)
    fn = torch.compile(attend, backend=counter, fullgraph=True, dynamic=True)
    for m, n in ((17, 40), (9, 23)):
        q = torch.randn(1, 2, m, 24, device=DEVICE, dtype=torch.float16)
        k = torch.randn(1, 2, n, 24, device=DEVICE, dtype=torch.float16)
        v = torch.randn(1, 2, n, 24, device=DEVICE, dtype=torch.float16)
        out = fn(q, k, v)
        assert_close_to_reference(out / 2.0, q, k, v)
    assert counter.frame_count == 1


def test_fullgraph_backward_with_a_learned_bias_and_16_bit_residual(seed):
    """A 16-bit forward under autograd returns its rounding residual and a learned bias
    gets a gradient: both through the compiled graph, equal to eager."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()

    def attend(q, k, v, bias):
        return flash_attention(q, k, v, bias)

    counter = CompileCounterWithBackend(BACKEND)
    fn = torch.compile(attend, backend=counter, fullgraph=True)
    q, k, v = (torch.randn(2, 2, n, 40, device=DEVICE, dtype=torch.float16, requires_grad=True) for n in (19, 33, 33))
    bias = torch.randn(1, 2, 19, 33, device=DEVICE, requires_grad=True)  # per head, learned
    do = torch.randn(2, 2, 19, 40, device=DEVICE, dtype=torch.float16)
    out = fn(q, k, v, bias)
    assert counter.frame_count == 1
    got = torch.autograd.grad(out, (q, k, v, bias), do)
    want = torch.autograd.grad(attend(q, k, v, bias), (q, k, v, bias), do)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert rel_error(g, w) < 1e-6
