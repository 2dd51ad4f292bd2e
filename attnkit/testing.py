"""The float64 reference and the tolerance rule every backend is held to.

Tests and benchmarks both import from here, so "correct" means one thing everywhere.
"""

from __future__ import annotations

import math

import torch

from .masks import to_additive_bias


def _bias_to_additive(attn_bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if attn_bias.dtype == torch.bool:
        # True = attend, as in torch's scaled_dot_product_attention.
        return to_additive_bias(attn_bias, dtype)
    return attn_bias.to(dtype)


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_bias: torch.Tensor | None = None, scale: float | None = None
) -> torch.Tensor:
    """softmax(q @ k^T * scale + attn_bias) @ v in float64.

    q: (..., M, D); k: (..., N, D); v: (..., N, Dv); attn_bias broadcastable to
    (..., M, N): additive float, or bool where True means "attend".
    scale defaults to D ** -0.5. A query row whose keys are all masked (-inf or False)
    gives zeros, the convention of FlashAttention and torch's SDPA.
    Returns float64 on the inputs' device.
    """
    d = q.shape[-1]
    scale = d**-0.5 if scale is None else float(scale)
    q64, k64, v64 = q.double(), k.double(), v.double()
    scores = torch.matmul(q64, k64.transpose(-1, -2)) * scale
    if attn_bias is not None:
        scores = scores + _bias_to_additive(attn_bias, torch.float64)
    row_max = scores.amax(dim=-1, keepdim=True)
    dead = torch.isneginf(row_max)
    row_max = torch.where(dead, torch.zeros_like(row_max), row_max)
    p = torch.exp(scores - row_max)
    denom = p.sum(dim=-1, keepdim=True)
    p = torch.where(dead, torch.zeros_like(p), p / torch.where(dead, torch.ones_like(denom), denom))
    return torch.matmul(p, v64)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; inf if out has a NaN or inf."""
    out64 = out.detach().double()
    ref64 = ref.detach().double()
    if not torch.isfinite(out64).all():
        return math.inf
    denom = ref64.norm().item()
    num = (out64 - ref64).norm().item()
    if denom == 0.0:
        return num
    return num / denom


def torch_math_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: torch.Tensor | None = None,
    scale: float | None = None,
    upcast: bool = False,
) -> torch.Tensor:
    """Plain torch math in the inputs' own dtype: the baseline for the tolerance rule.

    Scores and softmax in the inputs' dtype, then cast back: what an unfused
    implementation in that precision gets, without any upcasting. With upcast=True
    (what ``attn.upcast_attention`` asks for) everything runs in fp32 and only the
    output is rounded to the inputs' dtype.
    """
    if upcast and q.dtype != torch.float64:
        return torch_math_attention(q.float(), k.float(), v.float(), attn_bias, scale).to(q.dtype)
    d = q.shape[-1]
    scale = d**-0.5 if scale is None else float(scale)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if attn_bias is not None:
        scores = scores + _bias_to_additive(attn_bias, scores.dtype)
    p = (
        torch.ops.aten._safe_softmax.default(scores, -1)
        if hasattr(torch.ops.aten, "_safe_softmax")
        else scores.softmax(-1)
    )
    return torch.matmul(p.to(v.dtype), v)


# Floor of the tolerance: a few units of rounding of the output dtype, so that a
# baseline that happens to be exact (tiny problems) does not demand exactness.
EPSILON = {torch.float64: 1e-12, torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def tolerance(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: torch.Tensor | None = None,
    scale: float | None = None,
    ref: torch.Tensor | None = None,
    factor: float = 2.0,
    upcast: bool = False,
) -> float:
    """The allowed relative error for a backend on these inputs.

    factor * (error of plain torch math in the inputs' dtype against float64) + EPSILON;
    with upcast=True the baseline is torch math in fp32 rounded to the inputs' dtype.
    """
    if ref is None:
        ref = reference_attention(q, k, v, attn_bias, scale)
    base = rel_error(torch_math_attention(q, k, v, attn_bias, scale, upcast=upcast), ref)
    if not math.isfinite(base):
        # torch math itself overflowed (fp16 scores beyond 65504): hold the backend
        # to the dtype's rounding instead.
        base = 0.0
    return factor * base + EPSILON.get(q.dtype, 1e-3)


def assert_close_to_reference(
    out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: torch.Tensor | None = None,
    scale: float | None = None,
    factor: float = 2.0,
    upcast: bool = False,
) -> None:
    """Fail unless out is within the tolerance rule of the float64 reference. NaN fails."""
    ref = reference_attention(q, k, v, attn_bias, scale)
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    err = rel_error(out, ref)
    tol = tolerance(q, k, v, attn_bias, scale, ref=ref, factor=factor, upcast=upcast)
    assert err <= tol, f"relative error {err:.3e} > tolerance {tol:.3e} ({q.dtype})"


# -- random inputs, shared by the tests and the benchmarks ----------------------------------
BIAS_KINDS = ("none", "key_padding", "key_padding_bool", "fewkeys", "perhead", "headq", "full", "2d", "bool")


def make_qkv(
    batch: int,
    heads: int,
    q_len: int,
    kv_len: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    *,
    layout: str = "bhnd",
    device: torch.device | str = "cpu",
    requires_grad: bool = False,
    generator: torch.Generator | None = None,
    v_dim: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random q (B, H, M, D), k (B, H, N, D), v (B, H, N, Dv), drawn in float32 (standard
    normal, never zeros) and rounded to ``dtype``.

    layout "bhnd": contiguous (B, H, N, D). "bnhd": (B, N, H, D) storage viewed as
    (B, H, N, D), the strided views a diffusers processor produces.
    """
    if layout not in ("bhnd", "bnhd"):
        raise ValueError(f"layout={layout!r}: 'bhnd' (contiguous) or 'bnhd' (diffusers' strided views)")

    def one(n: int, d: int) -> torch.Tensor:
        if layout == "bnhd":
            x = torch.randn(batch, n, heads, d, generator=generator).transpose(1, 2)
        else:
            x = torch.randn(batch, heads, n, d, generator=generator)
        return x.to(device=device, dtype=dtype).requires_grad_(requires_grad)

    return one(q_len, head_dim), one(kv_len, head_dim), one(kv_len, v_dim or head_dim)


def make_bias(
    kind: str,
    batch: int,
    heads: int,
    q_len: int,
    kv_len: int,
    dtype: torch.dtype = torch.float32,
    *,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> torch.Tensor | None:
    """A random attention bias of one broadcast kind (see BIAS_KINDS):

    none -> None; key_padding: (B, 1, 1, N) additive, 0 on kept keys and -inf on the
    padded tail of each batch item, a different length each (at least one key kept, and
    at least one key padded somewhere when N > 1, so the mask always hides something and
    is never dropped as a mask that hides nothing);
    key_padding_bool: the same as a boolean mask (True = attend); fewkeys: key padding
    keeping 1 to 3 keys; perhead: (B, H, 1, N); headq: (1, H, M, N); full: (B, H, M, N);
    2d: (M, N); bool: (B, 1, M, N) boolean, about 70% True, key 0 always kept.
    Random biases are standard normal.
    """

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    def lengths(most: int) -> list[int]:
        drawn = [int(torch.randint(1, most + 1, (), generator=generator)) for _ in range(batch)]
        if kv_len > 1 and min(drawn) == kv_len:
            drawn[0] = kv_len - 1
        return drawn

    if kind == "none":
        return None
    if kind in ("key_padding", "key_padding_bool", "fewkeys"):
        keep = torch.zeros(batch, 1, 1, kv_len, dtype=torch.bool)
        for b, n in enumerate(lengths(kv_len if kind != "fewkeys" else min(3, kv_len))):
            keep[b, ..., :n] = True
        keep = keep.to(device)
        if kind == "key_padding_bool":
            return keep
        return to_additive_bias(keep, dtype)
    if kind == "perhead":
        return randn(batch, heads, 1, kv_len)
    if kind == "headq":
        return randn(1, heads, q_len, kv_len)
    if kind == "full":
        return randn(batch, heads, q_len, kv_len)
    if kind == "2d":
        return randn(q_len, kv_len)
    if kind == "bool":
        mask = torch.rand(batch, 1, q_len, kv_len, generator=generator) < 0.7
        mask[..., 0] = True
        return mask.to(device)
    raise ValueError(f"bias kind {kind!r}: choose one of {', '.join(BIAS_KINDS)}")


def reference_grads(
    inputs: tuple[torch.Tensor, ...],
    grad_out: torch.Tensor,
    attn_bias: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Gradients of (q, k, v) = inputs for the output gradient ``grad_out``: the float64
    reference, and plain torch math in the inputs' dtype (the baseline of the tolerance
    rule). ``attn_bias`` is a constant here (no gradient)."""
    ref_in = [t.detach().double().requires_grad_() for t in inputs]
    bias64 = attn_bias if attn_bias is None or attn_bias.dtype == torch.bool else attn_bias.double()
    ref = torch.autograd.grad(reference_attention(*ref_in, bias64, scale), ref_in, grad_out.double())
    base_in = [t.detach().clone().requires_grad_() for t in inputs]
    base = torch.autograd.grad(torch_math_attention(*base_in, attn_bias, scale), base_in, grad_out.to(inputs[0].dtype))
    return ref, base


def assert_grads_close_to_reference(
    fn,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: torch.Tensor | None = None,
    scale: float | None = None,
    factor: float = 2.0,
    floor: float = 0.0,
) -> None:
    """Fail unless the gradients of ``fn(q, k, v, attn_bias, scale)`` in q, k and v are
    within the tolerance rule of the float64 reference's, for a random output gradient:
    at most ``factor`` times plain torch's error in the same dtype, plus EPSILON, or
    ``floor`` if larger (for inputs where the float64 reference is itself only that
    accurate: a bias of 1e9 leaves q.k about 1e9 * 2.2e-16 of absolute precision)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves, attn_bias, scale)
    grad_out = torch.randn(out.shape, dtype=torch.float32).to(device=out.device, dtype=out.dtype)
    got = torch.autograd.grad(out, leaves, grad_out)
    ref, base = reference_grads(tuple(leaves), grad_out, attn_bias, scale)
    for name, g, r, b in zip("qkv", got, ref, base):
        err, tol = rel_error(g, r), factor * rel_error(b, r) + EPSILON.get(q.dtype, 1e-3)
        if not math.isfinite(tol):
            tol = EPSILON.get(q.dtype, 1e-3)
        tol = max(tol, floor)
        assert g.shape == r.shape, f"d{name}: shape {tuple(g.shape)} != {tuple(r.shape)}"
        assert err <= tol, f"d{name}: relative error {err:.3e} > tolerance {tol:.3e} ({q.dtype})"
