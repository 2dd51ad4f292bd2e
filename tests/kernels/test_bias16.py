"""A full bias in the inputs' 16-bit dtype, read by the inference forward as it is.

Converting a (B, H, M, N) fp16 bias to float32 reads and writes more memory than the
attention itself (0.34x SDPA's speed on an H100 at 2 x 8 x 4096^2). Where the call
needs no gradient and the bias's layout allows it (attnkit/kernels/bias_form.py), the
forward runs the kernels' "full16" variant: its own tiles and static-report rows, the
bias pointer in its own dtype, BIAS_ALIGN = bias_form.BIAS_16BIT_ALIGN. Every other bias
is converted to float32 first, as before. In the interpreter, as on a GPU, the kernel
widens each bias tile to float32 after loading it: the same values as the converted
bias, so the two paths give the same bits with the same tile.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from attnkit import testing
from attnkit.testing import assert_close_to_reference
from tests._masks import causal_bias

triton = pytest.importorskip("triton")

from attnkit.kernels import flash_attention, flash_attention_with_lse  # noqa: E402

fk = importlib.import_module("attnkit.kernels.flash.kernels")
fl = importlib.import_module("attnkit.kernels.flash.launch")
fo = importlib.import_module("attnkit.kernels.flash.ops")
select = importlib.import_module("attnkit.kernels.flash.select")
launcher = importlib.import_module("attnkit.kernels.launcher")
BIAS_16BIT_ALIGN = importlib.import_module("attnkit.kernels.bias_form").BIAS_16BIT_ALIGN

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def poison():
    """Every buffer a kernel writes starts as NaN: an unwritten element fails the test."""
    with launcher.override(poison_outputs=True):
        yield


class _Seen:
    """What each attention launch got since the last clear(): (kernel, Bias dtype, BIAS,
    BIAS_ALIGN), read from the launches launcher.recording() saw."""

    def __init__(self, launches: list):
        self.launches = launches

    def _rows(self) -> list:
        return [
            (x.kernel, x.arguments["Bias"].dtype, x.arguments["BIAS"], x.arguments["BIAS_ALIGN"])
            for x in self.launches
            if x.kernel not in ("delta", "lengths")
        ]

    def __eq__(self, other) -> bool:
        return self._rows() == list(other)

    def __iter__(self):
        return iter(self._rows())

    def __getitem__(self, i):
        return self._rows()[i]

    def __len__(self) -> int:
        return len(self._rows())

    def __repr__(self) -> str:
        return repr(self._rows())

    def clear(self) -> None:
        self.launches.clear()


@pytest.fixture
def seen():
    with launcher.recording() as launches:
        yield _Seen(launches)


def _qkv(dt, B=2, H=2, M=33, N=48, D=64, requires_grad=False):
    return testing.make_qkv(B, H, M, N, D, dt, device=DEVICE, requires_grad=requires_grad)


# (bias shape as (B|1, H|1, M, N) dims or a 2-D (M, N), layout of q)
SHAPES = {"full": (2, 2, 33, 48), "perhead": (1, 2, 33, 48), "perbatch": (2, 1, 33, 48), "2d": (33, 48)}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_16_bit_full_bias_is_read_as_it_is_and_gives_the_converted_bias_bits(dtype, shape, seen, seed):
    dt = DTYPES[dtype]
    q, k, v = _qkv(dt)
    bias = torch.randn(SHAPES[shape], dtype=dt, device=DEVICE) * 2
    bias[..., 5] = float("-inf")  # a masked key in every row
    out = flash_attention(q, k, v, bias)
    assert seen == [("fwd", dt, fk.FULL_BIAS, BIAS_16BIT_ALIGN)]
    seen.clear()
    converted = flash_attention(q, k, v, bias.float())
    assert seen[0][1] == torch.float32
    assert torch.equal(out, converted), "the 16-bit bias read as it is must give the converted bias's bits"
    assert not out.isnan().any()
    assert_close_to_reference(out, q, k, v, bias)


def test_the_lse_of_a_16_bit_bias_read_as_it_is(seen, seed):
    q, k, v = _qkv(torch.float16, M=40, N=70)
    bias = torch.randn(2, 2, 40, 70, dtype=torch.float16, device=DEVICE)
    with torch.no_grad():
        out, lse = flash_attention_with_lse(q, k, v, bias)
        out32, lse32 = flash_attention_with_lse(q, k, v, bias.float())
    assert seen[0][1] == torch.float16 and seen[1][1] == torch.float32
    assert torch.equal(out, out32) and torch.equal(lse, lse32)
    ref = torch.logsumexp(q.double() @ k.double().transpose(-1, -2) * 64**-0.5 + bias.double(), -1)
    assert (lse.double() - ref).abs().max() < 1e-4


def _offset_by_one(dt):
    base = torch.randn(2 * 2 * 33 * 48 + 1, dtype=dt, device=DEVICE)
    return base[1:].view(2, 2, 33, 48)  # every stride even, the address 2 bytes off


CONVERTED = {
    # an odd row stride (N = 47): a tile row starts 2 bytes off a 4-byte boundary
    "odd_row_stride": lambda dt: (dict(N=47), torch.randn(2, 2, 33, 47, dtype=dt, device=DEVICE)),
    "misaligned_address": lambda dt: (dict(), _offset_by_one(dt)),
    "keys_not_contiguous": lambda dt: (dict(), torch.randn(2, 2, 48, 33, dtype=dt, device=DEVICE).transpose(-1, -2)),
    "other_16_bit_dtype": lambda dt: (
        dict(),
        torch.randn(2, 2, 33, 48, device=DEVICE).to(torch.bfloat16 if dt == torch.float16 else torch.float16),
    ),
    "key_bias": lambda dt: (dict(), torch.randn(2, 1, 1, 48, dtype=dt, device=DEVICE)),
}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("why", list(CONVERTED))
def test_a_16_bit_bias_the_kernels_cannot_read_as_it_is_is_converted(dtype, why, seen, seed):
    dt = DTYPES[dtype]
    kw, bias = CONVERTED[why](dt)
    q, k, v = _qkv(dt, **kw)
    out = flash_attention(q, k, v, bias)
    assert [(kernel, b) for kernel, b, _, _ in seen] == [("fwd", torch.float32)], seen
    assert_close_to_reference(out, q, k, v, bias)


def test_a_call_that_needs_gradients_converts_it(seen, seed):
    """The backward kernels read a float32 bias (no 16-bit rows in the static report),
    so a call autograd will differentiate converts it once, for both passes."""
    q, k, v = _qkv(torch.float16, requires_grad=True)
    bias = torch.randn(2, 2, 33, 48, dtype=torch.float16, device=DEVICE)
    out = flash_attention(q, k, v, bias)
    out.backward(torch.randn_like(out))
    assert {kernel.split("_")[0] for kernel, _, _, _ in seen} == {"fwd", "dkdv", "dq"}
    assert all(b == torch.float32 for _, b, _, _ in seen), seen
    seen.clear()
    with torch.no_grad():
        flash_attention(q, k, v, bias)
    assert [b for _, b, _, _ in seen] == [torch.float16]


def test_the_launcher_refuses_a_16_bit_bias_it_cannot_read(seed):
    """launch.forward is reached through ops, which converts such a bias; called
    directly with one, it says so instead of running with a false alignment hint."""
    q, k, v = _qkv(torch.float16, N=47)
    bias = torch.randn(2, 2, 33, 47, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="cannot be read as it is: convert it to float32"):
        fl.forward(q, k, v, bias, 0.125, False)


@pytest.mark.parametrize("arch,d", [("sm90", 128), ("sm90", 80), ("sm80", 160), ("sm80", 64)])
def test_the_shipped_full16_tiles_run(arch, d, seed):
    """The default tile each target ships for the full16 variant (its own list: on sm_90
    at head dim 128 the float32 bias's M128-N128 spills with a 16-bit bias), run in the
    interpreter, causal too, against float64."""
    M, N = 150, 140
    q, k, v = testing.make_qkv(1, 2, M, N, d, torch.float16, layout="bnhd", device=DEVICE)
    bias = torch.randn(1, 2, M, N, dtype=torch.float16, device=DEVICE)
    for causal in (False, True):
        with launcher.override(shipped_tiles=True, arch=arch), launcher.recording() as launches:
            out = flash_attention(q, k, v, bias, causal=causal, causal_offset=N - M if causal else 0)
        tma = arch == "sm90"
        c = select.configs_for("fwd", d, torch.float16, arch, "full16", causal, tma)[0]
        ran = [(x.kernel, x.description["variant"], x.description["tile"]) for x in launches]
        assert ran == [("fwd", "full16", (c.block_m, c.block_n, c.num_warps, c.num_stages, c.reload))]
        full = bias.float() + causal_bias(M, N, N - M).to(DEVICE) if causal else bias
        assert_close_to_reference(out, q, k, v, full)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "misaligned"])
def test_torch_compile_reads_it_as_eager_does(aligned, backend, seen, seed):
    """Traced, the bias has no address: ops.prepare decides on its layout, and the op's
    body, which gets the real tensor, converts one whose address is not aligned."""
    torch._dynamo.reset()
    q, k, v = _qkv(torch.float16)
    bias = torch.randn(2, 2, 33, 48, dtype=torch.float16, device=DEVICE) if aligned else _offset_by_one(torch.float16)
    fn = torch.compile(lambda q, k, v, b: flash_attention(q, k, v, b), backend=backend, fullgraph=True)
    with torch.no_grad():
        got = fn(q, k, v, bias)
        compiled = list(seen)
        seen.clear()
        want = flash_attention(q, k, v, bias)
    assert [b for _, b, _, _ in compiled] == [torch.float16 if aligned else torch.float32]
    assert [b for _, b, _, _ in seen] == [b for _, b, _, _ in compiled]
    assert torch.equal(got, want)
    assert_close_to_reference(got, q, k, v, bias)


def test_the_raw_forward_op_converts_a_16_bit_bias_when_a_backward_will_follow(seed):
    """torch.ops.attnkit.flash_attention_forward with store_lo (a backward will read
    float32): no full16 tile serves the forward with its residual, so the op's body
    converts the bias, whoever called it."""
    q, k, v = _qkv(torch.float16)
    bias = torch.randn(2, 2, 33, 48, dtype=torch.float16, device=DEVICE)
    out, lse, shift, lo = torch.ops.attnkit.flash_attention_forward(q, k, v, bias, 0.125, False, True, None)
    assert lo.shape == q.shape and not out.isnan().any()
    assert_close_to_reference(out, q, k, v, bias, scale=0.125)
