"""Quantisation of Q and K for the INT8 attention kernel in Triton: quant.py's torch form
(the contract), bit for bit, in one pass over each tensor.

    q8, qs, k8, ks, pieces = quantize_qk_fused(q, k, scale)               # as quant.quantize_qk
    mean = token_mean(k)                                                   # (B, H, D) float32
    k8, ks = quantize_rows(k, width, mean=mean, k_block=128)               # K, given its mean
    q8, qs = quantize_rows(q, width, factor=abs(scale), negate=scale < 0)  # Q

The torch form makes some fifteen passes over each tensor (float32 copies, abs, amax,
multiply, round, clamp, cast, a zeroed buffer, a copy); here each program loads a tile of
rows once, finds the amax of each row or block of rows, and writes the int8 values with
their zero padding (up to the width of qk_pieces) and the float32 scales, all contiguous.
K's mean over tokens is a first, separate reduction (token_mean), which reads K once more.

Bit-equality with quant.py. The int8 values and the scales are computed with the same
float32 operations in the same order as torch's: s = amax / 127 and inv = 1 / s as IEEE
divisions (tl.math.div_rn: on CUDA, Triton's ``/`` on float32 may lower to an approximate
division, which would move s and inv by an ulp), then x * inv (a multiply, as torch does,
not x / s), rounded half to even (_rint), clamped to +-127, with no fma contraction
(enable_fp_fusion=False; the test compiles the kernels for sm_90 and reads the PTX: only
div.rn.f32, no fma). Only K's mean may differ from
torch's in its last bits: a float32 sum's value depends on its order, and Triton's order is
not torch's. So quantize_rows takes the mean as an input, and given torch's mean the
result is torch's exactly (tests/kernels/test_int8_quant_fused.py checks both that and
how close token_mean is).

Tiles. A program holds ROWS rows of the next power of two of the padded width (8K
elements). When a K block (``k_block`` rows; Q's is one row) fits in a tile, a program
holds GROUPS whole blocks and reads them once. A larger block (the default 128 keys at
head dims above 64 with the default budget) is read twice by its program, once for its amax and
once to quantise; the second read is of the block just read (k_block x D x 2 bytes), so it
should come from L2 rather than memory (the tiles are not yet timed on a GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .quant import K_BLOCK, QMAX, qk_pieces

# float32 values per program tile (ROWS x the padded width), on 16 warps: compiled for
# sm_90, about 100 registers a thread and no spills at every head dim (twice the tile on
# 8 warps took 255 registers and spilled)
TILE_ELEMENTS = 8192
MAX_ROWS = 128
MEAN_ROWS = 64  # rows per step of token_mean's loop
MEAN_COLS = 64  # channels per token_mean program


@triton.jit
def _rint(y):
    """y rounded to the nearest integer, ties to even, as torch.round (exact for |y| < 2^23).

    From operations the interpreter and every GPU compute exactly: floor, y - floor(y) (a
    float's fraction is representable), comparisons and small integer-valued arithmetic.
    libdevice.rint is not available in Triton's interpreter. The kernel is compiled without
    fma contraction (quantize_rows' enable_fp_fusion=False): y - floor(y) of y = x * inv is
    otherwise fma(x, inv, -floor(y)), which skips the rounding of x * inv that torch's
    round sees. (floor is cvt.rmi.ftz on CUDA: a subnormal y rounds to 0 either way.)"""
    f = tl.floor(y)
    frac = y - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    up = (frac > 0.5) | ((frac == 0.5) & odd)
    return tl.where(up, f + 1.0, f)


@triton.jit
def _quantise_tile(x, inv, qmax: tl.constexpr, NEGATE: tl.constexpr):
    """int8 of x * inv (inv per row, broadcast), rounded, clamped, negated if NEGATE."""
    r = _rint(x * inv[:, None])
    r = tl.minimum(tl.maximum(r, -qmax), qmax)
    if NEGATE:
        r = -r
    return r.to(tl.int8)


@triton.jit
def _token_mean_kernel(
    x_ptr,
    mean_ptr,
    H,
    N,
    count,
    D,
    stride_b,
    stride_h,
    stride_n,
    stride_d,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):
    """mean[b, h, d] = sum over n of x[b, h, n, d] (float32) / N (``count``: N as a float)."""
    pid_d = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    base = x_ptr + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    cols = pid_d * COLS + tl.arange(0, COLS)
    rows = tl.arange(0, ROWS)
    col_ok = cols < D
    # One partial sum per (row slot, channel), summed at the end: N / ROWS additions in
    # each slot, then a tree over the slots, so the rounding grows with N / ROWS + log2(ROWS).
    acc = tl.zeros((ROWS, COLS), dtype=tl.float32)
    for n0 in range(0, N, ROWS):
        n = n0 + rows
        ptrs = base + n.to(tl.int64)[:, None] * stride_n + cols[None, :] * stride_d
        acc += tl.load(ptrs, mask=(n < N)[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
    total = tl.sum(acc, axis=0)
    mean = tl.math.div_rn(total, count)
    out = mean_ptr + (b.to(tl.int64) * H + h) * D + cols
    tl.store(out, mean, mask=col_ok)


@triton.jit
def _quant_kernel(
    x_ptr,
    mean_ptr,
    x8_ptr,
    s_ptr,
    H,
    L,
    D,
    W,
    n_blocks,
    factor,
    stride_b,
    stride_h,
    stride_l,
    stride_d,
    KB: tl.constexpr,
    GROUPS: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    HAS_MEAN: tl.constexpr,
    NEGATE: tl.constexpr,
    QMAX_: tl.constexpr,
):
    """x8 (B, H, L, W) int8 and s (B, H, n_blocks) float32 of x (B, H, L, D), one scale per
    block of KB rows: s = amax / QMAX_ * factor, x8 = round((x - mean) * QMAX_ / amax).

    GROUPS > 0: the program holds GROUPS whole blocks (GROUPS * KB <= ROWS rows) in one
    tile. GROUPS == 0: the program holds one block of KB > ROWS rows, read in steps of
    ROWS rows twice (its amax, then its values)."""
    pid = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    bh = b.to(tl.int64) * H + h
    base = x_ptr + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    cols = tl.arange(0, COLS)
    col_in = cols < D
    col_out = cols < W
    rows = tl.arange(0, ROWS)
    if HAS_MEAN:
        mean = tl.load(mean_ptr + bh * D + cols, mask=col_in, other=0.0)
    else:
        mean = tl.zeros((COLS,), dtype=tl.float32)

    if GROUPS > 0:
        row0 = pid * (GROUPS * KB)
        n = row0 + rows
        row_ok = (rows < GROUPS * KB) & (n < L)
        ptrs = base + n.to(tl.int64)[:, None] * stride_l + cols[None, :] * stride_d
        x = tl.load(ptrs, mask=row_ok[:, None] & col_in[None, :], other=0.0).to(tl.float32)
        # x - mean as torch's smooth computes it; rows past the end hold 0, as torch's
        # zero padding of a short last block does
        x = tl.where(row_ok[:, None], x - mean[None, :], 0.0)
        row_amax = tl.max(tl.abs(x), axis=1)
        if KB == 1:
            block_amax = row_amax
            amax = row_amax
        else:
            # blocks of KB rows: each block's largest row amax, then each row's block's
            groups = tl.arange(0, GROUPS)
            seg = rows // KB
            block_amax = tl.max(tl.where(seg[None, :] == groups[:, None], row_amax[None, :], 0.0), axis=1)
            amax = tl.max(tl.where(seg[:, None] == groups[None, :], block_amax[None, :], 0.0), axis=1)
        # IEEE divisions (div_rn), as torch's: Triton's `/` on float32 may be approximate
        # on CUDA, which would move a scale or its inverse by an ulp
        s = tl.math.div_rn(amax, QMAX_ * 1.0)
        # 0 where s is 0 (rows of zeros, rows past the end), as torch's where
        inv = tl.where(s > 0.0, tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), tl.where(s > 0.0, s, 1.0)), 0.0)
        x8 = tl.where(col_in[None, :], _quantise_tile(x, inv, QMAX_, NEGATE), 0)
        out = x8_ptr + (bh * L + n.to(tl.int64))[:, None] * W + cols[None, :]
        tl.store(out, x8, mask=row_ok[:, None] & col_out[None, :])
        if KB == 1:
            blk = row0 + rows
        else:
            blk = pid * GROUPS + tl.arange(0, GROUPS)
        block_s = tl.math.div_rn(block_amax, QMAX_ * 1.0) * factor
        tl.store(s_ptr + bh * n_blocks + blk, block_s, mask=blk < n_blocks)
    else:
        row0 = pid * KB
        running = tl.zeros((ROWS,), dtype=tl.float32)
        for r0 in range(0, KB, ROWS):
            n = row0 + r0 + rows
            row_ok = (r0 + rows < KB) & (n < L)
            ptrs = base + n.to(tl.int64)[:, None] * stride_l + cols[None, :] * stride_d
            x = tl.load(ptrs, mask=row_ok[:, None] & col_in[None, :], other=0.0).to(tl.float32)
            x = tl.where(row_ok[:, None], x - mean[None, :], 0.0)
            running = tl.maximum(running, tl.max(tl.abs(x), axis=1))
        amax = tl.max(running, axis=0)
        s = tl.math.div_rn(amax, QMAX_ * 1.0)  # IEEE, as above
        inv = tl.where(s > 0.0, tl.math.div_rn(1.0, tl.where(s > 0.0, s, 1.0)), 0.0)
        inv_rows = tl.full((ROWS,), 0.0, tl.float32) + inv
        for r0 in range(0, KB, ROWS):
            n = row0 + r0 + rows
            row_ok = (r0 + rows < KB) & (n < L)
            ptrs = base + n.to(tl.int64)[:, None] * stride_l + cols[None, :] * stride_d
            x = tl.load(ptrs, mask=row_ok[:, None] & col_in[None, :], other=0.0).to(tl.float32)
            x = x - mean[None, :]
            x8 = tl.where(col_in[None, :], _quantise_tile(x, inv_rows, QMAX_, NEGATE), 0)
            out = x8_ptr + (bh * L + n.to(tl.int64))[:, None] * W + cols[None, :]
            tl.store(out, x8, mask=row_ok[:, None] & col_out[None, :])
        tl.store(s_ptr + bh * n_blocks + pid, s * factor)


# The kernels by name, for what compiles them outside a launch (a test compiles them for
# sm_90 and reads the PTX: IEEE divisions, no fma)
KERNELS = {"quant": _quant_kernel, "token_mean": _token_mean_kernel}
LAUNCH_OPTIONS = {"quant": {"enable_fp_fusion": False}, "token_mean": {}}


def _check(x: torch.Tensor, name: str) -> None:
    if x.dim() != 4:
        raise ValueError(f"{name} has shape {tuple(x.shape)}: (B, H, L, D) expected")
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"{name} is {x.dtype}: float16 or bfloat16 expected")


def tile_of(width: int, k_block: int) -> tuple[int, int, int, int]:
    """(COLS, ROWS, GROUPS, warps) of a width and a block: GROUPS = 0 where a block is
    larger than a tile (read twice by its program)."""
    cols = triton.next_power_of_2(width)
    rows = max(1, min(MAX_ROWS, TILE_ELEMENTS // cols))
    warps = 16 if rows * cols >= TILE_ELEMENTS else 4
    if k_block > rows:
        return cols, rows, 0, warps
    groups = 1 << ((rows // k_block).bit_length() - 1)  # a power of two, GROUPS * KB <= ROWS
    return cols, rows, groups, warps


def token_mean(k: torch.Tensor) -> torch.Tensor:
    """(B, H, D) float32: k's mean over its tokens (dim 2), as quant.smooth subtracts it,
    up to float32 rounding (the summation order is not torch's)."""
    _check(k, "k")
    B, H, N, D = k.shape
    mean = torch.empty((B, H, D), dtype=torch.float32, device=k.device)
    if mean.numel() == 0:
        return mean
    if N == 0:
        return mean.fill_(float("nan"))  # torch's mean of no tokens
    grid = (triton.cdiv(D, MEAN_COLS), H, B)
    _token_mean_kernel[grid](
        k,
        mean,
        H,
        N,
        float(N),
        D,
        *k.stride(),
        ROWS=MEAN_ROWS,
        COLS=min(MEAN_COLS, triton.next_power_of_2(D)),
        num_warps=4,
    )
    return mean


def quantize_rows(
    x: torch.Tensor,
    width: int,
    *,
    factor: float = 1.0,
    negate: bool = False,
    mean: torch.Tensor | None = None,
    k_block: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x8, s): x (B, H, L, D) minus ``mean`` (B, H, D) float32 if given, quantised per
    block of ``k_block`` rows: x8 (B, H, L, width) int8 zero-padded, negated if
    ``negate``; s (B, H, cdiv(L, k_block)) float32, amax / 127 * ``factor``. Both
    contiguous, bit for bit quant.py's for the same mean."""
    _check(x, "x")
    if not isinstance(k_block, int) or k_block < 1:
        raise ValueError(f"k_block={k_block!r}: rows per scale, a positive int")
    B, H, L, D = x.shape
    if width < D:
        raise ValueError(f"width={width} is narrower than the head dim {D}")
    if H > 65535 or B > 65535:
        raise ValueError(f"B={B}, H={H}: the grid takes at most 65535 of each")
    if mean is not None and (mean.shape != (B, H, D) or mean.dtype != torch.float32):
        raise ValueError(f"mean has shape {tuple(mean.shape)} and {mean.dtype}: ({B}, {H}, {D}) float32 expected")
    n_blocks = -(-L // k_block)
    x8 = torch.empty((B, H, L, width), dtype=torch.int8, device=x.device)
    s = torch.empty((B, H, n_blocks), dtype=torch.float32, device=x.device)
    if x8.numel() == 0:
        return x8, s
    cols, rows, groups, warps = tile_of(width, k_block)
    programs = n_blocks if groups == 0 else triton.cdiv(L, groups * k_block)
    mean_arg = mean.contiguous() if mean is not None else s  # s: a placeholder, never read
    _quant_kernel[(programs, H, B)](
        x,
        mean_arg,
        x8,
        s,
        H,
        L,
        D,
        width,
        n_blocks,
        float(factor),
        *x.stride(),
        KB=k_block,
        GROUPS=groups,
        ROWS=rows,
        COLS=cols,
        HAS_MEAN=mean is not None,
        NEGATE=bool(negate),
        QMAX_=QMAX,
        num_warps=warps,
        # No contraction into fma: _rint's y - floor(y) of y = x * inv would become
        # fma(x, inv, -floor(y)), rounded once, which can put a value just past .5 that
        # torch's rounded product leaves at .5 (a different int8): enable_fp_fusion=False.
        **LAUNCH_OPTIONS["quant"],
    )
    return x8, s


def quantize_qk_fused(q: torch.Tensor, k: torch.Tensor, scale: float, k_block: int = K_BLOCK) -> tuple:
    """quant.quantize_qk in Triton: (q8, qs, k8, ks, (DQ0, DQ1)), the same shapes, dtypes
    and values (K's mean up to its float32 rounding: see the module)."""
    if not isinstance(k_block, int) or k_block < 1:
        raise ValueError(f"k_block={k_block!r}: keys per K scale, a positive int")
    _check(q, "q")
    _check(k, "k")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"q's head dim {q.shape[-1]} is not k's {k.shape[-1]}")
    pieces = qk_pieces(q.shape[-1])
    width = sum(pieces)
    q8, qs = quantize_rows(q, width, factor=abs(scale), negate=scale < 0)
    k8, ks = quantize_rows(k, width, mean=token_mean(k), k_block=k_block)
    return q8, qs, k8, ks, pieces
