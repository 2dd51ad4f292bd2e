"""The Triton FlashAttention kernel against the float64 reference.

Without a GPU these run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1
before anything imports the kernels): the same kernel source, executed with numpy on CPU
tensors, with small tiles (32 x 32) so that small problems still cross tile boundaries.

bf16 in the interpreter. Triton 3.9's interpreter stores bf16 as uint16 and multiplies
the raw bit patterns in tl.dot (errors of 1e10). Under the interpreter only, the launcher
sets the kernels' EMULATE_BF16 constexpr: each dot widens its bf16 operands to fp32
(exact: every bf16 value is an fp32 value) and multiplies in true fp32, which is what a
bf16 tensor-core dot with fp32 accumulation computes, up to summation order. Everything
else runs as compiled: bf16 loads and stores, the rounding of P and dS to bf16 before
their dots, the fp32 softmax. So the bf16 tests prove the bf16 data path and its
roundings; they do not prove the bf16 tensor-core instruction, which only the compiler
emits (EMULATE_BF16 is a constexpr, False in every compiled kernel: the branch does not
exist there). That the compiled bf16 kernels use tensor cores (mma on sm_80, wgmma on
sm_90) is checked by `python -m tools.static_report` (tests/static_report/test_kernel_inspect.py).

The interpreter also truncates fp32 to bf16 where a GPU rounds to nearest; conftest
installs tests/kernels/_interpreter_rounding.py so that those roundings (the output, P, dS, the
gradients) are the GPU's. With truncation every bf16 gradient measured 1.1-2.4x plain
torch's error; rounded as on a GPU, 0.4-0.9x.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnkit import testing
from attnkit.testing import (
    EPSILON,
    assert_close_to_reference,
    assert_grads_close_to_reference,
    reference_attention,
    rel_error,
    torch_math_attention,
)
from tests._masks import additive, key_padding_bias

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from attnkit.kernels import flash_attention, flash_attention_with_lse  # noqa: E402
from attnkit.kernels.limits import MAX_HEAD_DIM  # noqa: E402

launcher = importlib.import_module("attnkit.kernels.launcher")
fk = importlib.import_module("attnkit.kernels.flash.kernels")
plans = importlib.import_module("attnkit.kernels.flash.launch")  # the forward and backward plans
fo = importlib.import_module("attnkit.kernels.flash.ops")
select = importlib.import_module("attnkit.kernels.flash.select")
TileConfig = importlib.import_module("attnkit.kernels.flash.tile_config").TileConfig

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def poison():
    """Every buffer a kernel writes starts as NaN: an unwritten element fails the test."""
    with launcher.override(poison_outputs=True):
        yield


PASSES = ("delta", "lengths")  # the passes before the attention kernels


def attention_launches(seen: list) -> list:
    """The attention kernels' launches of a recording (launcher.recording()), without the
    delta and key-lengths passes before them."""
    return [x for x in seen if x.kernel not in PASSES]


# -- inputs ----------------------------------------------------------------------------
# attnkit.testing's builders. "keypad" and "fewkeys" here are key biases with random
# values and a padded tail (-inf), so that the key bias is loaded (a bare 0 / -inf
# padding mask is a length and never loaded: tests/kernels/test_kernel_paths.py covers it).


def make_qkv(B, H, M, N, D, dtype, layout="bhnd", requires_grad=False):
    return testing.make_qkv(B, H, M, N, D, dtype, layout=layout, device=DEVICE, requires_grad=requires_grad)


def make_bias(kind: str, B, H, M, N, dtype):
    if kind in ("keypad", "fewkeys"):
        padding = testing.make_bias("key_padding" if kind == "keypad" else "fewkeys", B, 1, M, N, dtype)
        return testing.make_bias("perhead", B, 1, M, N, dtype) + padding
    return testing.make_bias(kind, B, H, M, N, dtype)


# (dtype, head dim, M, N, bias kind, bias dtype, layout)
FWD_CASES = [
    ("fp32", 64, 77, 50, "none", "fp32", "bhnd"),
    ("fp32", 40, 33, 70, "keypad", "fp32", "bnhd"),
    ("fp32", 8, 1, 5, "full", "fp32", "bhnd"),
    ("fp32", 160, 20, 17, "perhead", "fp32", "bnhd"),
    ("fp16", 40, 77, 333, "keypad", "fp32", "bnhd"),
    ("fp16", 80, 64, 64, "perhead", "fp16", "bhnd"),
    ("fp16", 160, 20, 17, "full", "fp32", "bnhd"),
    ("fp16", 24, 1, 1, "none", "fp32", "bhnd"),
    ("fp16", 100, 50, 40, "bool", "fp32", "bhnd"),
    ("fp16", 72, 19, 45, "2d", "fp16", "bnhd"),
    ("fp16", 256, 17, 33, "keypad", "fp16", "bhnd"),
    ("bf16", 40, 77, 50, "keypad", "fp32", "bnhd"),
    ("bf16", 64, 32, 96, "full", "bf16", "bhnd"),
    ("bf16", 160, 5, 31, "headq", "fp32", "bnhd"),
    ("bf16", 80, 1, 7, "none", "fp32", "bhnd"),
]


def case_id(case):
    dt, d, m, n, bias, bdt, layout = case
    return (
        f"{dt}-d{d}-m{m}-n{n}-{bias}"
        + (f"-{bdt}bias" if bias not in ("none", "bool") and bdt != "fp32" else "")
        + ("-bnhd" if layout == "bnhd" else "")
    )


def build(case, requires_grad=False, B=2, H=2):
    dt, d, m, n, bias_kind, bdt, layout = case
    q, k, v = make_qkv(B, H, m, n, d, DTYPES[dt], layout, requires_grad)
    bias = make_bias(bias_kind, B, H, m, n, DTYPES[bdt])
    if bias is not None:
        bias = bias.to(DEVICE)
    return q, k, v, bias


@pytest.mark.parametrize("case", FWD_CASES, ids=case_id)
def test_forward_matches_reference(case, seed):
    q, k, v, bias = build(case)
    out = flash_attention(q, k, v, bias)
    assert out.dtype == q.dtype and out.shape == q.shape
    # The output keeps q's layout: a (B, M, H, D) view stays one (no copy to undo).
    assert out.stride() == q.stride()
    assert_close_to_reference(out, q, k, v, additive(bias))  # a bool mask converted by the tests' own rule


def test_custom_scale_and_last_dim_strided_input(seed):
    """A scale other than D**-0.5, and a q whose last dim is not contiguous (copied)."""
    q, k, v = make_qkv(1, 2, 21, 37, 48, torch.float16)
    q_odd = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # stride(-1) = M
    assert q_odd.stride(-1) != 1
    out = flash_attention(q_odd, k, v, scale=0.3)
    assert_close_to_reference(out, q, k, v, None, scale=0.3)


# -- gradients ---------------------------------------------------------------------------

GRAD_CASES = [
    ("fp32", 40, 33, 45, "keypad", "fp32", "bnhd"),
    ("fp32", 64, 1, 20, "full", "fp32", "bhnd"),
    ("fp16", 40, 77, 50, "keypad", "fp32", "bnhd"),
    ("fp16", 80, 32, 32, "perhead", "fp16", "bhnd"),
    ("fp16", 160, 17, 9, "full", "fp32", "bnhd"),
    ("fp16", 24, 5, 1, "none", "fp32", "bhnd"),
    ("bf16", 64, 40, 70, "2d", "fp32", "bnhd"),
    ("bf16", 100, 19, 33, "headq", "bf16", "bhnd"),
]


def reference_grads(inputs, do, bias=None):
    """Gradients of (q, k, v[, bias]) = inputs: the float64 reference, and plain torch
    math in the inputs' dtype (the baseline of the tolerance rule). bias, if given, is a
    constant (no gradient)."""
    ref_in = [t.detach().double().requires_grad_() for t in inputs]
    ref = torch.autograd.grad(reference_attention(*ref_in, bias), ref_in, do.double())
    base_in = [t.detach().clone().requires_grad_() for t in inputs]
    base = torch.autograd.grad(torch_math_attention(*base_in, bias), base_in, do)
    return ref, base


def grads_and_tolerances(case, B=2, H=2):
    q, k, v, bias = build(case, requires_grad=True, B=B, H=H)
    out = flash_attention(q, k, v, bias)
    do = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), do)
    ref, base = reference_grads((q, k, v), do, bias)
    # The rule of attnkit.testing applied to gradients: at most twice the error of plain
    # torch math in the same dtype, plus a few units of rounding.
    eps = EPSILON[q.dtype]
    return [(name, g, r, 2.0 * rel_error(b, r) + eps) for name, g, r, b in zip("qkv", got, ref, base)]


@pytest.mark.parametrize("case", GRAD_CASES, ids=case_id)
def test_gradients_match_reference(case, seed):
    for name, g, r, tol in grads_and_tolerances(case):
        err = rel_error(g, r)
        assert g.shape == r.shape and g.dtype != torch.float64
        assert err <= tol, f"d{name}: relative error {err:.3e} > tolerance {tol:.3e}"


@pytest.mark.parametrize("case", [GRAD_CASES[2], GRAD_CASES[6]], ids=case_id)
def test_reload_variant_matches_reference(case, seed):
    """The tile variant that reloads its loop-invariant operands each iteration (shipped
    for large head dims) computes the same, forward and backward."""
    with launcher.override(interpret_tile=TileConfig(32, 16, 4, 1, reload=True)):
        q, k, v, bias = build(case, B=1)
        assert_close_to_reference(flash_attention(q, k, v, bias), q, k, v, bias)
        for name, g, r, tol in grads_and_tolerances(case, B=1):
            err = rel_error(g, r)
            assert err <= tol, f"d{name}: relative error {err:.3e} > tolerance {tol:.3e}"


def test_gradients_keep_input_layout(seed):
    q, k, v = make_qkv(1, 2, 9, 13, 40, torch.float16, "bnhd", requires_grad=True)
    out = flash_attention(q, k, v)
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    assert dq.stride() == q.stride() and dk.stride() == k.stride() and dv.stride() == v.stride()


# -- the gradient of attn_bias -----------------------------------------------------------

# Each broadcast kind takes its own path: key-padding-like biases (no query dim) are
# summed over the queries inside the dK/dV kernel; the others store dS tiles, summed over
# their broadcast dims on the host.
BIAS_GRAD_CASES = [
    ("fp32", 40, 33, 45, "full", "fp32", "bnhd"),
    ("fp32", 64, 70, 20, "keypad", "fp32", "bhnd"),
    ("fp16", 80, 37, 19, "perhead", "fp16", "bhnd"),
    ("fp16", 40, 77, 50, "headq", "fp32", "bnhd"),
    ("fp16", 24, 1, 33, "full", "fp16", "bhnd"),
    ("bf16", 64, 40, 33, "2d", "fp32", "bhnd"),
    ("bf16", 160, 17, 9, "keypad", "bf16", "bnhd"),
    # With few keys, dS = P * (dP - delta) is a small difference of near-equal terms:
    # it needs delta from the unrounded output (the forward's residual, see _attn_fwd).
    ("bf16", 64, 30, 9, "fewkeys", "bf16", "bhnd"),
    ("fp16", 40, 30, 9, "fewkeys", "fp16", "bnhd"),
]


@pytest.mark.parametrize("case", BIAS_GRAD_CASES, ids=case_id)
def test_bias_gradient_matches_reference(case, seed):
    q, k, v, bias = build(case, requires_grad=True)
    bias.requires_grad_()
    out = flash_attention(q, k, v, bias)
    do = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, bias), do)
    assert got[3].shape == bias.shape and got[3].dtype == bias.dtype

    ref, base = reference_grads((q, k, v, bias), do)
    for name, g, r, b in zip(("dq", "dk", "dv", "dbias"), got, ref, base):
        # Masked keys (-inf) have zero gradient in both.
        err, tol = rel_error(g, r), 2.0 * rel_error(b, r) + EPSILON[q.dtype]
        assert err <= tol, f"{name}: relative error {err:.3e} > tolerance {tol:.3e}"


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_bias_gradient_with_few_keys_per_row_beats_plain_torch(dtype, seed):
    """Rows with 2-3 live keys: there dS = P * (dP - delta) is a small difference of
    near-equal terms, and a delta from the output rounded to 16 bits (what FlashAttention
    does) makes the bias gradient 1.4-2x less accurate than plain torch in bf16. The
    forward keeps its rounding residual for the backward, which brings the bias gradient
    to about half of torch's error in bf16 (measured 0.45-0.54x over 12 seeds, with the
    interpreter rounding to nearest as a GPU does); held to at most 1x."""
    B, H, M, N, D = 1, 2, 64, 16, 64
    dt = DTYPES[dtype]
    q, k, v = make_qkv(B, H, M, N, D, dt, requires_grad=True)
    keep = torch.randint(2, 4, (B, H, M, 1), device=DEVICE)
    bias = torch.randn(B, H, M, N, dtype=dt, device=DEVICE).masked_fill(
        torch.arange(N, device=DEVICE) >= keep, float("-inf")
    )
    bias.requires_grad_()
    out = flash_attention(q, k, v, bias)
    do = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, bias), do)
    ref, base = reference_grads((q, k, v, bias), do)
    for name, g, r, b in zip(("dq", "dk", "dv", "dbias"), got, ref, base):
        err, torch_err = rel_error(g, r), rel_error(b, r)
        limit = torch_err if name == "dbias" else 2.0 * torch_err + EPSILON[dt]
        assert err <= limit, f"{name}: relative error {err:.3e} > {limit:.3e} (plain torch: {torch_err:.3e})"


def test_forward_residual_is_kept_only_for_a_16_bit_backward(seed):
    """The forward writes its rounding residual only when autograd will need it and the
    output is 16-bit; the residual is what rounding lost: out + out_lo is the fp32 result."""
    for dtype, grad, expected in (
        ("fp16", True, ("fwd_lo", True)),
        ("fp16", False, ("fwd", False)),
        ("fp32", True, ("fwd", False)),
    ):
        q, k, v = make_qkv(1, 2, 20, 30, 40, DTYPES[dtype], requires_grad=grad)
        with launcher.recording() as seen:
            flash_attention(q, k, v)
        forwards = [(x.kernel, x.arguments["STORE_LO"]) for x in attention_launches(seen) if x.kernel.startswith("fwd")]
        assert forwards == [expected], (dtype, grad)

    q, k, v = make_qkv(1, 2, 20, 30, 40, torch.bfloat16)
    out, _, _, lo = plans.forward(q, k, v, None, 40**-0.5, False, store_lo=True)
    assert lo.stride() == out.stride() and lo.dtype == out.dtype
    # At most half a unit in the last place of out: the output is rounded to nearest
    # (on a GPU, and here through tests/kernels/_interpreter_rounding.py).
    eps = torch.finfo(torch.bfloat16).eps
    assert (lo.float().abs() <= 0.5 * eps * out.float().abs() + 1e-30).all()
    assert torch.count_nonzero(lo) > lo.numel() // 2
    ref = reference_attention(q, k, v)
    assert rel_error(out.double() + lo.double(), ref) < rel_error(out, ref)


def test_bias_gradient_of_row_biases_and_through_the_lse(seed):
    """A bias constant along the keys (a per-query shift, or a scalar) cannot change
    the output, so its gradient is exactly zero; through the LSE it is dlse. And a
    float64 bias (computed in fp32) gets a float64 gradient."""
    B, H, M, N, D = 2, 2, 21, 35, 40
    q, k, v = make_qkv(B, H, M, N, D, torch.float32)
    for shape in ((B, 1, M, 1), ()):
        bias = torch.randn(shape, device=DEVICE).requires_grad_()
        out = flash_attention(q, k, v, bias)
        (g,) = torch.autograd.grad(out, (bias,), torch.randn_like(out))
        assert g.shape == bias.shape and torch.count_nonzero(g) == 0

    for shape in ((B, 1, M, 1), (), (B, H, M, N), (1, H, 1, N)):
        bias = torch.randn(shape, dtype=torch.float64, device=DEVICE).requires_grad_()
        out, lse = flash_attention_with_lse(q, k, v, bias)
        do, dlse = torch.randn_like(out), torch.randn_like(lse)
        (g,) = torch.autograd.grad((out, lse), (bias,), (do, dlse))
        # The float64 dS of every score; the bias's gradient is its sum over the dims
        # the bias broadcasts over.
        ref_in = [t.detach().double() for t in (q, k, v)]
        full = bias.detach().expand(B, H, M, N).clone().requires_grad_()
        scores = ref_in[0] @ ref_in[1].transpose(-1, -2) * D**-0.5 + full
        ref_out = torch.softmax(scores, -1) @ ref_in[2]
        (ds,) = torch.autograd.grad((ref_out, torch.logsumexp(scores, -1)), (full,), (do.double(), dlse.double()))
        r, size = ds.sum_to_size(bias.shape), ds.abs().sum_to_size(bias.shape)
        assert g.dtype == torch.float64 and g.shape == bias.shape
        # A summed gradient can cancel to near zero (the scalar's is the sum of dlse over
        # 84 rows): its rounding scales with the sum of the terms' sizes, so the error is
        # measured against that. For the full shape the two measures are the same.
        err = (g - r).norm().item() / size.norm().item()
        assert err < 1e-5, (shape, err)


def test_bias_gradient_is_written_by_one_kernel_and_only_when_needed(seed):
    """dS is written for the bias only when the bias requires a gradient: summed over the
    queries by the dK/dV kernel for a key-padding-like bias, whole by the dQ kernel
    otherwise (each with its own tile candidates)."""
    for kind, grad, expected in (
        ("full", False, [("dkdv", False), ("dq", False)]),
        ("full", True, [("dkdv", False), ("dq_dbias", True)]),
        ("keypad", True, [("dkdv_dbias", True), ("dq", False)]),
    ):
        q, k, v, bias = build(("fp32", 40, 20, 30, kind, "fp32", "bhnd"), requires_grad=True)
        bias.requires_grad_(grad)
        with launcher.recording() as seen:
            out = flash_attention(q, k, v, bias)
            torch.autograd.grad(out.sum(), (q, k, v, bias) if grad else (q, k, v))
        backward = [
            (x.kernel, x.arguments["BIAS_GRAD"]) for x in attention_launches(seen) if not x.kernel.startswith("fwd")
        ]
        assert backward == expected, (kind, grad)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_16_bit_bias_reaches_a_differentiated_call_as_float32(dtype, seed):
    """The backward kernels, and the forward with a key-padding bias, are compiled (and
    their tiles chosen, by the static report) for a float32 bias: a 16-bit pointer
    compiles to other code, which on sm_90 needed more shared memory than the GPU has
    (a key-padding mask at head dim 128). So in a call autograd will differentiate, a
    bias in the model's dtype, as diffusers passes it, is converted first, and its
    gradient comes back in its own dtype (tests/kernels/test_bias16.py: the inference
    forward reads a full one as it is)."""
    dt = DTYPES[dtype]
    for kind in ("key_padding", "full"):
        q, k, v = make_qkv(2, 2, 33, 47, 128, dt, requires_grad=True)
        bias = testing.make_bias(kind, 2, 2, 33, 47, dt, device=DEVICE).requires_grad_(kind == "full")
        with launcher.recording() as seen:
            out = flash_attention(q, k, v, bias)
            grads = torch.autograd.grad(out, (q, k, v, bias) if kind == "full" else (q, k, v), torch.randn_like(out))
        biases = [(x.kernel, x.arguments["Bias"].dtype) for x in attention_launches(seen)]
        assert {kernel.split("_")[0] for kernel, _ in biases} == {"fwd", "dkdv", "dq"}
        assert all(b == torch.float32 for _, b in biases), biases
        assert_close_to_reference(out.detach(), q.detach(), k.detach(), v.detach(), bias.detach())
        if kind == "full":
            assert grads[3].dtype == dt and grads[3].shape == bias.shape


@pytest.mark.parametrize("dtype", ["fp16", "bool"])
def test_an_expanded_key_mask_stays_a_key_mask_when_converted(dtype, seed):
    """A (B, 1, 1, N) key mask expanded to (B, H, M, N) is a stride-0 view. Converting it
    with .to() wrote it out in full: M times the memory (4 GB for Flux's 2 x 24 x 4608^2)
    and a full bias to the kernels, which then skip no tiles. It must reach them as the
    same broadcast view in float32, as a key bias, with the same answer."""
    B, H, M, N, D = 2, 3, 40, 70, 64
    q, k, v = make_qkv(B, H, M, N, D, torch.float16)
    lengths = torch.randint(1, N, (B,))  # a key padded in every item: a mask hiding nothing is dropped
    keep = torch.arange(N)[None, :] < lengths[:, None]
    if dtype == "bool":
        mask = keep.to(DEVICE)
    else:
        mask = key_padding_bias(keep, torch.float16, dims=2).to(DEVICE)
    expanded = mask[:, None, None, :].expand(B, H, M, N)
    assert expanded.stride()[1:3] == (0, 0)
    with launcher.recording() as seen:
        out = flash_attention(q, k, v, expanded)
    ((kernel, args),) = [(x.kernel, x.arguments) for x in attention_launches(seen)]
    variant = {fk.KEY_BIAS: "keypad", fk.FULL_BIAS: "full"}.get(args["BIAS"], "none")
    bias_dtype, nbytes = args["Bias"].dtype, args["Bias"].untyped_storage().nbytes()
    assert (kernel, variant, bias_dtype) == ("fwd", "keypad", torch.float32)
    assert nbytes <= B * N * 4, f"the converted mask holds {nbytes} bytes: it was written out in full"
    ref_bias = key_padding_bias(keep)
    assert_close_to_reference(out, q, k, v, ref_bias.to(DEVICE))


def test_an_expanded_16_bit_bias_that_needs_its_gradient_gets_one_per_element(seed):
    """A stride-0 view that is itself a leaf needing its gradient: torch gives each of its
    elements its own gradient, so it must be converted as the view it is, not through
    its stored row (which would put every row's gradient into row 0)."""
    B, H, M, N, D = 2, 2, 24, 40, 32
    q, k, v = make_qkv(B, H, M, N, D, torch.float16, requires_grad=True)
    bias = torch.randn(B, 1, 1, N, dtype=torch.float16).to(DEVICE).expand(B, H, M, N).requires_grad_()
    assert bias.is_leaf and bias.stride()[1:3] == (0, 0)
    out = flash_attention(q, k, v, bias)
    do = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, bias), do)
    ref, base = reference_grads((q, k, v, bias), do)
    for name, g, r, b in zip(("dq", "dk", "dv", "dbias"), got, ref, base):
        err, tol = rel_error(g, r), 2.0 * rel_error(b, r) + EPSILON[q.dtype]
        assert err <= tol, f"{name}: relative error {err:.3e} > tolerance {tol:.3e}"


@pytest.mark.cuda
def test_a_16_bit_key_padding_mask_runs_on_the_gpu_at_every_band(seed):
    """Found on an H200: an fp16 key-padding mask (Flux's variable-length text) at head
    dims 128-256 stopped the default sm_90 forward tile with OutOfResources (296,000 bytes
    of shared memory). The default tile of every band, forward and backward."""
    with launcher.override(autotune=False):
        for D in (40, 64, 80, 128, 160, 256, 320, 512):
            q, k, v = make_qkv(2, 2, 130, 300, D, torch.float16, requires_grad=True)
            bias = testing.make_bias("key_padding", 2, 2, 130, 300, torch.float16, device=DEVICE)
            out = flash_attention(q, k, v, bias)
            assert_close_to_reference(out.detach(), q.detach(), k.detach(), v.detach(), bias)
            assert_grads_close_to_reference(flash_attention, q.detach(), k.detach(), v.detach(), bias)


def test_eager_inference_skips_the_ops_dispatch_and_gives_the_same_answer(monkeypatch, seed):
    """Eager inference calls the op's body directly (torch.library's dispatch was most of
    a small call's host time); with a gradient to record, or under a dispatch mode (a
    FLOP counter, fake tensors), the op itself runs, and the answer is the same."""
    from torch.utils.flop_counter import FlopCounterMode

    calls = []
    real = fo.forward_op
    monkeypatch.setattr(fo, "forward_op", lambda *a: calls.append(1) or real(*a))
    q, k, v = make_qkv(1, 2, 20, 30, 64, torch.float32)
    bias = testing.make_bias("full", 1, 2, 20, 30, torch.float32, device=DEVICE)
    with torch.no_grad():
        direct = flash_attention(q, k, v, bias)
    assert calls == []
    assert_close_to_reference(direct, q, k, v, bias)
    out = flash_attention(q.clone().requires_grad_(), k, v, bias)  # eager training: _EagerFlash
    assert calls == [] and torch.equal(out.detach(), direct)
    with FlopCounterMode(display=False):
        flash_attention(q, k, v, bias)
        flash_attention(q.clone().requires_grad_(), k, v, bias)
    assert calls == [1, 1]


# (dtype, bias kind or None, the bias needs its gradient, causal, which outputs the loss reads)
EAGER_TRAINING_CASES = [
    ("fp16", None, False, False, "out"),
    ("fp16", "keypad", True, True, "out+lse"),
    ("bf16", "full", True, False, "lse"),
    ("fp32", "full", False, True, "out+lse"),
    ("fp16", "row", True, False, "out"),
]


@pytest.mark.parametrize("case", EAGER_TRAINING_CASES, ids=lambda c: "-".join(str(x) for x in c))
def test_eager_training_skips_both_ops_and_gives_the_ops_bits(monkeypatch, seed, case):
    """Eager training runs the forward and backward bodies in a plain autograd.Function
    (_EagerFlash) instead of the two torch.library ops: the same outputs and gradients,
    bit for bit, whether the loss reads the output, the LSE or both, with a bias that
    needs its gradient (a row bias's comes through the LSE alone), causal or not."""
    from torch.utils._python_dispatch import TorchDispatchMode

    dt, kind, bias_grad, causal, reads = case
    dtype = DTYPES[dt]
    q, k, v = make_qkv(2, 2, 24, 40, 40, dtype)
    if kind == "row":
        bias = torch.randn(2, 2, 24, 1, dtype=torch.float32, device=DEVICE)
    else:
        bias = make_bias(kind, 2, 2, 24, 40, torch.float32) if kind else None
    grads_of = [q, k, v] + ([bias] if bias_grad else [])
    do = torch.randn(q.shape, dtype=dtype, device=DEVICE)
    dl = torch.randn(2, 2, 24, dtype=torch.float32, device=DEVICE)

    class PassThrough(TorchDispatchMode):
        """A dispatch mode that changes nothing: with one active, the ops run."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def run(through_ops=False):
        leaves = [t.detach().clone().requires_grad_() for t in grads_of]
        qq, kk, vv = leaves[:3]
        b = leaves[3] if bias_grad else bias
        with PassThrough() if through_ops else contextlib.nullcontext():
            out, lse = flash_attention_with_lse(qq, kk, vv, b, causal=causal)
        loss = ((out.float() * do.float()).sum() if "out" in reads else 0) + (
            (torch.where(torch.isfinite(lse), lse, 0) * dl).sum() if "lse" in reads else 0
        )
        return [out.detach(), lse.detach(), *torch.autograd.grad(loss, leaves)]

    ops = []
    real_fwd, real_bwd = fo.forward_op, fo.backward_op
    monkeypatch.setattr(fo, "forward_op", lambda *a: ops.append("fwd") or real_fwd(*a))
    monkeypatch.setattr(fo, "backward_op", lambda *a: ops.append("bwd") or real_bwd(*a))
    eager = run()
    assert ops == []
    through_ops = run(through_ops=True)
    assert ops == ["fwd", "bwd"]
    for name, a, b in zip(["out", "lse", "dq", "dk", "dv", "dbias"], eager, through_ops):
        assert not a.isnan().any(), name
        assert torch.equal(a, b), name


# -- determinism -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_rerun_is_bit_identical(dtype, seed):
    case = (dtype, 40, 45, 70, "keypad", "fp32", "bnhd")
    q, k, v, bias = build(case, requires_grad=True, B=1)
    do = torch.randn(q.shape, dtype=q.dtype, device=DEVICE)
    runs = []
    for _ in range(2):
        out = flash_attention(q, k, v, bias)
        runs.append((out.detach().clone(), *torch.autograd.grad(out, (q, k, v), do)))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


# -- LSE, fully masked rows --------------------------------------------------------------


def test_lse_and_its_gradient(seed):
    """The forward's log-sum-exp, and gradients that flow through it (as ring attention
    combines partial results with it)."""
    q, k, v, bias = build(("fp32", 40, 33, 50, "perhead", "fp32", "bhnd"), requires_grad=True)
    out, lse = flash_attention_with_lse(q, k, v, bias)
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    scores = ref_in[0] @ ref_in[1].transpose(-1, -2) * 40**-0.5 + bias.double()
    ref_lse = torch.logsumexp(scores, dim=-1)
    assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape
    assert rel_error(lse, ref_lse) < 1e-6

    do, dlse = torch.randn_like(out), torch.randn_like(lse)
    got = torch.autograd.grad((out * do).sum() + (lse * dlse).sum(), (q, k, v))
    ref_out = reference_attention(*ref_in, bias)
    ref = torch.autograd.grad((ref_out * do.double()).sum() + (ref_lse * dlse.double()).sum(), ref_in)
    for name, g, r in zip("qkv", got, ref):
        assert rel_error(g, r) < 1e-5, name


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_fully_masked_rows_give_zeros(dtype, seed):
    """A query whose keys are all -inf outputs 0 (LSE -inf) and gets zero gradients;
    nothing turns into NaN, in the forward or the backward."""
    B, H, M, N, D = 1, 2, 40, 37, 64
    q, k, v = make_qkv(B, H, M, N, D, DTYPES[dtype], requires_grad=True)
    bias = torch.randn(B, H, M, N, device=DEVICE)
    bias[:, :, 3] = float("-inf")
    bias[:, 1, 35:] = float("-inf")
    out, lse = flash_attention_with_lse(q, k, v, bias)
    assert torch.all(out[:, :, 3] == 0) and torch.all(out[:, 1, 35:] == 0)
    assert torch.all(torch.isneginf(lse[:, :, 3]))
    assert_close_to_reference(out, q, k, v, bias)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
    assert torch.all(dq[:, :, 3] == 0)


# -- bf16 in the interpreter -------------------------------------------------------------


@pytest.mark.skipif(not launcher.INTERPRETED, reason="about Triton's interpreter")
def test_interpreter_bf16_dot_still_needs_emulation():
    """Why EMULATE_BF16 exists (see the module docstring). If a Triton release fixes
    the interpreter, this skips: the emulation can then go."""

    @triton.jit
    def dot16(a_ptr, b_ptr, c_ptr, EMULATE: tl.constexpr):
        r = tl.arange(0, 16)
        a = tl.load(a_ptr + r[:, None] * 16 + r[None, :])
        b = tl.load(b_ptr + r[:, None] * 16 + r[None, :])
        c = fk.SHARED["dot"](a, b, tl.zeros([16, 16], dtype=tl.float32), "tf32", EMULATE)
        tl.store(c_ptr + r[:, None] * 16 + r[None, :], c)

    a, b = torch.randn(16, 16, dtype=torch.bfloat16), torch.randn(16, 16, dtype=torch.bfloat16)
    exact = a.double() @ b.double()
    c = torch.empty(16, 16)
    dot16[(1,)](a, b, c, EMULATE=True)
    assert rel_error(c, exact) < 1e-6  # fp32 products of bf16 values are exact
    dot16[(1,)](a, b, c, EMULATE=False)
    if rel_error(c, exact) < 1e-2:
        pytest.skip("this Triton's interpreter multiplies bf16 correctly: EMULATE_BF16 can go")


def _bf16_probe():
    """fp32 values that exercise every branch of a conversion to bf16: random values,
    ties (low half exactly 0x8000, even and odd), overflow past bf16's largest finite
    value, infinities, NaN, subnormals and signed zeros."""
    ties = torch.tensor([0x3F808000, 0x3F818000, 0xBF808000, 0xBF818000], dtype=torch.int64)
    special = torch.tensor([3.4e38, -3.4e38, float("inf"), float("-inf"), float("nan"), 1e-40, -1e-40, 0.0, -0.0])
    return torch.cat(
        [torch.randn(4096) * 10.0 ** torch.randint(-6, 7, (4096,)), ties.to(torch.int32).view(torch.float32), special]
    )


@triton.jit
def _to_bf16_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    tl.store(y_ptr + r, tl.load(x_ptr + r, mask=r < n).to(tl.bfloat16), mask=r < n)


def _to_bf16_in_a_kernel(x):
    y = torch.empty(x.shape, dtype=torch.bfloat16)
    _to_bf16_kernel[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    return y


def _same_bf16(a, b):
    nan = torch.isnan(a.float())
    return torch.equal(nan, torch.isnan(b.float())) and torch.equal(
        a[~nan].view(torch.int16), b[~nan].view(torch.int16)
    )


@pytest.mark.skipif(not launcher.INTERPRETED, reason="about Triton's interpreter")
def test_interpreter_converts_fp32_to_bf16_as_a_gpu_does(seed):
    """tests/kernels/_interpreter_rounding.py is in effect: a kernel's fp32 -> bf16 conversion in
    the interpreter gives torch's bits (round to nearest, ties to even, which is what
    cvt.rn.bf16.f32 does on a GPU), so the bf16 tests measure the kernel's own error."""
    from tests.kernels._interpreter_rounding import fp32_to_bf16_bits

    x = _bf16_probe()
    want = x.to(torch.bfloat16)
    assert _same_bf16(torch.from_numpy(fp32_to_bf16_bits(x.numpy()).view("int16")).view(torch.bfloat16), want)
    assert _same_bf16(_to_bf16_in_a_kernel(x), want)


@pytest.mark.skipif(not launcher.INTERPRETED, reason="about Triton's interpreter")
def test_interpreter_still_truncates_to_bf16(monkeypatch, seed):
    """Why tests/kernels/_interpreter_rounding.py exists. If a Triton release rounds correctly,
    this skips: the patch can then go."""
    from triton.runtime import interpreter

    original = getattr(interpreter._convert_float, "original", None)
    if original is None:
        pytest.skip("tests/kernels/_interpreter_rounding.py found nothing to patch in this Triton")
    monkeypatch.setattr(interpreter, "_convert_float", original)
    x = torch.randn(1024)
    y = _to_bf16_in_a_kernel(x)
    if _same_bf16(y, x.to(torch.bfloat16)):
        pytest.skip("this Triton's interpreter rounds fp32 to bf16 to nearest: the patch can go")
    truncated = (x.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    assert _same_bf16(y, truncated)


def test_bf16_emulation_is_interpreter_only():
    """The launcher asks for emulation only under the interpreter. (The plans' launches
    go to a stand-in of Triton's launch, which runs nothing; one built as on a GPU,
    interpret=False, takes sm_90's fixed default tile.)"""
    q, k, v = make_qkv(1, 1, 4, 4, 16, torch.bfloat16)

    def emulated(interpret: bool, *qkv) -> bool:
        nowhere = launcher.override(
            interpret=interpret,
            arch="sm90",
            autotune=False,
            launch_through=lambda fn, grid, kwargs: None,
        )
        with nowhere, launcher.recording() as seen:
            plans.forward(*qkv, None, 0.25, False)
        ((kernel, args),) = [(x.kernel, x.arguments) for x in seen]
        assert kernel == "fwd"
        return args["EMULATE_BF16"]

    assert emulated(False, q, k, v) is False
    assert emulated(True, q, k, v) is True
    assert emulated(True, q.half(), k.half(), v.half()) is False


# -- refusals ----------------------------------------------------------------------------


def _t(*shape, dtype=torch.float16):
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


BAD_INPUTS = [
    (
        f"head_dim={MAX_HEAD_DIM + 8} exceeds {MAX_HEAD_DIM}",
        lambda: tuple(_t(1, 1, 4, MAX_HEAD_DIM + 8) for _ in range(3)),
        {},
    ),
    ("head_dim=4 is below 8", lambda: (_t(1, 1, 4, 4), _t(1, 1, 4, 4), _t(1, 1, 4, 4)), {}),
    ("float64 is not supported", lambda: tuple(_t(1, 1, 4, 16, dtype=torch.float64) for _ in range(3)), {}),
    ("must have 4 dims", lambda: (_t(1, 4, 16), _t(1, 4, 16), _t(1, 4, 16)), {}),
    ("does not match q shape", lambda: (_t(1, 2, 4, 16), _t(1, 1, 4, 16), _t(1, 1, 4, 16)), {}),
    ("must equal k shape", lambda: (_t(1, 1, 4, 16), _t(1, 1, 4, 16), _t(1, 1, 5, 16)), {}),
    ("share a dtype", lambda: (_t(1, 1, 4, 16), _t(1, 1, 4, 16, dtype=torch.float32), _t(1, 1, 4, 16)), {}),
    ("kv_len=0", lambda: (_t(1, 1, 4, 16), _t(1, 1, 0, 16), _t(1, 1, 0, 16)), {}),
    (
        "not broadcastable",
        lambda: (_t(1, 1, 4, 16), _t(1, 1, 5, 16), _t(1, 1, 5, 16)),
        {"attn_bias": torch.zeros(1, 1, 4, 4, device=DEVICE)},
    ),
    (
        "expected an additive float bias",
        lambda: (_t(1, 1, 4, 16), _t(1, 1, 5, 16), _t(1, 1, 5, 16)),
        {"attn_bias": torch.zeros(1, 1, 1, 5, dtype=torch.int32, device=DEVICE)},
    ),
    ("scale=inf must be finite", lambda: (_t(1, 1, 4, 16), _t(1, 1, 5, 16), _t(1, 1, 5, 16)), {"scale": math.inf}),
]


@pytest.mark.parametrize("message,make,kwargs", BAD_INPUTS, ids=[b[0].split()[0] for b in BAD_INPUTS])
def test_bad_inputs_raise_value_error(message, make, kwargs):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        flash_attention(*make(), **kwargs)


def _in_a_process(code: str, interpret: bool) -> str:
    """What `code` prints, run by this Python in a process of its own, under Triton's
    interpreter or not: TRITON_INTERPRET is read when the kernels are defined
    (launcher.INTERPRETED), so no process switches it once they are."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    repo = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-c", code], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_cpu_without_interpreter_is_refused():
    """CPU tensors, in a process without Triton's interpreter (_in_a_process)."""
    refusal = _in_a_process(
        "import torch\n"
        "from attnkit.kernels import flash_attention\n"
        "q = torch.randn(1, 1, 4, 16)\n"
        "try:\n"
        "    flash_attention(q, q, q)\n"
        "except ValueError as e:\n"
        "    print('ValueError:', e)\n",
        interpret=False,
    )
    assert refusal.startswith("ValueError:")
    assert "runs on CUDA; on the CPU it runs only under TRITON_INTERPRET=1" in refusal


def test_empty_query_batch():
    q, k, v = _t(1, 2, 0, 16), _t(1, 2, 3, 16), _t(1, 2, 3, 16)
    assert flash_attention(q, k, v).shape == (1, 2, 0, 16)


# -- packaging ---------------------------------------------------------------------------


def test_installed_as_attnkit_kernels_and_nothing_named_kernels(tmp_path):
    """attnkit/kernels/ is importable as attnkit.kernels from anywhere, and the install
    adds no top-level `kernels` (Hugging Face's hub-kernel loader owns that
    name). Run outside the checkout, so the current directory cannot supply either."""
    import importlib.metadata

    try:
        importlib.metadata.distribution("attnkit")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(
            "attnkit is not installed here (staged on PYTHONPATH, as bench/gpu_suite.sh does): "
            "there is no install to check"
        )
    repo = Path(__file__).resolve().parents[2]
    code = (
        "import importlib.util, attnkit.kernels as ak\n"
        "print(ak.flash_attention.__module__, ak.__file__)\n"
        "spec = importlib.util.find_spec('kernels')\n"
        "print(spec.origin if spec else None)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    lines = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    module, path = lines[0].split()
    assert module.startswith("attnkit.kernels") and Path(path).resolve().parent == repo / "attnkit" / "kernels"
    other = lines[1]
    assert other == "None" or repo not in Path(other).resolve().parents, other


# -- the backend -------------------------------------------------------------------------


def test_backend_reasons_and_forward(seed):
    from attnkit.backends import AttentionCall, DeviceInfo, get_backend
    from attnkit.backends import triton as tb

    backend = get_backend("triton")
    h100 = DeviceInfo("cuda", (9, 0), "H100")
    assert backend.not_supported_reasons(AttentionCall(h100, torch.bfloat16, 40, mask="key_padding")) == []
    too_big = backend.capabilities.max_head_dim + 8
    reasons = backend.not_supported_reasons(AttentionCall(h100, torch.float16, too_big))
    assert reasons == [f"head_dim={too_big} > {backend.capabilities.max_head_dim}"]
    t4 = DeviceInfo("cuda", (7, 5), "T4")
    assert backend.not_supported_reasons(AttentionCall(t4, torch.float16, 64)) == ["compute capability 7.5 < 8.0"]

    # A CPU call: refused without Triton's interpreter, judged as a GPU's under it; one of
    # the two here, the other in a process of its own (_in_a_process).
    cpu_call = AttentionCall(DeviceInfo("cpu"), torch.float16, 40)
    reasons = {False: [tb.CPU_REASON], True: []}
    assert backend.not_supported_reasons(cpu_call) == reasons[launcher.INTERPRETED]
    elsewhere = _in_a_process(
        "import json, torch\n"
        "import attnkit.kernels  # the kernels defined: their launcher's INTERPRETED is the truth\n"
        "from attnkit.backends import AttentionCall, DeviceInfo, get_backend\n"
        "call = AttentionCall(DeviceInfo('cpu'), torch.float16, 40)\n"
        "print(json.dumps(get_backend('triton').not_supported_reasons(call)))\n",
        interpret=not launcher.INTERPRETED,
    )
    assert json.loads(elsewhere.splitlines()[-1]) == reasons[not launcher.INTERPRETED]

    q, k, v, bias = build(("fp16", 40, 20, 30, "keypad", "fp16", "bnhd"))
    out = backend.forward(q, k, v, bias, upcast=True)
    assert_close_to_reference(out, q, k, v, bias)


def test_backend_tf32_option_reaches_the_kernel():
    from attnkit.backends import get_backend

    q = torch.randn(1, 1, 4, 16, device=DEVICE)

    def precision(backend) -> str:
        with launcher.recording() as seen:
            backend.forward(q, q, q)
        (fwd,) = [x for x in seen if x.kernel == "fwd"]
        return fwd.arguments["PRECISION"]

    assert precision(get_backend("triton")) == "ieee"  # fp32 is exact fp32 unless asked
    assert precision(get_backend("triton", allow_tf32=True)) == "tf32"


# -- 64-bit offsets ----------------------------------------------------------------------


@pytest.mark.skipif(DEVICE != "cpu", reason="interpreter-only: the CUDA test below covers a GPU")
def test_offsets_beyond_2_to_the_31_in_the_interpreter():
    """Forward and backward on views whose batch, head and tile-start offsets pass 2**31
    elements (tests/kernels/_large_offsets.py says how, without 2**31 elements of work). Run in
    a process of its own: a 32-bit offset there wraps and can crash the process."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = os.path.join(os.path.dirname(__file__), "_large_offsets.py")
    res = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, f"exit status {res.returncode} (-11 / 139: a segfault)\n{res.stdout}{res.stderr}"
    assert "ok: forward and backward" in res.stdout


def test_views_a_tile_cannot_address_are_compacted(seed):
    """A row stride so large that one tile's rows span 2**31 elements would overflow the
    kernels' 32-bit in-tile offsets: such a view is copied to a compact layout first
    (and nothing else is)."""
    rows = select.MAX_TILE_ROWS
    q, k, v = make_qkv(1, 2, 5, 6, 16, torch.float32)
    assert plans.addressable(q)
    row_stride = 2**31 // (rows - 1) + 1
    huge = torch.empty(4 * row_stride + 32, device=DEVICE).as_strided(
        q.shape, (16, 16, row_stride, 1)
    )  # lazily allocated
    huge.copy_(q)
    assert not plans.addressable(huge)
    with launcher.recording() as seen:
        out = flash_attention(huge, k, v)
        flash_attention(q, k, v)
    compacted, as_it_is = (x.arguments["Q"] for x in seen if x.kernel == "fwd")
    assert compacted is not huge and compacted.is_contiguous() and torch.equal(compacted, q)
    assert as_it_is is q
    assert_close_to_reference(out, q, k, v)


# -- on a GPU ----------------------------------------------------------------------------


@pytest.mark.cuda
def test_offsets_beyond_2_to_the_31(seed):
    """k and v of 2**31 + elements: the last heads are read from beyond 32-bit offsets."""
    B, H, M, D = 1, 4, 16, 128
    N = (1 << 31) // (B * H * D) + 64  # B*H*N*D > 2**31
    free, _ = torch.cuda.mem_get_info()
    if free < 2.5 * 2 * B * H * N * D * 2:
        pytest.skip("not enough GPU memory for two 4 GiB tensors")
    q = torch.randn(B, H, M, D, device="cuda", dtype=torch.float16)
    k = torch.randn(B, H, N, D, device="cuda", dtype=torch.float16)
    v = torch.randn(B, H, N, D, device="cuda", dtype=torch.float16)
    out = flash_attention(q, k, v)
    h = H - 1
    ref = torch.softmax((q[:, h:].float() @ k[:, h:].float().transpose(-1, -2)) * D**-0.5, -1) @ v[:, h:].float()
    assert rel_error(out[:, h:], ref) < 1e-2


# -- the launch plans on a GPU -------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["none", "keypad", "full"])
def test_direct_launches_give_the_bits_of_the_first_and_replay_in_a_cuda_graph(kind, seed):
    """After a signature's first call (through Triton, the autotuner included) every call
    launches the compiled kernel directly: forward and backward give the same bits as
    the first call, and a CUDA graph captured after them replays them (nothing on the
    launch path syncs with the host or benchmarks inside the capture)."""
    q, k, v, bias = build(("fp16", 64, 150, 140, kind, "fp32", "bhnd"), requires_grad=True)
    grad = torch.randn_like(q)

    def step():
        out = flash_attention(q, k, v, bias)
        return (out, *torch.autograd.grad(out, (q, k, v), grad))

    first = [t.clone() for t in step()]
    for _ in range(2):
        for a, b in zip(first, step()):
            assert torch.equal(a, b)
    assert_close_to_reference(first[0].detach(), q.detach(), k.detach(), v.detach(), bias)
    with torch.no_grad():
        static_out = flash_attention(q, k, v, bias)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = flash_attention(q, k, v, bias)
        for _ in range(2):
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(static_out, first[0])
