"""The flash-attention kernel's paths beyond the plain forward, in Triton's interpreter,
against the float64 reference (attnkit.testing), gradients included:

* causal masking, top-left (torch's is_causal), bottom-right and negative offsets
  (rows that see no key), alone and with every bias kind; tiles above the diagonal
  are skipped, not computed;
* head dims 320, 384 and 512 (two 256-wide pieces at most);
* key padding as lengths: a 0 / -inf key mask is a length and is never loaded; other
  key biases are loaded up to their last live key;
* TMA and pointer loads: the launcher picks TMA on sm_90 where the tensors are
  16-byte aligned, pointers otherwise, and the interpreter runs whichever it picks;
* each bias variant's own default tiles (the shipped ones, not the interpreter's);
* rows fully masked by a huge finite value (float32's min), which float64 averages.

Every buffer a kernel writes starts as NaN (poison), and reruns are bit-identical.
"""

from __future__ import annotations

import importlib
import math
import types

import pytest
import torch

from attnkit.testing import (
    EPSILON,
    assert_close_to_reference,
    make_bias,
    make_qkv,
    reference_attention,
    rel_error,
    torch_math_attention,
)
from tests._masks import additive, causal_bias

triton = pytest.importorskip("triton")

from attnkit.kernels import flash_attention, flash_attention_with_lse  # noqa: E402

launcher = importlib.import_module("attnkit.kernels.launcher")
devices = importlib.import_module("attnkit.kernels.devices")
limits = importlib.import_module("attnkit.kernels.limits")
fk = importlib.import_module("attnkit.kernels.flash.kernels")
plans = importlib.import_module("attnkit.kernels.flash.launch")  # the forward and backward plans
fo = importlib.import_module("attnkit.kernels.flash.ops")
select = importlib.import_module("attnkit.kernels.flash.select")
ftc = importlib.import_module("attnkit.kernels.flash.tile_config")
tiles = importlib.import_module("attnkit.kernels.flash.tiles")
TensorDescriptor = importlib.import_module("triton.tools.tensor_descriptor").TensorDescriptor
TileConfig = ftc.TileConfig

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    DEVICE == "cuda", reason="interpreter paths; tests/kernels/test_kernel_flash.py covers a GPU"
)


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


def check(q, k, v, bias=None, scale=None, causal=False, offset=0, grads=True, bias_grad=False):
    """Output, LSE and gradients of the kernel against the float64 reference (the bias
    plus the causal mask), with the tolerance rule of attnkit.testing: twice the error
    of plain torch in the same dtype, plus rounding. Returns the kernel's (out, lse)."""
    M, N = q.shape[2], k.shape[2]
    mask = causal_bias(M, N, offset) if causal else None

    def with_mask(b, dtype):
        out = additive(b, dtype)
        if mask is not None:
            out = mask.to(dtype) if out is None else out + mask.to(dtype)
        return out

    inputs = [q, k, v] + ([bias] if bias_grad else [])
    for t in inputs:
        t.requires_grad_(grads)
    out, lse = flash_attention_with_lse(q, k, v, bias, scale, causal=causal, causal_offset=offset)
    ref_in = [t.detach().double().requires_grad_(grads) for t in inputs]
    ref = reference_attention(*ref_in[:3], with_mask(ref_in[3] if bias_grad else bias, torch.float64), scale)
    base_in = [t.detach().clone().requires_grad_(grads) for t in inputs]
    base = torch_math_attention(*base_in[:3], with_mask(base_in[3] if bias_grad else bias, torch.float32), scale)
    eps = EPSILON[q.dtype]
    err, tol = rel_error(out, ref), 2.0 * rel_error(base, ref) + eps
    assert err <= tol, f"out: relative error {err:.3e} > tolerance {tol:.3e}"
    # The LSE of rows that see a key, and -inf exactly for those that see none.
    scores = (
        q.detach().double() @ k.detach().double().transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    )
    full = with_mask(None if bias is None else bias.detach(), torch.float64)
    ref_lse = torch.logsumexp(scores if full is None else scores + full, -1)
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isneginf(lse.detach()), ~seen)
    assert rel_error(lse[seen], ref_lse[seen]) < 1e-5
    assert torch.all(out.detach()[~seen] == 0)
    if grads:
        do = torch.randn_like(out)
        got = torch.autograd.grad(out, inputs, do)
        ref_g = torch.autograd.grad(ref, ref_in, do.double())
        base_g = torch.autograd.grad(base, base_in, do)
        for name, g, r, b in zip(("dq", "dk", "dv", "dbias"), got, ref_g, base_g):
            assert g.shape == r.shape and g.dtype != torch.float64
            if r.norm() == 0:
                # Every row sees one key at most (a short padding length under a causal
                # mask): the gradient is exactly 0, and only rounding may remain of it.
                assert g.double().norm() <= eps * do.double().norm(), name
                continue
            err, tol = rel_error(g, r), 2.0 * rel_error(b, r) + eps
            assert err <= tol, f"{name}: relative error {err:.3e} > tolerance {tol:.3e}"
    return out.detach(), lse.detach()


# -- causal ------------------------------------------------------------------------------

# (dtype, head dim, M, N, causal offset, bias kind, layout)
CAUSAL_CASES = [
    ("fp16", 64, 70, 70, 0, "none", "bhnd"),  # torch's is_causal: top-left
    ("bf16", 40, 45, 100, 55, "key_padding", "bnhd"),  # bottom-right: offset N - M
    ("fp32", 80, 50, 40, -10, "none", "bhnd"),  # negative: the first 10 rows see nothing
    ("fp16", 24, 33, 65, 5, "full", "bnhd"),
    ("bf16", 100, 65, 31, -3, "perhead", "bhnd"),  # head dim 100: no TMA (200-byte rows)
    ("fp32", 40, 20, 30, -20, "none", "bhnd"),  # every row blind
    ("fp16", 160, 17, 96, 80, "bool", "bnhd"),
]


def causal_id(case):
    dt, d, m, n, off, bias, layout = case
    return f"{dt}-d{d}-m{m}-n{n}-off{off}-{bias}-{layout}"


@pytest.mark.parametrize("case", CAUSAL_CASES, ids=causal_id)
def test_causal_forward_lse_and_gradients(case, seed):
    dt, d, m, n, off, kind, layout = case
    B = 2 if kind == "key_padding" else 1  # two lengths
    q, k, v = make_qkv(B, 2, m, n, d, DTYPES[dt], layout=layout)
    bias = make_bias(kind, B, 2, m, n, torch.float32)
    out, lse = check(q, k, v, bias, causal=True, offset=off)
    if off < 0:
        assert torch.all(out[:, :, :-off] == 0) and torch.all(torch.isneginf(lse[:, :, :-off]))


def test_causal_is_torch_is_causal(seed):
    """causal_offset=0 is torch's scaled_dot_product_attention(is_causal=True), M != N."""
    q, k, v = make_qkv(1, 2, 37, 53, 32, torch.float32)
    ours = flash_attention(q, k, v, causal=True)
    theirs = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert rel_error(ours, theirs) < 1e-5


def test_causal_with_a_learned_bias_gets_its_gradient(seed):
    q, k, v = make_qkv(1, 2, 40, 50, 40, torch.float16)
    bias = make_bias("headq", 1, 2, 40, 50, torch.float32)
    check(q, k, v, bias, causal=True, offset=10, bias_grad=True)


def test_tiles_above_the_diagonal_are_never_read(seed):
    """Keys no row may see, in tiles of their own, hold NaN: a kernel that loaded and
    masked them would turn every output into NaN (0 * NaN), one that skips them cannot.
    (32-key tiles in the interpreter: rows 0-39 see keys 0-39, tiles from key 64 on are
    skipped.)"""
    q, k, v = make_qkv(1, 2, 40, 128, 32, torch.float16)
    k[:, :, 64:] = float("nan")
    v[:, :, 64:] = float("nan")
    out = flash_attention(q, k, v, causal=True)
    ref = reference_attention(q, k[:, :, :64], v[:, :, :64], causal_bias(40, 64, 0))
    assert rel_error(out, ref) < 2e-3
    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    out = flash_attention(q, k, v, causal=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert torch.isfinite(dq).all() and torch.isfinite(dk[:, :, :64]).all() and torch.isfinite(dv[:, :, :64]).all()
    assert torch.all(dk[:, :, 64:] == 0) and torch.all(dv[:, :, 64:] == 0)


def test_causal_arguments_are_checked():
    q, k, v = make_qkv(1, 1, 4, 4, 16, torch.float16)
    with pytest.raises(ValueError, match="causal_offset=3 without causal=True would be ignored"):
        flash_attention(q, k, v, causal_offset=3)
    with pytest.raises(ValueError, match="causal_offset=1.5 must be an int"):
        flash_attention(q, k, v, causal=True, causal_offset=1.5)
    with pytest.raises(ValueError, match="causal=1 must be a bool"):
        flash_attention(q, k, v, causal=1)


def test_an_offset_that_hides_nothing_is_no_mask(seed):
    """Offsets beyond the last key mean every key is visible: the unmasked kernel runs;
    offsets before the first row mean none is, and every row is empty."""
    q, k, v = make_qkv(1, 2, 20, 30, 16, torch.float32)
    with launcher.recording() as seen:
        out = flash_attention(q, k, v, causal=True, causal_offset=10**12)
    assert [x.arguments["CAUSAL"] for x in attention_launches(seen)] == [False]
    assert rel_error(out, reference_attention(q, k, v)) < 1e-5
    with launcher.recording() as seen:
        out = flash_attention(q, k, v, causal=True, causal_offset=-(10**12))
    assert [x.arguments["CAUSAL"] for x in attention_launches(seen)] == [True] and torch.all(out == 0)


# -- head dims up to 512 -----------------------------------------------------------------


@pytest.mark.parametrize(
    "dt,d,causal", [("fp16", 320, False), ("bf16", 384, True), ("fp16", 512, False), ("fp32", 512, True)]
)
def test_large_head_dims(dt, d, causal, seed):
    """Two pieces of at most 256 (320 = 256 + 64, 384 = 256 + 128, 512 = 256 + 256): the
    SD VAE's single 512-wide head, and the head dims of newer models."""
    q, k, v = make_qkv(1, 2, 33, 40, d, DTYPES[dt], layout="bnhd")
    bias = make_bias("key_padding", 1, 2, 33, 40, torch.float32)
    check(q, k, v, bias, causal=causal, offset=3 if causal else 0)


# -- key padding as lengths --------------------------------------------------------------


def test_key_padding_lengths_and_plain_flags():
    """The launcher measures each (batch, head)'s length (one past its last key that is
    not -inf) and whether the bias is 0 before it (a mask: nothing to load): the bias's
    layout (bias_layout) makes it a key bias, and its lengths launch (key_lengths)
    measures it."""
    B, H, M, N = 3, 2, 5, 10
    bias = torch.zeros(B, 1, 1, N)
    bias[0, ..., 7:] = float("-inf")  # a mask: length 7
    bias[1, ..., 3] = float("-inf")  # a hole: length 10, not plain
    bias[2] = float("-inf")  # nothing visible: length 0
    _, _, sl, constexprs, variant = plans.bias_layout(bias, (B, H, M, N))
    assert variant == "keypad" and constexprs["BIAS"] == fk.KEY_BIAS
    lens, plain = plans.key_lengths(bias, N)
    assert lens[:, 0].tolist() == [7, 10, 0] and plain[:, 0].tolist() == [1, 0, 1]
    assert sl == (lens.stride(0), 0)  # broadcast over heads
    bias[0, ..., 2] = 0.5  # a value: the bias must be loaded
    lens, plain = plans.key_lengths(bias, N)
    assert plain[:, 0].tolist() == [0, 0, 1]
    # A call's forward gets those lengths and flags, with those strides.
    q, kv = torch.randn(B, H, M, 16), torch.randn(B, H, N, 16)
    with launcher.recording() as seen:
        flash_attention(q, kv, kv, bias)
    (fwd,) = attention_launches(seen)
    assert torch.equal(fwd.arguments["Lens"], lens) and torch.equal(fwd.arguments["Plain"], plain)
    assert (fwd.arguments["stride_lb"], fwd.arguments["stride_lh"]) == sl
    _, _, _, constexprs, variant = plans.bias_layout(torch.zeros(B, H, M, N), (B, H, M, N))
    assert variant == "full" and constexprs["BIAS"] == fk.FULL_BIAS


@pytest.mark.parametrize("kind", ["key_padding", "key_padding_bool", "value_and_padding", "empty_rows"])
def test_key_padding(kind, seed):
    B, H, M, N, D = 3, 2, 40, 70, 40
    q, k, v = make_qkv(B, H, M, N, D, torch.float16, layout="bnhd")
    if kind == "value_and_padding":  # a per-key value plus padding: loaded up to the length
        bias = make_bias("perhead", B, 1, M, N) + make_bias("key_padding", B, 1, M, N)
    elif kind == "empty_rows":  # one batch item sees no key at all
        bias = make_bias("key_padding", B, 1, M, N)
        bias[1] = float("-inf")
    else:
        bias = make_bias(kind, B, H, M, N)
    out, _ = check(q, k, v, bias)
    if kind == "empty_rows":
        assert torch.all(out[1] == 0)


def test_padded_keys_are_never_read(seed):
    """Keys past the length, in tiles of their own, hold NaN: they are not loaded."""
    q, k, v = make_qkv(2, 2, 30, 128, 32, torch.float16)
    bias = torch.zeros(2, 1, 1, 128)
    bias[..., 50:] = float("-inf")
    k[:, :, 64:] = float("nan")
    v[:, :, 64:] = float("nan")
    out = flash_attention(q, k, v, bias)
    assert rel_error(out, reference_attention(q, k[:, :, :50], v[:, :, :50])) < 2e-3


def test_key_padding_bias_gradient(seed):
    """The gradient of a learned key bias with padding (the dK/dV pass sums it), zero
    on padded keys."""
    B, H, M, N = 2, 2, 37, 70
    q, k, v = make_qkv(B, H, M, N, 64, torch.bfloat16)
    bias = make_bias("key_padding", B, 1, M, N, torch.float32)
    check(q, k, v, bias, bias_grad=True)


# -- TMA and pointer loads ---------------------------------------------------------------


def _tma_of(seen: list) -> list:
    """(kernel, TMA loads) of each attention kernel's launch in a recording."""
    return [(x.kernel, x.description["tma"]) for x in attention_launches(seen)]


def test_tma_where_aligned_pointers_elsewhere(seed):
    """On sm_90 the streamed tiles come through tensor descriptors when every tensor is
    16-byte aligned; a 200-byte row (head dim 100 in fp16), an odd offset, fp32 inputs
    or sm_80 take pointers. The interpreter runs the same launcher path either way, and
    both give the same bits."""
    q, k, v = make_qkv(1, 2, 40, 70, 64, torch.float16, layout="bnhd")
    for t in (q, k, v):
        t.requires_grad_()
    with launcher.recording() as seen:
        out = flash_attention(q, k, v)
        grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert _tma_of(seen) == [("fwd_lo", True), ("dkdv", True), ("dq", True)]
    with launcher.override(arch="sm80"), launcher.recording() as seen:
        out_ptr = flash_attention(q, k, v)
        grads_ptr = torch.autograd.grad(out_ptr, (q, k, v), torch.ones_like(out))
    assert _tma_of(seen) == [("fwd_lo", False), ("dkdv", False), ("dq", False)]
    assert torch.equal(out, out_ptr) and all(torch.equal(a, b) for a, b in zip(grads, grads_ptr))

    q, k, v = make_qkv(1, 2, 40, 70, 100, torch.float16)
    with launcher.recording() as seen:
        check(q, k, v, grads=False)
    assert _tma_of(seen) == [("fwd", False)]
    storage = torch.randn(1 + 2 * 70 * 64, dtype=torch.float16)
    k_odd = storage[1:].view(1, 2, 70, 64)  # 2 bytes past a 16-byte boundary
    q, _, v = make_qkv(1, 2, 40, 70, 64, torch.float16)
    with launcher.recording() as seen:
        check(q, k_odd, v, grads=False)
    assert _tma_of(seen) == [("fwd", False)]
    with launcher.recording() as seen:
        check(*make_qkv(1, 2, 40, 70, 64, torch.float32), grads=False)
    assert _tma_of(seen) == [("fwd", False)]


def test_misaligned_inputs_without_a_pointer_tile_are_copied_for_tma(seed):
    """Where a call has no spill-free pointer tile on sm_90 (a full bias at some head
    dims; here every list keeps its TMA tiles only, through a candidates filter), the
    misaligned tensors are copied into aligned buffers (rows padded to 16 bytes) and the
    TMA path runs; the results are those of the aligned call."""
    storage = torch.randn(1 + 2 * 70 * 100, dtype=torch.float16)
    k_odd = storage[1:].view(1, 2, 70, 100)  # 200-byte rows, 2 bytes off: no descriptor can read it
    q, _, v = make_qkv(1, 2, 40, 70, 100, torch.float16)
    bias = make_bias("full", 1, 2, 40, 70)
    tma_only = launcher.override(candidates=lambda kernel, cands, tma: cands if tma else ())
    with tma_only, launcher.recording() as seen:
        check(q, k_odd, v, bias)
    assert _tma_of(seen) == [("fwd_lo", True), ("dkdv", True), ("dq", True)]
    assert plans.tma_ok(plans.tma_copy(k_odd)) and torch.equal(plans.tma_copy(k_odd), k_odd)


# -- the shipped tiles of each bias variant ----------------------------------------------


def _shipped_tiles(arch: str):
    """Make the interpreter run the default tile `arch` ships for each call (instead of
    its own small tile), inside a with block."""
    return launcher.override(shipped_tiles=True, arch=arch)


def _tile(c) -> tuple:
    """A TileConfig as Launch.describe() gives a launch's tile: (BLOCK_M, BLOCK_N,
    num_warps, num_stages, RELOAD); its register cap is no option of the interpreter."""
    return (c.block_m, c.block_n, c.num_warps, c.num_stages, c.reload)


def _tiles_ran(seen: list) -> dict:
    """The tile each attention kernel of a recording ran, by kernel (every launch of a
    kernel the same one)."""
    ran = {}
    for x in attention_launches(seen):
        assert ran.setdefault(x.kernel, x.description["tile"]) == x.description["tile"], x.kernel
    return ran


@pytest.mark.parametrize(
    "arch,kind,d,bias_grad",
    [
        ("sm80", "key_padding", 320, False),
        ("sm80", "full", 512, True),
        ("sm90", "none", 384, False),
        ("sm90", "full", 320, True),
    ],
)
def test_shipped_fp32_backward_tiles_at_large_head_dims(arch, kind, d, bias_grad, seed):
    """The exact-fp32 backward lists above head dim 256 ship 16-row tiles on 8 warps, with
    and without reloading the held tiles, per variant and causality: run each call with
    the default its target ships (every head-dim piece and gradient launch), causal, in
    the interpreter, against float64."""
    variant = {"none": "none", "key_padding": "keypad", "full": "full"}[kind]
    M, N = 37, 45  # more than two 16-row tiles, ending inside one
    q, k, v = make_qkv(1, 1, M, N, d, torch.float32, layout="bnhd")
    bias = make_bias(kind, 1, 1, M, N, torch.float32)
    with _shipped_tiles(arch), launcher.recording() as seen:
        check(q, k, v, bias, causal=True, offset=N - M, bias_grad=bias_grad)
    ran = _tiles_ran(seen)
    # Above 256 the backward runs once per head-dim piece (dK/dV once per gradient too); a
    # full bias's gradient comes with the first dQ launch.
    assert {"fwd", "dkdv", "dq"} <= set(ran) and bias_grad == ("dq_dbias" in ran)
    for kernel, tile in ran.items():
        assert tile == _tile(select.configs_for(kernel, d, torch.float32, arch, variant, True, False)[0]), kernel


@pytest.mark.parametrize("d,bias_grad", [(320, True), (512, False), (512, True)])
def test_sm80_causal_backward_with_key_padding_runs_its_three_stage_tiles(d, bias_grad, seed):
    """sm_80's 16-bit causal dK/dV with key padding at head dims 320 and 512 ships
    three-stage tiles without reloading the held K and V (the two-stage ones spilled;
    A100 only: kernels/devices.py refuses these backward calls on 99 KiB GPUs): run each
    with that tile in the interpreter, the key-summed bias gradient too, against float64."""
    kernel = "dkdv_dbias" if bias_grad else "dkdv"
    tile = select.configs_for(kernel, d, torch.float16, "sm80", "keypad", True, False)[0]
    assert (tile.num_stages, tile.reload) == (3, False)
    M, N = 37, 45  # two 32-query tiles, the second ragged; the causal diagonal crosses them
    q, k, v = make_qkv(1, 1, M, N, d, torch.float16, layout="bnhd")
    bias = make_bias("key_padding", 1, 1, M, N, torch.float32)
    with _shipped_tiles("sm80"), launcher.recording() as seen:
        check(q, k, v, bias, causal=True, offset=N - M, bias_grad=bias_grad)
    assert _tiles_ran(seen)[kernel] == _tile(tile)


@pytest.mark.parametrize(
    "arch,kind",
    [
        ("sm90", "none"),
        ("sm90", "key_padding"),
        ("sm90", "perhead"),
        ("sm90", "full"),
        ("sm80", "none"),
        ("sm80", "full"),
    ],
)
def test_each_variant_runs_its_own_default_tiles(arch, kind, seed):
    """Each bias variant has its own candidate lists (a tile that spills with a full
    bias still serves the others): run the kernels with the default tile the target
    ships for the call's variant (up to 128 x 128), causal too, in the interpreter."""
    variant = {"none": "none", "key_padding": "keypad", "perhead": "keypad", "full": "full"}[kind]
    shipped = {
        kernel: _tile(select.configs_for(kernel, 64, torch.float16, arch, variant, True, arch == "sm90")[0])
        for kernel in ("fwd_lo", "dkdv", "dq")
    }
    M, N = 150, 140  # crosses a 128-row tile and ends inside one
    q, k, v = make_qkv(1, 2, M, N, 64, torch.float16, layout="bnhd")
    bias = make_bias(kind, 1, 2, M, N, torch.float32)
    with _shipped_tiles(arch), launcher.recording() as seen:
        check(q, k, v, bias, causal=True, offset=N - M)
    assert _tiles_ran(seen) == shipped


def test_every_call_has_a_tile():
    """Every call a kernel can receive has a candidate: each target, kernel, width, head-dim
    band, bias variant and causality; pointer loads on sm_80 and for fp32, TMA or pointer
    loads for 16-bit on sm_90 (a call with no TMA tile runs pointer loads; one whose
    tensors are not aligned for TMA and whose list has no pointer tile copies them into
    aligned buffers: test_misaligned_inputs_without_a_pointer_tile_are_copied_for_tma)."""
    missing = []
    for arch in select.ARCHS:
        for kernel in fk.KERNELS:
            variants = ("keypad", "full") if kernel.endswith("dbias") else ("none", "keypad", "full")
            dtypes = (torch.float16, torch.bfloat16) if kernel == "fwd_lo" else (torch.float16, torch.float32)
            for dtype in dtypes:
                for band in limits.BANDS:
                    for d in {band, max(8, band - 24)}:
                        for variant in variants:
                            for causal in (False, True):
                                loads = (True, False) if arch == "sm90" and dtype != torch.float32 else (False,)
                                if not any(
                                    select.configs_for(kernel, d, dtype, arch, variant, causal, tma) for tma in loads
                                ):
                                    missing.append((arch, kernel, str(dtype), d, variant, causal))
    assert not missing, missing


def test_a_tiles_register_cap_reaches_the_compiler():
    """A tile with a register cap (TileConfig.maxnreg) is compiled with it on a GPU, fixed
    or autotuned: the cap is what keeps some 8-warp tiles from spilling, and the inspector
    compiles with it. The interpreter has no such option and gets none."""
    cap = TileConfig(16, 16, 8, 2, maxnreg=255)
    assert str(cap) == "M16-N16-w8-s2-reg255"
    calls = []
    tensors = {"Q": torch.randn(1), **{n: None for n in ("KD0", "KD1", "VD0", "VD1")}}
    for interpret in (False, True):
        with launcher.override(interpret=interpret, launch_through=lambda fn, grid, kwargs: calls.append(kwargs)):
            fwd = fk.KERNELS["fwd"]
            launch = select.tile_launch(
                "fwd", fwd, cap, {"CAUSAL": False, "TMA": False}, 40, "BLOCK_M", 1, 1, cuda=False
            )
            launcher.run(launch, tensors)
    assert calls[0]["maxnreg"] == 255 and calls[0]["num_warps"] == 8
    assert "maxnreg" not in calls[1]
    # Autotuned (a list of two candidates, the second capped, through a candidates
    # filter): each candidate's triton.Config carries its own cap.
    two = (TileConfig(16, 16, 4, 1), cap)
    with launcher.override(interpret=False, arch="sm90", autotune=True, candidates=lambda kernel, cands, tma: two):
        tuner, fixed = select.kernel_for("fwd", 64, torch.float32, torch.device("cpu"), "none", False, False)
    assert fixed is None and [c.maxnreg for c in tuner.configs] == [None, 255]


def test_a_call_the_gpus_shared_memory_cannot_hold_raises_before_it_runs(monkeypatch):
    """flash_attention refuses, before the forward, a call whose default tiles (the
    backward's, when gradients will be needed) need more shared memory than the GPU has
    (devices.NEEDS): not a forward that runs and a backward that cannot launch. It runs
    when the forward's launch plan is built (a plan is the proof its call passed)."""
    seen = []
    monkeypatch.setattr(plans, "check_shared_memory", lambda q, bias, causal, grads: seen.append((causal, grads)))
    launcher.clear_plans()
    q, k, v = make_qkv(1, 1, 8, 8, 16, torch.float32, requires_grad=True)
    flash_attention(q, k, v, causal=True)
    with torch.no_grad():
        flash_attention_with_lse(q, k, v)
    assert seen == [(True, True), (False, False)]
    monkeypatch.undo()
    # On an RTX 4090 (compute capability 8.9), with a table entry for the key-padding dQ:
    monkeypatch.setattr(devices, "NEEDS", {("sm80", "dq", "32bit", 512, "keypad", False): 132_160})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    gpu_q = types.SimpleNamespace(device=torch.device("cuda"), shape=(1, 2, 16, 512), dtype=torch.float32)
    keypad = torch.zeros(1, 1, 1, 32)
    with pytest.raises(ValueError, match=r"backward \(dq\) at head dim 512 .* needs 132,160 B"):
        plans.check_shared_memory(gpu_q, keypad, False, True)
    plans.check_shared_memory(gpu_q, keypad, False, False)  # the forward alone fits
    plans.check_shared_memory(gpu_q, torch.zeros(16, 32), False, True)  # a full bias: not in the table
    # Every broadcast shape is judged as the launcher runs it (found on an H200: a scalar
    # bias raised "numel: integer multiplication overflow" here): a bias that does not
    # vary over the queries is a key bias, whatever its rank.
    for bias, variant in (
        (torch.tensor(0.5), "keypad"),
        (torch.zeros(32), "keypad"),
        (torch.zeros(2, 1, 32), "keypad"),
        (torch.zeros(1, 16, 1).expand(1, 16, 32), "full"),
        (torch.zeros(1, 16, 32)[:, :1].expand(1, 16, 32), "keypad"),
        (torch.zeros(16, 32), "full"),
    ):
        assert plans.bias_layout(bias, (1, 2, 16, 32))[-1] == variant
        if variant == "keypad":
            with pytest.raises(ValueError, match="needs 132,160 B"):
                plans.check_shared_memory(gpu_q, bias, False, True)
        else:
            plans.check_shared_memory(gpu_q, bias, False, True)


def test_every_list_builds_its_autotuner():
    """On a GPU with autotuning on (the default), a call whose list has more than one
    candidate runs through a triton.autotune wrapper: build each one, as a GPU would on
    first use (Triton checks its key against the kernel's arguments), with one candidate
    per entry of the list."""
    built = 0
    for arch in select.ARCHS:
        with launcher.override(interpret=False, arch=arch, autotune=True):
            for kernel in fk.KERNELS:
                for dtype in (torch.float16, torch.float32):
                    for band in tiles.CONFIGS[arch][kernel][select.width(dtype)]:  # no fp32 fwd_lo
                        for variant in ftc.VARIANTS:
                            for causal in (False, True):
                                for tma in (False, True):
                                    cands = select.configs_for(kernel, band, dtype, arch, variant, causal, tma)
                                    if len(cands) < 2:
                                        continue
                                    tuner, fixed = select.kernel_for(
                                        kernel, band, dtype, torch.device("cpu"), variant, causal, tma
                                    )
                                    assert fixed is None and len(tuner.configs) == len(cands)
                                    assert {"HEAD_DIM", "CAUSAL", "PRECISION"} <= set(tuner.keys)
                                    built += 1
    assert built > 100


def test_each_head_dim_is_tuned_over_its_own_candidates(monkeypatch):
    """Within a band, a tile may hold only for part of its head dims (its dims). The
    autotuner a call gets times exactly the candidates of its own head dim, whichever
    head dim of the band came first: a tuner made for head dim 40 must not serve 64 with
    40's list. (Today's tables give such head dims one candidate each, which needs no
    tuner; a band with two lists of several is set up here.)"""
    T = TileConfig
    low = (T(64, 64, 4, 3, dims=(1, 48)), T(32, 64, 4, 2, dims=(1, 48)))
    high = (T(128, 64, 8, 2, dims=(49, 64)), T(64, 32, 4, 2, dims=(49, 64)), T(32, 32, 4, 2, dims=(49, 64)))
    monkeypatch.setitem(tiles.CONFIGS["sm90"]["fwd"]["16bit"], 64, low + high)
    tuners = {}
    with launcher.override(interpret=False, arch="sm90", autotune=True):
        for d, want in ((40, low), (64, high), (48, low), (56, high)):
            tuner, fixed = select.kernel_for("fwd", d, torch.float16, torch.device("cpu"), "none", False, False)
            assert fixed is None
            assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in tuner.configs] == [
                (c.block_m, c.block_n, c.num_warps, c.num_stages) for c in want
            ], d
            tuners[d] = tuner
    # One tuner per list, shared by the head dims it serves.
    assert tuners[40] is tuners[48] and tuners[64] is tuners[56] and tuners[40] is not tuners[64]


# -- huge finite masks -------------------------------------------------------------------


F32_MIN = torch.finfo(torch.float32).min


# The interpreter computes with numpy, which warns where a huge bias times log2(e)
# overflows to -inf in a score whose weight is 0 anyway; a GPU does the same silently.
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize(
    "dt,value,shape",
    [
        ("fp16", F32_MIN, "full"),
        ("bf16", F32_MIN, "key"),
        ("fp32", F32_MIN, "full"),
        ("fp32", F32_MIN, "key"),
        ("fp16", -1e30, "key"),
        ("fp32", -1e9, "full"),
        ("bf16", -1e9, "key"),
    ],
)
def test_rows_masked_by_a_huge_finite_value_average_v(dt, value, shape, seed):
    """A row whose keys all carry the same huge finite bias (float32's min is a common
    "minus infinity") is an ordinary row to float64: its weights are those of the
    scores alone, which such a bias swamps in float32 (uniform: the mean of V) for
    -1e30 and float32's min. Multiplying the bias by log2(e) on its own overflowed to
    -inf and gave zeros. Only -inf masks give zeros."""
    B, H, M, N, D = 2, 2, 20, 37, 32
    q, k, v = make_qkv(B, H, M, N, D, DTYPES[dt])
    if shape == "full":
        bias = torch.randn(B, H, M, N)
        bias[:, :, 3] = value
        bias[:, 1, 7] = float("-inf")
        rows = (slice(None), slice(None), 3)
    else:
        bias = torch.zeros(B, 1, 1, N)
        bias[1] = value  # every row of batch item 1
        rows = (1,)
    out = flash_attention(q, k, v, bias)
    ref = reference_attention(q, k, v, bias)
    assert torch.isfinite(out).all()
    if value < -1e29:
        # float64 averages V there: the bias swamps the scores even in float64.
        mean_v = v.double().mean(2, keepdim=True).expand(B, H, M, D)
        assert rel_error(ref[rows], mean_v[rows]) < 1e-12
        err, tol = (
            rel_error(out[rows], ref[rows]),
            2.0 * rel_error(v.mean(2, keepdim=True).expand(B, H, M, D)[rows], mean_v[rows]) + EPSILON[q.dtype],
        )
        assert err <= tol, f"masked rows: relative error {err:.3e} > {tol:.3e}"
    else:
        # -1e9 leaves float64 the scores (softmax of q.k), float32 arithmetic a uniform
        # row: any float32 kernel gives the mean of V there, as plain torch in float32.
        fp32 = torch_math_attention(q.float(), k.float(), v.float(), bias)
        assert rel_error(out[rows], fp32[rows]) <= 2 * EPSILON[q.dtype]
    if shape == "full":
        assert torch.all(out[:, 1, 7] == 0)  # -inf rows still give zeros
    # Gradients stay finite and the scores' rows that float64 and float32 agree on match.
    for t in (q, k, v):
        t.requires_grad_()
    out = flash_attention(q, k, v, bias)
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_huge_finite_mask_gradients_match_float64(seed):
    """With float32's min the masked rows are uniform in float64 too; the gradients of
    such a bias, and of q, k, v, match the reference by the tolerance rule."""
    B, H, M, N = 1, 2, 24, 33
    q, k, v = make_qkv(B, H, M, N, 40, torch.float32)
    bias = torch.randn(B, H, M, N)
    bias[:, :, 5] = torch.finfo(torch.float32).min
    check(q, k, v, bias, bias_grad=True)


# -- scales ------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [-0.3, 0.0])
def test_negative_and_zero_scale(scale, seed):
    """The max is taken on unscaled scores, which needs scale >= 0: a negative scale
    runs as -q with -scale; a zero scale gives uniform rows, masks still applied."""
    q, k, v = make_qkv(1, 2, 30, 45, 40, torch.float32)
    check(q, k, v, scale=scale)
    check(q, k, v, make_bias("key_padding", 1, 2, 30, 45), scale=scale, causal=True, offset=2)


# -- determinism -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["none", "key_padding", "full"])
def test_rerun_is_bit_identical(kind, seed):
    q, k, v = make_qkv(1, 2, 45, 70, 40, torch.bfloat16, layout="bnhd", requires_grad=True)
    bias = make_bias(kind, 1, 2, 45, 70)
    do = torch.randn(q.shape, dtype=q.dtype)
    runs = []
    for _ in range(2):
        out = flash_attention(q, k, v, bias, causal=True, causal_offset=20)
        runs.append((out.detach().clone(), *torch.autograd.grad(out, (q, k, v), do)))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_head_dims_above_256_are_not_padded():
    """320 = 256 + 64 and 512 = 256 + 256: the pieces hold the head dim exactly. (That
    every call has a tile is test_every_call_has_a_tile.)"""
    assert math.isclose(limits.padding_waste(320), 0.0) and math.isclose(limits.padding_waste(512), 0.0)


# -- the launcher and Triton's autotuner ----------------------------------------------------


class _Compiled:
    """A stand-in for the kernel Triton compiles (which cannot run on the CPU): its
    launcher takes the kernel's arguments in their declared order, as Triton's does; it
    records them by name."""

    def __init__(self, jit, launches):
        self.src = types.SimpleNamespace(fn=jit)
        self.function = self.packed_metadata = None
        self.launches = launches

    def run(self, g0, g1, g2, stream, function, metadata, launch_metadata, enter, exit_, *values):
        self.launches.append(("compiled", (g0, g1, g2), dict(zip(self.src.fn.arg_names, values))))


def _on_a_gpu(cands: tuple, twin):
    """(settings, state): settings under which plans are built as on an sm_90 GPU with
    autotuning on, over the list cands (a candidates filter gives it to every call), so
    that a launch's first call goes through the autotuner select.kernel_for makes of
    it; and a stand-in for Triton's launch (launch_through) that runs that autotuner as
    `twin` (Triton's own autotuner over the same candidates, made by the test with
    select.tuner_of) and leaves twin's choice on it (best_config), as Triton's run of
    it would. A launch of the plain forward kernel goes to state.plain(fn, grid,
    kwargs); the autotuners launched are kept in state.tuners."""
    state = types.SimpleNamespace(tuners=[], plain=None)

    def through(fn, grid, kwargs):
        if fn is fk.KERNELS["fwd"]:
            return state.plain(fn, grid, kwargs)
        state.tuners.append(fn)
        compiled = twin[grid](**kwargs)
        fn.best_config = twin.best_config
        return compiled

    settings = launcher.override(
        interpret=False,
        arch="sm90",
        autotune=True,
        candidates=lambda kernel, found, tma: cands,
        launch_through=through,
    )
    return settings, state


def test_a_tuned_kernel_runs_the_tuners_choice_directly_once_it_has_chosen():
    """With autotuning on, the first call of a signature goes through Triton's autotuner;
    later calls launch the compiled kernel of its choice directly, every argument in its
    declared place (grid, block sizes, lengths, constexprs), with no pre-launch hook (the
    first of them checked against Triton's own launch of the same call); a call of
    another signature (a length, causality, head dim, dtype or bias dtype) goes back to
    the tuner first. The plans are built as on a GPU (_on_a_gpu), their tuner run as
    Triton's own autotuner (select.tuner_of), made to choose without timing (its pruning
    keeps one candidate); the kernel under it, which cannot run on the CPU, is a
    stand-in that returns a recording compiled kernel, and Triton's launch of the plain
    kernel is recorded, not run."""
    launches, hooked = [], []
    fwd = fk.KERNELS["fwd"]
    cands = (TileConfig(64, 64, 4, 3), TileConfig(32, 16, 8, 2))
    twin = select.tuner_of(
        "fwd", cands, prune_configs_by={"early_config_prune": lambda configs, nargs, **kw: configs[1:]}
    )

    class Kernel:
        arg_names = fwd.arg_names

        def run(self, *args, grid, warmup, **kw):
            launches.append(("tuner", grid(kw) if callable(grid) else grid, kw))
            return _Compiled(fwd, launches)

    twin.fn = Kernel()
    for config in twin.configs:  # record the pre-launch hook of the tile that runs
        real = config.pre_hook
        config.pre_hook = lambda nargs, _real=real: hooked.append(nargs["BLOCK_M"]) or _real(nargs)
    settings, gpu = _on_a_gpu(cands, twin)
    gpu.plain = lambda fn, grid, kwargs: launches.append(("triton", grid, kwargs)) or _Compiled(fn, launches)

    def call(dtype=torch.float16, m=100, causal=False, head_dim=64, bias_dtype=None):
        q = torch.randn(2, 3, m, head_dim, dtype=dtype)
        bias = None if bias_dtype is None else torch.zeros(2, 3, m, m, dtype=bias_dtype)
        plans.forward(q, q, q, bias, 0.125, False, causal_offset=0 if causal else None)

    with settings:
        call()
        call()
        # The second call: the direct launch, then Triton's launch of the same call that
        # checks it (its first direct launch).
        assert [x[0] for x in launches] == ["tuner", "compiled", "triton"]
        assert launches[0][1] == launches[1][1] == launches[2][1] == (4, 3, 2)  # cdiv(100 rows, 32), heads, batch
        direct, checked = launches[1][2], launches[2][2]
        assert (direct["BLOCK_M"], direct["BLOCK_N"], direct["RELOAD"]) == (32, 16, False)
        assert (direct["HEAD_DIM"], direct["M"], direct["N"], direct["H"]) == (64, 100, 100, 3)
        assert direct["sm_scale"] == 0.125 and direct["Q"].shape == (2, 3, 100, 64)
        # What a call without a bias or a residual does not read is passed as None (the
        # descriptors are there: 16-bit inputs on sm_90 stream through TMA).
        assert all(
            direct[n] is None
            for n in ("Bias", "Lens", "Plain", "LseShift", "OutLo", "stride_bb", "stride_bm", "stride_lb")
        )
        assert direct["TMA"] and direct["KD0"] is not None
        # Triton's launch that checks it is passed the same values by name.
        for name, value in direct.items():
            if name not in checked:
                continue  # an argument left at its default
            if isinstance(value, (torch.Tensor, TensorDescriptor)):
                assert checked[name] is value, name
            else:
                assert checked[name] == value, name
        assert hooked == [32]  # the tuner runs the tile's hook; a direct launch needs none
        for other in (
            dict(m=300),
            dict(causal=True),
            dict(head_dim=48),
            dict(dtype=torch.bfloat16),
            dict(bias_dtype=torch.float32),
        ):
            call(**other)
            call(**other)
            assert [x[0] for x in launches[-3:]] == ["tuner", "compiled", "triton"], other
        # Another length in a tuned length bucket (100 and 110 round up to 128) runs the
        # tuner's choice for the bucket without tuning again: through Triton's launch of
        # the plain kernel, with the tile chosen.
        seen, tuned = len(launches), len(gpu.tuners)
        call(m=110)
    assert [x[0] for x in launches[seen:]] == ["triton"] and len(gpu.tuners) == tuned
    _, grid, kwargs = launches[seen]
    assert grid == (4, 3, 2)  # cdiv(110, 32)
    assert (kwargs["BLOCK_M"], kwargs["BLOCK_N"], kwargs["num_warps"]) == (32, 16, 8)


def test_a_bucket_met_by_two_threads_at_once_is_tuned_once():
    """Two signatures of one length bucket (M = 100 and 110 round up to 128), first called
    at once from two threads: the second waits for the first's tuning and runs its
    choice; it is not tuned again over its exact lengths (which may choose otherwise)
    while the bucket keeps the first choice. (Plans built as on a GPU: _on_a_gpu.)"""
    import threading
    import time

    fwd = fk.KERNELS["fwd"]
    # A list of its own (not the previous test's): the tuner select.kernel_for makes of it
    # is this test's alone.
    cands = (TileConfig(64, 64, 4, 2), TileConfig(32, 16, 8, 3))
    # "Timing" that picks another tile for each exact length.
    twin = select.tuner_of(
        "fwd",
        cands,
        prune_configs_by={
            "early_config_prune": lambda configs, nargs, **kw: configs[:1] if kw["M"] == 100 else configs[1:]
        },
    )
    ran, tuned, started = {}, [], threading.Event()

    class Kernel:
        arg_names = fwd.arg_names

        def run(self, *args, grid, warmup, **kw):
            tuned.append(kw["M"])
            ran.setdefault(kw["M"], []).append(kw["BLOCK_M"])
            if kw["M"] == 100:
                started.set()
                time.sleep(0.3)  # the other thread meets the bucket meanwhile
            return _Compiled(fwd, [])

    def plain(fn, grid, kwargs):
        ran.setdefault(kwargs["M"], []).append(kwargs["BLOCK_M"])
        return _Compiled(fn, [])

    twin.fn = Kernel()
    settings, gpu = _on_a_gpu(cands, twin)
    gpu.plain = plain

    def call(m):
        q = torch.randn(1, 1, m, 64, dtype=torch.float16)
        plans.forward(q, q, q, None, 0.125, False)

    with settings:
        first = threading.Thread(target=call, args=(100,))
        first.start()
        assert started.wait(10)
        second = threading.Thread(target=call, args=(110,))
        second.start()
        first.join()
        second.join()
    assert tuned == [100] and ran == {100: [64], 110: [64]}
    (tuner,) = gpu.tuners
    assert [c.kwargs["BLOCK_M"] for c in tuner.attnkit_chosen.values()] == [64]


def test_a_direct_launch_passes_every_argument_in_its_place(seed):
    """The direct launch's argument list, run by the interpreted kernel itself (each value
    bound to the name at its place), gives the bits that Triton's own launch gives:
    forward and backward, with a key-padding mask, TMA descriptors (16-bit, sm_90) and
    causality, over three calls of each signature (the second direct, checked against
    Triton's own launch of the same call; the third direct alone)."""

    def interpreted(fn, grid, kwargs):
        fn[grid](**kwargs)
        compiled = _Compiled(fn, [])  # the interpreter launches the kernels themselves (no autotuner)

        def run(g0, g1, g2, stream, f, m, lm, e, x, *values):
            ran.append((fn.fn.__name__, compiled))
            fn[(g0, g1, g2)](**dict(zip(fn.arg_names, values)))

        compiled.run = run
        return compiled

    results, ran, tma = [], [], []
    for direct in (False, True):
        with launcher.override(launch_through=interpreted if direct else None), launcher.recording() as seen:
            torch.manual_seed(seed)
            q, k, v = make_qkv(2, 2, 37, 45, 40, torch.float16, layout="bnhd", requires_grad=True)
            bias = make_bias("key_padding", 2, 2, 37, 45, torch.float32)
            for _ in range(3):
                out = flash_attention(q, k, v, bias, causal=True, causal_offset=8)
                grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
                results.append((out, *grads))
        tma.append([x.description["tma"] for x in seen if x.kernel.startswith("fwd")])
        launcher.clear_plans()
    # The second and third calls: the forward, the backward's three passes, and a
    # key-lengths pass for each; every compiled kernel's direct launch checked, and agreed.
    once = ["_attn_bwd_delta", "_attn_bwd_dkdv", "_attn_bwd_dq", "_attn_fwd", "_key_lengths_kernel"]
    assert sorted(name for name, _ in ran) == sorted(2 * (once + ["_key_lengths_kernel"]))
    assert all(launcher.direct_checked(compiled) is True for _, compiled in ran)
    assert tma == [[True] * 3, [True] * 3]
    for later in results[1:]:  # Triton's later calls, then the direct path's three
        for x, y in zip(results[0], later):
            assert torch.equal(x, y)
    assert all(torch.isfinite(x).all() for r in results for x in r)


_READ_ALWAYS = {
    "_attn_fwd": {"Q", "K", "V", "Out", "Lse"},
    "_attn_bwd_delta": {"Out", "DO", "Delta"},
    "_attn_bwd_dkdv": {"Q", "K", "V", "DO", "Lse", "Delta", "DK", "DV"},
    "_attn_bwd_dq": {"Q", "K", "V", "DO", "Lse", "Delta", "DQ"},
}


@pytest.mark.parametrize("case", ["none", "keypad", "full", "full-grad", "fp16-tma"])
def test_a_launch_passes_only_what_its_kernel_reads(seed, case):
    """Arguments a launch does not read are passed as None, which Triton compiles as
    constants and its launcher does not pack (abi.absent_arguments): no bias, no key
    lengths, no row shift, no residual, no descriptors without TMA, no bias gradient
    for a kernel that does not write one. What a launch passes is what its kernel
    reads: its results match float64 (the kernels run, interpreted, with those Nones)."""
    passed = []

    def recorded(fn, grid, kwargs):
        fn[grid](**kwargs)
        passed.append(
            (
                fn.fn.__name__,
                {n for n, x in kwargs.items() if x is not None and not isinstance(x, (int, float, str, bool))},
            )
        )

    dtype = torch.float16 if case == "fp16-tma" else torch.float32
    grad = case in ("full-grad", "fp16-tma")
    q, k, v = make_qkv(2, 2, 37, 45, 40, dtype, requires_grad=grad)
    bias = None
    if case == "keypad":
        bias = make_bias("key_padding", 2, 2, 37, 45, torch.float32)
    elif case.startswith("full"):
        bias = torch.randn(2, 2, 37, 45, requires_grad=grad)
    with launcher.override(launch_through=recorded):
        out = flash_attention(q, k, v, bias)
        ref = reference_attention(q, k, v, bias)
        assert rel_error(out, ref) < 2 * max(rel_error(torch_math_attention(q, k, v, bias), ref), EPSILON[dtype])
        if grad:
            torch.autograd.grad(out, (q, k, v) + ((bias,) if bias is not None else ()), torch.randn_like(out))
    extra = {
        "none": set(),
        "keypad": {"Bias", "Lens", "Plain", "LseShift"},
        "full": {"Bias", "LseShift"},
        "full-grad": {"Bias", "LseShift"},
        "fp16-tma": {"KD0", "KD1", "VD0", "VD1"},
    }[case]
    for name, tensors in passed:
        if name not in _READ_ALWAYS:
            continue  # the key lengths' own kernel
        want = set(_READ_ALWAYS[name])
        if name != "_attn_bwd_delta":
            want |= extra
        if case == "fp16-tma" and name == "_attn_bwd_dkdv":
            want |= {"QD0", "QD1", "DOD0", "DOD1"}
        if case == "fp16-tma" and name == "_attn_bwd_dq":
            want -= {"QD0", "QD1"}
        if grad and dtype != torch.float32 and name in ("_attn_fwd", "_attn_bwd_delta"):
            want.add("OutLo")  # a 16-bit training forward keeps its rounding residual
        if case == "full-grad" and name == "_attn_bwd_dq":
            want.add("DBias")  # dS whole, from the dQ pass; the dK/dV pass writes none
        assert tensors == want, (name, tensors ^ want)
    assert {n for n, _ in passed} >= (
        {"_attn_fwd", "_attn_bwd_delta", "_attn_bwd_dkdv", "_attn_bwd_dq"} if grad else {"_attn_fwd"}
    )


def test_the_shared_memory_check_looks_up_the_variant_the_launcher_runs(seed):
    """flash_attention's up-front shared-memory check (which runs only on a GPU) reads the
    bias variant from the bias's shape and strides (bias_form, through table_variant);
    it must be the variant bias_layout gives the kernels, one query row and expanded
    views included."""
    B, H, N = 2, 3, 7
    for M in (1, 5):
        q = torch.empty(B, H, M, 8)
        biases = [
            torch.randn(B, 1, 1, N),
            torch.randn(1, H, 1, N),
            torch.randn(N),
            torch.randn(M, N),
            torch.randn(B, H, M, N),
            torch.randn(B, 1, M, N),
            torch.randn(B, H, 1, N).expand(B, H, M, N),
            torch.randn(B, H, 1, 1),
            torch.randn(B, H, N, M).transpose(-1, -2),
        ]
        for bias in biases:
            launched = plans.bias_layout(bias, (B, H, M, N))[-1]
            assert plans.table_variant(q, bias) == launched, (M, tuple(bias.shape), bias.stride())
    assert plans.table_variant(q, None) == "none"


def test_plans_built_by_racing_threads_launch_what_one_thread_does(seed):
    """Threads that meet the same call signatures at once (a pipeline served from a
    thread pool) build and settle plans concurrently: every direct launch gets the grid
    and the arguments (all but the tensors) that one thread alone gets. The launches are
    recorded, not run (Triton's interpreter is not thread-safe itself)."""
    import threading

    launches, lock = [], threading.Lock()

    def recorded(fn, grid, kwargs):
        compiled = _Compiled(fn, [])

        def run(g0, g1, g2, stream, f, m, lm, e, x, *values):
            args = dict(zip(fn.arg_names, values))
            fixed = tuple(
                sorted((n, v) for n, v in args.items() if not isinstance(v, (torch.Tensor, TensorDescriptor)))
            )
            with lock:
                launches.append((fn.fn.__name__, (g0, g1, g2), fixed))

        compiled.run = run
        return compiled

    cases = []
    for m, n, d, dt in ((20, 30, 40, torch.float16), (33, 47, 64, torch.float32), (20, 30, 40, torch.bfloat16)):
        q, k, v = make_qkv(1, 2, m, n, d, dt)
        cases.append((q, k, v, make_bias("key_padding", 1, 2, m, n, torch.float32)))

    def run(case):
        for _ in range(20):
            flash_attention(*case)

    with launcher.override(launch_through=recorded):
        for case in cases:
            run(case)
        alone = set(launches)
        launches.clear()
        launcher.clear_plans()
        threads = [threading.Thread(target=run, args=(case,)) for case in cases for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(launches) > len(cases) * 3 * 19 and set(launches) == alone


def test_a_call_plan_is_the_proof_of_its_checks():
    """An eager call is checked once per signature: its call plan (keyed by the inputs as
    given, the bias before its float32 conversion) exists only for a call that passed
    the checks, so a refused call is refused every time and leaves no plan; a bool
    mask's call plan then serves its converted copy's launch plan, and the answer is
    the same every call."""
    launcher.clear_plans()
    q, k, v = make_qkv(1, 2, 8, 8, 16, torch.float16)
    bad = torch.ones(1, 2, 8, 7, dtype=torch.bool)  # 7 keys for 8
    for _ in range(2):
        with pytest.raises(ValueError, match="not broadcastable"):
            flash_attention(q, k, v, bad)
        with pytest.raises(ValueError, match="must be finite"):
            flash_attention(q, k, v, scale=float("nan"))
    assert launcher.plan_count() == 0
    mask = torch.rand(1, 1, 1, 8) > 0.3
    mask[..., 0] = True
    with torch.no_grad():
        first = flash_attention(q, k, v, mask)
        built = launcher.plan_count()
        again = flash_attention(q, k, v, mask)
    assert built == 2 and launcher.plan_count() == 2, "the call's plan and its forward's, built once"
    assert torch.equal(first, again)
    assert_close_to_reference(first, q, k, v, additive(mask, torch.float32))
