"""A FlexAttention BlockMask in the flash kernel: its block table, and the block-sparse
forward and backward (flash/sparse_kernels.py) as an autograd function.

block_table() maps a BlockMask of any block size onto the kernel's tile (BLOCK_M query
rows x BLOCK_N keys): a tile inside one mask block takes that block's state; a tile
covering several is full where all are full, skipped where all are hidden, partial
otherwise. Partial tiles keep their element mask in a compact store of only those tiles
(one byte per score of each partial tile, never an (M, N) tensor), evaluated from the
mask's mask_mod on its partial blocks only (vectorised, in bounded chunks). A block list
with no mask_mod (from_kv_blocks' noop_mask, Kandinsky 5's NABLA form) is seen whole, as
compiled FlexAttention sees it. The last key tile, where N is not a multiple of BLOCK_N,
is partial (its keys past N are not loaded). The table is built once per mask object and
tile (weakly cached: it leaves with its mask).

block_sparse_attention(q, k, v, block_mask, scale) is softmax over the keys the mask
shows each row, rows that see no key giving zeros; its gradients come from the backward
kernels (dQ walks the forward table, dK/dV the transposed one)."""

from __future__ import annotations

import functools
import math
import weakref
from dataclasses import dataclass

import torch
from torch.func import vmap

from ...masks import EMPTY, FULL, PARTIAL, block_size, block_states, check_block_mask, noop_mask_mod
from ..launcher import Launch, run, settings
from .abi import COMPILE_OPTIONS, align, precision
from .kernels import LOG2E
from .select import INTERPRET_TILE, pieces
from .sparse_kernels import SPARSE_KERNELS

# Elements of mask_mod evaluated at once while building a table's store (bounded memory).
EVAL_CHUNK = 1 << 20


@dataclass(frozen=True)
class Lists:
    """One walk of a block table: per (mask batch, mask head, tile), the full and the
    partial tiles of the other axis it visits (ascending), and each partial tile's slot
    in the store. Counts (Bm, Hm, T); lists (Bm, Hm, T, T_other), int32, contiguous."""

    full_num: torch.Tensor
    full_idx: torch.Tensor
    part_num: torch.Tensor
    part_idx: torch.Tensor
    part_slot: torch.Tensor

    def arguments(self) -> dict:
        return dict(FullNum=self.full_num, FullIdx=self.full_idx, PartNum=self.part_num, PartIdx=self.part_idx)

    def strides(self) -> dict:
        bm, hm = self.full_num.shape[:2]
        sn, si = self.full_num.stride(), self.full_idx.stride()
        return dict(
            stride_nb=sn[0] if bm > 1 else 0,
            stride_nh=sn[1] if hm > 1 else 0,
            stride_tb=si[0] if bm > 1 else 0,
            stride_th=si[1] if hm > 1 else 0,
            stride_tl=si[2],
            stride_te=si[3],
        )


@dataclass(frozen=True)
class BlockTable:
    """A BlockMask on the kernel's tile: rows (query tiles' walk), cols (key tiles' walk,
    the transposed table), store (partial tiles' element masks, (P, BLOCK_M, BLOCK_N)
    uint8), the tile, and how many tiles of each state there are (for describe and the
    benchmarks: the work the kernel skips)."""

    tile: tuple[int, int]
    rows: Lists
    cols: Lists
    store: torch.Tensor
    full_tiles: int
    partial_tiles: int
    tiles: int

    @property
    def density(self) -> float:
        """The fraction of tiles the kernel visits."""
        return (self.full_tiles + self.partial_tiles) / max(self.tiles, 1)


# (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel and head-dim band on a GPU: the
# tiles whose static rows are clean (no spills, no duplicated work) on sm_80 and sm_90
# (bench/results/static, rows sparse_*), one table per tile. Up to 64: 64 x 64 for all
# three; to 128: dK/dV at 32 x 32 (64 x 64 spills); to 256: 32 x 32, dK/dV 32 x 16 in one
# stage (two spill 8 B on sm_80). Every tile needs under 101,376 B of shared memory.
CONFIGS = {
    64: {"sparse_fwd": (64, 64, 4, 2), "sparse_dq": (64, 64, 4, 2), "sparse_dkdv": (64, 64, 4, 2)},
    128: {"sparse_fwd": (64, 64, 4, 2), "sparse_dq": (64, 64, 4, 2), "sparse_dkdv": (32, 32, 4, 2)},
    256: {"sparse_fwd": (32, 32, 4, 2), "sparse_dq": (32, 32, 4, 2), "sparse_dkdv": (32, 16, 4, 1)},
    512: {"sparse_fwd": (32, 32, 4, 2), "sparse_dq": (32, 32, 4, 2), "sparse_dkdv": (32, 16, 4, 1)},
}


def launch_config(kernel: str, head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of a sparse kernel at a head dim: CONFIGS
    on a GPU; the interpreter's small tile under TRITON_INTERPRET."""
    s = settings()
    if s.interpret:
        t = s.interpret_tile or INTERPRET_TILE
        return t.block_m, t.block_n, 4, 1
    band = next(b for b in sorted(CONFIGS) if head_dim <= b)
    return CONFIGS[band][kernel]


def tile_for(head_dim: int, kernel: str = "sparse_fwd") -> tuple[int, int]:
    """The (BLOCK_M, BLOCK_N) a sparse kernel's table is built for (launch_config)."""
    return launch_config(kernel, head_dim)[:2]


def block_table(block_mask, m: int, n: int, tile: tuple[int, int], device: torch.device) -> BlockTable:
    """The BlockMask's table for the kernel's tile on ``device``, built once per mask
    object, tile and device (read again only for another one)."""
    key = (id(block_mask), tile, str(device))
    hit = _TABLES.get(key)
    if hit is not None and hit[0]() is block_mask:
        return hit[1]
    table = _build(block_mask, m, n, tile, device)
    try:
        ref = weakref.ref(block_mask, functools.partial(_forget, key))
    except TypeError:
        return table
    _TABLES[key] = (ref, table)
    return table


def table_count() -> int:
    """How many block tables are kept (one per live mask object, tile and device)."""
    return len(_TABLES)


# (id(BlockMask), tile, device) -> (a weak reference to the mask, its BlockTable): an entry
# leaves with its mask, so the table is bounded by the masks alive.
_TABLES: dict[tuple, tuple] = {}


def _forget(key, _ref) -> None:
    _TABLES.pop(key, None)


def _build(block_mask, m: int, n: int, tile: tuple[int, int], device: torch.device) -> BlockTable:
    bm_rows, bm_cols = tile
    qb, kb = block_size(block_mask.BLOCK_SIZE)
    n_qb, n_kb = -(-m // qb), -(-n // kb)
    states = block_states(block_mask, n_qb, n_kb).to(device)
    bmask, hmask = states.shape[:2]
    tq, tk = -(-m // bm_rows), -(-n // bm_cols)
    # Cells: the largest units that lie in one mask block and one tile.
    gq, gk = math.gcd(qb, bm_rows), math.gcd(kb, bm_cols)
    rq, rk = bm_rows // gq, bm_cols // gk
    q_at = torch.arange(tq * rq, device=device) * gq
    k_at = torch.arange(tk * rk, device=device) * gk
    cells = states[:, :, (q_at // qb).clamp(max=n_qb - 1)][:, :, :, (k_at // kb).clamp(max=n_kb - 1)]
    valid = ((q_at < m)[:, None] & (k_at < n)[None, :]).view(1, 1, tq, rq, tk, rk)
    cells = cells.view(bmask, hmask, tq, rq, tk, rk)
    seen = ((cells > EMPTY) & valid).any(5).any(3)
    whole = ((cells == FULL) | ~valid).all(5).all(3)
    ragged = torch.zeros(tk, dtype=torch.bool, device=device)
    if n % bm_cols:
        ragged[-1] = True
    full = seen & whole & ~ragged
    part = seen & ~full
    store = _store(block_mask, states, part, m, n, tile, (qb, kb))
    slots = (part.flatten().cumsum(0) - 1).view(part.shape).to(torch.int32)
    rows = _lists(full, part, slots)
    cols = _lists(full.transpose(-1, -2), part.transpose(-1, -2), slots.transpose(-1, -2))
    return BlockTable(tile, rows, cols, store, int(full.sum()), int(part.sum()), full.numel())


def _lists(full: torch.Tensor, part: torch.Tensor, slots: torch.Tensor) -> Lists:
    def walk(visit):
        order = torch.sort((~visit).to(torch.uint8), dim=-1, stable=True).indices
        return visit.sum(-1).to(torch.int32).contiguous(), order.to(torch.int32).contiguous()

    full_num, full_idx = walk(full)
    part_num, part_idx = walk(part)
    part_slot = torch.gather(slots, -1, part_idx.long()).to(torch.int32).contiguous()
    return Lists(full_num, full_idx, part_num, part_idx, part_slot)


def _store(block_mask, states, part, m, n, tile, block) -> torch.Tensor:
    """(P, BLOCK_M, BLOCK_N) uint8: the element mask of each partial tile, in slot order
    (row-major over (mask batch, mask head, query tile, key tile))."""
    bm_rows, bm_cols = tile
    qb, kb = block
    device = states.device
    where = part.nonzero()  # (P, 4), row-major
    if where.shape[0] == 0:
        return torch.zeros(1, bm_rows, bm_cols, dtype=torch.uint8, device=device)
    mask_mod = None if noop_mask_mod(block_mask.mask_mod) else block_mask.mask_mod
    out = []
    step = max(1, EVAL_CHUNK // (bm_rows * bm_cols))
    r_off = torch.arange(bm_rows, device=device)
    c_off = torch.arange(bm_cols, device=device)
    for at in range(0, where.shape[0], step):
        w = where[at : at + step]
        b, h, i, j = (w[:, x] for x in range(4))
        q = (i[:, None] * bm_rows + r_off)[:, :, None]  # (P, BM, 1)
        k = (j[:, None] * bm_cols + c_off)[:, None, :]  # (P, 1, BN)
        valid = (q < m) & (k < n)
        qc, kc = q.clamp(max=m - 1), k.clamp(max=n - 1)
        state = states[b[:, None, None], h[:, None, None], qc // qb, kc // kb]
        keep = state == FULL
        inner = state == PARTIAL
        if mask_mod is not None and bool(inner.any()):
            shape = inner.shape
            flat = [x.expand(shape).reshape(-1) for x in (b[:, None, None], h[:, None, None], qc, kc)]
            keep = keep | (inner & vmap(mask_mod)(*flat).to(torch.bool).view(shape))
        out.append((keep & valid).to(torch.uint8))
    return torch.cat(out).contiguous()


# =====================================================================================
# Launches
# =====================================================================================


def _dense(t: torch.Tensor) -> torch.Tensor:
    """t itself where the kernels can read and write through its strides (last dim
    contiguous, no overlapping elements), else a contiguous copy."""
    if t.stride(-1) == 1 and _non_overlapping_and_dense(t):
        return t
    return t.contiguous()


def _non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill its storage span exactly once, in some order of its
    dims (then empty_like keeps its strides, and a gradient written through them races
    nowhere)."""
    expected = 1
    dims = sorted(((st, sz) for sz, st in zip(t.shape, t.stride()) if sz > 1))
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _common(q, k, v, table: BlockTable, tensors: tuple) -> dict:
    b, h, m, d = q.shape
    d0, d1 = pieces(d)
    strides = [s for t in tensors for s in (*t.stride()[:3], t.storage_offset())]
    return dict(
        H=h,
        M=m,
        N=k.shape[2],
        HEAD_DIM=d,
        D0=d0,
        D1=d1,
        ALIGN=align(*strides),
        PRECISION=precision(q.dtype, False),
        EMULATE_BF16=settings().interpret and q.dtype == torch.bfloat16,
    )


def _launch(kernel: str, grid_rows: int, axis: str, b: int, h: int, tile, static: dict, tensors: dict, d: int):
    bm, bn, warps, stages = launch_config(kernel, d)
    assert (bm, bn) == tuple(tile), f"{kernel}: a table for {tile}, the kernel's tile is {(bm, bn)}"
    meta = dict(BLOCK_M=bm, BLOCK_N=bn)
    options = dict(COMPILE_OPTIONS)
    if not settings().interpret:
        options.update(num_warps=warps, num_stages=stages)
    jit = SPARSE_KERNELS[kernel]
    launch = Launch(kernel, jit, jit, static, grid_rows, axis, b, h, meta=meta, options=options, cuda=True)
    launch.cuda = tensors["Q"].device.type == "cuda"
    run(launch, tensors)


def _strides(t: torch.Tensor, names: tuple[str, str, str]) -> dict:
    return dict(zip(names, t.stride()[:3]))


def forward(q, k, v, table: BlockTable, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): lse (B, H, M) float32, base 2, -inf on rows that see no key."""
    b, h, m, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((b, h, m), dtype=torch.float32, device=q.device)
    static = dict(
        _common(q, k, v, table, (q, k, v, out)),
        **_strides(q, ("stride_qb", "stride_qh", "stride_qm")),
        **_strides(k, ("stride_kb", "stride_kh", "stride_kn")),
        **_strides(v, ("stride_vb", "stride_vh", "stride_vn")),
        **_strides(out, ("stride_ob", "stride_oh", "stride_om")),
        **table.rows.strides(),
        qk_scale=scale * LOG2E,
    )
    tensors = dict(Q=q, K=k, V=v, Out=out, Lse=lse, PartSlot=table.rows.part_slot, Store=table.store)
    tensors.update(table.rows.arguments())
    _launch("sparse_fwd", m, "BLOCK_M", b, h, table.tile, static, tensors, d)
    return out, lse


def backward(do, q, k, v, out, lse, rows_table: BlockTable, cols_table: BlockTable, scale: float):
    """(dq, dk, dv), each with its input's strides: dQ walks rows_table's rows (built for
    sparse_dq's tile), dK/dV cols_table's columns (sparse_dkdv's)."""
    b, h, m, d = q.shape
    n = k.shape[2]
    do = _dense(do)
    delta = (do.float() * out.float()).sum(-1).contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    common = dict(
        _common(q, k, v, rows_table, (q, k, v, do)),
        **_strides(q, ("stride_qb", "stride_qh", "stride_qm")),
        **_strides(k, ("stride_kb", "stride_kh", "stride_kn")),
        **_strides(v, ("stride_vb", "stride_vh", "stride_vn")),
        **_strides(do, ("stride_dob", "stride_doh", "stride_dom")),
        qk_scale=scale * LOG2E,
        sm_scale=scale,
    )
    base = dict(Q=q, K=k, V=v, DO=do, Lse=lse, Delta=delta)
    t = rows_table
    rows = dict(base, DQ=dq, Store=t.store, PartSlot=t.rows.part_slot, **t.rows.arguments())
    _launch("sparse_dq", m, "BLOCK_M", b, h, t.tile, dict(common, **t.rows.strides()), rows, d)
    t = cols_table
    cols = dict(base, DK=dk, DV=dv, Store=t.store, PartSlot=t.cols.part_slot, **t.cols.arguments())
    _launch("sparse_dkdv", n, "BLOCK_N", b, h, t.tile, dict(common, **t.cols.strides()), cols, d)
    return dq, dk, dv


class _BlockSparse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, block_mask, scale):
        m, n, d = q.shape[2], k.shape[2], q.shape[-1]
        out, lse = forward(q, k, v, block_table(block_mask, m, n, tile_for(d), q.device), scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.block_mask, ctx.scale = block_mask, scale
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        m, n, d = q.shape[2], k.shape[2], q.shape[-1]
        rows = block_table(ctx.block_mask, m, n, tile_for(d, "sparse_dq"), q.device)
        cols = block_table(ctx.block_mask, m, n, tile_for(d, "sparse_dkdv"), q.device)
        dq, dk, dv = backward(do, q, k, v, out, lse, rows, cols, ctx.scale)
        return dq, dk, dv, None, None


def block_sparse_attention(q, k, v, block_mask, scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale over the keys block_mask shows each row) v in the block-sparse
    kernel; differentiable. q, k, v: (B, H, L, D), one head dim for all three (any
    strides; the last dim is made contiguous where it is not), 16-bit or float32, on a
    device Triton runs on (or under TRITON_INTERPRET). block_mask: a FlexAttention
    BlockMask for (M, N) (batch and heads B and H, or 1), checked as block_masks.check."""
    b, h, m, d = q.shape
    n = k.shape[2]
    if k.shape[-1] != d or v.shape[-1] != d:
        raise ValueError(
            f"the block-sparse kernel takes one head dim for q, k and v; got {d}, {k.shape[-1]}, {v.shape[-1]}: "
            "use attnkit.block_masks.block_mask_attention for a value head dim of its own"
        )
    check_block_mask(block_mask, b, h, m, n)
    q, k, v = _dense(q), _dense(k), _dense(v)
    scale = d**-0.5 if scale is None else float(scale)
    return _BlockSparse.apply(q, k, v, block_mask, scale)
