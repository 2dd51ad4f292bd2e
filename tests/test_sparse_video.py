"""attnkit.sparse_video: the sliding-tile and radial BlockMasks against brute-force
references of their rules, attention under them against float64 masked attention, and
auto(lossy=mask)'s quality guard (attnkit/choose/guard.py), which falls back by itself."""

from __future__ import annotations

import itertools
import logging
import math
from fractions import Fraction

import pytest
import torch

import attnkit
from attnkit import sparse_video as sv
from attnkit.block_masks import block_mask_attention
from attnkit.choose.auto import AutoChooser


# -- brute-force references: plain Python over token coordinates ---------------------------
def _coords(i, height, width):
    f, rest = divmod(i, height * width)
    return (f, *divmod(rest, width))


def _sta_reference(frames, height, width, tile, window, text):
    video = frames * height * width
    n = video + text
    grid = [math.ceil(s / t) for s, t in zip((frames, height, width), tile)]

    def tiles_seen(qt, w, count):  # the window's first tile, kept inside the grid
        if w >= count:
            return range(count)
        lo = min(max(qt - w // 2, 0), count - w)
        return range(lo, lo + w)

    out = torch.zeros(n, n, dtype=torch.bool)
    for i, j in itertools.product(range(n), range(n)):
        if i >= video or j >= video:
            out[i, j] = True
            continue
        qc, kc = _coords(i, height, width), _coords(j, height, width)
        out[i, j] = all(kc[a] // tile[a] in tiles_seen(qc[a] // tile[a], window[a], grid[a]) for a in range(3))
    return out


def _radial_reference(frames, height, width, window, text):
    hw = height * width
    video = frames * hw
    n = video + text
    out = torch.zeros(n, n, dtype=torch.bool)
    for i, j in itertools.product(range(n), range(n)):
        if i >= video or j >= video:
            out[i, j] = True
            continue
        d = abs(i // hw - j // hw)
        dp = abs(i % hw - j % hw)
        if d == 0:
            out[i, j] = True
            continue
        r = 0
        while 2 ** (r + 1) <= d:
            r += 1
        width_r = Fraction(window, 2**r)
        if width_r >= 1:
            out[i, j] = dp < width_r
        else:
            out[i, j] = dp == 0 and d % math.ceil(Fraction(2**r, window)) == 0
    return out


def _block_states(bm):
    """(query blocks, key blocks): 0 hidden, 1 partial, 2 full."""
    n_qb = bm.kv_num_blocks.shape[-1]
    n_kb = math.ceil(bm.seq_lengths[1] / bm.BLOCK_SIZE[1])
    states = torch.zeros(n_qb, n_kb, dtype=torch.long)
    for num, idx, value in ((bm.kv_num_blocks, bm.kv_indices, 1), (bm.full_kv_num_blocks, bm.full_kv_indices, 2)):
        for i in range(n_qb):
            for j in idx[0, 0, i, : int(num[0, 0, i])].tolist():
                assert states[i, j] == 0, "a key block listed twice"
                states[i, j] = value
    return states


def _element_mask(bm):
    """What the BlockMask shows: full blocks whole, partial ones through its mask_mod."""
    m, n = bm.seq_lengths
    qb, kb = bm.BLOCK_SIZE
    states = _block_states(bm)
    per = states.repeat_interleave(qb, 0).repeat_interleave(kb, 1)[:m, :n]
    idx_q, idx_k = torch.arange(m)[:, None], torch.arange(n)[None, :]
    return (per == 2) | ((per == 1) & bm.mask_mod(None, None, idx_q, idx_k))


def _assert_tight(bm, reference):
    """Every full block is all shown, every hidden one all hidden, every partial one mixed."""
    qb, kb = bm.BLOCK_SIZE
    states = _block_states(bm)
    for i, j in itertools.product(range(states.shape[0]), range(states.shape[1])):
        part = reference[i * qb : (i + 1) * qb, j * kb : (j + 1) * kb]
        expected = 2 if bool(part.all()) else (0 if not bool(part.any()) else 1)
        assert int(states[i, j]) == expected, (i, j)


LAYOUTS = [(1, 3, 5, 0), (3, 4, 6, 0), (4, 5, 3, 7), (6, 2, 7, 3)]


@pytest.mark.parametrize("frames,height,width,text", LAYOUTS)
@pytest.mark.parametrize("tile,window", [((1, 2, 2), (3, 3, 3)), ((2, 3, 2), (1, 3, 1)), ((1, 1, 4), (3, 1, 5))])
@pytest.mark.parametrize("block", [16, (8, 24), 13])
def test_sliding_tile_is_its_rule(frames, height, width, text, tile, window, block):
    bm = sv.sliding_tile(frames, height, width, tile=tile, window=window, text=text, block_size=block)
    reference = _sta_reference(frames, height, width, tile, window, text)
    assert tuple(bm.seq_lengths) == reference.shape
    assert torch.equal(_element_mask(bm), reference)
    assert torch.equal(
        bm.mask_mod(None, None, torch.arange(len(reference))[:, None], torch.arange(len(reference))), reference
    )
    _assert_tight(bm, reference)


@pytest.mark.parametrize("frames,height,width,text", LAYOUTS + [(9, 2, 3, 2), (17, 1, 4, 0)])
@pytest.mark.parametrize("window", [1, 3, 6, 20])
@pytest.mark.parametrize("block", [16, (8, 24), 13])
def test_radial_is_its_rule(frames, height, width, text, window, block):
    bm = sv.radial(frames, height, width, window=window, text=text, block_size=block)
    reference = _radial_reference(frames, height, width, window, text)
    assert torch.equal(_element_mask(bm), reference)
    _assert_tight(bm, reference)


def test_radial_keeps_less_as_frames_get_further():
    bm = sv.radial(16, 6, 6, window=36, block_size=6)  # one block a row of a frame
    reference = _radial_reference(16, 6, 6, 36, 0)
    per_distance = [float(reference[:36, 36 * d : 36 * (d + 1)].float().mean()) for d in range(16)]
    assert per_distance[0] == 1.0
    assert all(a >= b for a, b in zip(per_distance[1:], per_distance[2:]))
    assert per_distance[15] < per_distance[1] / 4
    assert sv.density(bm) < 1.0


@pytest.mark.parametrize(
    "build",
    [
        lambda: sv.sliding_tile(3, 4, 5, tile=(1, 2, 2), window=(1, 3, 3), text=6, block_size=(16, 8)),
        lambda: sv.radial(5, 3, 4, window=4, text=5, block_size=(8, 16)),
    ],
)
def test_attention_under_the_masks_is_float64_masked_attention(build, seed):
    bm = build()
    n = bm.seq_lengths[0]
    q, k, v = (torch.randn(2, 3, n, 8, dtype=torch.float64) for _ in range(3))
    keep = bm.mask_mod(None, None, torch.arange(n)[:, None], torch.arange(n)[None, :])
    scores = (q @ k.transpose(-1, -2)) * 8**-0.5
    expected = scores.masked_fill(~keep, -math.inf).softmax(-1) @ v
    torch.testing.assert_close(block_mask_attention(q, k, v, bm), expected, rtol=1e-12, atol=1e-12)
    low = block_mask_attention(q.float(), k.float(), v.float(), bm)
    torch.testing.assert_close(low.double(), expected, rtol=1e-5, atol=1e-5)


# -- opt-in through auto(), under the guard -------------------------------------------------
def _local_qkv(frames, height, width, sharpness=2.0, heads=2):
    """Attention that decays with the distance between tokens (q.k = -c/2 |pos_q - pos_k|^2
    + a term of q alone), plus random channels: what sparse video attention assumes."""
    f, y, x = torch.meshgrid(torch.arange(frames), torch.arange(height), torch.arange(width), indexing="ij")
    pos = torch.stack([f, y, x], -1).reshape(-1, 3).float()
    n = len(pos)
    q = torch.cat([sharpness * pos, sharpness * torch.ones(n, 1), 0.3 * torch.randn(n, 12)], -1)
    k = torch.cat([pos, -0.5 * (pos**2).sum(-1, keepdim=True), 0.3 * torch.randn(n, 12)], -1)
    v = torch.randn(1, heads, n, 16)
    return q.expand(1, heads, n, 16).contiguous(), k.expand(1, heads, n, 16).contiguous(), v


def _attend(chooser, who, q, k, v, bias=None):
    with torch.no_grad():
        return chooser.attention(who, q, k, v, bias, 1.0, False)


def test_a_good_mask_stays_sparse_and_explain_marks_it(seed):
    bm = sv.sliding_tile(4, 6, 6, tile=(1, 2, 2), window=(3, 3, 3), block_size=16)
    q, k, v = _local_qkv(4, 6, 6)
    assert "LOSSY SPARSE" in attnkit.auto(lossy=bm).explain()  # the processor takes the option
    chooser = AutoChooser(lossy=bm)
    out = _attend(chooser, "blocks.0.attn1", q, k, v)
    assert torch.equal(out, block_mask_attention(q, k, v, bm, 1.0))  # the sparse output itself
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)
    assert 0.002 < attnkit.testing.rel_error(out, full) < 0.03  # about 1.2%: far keys weigh a little
    (state,) = chooser.guard_states()
    assert (state.module, state.checks, state.fallen_back) == ("blocks.0.attn1", 1, False)
    text = chooser.explain()
    assert "LOSSY SPARSE" in text and "sliding_tile(4x6x6, tile=(1, 2, 2), window=(3, 3, 3))" in text
    assert "blocks.0.attn1" in text and "lossy after 1 call(s)" in text
    assert "lossy=sparse sliding_tile(" in chooser.describe()


def test_a_mask_too_sparse_falls_back_to_exact_naming_the_layer(caplog, seed):
    bm = sv.sliding_tile(4, 6, 6, tile=(1, 2, 2), window=(1, 1, 1), block_size=16)
    q, k, v = (torch.randn(1, 2, 144, 16) for _ in range(3))  # no locality: the far keys matter
    chooser = AutoChooser(lossy=bm)
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        out = _attend(chooser, "blocks.3.attn1", q, k, v)
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)
    torch.testing.assert_close(out, full)  # this call is recomputed exactly
    assert attnkit.testing.rel_error(block_mask_attention(q, k, v, bm, 1.0), full) > 0.2
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "blocks.3.attn1" in warning.getMessage() and "sliding_tile(" in warning.getMessage()
    (state,) = chooser.guard_states()
    assert state.fallen_back and state.error > 0.05
    # later calls of that module and signature run exactly, unchecked; another module is checked apart
    torch.testing.assert_close(_attend(chooser, "blocks.3.attn1", q, k, v), full)
    assert state.checks == 1
    q2, k2, v2 = _local_qkv(4, 6, 6)
    _attend(chooser, "blocks.4.attn1", q2, k2, v2)
    assert "fell back to exact" in chooser.explain() and len(chooser.guard_states()) == 2


def test_calls_the_mask_does_not_fit_run_exactly_and_say_why(seed):
    bm = sv.radial(3, 4, 4, window=4, text=2, block_size=16)
    chooser = AutoChooser(lossy=bm)
    q = torch.randn(1, 2, 50, 8)
    cross_k, cross_v = torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    out = _attend(chooser, "blocks.0.attn2", q, cross_k, cross_v)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, cross_k, cross_v, scale=1.0))
    masked = torch.randn(1, 1, 50, 50)
    k, v = torch.randn(1, 2, 50, 8), torch.randn(1, 2, 50, 8)
    out = _attend(chooser, "blocks.0.attn1", q, k, v, masked)
    torch.testing.assert_close(
        out, torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=masked, scale=1.0)
    )
    assert chooser.guard_states() == []
    text = chooser.explain()
    assert "the sparse mask cannot serve" in text and "7 keys, the sparse mask is for 50 and 50" in text
    assert "a mask of its own" in text


def test_guarded_checks_any_layer(caplog, seed):
    bm = sv.sliding_tile(4, 6, 6, tile=(1, 2, 2), window=(3, 3, 3), block_size=16)
    q, k, v = _local_qkv(4, 6, 6)
    out, figures = sv.guarded(q, k, v, bm, 1.0, layer="blocks.0.attn1")
    assert not figures["fallen_back"] and figures["error"] < 0.05
    assert torch.equal(out, block_mask_attention(q, k, v, bm, 1.0))
    tight = sv.sliding_tile(4, 6, 6, tile=(1, 2, 2), window=(1, 1, 1), block_size=16)
    q, k, v = (torch.randn(1, 2, 144, 16) for _ in range(3))
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        out, figures = sv.guarded(q, k, v, tight, layer="blocks.7.attn1")
    assert figures["fallen_back"] and figures["row_error"] > 0.2
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v))
    assert "blocks.7.attn1" in caplog.text
    out, figures = sv.guarded(q, k, v, tight, guard=False)
    assert figures["error"] is None and torch.equal(out, block_mask_attention(q, k, v, tight))


def test_without_lossy_no_mask_is_applied(seed):
    chooser = AutoChooser()
    q, k, v = (torch.randn(1, 2, 144, 16) for _ in range(3))
    torch.testing.assert_close(
        _attend(chooser, "x", q, k, v), torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)
    )
    assert "LOSSY" not in chooser.explain()


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: sv.sliding_tile(0, 4, 4), r"frames=0: use a positive int \(latent frames after patching\)"),
        (lambda: sv.sliding_tile(2, 4, 4, window=(3, 2, 3)), r"window=\(3, 2, 3\): use odd sizes"),
        (lambda: sv.sliding_tile(2, 4, 4, tile=(1, 2)), r"tile=\(1, 2\): give three positive ints"),
        (lambda: sv.sliding_tile(2, 4, 4, tile=(1, 0, 2)), r"tile=0: use a positive int"),
        (lambda: sv.sliding_tile(2, 4, 4, text=-1), r"text=-1: use an int >= 0"),
        (lambda: sv.radial(2, 4, 4, window=0), r"window=0: use a positive int"),
        (lambda: sv.radial(2, 4, 4, block_size=(16, 0)), r"block_size=0: use a positive int"),
        (lambda: sv.radial(2, 4, 4, block_size="big"), r"block_size='big': give an int or"),
        (lambda: AutoChooser(lossy="sparse"), r"lossy='sparse': the lossy backend attnkit has is 'int8', or sparse"),
    ],
)
def test_invalid_arguments_say_what_to_do(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_text_padding_mask_combines_with_the_sparse_mask(seed, caplog):
    """HunyuanVideo passes its text padding as a (B, 1, 1, N) key mask: the sparse mask
    serves the call with those keys hidden too, checked by the guard against full
    attention under the same key mask; a key-shaped bias that is not a mask (finite
    values) cannot be expressed and runs exactly, saying so."""
    bm = sv.sliding_tile(4, 6, 6, tile=(1, 2, 2), window=(3, 3, 3), block_size=16)
    q, k, v = _local_qkv(4, 6, 6)
    n = q.shape[2]
    keep = torch.arange(n) < n - 20
    bias = torch.zeros(1, 1, 1, n).masked_fill(~keep, float("-inf"))
    chooser = AutoChooser(lossy=bm)
    out = _attend(chooser, "blocks.0.attn1", q, k, v, bias)
    assert torch.equal(out, block_mask_attention(q, k, v, bm, 1.0, keys=keep.expand(1, n)))
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)
    assert attnkit.testing.rel_error(out, full) < 0.05
    (state,) = chooser.guard_states()
    assert not state.fallen_back and state.checks == 1
    with torch.no_grad():  # torch's is_causal (offset 0) combines too
        causal = chooser.attention("blocks.2.attn1", q, k, v, bias, 1.0, False, causal_offset=0)
    expected = block_mask_attention(q, k, v, bm, 1.0, keys=keep.expand(1, n), causal=True)
    assert torch.equal(causal, expected)
    other = torch.randn(1, 1, 1, n)
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        out = _attend(chooser, "blocks.1.attn1", q, k, v, other)
    torch.testing.assert_close(
        out, torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=other, scale=1.0)
    )
    assert any("values other than 0 and -inf" in r.getMessage() for r in caplog.records)
