"""Every CPU backend against the float64 reference, on a matrix drawn from its capabilities.

Rule (attnkit.testing.tolerance): the backend's relative error against float64 is at
most 2x the error of plain torch math in the same dtype, plus a small epsilon. Data is
random and fresh every run (the seed is printed); NaN never passes.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.backends import AttentionCall, DeviceInfo, get_backend
from attnkit.testing import assert_close_to_reference, make_bias, make_qkv, reference_attention, rel_error
from tests._masks import additive

# (backend name, constructor options, id)
CPU_BACKENDS = [
    ("vanilla", {}, "vanilla"),
    ("sliced", {"slice_size": 3}, "sliced-3"),
    ("sdpa", {}, "sdpa"),
    ("sdpa", {"kernel": "math"}, "sdpa-math"),
    ("sdpa", {"kernel": "flash"}, "sdpa-flash"),
]

DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
HEAD_DIMS = [8, 40, 64, 72, 80, 100, 160, 512]
# (M, N): query lengths 1, 77, 333, 1024; key lengths 1, 77 and odd ~4097-class values;
# self-attention (M == N) and cross-attention.
LENGTHS = [(1, 1), (77, 77), (333, 77), (1024, 77), (1, 4097), (333, 4099), (1024, 1), (333, 333)]
MASKS = ["none", "keypad-bool", "keypad", "perhead", "full"]
LAYOUTS = ["contig", "strided"]


# CPU matmuls in fp16/bf16 are slow (no fast kernels): the largest problems run in fp32.
HALF_WORK_LIMIT = 6_000_000  # M * N * D


def _cases():
    """A covering design rather than the full product (which would take an hour on two
    cores): each head dim meets three length pairs, each length pair three head dims,
    and masks and layouts rotate across them, so every value of every axis appears with
    several values of the others."""
    cases = []
    for i, d in enumerate(HEAD_DIMS):
        for j in range(3):
            m, n = LENGTHS[(3 * i + j) % len(LENGTHS)]
            mask = MASKS[(i + j) % len(MASKS)]
            layout = LAYOUTS[(i + j) % 2]
            cases.append((d, m, n, mask, layout))
    return cases


CASES = _cases()


def make_inputs(b, h, m, n, d, dtype, layout, mask, scale_kind="default"):
    """q, k, v (attnkit.testing.make_qkv; "strided" is the processor's (B, N, H, D)
    storage viewed as (B, H, N, D)) and a bias of one kind."""
    q, k, v = make_qkv(b, h, m, n, d, dtype, layout="bnhd" if layout == "strided" else "bhnd")
    bias = None
    if mask == "keypad-bool":
        bias = make_bias("key_padding_bool", b, h, m, n)
    elif mask == "keypad":  # diffusers' convention: -10000 on padded keys
        bias = (~make_bias("key_padding_bool", b, h, m, n)).to(dtype) * -10000.0
    elif mask == "perhead":
        bias = make_bias("perhead", b, h, m, n, dtype)
    elif mask == "full":
        bias = make_bias("full", b, h, m, n, dtype)
    scale = None if scale_kind == "default" else 0.5 / math.sqrt(d)
    return q, k, v, bias, scale


def _params():
    out = []
    for name, opts, bid in CPU_BACKENDS:
        backend = get_backend(name, **opts)
        caps = backend.capabilities
        for dtype, dname in DTYPES.items():
            if dtype not in caps.dtypes:
                continue
            for d, m, n, mask, layout in CASES:
                if dtype != torch.float32 and m * n * d > HALF_WORK_LIMIT:
                    continue
                call = AttentionCall(
                    DeviceInfo("cpu"),
                    dtype,
                    d,
                    q_len=m,
                    kv_len=n,
                    batch=2,
                    heads=2,
                    mask="none" if mask == "none" else ("key_padding" if "keypad" in mask else "bias"),
                )
                if backend.not_supported_reasons(call):
                    continue
                out.append(
                    pytest.param(
                        name, opts, dtype, d, m, n, mask, layout, id=f"{bid}-{dname}-d{d}-m{m}-n{n}-{mask}-{layout}"
                    )
                )
    return out


@pytest.mark.parametrize("name,opts,dtype,d,m,n,mask,layout", _params())
def test_backend_matches_float64_reference(seed, name, opts, dtype, d, m, n, mask, layout):
    backend = get_backend(name, **opts)
    q, k, v, bias, scale = make_inputs(2, 2, m, n, d, dtype, layout, mask)
    bias = additive(bias, dtype)
    out = backend.forward(q, k, v, bias, scale)
    assert out.dtype == dtype
    assert out.shape == (2, 2, m, d)
    assert_close_to_reference(out, q, k, v, bias, scale)


@pytest.mark.parametrize("name,opts,bid", CPU_BACKENDS, ids=[c[2] for c in CPU_BACKENDS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_custom_scale_and_upcast(seed, name, opts, bid, dtype):
    """attn.scale other than D**-0.5 is honoured; upcast keeps fp16 scores out of overflow."""
    backend = get_backend(name, **opts)
    q, k, v, bias, _ = make_inputs(1, 2, 65, 77, 40, dtype, "strided", "keypad")
    for scale in (1.0, 0.05):
        out = backend.forward(q, k, v, bias, scale)
        assert_close_to_reference(out, q, k, v, bias, scale)
    # Scores of ~7e4 overflow fp16 (max 65504) unless they are held in fp32.
    qb = (torch.randn(1, 2, 16, 64) * 40).to(dtype)
    kb = (torch.randn(1, 2, 16, 64) * 40).to(dtype)
    vb = torch.randn(1, 2, 16, 64).to(dtype)
    out = backend.forward(qb, kb, vb, None, 1.0, upcast=True)
    assert torch.isfinite(out).all(), "upcast=True still produced inf/NaN"
    # Scores this large leave fp32 itself an error of up to ~2e-4 on some draws (near-tied
    # maxima): the baseline is torch math in fp32, rounded to the dtype.
    assert_close_to_reference(out, qb, kb, vb, None, 1.0, upcast=True)


@pytest.mark.parametrize("name,opts,bid", CPU_BACKENDS, ids=[c[2] for c in CPU_BACKENDS])
def test_fully_masked_row_gives_zeros(seed, name, opts, bid):
    backend = get_backend(name, **opts)
    q, k, v, _, _ = make_inputs(2, 2, 5, 7, 16, torch.float32, "contig", "none")
    keep = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    keep[0, :, 2, :] = False  # query 2 of batch 0 sees no key
    bias = additive(keep, torch.float32)
    out = backend.forward(q, k, v, bias)
    assert torch.isfinite(out).all()
    assert torch.equal(out[0, :, 2], torch.zeros_like(out[0, :, 2]))
    assert_close_to_reference(out, q, k, v, bias)


@pytest.mark.parametrize("name,opts,bid", CPU_BACKENDS, ids=[c[2] for c in CPU_BACKENDS])
def test_gradients_match_reference(seed, name, opts, bid):
    backend = get_backend(name, **opts)
    q, k, v, bias, scale = make_inputs(2, 2, 33, 77, 40, torch.float64, "strided", "perhead")
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    grad_out = torch.randn(2, 2, 33, 40, dtype=torch.float64)
    grads = torch.autograd.grad((backend.forward(q, k, v, bias, scale) * grad_out).sum(), (q, k, v))
    q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
    ref_grads = torch.autograd.grad((reference_attention(q2, k2, v2, bias, scale) * grad_out).sum(), (q2, k2, v2))
    for g, r in zip(grads, ref_grads):
        assert rel_error(g, r) < 1e-10


@pytest.mark.parametrize("mask", ["keypad", "perhead", "full"])
@pytest.mark.parametrize("name,opts,bid", CPU_BACKENDS, ids=[c[2] for c in CPU_BACKENDS])
def test_a_mask_that_needs_a_gradient_gets_it(seed, name, opts, bid, mask):
    """A float mask that requires grad (a learned bias) gets float64's gradient, with
    q, k and v's, from every backend: no backend may turn it into a constant (a
    conversion or a fast path that detaches it would leave its gradient None or zero)."""
    backend = get_backend(name, **opts)
    q, k, v, bias, scale = make_inputs(2, 2, 9, 33, 40, torch.float64, "strided", mask)
    leaves = [t.detach().requires_grad_() for t in (q, k, v, bias)]
    grad_out = torch.randn(2, 2, 9, 40, dtype=torch.float64)
    if opts.get("kernel") == "flash":  # torch's flash kernel has no mask gradient: refused
        with pytest.raises(ValueError, match="gives an attention mask no gradient"):
            backend.forward(*leaves[:3], leaves[3], scale)
        return
    grads = torch.autograd.grad((backend.forward(*leaves[:3], leaves[3], scale) * grad_out).sum(), leaves)
    ref_leaves = [t.detach().requires_grad_() for t in (q, k, v, bias)]
    ref = torch.autograd.grad((reference_attention(*ref_leaves, scale) * grad_out).sum(), ref_leaves)
    for name_, g, r in zip(("q", "k", "v", "mask"), grads, ref):
        assert g is not None and g.shape == r.shape, name_
        assert rel_error(g, r) < 1e-10, (name_, rel_error(g, r))


def test_sliced_covers_every_row_with_ragged_last_slice(seed):
    """B*H = 2*5 = 10 rows in slices of 4: the last slice has 2 rows (ceil division)."""
    backend = get_backend("sliced", slice_size=4)
    q, k, v, _, _ = make_inputs(2, 5, 9, 11, 8, torch.float32, "contig", "none")
    out = backend.forward(q, k, v)
    assert_close_to_reference(out, q, k, v)
    assert torch.isfinite(out[-1]).all()


def test_sliced_peak_memory_falls_with_slice_size():
    """The score matrix is held one slice at a time: peak allocation scales with slice_size."""
    from torch.profiler import ProfilerActivity, profile

    q, k, v, _, _ = make_inputs(1, 8, 512, 512, 8, torch.float32, "contig", "none")
    peaks = {}
    for size in (8, 4, 1):
        backend = get_backend("sliced", slice_size=size)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            backend.forward(q, k, v)
        # the largest single allocation of any one op
        peaks[size] = max(e.cpu_memory_usage for e in prof.events())
    # ... is one slice's scores: size * 512 * 512 float32 values
    assert peaks == {size: size * 512 * 512 * 4 for size in (8, 4, 1)}


@pytest.mark.parametrize("bad", [0, -1, "half", 2.5, True])
def test_sliced_rejects_bad_slice_size(bad):
    with pytest.raises(ValueError, match="slice_size"):
        get_backend("sliced", slice_size=bad)


def test_sdpa_rejects_unknown_kernel():
    with pytest.raises(ValueError, match="flash, efficient, math, cudnn"):
        get_backend("sdpa", kernel="fastest")


def test_reasons_are_readable():
    """Capabilities turn into sentences that state the limit and the value."""
    flash = get_backend("sdpa", kernel="flash")
    h100 = DeviceInfo("cuda", (9, 0), "NVIDIA H100")
    call = AttentionCall(h100, torch.float32, 40, mask="bias")
    reasons = flash.not_supported_reasons(call)
    assert any("float32" in r and "float16" in r for r in reasons), reasons
    assert any("mask=bias" in r for r in reasons), reasons
    t4 = DeviceInfo("cuda", (7, 5), "Tesla T4")
    reasons = flash.not_supported_reasons(AttentionCall(t4, torch.float16, 512))
    assert "compute capability 7.5 < 8.0" in reasons
    assert any("head_dim=512 > 256" in r for r in reasons)
    efficient = get_backend("sdpa", kernel="efficient")
    assert any(
        "device=cpu" in r for r in efficient.not_supported_reasons(AttentionCall(DeviceInfo("cpu"), torch.float32, 40))
    )
    assert get_backend("vanilla").not_supported_reasons(AttentionCall(DeviceInfo("cpu"), torch.float16, 40)) == []


def test_parity_matrix_covers_every_axis():
    """The covering design really meets every head dim, length, mask and layout."""
    seen = {axis: set() for axis in ("d", "len", "mask", "layout")}
    for d, m, n, mask, layout in CASES:
        seen["d"].add(d)
        seen["len"].add((m, n))
        seen["mask"].add(mask)
        seen["layout"].add(layout)
    assert seen["d"] == set(HEAD_DIMS)
    assert seen["len"] == set(LENGTHS)
    assert seen["mask"] == set(MASKS)
    assert seen["layout"] == set(LAYOUTS)
    pairs = {(d, mask) for d, _, _, mask, _ in CASES}
    assert len(pairs) >= len(HEAD_DIMS) * 3
    # and the dtype filters (half precision skips the largest problems) leave every head
    # dim and every mask kind to every backend in every dtype it declares
    params = [p.values for p in _params()]
    for name, opts, _ in CPU_BACKENDS:
        for dtype in get_backend(name, **opts).capabilities.dtypes & set(DTYPES):
            mine = [p for p in params if p[0] == name and p[1] == opts and p[2] == dtype]
            assert {p[3] for p in mine} == set(HEAD_DIMS), (name, opts, dtype)
            assert {p[6] for p in mine} == set(MASKS), (name, opts, dtype)
