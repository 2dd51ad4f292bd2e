"""Sparse attention for video as FlexAttention BlockMasks: lossy approximations of full
attention, used only when asked for (docs/sparse_video.md).

The token layout is Wan's and HunyuanVideo's: ``frames x height x width`` video tokens in
frame-major order (token ``i`` is frame ``i // (height * width)``, row ``(i // width) %
height``, column ``i % width``), then ``text`` tokens, which see every token and are seen
by every token. Each builder returns a ``BlockMask`` for (tokens, tokens), tokens =
frames * height * width + text, batch and heads 1 (broadcast), whose ``mask_mod`` states
the rule over token indices; its block lists come from that rule per class of frame pair
(one (height*width)^2 table each, never (tokens, tokens)), without torch.compile. A block the rule shows whole is a full block, one it shows in part is a
partial block (read through the mask_mod), one it hides is not listed.

* :func:`sliding_tile` (STA, "Fast Video Generation with Sliding Tile Attention"): 3-D tiles
  of ``tile`` tokens; a query's tile sees the key tiles within ``window`` tiles on each
  axis, the window centred on it and shifted inward at the borders (each query tile sees
  a full window where the grid allows it).
* :func:`radial` ("Radial Attention: O(n log n) Sparse Attention with Energy Decay for
  Long Video Generation"): a query's own frame is dense; at frame distance d >= 1, in band
  r = floor(log2(d)), it sees keys whose in-frame position is less than ``window / 2**r``
  away; where that band is under one token, only the same position, one frame in
  ceil(2**r / window).

Opt in with ``attnkit.auto(lossy=mask)``, under the quality guard, or check any layer with
:func:`guarded`.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import torch
from torch.nn.attention.flex_attention import BlockMask

from .block_masks import block_mask_attention
from .choose.guard import checked_rows, compare, guard_options, sample_inputs

logger = logging.getLogger("attnkit")


def _positive(name: str, value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r}: use a positive int ({what})")
    return value


def _triple(name: str, value: Any, what: str, odd: bool = False) -> tuple[int, int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value, value)
    if not isinstance(value, Sequence) or len(value) != 3:
        raise ValueError(f"{name}={value!r}: give three positive ints (frames, height, width) or one for all ({what})")
    out = tuple(_positive(name, x, what) for x in value)
    if odd and any(x % 2 == 0 for x in out):
        raise ValueError(
            f"{name}={value!r}: use odd sizes (the window is centred on the query's tile: 1, 3, 5, ... tiles)"
        )
    return out  # type: ignore[return-value]


class VideoLayout:
    """frames x height x width video tokens (frame-major), then ``text`` tokens."""

    def __init__(self, frames: int, height: int, width: int, text: int = 0) -> None:
        self.frames = _positive("frames", frames, "latent frames after patching")
        self.height = _positive("height", height, "latent rows after patching")
        self.width = _positive("width", width, "latent columns after patching")
        if not isinstance(text, int) or isinstance(text, bool) or text < 0:
            raise ValueError(f"text={text!r}: use an int >= 0 (text tokens appended after the video tokens)")
        self.text = text
        self.video = frames * height * width
        self.tokens = self.video + text

    def coords(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hw = self.height * self.width
        return idx // hw, (idx // self.width) % self.height, idx % self.width

    def __repr__(self) -> str:
        text = f", text={self.text}" if self.text else ""
        return f"{self.frames}x{self.height}x{self.width}{text}"


class _Rule:
    """A mask_mod over token indices (tensor operations only: vmapped by FlexAttention and
    block_mask_attention, broadcast by the builders). Picklable, unlike a closure."""

    layout: VideoLayout
    description: str

    def __call__(self, b, h, q_idx, kv_idx):
        text = (q_idx >= self.layout.video) | (kv_idx >= self.layout.video)
        return text | self.video(q_idx.clamp(max=self.layout.video - 1), kv_idx.clamp(max=self.layout.video - 1))

    def video(self, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def frame_class(self, fq: int, fk: int) -> Any:
        """A key equal for two frame pairs where video() is the same (hw, hw) matrix of
        in-frame positions."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.description


class SlidingTileRule(_Rule):
    def __init__(self, layout: VideoLayout, tile: tuple[int, int, int], window: tuple[int, int, int]) -> None:
        self.layout, self.tile, self.window = layout, tile, window
        self.grid = tuple(-(-n // t) for n, t in zip((layout.frames, layout.height, layout.width), tile))
        self.description = f"sliding_tile({layout!r}, tile={tile}, window={window})"

    def video(self, q_idx, kv_idx):
        seen = None
        for qc, kc, t, w, n in zip(
            self.layout.coords(q_idx), self.layout.coords(kv_idx), self.tile, self.window, self.grid
        ):
            if w >= n:
                continue  # the window covers the axis
            half = w // 2
            centre = (qc // t).clamp(half, n - 1 - half)
            near = (kc // t - centre).abs() <= half
            seen = near if seen is None else seen & near
        if seen is None:
            return torch.ones_like(q_idx, dtype=torch.bool) | (kv_idx < 0)
        return seen

    def frame_class(self, fq: int, fk: int) -> Any:
        t, w, n = self.tile[0], self.window[0], self.grid[0]
        if w >= n:
            return True
        half = w // 2
        return abs(fk // t - min(max(fq // t, half), n - 1 - half)) <= half


class RadialRule(_Rule):
    def __init__(self, layout: VideoLayout, window: int) -> None:
        self.layout, self.window = layout, window
        self.description = f"radial({layout!r}, window={window})"

    def video(self, q_idx, kv_idx):
        lay = self.layout
        hw = lay.height * lay.width
        fq, fk = q_idx // hw, kv_idx // hw
        dp = (q_idx % hw - kv_idx % hw).abs()
        d = (fq - fk).abs()
        band = torch.ones_like(d)  # 2**floor(log2(max(d, 1))), by comparisons (exact, vmappable)
        for bit in range(1, max(lay.frames - 1, 1).bit_length()):
            band = torch.where(d >= 2**bit, torch.full_like(d, 2**bit), band)
        near = band <= self.window  # the band keeps at least one token
        within = near & (dp * band < self.window)
        stride = (band + self.window - 1) // self.window  # ceil(2**r / window)
        sparse_frames = ~near & (dp == 0) & (d % stride == 0)
        return (d == 0) | within | sparse_frames

    def frame_class(self, fq: int, fk: int) -> Any:
        d = abs(fq - fk)
        if d == 0:
            return ("own frame",)
        band = 1 << (d.bit_length() - 1)
        if band > self.window:
            return ("one frame in a stride", band, d % -(-band // self.window) == 0)
        return ("band", band)


def _block_mask(rule: _Rule, block_size: Any, device: Any) -> BlockMask:
    if isinstance(block_size, int) and not isinstance(block_size, bool):
        block_size = (block_size, block_size)
    if not isinstance(block_size, Sequence) or len(block_size) != 2:
        raise ValueError(f"block_size={block_size!r}: give an int or (query block, key block)")
    qb = _positive("block_size", block_size[0], "query rows per block")
    kb = _positive("block_size", block_size[1], "keys per block")
    lay = rule.layout
    n = lay.tokens
    shown, whole = _block_states(rule, qb, kb)
    partial = shown & ~whole

    def lists(which: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        count = which.sum(-1).to(torch.int32)
        order = torch.argsort((~which).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return count[None, None], order[None, None]

    num, idx = lists(partial)
    full_num, full_idx = lists(whole)
    mask = BlockMask.from_kv_blocks(
        num, idx, full_num, full_idx, BLOCK_SIZE=(qb, kb), mask_mod=rule, seq_lengths=(n, n)
    )
    return mask.to(device) if device is not None else mask


def _segments(lay: VideoLayout, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each block's video tokens as per-frame runs of in-frame positions: (frame, start,
    stop) each (blocks, S), empty runs (start == stop) as padding; and whether each
    block holds text tokens (blocks,)."""
    hw = lay.height * lay.width
    blocks = -(-lay.tokens // block)
    s = torch.arange(blocks) * block
    e = torch.clamp(s + block, max=lay.tokens)
    ve = torch.clamp(e, max=lay.video)
    runs = -(-block // hw) + 1
    frame = (s // hw).clamp(max=lay.frames - 1)[:, None] + torch.arange(runs)[None, :]
    lo = torch.maximum(s[:, None], frame * hw)
    hi = torch.minimum(ve[:, None], (frame + 1) * hw)
    empty = hi <= lo
    start = torch.where(empty, 0, lo - frame * hw)
    stop = torch.where(empty, 0, hi - frame * hw)
    return frame.clamp(max=lay.frames - 1), start, stop, e > lay.video


def _block_states(rule: _Rule, qb: int, kb: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(shown, whole): per (query block, key block), whether the rule shows any / every
    (query, key) pair of it. The video part is read from rectangle sums: the rule at
    frames (fq, fk) is a (hw, hw) matrix of in-frame positions, one per class of frame
    pair (rule.frame_class), summed once into a 2-D prefix table."""
    lay = rule.layout
    hw = lay.height * lay.width
    fq, sq, eq, tq = _segments(lay, qb)
    fk, sk, ek, tk = _segments(lay, kb)
    classes: dict[Any, tuple[int, int]] = {}
    of_pair = torch.empty(lay.frames, lay.frames, dtype=torch.long)
    for a in range(lay.frames):
        for b in range(lay.frames):
            key = rule.frame_class(a, b)
            if key not in classes:
                classes[key] = (len(classes), a * lay.frames + b)
            of_pair[a, b] = classes[key][0]
    # (query block, key block, query run, key run)
    cls = of_pair[fq[:, None, :, None], fk[None, :, None, :]]
    r0, r1 = sq[:, None, :, None], eq[:, None, :, None]
    c0, c1 = sk[None, :, None, :], ek[None, :, None, :]
    area = ((r1 - r0) * (c1 - c0)).sum((2, 3))
    count = torch.zeros_like(area)
    p = torch.arange(hw)
    for index, pair in classes.values():
        a, b = divmod(pair, lay.frames)
        seen = rule.video(a * hw + p[:, None], b * hw + p[None, :]).to(torch.int32)
        table = torch.nn.functional.pad(seen.cumsum(0).cumsum(1), (1, 0, 1, 0))
        rect = table[r1, c1] - table[r0, c1] - table[r1, c0] + table[r0, c0]
        count += torch.where(cls == index, rect, 0).sum((2, 3))
    text = tq[:, None] | tk[None, :]
    return (count > 0) | text, count == area


def sliding_tile(
    frames: int,
    height: int,
    width: int,
    *,
    tile: int | Sequence[int] = (1, 4, 4),
    window: int | Sequence[int] = (3, 3, 3),
    text: int = 0,
    block_size: int | Sequence[int] = 128,
    device: Any = None,
) -> BlockMask:
    """Sliding-tile attention's BlockMask for frames x height x width video tokens (after
    patching: Wan 480p, 81 frames: 21 x 30 x 52) and ``text`` tokens after them.

    tile: tokens per tile along (frames, height, width) (an axis not divisible by it ends
    in a smaller tile); window: tiles seen along each axis, odd, centred on the query's
    tile and shifted inward at the borders (3: the tile and its neighbours; a window at
    least the axis' tiles sees the whole axis). block_size: the BlockMask's block (its
    query and key blocks)."""
    layout = VideoLayout(frames, height, width, text)
    rule = SlidingTileRule(
        layout,
        _triple("tile", tile, "tokens per tile along frames, height, width"),
        _triple("window", window, "tiles seen along frames, height, width", odd=True),
    )
    return _block_mask(rule, block_size, device)


def radial(
    frames: int,
    height: int,
    width: int,
    *,
    window: int | None = None,
    text: int = 0,
    block_size: int | Sequence[int] = 128,
    device: Any = None,
) -> BlockMask:
    """Radial attention's BlockMask for frames x height x width video tokens and ``text``
    tokens after them. A query's frame is dense; at frame distance d (band r =
    floor(log2(d))) it sees keys of in-frame position |p_q - p_k| < window / 2**r; past
    the band where that is under one token, the same position in one frame of every
    ceil(2**r / window). window: in tokens of a frame (default height * width: the
    neighbouring frames dense, halved at each doubling of the distance)."""
    layout = VideoLayout(frames, height, width, text)
    window = _positive("window", height * width if window is None else window, "in-frame tokens at frame distance 1")
    return _block_mask(RadialRule(layout, window), block_size, device)


def describe(block_mask: BlockMask) -> str:
    """What a BlockMask computes: a builder's words, else its lengths and block."""
    rule = getattr(block_mask, "mask_mod", None)
    if isinstance(rule, _Rule):
        return rule.description
    m, n = block_mask.seq_lengths
    return f"a BlockMask for {m} queries and {n} keys, block {tuple(block_mask.BLOCK_SIZE)}"


def density(block_mask: BlockMask) -> float:
    """The fraction of (query, key) blocks visited (full or partial): the work kept."""
    total = block_mask.kv_num_blocks.shape[-1] * -(-block_mask.seq_lengths[1] // block_mask.BLOCK_SIZE[1])
    kept = block_mask.kv_num_blocks.sum()
    if block_mask.full_kv_num_blocks is not None:
        kept = kept + block_mask.full_kv_num_blocks.sum()
    return float(kept) / (total * block_mask.kv_num_blocks[..., 0].numel())


def guarded(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_mask: BlockMask,
    scale: float | None = None,
    *,
    guard: bool | Mapping[str, Any] = True,
    layer: str = "an attention layer",
) -> tuple[torch.Tensor, dict]:
    """Sparse attention under block_mask, checked as auto(lossy=...)'s guard checks it.

    q, k, v: (B, H, N, D), N the mask's tokens, no mask of their own. The guard's rows
    (``rows`` spread evenly, ``risky_rows`` of the largest scores) are computed exactly over
    all keys and compared with the sparse output; past its thresholds (guard.DEFAULTS, or
    ``guard``'s), one warning names ``layer`` and the figures and the exact output is
    returned. Returns (output, {"error", "cosine", "row_error", "fallen_back"})."""
    options = guard_options(guard)
    out = block_mask_attention(q, k, v, block_mask.to(q.device), scale)
    if options is None:
        return out, {"error": None, "cosine": None, "row_error": None, "fallen_back": False}
    rows = checked_rows(q, k, options)
    q_s, _ = sample_inputs(q, k, v, None, None, rows)
    reference = torch.nn.functional.scaled_dot_product_attention(q_s.float(), k.float(), v.float(), scale=scale)
    error, cosine, row_error = compare(out.index_select(2, rows), reference)
    bad = not (
        error <= options["max_error"] and row_error <= options["max_row_error"] and cosine >= options["min_cosine"]
    )
    if bad:
        logger.warning(
            "attnkit: sparse attention (%s) in %s measured a worst row's relative L2 error of %.3g, %.3g over all "
            "and a cosine of %.6f on %d checked query rows, beyond the guard's %.3g / %.3g / %.6f: computed exactly",
            describe(block_mask),
            layer,
            row_error,
            error,
            cosine,
            len(rows),
            options["max_row_error"],
            options["max_error"],
            options["min_cosine"],
        )
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)
    return out, {"error": error, "cosine": cosine, "row_error": row_error, "fallen_back": bad}


__all__ = ["VideoLayout", "describe", "density", "guarded", "radial", "sliding_tile"]
