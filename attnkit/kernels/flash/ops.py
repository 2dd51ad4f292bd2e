"""The flash-attention kernels as torch operations: input checks (errors that name the
limit and the value), torch.library custom ops with fake implementations for tracing and
a registered autograd formula, the eager fast path, and the public functions
flash_attention and flash_attention_with_lse."""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ...masks import hidden_to_bias
from .. import launcher
from ..bias_form import BiasForm, bias_form
from ..launcher import INTERPRETED
from ..limits import input_problems
from . import launch
from .kernels import LN2
from .select import MAX_TILE_ROWS

# =====================================================================================
# torch.library ops: opaque to torch.compile (no graph break), with fake implementations
# for tracing and a registered autograd formula.
# =====================================================================================


@torch.library.custom_op("attnkit::flash_attention_forward", mutates_args=())
def forward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: Optional[torch.Tensor],
    scale: float,
    allow_tf32: bool,
    store_lo: bool,
    causal_offset: Optional[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, lse, lse_shift, out_lo): the natural LSE is lse_shift + lse * ln(2) (see
    launch.forward); lse_shift is empty without a bias, out_lo an empty placeholder
    unless store_lo (16-bit only). The row statistics are differentiable only through
    that sum, the one way this module combines them."""
    return _forward_body(q, k, v, attn_bias, scale, allow_tf32, store_lo, causal_offset)


def _forward_body(q, k, v, attn_bias, scale, allow_tf32, store_lo, causal_offset):
    # Here rather than in the Python wrappers: torch.compile traces those, and runs this.
    if attn_bias is not None and attn_bias.dtype != torch.float32 and _bias_form(q, k, attn_bias, store_lo).to_float32:
        # A 16-bit bias that prepare kept on its layout while traced (no address then),
        # whose real tensor is not aligned for reading it as it is; or the op called
        # for a forward that a backward will follow (store_lo), which reads float32.
        attn_bias = float32_bias(attn_bias)
    out, lse, shift, out_lo = launch.forward(q, k, v, attn_bias, scale, allow_tf32, store_lo, causal_offset)
    return out, lse, shift, (q.new_empty(0) if out_lo is None else out_lo)


@forward_op.register_fake
def _(q, k, v, attn_bias, scale, allow_tf32, store_lo, causal_offset):
    B, H, M, _ = q.shape
    out_lo = torch.empty_like(q) if store_lo and q.dtype != torch.float32 else q.new_empty(0)
    shift = q.new_empty((B, H, M) if attn_bias is not None else (0,), dtype=torch.float32)
    return torch.empty_like(q), q.new_empty((B, H, M), dtype=torch.float32), shift, out_lo


@torch.library.custom_op("attnkit::flash_attention_backward", mutates_args=())
def backward_op(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: Optional[torch.Tensor],
    out: torch.Tensor,
    lse: torch.Tensor,
    lse_shift: torch.Tensor,
    out_lo: torch.Tensor,
    dlse: Optional[torch.Tensor],
    scale: float,
    allow_tf32: bool,
    bias_grad: bool,
    causal_offset: Optional[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dbias); dbias is an empty placeholder unless bias_grad. out_lo: the
    forward's placeholder or residual."""
    return _backward_body(
        do, q, k, v, attn_bias, out, lse, lse_shift, out_lo, dlse, scale, allow_tf32, bias_grad, causal_offset
    )


def _backward_body(
    do, q, k, v, attn_bias, out, lse, lse_shift, out_lo, dlse, scale, allow_tf32, bias_grad, causal_offset
):
    dq, dk, dv, dbias = launch.backward(
        do,
        q,
        k,
        v,
        attn_bias,
        out,
        lse,
        lse_shift,
        scale,
        allow_tf32,
        dlse,
        bias_grad,
        out_lo if out_lo.numel() else None,
        causal_offset,
    )
    return dq, dk, dv, (q.new_empty(0) if dbias is None else dbias)


@backward_op.register_fake
def _(do, q, k, v, attn_bias, out, lse, lse_shift, out_lo, dlse, scale, allow_tf32, bias_grad, causal_offset):
    dbias = (
        torch.empty(attn_bias.shape, dtype=attn_bias.dtype, device=attn_bias.device)
        if bias_grad and attn_bias is not None
        else q.new_empty(0)
    )
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dbias


def _setup_context(ctx, inputs, output):
    q, k, v, attn_bias, scale, allow_tf32, store_lo, causal_offset = inputs
    out, lse, shift, out_lo = output
    ctx.save_for_backward(q, k, v, attn_bias, out, lse, shift, out_lo)
    ctx.scale = scale
    ctx.allow_tf32 = allow_tf32
    ctx.causal_offset = causal_offset


def _backward(ctx, dout, dlse, _dshift, _dout_lo, run=None):
    # The LSE is lse_shift + lse * ln(2): dlse (of the base-2 part) carries its whole
    # gradient, and _dshift is the same gradient again. run: the backward op (default)
    # or its body (_EagerFlash).
    run = backward_op if run is None else run
    q, k, v, attn_bias, out, lse, shift, out_lo = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    bias_grad = attn_bias is not None and ctx.needs_input_grad[3]
    dq, dk, dv, dbias = run(
        dout,
        q,
        k,
        v,
        attn_bias,
        out,
        lse,
        shift,
        out_lo,
        dlse,
        ctx.scale,
        ctx.allow_tf32,
        bias_grad,
        ctx.causal_offset,
    )
    return dq, dk, dv, (dbias if bias_grad else None), None, None, None, None


forward_op.register_autograd(_backward, setup_context=_setup_context)


@functools.lru_cache(maxsize=None)
def _eager_flash() -> type:
    """_EagerFlash: the forward op with its autograd formula (_setup_context, _backward),
    without torch.library's dispatch, for eager training (see _attention). The same body
    runs both ways, so both give the same bits. Gradients of outputs nothing used stay
    None (the op's generated Function fills them with zeros: same results, more work).
    Made on first use, so that importing the kernels defines no autograd.Function. Its
    forward takes ctx itself: with a separate setup_context, every apply() binds its
    arguments through inspect.signature, about a seventh of the host time of a small
    forward and backward (measured on a CPU, the kernels stubbed)."""

    class _EagerFlash(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, attn_bias, scale, allow_tf32, store_lo, causal_offset):
            inputs = (q, k, v, attn_bias, scale, allow_tf32, store_lo, causal_offset)
            output = _forward_body(*inputs)
            _setup_context(ctx, inputs, output)
            ctx.set_materialize_grads(False)
            return output

        @staticmethod
        @torch.autograd.function.once_differentiable  # a second derivative raises, as through the ops
        def backward(ctx, dout, dlse, dshift, dout_lo):
            return _backward(ctx, dout, dlse, dshift, dout_lo, run=_backward_body)

    return _EagerFlash


# =====================================================================================
# Public functions
# =====================================================================================

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def prepare(q, k, v, attn_bias, scale):
    """Check the inputs (ValueError naming the limit and the value) and normalise
    attn_bias (bool -> additive float, converted once here) and scale. Eager calls check
    once per signature instead (CallPlan)."""
    _check_inputs(q, k, v, attn_bias)
    scale = _scale(q, scale)
    if attn_bias is not None and _to_float32(q, k, attn_bias, _needs_grad(q, k, v, attn_bias)):
        attn_bias = float32_bias(attn_bias)
    return attn_bias, scale


def _scale(q, scale) -> float:
    if scale is None:
        return q.shape[3] ** -0.5  # symbolic under torch.compile(dynamic=True); finite anyway
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale={scale} must be finite")
    return scale


def _to_float32(q, k, attn_bias: torch.Tensor, needs_grad: bool) -> bool:
    """Whether the bias is read as a float32 copy: every bias but "full16" is, the bias
    type the rest of the static report compiles and the shipped tiles are chosen for: a
    16-bit bias pointer changes the compiled code (on sm_90 the key-padding tile at head
    dim 128 then needs 296,000 bytes of shared memory, above the GPU's 232,448). A
    float32 bias is read as it is: no decision to make."""
    return attn_bias.dtype != torch.float32 and _bias_form(q, k, attn_bias, needs_grad).to_float32


class CallPlan:
    """What an eager call of flash_attention decides before its launch plan, once per
    signature (launcher.plan_key of the call as given: the bias before conversion): its
    inputs passed the checks (a plan exists only for a call that did), its scale, whether
    its bias is converted to float32, and, for inference, the forward's launch plan (the
    converted bias's layout follows from the given one's, so one key serves both)."""

    __slots__ = ("scale", "to_float32", "inference")

    def __init__(self, q, k, v, attn_bias, scale, needs_grad):
        _check_inputs(q, k, v, attn_bias)
        self.scale = _scale(q, scale)
        self.to_float32 = attn_bias is not None and _to_float32(q, k, attn_bias, needs_grad)
        self.inference = None


def eager_call(q, k, v, attn_bias) -> bool:
    """Whether nothing needs the op's dispatch: plain tensors, not traced by
    torch.compile, no dispatch mode (a FLOP counter, fake tensors), no torch.func
    transform. Such calls skip torch.library's dispatch, most of the host time of a
    small call (measured on a CPU: about half of the launcher's own time)."""
    return (
        type(q) is torch.Tensor
        and type(k) is torch.Tensor
        and type(v) is torch.Tensor
        and (attn_bias is None or type(attn_bias) is torch.Tensor)
        and not torch.compiler.is_compiling()
        and _get_current_dispatch_mode() is None
        and not torch._C._are_functorch_transforms_active()
    )


def _attention(q, k, v, attn_bias, scale, allow_tf32, causal_offset) -> tuple:
    """(out, lse, lse_shift, has_bias) of a public call: the checks, the bias's
    conversion and the forward. An eager call (eager_call) goes through its CallPlan:
    inference runs the forward's body, training (a gradient to record: store_lo) runs
    _eager_flash(), the same body and backward in a plain autograd.Function whose
    backward skips the backward op's dispatch too (a diffusion model's denoising loop is
    the first case, fine-tuning at small shapes the second). Any other call runs the
    ops. causal_offset: check_causal's form (None: not causal)."""
    allow_tf32 = bool(allow_tf32)
    if eager_call(q, k, v, attn_bias):
        needs_grad = _needs_grad(q, k, v, attn_bias)
        key = launcher.plan_key("call", (q, k, v, attn_bias), scale, allow_tf32, causal_offset, needs_grad)
        cp = launcher.cached_plan(key)
        if cp is None:
            cp = launcher.plan(key, lambda: CallPlan(q, k, v, attn_bias, scale, needs_grad))
        bias = float32_bias(attn_bias) if cp.to_float32 else attn_bias
        if not needs_grad:
            fp = cp.inference
            if fp is None:
                fp = cp.inference = launch.forward_plan(q, k, v, bias, cp.scale, allow_tf32, False, causal_offset)
            out, lse, shift, _ = fp(q, k, v, bias, False)
        else:
            out, lse, shift, _ = _eager_flash().apply(q, k, v, bias, cp.scale, allow_tf32, True, causal_offset)
        return out, lse, shift, bias is not None
    bias, scale = prepare(q, k, v, attn_bias, scale)
    needs_grad = _needs_grad(q, k, v, attn_bias)
    out, lse, shift, _ = forward_op(q, k, v, bias, scale, allow_tf32, needs_grad, causal_offset)
    return out, lse, shift, bias is not None


def _bias_form(q, k, attn_bias: Optional[torch.Tensor], needs_grad: bool) -> BiasForm:
    """How the kernels read this call's bias (attnkit/kernels/bias_form.py, the one
    decision). A full bias in q's 16-bit dtype with even strides and address, in a call
    autograd will not differentiate, is read as it is ("full16"): converting it to float32
    reads and writes B*H*M*N elements more than the attention itself. A key-padding bias
    is one row per (batch, head), converted at no cost, and a call that needs gradients
    reads float32 in its backward too."""
    return bias_form(
        attn_bias,
        (*q.shape[:3], k.shape[2]),
        q_dtype=q.dtype,
        needs_grad=needs_grad,
        max_tile_rows=MAX_TILE_ROWS,
    )


def _check_inputs(q, k, v, attn_bias) -> None:
    """ValueError, naming the limit and the value, for inputs the kernels cannot take."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dims (B, H, len, head_dim), got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name}.dtype={t.dtype} is not supported (float16, bfloat16, float32)")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, H, M, D = q.shape
    N = k.shape[2]
    if k.shape[0] != B or k.shape[1] != H or k.shape[3] != D:
        raise ValueError(
            f"k shape {tuple(k.shape)} does not match q shape {tuple(q.shape)} (expected ({B}, {H}, N, {D}))"
        )
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(
            f"v shape {tuple(v.shape)} must equal k shape {tuple(k.shape)} "
            f"(a value head dim different from the query head dim is not supported)"
        )
    problems = input_problems(D, batch=B, heads=H, q_len=M, kv_len=N)
    if problems:
        raise ValueError("; ".join(problems))
    if q.device.type != "cuda" and not (INTERPRETED and q.device.type == "cpu"):
        raise ValueError(
            f"device={q.device.type}: the triton flash attention runs on CUDA; on the CPU it runs "
            f"only under TRITON_INTERPRET=1 (set before attnkit.kernels is imported), for debugging"
        )

    if attn_bias is not None:
        if not isinstance(attn_bias, torch.Tensor):
            raise ValueError(f"attn_bias must be a torch.Tensor or None, got {type(attn_bias).__name__}")
        if attn_bias.device != q.device:
            raise ValueError(f"attn_bias is on {attn_bias.device}, q on {q.device}")
        if attn_bias.dim() > 4:
            raise ValueError(f"attn_bias has {attn_bias.dim()} dims; at most 4 (B, H, M, N)")
        try:
            torch.broadcast_shapes(tuple(attn_bias.shape), (B, H, M, N))
            ok = torch.broadcast_shapes(tuple(attn_bias.shape), (B, H, M, N)) == (B, H, M, N)
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"attn_bias shape {tuple(attn_bias.shape)} is not broadcastable to (B, H, M, N) = {(B, H, M, N)}"
            )
        if not (attn_bias.dtype == torch.bool or attn_bias.is_floating_point()):
            raise ValueError(f"attn_bias.dtype={attn_bias.dtype}: expected an additive float bias or a bool mask")


def float32_bias(bias: torch.Tensor) -> torch.Tensor:
    """A bool mask (True = attend, as in torch's scaled_dot_product_attention) or a 16-bit
    bias as an additive float32 bias, its broadcast dims kept broadcast: .to() would write
    an expanded (stride 0) dim out in full, which turns a (B, 1, 1, N) key mask expanded to
    (B, H, M, N) into an M-times-larger copy that the kernels then read as a full bias (no
    key lengths, no skipped tiles). Converted once per stored element, then expanded
    again. A bias that needs a gradient is converted as it is (differentiable): its
    gradient must keep one value per element of the view it is, as torch gives it."""
    if bias.requires_grad:
        return bias.to(torch.float32)
    strides = bias.stride()
    stored = (
        bias
        if 0 not in strides
        else bias[tuple(slice(0, 1) if st == 0 and n > 1 else slice(None) for n, st in zip(bias.shape, strides))]
    )
    if bias.dtype == torch.bool:
        out = hidden_to_bias(~stored, torch.float32)
    else:
        out = stored.to(torch.float32)
    return out if stored is bias else out.expand(bias.shape)


def _needs_grad(q, k, v, attn_bias) -> bool:
    """Whether autograd will call the backward: then a 16-bit forward also keeps its
    rounding residual (one more output-sized tensor, see _attn_fwd)."""
    return torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad or (attn_bias is not None and attn_bias.requires_grad)
    )


def check_causal(causal, causal_offset) -> Optional[int]:
    """The public pair (causal, causal_offset) as the one form below the public functions:
    None where the call is not causal, else the offset (query row i sees key j only if
    j <= i + offset). ValueError for a non-bool causal, a non-int offset, or an offset
    without causal=True (it would be ignored)."""
    if causal is False and type(causal_offset) is int and causal_offset == 0:
        return None  # the common call, in one test
    if not isinstance(causal, bool):
        raise ValueError(f"causal={causal!r} must be a bool")
    if isinstance(causal_offset, bool) or not isinstance(causal_offset, (int, torch.SymInt)):
        raise ValueError(f"causal_offset={causal_offset!r} must be an int")
    if causal_offset and not causal:
        raise ValueError(
            f"causal_offset={causal_offset} without causal=True would be ignored: pass causal=True or drop the offset"
        )
    return int(causal_offset) if causal else None


def flash_attention_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    *,
    allow_tf32: bool = False,
    causal: bool = False,
    causal_offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): attention and the row log-sum-exp (natural log), both differentiable.

    lse[b, h, m] = log(sum_n exp(scale * q.k + bias)) over the keys row m sees, in
    float32, shape (B, H, M); -inf for a row that sees no key (all masked). Partial
    results over disjoint key sets combine exactly through it (ring / context-parallel
    attention). Arguments as in flash_attention.
    """
    out, lse, shift, has_bias = _attention(q, k, v, attn_bias, scale, allow_tf32, check_causal(causal, causal_offset))
    lse = lse * LN2
    return out, (lse + shift if has_bias else lse)


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    *,
    allow_tf32: bool = False,
    causal: bool = False,
    causal_offset: int = 0,
) -> torch.Tensor:
    """softmax(q @ k^T * scale + attn_bias) @ v, FlashAttention-2 in Triton; differentiable.

    q: (B, H, M, D), k and v: (B, H, N, D), fp16 / bf16 / fp32, 8 <= D <= MAX_HEAD_DIM
    (limits.py); any strides with a contiguous last dim. attn_bias: None, an additive
    float tensor, or a bool mask (True = attend), broadcastable to (B, H, M, N); it is
    read through its strides, never expanded in memory: a full bias in q's 16-bit dtype with
    even strides is read as it is by a call that needs no gradient, any other bool or
    16-bit bias as a float32 copy in its own shape (docs/kernel.md, "Bias dtype"); a
    float bias that requires grad
    gets its gradient (see the module docstring for its memory). scale defaults to
    D ** -0.5. allow_tf32 lets fp32 inputs use tf32 tensor cores (otherwise fp32 is
    exact fp32). causal: query row i sees key j only if j <= i + causal_offset (offset
    0: top-left aligned, torch's scaled_dot_product_attention(is_causal=True); N - M:
    bottom-right); it combines with any bias, and key tiles a row cannot see are
    skipped, not computed. Returns q's dtype and layout. A query row that sees no key
    (all masked, or a negative offset) outputs zeros.
    """
    return _attention(q, k, v, attn_bias, scale, allow_tf32, check_causal(causal, causal_offset))[0]
