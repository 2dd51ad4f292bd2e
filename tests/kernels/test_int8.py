"""The INT8 attention kernel (attnkit/kernels/int8) in Triton's interpreter.

Three checks, from tight to loose:
* the smoothing (K minus its mean over tokens) is exact: float64 attention gives the
  same output with and without it, masks and causal included;
* the kernel computes what its quantised inputs say: against float64 attention on the
  dequantised Q and K (int8/quant.py: dequantize), within the usual rule (twice plain
  torch's error in the same dtype), since the int8 products are exact and what is left
  is the 16-bit P.V of any attention kernel;
* against exact float64 attention, each row's error stays within the bound the
  quantisation step gives: a score moves by at most
  delta = |scale| * (sum_d |q_hat_d| * sk / 2 + sum_d |k_d| * sq / 2), so each
  probability by a factor within exp(+-2 delta), and the output by at most
  (exp(2 delta) - 1) * max|v| (plus the 16-bit rounding of the second check).
"""

from __future__ import annotations

import pytest
import torch

from attnkit import testing
from attnkit.testing import rel_error, torch_math_attention
from tests._masks import additive, causal_bias

triton = pytest.importorskip("triton")

from attnkit.kernels.int8 import int8_attention  # noqa: E402
from attnkit.kernels.int8.quant import K_BLOCK, dequantize, per_key, qk_pieces, quantize_qk, smooth  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _reference(q, k, v, bias=None, scale=None):
    return testing.reference_attention(q, k, v, bias, scale)


def _full_mask(bias, M, N, causal, offset):
    """The additive float64 mask a call applies: its bias plus the causal mask."""
    mask = None if bias is None else additive(bias, torch.float64)
    if causal:
        c = causal_bias(M, N, offset).to(DEVICE)
        mask = c if mask is None else mask + c
    return mask


# (dtype, head dim, M, N, bias kind, causal, layout)
CASES = [
    ("fp16", 64, 70, 90, "none", False, "bhnd"),
    ("fp16", 40, 77, 130, "key_padding", False, "bnhd"),
    ("bf16", 80, 33, 47, "full", False, "bhnd"),
    ("fp16", 8, 1, 5, "none", False, "bhnd"),
    ("fp16", 160, 20, 17, "perhead", False, "bnhd"),
    ("bf16", 128, 40, 40, "none", True, "bhnd"),
    ("fp16", 96, 50, 70, "bool", True, "bnhd"),
    ("fp16", 320, 17, 33, "key_padding", False, "bhnd"),
    ("bf16", 512, 9, 20, "2d", False, "bhnd"),
    ("fp16", 72, 64, 64, "headq", False, "bnhd"),
]


def _case_id(c):
    dt, d, m, n, bias, causal, layout = c
    return f"{dt}-d{d}-m{m}-n{n}-{bias}" + ("-causal" if causal else "") + ("-bnhd" if layout == "bnhd" else "")


def _build(case):
    dt, d, m, n, kind, causal, layout = case
    q, k, v = testing.make_qkv(2, 2, m, n, d, DTYPES[dt], layout=layout, device=DEVICE)
    bias = testing.make_bias(kind, 2, 2, m, n, torch.float32, device=DEVICE)
    return q, k, v, bias, causal, (n - m if causal else 0)


@pytest.mark.parametrize("case", CASES[:7], ids=_case_id)
def test_the_smoothing_is_exact_in_float64(case, seed):
    q, k, v, bias, causal, off = _build(case)
    mask = _full_mask(bias, q.shape[2], k.shape[2], causal, off)
    plain = _reference(q.double(), k.double(), v.double(), mask)
    k64 = k.double()
    smoothed = _reference(q.double(), k64 - k64.mean(dim=2, keepdim=True), v.double(), mask)
    assert (plain - smoothed).abs().max() < 1e-12
    # int8/quant.py smooths in float32: off by its rounding only
    assert (smooth(k).double() - (k64 - k64.mean(dim=2, keepdim=True))).abs().max() < 1e-5


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_the_kernel_computes_what_its_quantised_inputs_say(case, seed):
    q, k, v, bias, causal, off = _build(case)
    M, N = q.shape[2], k.shape[2]
    with torch.no_grad():
        out = int8_attention(q, k, v, bias, causal=causal, causal_offset=off)
    assert out.dtype == q.dtype and out.shape == q.shape and out.stride() == q.stride()
    assert not out.isnan().any()
    _assert_matches_its_quantised_inputs(out, q, k, v, _full_mask(bias, M, N, causal, off))


def _assert_matches_its_quantised_inputs(out, q, k, v, mask, scale=None, k_block=K_BLOCK):
    """out against float64 attention on the dequantised Q and K, within twice plain
    torch's error in the same dtype on those inputs (plus rounding)."""
    D = q.shape[3]
    scale = D**-0.5 if scale is None else scale
    q8, qs, k8, ks, _ = quantize_qk(q, k, scale, k_block)
    q_hat, k_hat = dequantize(q8, qs, k8, ks, D, scale, k_block)
    ref = _reference(q_hat, k_hat, v.double(), mask, scale)
    base = rel_error(torch_math_attention(q_hat.to(q.dtype), k_hat.to(q.dtype), v, mask, scale), ref)
    err = rel_error(out, ref)
    assert err <= 2 * base + testing.EPSILON[q.dtype], (err, base)


@pytest.mark.parametrize("k_block", [1, K_BLOCK])
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[5]], ids=_case_id)
def test_either_k_scale_form_and_a_negative_scale(case, k_block, seed):
    """K scales per key (an outer product per score, natural units) and per block of
    K_BLOCK keys (one factor per row and tile: base-2 units without a bias), with the
    softmax scale of either sign (its sign goes into q8, so qs >= 0 and the row max may
    be taken on the integer products): each computes what its quantised inputs say."""
    q, k, v, bias, causal, off = _build(case)
    M, N, D = q.shape[2], k.shape[2], q.shape[3]
    mask = _full_mask(bias, M, N, causal, off)
    for scale in (D**-0.5, -0.7 * D**-0.5):
        with torch.no_grad():
            out = int8_attention(q, k, v, bias, scale, causal=causal, causal_offset=off, k_block=k_block)
        assert not out.isnan().any()
        _assert_matches_its_quantised_inputs(out, q, k, v, mask, scale, k_block)
        q8, qs, _, ks, _ = quantize_qk(q, k, scale, k_block)
        assert (qs >= 0).all() and (ks >= 0).all() and ks.shape[-1] == -(-N // k_block)
    with pytest.raises(ValueError, match="k_block=3: keys per K scale, one of 1, 128"):
        int8_attention(q, k, v, k_block=3)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_each_rows_error_is_within_the_quantisation_bound(case, seed):
    q, k, v, bias, causal, off = _build(case)
    M, N, D = q.shape[2], k.shape[2], q.shape[3]
    scale = D**-0.5
    with torch.no_grad():
        out = int8_attention(q, k, v, bias, causal=causal, causal_offset=off)
    mask = _full_mask(bias, M, N, causal, off)
    exact = _reference(q.double(), k.double(), v.double(), mask)
    q8, qs, k8, ks, _ = quantize_qk(q, k, scale)
    q_hat, k_hat = dequantize(q8, qs, k8, ks, D, scale)
    quantised = _reference(q_hat, k_hat, v.double(), mask)
    sq = (qs.double() / scale).abs()  # (B, H, M)
    sk = per_key(ks.double(), N, K_BLOCK)  # (B, H, N): each key's block scale
    k_s = smooth(k).double()
    delta = abs(scale) * (
        q_hat.abs().sum(-1)[..., :, None] * sk[..., None, :] / 2
        + sq[..., :, None] * k_s.abs().sum(-1)[..., None, :] / 2
    )  # (B, H, M, N)
    if mask is not None:
        delta = delta.masked_fill(torch.isneginf(mask.expand_as(delta)), 0.0)
    bound = (torch.exp(2 * delta.amax(-1)) - 1) * v.double().abs().amax(dim=(-2, -1))[..., None]  # (B, H, M)
    rounding = (out.double() - quantised).abs().amax(-1)  # the 16-bit P.V, checked tight above
    err = (out.double() - exact).abs().amax(-1)
    assert (err <= bound + rounding + 1e-6).all(), (err - bound - rounding).max()


def test_per_channel_offsets_in_k_cost_nothing_once_smoothed(seed):
    """Keys with large per-channel offsets (common in diffusion transformers' K): the
    smoothing takes them out before the per-token scale is chosen, so the error is what
    it is without them; quantised without smoothing it grows with the offset."""
    q, k, v = testing.make_qkv(1, 2, 64, 96, 64, torch.float16, device=DEVICE)
    offset = torch.zeros(64, device=DEVICE, dtype=torch.float16)
    offset[::7] = 40.0
    shifted = k + offset
    exact = _reference(q.double(), k.double(), v.double())  # the same for shifted: exact smoothing
    with torch.no_grad():
        err_plain = rel_error(int8_attention(q, k, v), exact)
        err_shifted = rel_error(int8_attention(q, shifted, v), exact)
    # the same quantisation without the smoothing, in float64
    k8 = torch.round(shifted.double() / (shifted.double().abs().amax(-1, keepdim=True) / 127))
    k_naive = k8 * (shifted.double().abs().amax(-1, keepdim=True) / 127)
    q8, qs, _, _, _ = quantize_qk(q, k, 1.0)
    q_hat = q8[..., :64].double() * qs.double()[..., None]
    err_naive = rel_error(_reference(q_hat, k_naive, v.double()), exact)
    assert err_shifted < 1.5 * err_plain + 1e-4
    assert err_naive > 4 * err_shifted, (err_naive, err_shifted)


def test_rows_that_see_no_key_output_zeros_and_empty_calls(seed):
    q, k, v = testing.make_qkv(1, 2, 10, 20, 64, torch.float16, device=DEVICE)
    bias = torch.zeros(1, 1, 10, 20, device=DEVICE)
    bias[..., 3, :] = float("-inf")
    with torch.no_grad():
        out = int8_attention(q, k, v, bias)
        assert (out[:, :, 3] == 0).all() and not out.isnan().any()
        assert int8_attention(q[:, :, :0], k, v).shape == (1, 2, 0, 64)
        with pytest.raises(ValueError, match="kv_len=0: attention over no keys is undefined"):
            int8_attention(q, k[:, :, :0], v[:, :, :0])  # as the exact kernel says


def test_gradients_and_fp32_are_refused_with_their_reasons():
    q, k, v = testing.make_qkv(1, 1, 8, 8, 64, torch.float16, device=DEVICE, requires_grad=True)
    with pytest.raises(ValueError, match="forward only: a call that needs gradients"):
        int8_attention(q, k, v)
    q32, k32, v32 = testing.make_qkv(1, 1, 8, 8, 64, torch.float32, device=DEVICE)
    with pytest.raises(ValueError, match="q.dtype=torch.float32: the int8 attention takes float16 or bfloat16"):
        int8_attention(q32, k32, v32)
    with torch.no_grad():
        assert int8_attention(q, k, v).shape == q.shape


@pytest.mark.parametrize(
    "d,pieces",
    [
        (8, (32, 0)),
        (40, (64, 0)),
        (80, (64, 32)),
        (128, (128, 0)),
        (160, (128, 32)),
        (200, (256, 0)),
        (320, (256, 64)),
        (512, (256, 256)),
    ],
)
def test_the_quantised_head_dim_pieces(d, pieces):
    assert qk_pieces(d) == pieces
    assert sum(pieces) >= d and all(p == 0 or (p >= 32 and p & (p - 1) == 0 and p <= 256) for p in pieces)


def test_the_int8_plan_launches_its_kernel_directly_after_the_first_call(seed):
    """The int8 call goes through attnkit's launcher as the exact kernel does: the second
    call of a signature launches the kernel Triton compiled, with every argument in its
    declared order. The interpreted kernel run from that argument list gives the bits
    Triton's own launch gives (key padding and causal, so the lengths pass runs too)."""
    import types

    from attnkit.kernels import launcher

    ran = []

    def interpreted(fn, grid, kwargs):
        fn[grid](**kwargs)
        compiled = types.SimpleNamespace(src=types.SimpleNamespace(fn=fn), function=None, packed_metadata=None)
        compiled.run = lambda g0, g1, g2, stream, f, m, lm, e, x, *values: ran.append(fn.fn.__name__) or fn[
            (g0, g1, g2)
        ](**dict(zip(fn.arg_names, values)))
        return compiled

    q, k, v = testing.make_qkv(2, 2, 37, 45, 80, torch.float16, layout="bnhd", device=DEVICE)
    bias = testing.make_bias("key_padding", 2, 2, 37, 45, torch.float32, device=DEVICE)
    with torch.no_grad():
        want = int8_attention(q, k, v, bias, causal=True, causal_offset=8)
        with launcher.override(launch_through=interpreted):
            got = [int8_attention(q, k, v, bias, causal=True, causal_offset=8) for _ in range(2)]
    assert sorted(ran) == ["_attn_fwd_int8", "_key_lengths_kernel"]  # the second call's, direct
    assert all(torch.equal(g, want) for g in got)


@pytest.mark.parametrize(
    "arch,d,kind,causal",
    [
        ("sm90", 64, "none", False),
        ("sm90", 128, "key_padding", False),
        ("sm80", 128, "none", True),
        ("sm80", 64, "full", False),
        ("sm90", 128, "full", True),
        ("sm80", 160, "key_padding", False),
        ("sm90", 256, "none", True),
        ("sm80", 320, "full", False),
    ],
)
def test_each_targets_int8_tile_runs(arch, d, kind, causal, seed):
    """The tile each target ships for a head dim and bias (int8/ops.py's TILES, what the
    static report's int8 rows compile), run in the interpreter instead of its small tile,
    against float64 on the dequantised inputs, as the tight check above."""
    from attnkit.kernels import launcher
    from attnkit.kernels.int8 import ops

    M, N = 150, 140
    q, k, v = testing.make_qkv(1, 2, M, N, d, torch.float16, layout="bnhd", device=DEVICE)
    bias = testing.make_bias(kind, 1, 2, M, N, torch.float32, device=DEVICE)
    off = N - M if causal else 0
    with torch.no_grad(), launcher.override(shipped_tiles=True, arch=arch), launcher.recording() as launches:
        out = int8_attention(q, k, v, bias, causal=causal, causal_offset=off)
    (launch,) = [x for x in launches if x.kernel == "int8"]
    variant = {"none": "none", "key_padding": "keypad", "full": "full"}[kind]
    bm, bn, warps, stages = ops.tile_for(arch, d, variant)
    assert launch.description["tile_name"] == f"M{bm}-N{bn}-w{warps}-s{stages}"
    assert launch.description["variant"] == variant
    _assert_matches_its_quantised_inputs(out, q, k, v, _full_mask(bias, M, N, causal, off))


@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[6]], ids=_case_id)
def test_p_v_accumulated_in_float16(case, seed):
    """pv_accumulate="fp16" (GeForce tensor cores run a float16-accumulating product at twice
    the rate): each tile's P.V is summed in float16, then joins the float32 accumulator. The
    output stays within the tight check on its quantised inputs, and within a float16
    rounding of each tile's sum (2^-11 relative, a few tiles deep: 4e-3) of the float32
    accumulation's; bfloat16 inputs are refused (their products accumulate in float32 only)."""
    q, k, v, bias, causal, off = _build(case)
    M, N = q.shape[2], k.shape[2]
    with torch.no_grad():
        plain = int8_attention(q, k, v, bias, causal=causal, causal_offset=off)
        half = int8_attention(q, k, v, bias, causal=causal, causal_offset=off, pv_accumulate="fp16")
    assert not half.isnan().any()
    assert not torch.equal(half, plain), "pv_accumulate='fp16' changed nothing: the option was dropped"
    assert rel_error(half, plain) <= 4e-3, rel_error(half, plain)
    _assert_matches_its_quantised_inputs(half, q, k, v, _full_mask(bias, M, N, causal, off))
    qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
    with pytest.raises(ValueError, match="pv_accumulate='fp16' takes float16 inputs"):
        int8_attention(qb, kb, vb, pv_accumulate="fp16")
    with pytest.raises(ValueError, match="'fp32' \\(the default\\) or 'fp16'"):
        int8_attention(q, k, v, pv_accumulate="fp8")


def test_every_tile_sees_one_k_scale():
    """A tile's keys share one K scale (the kernel asserts it when it compiles): every
    shipped tile's BLOCK_N, and the interpreter's, divides quant.K_BLOCK."""
    from attnkit.kernels.flash import select
    from attnkit.kernels.int8 import ops

    widths = {tile[1] for *_, tile in ops.TILES} | {select.INTERPRET_TILE.block_n}
    assert all(K_BLOCK % n == 0 for n in widths), (K_BLOCK, widths)


def test_an_int8_call_plan_is_the_proof_of_its_checks():
    """As the exact kernel's: an eager int8 call is checked once per signature (its call
    plan exists only for a call that passed, whether it needs a gradient in the key), so
    a refused call is refused every time and leaves no plan; a bool mask's call plan holds
    its float32 copy's launch plan, and the answer is the same every call."""
    from attnkit.kernels import launcher

    launcher.clear_plans()
    q, k, v = testing.make_qkv(1, 2, 16, 16, 32, torch.float16)
    qg = q.clone().requires_grad_()
    for _ in range(2):
        with pytest.raises(ValueError, match="forward only"):
            int8_attention(qg, k, v)
        with pytest.raises(ValueError, match="float16 or bfloat16"):
            int8_attention(q.float(), k.float(), v.float())
    assert launcher.plan_count() == 0
    keep = torch.rand(1, 1, 1, 16) > 0.3
    keep[..., 0] = True
    with torch.no_grad():
        first = int8_attention(q, k, v, keep)
        built = launcher.plan_count()
        again = int8_attention(q, k, v, keep)
        assert built == 2 and launcher.plan_count() == 2, "the call's plan and its launch plan, built once"
        assert torch.equal(first, again)
        # Refused under autograd, though the same tensors passed under no_grad.
        with torch.enable_grad(), pytest.raises(ValueError, match="forward only"):
            int8_attention(qg, k, v, keep)
