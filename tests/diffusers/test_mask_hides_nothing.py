"""A mask that hides nothing (boolean all True, additive all zero: a text mask at full
length) is dropped on every route, so auto() may choose a mask-free kernel: read once per
mask object (one host sync), seen again after an in-place change, and never dropped where
that could change an answer (a mask that needs a gradient, an inference tensor)."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn
from diffusers.models.attention_processor import Attention, AttnProcessor2_0
from torch.utils._python_dispatch import TorchDispatchMode

import attnkit
from attnkit.diffusers import backend as diffusers_backend
from attnkit.diffusers.adapters import sdpa_call
from attnkit.masks import hides_nothing
from attnkit.testing import assert_close_to_reference
from tests._masks import additive


class _HostReads(TorchDispatchMode):
    """Counts the host syncs (a tensor read as a Python number) inside the block."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        return func(*args, **(kwargs or {}))


def test_a_mask_is_read_once_and_again_after_an_in_place_change():
    keep = torch.ones(2, 77, dtype=torch.bool)
    with _HostReads() as seen:
        assert hides_nothing(keep) and hides_nothing(keep) and hides_nothing(keep)
    assert seen.reads == 1, "one host sync per mask object, not per call"
    keep[1, 70:] = False  # in place: its version moves
    assert not hides_nothing(keep)
    zeros = torch.zeros(2, 1, 1, 77)
    assert hides_nothing(zeros) and hides_nothing(-zeros)  # -0.0 is zero too
    zeros[0, 0, 0, 5] = -10000.0
    assert not hides_nothing(zeros)
    # Never dropped: a mask whose gradient is owed, an inference tensor (no version
    # counter: an in-place change could not be seen), a dtype the conversion refuses.
    assert not hides_nothing(torch.zeros(2, 77, requires_grad=True))
    with torch.inference_mode():
        assert not hides_nothing(torch.ones(2, 77, dtype=torch.bool))
    assert not hides_nothing(torch.ones(2, 77, dtype=torch.int64))


def _attention():
    return Attention(query_dim=32, cross_attention_dim=24, heads=2, dim_head=16)


def test_the_processor_route_drops_it_and_keeps_a_mask_that_hides_something(seed):
    attn = _attention()
    stock = _attention()
    stock.load_state_dict(attn.state_dict())
    stock.set_processor(AttnProcessor2_0())
    proc = attnkit.auto()
    attn.set_processor(proc)
    x, ctx = torch.randn(2, 9, 32), torch.randn(2, 13, 24)
    keep = torch.ones(2, 13, dtype=torch.bool)
    with torch.no_grad():
        out = attn(x, ctx, attention_mask=keep)
        assert {r.call.mask for r in proc.decisions} == {"none"}
        torch.testing.assert_close(out, stock(x, ctx))
        keep[0, 9:] = False  # the same tensor, now padding four keys of the first prompt
        out = attn(x, ctx, attention_mask=keep)
        assert "none" in {r.call.mask for r in proc.decisions} and len(proc.decisions) == 2
        torch.testing.assert_close(out, stock(x, ctx, attention_mask=keep))
        # an additive mask of zeros, as diffusers' UNet makes of a full-length text mask
        zeros = (1 - torch.ones(2, 1, 13)) * -10000.0
        torch.testing.assert_close(attn(x, ctx, attention_mask=zeros), stock(x, ctx))


def test_the_dispatch_route_drops_it_and_its_served_call_never_drops_another(seed):
    proc = attnkit.auto()  # held: the registry holds its chooser weakly
    name = AttentionBackendName(diffusers_backend.member_for(proc).value)
    b, m, n, h, d = 2, 6, 11, 2, 16
    q, k, v = (torch.randn(b, s, h, d) for s in (m, n, n))
    keep = torch.ones(b, n, dtype=torch.bool)
    native = AttentionBackendName.NATIVE
    with torch.no_grad():
        for _ in range(3):  # the first call is served the whole way, the next ones by its served call
            out = dispatch_attention_fn(q, k, v, attn_mask=keep, backend=name)
            torch.testing.assert_close(out, dispatch_attention_fn(q, k, v, backend=native))
        assert {r.call.mask for r in proc.decisions} == {"none"}
        # Another mask of the same shape that hides keys: not the dropped mask's served call.
        other = torch.ones(b, n, dtype=torch.bool)
        other[1, 7:] = False
        for mask in (other, keep, other):
            out = dispatch_attention_fn(q, k, v, attn_mask=mask, backend=name)
            torch.testing.assert_close(out, dispatch_attention_fn(q, k, v, attn_mask=mask, backend=native))
        keep[0, 5:] = False  # in place
        out = dispatch_attention_fn(q, k, v, attn_mask=keep, backend=name)
        torch.testing.assert_close(out, dispatch_attention_fn(q, k, v, attn_mask=keep, backend=native))
        assert len({r.call.mask for r in proc.decisions}) == 2
    # A mask of a shape that does not broadcast is refused, whatever it hides.
    with pytest.raises(ValueError, match="does not broadcast"):
        dispatch_attention_fn(q, k, v, attn_mask=torch.ones(b, 1, 1, n + 1, dtype=torch.bool), backend=name)


class _Recording:
    """A chooser (the protocol alone) that records the bias it is given."""

    def __init__(self):
        self.biases = []

    def attention(self, who, q, k, v, bias, scale, upcast, **kwargs):
        self.biases.append(bias)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)


def test_the_sdpa_route_drops_it(seed):
    chooser = _Recording()
    q, k, v = torch.randn(2, 3, 5, 16), torch.randn(2, 3, 7, 16), torch.randn(2, 3, 7, 16)
    keep = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    out = sdpa_call(chooser, q, k, v, keep, 0.0, False, None, False)
    assert chooser.biases == [None]
    assert_close_to_reference(out, q, k, v)
    keep[1, 0, 2, 3:] = False
    out = sdpa_call(chooser, q, k, v, keep, 0.0, False, None, False)
    assert chooser.biases[-1] is not None
    assert_close_to_reference(out, q, k, v, additive(keep, torch.float32))


def test_the_dispatch_route_drops_a_block_mask_that_hides_nothing(seed):
    """A BlockMask that shows every key whole is dropped, so auto() chooses as for no
    mask; one that hides a block is computed under its meaning."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    proc = attnkit.auto()
    name = AttentionBackendName(diffusers_backend.member_for(proc).value)
    b, m, n, h, d = 1, 64, 64, 2, 16
    q, k, v = (torch.randn(b, s, h, d) for s in (m, n, n))
    everything = flex.create_block_mask(lambda bi, hi, qi, ki: qi >= 0, b, 1, m, n, device="cpu", BLOCK_SIZE=32)
    with torch.no_grad():
        out = dispatch_attention_fn(q, k, v, attn_mask=everything, backend=name)
    assert {r.call.mask for r in proc.decisions} == {"none"}
    torch.testing.assert_close(out, dispatch_attention_fn(q, k, v, backend=AttentionBackendName.NATIVE))
    blocks = torch.tensor([[[[0, 1]]]], dtype=torch.int32).expand(1, 1, 2, 2).contiguous()
    first_keys = flex.BlockMask.from_kv_blocks(
        torch.ones(1, 1, 2, dtype=torch.int32), blocks, BLOCK_SIZE=32, seq_lengths=(m, n)
    )  # each query block sees key block 0 only
    with torch.no_grad():
        out = dispatch_attention_fn(q, k, v, attn_mask=first_keys, backend=name)
    bias = torch.zeros(m, n, dtype=torch.float64)
    bias[:, 32:] = float("-inf")
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    assert_close_to_reference(out.transpose(1, 2), qt, kt, vt, bias)


@pytest.mark.parametrize("kind", ["key_padding", "key_padding_bool", "fewkeys"])
def test_the_test_suites_padding_masks_always_hide_a_key(kind):
    """Tests that draw a key-padding mask expect a masked call: a draw that padded nothing
    (both lengths at N, 1 in 36 for two items of 6 keys) would be dropped as hiding nothing
    and change the route a test asserts on."""
    from attnkit.testing import make_bias

    for n in (2, 3, 6):
        for draw in range(40):
            g = torch.Generator().manual_seed(draw)
            mask = make_bias(kind, 2, 1, 1, n, torch.float32, generator=g)
            assert not hides_nothing(mask), (kind, n, draw)
