"""The fused quantisation of Q and K (attnkit/kernels/int8/quant_kernel.py) against its
contract, the torch form in int8/quant.py, in Triton's interpreter.

* Given torch's mean of K over its tokens, every int8 value and every scale is bit-equal
  to quantize_qk's (torch.equal): both dtypes, head dims 8-512, lengths that are not
  multiples of a tile or a block, k_block 1, 64 and others, a negative softmax scale,
  strided inputs, rows and blocks of zeros, values halfway between two integers.
* token_mean, the kernel's own mean, is within float32 summation's worst-case rounding of
  the exact mean (and so within twice that of torch's, which obeys the same bound): for
  any order of summing N float32 terms |S^ - S| <= gamma(N - 1) * sum |x|, gamma(n) =
  n u / (1 - n u), u = 2^-24; the division by N (or a multiply by 1 / N) adds at most 2u
  of the result.
* Compiled for sm_90 (no GPU needed), the divisions are IEEE (div.rn.f32) and nothing is
  contracted into an fma: what the interpreter cannot show about the GPU's numerics.
* End to end (each with its own mean), q8 and qs are equal, and k8 differs from torch's
  in few places by at most one unit (a mean an ulp off moves x * inv by far less than 1:
  only a value next to a rounding boundary can cross it); ks is off by the mean's shift.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
import torch

from attnkit import testing

triton = pytest.importorskip("triton")

from attnkit.kernels.int8.quant import K_BLOCK, qk_pieces, quantize_qk  # noqa: E402
from attnkit.kernels.int8.quant_kernel import quantize_qk_fused, quantize_rows, token_mean  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
U = 2.0**-24

# (dtype, head dim, M, N, k_block, scale, layout)
CASES = [
    ("fp16", 8, 5, 3, 1, 0.35, "bhnd"),
    ("bf16", 8, 70, 130, 64, -1.0, "bnhd"),
    ("fp16", 40, 33, 70, 64, 40**-0.5, "bnhd"),
    ("bf16", 40, 17, 19, 1, -0.2, "bhnd"),
    ("fp16", 64, 65, 129, 64, -0.125, "bhnd"),
    ("bf16", 64, 9, 40, 3, 0.125, "bnhd"),
    ("fp16", 80, 21, 37, 1, 80**-0.5, "bnhd"),
    ("bf16", 80, 30, 100, 64, 0.7, "bhnd"),
    ("fp16", 128, 31, 77, 64, 128**-0.5, "bnhd"),
    ("bf16", 128, 40, 41, 1, -(128**-0.5), "bhnd"),
    ("fp16", 160, 12, 20, 1, 0.3, "bhnd"),
    ("bf16", 160, 7, 70, 64, -0.3, "bnhd"),
    ("fp16", 320, 6, 66, 64, 0.05, "bhnd"),
    ("bf16", 320, 11, 9, 1, 1.5, "bnhd"),
    ("fp16", 512, 10, 5, 1, -0.0441941738, "bnhd"),
    ("bf16", 512, 3, 70, 64, 0.0441941738, "bhnd"),
    ("fp16", 96, 12, 250, 100, 0.1, "bhnd"),  # a block larger than a tile, not a power of two
]


def _case_id(c):
    dt, d, m, n, kb, scale, layout = c
    return f"{dt}-d{d}-m{m}-n{n}-kb{kb}" + ("-neg" if scale < 0 else "") + ("-bnhd" if layout == "bnhd" else "")


def _qk(case):
    dt, d, m, n, kb, scale, layout = case
    q, k, _ = testing.make_qkv(1, 2, m, n, d, DTYPES[dt], layout=layout)
    return q, k, kb, scale


def _torch_mean(k):
    """The mean quant.smooth subtracts: torch's float32 mean over tokens."""
    return k.to(torch.float32).mean(dim=2)


def _assert_bit_equal_given_torchs_mean(q, k, scale, kb):
    q8, qs, k8, ks, pieces = quantize_qk(q, k, scale, k_block=kb)
    fq8, fqs, _, _, fpieces = quantize_qk_fused(q, k, scale, k_block=kb)
    gk8, gks = quantize_rows(k, sum(pieces), mean=_torch_mean(k), k_block=kb)
    assert fpieces == pieces
    for got, want in ((fq8, q8), (fqs, qs), (gk8, k8), (gks, ks)):
        assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
        assert torch.equal(got, want), (got.to(torch.float64) - want.to(torch.float64)).abs().max()


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_bit_equal_to_torch_given_its_mean(case, seed):
    q, k, kb, scale = _qk(case)
    _assert_bit_equal_given_torchs_mean(q, k, scale, kb)


def test_rows_and_blocks_of_zeros_and_strided_rows(seed):
    """Zero rows of Q, a head of K whose tokens are all one row (smoothed: all zeros,
    each block's scale 0), zero tokens among random ones; inputs sliced out of wider
    tensors (row stride above the head dim)."""
    B, H, M, N, D = 2, 2, 40, 70, 40
    q = torch.randn(B, H, M, D + 24).to(torch.float16)[..., :D]
    k = torch.randn(B, N, H, D + 8).to(torch.float16)[..., :D].transpose(1, 2)
    q[0, 1, 3] = 0
    q[1, 0, 30:] = 0
    k[1, 1] = torch.randn(D).to(torch.float16)  # N copies of one row: the mean is that row, exactly
    k[0, 0, 5] = 0
    assert q.stride(-1) == k.stride(-1) == 1 and q.stride(2) == D + 24 and k.stride(2) == H * (D + 8)
    for kb in (1, K_BLOCK):
        for scale in (0.2, -0.2):
            _assert_bit_equal_given_torchs_mean(q, k, scale, kb)
            q8, qs, k8, ks, _ = quantize_qk_fused(q, k, scale, k_block=kb)
            assert (qs[0, 1, 3] == 0).all() and (q8[1, 0, 30:] == 0).all() and (qs[1, 0, 30:] == 0).all()
            assert (ks[1, 1] == 0).all() and (k8[1, 1] == 0).all()


@pytest.mark.parametrize("dt", list(DTYPES))
def test_halfway_values_round_to_even(dt, seed):
    """Rows whose amax is 127 (scale 1, inverse 1): every value a random multiple of 1/2,
    so each rounds at a tie, to even as torch.round does."""
    q = torch.randint(-254, 255, (1, 3, 24, 64)).to(torch.float32) / 2
    q[..., 7] = 127.0
    q = q.to(DTYPES[dt])
    k = torch.randn(1, 3, 10, 64).to(DTYPES[dt])
    _assert_bit_equal_given_torchs_mean(q, k, 1.0, 1)
    q8 = quantize_qk_fused(q, k, 1.0)[0][..., :64]
    assert torch.equal(q8.to(torch.float32), torch.round(q.to(torch.float32)))


def _mean_bound(k):
    """(B, H, D): float32 rounding of a mean over N tokens, any summation order (module
    docstring): gamma(N - 1) * A + 2u (|mean| + gamma(N - 1) * A), A = mean |x|."""
    N = k.shape[2]
    gamma = (N - 1) * U / (1 - (N - 1) * U)
    k64 = k.to(torch.float64)
    a = k64.abs().mean(dim=2)
    return gamma * a + 2 * U * (k64.mean(dim=2).abs() + gamma * a)


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("n", [1, 63, 1000])
def test_token_mean_within_float32_rounding(dt, n, seed):
    """Against the exact (float64) mean within the bound, against torch's within twice it;
    offset data (mean about 3), where the rounding of the sum shows."""
    k = (torch.randn(2, n, 3, 40) + 3).to(DTYPES[dt]).transpose(1, 2)
    mean = token_mean(k)
    bound = _mean_bound(k)
    exact = k.to(torch.float64).mean(dim=2)
    assert mean.shape == (2, 3, 40) and mean.dtype == torch.float32
    assert ((mean.to(torch.float64) - exact).abs() <= bound).all()
    assert ((mean.to(torch.float64) - _torch_mean(k).to(torch.float64)).abs() <= 2 * bound).all()
    if n == 1:
        assert torch.equal(mean, k[:, :, 0].to(torch.float32))


def test_end_to_end_rarely_one_unit_off(seed):
    """Each with its own mean: q8 and qs equal; k8 at most one unit off in at most 1 in
    1000 values; ks within what the means' difference can move an amax, / 127."""
    differ = total = 0
    for dt, d, n, kb in (("fp16", 128, 300, 64), ("bf16", 64, 257, 1), ("bf16", 80, 200, 64), ("fp16", 40, 129, 1)):
        q, k, _ = testing.make_qkv(1, 2, 20, n, d, DTYPES[dt], layout="bnhd")
        k = k + 2 * torch.randn(1, 2, 1, d).to(k.dtype)  # per-channel offsets, as K has
        want = quantize_qk(q, k, 0.1, k_block=kb)
        got = quantize_qk_fused(q, k, 0.1, k_block=kb)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        diff = (got[2].to(torch.int16) - want[2].to(torch.int16)).abs()
        assert diff.max() <= 1
        differ += int((diff > 0).sum())
        total += diff.numel()
        shift = (_mean_bound(k) * 2).amax(dim=-1, keepdim=True)  # (B, H, 1): the means' difference
        ks_bound = shift / 127 + 2 * U * want[3].to(torch.float64)
        assert ((got[3].to(torch.float64) - want[3].to(torch.float64)).abs() <= ks_bound).all()
    print(f"k8 values off by one: {differ} of {total}")
    assert differ <= total / 1000


@pytest.mark.parametrize("shape", [(1, 2, 0, 5), (1, 2, 5, 0), (0, 2, 5, 5), (1, 0, 3, 3), (1, 2, 0, 0)])
def test_empty_tensors(shape, seed):
    B, H, M, N = shape
    q = torch.randn(B, H, M, 40).to(torch.float16)
    k = torch.randn(B, H, N, 40).to(torch.float16)
    for kb in (1, K_BLOCK):
        q8, qs, k8, ks, pieces = quantize_qk_fused(q, k, 0.5, k_block=kb)
        w = sum(pieces)
        assert (q8.shape, qs.shape, k8.shape, ks.shape) == ((B, H, M, w), (B, H, M), (B, H, N, w), (B, H, -(-N // kb)))
        assert (q8.dtype, qs.dtype, k8.dtype, ks.dtype) == (torch.int8, torch.float32, torch.int8, torch.float32)
        if B * H or kb == 1:  # quantize_qk's block view fails on B * H == 0 with k_block > 1
            want = quantize_qk(q, k, 0.5, k_block=kb)
            assert all(torch.equal(a, b) for a, b in zip((q8, qs, k8, ks), want[:4]))


def test_signature_and_argument_checks():
    assert inspect.signature(quantize_qk_fused) == inspect.signature(quantize_qk)
    q, k, _ = testing.make_qkv(1, 1, 4, 4, 40, torch.float16)
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match="keys per K scale"):
            quantize_qk_fused(q, k, 0.1, k_block=bad)
    with pytest.raises(ValueError, match="head dim"):
        quantize_qk_fused(q, k[..., :32], 0.1)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        quantize_qk_fused(q.float(), k.float(), 0.1)
    with pytest.raises(ValueError, match="the int8 kernel takes"):
        quantize_qk_fused(q[..., :4], k[..., :4], 0.1)
    assert qk_pieces(40) == quantize_qk_fused(q, k, 0.1)[4]


_COMPILE = """
import re, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attnkit.kernels.int8 import quant_kernel as qk
for name, d, kb, neg in (("quant", 128, 1, True), ("quant", 128, 64, False), ("quant", 512, 64, False), ("token_mean", 0, 0, 0)):
    fn = qk.KERNELS[name]
    types = {"x_ptr": "*bf16", "x8_ptr": "*i8", "factor": "fp32", "count": "fp32"}
    sig = {p.name: "constexpr" if p.is_constexpr else types.get(p.name, "*fp32" if p.name.endswith("_ptr") else "i32")
           for p in fn.params}
    if name == "quant":
        cols, rows, groups, warps = qk.tile_of(d, kb)
        consts = dict(KB=kb, GROUPS=groups, ROWS=rows, COLS=cols, HAS_MEAN=not neg, NEGATE=neg, QMAX_=127)
    else:
        consts, warps = dict(ROWS=qk.MEAN_ROWS, COLS=qk.MEAN_COLS), 4
    options = {"num_warps": warps, **qk.LAUNCH_OPTIONS[name]}
    ptx = triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    print(name, d, kb, sorted(set(re.findall(r"\\b(?:div|rcp|fma)\\.[a-z0-9.]+", ptx))))
"""


def test_compiled_for_sm90_divides_ieee_and_contracts_nothing():
    """The kernels compiled for sm_90 without a GPU, in a process without the
    interpreter: every division is div.rn.f32 (no div.approx / div.full / rcp.approx),
    and no fma (quantize_rows launches with enable_fp_fusion=False)."""
    pytest.importorskip("triton.backends.nvidia")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=env, cwd=root, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert len(lines) == 4, run.stdout
    for line in lines:
        assert line.endswith("['div.rn.f32']"), line
