"""bias_form(): the one decision of how the kernels read a bias ("none", "keypad", "full",
"full16", converted to float32 or not, compact or not), from metadata alone. The same
answers on real, meta and fake tensors; the call-level variants (variants_of_call, what the
backend's refusals and the device table read) cover every form a call's bias can take."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from attnkit.backends import mask_kind
from attnkit.kernels.bias_form import BIAS_16BIT_ALIGN, FULL, FULL16, KEYPAD, NONE, bias_form, variants_of_call

B, H, N = 2, 3, 8
ROWS = 128  # a tile's rows, as the launcher passes its largest


def form(bias, M=5, q_dtype=torch.float16, needs_grad=False, n=N):
    return bias_form(bias, (B, H, M, n), q_dtype=q_dtype, needs_grad=needs_grad, max_tile_rows=ROWS)


def _query_independent(M, dtype):
    return [
        torch.randn(B, 1, 1, N).to(dtype),
        torch.randn(1, H, 1, N).to(dtype),
        torch.randn(B, H, 1, N).to(dtype),
        torch.randn(N).to(dtype),
        torch.randn(1, N).to(dtype),
        torch.randn(B, H, 1, N).to(dtype).expand(B, H, M, N),
        torch.randn(B, H, 1, 1).to(dtype),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.bool])
def test_a_bias_that_does_not_depend_on_the_query_is_keypad_whatever_its_shape(dtype):
    for bias in _query_independent(5, dtype):
        f = form(bias)
        assert f.variant == KEYPAD and f.table_variant == KEYPAD, tuple(bias.shape)
        assert f.to_float32 == (dtype != torch.float32) and not f.compact
        assert f.strides[2] == 0


def test_one_query_row_keeps_its_stride_and_is_full():
    for bias in _query_independent(1, torch.float32)[:5]:
        assert form(bias, M=1).variant == FULL, tuple(bias.shape)


def test_no_bias():
    f = form(None)
    assert (f.variant, f.to_float32, f.compact, f.strides) == (NONE, False, False, (0, 0, 0, 0))


@pytest.mark.parametrize("shape", [(B, H, 5, N), (1, H, 5, N), (B, 1, 5, N), (5, N)])
def test_a_16_bit_full_bias_is_read_as_it_is_only_where_every_condition_holds(shape):
    bias = torch.randn(shape, dtype=torch.float16)
    f = form(bias)
    assert (f.variant, f.to_float32, f.table_variant) == (FULL16, False, FULL)
    # A backward follows (it reads float32), another dtype than q's, or q in float32.
    assert form(bias, needs_grad=True).variant == FULL and form(bias, needs_grad=True).to_float32
    assert form(bias, q_dtype=torch.bfloat16).variant == FULL
    assert form(bias.float(), q_dtype=torch.float32).variant == FULL and not form(bias.float()).to_float32
    assert form(bias.to(torch.bool)).variant == FULL and form(bias.to(torch.bool)).to_float32
    # Its last dim not contiguous.
    assert form(bias.transpose(-1, -2).contiguous().transpose(-1, -2)).variant == FULL


def test_a_16_bit_bias_with_an_odd_stride_or_address_is_converted():
    odd = torch.randn(B, H, 5, N + 1, dtype=torch.float16)[..., :N]  # row stride N + 1, odd
    assert odd.stride(2) % BIAS_16BIT_ALIGN and form(odd).variant == FULL and form(odd).to_float32
    flat = torch.randn(2 + B * H * 5 * N, dtype=torch.float16)
    shifted = flat[1:-1].view(B, H, 5, N)  # strides even, address odd in elements
    assert shifted.data_ptr() % 4 and form(shifted).variant == FULL
    assert form(flat[2:].view(B, H, 5, N)).variant == FULL16


def test_a_bias_whose_tile_would_span_2_to_the_31_elements_is_compact_and_never_read_as_it_is():
    big = torch.empty_strided((1, 1, 5, N), (0, 0, 2**27, 1), dtype=torch.float16, device="meta")
    f = form(big)
    assert f.compact and f.variant == FULL and f.to_float32
    assert f.strides == (0, 0, N, 1)  # of the compact copy, expanded
    small = torch.empty_strided((1, 1, 5, N), (0, 0, 2**20, 1), dtype=torch.float32, device="meta")
    assert not form(small).compact


def test_meta_and_fake_tensors_get_the_real_tensors_answers():
    cases = [*_query_independent(5, torch.float16), torch.randn(B, H, 5, N, dtype=torch.float16)]
    cases.append(torch.randn(B, H, 5, N + 1, dtype=torch.float16)[..., :N])
    for bias in cases:
        want = form(bias)
        meta = torch.empty_strided(bias.shape, bias.stride(), dtype=bias.dtype, device="meta")
        assert form(meta) == want, tuple(bias.shape)
        with FakeTensorMode() as mode:
            fake = mode.from_tensor(bias)
            assert form(fake) == want, tuple(bias.shape)


@pytest.mark.parametrize("M", [1, 5])
def test_the_call_level_variants_cover_every_form_a_calls_bias_takes(M):
    """What the backend's refusals and the device table read from a call's mask kind
    (attnkit.backends.mask_kind) covers what bias_form() gives its tensors."""
    biases = [*_query_independent(M, torch.float32), torch.randn(B, H, M, N), torch.randn(M, N)]
    biases.append(torch.randn(B, H, N, M).transpose(-1, -2))
    for bias in biases:
        for dtype in (torch.float32, torch.float16):
            got = form(bias.to(dtype), M=M).table_variant
            assert got in variants_of_call(mask_kind(bias), M), (M, tuple(bias.shape), got)
    assert variants_of_call("none", M) == (NONE,) == (form(None, M=M).table_variant,)
