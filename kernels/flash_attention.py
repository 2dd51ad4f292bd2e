"""FlashAttention-2 in Triton: softmax(q k^T * scale + attn_bias) v without an M x N matrix.

Read top to bottom: the @triton.jit kernels, then the launchers that choose tiles and
grids, then the torch.library custom ops with their autograd, then the public functions.

The algorithm (Dao, "FlashAttention-2", 2023):

* forward: each program owns BLOCK_M query rows; their Q tile stays in registers while
  K/V tiles of BLOCK_N keys stream through. The softmax is computed online in fp32 with
  exp2 (see _fwd_tile for the units: without a bias the scale folds into one FFMA per
  score; a bias stays in natural units so that no finite mask overflows). The program
  writes its O rows and their row statistics (the LSE, see _attn_fwd).
* backward: delta = rowsum(dO * O) first; then one pass per key tile computes dK and dV
  (streaming Q, dO), and one pass per query tile computes dQ (streaming K, V). Each
  output element is written by exactly one program: no atomics, so the backward is
  deterministic too.
* the gradient of attn_bias, when it requires one, is dS = P * (dP - delta) summed over
  the dims the bias broadcasts over. A bias without a query dim (key padding) is summed
  over the queries inside the dK/dV pass, into (B, H, N); any other bias gets dS whole,
  (B, H, M, N) in fp32, written by the dQ pass, then summed on the host. These variants
  (`dkdv_dbias`, `dq_dbias`) hold more registers and have their own tile candidates.
* causal (row i sees key j iff j <= i + causal_offset) and a key bias's length decide
  which tiles each program visits: tiles that need no mask run first in a loop of their
  own, the masked ones (the diagonal band, the last keys or rows) in a second, and the
  tiles no row can see are never loaded (_row_range, and the dK/dV kernel's bounds).
* on sm_90 the tiles a loop streams come through TMA (host-side tensor descriptors)
  when every tensor is 16-byte aligned, through pointers otherwise (_load_stream).

Head dims are cut into at most two power-of-two pieces 256 >= D0 >= D1 >= 16, each its
own dot (limits.split_head_dim: 40 = 32 + 16, 80 = 64 + 16, 160 = 128 + 32,
320 = 256 + 64, 512 = 256 + 256), rather than padded to the next power of two;
limits.py tabulates the waste against FlashAttention-2/3. Head dim 8 still pays 50%: a
tensor-core dot cannot reduce over fewer than 16.

Everything else the callers of a diffusion model produce:

* M and N from 1 up, any remainder: full tiles run without bounds checks and the last
  masked tile handles the remainder.
* attn_bias broadcastable to (B, H, M, N), in float32 (a bool or 16-bit bias is converted
  once, in its own shape), read through its strides (0 on broadcast dims); a key-padding
  bias (stride 0 over queries) is loaded as one row per tile, or not at all when it is a
  0 / -inf mask (then it is a length). A row that sees no key (all -inf, or none under a
  negative causal offset) outputs zeros (LSE -inf); a huge finite mask acts as in float64.
* q, k, v, dO with any strides as long as the last dim is contiguous (the (B, N, H, D)
  storage that a diffusers processor produces, viewed as (B, H, N, D)).
* 64-bit offsets: batch, head and tile-start offsets are computed in int64, so tensors
  beyond 2**31 elements index correctly; offsets inside a tile stay 32-bit.
* fp32 inputs are multiplied in true fp32 (input_precision="ieee") unless the caller
  allows tf32. Those dots run on FMA units, not tensor cores, with their own smaller
  tiles (16 query rows, Q / K / V reloaded per tile) so that they do not spill
  registers either (see _FP32).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.utils._python_dispatch import _get_current_dispatch_mode
from triton.tools.tensor_descriptor import TensorDescriptor

LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2): log(x) == log2(x) * LN2

from . import devices, limits
from .limits import (  # noqa: F401 - re-exported: the limits live in limits.py only
    MAX_GRID_YZ,
    MAX_HEAD_DIM,
    MIN_HEAD_DIM,
    _next_pow2,
    attention_flops,
    input_problems,
    padded_head_dim,
    padding_waste,
    split_head_dim,
)

# Triton's interpreter runs the same kernels on CPU tensors (for tests and debugging).
# It must be chosen before this module defines its kernels, like triton itself does.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# =====================================================================================
# Kernels
# =====================================================================================

# Bias kinds the kernels specialise on (the BIAS constexpr).
NO_BIAS, KEY_BIAS, FULL_BIAS = 0, 1, 2


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr):
    """acc + a @ b with fp32 accumulation.

    EMULATE_BF16 is set only by the launcher under TRITON_INTERPRET=1 for bf16 inputs:
    the interpreter multiplies bf16 tensors as their raw uint16 bit patterns. Every bf16
    value is exact in fp32, so an fp32 dot of the widened operands computes the same
    products a bf16 tensor-core dot accumulates in fp32. Compiled kernels never take
    this branch (it is a constexpr, eliminated at compile time).
    """
    if EMULATE_BF16:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc, input_precision=PRECISION)
    return out


@triton.jit
def _load_tile(base, offs_r, offs_c, stride_r, rows_left, COL_LIMIT: tl.constexpr,
               MASK_R: tl.constexpr, MASK_C: tl.constexpr, ALIGN: tl.constexpr):
    """Load base[r, c] for r in offs_r, c in offs_c (last dim contiguous), zeros outside.

    base already points at the tile's first row (int64 arithmetic); offs_r are offsets
    inside the tile, so the 32-bit products offs_r * stride_r stay small. MASK_R / MASK_C
    are constexprs so that full tiles carry no bounds checks at all. ALIGN: a power of
    two that divides stride_r (and base's offset), checked by the launcher; with it the
    compiler can use vector loads.
    """
    ptrs = base + tl.multiple_of(offs_r * stride_r, ALIGN)[:, None] + offs_c[None, :]
    if MASK_R:
        if MASK_C:
            x = tl.load(ptrs, mask=(offs_r[:, None] < rows_left) & (offs_c[None, :] < COL_LIMIT), other=0.0)
        else:
            x = tl.load(ptrs, mask=offs_r[:, None] < rows_left, other=0.0)
    else:
        if MASK_C:
            x = tl.load(ptrs, mask=offs_c[None, :] < COL_LIMIT, other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _check_tiles(HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Compile-time checks of the tile shapes every attention kernel assumes."""
    tl.static_assert(D0 >= 16 and D0 <= 256 and (D0 & (D0 - 1)) == 0, "D0 must be a power of two in [16, 256]")
    tl.static_assert(D1 == 0 or (D1 >= 16 and D1 <= D0 and (D1 & (D1 - 1)) == 0),
                     "D1 must be 0 or a power of two in [16, D0]")
    tl.static_assert(D0 + D1 >= HEAD_DIM, "the pieces must cover the head dim")
    tl.static_assert(BLOCK_M >= 16 and (BLOCK_M & (BLOCK_M - 1)) == 0, "BLOCK_M: power of two >= 16")
    tl.static_assert(BLOCK_N >= 16 and (BLOCK_N & (BLOCK_N - 1)) == 0, "BLOCK_N: power of two >= 16")


@triton.jit
def _tile_offsets(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr):
    """(offs_m, offs_n, offs_d0, offs_d1): offsets inside a tile of queries, of keys, and
    of the two head-dim pieces (the second is the first again when there is one piece: a
    placeholder, never read)."""
    offs_d0 = tl.arange(0, D0)
    if D1 > 0:
        offs_d1 = D0 + tl.arange(0, D1)
    else:
        offs_d1 = offs_d0
    return tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_N), offs_d0, offs_d1


@triton.jit
def _zeros_pieces(ROWS: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr, PIECE: tl.constexpr):
    """fp32 accumulators for the head-dim pieces of ROWS rows a program computes (PIECE:
    -1 both, 0 or 1 that one, 2 none); [1, 1] placeholders for the others."""
    if PIECE == -1 or PIECE == 0:
        x0 = tl.zeros([ROWS, D0], dtype=tl.float32)
    else:
        x0 = tl.zeros([1, 1], dtype=tl.float32)
    if D1 > 0 and (PIECE == -1 or PIECE == 1):
        x1 = tl.zeros([ROWS, D1], dtype=tl.float32)
    else:
        x1 = tl.zeros([1, 1], dtype=tl.float32)
    return x0, x1


@triton.jit
def _load_pieces(base, offs_r, offs_d0, offs_d1, stride_r, rows_left, HEAD_DIM: tl.constexpr,
                 D0: tl.constexpr, D1: tl.constexpr, MASK_R: tl.constexpr, ALIGN: tl.constexpr):
    """Both head-dim pieces of a tile through pointers (_load_tile each); the second is
    the first again when there is one piece (a placeholder, never read)."""
    x0 = _load_tile(base, offs_r, offs_d0, stride_r, rows_left, HEAD_DIM, MASK_R, D0 > HEAD_DIM, ALIGN)
    if D1 > 0:
        x1 = _load_tile(base, offs_r, offs_d1, stride_r, rows_left, HEAD_DIM, MASK_R, D0 + D1 > HEAD_DIM, ALIGN)
    else:
        x1 = x0
    return x0, x1


@triton.jit
def _load_stream(src, b, h, start, offs_r, offs_d0, offs_d1, rows_left,
                 HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr, MASK_R: tl.constexpr,
                 ALIGN: tl.constexpr, TMA: tl.constexpr):
    """Both head-dim pieces of the tile of rows start.. of batch b, head h.

    src = (desc0, desc1, base, stride_r). TMA: through the tensor descriptors desc0 /
    desc1 that the launcher built over the whole (B, H, L, HEAD_DIM) tensor with boxes
    (1, 1, rows, D0) and (1, 1, rows, D1): one bulk copy per piece, no per-thread
    addresses, and the copy engine fills rows past L and columns past HEAD_DIM with
    zeros. Otherwise through pointers from base, which points at row 0 of (b, h)."""
    desc0, desc1, base, stride_r = src
    if TMA:
        x0 = desc0.load([b, h, start, 0])
        x0 = x0.reshape(x0.shape[2], x0.shape[3])
        if D1 > 0:
            x1 = desc1.load([b, h, start, D0])
            x1 = x1.reshape(x1.shape[2], x1.shape[3])
        else:
            x1 = x0
    else:
        base = base + tl.multiple_of(tl.cast(start, tl.int64) * stride_r, ALIGN)
        x0, x1 = _load_pieces(base, offs_r, offs_d0, offs_d1, stride_r, rows_left, HEAD_DIM, D0, D1, MASK_R, ALIGN)
    return x0, x1


@triton.jit
def _held_pieces(src, b, h, start, offs_r, offs_d0, offs_d1, rows_left,
                 HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr,
                 ALIGN: tl.constexpr, TMA: tl.constexpr, RELOAD: tl.constexpr):
    """The tile a program holds through its loop (rows masked): loaded now, or [1, 1]
    placeholders when the loop reloads it every iteration (RELOAD)."""
    if RELOAD:
        x0 = tl.zeros([1, 1], dtype=tl.float32)
        x1 = x0
    else:
        x0, x1 = _load_stream(src, b, h, start, offs_r, offs_d0, offs_d1, rows_left, HEAD_DIM, D0, D1, True,
                              ALIGN, TMA)
    return x0, x1


@triton.jit
def _store_tile(base, x, offs_r, offs_c, stride_r, rows_left, COL_LIMIT: tl.constexpr, MASK_C: tl.constexpr,
                ALIGN: tl.constexpr):
    """Store x to base[r, c], rows below rows_left (and columns below COL_LIMIT)."""
    ptrs = base + tl.multiple_of(offs_r * stride_r, ALIGN)[:, None] + offs_c[None, :]
    if MASK_C:
        tl.store(ptrs, x, mask=(offs_r[:, None] < rows_left) & (offs_c[None, :] < COL_LIMIT))
    else:
        tl.store(ptrs, x, mask=offs_r[:, None] < rows_left)


@triton.jit
def _store_pieces(base, x0, x1, offs_r, offs_d0, offs_d1, stride_r, rows_left, HEAD_DIM: tl.constexpr,
                  D0: tl.constexpr, D1: tl.constexpr, ALIGN: tl.constexpr, PIECE: tl.constexpr):
    """Store the head-dim pieces of a tile a program computed (PIECE as in
    _zeros_pieces), already in the output dtype."""
    if PIECE == -1 or PIECE == 0:
        _store_tile(base, x0, offs_r, offs_d0, stride_r, rows_left, HEAD_DIM, D0 > HEAD_DIM, ALIGN)
    if D1 > 0 and (PIECE == -1 or PIECE == 1):
        _store_tile(base, x1, offs_r, offs_d1, stride_r, rows_left, HEAD_DIM, D0 + D1 > HEAD_DIM, ALIGN)


@triton.jit
def _load_bias(bs, start_m, start_n, offs_m, offs_n, m_left, n_left,
               BIAS: tl.constexpr, MASK_M: tl.constexpr, MASK_N: tl.constexpr,
               BIAS_ALIGN: tl.constexpr, BIAS_CONTIG: tl.constexpr):
    """The bias tile [len(offs_m), len(offs_n)] at (start_m, start_n), in fp32, 0 outside.

    bs = (base, stride_bm, stride_bn), base at the program's (b, h). BIAS == KEY_BIAS:
    the bias does not depend on the query (key padding, stride 0 over M): one row is
    loaded and broadcast, not BLOCK_M copies of it. BIAS_CONTIG: stride_bn is 1 (vector
    loads along keys); BIAS_ALIGN divides stride_bm.
    """
    base, stride_bm, stride_bn = bs
    base = base + tl.cast(start_m, tl.int64) * stride_bm + tl.cast(start_n, tl.int64) * stride_bn
    if BIAS_CONTIG:
        col_off = offs_n
    else:
        col_off = offs_n * stride_bn
    if BIAS == 1:
        ptrs = base + col_off
        if MASK_N:
            b = tl.load(ptrs, mask=offs_n < n_left, other=0.0)
        else:
            b = tl.load(ptrs)
        b = b[None, :]
    else:
        ptrs = base + tl.multiple_of(offs_m * stride_bm, BIAS_ALIGN)[:, None] + col_off[None, :]
        if MASK_M:
            if MASK_N:
                b = tl.load(ptrs, mask=(offs_m[:, None] < m_left) & (offs_n[None, :] < n_left), other=0.0)
            else:
                b = tl.load(ptrs, mask=offs_m[:, None] < m_left, other=0.0)
        else:
            if MASK_N:
                b = tl.load(ptrs, mask=offs_n[None, :] < n_left, other=0.0)
            else:
                b = tl.load(ptrs)
    return b.to(tl.float32)


@triton.jit
def _row_range(row0, rows, M, N, n_keys, OFF, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """(n_unmasked, n_hi) for query rows row0 .. row0 + rows - 1: key tiles [0, n_unmasked)
    need no mask, [n_unmasked, n_hi) are masked, keys from n_hi on are skipped.

    n_keys: the keys that can be visible at all (N, or fewer for a key-padding bias:
    past a row's last unmasked key every score is -inf and the tile is not computed).
    CAUSAL: row i sees key j iff j <= i + OFF; the last row sees keys below
    row_end + OFF, and keys up to row0 + OFF are seen by every row."""
    n_hi = n_keys
    if CAUSAL:
        row_end = tl.minimum(row0 + rows, M)
        n_hi = tl.minimum(n_hi, tl.maximum(row_end + OFF, 0))
        n_unmasked = tl.minimum(n_hi, tl.maximum(row0 + OFF + 1, 0))
    else:
        n_unmasked = n_hi
    return (n_unmasked // BLOCK_N) * BLOCK_N, n_hi


@triton.jit
def _key_bias_info(Lens, Plain, b, h, stride_lb, stride_lh, N, BIAS: tl.constexpr):
    """(keys that can be visible, whether the bias reads as zero) of one (batch, head).

    KEY_BIAS: keys from Lens[b, h] on are -inf in every row (the launcher measured it),
    and Plain[b, h] != 0 when the bias is 0 on every key before that: a key-padding
    mask, which is then nothing but a length and is never loaded (the callers run
    their loops of no bias: `if BIAS == 0 or plain`, a branch on a value for a key
    bias, taken by the whole program, and decided at compile time otherwise)."""
    if BIAS == 1:
        n_keys = tl.minimum(N, tl.load(Lens + b * stride_lb + h * stride_lh))
        plain = tl.load(Plain + b * stride_lb + h * stride_lh) != 0
    else:
        n_keys = N
        plain = BIAS == 0
    return n_keys, plain


@triton.jit
def _causal_keep(offs_m, offs_n, n_left, diag, CAUSAL: tl.constexpr):
    """Which scores of a masked [queries, keys] tile are seen: keys below n_left, and
    with CAUSAL, key offs_n[j] by row offs_m[i] iff offs_n[j] - offs_m[i] <= diag. One
    compare per score: row i sees the keys below min(n_left, diag + i + 1)."""
    if CAUSAL:
        keep = offs_n[None, :] < tl.minimum(diag + 1 + offs_m, n_left)[:, None]
    else:
        keep = offs_n[None, :] < n_left
    return keep


@triton.jit
def _fwd_tile(acc0, acc1, m_i, l_i, qs, kv, bs, geo, scales, b, h, row0, start_n, m_left, n_left, diag,
              HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr,
              BIAS: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
              ALIGN: tl.constexpr, BIAS_ALIGN: tl.constexpr, BIAS_CONTIG: tl.constexpr,
              PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr, RELOAD: tl.constexpr, TMA: tl.constexpr):
    """One K/V tile of the online softmax: update (acc, m, l) for the program's queries.

    qs = (q0, q1, q source), kv = (k source, v source), bs = bias (see _load_bias),
    geo = _tile_offsets, scales = (qk_scale, sm_scale). MASK: keys from n_left on are
    masked, and with CAUSAL the keys past the diagonal (_causal_keep). RELOAD: load the
    Q tile here, every iteration (from L1/L2), instead of holding it in registers across
    the loop: fewer registers at large head dims (see CONFIGS).

    Units. Without a bias, m is the row max in base-2 units and the scale is folded in:
    the max is taken on the raw q.k (a scale >= 0 keeps the order; the launcher makes
    it so) and p = exp2(s * qk_scale - m) is one FFMA per score (masked tiles scale
    before masking, one instruction more). A bias stays in natural units,
    s = q.k * sm_scale + bias, m too, and p = exp2((s - m) * log2(e)): the subtraction
    comes first, so a huge finite bias (float32's min, a common "minus infinity") never
    overflows to -inf and never turns a row that float64 averages into zeros.
    """
    q0, q1, q_src = qs
    k_src, v_src = kv
    offs_m, offs_n, offs_d0, offs_d1 = geo
    qk_scale, sm_scale = scales
    if RELOAD:
        q0, q1 = _load_stream(q_src, b, h, row0, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, True, ALIGN,
                              False)
    k0, k1 = _load_stream(k_src, b, h, start_n, offs_n, offs_d0, offs_d1, n_left, HEAD_DIM, D0, D1, MASK, ALIGN, TMA)
    s = _dot(q0, tl.trans(k0), tl.zeros([q0.shape[0], k0.shape[0]], dtype=tl.float32), PRECISION, EMULATE_BF16)
    if D1 > 0:
        s = _dot(q1, tl.trans(k1), s, PRECISION, EMULATE_BF16)
    if BIAS != 0:
        # Rows beyond M are masked (a full bias has no memory there); key columns only
        # in masked tiles.
        s = s * sm_scale + _load_bias(bs, row0, start_n, offs_m, offs_n, m_left, n_left,
                                      BIAS, True, MASK, BIAS_ALIGN, BIAS_CONTIG)
    elif MASK:
        s = s * qk_scale  # masked tiles scale first: -inf * qk_scale is NaN when the scale is 0
    if MASK:
        s = tl.where(_causal_keep(offs_m, offs_n, n_left, diag, CAUSAL), s, float("-inf"))

    # Online softmax. A row that has seen only -inf keeps m = -inf; exponentiate
    # against 0 instead so that exp2(-inf - -inf) never makes a NaN: its p and alpha
    # are 0, and its l stays 0.
    if BIAS != 0:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2((m_i - m_ref) * 1.4426950408889634)
        p = tl.math.exp2((s - m_ref[:, None]) * 1.4426950408889634)
    elif not MASK:
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_ref)
        p = tl.math.exp2(s * qk_scale - m_ref[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_ref)
        p = tl.math.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)

    # acc = acc * alpha + p @ v; p is rounded to the input dtype for the tensor-core dot,
    # as in FlashAttention (a no-op for fp32 inputs).
    v0, v1 = _load_stream(v_src, b, h, start_n, offs_n, offs_d0, offs_d1, n_left, HEAD_DIM, D0, D1, MASK, ALIGN, TMA)
    acc0 = _dot(p.to(v0.dtype), v0, acc0 * alpha[:, None], PRECISION, EMULATE_BF16)
    if D1 > 0:
        acc1 = _dot(p.to(v1.dtype), v1, acc1 * alpha[:, None], PRECISION, EMULATE_BF16)
    return acc0, acc1, m_new, l_i


@triton.jit
def _fwd_loops(acc0, acc1, m_i, l_i, qs, kv, bs, geo, scales, b, h, row0, OFF, n_unmasked, n_hi, m_left,
               HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr, BLOCK_N: tl.constexpr,
               BIAS: tl.constexpr, CAUSAL: tl.constexpr,
               ALIGN: tl.constexpr, BIAS_ALIGN: tl.constexpr, BIAS_CONTIG: tl.constexpr,
               PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr, RELOAD: tl.constexpr, TMA: tl.constexpr,
               WARP_SPEC: tl.constexpr):
    """The key tiles that need no mask, then the masked ones (the diagonal band, the
    last keys); tiles above the diagonal or past the last live key are never loaded.

    WARP_SPEC marks the unmasked loop for Triton's automatic warp specialization. The
    launcher leaves it off: with triton 3.9 on sm_90 it compiles to the same machine
    code (8 warps) or fails to compile (4 warps); the static report checks it again on
    every run (python -m attnkit.kernels.inspect)."""
    for start_n in tl.range(0, n_unmasked, BLOCK_N, warp_specialize=WARP_SPEC):
        acc0, acc1, m_i, l_i = _fwd_tile(
            acc0, acc1, m_i, l_i, qs, kv, bs, geo, scales, b, h, row0, start_n, m_left, n_hi - start_n,
            row0 + OFF - start_n, HEAD_DIM, D0, D1, BIAS, False, CAUSAL, ALIGN, BIAS_ALIGN, BIAS_CONTIG,
            PRECISION, EMULATE_BF16, RELOAD, TMA)
    for start_n in range(n_unmasked, n_hi, BLOCK_N):
        acc0, acc1, m_i, l_i = _fwd_tile(
            acc0, acc1, m_i, l_i, qs, kv, bs, geo, scales, b, h, row0, start_n, m_left, n_hi - start_n,
            row0 + OFF - start_n, HEAD_DIM, D0, D1, BIAS, True, CAUSAL, ALIGN, BIAS_ALIGN, BIAS_CONTIG,
            PRECISION, EMULATE_BF16, RELOAD, TMA)
    return acc0, acc1, m_i, l_i


@triton.jit
def _attn_fwd(
    Q, K, V, KD0, KD1, VD0, VD1, Bias, Lens, Plain, Out, Lse, LseShift, OutLo,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_bb, stride_bh, stride_bm, stride_bn,
    stride_lb, stride_lh,
    stride_ob, stride_oh, stride_om,
    H, M, N, OFF, qk_scale, sm_scale,
    M_KEY, N_KEY,  # autotuning keys only (lengths rounded to powers of two)
    HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BIAS: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr,
    ALIGN: tl.constexpr, BIAS_ALIGN: tl.constexpr, BIAS_CONTIG: tl.constexpr,
    PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr, RELOAD: tl.constexpr,
    STORE_LO: tl.constexpr, WARP_SPEC: tl.constexpr = False,
):
    """Grid (cdiv(M, BLOCK_M), H, B): one program per BLOCK_M query rows of one head.

    Row statistics: the row's natural log-sum-exp is LseShift + Lse * ln(2). Without a
    bias Lse is the whole base-2 LSE (and LseShift is not written); with one, LseShift
    is the row max in natural units and Lse the base-2 log of the row's sum relative to
    it: with a huge finite bias (float32's min) the sum is not representable next to the
    max, and the backward needs both (see _row_stats).

    STORE_LO (16-bit outputs that a backward will need): also write what rounding the
    output to its dtype lost, OutLo = (O - O.to(dtype)).to(dtype), with Out's strides,
    so that the backward's delta = rowsum(dO * O) sees O to about 16 more bits."""
    _check_tiles(HEAD_DIM, D0, D1, BLOCK_M, BLOCK_N)
    b = tl.program_id(2)
    h = tl.program_id(1)
    row0 = tl.program_id(0) * BLOCK_M
    m_left = M - row0
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    geo = _tile_offsets(BLOCK_M, BLOCK_N, D0, D1)
    offs_m, offs_n, offs_d0, offs_d1 = geo

    q_src = (Q, Q, Q + tl.multiple_of(b64 * stride_qb + h64 * stride_qh, ALIGN), stride_qm)
    kv = ((KD0, KD1, K + tl.multiple_of(b64 * stride_kb + h64 * stride_kh, ALIGN), stride_kn),
          (VD0, VD1, V + tl.multiple_of(b64 * stride_vb + h64 * stride_vh, ALIGN), stride_vn))
    bs = (Bias + tl.multiple_of(b64 * stride_bb + h64 * stride_bh, BIAS_ALIGN), stride_bm, stride_bn)
    # The Q tile stays in registers through the loop, unless the tiles reload it.
    q0, q1 = _held_pieces(q_src, b, h, row0, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, ALIGN, False,
                          RELOAD)
    qs = (q0, q1, q_src)
    acc0, acc1 = _zeros_pieces(BLOCK_M, D0, D1, -1)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    n_keys, plain = _key_bias_info(Lens, Plain, b64, h64, stride_lb, stride_lh, N, BIAS)
    n_unmasked, n_hi = _row_range(row0, BLOCK_M, M, N, n_keys, OFF, CAUSAL, BLOCK_N)
    if BIAS == 0 or plain:
        acc0, acc1, m_i, l_i = _fwd_loops(
            acc0, acc1, m_i, l_i, qs, kv, bs, geo, (qk_scale, sm_scale), b, h, row0, OFF, n_unmasked, n_hi, m_left,
            HEAD_DIM, D0, D1, BLOCK_N, 0, CAUSAL, ALIGN, BIAS_ALIGN, BIAS_CONTIG, PRECISION, EMULATE_BF16,
            RELOAD, TMA, WARP_SPEC)
    else:
        acc0, acc1, m_i, l_i = _fwd_loops(
            acc0, acc1, m_i, l_i, qs, kv, bs, geo, (qk_scale, sm_scale), b, h, row0, OFF, n_unmasked, n_hi, m_left,
            HEAD_DIM, D0, D1, BLOCK_N, BIAS, CAUSAL, ALIGN, BIAS_ALIGN, BIAS_CONTIG, PRECISION, EMULATE_BF16,
            RELOAD, TMA, WARP_SPEC)

    # Rows that saw no key have l = 0: they output 0 and their LSE is -inf.
    dead = l_i == 0.0
    inv_l = 1.0 / tl.where(dead, 1.0, l_i)
    row_ok = offs_m < m_left
    stat = (b64 * H + h64) * M + row0 + offs_m
    log2_l = tl.math.log2(tl.where(dead, 1.0, l_i))
    if BIAS == 0:
        tl.store(Lse + stat, tl.where(dead, float("-inf"), m_i + log2_l), mask=row_ok)
    else:
        lse = log2_l
        shift = m_i
        if BIAS == 1:
            # Base 2 where the loop of no bias ran (plain), as without a bias.
            lse = tl.where(plain, m_i + log2_l, log2_l)
            shift = tl.where(plain, 0.0, m_i)
        tl.store(Lse + stat, tl.where(dead, float("-inf"), lse), mask=row_ok)
        tl.store(LseShift + stat, tl.where(dead, 0.0, shift), mask=row_ok)
    o0 = acc0 * inv_l[:, None]
    o1 = acc1 * inv_l[:, None]
    o0_hi = o0.to(Out.dtype.element_ty)
    o1_hi = o1.to(Out.dtype.element_ty)
    out_at = b64 * stride_ob + h64 * stride_oh + row0.to(tl.int64) * stride_om
    _store_pieces(Out + tl.multiple_of(out_at, ALIGN), o0_hi, o1_hi, offs_m, offs_d0, offs_d1, stride_om, m_left,
                  HEAD_DIM, D0, D1, ALIGN, -1)
    if STORE_LO:
        _store_pieces(OutLo + tl.multiple_of(out_at, ALIGN), (o0 - o0_hi.to(tl.float32)).to(Out.dtype.element_ty),
                      (o1 - o1_hi.to(tl.float32)).to(Out.dtype.element_ty), offs_m, offs_d0, offs_d1, stride_om,
                      m_left, HEAD_DIM, D0, D1, ALIGN, -1)


@triton.jit
def _attn_bwd_delta(
    Out, OutLo, DO, Delta,
    stride_ob, stride_oh, stride_om,
    stride_db, stride_dh, stride_dm,
    H, M,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, ALIGN: tl.constexpr,
    HAS_LO: tl.constexpr,
):
    """delta = rowsum(dO * O) in fp32, the softmax-gradient term of every query row.

    HAS_LO: O is Out + OutLo (same strides), the forward's output before and after its
    rounding to 16 bits. delta is subtracted from dP in dS = P * (dP - delta), where the
    two nearly cancel whenever few keys carry the weight: a delta from the rounded O
    alone costs the gradients (of the bias most of all) up to ten times plain torch's
    error in bf16."""
    tl.static_assert(BLOCK_D >= HEAD_DIM, "BLOCK_D must cover the head dim")
    pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    row0 = pid_m.to(tl.int64) * BLOCK_M
    m_left = M - pid_m * BLOCK_M
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = _load_tile(Out + b * stride_ob + h * stride_oh + row0 * stride_om, offs_m, offs_d,
                   stride_om, m_left, HEAD_DIM, True, BLOCK_D > HEAD_DIM, ALIGN)
    do = _load_tile(DO + b * stride_db + h * stride_dh + row0 * stride_dm, offs_m, offs_d,
                    stride_dm, m_left, HEAD_DIM, True, BLOCK_D > HEAD_DIM, ALIGN)
    o = o.to(tl.float32)
    if HAS_LO:
        o += _load_tile(OutLo + b * stride_ob + h * stride_oh + row0 * stride_om, offs_m, offs_d,
                        stride_om, m_left, HEAD_DIM, True, BLOCK_D > HEAD_DIM, ALIGN).to(tl.float32)
    delta = tl.sum(o * do.to(tl.float32), 1)
    tl.store(Delta + (b * H + h) * M + row0 + offs_m, delta, mask=offs_m < m_left)


@triton.jit
def _row_stats(stats, start, offs, rows_left, BIAS: tl.constexpr, MASK: tl.constexpr):
    """(lse, shift, delta) of query rows start + offs for the backward, from
    stats = (Lse, LseShift, Delta) at the program's (b, h): p = exp2(s * qk_scale - lse)
    without a bias, exp2((s - shift) * log2(e) - lse) with one (see _attn_fwd). Rows
    beyond M load lse = +inf and dead rows (lse -inf) become +inf, so that their p is
    exactly 0 instead of exp2(-inf - -inf) = NaN."""
    lse_base, shift_base, delta_base = stats
    if MASK:
        lse = tl.load(lse_base + start + offs, mask=offs < rows_left, other=float("inf"))
        delta = tl.load(delta_base + start + offs, mask=offs < rows_left, other=0.0)
    else:
        lse = tl.load(lse_base + start + offs)
        delta = tl.load(delta_base + start + offs)
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    if BIAS != 0:
        if MASK:
            shift = tl.load(shift_base + start + offs, mask=offs < rows_left, other=0.0)
        else:
            shift = tl.load(shift_base + start + offs)
    else:
        shift = lse  # placeholder, never read
    return lse, shift, delta


@triton.jit
def _dkdv_tile(dk0, dk1, dv0, dv1, db, ks, vs, q_src, do_src, bs, stats, geo, scales, b, h, col0, start_m,
               m_left, n_left, diag,
               HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr,
               BIAS: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
               ALIGN: tl.constexpr, BIAS_ALIGN: tl.constexpr, BIAS_CONTIG: tl.constexpr,
               PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr, RELOAD: tl.constexpr,
               BIAS_GRAD: tl.constexpr, TMA: tl.constexpr, PIECE: tl.constexpr, GRADS: tl.constexpr):
    """One Q/dO tile of the dK/dV pass, computed transposed (keys x queries).

    ks, vs = (piece 0, piece 1, source) of the program's K and V. MASK: query rows from
    m_left on are masked (their lse is +inf), and with CAUSAL the queries before the
    diagonal (key offs_n[j] is visible to query offs_m[i] iff offs_n[j] - offs_m[i] <=
    diag). RELOAD: load the program's K and V tiles here (see _fwd_tile). BIAS_GRAD: add
    dS summed over this tile's queries to db (the gradient of a bias that does not
    depend on the query). Units as in _fwd_tile. PIECE (-1 both head-dim pieces, else
    that one) and GRADS ("dkdv", "dk" or "dv") say which gradients the program
    accumulates (see _attn_bwd_dkdv)."""
    k0, k1, k_src = ks
    v0, v1, v_src = vs
    offs_m, offs_n, offs_d0, offs_d1 = geo
    qk_scale, sm_scale = scales
    if RELOAD:
        # Large head dims: K here, V where dP needs it, neither held across the loop.
        k0, k1 = _load_stream(k_src, b, h, col0, offs_n, offs_d0, offs_d1, n_left, HEAD_DIM, D0, D1, True, ALIGN,
                              False)
    q0, q1 = _load_stream(q_src, b, h, start_m, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, MASK, ALIGN,
                          TMA)
    sT = _dot(k0, tl.trans(q0), tl.zeros([k0.shape[0], q0.shape[0]], dtype=tl.float32), PRECISION, EMULATE_BF16)
    if D1 > 0:
        sT = _dot(k1, tl.trans(q1), sT, PRECISION, EMULATE_BF16)
    lse, shift, delta = _row_stats(stats, start_m, offs_m, m_left, BIAS, MASK)
    if BIAS != 0:
        # The key rows of this tile may run past N (the tile is the program's own and is
        # masked on load); the query columns only in masked tiles.
        sT = sT * sm_scale + tl.trans(_load_bias(bs, start_m, col0, offs_m, offs_n, m_left, n_left,
                                                 BIAS, MASK, True, BIAS_ALIGN, BIAS_CONTIG))
        arg = (sT - shift[None, :]) * 1.4426950408889634 - lse[None, :]
    else:
        arg = sT * qk_scale - lse[None, :]
    if MASK and CAUSAL:
        # Key j is seen by the tile's queries from offs_n[j] - diag on.
        arg = tl.where(offs_m[None, :] >= (offs_n - diag)[:, None], arg, float("-inf"))
    pT = tl.math.exp2(arg)

    do0, do1 = _load_stream(do_src, b, h, start_m, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, MASK, ALIGN,
                            TMA)
    if GRADS != "dk":
        if PIECE != 1:
            dv0 = _dot(pT.to(do0.dtype), do0, dv0, PRECISION, EMULATE_BF16)
        if D1 > 0 and PIECE != 0:
            dv1 = _dot(pT.to(do1.dtype), do1, dv1, PRECISION, EMULATE_BF16)
    if GRADS != "dv":
        if RELOAD:
            v0, v1 = _load_stream(v_src, b, h, col0, offs_n, offs_d0, offs_d1, n_left, HEAD_DIM, D0, D1, True, ALIGN,
                                  False)
        dpT = _dot(v0, tl.trans(do0), tl.zeros([k0.shape[0], q0.shape[0]], dtype=tl.float32), PRECISION,
                   EMULATE_BF16)
        if D1 > 0:
            dpT = _dot(v1, tl.trans(do1), dpT, PRECISION, EMULATE_BF16)
        # dS = P * (dP - delta): the gradient of the logits (natural units), which is
        # also the gradient of an additive bias; the scale of dK is applied once at the end.
        dsT = pT * (dpT - delta[None, :])
        if BIAS_GRAD:
            db += tl.sum(dsT, 1)
        dsT = dsT.to(q0.dtype)
        if PIECE != 1:
            dk0 = _dot(dsT, q0, dk0, PRECISION, EMULATE_BF16)
        if D1 > 0 and PIECE != 0:
            dk1 = _dot(dsT, q1, dk1, PRECISION, EMULATE_BF16)
    return dk0, dk1, dv0, dv1, db


@triton.jit
def _dkdv_loops(dk0, dk1, dv0, dv1, db, ks, vs, q_src, do_src, bs, stats, geo, scales, b, h, col0, OFF,
                m_lo, m_unmasked, m_full, m_hi, n_left,
                HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr, BLOCK_M: tl.constexpr,
                BIAS: tl.constexpr, CAUSAL: tl.constexpr,
                ALIGN: tl.constexpr, BIAS_ALIGN: tl.constexpr, BIAS_CONTIG: tl.constexpr,
                PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr, RELOAD: tl.constexpr,
                BIAS_GRAD: tl.constexpr, TMA: tl.constexpr, PIECE: tl.constexpr, GRADS: tl.constexpr):
    """Query tiles [m_unmasked, m_full) unmasked, then [m_lo, m_unmasked) masked (the
    diagonal band) and [max(m_full, m_lo), m_hi) masked (the last rows). The unmasked
    loop comes first in the program: it is the one that runs most."""
    for start_m in range(m_unmasked, m_full, BLOCK_M):
        dk0, dk1, dv0, dv1, db = _dkdv_tile(
            dk0, dk1, dv0, dv1, db, ks, vs, q_src, do_src, bs, stats, geo, scales, b, h, col0, start_m,
            m_hi - start_m, n_left, start_m + OFF - col0, HEAD_DIM, D0, D1, BIAS, False, CAUSAL, ALIGN, BIAS_ALIGN,
            BIAS_CONTIG, PRECISION, EMULATE_BF16, RELOAD, BIAS_GRAD, TMA, PIECE, GRADS)
    for start_m in range(m_lo, m_unmasked, BLOCK_M):
        dk0, dk1, dv0, dv1, db = _dkdv_tile(
            dk0, dk1, dv0, dv1, db, ks, vs, q_src, do_src, bs, stats, geo, scales, b, h, col0, start_m,
            m_hi - start_m, n_left, start_m + OFF - col0, HEAD_DIM, D0, D1, BIAS, True, CAUSAL, ALIGN, BIAS_ALIGN,
            BIAS_CONTIG, PRECISION, EMULATE_BF16, RELOAD, BIAS_GRAD, TMA, PIECE, GRADS)
    for start_m in range(tl.maximum(m_full, m_lo), m_hi, BLOCK_M):
        dk0, dk1, dv0, dv1, db = _dkdv_tile(
            dk0, dk1, dv0, dv1, db, ks, vs, q_src, do_src, bs, stats, geo, scales, b, h, col0, start_m,
            m_hi - start_m, n_left, start_m + OFF - col0, HEAD_DIM, D0, D1, BIAS, True, CAUSAL, ALIGN, BIAS_ALIGN,
            BIAS_CONTIG, PRECISION, EMULATE_BF16, RELOAD, BIAS_GRAD, TMA, PIECE, GRADS)
    return dk0, dk1, dv0, dv1, db


@triton.jit
def _attn_bwd_dkdv(
    Q, K, V, QD0, QD1, DOD0, DOD1, KD0, KD1, VD0, VD1, Bias, Lens, Plain, DO, Lse, LseShift, Delta, DK, DV, DBias,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_bb, stride_bh, stride_bm, stride_bn,
    stride_lb, stride_lh,
    stride_dob, stride_doh, stride_dom,
    stride_dkb, stride_dkh, stride_dkn,
    stride_dvb, stride_dvh, stride_dvn,
    stride_dbb, stride_dbh,
    H, M, N, OFF, qk_scale, sm_scale,
    M_KEY, N_KEY,
    HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BIAS: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr,
    ALIGN: tl.constexpr, BIAS_ALIGN: tl.constexpr, BIAS_CONTIG: tl.constexpr,
    PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr, RELOAD: tl.constexpr,
    BIAS_GRAD: tl.constexpr, PIECE: tl.constexpr = -1, GRADS: tl.constexpr = "dkdv",
):
    """Grid (cdiv(N, BLOCK_N), H, B): dK and dV of BLOCK_N keys, streaming the queries
    that see them (with CAUSAL, those from the diagonal on).

    PIECE and GRADS: which head-dim pieces (-1 both, else that one) and which gradients
    ("dkdv", "dk", "dv") this launch computes and stores. Above a head dim of 256 the
    launcher splits the pass into four launches, one per piece and gradient: each holds
    a quarter of the accumulators and recomputes the scores.

    BIAS_GRAD: also write dS summed over all queries, DBias[b, h, n] (contiguous in
    n): the gradient of a bias that does not depend on the query, such as key padding.
    (The dQ kernel writes the gradient of any other bias.)"""
    _check_tiles(HEAD_DIM, D0, D1, BLOCK_M, BLOCK_N)
    b = tl.program_id(2)
    h = tl.program_id(1)
    col0 = tl.program_id(0) * BLOCK_N
    n_left = N - col0
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    geo = _tile_offsets(BLOCK_M, BLOCK_N, D0, D1)
    offs_m, offs_n, offs_d0, offs_d1 = geo

    q_src = (QD0, QD1, Q + tl.multiple_of(b64 * stride_qb + h64 * stride_qh, ALIGN), stride_qm)
    do_src = (DOD0, DOD1, DO + tl.multiple_of(b64 * stride_dob + h64 * stride_doh, ALIGN), stride_dom)
    k_src = (KD0, KD1, K + tl.multiple_of(b64 * stride_kb + h64 * stride_kh, ALIGN), stride_kn)
    v_src = (VD0, VD1, V + tl.multiple_of(b64 * stride_vb + h64 * stride_vh, ALIGN), stride_vn)
    bs = (Bias + tl.multiple_of(b64 * stride_bb + h64 * stride_bh, BIAS_ALIGN), stride_bm, stride_bn)
    stat = (b64 * H + h64) * M
    stats = (Lse + stat, LseShift + stat, Delta + stat)
    # K and V stay in registers through the loop, unless the tiles reload them.
    k0, k1 = _held_pieces(k_src, b, h, col0, offs_n, offs_d0, offs_d1, n_left, HEAD_DIM, D0, D1, ALIGN, TMA, RELOAD)
    v0, v1 = _held_pieces(v_src, b, h, col0, offs_n, offs_d0, offs_d1, n_left, HEAD_DIM, D0, D1, ALIGN, TMA, RELOAD)
    if BIAS_GRAD:
        db = tl.zeros([BLOCK_N], dtype=tl.float32)
    else:
        db = tl.zeros([1], dtype=tl.float32)  # placeholder, never read
    # Placeholder pieces ([1, 1]) for the gradients this launch does not compute.
    dk0, dk1 = _zeros_pieces(BLOCK_N, D0, D1, PIECE if GRADS != "dv" else 2)
    dv0, dv1 = _zeros_pieces(BLOCK_N, D0, D1, PIECE if GRADS != "dk" else 2)

    # The queries that see these keys. Past the last live key (KEY_BIAS) none do. With
    # CAUSAL, query i sees key j iff i >= j - OFF: none before col0 - OFF, all from
    # (the tile's last live key) - OFF on.
    n_keys, plain = _key_bias_info(Lens, Plain, b64, h64, stride_lb, stride_lh, N, BIAS)
    m_hi = tl.where(col0 < n_keys, M, 0)
    m_full = (m_hi // BLOCK_M) * BLOCK_M
    if CAUSAL:
        m_lo = (tl.maximum(col0 - OFF, 0) // BLOCK_M) * BLOCK_M
        last_key = tl.minimum(col0 + BLOCK_N, n_keys) - 1
        m_unmasked = tl.cdiv(tl.maximum(last_key - OFF, 0), BLOCK_M) * BLOCK_M
        m_unmasked = tl.minimum(tl.maximum(m_unmasked, m_lo), m_full)
    else:
        m_lo = 0
        m_unmasked = 0
    ks = (k0, k1, k_src)
    vs = (v0, v1, v_src)
    if BIAS == 0 or plain:
        dk0, dk1, dv0, dv1, db = _dkdv_loops(
            dk0, dk1, dv0, dv1, db, ks, vs, q_src, do_src, bs, stats, geo, (qk_scale, sm_scale), b, h, col0, OFF,
            m_lo, m_unmasked, m_full, m_hi, n_left, HEAD_DIM, D0, D1, BLOCK_M, 0, CAUSAL, ALIGN, BIAS_ALIGN,
            BIAS_CONTIG, PRECISION, EMULATE_BF16, RELOAD, BIAS_GRAD, TMA, PIECE, GRADS)
    else:
        dk0, dk1, dv0, dv1, db = _dkdv_loops(
            dk0, dk1, dv0, dv1, db, ks, vs, q_src, do_src, bs, stats, geo, (qk_scale, sm_scale), b, h, col0, OFF,
            m_lo, m_unmasked, m_full, m_hi, n_left, HEAD_DIM, D0, D1, BLOCK_M, BIAS, CAUSAL, ALIGN, BIAS_ALIGN,
            BIAS_CONTIG, PRECISION, EMULATE_BF16, RELOAD, BIAS_GRAD, TMA, PIECE, GRADS)

    if BIAS == 1:
        # Keys past the last live one have no gradient; the loop of no bias (plain) did
        # not mask them, and each key's row of dK, dV and the bias gradient is its own.
        live = offs_n[:, None] < n_keys - col0
        dk0, dk1, dv0, dv1 = (tl.where(live, dk0, 0.0), tl.where(live, dk1, 0.0), tl.where(live, dv0, 0.0),
                              tl.where(live, dv1, 0.0))
        if BIAS_GRAD:
            db = tl.where(offs_n < n_keys - col0, db, 0.0)
    col0_64 = col0.to(tl.int64)
    if BIAS_GRAD:
        tl.store(DBias + b64 * stride_dbb + h64 * stride_dbh + col0_64 + offs_n, db, mask=offs_n < n_left)
    if GRADS != "dv":
        dk_at = DK + tl.multiple_of(b64 * stride_dkb + h64 * stride_dkh + col0_64 * stride_dkn, ALIGN)
        _store_pieces(dk_at, (dk0 * sm_scale).to(DK.dtype.element_ty), (dk1 * sm_scale).to(DK.dtype.element_ty),
                      offs_n, offs_d0, offs_d1, stride_dkn, n_left, HEAD_DIM, D0, D1, ALIGN, PIECE)
    if GRADS != "dk":
        dv_at = DV + tl.multiple_of(b64 * stride_dvb + h64 * stride_dvh + col0_64 * stride_dvn, ALIGN)
        _store_pieces(dv_at, dv0.to(DV.dtype.element_ty), dv1.to(DV.dtype.element_ty),
                      offs_n, offs_d0, offs_d1, stride_dvn, n_left, HEAD_DIM, D0, D1, ALIGN, PIECE)


@triton.jit
def _dq_tile(dq0, dq1, qs, dos, kv, bs, geo, scales, row_stats, db_src, b, h, row0, start_n, m_left, n_left, diag,
             HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr,
             BIAS: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
             ALIGN: tl.constexpr, BIAS_ALIGN: tl.constexpr, BIAS_CONTIG: tl.constexpr,
             PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr, RELOAD: tl.constexpr,
             BIAS_GRAD: tl.constexpr, TMA: tl.constexpr, PIECE: tl.constexpr):
    """One K/V tile of the dQ pass; MASK, CAUSAL and the units as in _fwd_tile.

    qs, dos = (piece 0, piece 1, source) of the program's Q and dO tiles (loaded here
    with RELOAD), row_stats = (lse, shift, delta) of its rows. BIAS_GRAD: store the dS
    tile (fp32) into db_src = (DBias at the program's rows, row stride), the gradient
    of the bias."""
    q0, q1, q_src = qs
    do0, do1, do_src = dos
    k_src, v_src = kv
    offs_m, offs_n, offs_d0, offs_d1 = geo
    qk_scale, sm_scale = scales
    lse, shift, delta = row_stats
    if RELOAD:
        q0, q1 = _load_stream(q_src, b, h, row0, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, True, ALIGN,
                              False)
        do0, do1 = _load_stream(do_src, b, h, row0, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, True, ALIGN,
                                False)
    k0, k1 = _load_stream(k_src, b, h, start_n, offs_n, offs_d0, offs_d1, n_left, HEAD_DIM, D0, D1, MASK, ALIGN, TMA)
    v0, v1 = _load_stream(v_src, b, h, start_n, offs_n, offs_d0, offs_d1, n_left, HEAD_DIM, D0, D1, MASK, ALIGN, TMA)
    s = _dot(q0, tl.trans(k0), tl.zeros([q0.shape[0], k0.shape[0]], dtype=tl.float32), PRECISION, EMULATE_BF16)
    dp = _dot(do0, tl.trans(v0), tl.zeros([q0.shape[0], k0.shape[0]], dtype=tl.float32), PRECISION, EMULATE_BF16)
    if D1 > 0:
        s = _dot(q1, tl.trans(k1), s, PRECISION, EMULATE_BF16)
        dp = _dot(do1, tl.trans(v1), dp, PRECISION, EMULATE_BF16)
    if BIAS != 0:
        s = s * sm_scale + _load_bias(bs, row0, start_n, offs_m, offs_n, m_left, n_left,
                                      BIAS, True, MASK, BIAS_ALIGN, BIAS_CONTIG)
        arg = (s - shift[:, None]) * 1.4426950408889634 - lse[:, None]
    else:
        arg = s * qk_scale - lse[:, None]
    if MASK:
        arg = tl.where(_causal_keep(offs_m, offs_n, n_left, diag, CAUSAL), arg, float("-inf"))
    p = tl.math.exp2(arg)
    ds = p * (dp - delta[:, None])
    if BIAS_GRAD:
        db_base, stride_dbm = db_src
        db_ptrs = db_base + start_n + offs_m[:, None] * stride_dbm + offs_n[None, :]
        if MASK:
            tl.store(db_ptrs, ds, mask=(offs_m[:, None] < m_left) & (offs_n[None, :] < n_left))
        else:
            tl.store(db_ptrs, ds, mask=offs_m[:, None] < m_left)
    ds = ds.to(k0.dtype)
    if PIECE != 1:
        dq0 = _dot(ds, k0, dq0, PRECISION, EMULATE_BF16)
    if D1 > 0 and PIECE != 0:
        dq1 = _dot(ds, k1, dq1, PRECISION, EMULATE_BF16)
    return dq0, dq1


@triton.jit
def _dq_loops(dq0, dq1, qs, dos, kv, bs, geo, scales, row_stats, db_src, b, h, row0, OFF, n_unmasked, n_hi, m_left,
              HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr, BLOCK_N: tl.constexpr,
              BIAS: tl.constexpr, CAUSAL: tl.constexpr,
              ALIGN: tl.constexpr, BIAS_ALIGN: tl.constexpr, BIAS_CONTIG: tl.constexpr,
              PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr, RELOAD: tl.constexpr,
              BIAS_GRAD: tl.constexpr, TMA: tl.constexpr, PIECE: tl.constexpr):
    """The unmasked key tiles, then the masked ones, as in _fwd_loops."""
    for start_n in range(0, n_unmasked, BLOCK_N):
        dq0, dq1 = _dq_tile(
            dq0, dq1, qs, dos, kv, bs, geo, scales, row_stats, db_src, b, h, row0, start_n, m_left, n_hi - start_n,
            row0 + OFF - start_n, HEAD_DIM, D0, D1, BIAS, False, CAUSAL, ALIGN, BIAS_ALIGN, BIAS_CONTIG,
            PRECISION, EMULATE_BF16, RELOAD, BIAS_GRAD, TMA, PIECE)
    for start_n in range(n_unmasked, n_hi, BLOCK_N):
        dq0, dq1 = _dq_tile(
            dq0, dq1, qs, dos, kv, bs, geo, scales, row_stats, db_src, b, h, row0, start_n, m_left, n_hi - start_n,
            row0 + OFF - start_n, HEAD_DIM, D0, D1, BIAS, True, CAUSAL, ALIGN, BIAS_ALIGN, BIAS_CONTIG,
            PRECISION, EMULATE_BF16, RELOAD, BIAS_GRAD, TMA, PIECE)
    return dq0, dq1


@triton.jit
def _attn_bwd_dq(
    Q, K, V, KD0, KD1, VD0, VD1, Bias, Lens, Plain, DO, Lse, LseShift, Delta, DQ, DBias,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_bb, stride_bh, stride_bm, stride_bn,
    stride_lb, stride_lh,
    stride_dob, stride_doh, stride_dom,
    stride_dqb, stride_dqh, stride_dqm,
    stride_dbb, stride_dbh, stride_dbm,
    H, M, N, OFF, qk_scale, sm_scale,
    M_KEY, N_KEY,
    HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BIAS: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr,
    ALIGN: tl.constexpr, BIAS_ALIGN: tl.constexpr, BIAS_CONTIG: tl.constexpr,
    PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr, RELOAD: tl.constexpr,
    BIAS_GRAD: tl.constexpr, PIECE: tl.constexpr = -1,
):
    """Grid (cdiv(M, BLOCK_M), H, B): dQ of BLOCK_M queries, streaming the keys they see.

    BIAS_GRAD: also write dS itself, DBias[b, h, m, n] (fp32, contiguous in n), the
    gradient of a bias that depends on the query; each element has one writer. Keys a
    row does not see (skipped tiles) get no write: the launcher zeroes DBias first
    when tiles can be skipped."""
    _check_tiles(HEAD_DIM, D0, D1, BLOCK_M, BLOCK_N)
    b = tl.program_id(2)
    h = tl.program_id(1)
    row0 = tl.program_id(0) * BLOCK_M
    m_left = M - row0
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    geo = _tile_offsets(BLOCK_M, BLOCK_N, D0, D1)
    offs_m, offs_n, offs_d0, offs_d1 = geo

    q_src = (Q, Q, Q + tl.multiple_of(b64 * stride_qb + h64 * stride_qh, ALIGN), stride_qm)
    do_src = (DO, DO, DO + tl.multiple_of(b64 * stride_dob + h64 * stride_doh, ALIGN), stride_dom)
    kv = ((KD0, KD1, K + tl.multiple_of(b64 * stride_kb + h64 * stride_kh, ALIGN), stride_kn),
          (VD0, VD1, V + tl.multiple_of(b64 * stride_vb + h64 * stride_vh, ALIGN), stride_vn))
    bs = (Bias + tl.multiple_of(b64 * stride_bb + h64 * stride_bh, BIAS_ALIGN), stride_bm, stride_bn)
    db_src = (DBias + b64 * stride_dbb + h64 * stride_dbh + row0.to(tl.int64) * stride_dbm, stride_dbm)
    # The Q and dO tiles stay in registers through the loop, unless the tiles reload them.
    q0, q1 = _held_pieces(q_src, b, h, row0, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, ALIGN, False,
                          RELOAD)
    do0, do1 = _held_pieces(do_src, b, h, row0, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, ALIGN, False,
                            RELOAD)
    dq0, dq1 = _zeros_pieces(BLOCK_M, D0, D1, PIECE)
    stat = (b64 * H + h64) * M
    row_stats = _row_stats((Lse + stat, LseShift + stat, Delta + stat), row0, offs_m, m_left, BIAS, True)

    n_keys, plain = _key_bias_info(Lens, Plain, b64, h64, stride_lb, stride_lh, N, BIAS)
    n_unmasked, n_hi = _row_range(row0, BLOCK_M, M, N, n_keys, OFF, CAUSAL, BLOCK_N)
    qs = (q0, q1, q_src)
    dos = (do0, do1, do_src)
    if BIAS == 0 or plain:
        dq0, dq1 = _dq_loops(
            dq0, dq1, qs, dos, kv, bs, geo, (qk_scale, sm_scale), row_stats, db_src, b, h, row0, OFF, n_unmasked,
            n_hi, m_left, HEAD_DIM, D0, D1, BLOCK_N, 0, CAUSAL, ALIGN, BIAS_ALIGN, BIAS_CONTIG, PRECISION,
            EMULATE_BF16, RELOAD, BIAS_GRAD, TMA, PIECE)
    else:
        dq0, dq1 = _dq_loops(
            dq0, dq1, qs, dos, kv, bs, geo, (qk_scale, sm_scale), row_stats, db_src, b, h, row0, OFF, n_unmasked,
            n_hi, m_left, HEAD_DIM, D0, D1, BLOCK_N, BIAS, CAUSAL, ALIGN, BIAS_ALIGN, BIAS_CONTIG, PRECISION,
            EMULATE_BF16, RELOAD, BIAS_GRAD, TMA, PIECE)

    dq_at = DQ + tl.multiple_of(b64 * stride_dqb + h64 * stride_dqh + row0.to(tl.int64) * stride_dqm, ALIGN)
    _store_pieces(dq_at, (dq0 * sm_scale).to(DQ.dtype.element_ty), (dq1 * sm_scale).to(DQ.dtype.element_ty),
                  offs_m, offs_d0, offs_d1, stride_dqm, m_left, HEAD_DIM, D0, D1, ALIGN, PIECE)


# =====================================================================================
# Launchers: head-dim pieces, tile configurations, grids
# =====================================================================================
import functools  # noqa: E402 - here, not above the kernels, whose line numbers key Triton's cache
import threading  # noqa: E402


VARIANTS = ("none", "keypad", "full")  # the bias kinds the kernels specialise on
_ALL = frozenset(VARIANTS)
_NK = frozenset({"none", "keypad"})  # what a tile that spills with a full bias serves


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # Reload the loop-invariant operand tiles (Q; K and V in the dK/dV pass) every
    # iteration instead of holding them in registers: for large head dims.
    reload: bool = False
    # The bias variants this tile serves (one that spills with a full bias serves the
    # others only).
    variants: frozenset = _ALL
    # The most main-loop warp instructions per score this entry may compile to, on its
    # target, over the head dims, 16-bit dtypes and variants it serves (None: not
    # gated). `python -m attnkit.kernels.inspect` fails above it.
    budget: Optional[float] = None
    # The causal settings it serves (a tile that spills only with the diagonal's masks
    # serves the unmasked kernel only).
    causal: tuple = (False, True)
    # The loads it serves on sm_90: TMA, and pointers (the fallback for tensors that
    # are not 16-byte aligned, whose address arithmetic holds more registers).
    loads: frozenset = frozenset({"tma", "ptr"})
    # The padded head dims it serves, (lo, hi) inclusive (None: every one of its band):
    # where no tile of a band compiles clean at all of its head dims for some variant.
    dims: Optional[tuple] = None
    # ptxas's register cap per thread (None: its own choice). With 8 warps it often
    # stops at 128 registers and spills; 255 lets such a tile hold what it needs.
    maxnreg: Optional[int] = None

    def __str__(self) -> str:
        r = "-r" if self.reload else ""
        n = f"-reg{self.maxnreg}" if self.maxnreg else ""
        return f"M{self.block_m}-N{self.block_n}-w{self.num_warps}-s{self.num_stages}{r}{n}"


# The autotuning candidates, by target, kernel, input width and head-dim band (the
# smallest bound in _BANDS that holds the padded head dim), each entry with the bias
# variants it serves (default: all) and the causal settings it serves (default: both).
# The first entry that serves a call is its default (the one used without autotuning,
# ATTNKIT_TRITON_AUTOTUNE=0); the lists are ordered by the static report (its fastest-
# looking candidate first). `python -m attnkit.kernels.inspect` compiles every entry for
# its target (sm_80 for "sm80", sm_90 for "sm90") at the head dims of its band, for the
# variants it serves, causal or not, TMA and pointer loads on sm_90, and fails if one
# spills registers, exceeds shared memory, duplicates matrix work or exponentials, or
# compiles to more main-loop instructions per score than its budget (set a few percent
# above what bench/results/static/report.md measured, the worst over its head dims,
# 16-bit dtypes and variants).
# For the dK/dV kernel, block_n is the key tile the program keeps and block_m the query
# tile it streams; for the forward and dQ kernels block_m is kept and block_n streamed.
_C = TileConfig
_N = frozenset({"none"})
_K = frozenset({"keypad"})
_F = frozenset({"full"})
_KF = frozenset({"keypad", "full"})
_UNCAUSAL = (False,)
_CAUSAL = (True,)
_NF = frozenset({"none", "full"})
_TMA = frozenset({"tma"})
_PTR = frozenset({"ptr"})
# fp32 inputs: exact fp32 dots run on FMA units, whose Triton lowering holds whole
# head-dim rows of both operands in registers, so fp32 needs 16-row tiles; M32 tiles spill
# on both targets. Which 16-row tile is clean depends on the variant and head dim in ways
# no rule predicts (M16-N32 on 4 warps with one stage is the fastest forward on sm_80 at
# head dims 40-160, and spills on sm_90 at 256 and above for most variants); the
# forward's lists were searched per variant over reload or not, 4 or 8 warps, one or two
# stages, and so were the backward's where a tile spilled. At head dims 256-512 4-warp
# tiles spill at 255 registers, and ptxas often stops 8-warp tiles at 128 registers and
# spills 8-56 B: those get a register cap of 255 (maxnreg). tf32 (allow_tf32=True) uses
# tensor cores and these tiles too.
# Every shipped tile compiles clean. Where the only clean tiles of an sm80 list need more
# shared memory than GPUs with 99 KiB per block have (the backward in fp32 at 512; 16-bit
# causal dK/dV at 320-512 with key padding and with the bias gradient at 384 with a full
# bias, whose two-stage tiles spill and three-stage ones need 104-166 KB; the rest of
# kernels/devices.py's NEEDS), the default is A100's tile, and the backend refuses those
# calls on the 99 KiB GPUs up front.
# The lists below were chosen from the static report: for each list (target, kernel,
# width, head-dim band) the tiles that compile clean (no spill, no duplicated work, within
# shared memory) at every head dim of the band for a (bias variant, causality, loads)
# serve it, ordered by the static clocks per score (the fastest-looking first); where no
# tile of a band is clean at all its head dims, `dims` splits the band by padded head dim; a
# few full-bias lists have pointer tiles only on sm_90 (those calls run pointer loads)
# or TMA tiles only (misaligned tensors are copied into aligned buffers first). Budgets
# are 5% above the instr/score measured. Figures: bench/results/static/report.md.
CONFIGS: dict[str, dict[str, dict[str, dict[int, tuple[TileConfig, ...]]]]] = {
    "sm80": {
        "fwd": {
            "16bit": {
                64: (_C(64, 64, 4, 3, budget=0.69),),
                96: (_C(128, 32, 8, 3, budget=0.88),),
                128: (_C(128, 32, 8, 3, budget=1.0),),
                192: (_C(64, 32, 4, 2, budget=0.99),),
                256: (_C(32, 32, 4, 2, reload=True, budget=2.15),),
                320: (_C(32, 32, 4, 2, reload=True, variants=_NK, causal=_UNCAUSAL, budget=2.1), _C(32, 32, 4, 2, reload=True, variants=_N, causal=_CAUSAL, budget=2.14), _C(16, 32, 4, 2, reload=True, budget=3.16)),
                384: (_C(16, 32, 4, 2, reload=True, budget=3.58),),
                512: (_C(16, 32, 4, 2, reload=True, variants=_NK, budget=3.3), _C(16, 32, 4, 2, variants=_F, budget=3.53)),
            },
            "32bit": {
                64: (_C(16, 32, 4, 1, reload=True, variants=_NF, budget=7.4), _C(16, 16, 4, 1, reload=True, variants=_K, budget=7.3)),
                96: (_C(16, 16, 4, 1, reload=True, budget=10.8),),
                128: (_C(16, 32, 4, 1, reload=True, budget=12.4),),
                192: (_C(16, 32, 4, 1, reload=True, budget=14.8),),
                256: (_C(16, 16, 4, 1, reload=True, variants=_NF, budget=24.4), _C(16, 32, 8, 2, reload=True, variants=_K, budget=24.3), _C(16, 16, 8, 2, budget=26.2)),
                320: (_C(16, 16, 4, 2, reload=True),),
                384: (_C(16, 16, 4, 1, reload=True, budget=36.3),),
                512: (_C(16, 16, 4, 1, reload=True, budget=45.8),),
            },
        },
        "fwd_lo": {
            "16bit": {
                64: (_C(64, 64, 4, 3, budget=0.69),),
                96: (_C(128, 32, 8, 3, budget=0.88),),
                128: (_C(128, 32, 8, 3, budget=1.0),),
                192: (_C(64, 32, 4, 2, budget=0.99),),
                256: (_C(32, 32, 4, 2, reload=True, budget=2.15),),
                320: (_C(32, 32, 4, 2, reload=True, variants=_NK, causal=_UNCAUSAL, budget=2.1), _C(32, 32, 4, 2, reload=True, variants=_N, causal=_CAUSAL, budget=2.14), _C(16, 32, 4, 2, reload=True, budget=3.16)),
                384: (_C(16, 32, 4, 2, reload=True, budget=3.58),),
                512: (_C(16, 32, 4, 2, reload=True, variants=_NK, budget=3.3), _C(16, 32, 4, 2, variants=_F, budget=3.53)),
            },
            "32bit": {},
        },
        "dkdv": {
            "16bit": {
                64: (_C(32, 128, 8, 3, variants=_F, causal=_CAUSAL, dims=(1, 48), budget=0.84), _C(32, 64, 4, 3, variants=_NK, causal=_UNCAUSAL, budget=0.6), _C(32, 64, 4, 3, variants=_K, causal=_CAUSAL, budget=0.6), _C(32, 128, 8, 3, variants=_NK, budget=0.59), _C(32, 64, 4, 2, variants=_F, causal=_UNCAUSAL, budget=0.85), _C(32, 32, 4, 2, reload=True, variants=_F, causal=_CAUSAL, dims=(49, 64), budget=1.0)),
                96: (_C(32, 64, 4, 3, variants=_K, causal=_UNCAUSAL, dims=(65, 80), budget=0.73), _C(32, 128, 8, 3, variants=_N, causal=_CAUSAL, dims=(65, 80), budget=0.7), _C(32, 64, 4, 3, variants=_F, causal=_UNCAUSAL, budget=0.99), _C(32, 128, 8, 3, variants=_F, causal=_CAUSAL, budget=1.06), _C(32, 64, 4, 2, variants=_N, causal=_UNCAUSAL, budget=0.72), _C(32, 128, 8, 3, variants=_K, causal=_UNCAUSAL, dims=(81, 96), budget=0.79), _C(32, 128, 8, 3, variants=_K, causal=_CAUSAL, dims=(81, 96), budget=0.78), _C(32, 64, 4, 2, variants=_N, causal=_CAUSAL, dims=(81, 96), budget=0.72), _C(16, 64, 4, 2, variants=_K, causal=_CAUSAL, dims=(65, 80), budget=0.71)),
                128: (_C(32, 32, 4, 2, reload=True, causal=_UNCAUSAL, budget=1.38), _C(32, 32, 4, 2, reload=True, variants=_NK, causal=_CAUSAL, budget=1.04), _C(32, 16, 4, 2, reload=True, variants=_F, causal=_CAUSAL, budget=1.79)),
                192: (_C(32, 16, 4, 2, reload=True, budget=2.09),),
                256: (_C(32, 16, 4, 2, reload=True, variants=_NF, causal=_UNCAUSAL, budget=2.79), _C(32, 16, 4, 2, reload=True, variants=_N, causal=_CAUSAL, budget=2.43), _C(32, 16, 4, 1, reload=True, variants=_KF, causal=_CAUSAL, budget=3.02), _C(32, 16, 4, 1, reload=True, variants=_K, causal=_UNCAUSAL, budget=2.57)),
                320: (_C(32, 16, 4, 1, reload=True, budget=3.12),),
                384: (_C(32, 16, 4, 2, reload=True, causal=_UNCAUSAL, budget=3.27), _C(32, 16, 4, 2, reload=True, variants=_N, causal=_CAUSAL, budget=2.97), _C(32, 16, 4, 1, reload=True, variants=_KF, causal=_CAUSAL, budget=3.52)),
                512: (_C(32, 16, 4, 2, reload=True, variants=_NK, causal=_UNCAUSAL, budget=3.11), _C(32, 16, 4, 2, reload=True, variants=_N, causal=_CAUSAL, budget=3.11), _C(32, 16, 4, 3, variants=_K, causal=_CAUSAL, budget=2.79), _C(32, 16, 4, 2, reload=True, variants=_F, causal=_UNCAUSAL), _C(32, 16, 4, 2, reload=True, variants=_F, causal=_CAUSAL)),
            },
            "32bit": {
                64: (_C(16, 32, 8, 2, reload=True, variants=_NF), _C(16, 16, 8, 2, variants=_K, causal=_CAUSAL), _C(16, 16, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL)),
                96: (_C(16, 16, 4, 2, reload=True, variants=_F, causal=_UNCAUSAL), _C(16, 16, 8, 2, variants=_K, causal=_UNCAUSAL), _C(16, 16, 8, 2, reload=True, variants=_N), _C(16, 16, 8, 2, reload=True, variants=_KF, causal=_CAUSAL), _C(16, 16, 8, 2, reload=True, variants=_F, causal=_UNCAUSAL)),
                128: (_C(16, 16, 4, 2, reload=True, variants=_F), _C(16, 16, 4, 2, reload=True, variants=_N, causal=_UNCAUSAL), _C(16, 16, 8, 2, reload=True, variants=_K), _C(16, 16, 8, 2, reload=True, variants=_N, causal=_CAUSAL), _C(16, 16, 8, 2, reload=True, variants=_F), _C(16, 16, 8, 2, reload=True, variants=_N, causal=_UNCAUSAL)),
                192: (_C(16, 32, 8, 2, reload=True, variants=_NF), _C(16, 32, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL), _C(16, 16, 8, 2, reload=True, variants=_K, causal=_CAUSAL), _C(16, 16, 4, 2, reload=True, variants=_N), _C(16, 16, 4, 2, reload=True, variants=_F, causal=_CAUSAL)),
                256: (_C(16, 16, 4, 2, reload=True, variants=_NF, causal=_UNCAUSAL), _C(16, 16, 8, 2, reload=True, variants=_K), _C(16, 16, 8, 2, reload=True, variants=_NF, causal=_CAUSAL)),
                320: (_C(16, 16, 8, 2, reload=True, variants=_K, causal=_CAUSAL, maxnreg=255), _C(16, 16, 8, 2, reload=True, variants=_N, causal=_CAUSAL, maxnreg=255), _C(16, 16, 8, 2, variants=_K, causal=_UNCAUSAL, maxnreg=255), _C(16, 16, 4, 2, reload=True, variants=_NF, causal=_UNCAUSAL), _C(16, 16, 8, 2, reload=True, variants=_F, causal=_CAUSAL)),
                384: (_C(16, 16, 8, 2, reload=True, variants=_K, causal=_CAUSAL, maxnreg=255), _C(16, 16, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL, maxnreg=255), _C(16, 16, 4, 2, reload=True, variants=_NF, causal=_UNCAUSAL), _C(16, 16, 8, 2, reload=True, variants=_NF, causal=_CAUSAL)),
                512: (_C(16, 16, 8, 2, reload=True, variants=_F, causal=_CAUSAL, maxnreg=255), _C(16, 16, 8, 2, variants=_K, causal=_CAUSAL, maxnreg=255), _C(16, 16, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL, maxnreg=255), _C(16, 16, 8, 2, variants=_F, causal=_UNCAUSAL, maxnreg=255), _C(16, 16, 8, 2, variants=_N)),
            },
        },
        "dq": {
            "16bit": {
                64: (_C(64, 32, 4, 3, budget=0.74),),
                96: (_C(64, 32, 4, 3, budget=0.81),),
                128: (_C(64, 64, 8, 2, reload=True, causal=_CAUSAL, budget=1.06), _C(64, 64, 8, 2, reload=True, variants=_NK, causal=_UNCAUSAL, budget=0.66), _C(64, 32, 4, 3, variants=_F, causal=_UNCAUSAL, budget=1.01)),
                192: (_C(64, 32, 4, 3, budget=0.97),),
                256: (_C(16, 32, 4, 2, reload=True, budget=2.22),),
                320: (_C(16, 32, 4, 2, reload=True, budget=2.56),),
                384: (_C(16, 32, 4, 2, reload=True, budget=3.07),),
                512: (_C(16, 32, 4, 2, reload=True, budget=3.05),),
            },
            "32bit": {
                64: (_C(16, 16, 4, 2, reload=True, variants=_NF), _C(16, 16, 4, 2, reload=True, variants=_K, causal=_CAUSAL), _C(16, 32, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL), _C(16, 32, 8, 2, reload=True, variants=_NF), _C(16, 32, 8, 2, reload=True, variants=_K, causal=_CAUSAL), _C(16, 16, 8, 2, reload=True, variants=_NF)),
                96: (_C(16, 32, 8, 2, reload=True, variants=_KF), _C(16, 32, 8, 2, reload=True, variants=_N, causal=_CAUSAL), _C(16, 16, 8, 2, reload=True, variants=_N, causal=_UNCAUSAL), _C(16, 16, 8, 2, reload=True, variants=_F), _C(16, 16, 8, 2, reload=True, variants=_NK, causal=_CAUSAL)),
                128: (_C(16, 32, 8, 2, reload=True), _C(16, 16, 8, 2, reload=True, variants=_NF)),
                192: (_C(16, 16, 4, 2, reload=True, variants=_NF), _C(16, 16, 8, 2, reload=True, variants=_K), _C(16, 16, 8, 2, reload=True, variants=_NF)),
                256: (_C(16, 16, 4, 2, reload=True, variants=_KF, causal=_UNCAUSAL), _C(16, 32, 8, 2, reload=True, variants=_N), _C(16, 32, 8, 2, reload=True, variants=_K, causal=_CAUSAL), _C(16, 16, 8, 2, reload=True, variants=_F, causal=_CAUSAL), _C(16, 16, 4, 2, reload=True, variants=_N, causal=_UNCAUSAL), _C(16, 32, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL)),
                320: (_C(16, 16, 8, 2, reload=True, variants=_K, causal=_CAUSAL, maxnreg=255), _C(16, 16, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL, maxnreg=255), _C(16, 16, 8, 1, reload=True, variants=_F, causal=_CAUSAL, maxnreg=255), _C(16, 16, 4, 2, reload=True, variants=_N, causal=_UNCAUSAL), _C(16, 16, 8, 1, reload=True, variants=_F, causal=_UNCAUSAL), _C(16, 16, 8, 1, reload=True, variants=_N, causal=_CAUSAL)),
                384: (_C(16, 16, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL, maxnreg=255), _C(16, 16, 8, 2, reload=True, variants=_K, causal=_CAUSAL), _C(16, 16, 8, 2, reload=True, variants=_N, causal=_CAUSAL), _C(16, 16, 8, 1, reload=True, variants=_F), _C(16, 16, 8, 1, reload=True, variants=_N, causal=_UNCAUSAL)),
                512: (_C(16, 16, 8, 1, reload=True, variants=_F), _C(16, 16, 8, 2, variants=_NK)),
            },
        },
        "dkdv_dbias": {
            "16bit": {
                64: (_C(32, 64, 4, 3, variants=_F, causal=_CAUSAL, dims=(1, 48), budget=0.89), _C(32, 64, 4, 3, causal=_UNCAUSAL, budget=0.92), _C(32, 64, 4, 3, variants=_K, causal=_CAUSAL, budget=0.65), _C(32, 32, 4, 2, reload=True, variants=_F, causal=_CAUSAL, dims=(49, 64), budget=1.16)),
                96: (_C(32, 64, 4, 3, causal=_UNCAUSAL, budget=1.03), _C(32, 64, 4, 3, variants=_F, causal=_CAUSAL, budget=1.02), _C(32, 64, 4, 3, variants=_K, causal=_CAUSAL, dims=(81, 96), budget=0.83), _C(16, 64, 4, 2, variants=_K, causal=_CAUSAL, dims=(65, 80), budget=0.78)),
                128: (_C(32, 32, 4, 2, reload=True, causal=_UNCAUSAL, budget=1.55), _C(32, 32, 4, 2, reload=True, variants=_K, causal=_CAUSAL, budget=1.27), _C(32, 16, 4, 2, reload=True, variants=_F, causal=_CAUSAL, budget=1.92)),
                192: (_C(32, 16, 4, 2, reload=True, budget=2.24),),
                256: (_C(32, 16, 4, 2, reload=True, causal=_UNCAUSAL, budget=2.96), _C(32, 16, 4, 2, reload=True, variants=_K, causal=_CAUSAL, budget=2.6), _C(32, 16, 4, 1, reload=True, variants=_F, causal=_CAUSAL, budget=3.23)),
                320: (_C(32, 16, 4, 1, reload=True, causal=_UNCAUSAL, budget=3.32), _C(32, 16, 4, 1, reload=True, variants=_F, causal=_CAUSAL, budget=3.33), _C(32, 16, 4, 3, variants=_K, causal=_CAUSAL, budget=2.46)),
                384: (_C(32, 16, 4, 2, reload=True, causal=_UNCAUSAL, budget=3.42), _C(32, 16, 4, 1, reload=True, variants=_K, causal=_CAUSAL, budget=3.29), _C(32, 16, 4, 3, reload=True, variants=_F, causal=_CAUSAL, budget=3.41)),
                512: (_C(32, 16, 4, 2, reload=True, variants=_K, causal=_UNCAUSAL, budget=3.27), _C(32, 32, 4, 2, reload=True, variants=_F, causal=_UNCAUSAL, budget=2.73), _C(32, 16, 4, 3, variants=_K, causal=_CAUSAL, budget=2.96), _C(32, 16, 4, 2, reload=True, variants=_F, causal=_CAUSAL)),
            },
            "32bit": {
                64: (_C(16, 32, 8, 2, reload=True, variants=_F), _C(16, 32, 8, 2, reload=True, variants=_K, causal=_CAUSAL), _C(16, 16, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL)),
                96: (_C(16, 16, 4, 2, reload=True, causal=_UNCAUSAL), _C(16, 16, 8, 2, reload=True, causal=_CAUSAL), _C(16, 16, 8, 2, reload=True, variants=_F, causal=_UNCAUSAL)),
                128: (_C(16, 16, 4, 2, reload=True, variants=_F), _C(16, 16, 8, 2, reload=True, variants=_K), _C(16, 16, 8, 2, reload=True, variants=_F)),
                192: (_C(16, 32, 8, 2, reload=True, variants=_F), _C(16, 32, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL), _C(16, 16, 8, 2, reload=True, variants=_K, causal=_CAUSAL), _C(16, 16, 4, 2, reload=True, variants=_F, causal=_CAUSAL), _C(16, 16, 4, 2, reload=True, variants=_K, causal=_UNCAUSAL)),
                256: (_C(16, 16, 4, 2, reload=True, variants=_F, causal=_UNCAUSAL), _C(16, 16, 8, 2, reload=True, variants=_K), _C(16, 16, 8, 2, reload=True, variants=_F, causal=_CAUSAL)),
                320: (_C(16, 16, 8, 2, variants=_K, causal=_UNCAUSAL, maxnreg=255), _C(16, 16, 4, 2, reload=True, variants=_F, causal=_UNCAUSAL), _C(16, 16, 8, 2, reload=True, causal=_CAUSAL)),
                384: (_C(16, 16, 4, 2, reload=True, variants=_F, causal=_UNCAUSAL), _C(16, 16, 8, 2, reload=True, variants=_K), _C(16, 16, 8, 2, reload=True, variants=_F, causal=_CAUSAL)),
                512: (_C(16, 16, 8, 2, variants=_K, causal=_CAUSAL, maxnreg=255), _C(16, 16, 8, 2, variants=_F, causal=_UNCAUSAL, maxnreg=255), _C(16, 16, 8, 2, reload=True, variants=_F, causal=_CAUSAL), _C(16, 16, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL)),
            },
        },
        "dq_dbias": {
            "16bit": {
                64: (_C(64, 32, 4, 3, budget=0.97),),
                96: (_C(64, 32, 4, 3, budget=1.07),),
                128: (_C(64, 64, 8, 2, reload=True, variants=_K, budget=0.99), _C(32, 32, 4, 2, reload=True, variants=_F, budget=1.51)),
                192: (_C(16, 32, 4, 2, reload=True, budget=2.0),),
                256: (_C(16, 32, 4, 2, reload=True, budget=2.61),),
                320: (_C(16, 32, 4, 2, reload=True, budget=3.1),),
                384: (_C(16, 32, 4, 2, reload=True, variants=_K, budget=3.44), _C(16, 32, 4, 2, variants=_F, budget=3.15)),
                512: (_C(16, 32, 4, 2, reload=True, variants=_K, budget=3.56), _C(16, 32, 4, 2, reload=True, variants=_F, causal=_UNCAUSAL), _C(16, 32, 4, 2, reload=True, variants=_F, causal=_CAUSAL)),
            },
            "32bit": {
                64: (_C(16, 16, 4, 2, reload=True, variants=_F), _C(16, 16, 4, 2, reload=True, variants=_K, causal=_CAUSAL), _C(16, 32, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL), _C(16, 32, 8, 2, reload=True, variants=_F), _C(16, 32, 8, 2, reload=True, variants=_K, causal=_CAUSAL), _C(16, 16, 8, 2, reload=True)),
                96: (_C(16, 32, 8, 2, reload=True), _C(16, 16, 8, 2, reload=True)),
                128: (_C(16, 32, 8, 2, reload=True), _C(16, 16, 8, 2, reload=True)),
                192: (_C(16, 16, 8, 2, reload=True), _C(16, 16, 4, 2, reload=True)),
                256: (_C(16, 16, 4, 2, reload=True), _C(16, 16, 8, 2, reload=True)),
                320: (_C(16, 16, 4, 2, reload=True, variants=_K, causal=_CAUSAL), _C(16, 16, 8, 2, reload=True, variants=_F), _C(16, 16, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL)),
                384: (_C(16, 16, 8, 2, reload=True),),
                512: (_C(16, 16, 8, 2),),
            },
        },
    },
    "sm90": {
        "fwd": {
            "16bit": {
                64: (_C(128, 128, 8, 2, variants=_NK, budget=0.31), _C(128, 64, 8, 2, variants=_F, causal=_CAUSAL, loads=_PTR), _C(128, 64, 8, 3, loads=_TMA, budget=0.71), _C(128, 32, 8, 3, variants=_F, causal=_UNCAUSAL, loads=_PTR)),
                96: (_C(128, 128, 8, 2, variants=_NK, loads=_TMA, budget=0.33), _C(128, 128, 8, 2, variants=_N, causal=_CAUSAL, loads=_PTR), _C(64, 64, 4, 2, budget=0.6)),
                128: (_C(128, 128, 8, 2, loads=_TMA, budget=0.43), _C(128, 64, 8, 2, variants=_NK, budget=0.4), _C(128, 32, 8, 3, budget=0.97)),
                192: (_C(128, 128, 8, 2, variants=_NK, loads=_TMA, budget=0.36), _C(64, 64, 4, 2, variants=_N, loads=_PTR), _C(128, 32, 8, 2, budget=0.96)),
                256: (_C(128, 64, 8, 2, variants=_NK, loads=_TMA, budget=0.52), _C(128, 32, 8, 2, variants=_NK, loads=_PTR), _C(128, 32, 8, 2, loads=_TMA, budget=1.24), _C(16, 32, 4, 2, reload=True, variants=_F, loads=_PTR)),
                320: (_C(32, 32, 4, 2, reload=True, loads=_TMA, budget=2.41), _C(16, 32, 4, 2, reload=True, variants=_NK, loads=_PTR)),
                384: (_C(32, 32, 4, 2, reload=True, variants=_NK, loads=_TMA, budget=2.22), _C(16, 32, 4, 2, reload=True, loads=_TMA, budget=3.47), _C(16, 32, 4, 1, reload=True, variants=_NK, loads=_PTR)),
                512: (_C(16, 32, 4, 2, reload=True, variants=_NK, loads=_PTR), _C(16, 32, 4, 2, reload=True, loads=_TMA, budget=3.93)),
            },
            "32bit": {
                64: (_C(16, 32, 4, 1, reload=True, budget=7.2),),
                96: (_C(16, 16, 4, 2, reload=True), _C(16, 16, 8, 2, reload=True)),
                128: (_C(16, 16, 4, 2, reload=True), _C(16, 16, 8, 2, reload=True)),
                192: (_C(16, 16, 4, 2, reload=True), _C(16, 16, 8, 2, reload=True)),
                256: (_C(16, 32, 8, 2, budget=25.0),),
                320: (_C(16, 16, 4, 1, reload=True, budget=30.7),),
                384: (_C(16, 32, 8, 2, variants=_N, budget=36.8), _C(16, 32, 8, 2, variants=_K, causal=_UNCAUSAL, budget=36.6), _C(16, 16, 8, 2, budget=40.6)),
                512: (_C(16, 32, 8, 2, budget=46.5),),
            },
        },
        "fwd_lo": {
            "16bit": {
                64: (_C(128, 128, 8, 2, variants=_NK, budget=0.31), _C(128, 64, 8, 2, causal=_CAUSAL, loads=_PTR), _C(128, 64, 8, 3, loads=_TMA, budget=0.71), _C(128, 32, 8, 3, budget=0.83)),
                96: (_C(128, 128, 8, 2, variants=_NK, loads=_TMA, budget=0.33), _C(128, 128, 8, 2, variants=_N, causal=_CAUSAL, loads=_PTR), _C(64, 64, 4, 2, budget=0.6)),
                128: (_C(128, 128, 8, 2, loads=_TMA, budget=0.43), _C(128, 64, 8, 2, variants=_NK, budget=0.4), _C(128, 32, 8, 3, budget=0.97)),
                192: (_C(128, 128, 8, 2, variants=_NK, loads=_TMA, budget=0.36), _C(64, 64, 4, 2, variants=_N, loads=_PTR), _C(128, 32, 8, 2, budget=0.96)),
                256: (_C(16, 32, 4, 2, reload=True, budget=2.69),),
                320: (_C(32, 32, 4, 2, reload=True, loads=_TMA, budget=2.39), _C(16, 32, 4, 2, reload=True, variants=_NK, loads=_PTR)),
                384: (_C(32, 32, 4, 2, reload=True, variants=_NK, loads=_TMA, budget=2.22), _C(16, 32, 4, 1, reload=True, variants=_NK, causal=_UNCAUSAL, loads=_PTR), _C(16, 32, 4, 2, reload=True, loads=_TMA, budget=3.47), _C(16, 32, 4, 1, reload=True, variants=_NK, causal=_CAUSAL, loads=_PTR)),
                512: (_C(16, 32, 4, 2, reload=True, variants=_NK, loads=_PTR), _C(16, 32, 4, 2, reload=True, loads=_TMA, budget=3.93)),
            },
            "32bit": {},
        },
        "dkdv": {
            "16bit": {
                64: (_C(64, 64, 4, 2, variants=_NK, causal=_UNCAUSAL, loads=_PTR), _C(64, 64, 4, 2, variants=_NK, causal=_UNCAUSAL, loads=_TMA, budget=0.45), _C(64, 64, 4, 2, variants=_NK, causal=_CAUSAL, loads=_TMA, budget=0.46), _C(64, 128, 8, 2, variants=_N, causal=_CAUSAL, loads=_PTR), _C(32, 64, 4, 2, variants=_NK, loads=_PTR), _C(32, 128, 8, 2, variants=_F, causal=_UNCAUSAL, loads=_PTR), _C(32, 64, 4, 2, loads=_TMA, budget=0.92), _C(16, 64, 4, 2, variants=_F, causal=_CAUSAL, loads=_PTR)),
                96: (_C(64, 64, 4, 2, variants=_N, loads=_TMA, budget=0.5), _C(32, 64, 4, 2, variants=_NK, causal=_UNCAUSAL, loads=_PTR), _C(32, 64, 4, 2, variants=_NK, causal=_CAUSAL, loads=_TMA, budget=0.7), _C(32, 64, 4, 2, variants=_N, causal=_CAUSAL, loads=_PTR), _C(32, 128, 8, 2, variants=_NK, causal=_CAUSAL, loads=_PTR), _C(32, 128, 8, 2, causal=_UNCAUSAL, loads=_TMA, budget=1.01), _C(16, 64, 4, 2, variants=_F, causal=_CAUSAL, loads=_PTR, dims=(65, 80)), _C(16, 64, 4, 2, variants=_F, causal=_UNCAUSAL, loads=_PTR, dims=(65, 80)), _C(16, 128, 8, 2, variants=_F, causal=_CAUSAL, loads=_TMA, budget=1.48), _C(32, 16, 4, 2, reload=True, variants=_F, causal=_UNCAUSAL, loads=_PTR, dims=(81, 96)), _C(32, 16, 4, 2, reload=True, variants=_F, causal=_CAUSAL, loads=_PTR, dims=(81, 96))),
                128: (_C(32, 64, 4, 2, variants=_NK, causal=_UNCAUSAL, loads=_TMA, budget=0.64), _C(32, 64, 4, 2, variants=_N, causal=_UNCAUSAL, loads=_PTR), _C(32, 64, 4, 2, variants=_N, causal=_CAUSAL, loads=_TMA, budget=0.62), _C(16, 64, 4, 2, variants=_NK, causal=_UNCAUSAL, loads=_PTR), _C(16, 64, 4, 2, variants=_N, causal=_CAUSAL, loads=_PTR), _C(16, 128, 8, 2, variants=_K, causal=_CAUSAL, loads=_PTR), _C(16, 64, 4, 2, loads=_TMA, budget=1.31), _C(32, 16, 4, 2, reload=True, variants=_F, loads=_PTR)),
                192: (_C(32, 64, 4, 2, variants=_N, causal=_UNCAUSAL, loads=_TMA, budget=0.8), _C(32, 16, 4, 1, reload=True, variants=_K, causal=_CAUSAL, loads=_PTR), _C(32, 16, 4, 2, reload=True, variants=_NF, causal=_CAUSAL, loads=_PTR), _C(32, 16, 4, 2, reload=True, causal=_UNCAUSAL, loads=_PTR), _C(32, 16, 4, 2, reload=True, causal=_UNCAUSAL, loads=_TMA, budget=2.62), _C(32, 16, 4, 2, reload=True, causal=_CAUSAL, loads=_TMA, budget=2.71)),
                256: (_C(32, 16, 4, 2, reload=True, variants=_N, causal=_UNCAUSAL, loads=_PTR), _C(32, 16, 4, 2, reload=True, loads=_TMA, budget=2.88), _C(32, 16, 4, 1, reload=True, variants=_NK, causal=_CAUSAL, loads=_PTR), _C(32, 16, 4, 1, reload=True, variants=_K, causal=_UNCAUSAL, loads=_PTR)),
                320: (_C(16, 128, 8, 2, variants=_NK, causal=_UNCAUSAL, loads=_PTR), _C(16, 128, 8, 2, variants=_N, causal=_CAUSAL, loads=_PTR), _C(32, 16, 4, 1, reload=True, loads=_TMA, budget=3.3)),
                384: (_C(32, 16, 4, 2, reload=True, variants=_N, loads=_PTR), _C(32, 16, 4, 2, reload=True, variants=_NK, causal=_CAUSAL, loads=_TMA, budget=3.21), _C(32, 16, 4, 2, reload=True, causal=_UNCAUSAL, loads=_TMA, budget=3.46), _C(32, 16, 4, 1, reload=True, variants=_F, causal=_CAUSAL, loads=_TMA, budget=3.49)),
                512: (_C(32, 16, 4, 2, reload=True, causal=_UNCAUSAL, budget=3.99), _C(32, 16, 4, 2, reload=True, variants=_NF, causal=_CAUSAL, loads=_PTR), _C(32, 16, 4, 2, reload=True, variants=_NK, causal=_CAUSAL, loads=_TMA, budget=3.71), _C(32, 16, 4, 1, reload=True, variants=_F, causal=_CAUSAL, loads=_TMA, budget=3.97)),
            },
            "32bit": {
                64: (_C(16, 32, 8, 2, reload=True, variants=_NK, causal=_CAUSAL, budget=11.85), _C(16, 32, 8, 2, reload=True, causal=_UNCAUSAL, budget=12.42), _C(16, 16, 8, 2, reload=True, variants=_F, causal=_CAUSAL, budget=14.48)),
                96: (_C(16, 16, 4, 2, reload=True, budget=18.69),),
                128: (_C(16, 32, 8, 2, reload=True, variants=_K, causal=_CAUSAL, budget=22.15), _C(16, 16, 4, 2, reload=True, variants=_K, causal=_UNCAUSAL, budget=22.33), _C(16, 16, 4, 2, reload=True, variants=_F, causal=_CAUSAL, budget=23.27), _C(16, 16, 8, 2, reload=True, variants=_N, causal=_CAUSAL, budget=25.4), _C(16, 16, 8, 2, reload=True, causal=_UNCAUSAL, budget=25.96)),
                192: (_C(16, 32, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL, budget=28.32), _C(16, 16, 8, 2, variants=_N, causal=_CAUSAL, budget=31.67), _C(16, 16, 8, 2, reload=True, variants=_F, budget=32.75), _C(16, 16, 8, 2, reload=True, variants=_K, causal=_CAUSAL, budget=31.96), _C(16, 16, 8, 2, reload=True, variants=_N, causal=_UNCAUSAL, budget=31.87)),
                256: (_C(16, 16, 8, 1, variants=_N, causal=_CAUSAL, maxnreg=255, budget=46.49), _C(16, 16, 8, 1, reload=True, variants=_N, causal=_UNCAUSAL, maxnreg=255, budget=46.6), _C(16, 16, 8, 2, variants=_K, causal=_CAUSAL, budget=47.29), _C(16, 16, 8, 1, reload=True, variants=_F, budget=48.01), _C(16, 16, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL, budget=47.35)),
                320: (_C(16, 32, 8, 2, reload=True, variants=_NK, causal=_UNCAUSAL, budget=40.1), _C(16, 16, 8, 2, variants=_F, budget=45.45), _C(16, 16, 8, 2, variants=_NK, causal=_CAUSAL, budget=44.63)),
                384: (_C(16, 16, 8, 2, variants=_N, causal=_CAUSAL, maxnreg=255, budget=50.53), _C(16, 16, 8, 2, variants=_K, causal=_UNCAUSAL, budget=51.78), _C(16, 16, 8, 3, variants=_K, causal=_CAUSAL, budget=51.78), _C(16, 16, 8, 2, variants=_N, causal=_UNCAUSAL, budget=51.78), _C(16, 16, 8, 2, reload=True, variants=_F, causal=_UNCAUSAL, budget=52.87), _C(16, 16, 8, 3, variants=_F, causal=_CAUSAL, budget=52.87)),
                512: (_C(16, 16, 8, 2, reload=True, budget=65.3),),
            },
        },
        "dq": {
            "16bit": {
                64: (_C(128, 128, 8, 2, variants=_NK, loads=_TMA, budget=0.28), _C(128, 128, 8, 2, variants=_N, loads=_PTR), _C(64, 64, 4, 2, variants=_NK, budget=0.35), _C(128, 32, 8, 2, budget=0.81)),
                96: (_C(128, 128, 8, 2, variants=_NK, loads=_TMA, budget=0.3), _C(64, 64, 4, 2, budget=0.55)),
                128: (_C(128, 128, 8, 2, variants=_NK, causal=_UNCAUSAL, loads=_TMA, budget=0.26), _C(64, 64, 4, 2, variants=_NK, budget=0.35), _C(128, 32, 8, 2, budget=0.91)),
                192: (_C(64, 64, 4, 2, variants=_NK, loads=_TMA, budget=0.45), _C(128, 32, 8, 2, budget=0.88)),
                256: (_C(64, 64, 4, 2, variants=_NK, loads=_TMA, budget=0.5), _C(16, 32, 4, 2, reload=True, budget=2.2)),
                320: (_C(16, 32, 4, 2, reload=True, budget=2.8),),
                384: (_C(16, 32, 4, 2, reload=True, budget=3.02),),
                512: (_C(16, 32, 4, 2, reload=True, budget=3.35),),
            },
            "32bit": {
                64: (_C(16, 32, 8, 2, reload=True), _C(16, 16, 8, 2, reload=True), _C(16, 16, 4, 2, reload=True)),
                96: (_C(16, 32, 8, 2, reload=True), _C(16, 16, 8, 2, reload=True)),
                128: (_C(16, 32, 8, 2, reload=True, variants=_K, budget=18.0), _C(16, 32, 8, 2, reload=True, variants=_F, causal=_CAUSAL, budget=18.51), _C(16, 32, 8, 2, reload=True, variants=_N, causal=_UNCAUSAL, budget=18.22), _C(16, 16, 8, 2, reload=True, variants=_F, causal=_UNCAUSAL, budget=20.15), _C(16, 16, 8, 2, reload=True, variants=_N, causal=_CAUSAL, budget=19.46), _C(16, 16, 8, 2, reload=True, variants=_K), _C(16, 16, 8, 2, reload=True, variants=_F, causal=_CAUSAL), _C(16, 16, 8, 2, reload=True, variants=_N, causal=_UNCAUSAL)),
                192: (_C(16, 16, 8, 2, reload=True), _C(16, 16, 4, 2, reload=True)),
                256: (_C(16, 32, 8, 2, reload=True, budget=35.36), _C(16, 16, 8, 2, reload=True, variants=_N), _C(16, 16, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL)),
                320: (_C(16, 32, 8, 2, budget=41.2),),
                384: (_C(16, 32, 8, 2, budget=47.5),),
                512: (_C(16, 16, 4, 1, reload=True, budget=58.6),),
            },
        },
        "dkdv_dbias": {
            "16bit": {
                64: (_C(64, 64, 4, 2, variants=_K, loads=_TMA, budget=0.5), _C(64, 128, 8, 2, variants=_K, causal=_UNCAUSAL, loads=_PTR), _C(32, 64, 4, 2, variants=_K, loads=_PTR), _C(32, 128, 8, 2, variants=_F, causal=_UNCAUSAL, loads=_PTR), _C(32, 64, 4, 2, loads=_TMA, budget=0.96), _C(16, 64, 4, 2, variants=_F, causal=_CAUSAL, loads=_PTR)),
                96: (_C(32, 64, 4, 2, variants=_K, causal=_UNCAUSAL, loads=_PTR), _C(32, 64, 4, 2, variants=_K, causal=_UNCAUSAL, loads=_TMA, budget=0.77), _C(32, 64, 4, 2, variants=_K, causal=_CAUSAL, loads=_TMA, budget=0.75), _C(32, 128, 8, 2, variants=_K, causal=_CAUSAL, loads=_PTR), _C(32, 128, 8, 2, causal=_UNCAUSAL, loads=_TMA, budget=1.06), _C(16, 64, 4, 2, variants=_F, causal=_CAUSAL, loads=_PTR, dims=(65, 80)), _C(16, 64, 4, 2, variants=_F, causal=_UNCAUSAL, loads=_PTR, dims=(65, 80)), _C(16, 128, 8, 2, variants=_F, causal=_CAUSAL, loads=_TMA, budget=1.55), _C(32, 16, 4, 2, reload=True, variants=_F, causal=_CAUSAL, loads=_PTR, dims=(81, 96)), _C(32, 16, 4, 2, reload=True, variants=_F, causal=_UNCAUSAL, loads=_PTR, dims=(81, 96))),
                128: (_C(32, 64, 4, 2, variants=_K, causal=_UNCAUSAL, loads=_TMA, budget=0.7), _C(16, 64, 4, 2, variants=_K, causal=_UNCAUSAL, loads=_PTR), _C(16, 128, 8, 2, variants=_K, causal=_CAUSAL, loads=_PTR), _C(16, 64, 4, 2, loads=_TMA, budget=1.37), _C(32, 16, 4, 2, reload=True, variants=_F, loads=_PTR)),
                192: (_C(32, 16, 4, 1, reload=True, variants=_K, loads=_PTR), _C(32, 16, 4, 2, reload=True, variants=_F, loads=_PTR), _C(32, 16, 4, 2, reload=True, loads=_TMA, budget=2.85)),
                256: (_C(32, 16, 4, 2, reload=True, loads=_TMA, budget=3.03), _C(32, 16, 4, 1, reload=True, variants=_K, loads=_PTR)),
                320: (_C(16, 128, 8, 2, variants=_K, causal=_UNCAUSAL, loads=_PTR), _C(32, 16, 4, 1, reload=True, loads=_TMA, budget=3.52)),
                384: (_C(32, 16, 4, 1, reload=True, variants=_K, causal=_CAUSAL, loads=_TMA, budget=3.36), _C(32, 16, 4, 2, reload=True, causal=_UNCAUSAL, loads=_TMA, budget=3.66), _C(32, 16, 4, 2, reload=True, variants=_F, causal=_CAUSAL, loads=_TMA, budget=3.71)),
                512: (_C(32, 16, 4, 2, reload=True, causal=_UNCAUSAL, budget=4.16), _C(32, 16, 4, 1, reload=True, causal=_CAUSAL, loads=_TMA, budget=4.16)),
            },
            "32bit": {
                64: (_C(16, 32, 8, 2, reload=True, budget=12.72),),
                96: (_C(16, 16, 4, 2, reload=True, variants=_F, budget=18.99), _C(16, 16, 8, 2, reload=True, budget=21.3)),
                128: (_C(16, 16, 4, 2, reload=True, variants=_F, causal=_CAUSAL, budget=23.29), _C(16, 16, 4, 2, reload=True, variants=_K, causal=_UNCAUSAL, budget=22.91), _C(16, 16, 8, 2, variants=_K, causal=_CAUSAL, budget=25.7), _C(16, 16, 8, 2, reload=True, variants=_F, causal=_UNCAUSAL, budget=26.29), _C(16, 16, 8, 2, reload=True, variants=_F, causal=_CAUSAL)),
                192: (_C(16, 32, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL, budget=28.55), _C(16, 16, 8, 2, reload=True, causal=_CAUSAL, budget=32.75), _C(16, 16, 8, 2, reload=True, variants=_F, causal=_UNCAUSAL, budget=33.05)),
                256: (_C(16, 16, 8, 1, reload=True, variants=_F, budget=48.14), _C(16, 16, 8, 1, reload=True, variants=_K, causal=_CAUSAL, budget=47.45), _C(16, 16, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL, budget=47.65)),
                320: (_C(16, 32, 8, 2, reload=True, variants=_K, causal=_UNCAUSAL, budget=40.28), _C(16, 16, 8, 2, reload=True, causal=_CAUSAL, budget=45.52), _C(16, 16, 8, 2, reload=True, variants=_F, causal=_UNCAUSAL, budget=46.04)),
                384: (_C(16, 16, 8, 2, reload=True, budget=52.64),),
                512: (_C(16, 32, 8, 2, reload=True, budget=58.3),),
            },
        },
        "dq_dbias": {
            "16bit": {
                64: (_C(128, 32, 8, 2, variants=_K, budget=0.81), _C(64, 32, 4, 2, reload=True, variants=_F, causal=_CAUSAL, loads=_PTR, dims=(1, 48)), _C(64, 32, 4, 2, reload=True, variants=_F, causal=_UNCAUSAL, loads=_PTR, dims=(1, 48)), _C(64, 32, 4, 2, variants=_F, causal=_UNCAUSAL, loads=_TMA, dims=(1, 48), budget=0.9), _C(64, 32, 4, 2, variants=_F, causal=_CAUSAL, loads=_TMA, dims=(1, 48), budget=0.9), _C(32, 32, 4, 2, reload=True, variants=_F, causal=_UNCAUSAL, loads=_PTR, dims=(49, 64)), _C(32, 32, 4, 2, reload=True, variants=_F, causal=_CAUSAL, loads=_PTR, dims=(49, 64)), _C(32, 32, 4, 2, reload=True, variants=_F, causal=_UNCAUSAL, loads=_TMA, dims=(49, 64), budget=1.38), _C(32, 32, 4, 2, reload=True, variants=_F, causal=_CAUSAL, loads=_TMA, dims=(49, 64), budget=1.38)),
                96: (_C(128, 32, 8, 2, variants=_K, budget=0.85), _C(128, 32, 8, 1, variants=_F, loads=_TMA, budget=1.29), _C(128, 16, 8, 2, variants=_F, loads=_PTR)),
                128: (_C(128, 32, 8, 2, variants=_K, budget=0.78), _C(32, 32, 4, 2, reload=True, variants=_F, loads=_PTR), _C(16, 32, 4, 2, reload=True, variants=_F, loads=_TMA, budget=2.1)),
                192: (_C(128, 32, 8, 2, loads=_TMA, budget=1.11), _C(16, 32, 4, 2, reload=True, loads=_PTR)),
                256: (_C(16, 32, 4, 1, reload=True, variants=_K, loads=_TMA, budget=2.37), _C(16, 32, 4, 2, reload=True, loads=_PTR)),
                320: (_C(16, 32, 4, 2, reload=True, variants=_K, loads=_PTR), _C(16, 32, 4, 2, variants=_F, loads=_PTR, budget=2.94)),
                384: (_C(16, 32, 4, 2, variants=_K, loads=_TMA, budget=2.71), _C(16, 32, 4, 2, variants=_K, loads=_PTR, budget=3.08), _C(16, 32, 4, 2, variants=_F, causal=_UNCAUSAL, loads=_TMA, budget=3.22), _C(16, 32, 4, 3, variants=_F, causal=_CAUSAL, loads=_TMA)),
                512: (_C(16, 32, 4, 2, reload=True, loads=_PTR),),
            },
            "32bit": {
                64: (_C(16, 16, 4, 2, reload=True, budget=9.85),),
                96: (_C(16, 32, 8, 2, reload=True, budget=14.72),),
                128: (_C(16, 32, 8, 2, reload=True, budget=18.68),),
                192: (_C(16, 16, 8, 2, reload=True, budget=25.53),),
                256: (_C(16, 16, 8, 2, reload=True, budget=38.53),),
                320: (_C(16, 16, 8, 2, reload=True, budget=45.42),),
                384: (_C(16, 16, 8, 2, reload=True, budget=53.06),),
                512: (_C(16, 16, 8, 2, reload=True, budget=64.78),),
            },
        },
    },
}
del _C

# Under the interpreter, tiles are small so that tests cross many tile boundaries;
# tests set INTERPRET_SHIPPED_TILES to run each kernel with the default tile the
# interpreted target (INTERPRET_ARCH) ships for the call's variant instead.
INTERPRET_CONFIG = TileConfig(32, 32, 4, 1)
INTERPRET_SHIPPED_TILES = False
ARCHS = ("sm80", "sm90")
# Head-dim bands of the candidate lists: a head dim uses the first band that holds its
# padded size (limits.padded_head_dim).
_BANDS = limits.BANDS


def _band(padded: int) -> int:
    return devices.band(padded)  # padding a padded head dim leaves it as it is


# The launchers ask for these on every call; they depend on the head dim only.
@functools.lru_cache(maxsize=None)
def _pieces(head_dim: int) -> tuple[int, int]:
    """limits.split_head_dim, remembered."""
    return split_head_dim(head_dim)


@functools.lru_cache(maxsize=None)
def _padded(head_dim: int) -> int:
    """limits.padded_head_dim, remembered."""
    return padded_head_dim(head_dim)


def _width(dtype: torch.dtype) -> str:
    return "32bit" if dtype == torch.float32 else "16bit"


# Under Triton's interpreter the launcher takes the path of this target (its TMA loads
# included), so that the CPU tests run what a GPU of that target runs; tests switch it.
INTERPRET_ARCH = "sm90"


def arch_of(device: torch.device) -> str:
    """The CONFIGS target of a device (devices.target): "sm90" for Hopper and datacenter
    Blackwell, "sm80" for Ampere, Ada and consumer Blackwell (99 KiB of shared memory per
    block, no warp-group MMA); INTERPRET_ARCH on the CPU."""
    if device.type != "cuda":
        return INTERPRET_ARCH
    return _cuda_target(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_target(index: int) -> str:
    """devices.target of CUDA device `index` (a capability does not change)."""
    return devices.target(torch.cuda.get_device_capability(index))


def configs_for(kernel: str, head_dim: int, dtype: torch.dtype, arch: str = "sm90",
                variant: str = "none", causal: bool = False, tma: bool = False) -> tuple[TileConfig, ...]:
    """The autotuning candidates of one kernel ("fwd", "dkdv", "dq", ...) at this head
    dim for one bias variant ("none", "keypad", "full"), causality and kind of loads,
    the default first."""
    padded = _padded(head_dim)
    cands = CONFIGS[arch][kernel][_width(dtype)][_band(padded)]
    loads = "tma" if tma else "ptr"
    return tuple(c for c in cands if variant in c.variants and causal in c.causal and loads in c.loads
                 and (c.dims is None or c.dims[0] <= padded <= c.dims[1]))


def _autotune_enabled() -> bool:
    return os.environ.get("ATTNKIT_TRITON_AUTOTUNE", "1") not in ("0", "")


# One triton.autotune wrapper per (target, kernel, width, band, variant), built on first
# use: each has its own candidates and its own cache of best configs, keyed by head dim,
# causality and by the query / key lengths rounded up to powers of two (M_KEY, N_KEY).
_TUNERS: dict[tuple, object] = {}
# The *_dbias entries are the same kernels when they also write the bias gradient
# (BIAS_GRAD): more live registers, so their own candidates.
_KERNELS = {"fwd": _attn_fwd, "dkdv": _attn_bwd_dkdv, "dq": _attn_bwd_dq,
            "fwd_lo": _attn_fwd, "dkdv_dbias": _attn_bwd_dkdv, "dq_dbias": _attn_bwd_dq}
# The tensor descriptors of each kernel (TMA), and which block size is their box rows:
# the operands each kernel streams through its loop, and the dK/dV kernel's K and V,
# which it holds (loaded once, like the rest of its operands, through TMA too).
_DESCRIPTORS = {"fwd": ((("KD0", "KD1", "VD0", "VD1"), "BLOCK_N"),),
                "dq": ((("KD0", "KD1", "VD0", "VD1"), "BLOCK_N"),),
                "dkdv": ((("QD0", "QD1", "DOD0", "DOD1"), "BLOCK_M"), (("KD0", "KD1", "VD0", "VD1"), "BLOCK_N"))}
for _k in ("fwd_lo", "dkdv_dbias", "dq_dbias"):
    _DESCRIPTORS[_k] = _DESCRIPTORS[_k.split("_")[0]]


def _set_boxes(kernel: str):
    """A pre-launch hook that sizes the kernel's tensor descriptors for the tile
    configuration about to run (the box rows are its block sizes)."""

    def hook(nargs):
        for names, rows_key in _DESCRIPTORS[kernel]:
            for name in names:
                desc = nargs[name]
                if isinstance(desc, TensorDescriptor):
                    desc.block_shape = [1, 1, nargs[rows_key], desc.block_shape[3]]

    return hook


# What an autotuner's choice depends on (of the arguments each kernel has).
_TUNE_KEY = ("HEAD_DIM", "M_KEY", "N_KEY", "CAUSAL", "TMA", "PIECE", "GRADS")


def _kernel_for(kernel: str, head_dim: int, dtype: torch.dtype, device: torch.device, variant: str,
                causal: bool, tma: bool):
    """(callable kernel, fixed config or None): the autotuner, or the plain kernel."""
    arch = arch_of(device)
    if INTERPRET:
        if INTERPRET_SHIPPED_TILES:
            return _KERNELS[kernel], configs_for(kernel, head_dim, dtype, arch, variant, causal, tma)[0]
        return _KERNELS[kernel], INTERPRET_CONFIG
    cands = configs_for(kernel, head_dim, dtype, arch, variant, causal, tma)
    if not _autotune_enabled() or len(cands) == 1:
        return _KERNELS[kernel], cands[0]
    key = (arch, kernel, _width(dtype), _band(_padded(head_dim)), variant, causal, tma)
    tuner = _TUNERS.get(key)
    if tuner is None:
        tuner = _TUNERS[key] = _make_tuner(kernel, cands)
    return tuner, None


def _make_tuner(kernel: str, cands: tuple[TileConfig, ...], **autotune_options):
    """A triton.autotune wrapper of one kernel over these candidates."""
    hook = _set_boxes(kernel)
    tuner = triton.autotune(
        configs=[
            triton.Config({"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "RELOAD": c.reload},
                          num_warps=c.num_warps, num_stages=c.num_stages, maxnreg=c.maxnreg, pre_hook=hook)
            for c in cands
        ],
        # Triton refuses a key that is not an argument: the forward has no PIECE or
        # GRADS, the dQ kernel no GRADS.
        key=[k for k in _TUNE_KEY if k in _KERNELS[kernel].arg_names],
        **autotune_options,
    )(_KERNELS[kernel])
    # The config the tuner chose, per value of its key and input dtypes (_launch), and
    # the lock that keeps a first call's choice from being read as another's.
    tuner.attnkit_chosen = {}
    tuner.attnkit_lock = threading.Lock()
    return tuner


# Fused multiply-add contraction (s * scale + bias in one rounding), stated rather than
# left to TRITON_DEFAULT_FP_FUSION, whose default Triton plans to change. The inspector
# compiles with the same options. Not passed to the interpreter, which has no such option.
_COMPILE_OPTIONS = {} if INTERPRET else {"enable_fp_fusion": True}


def _launch(kernel: str, head_dim: int, dtype: torch.dtype, grid_rows: int, rows_axis_block: str,
            b: int, h: int, args: dict, constexprs: dict, variant: str) -> None:
    """Launch one kernel over (tiles of grid_rows, h, b); args by name."""
    fn, cfg = _kernel_for(kernel, head_dim, dtype, args["Q"].device, variant, constexprs["CAUSAL"],
                          constexprs["TMA"])
    if cfg is None:
        # Once the tuner has chosen for this key, launch its choice directly: what the
        # tuner's wrapper does on every call (a dict of ~60 arguments, its key with the
        # dtype of each tensor, the pre-hook) costs as much host time as the rest of
        # the launcher. Its key is HEAD_DIM, the length buckets, CAUSAL, TMA, PIECE and
        # GRADS with the arguments' dtypes; in one tuner (a target, kernel, width and
        # bias variant) those dtypes follow from Q's and the bias's.
        key = (*(args[k] if k in args else constexprs[k] for k in fn.keys), args["Q"].dtype, args["Bias"].dtype)
        chosen = fn.attnkit_chosen.get(key)
        if chosen is None:
            def grid(meta):
                return (triton.cdiv(grid_rows, meta[rows_axis_block]), h, b)

            with fn.attnkit_lock:  # best_config is the tuner's one field for every caller
                fn[grid](**args, **constexprs, **_COMPILE_OPTIONS)
                fn.attnkit_chosen[key] = fn.best_config
            return
        meta = chosen.all_kwargs()
        if chosen.pre_hook is not None:
            chosen.pre_hook({**args, **meta})
        fn.fn[(triton.cdiv(grid_rows, meta[rows_axis_block]), h, b)](**args, **constexprs, **meta,
                                                                      **_COMPILE_OPTIONS)
    else:
        meta = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, RELOAD=cfg.reload)
        _set_boxes(kernel)({**args, **meta})
        regs = {} if INTERPRET or cfg.maxnreg is None else {"maxnreg": cfg.maxnreg}
        fn[(triton.cdiv(grid_rows, meta[rows_axis_block]), h, b)](
            **args, **constexprs, **meta, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            **_COMPILE_OPTIONS, **regs)


def _precision(dtype: torch.dtype, allow_tf32: bool) -> str:
    # Only fp32 operands look at it: "ieee" is true fp32, "tf32" the tensor-core format.
    return "tf32" if (allow_tf32 or dtype != torch.float32) else "ieee"


def _align(*strides: int) -> int:
    """The largest power of two <= 16 that divides every stride (0 divides by anything).

    Passed to the kernels as ALIGN: a true hint that lets the compiler vectorise loads
    (e.g. head dim 40 in a (B, N, H, D) layout has a head stride of 40: 8-aligned).
    """
    a = 16
    for st in strides:
        while st % a:
            a //= 2
    return a


def _tma_ok(*tensors: torch.Tensor) -> bool:
    """Whether a tensor descriptor can address each (B, H, L, D) tensor: 16-byte aligned
    base and positive strides (dims of size 1 excepted; a broadcast dim has stride 0),
    contiguous last dim, no empty dim."""
    for t in tensors:
        size, shape, strides = t.element_size(), t.shape, t.stride()
        if t.data_ptr() % 16 or strides[-1] != 1 or min(shape) == 0:
            return False
        if any((st * size) % 16 or st <= 0 for n, st in zip(shape[:-1], strides[:-1]) if n > 1):
            return False
    return True


def _descriptors(t: torch.Tensor, d0: int, d1: int, rows: int) -> tuple:
    """Tensor descriptors over the whole (B, H, L, D) tensor t with boxes (1, 1, rows, D0)
    and (1, 1, rows, D1) (the box rows are set again before each launch). Out-of-bounds
    rows and columns read as zeros."""
    strides = [st if n > 1 else 16 // t.element_size() * max(1, n)
               for n, st in zip(t.shape, t.stride())]
    strides[-1] = 1
    desc0 = TensorDescriptor(t, list(t.shape), strides, [1, 1, rows, d0])
    desc1 = TensorDescriptor(t, list(t.shape), strides, [1, 1, rows, d1]) if d1 else desc0
    return desc0, desc1


def _stream_args(names: tuple, tensors: tuple, use_tma: bool, d0: int, d1: int) -> dict:
    """The descriptor arguments of a kernel: descriptors with TMA, else placeholders
    (the tensors themselves, never read)."""
    out = {}
    for (n0, n1), t in zip(zip(names[::2], names[1::2]), tensors):
        out[n0], out[n1] = _descriptors(t, d0, d1, 16) if use_tma else (t, t)
    return out


def _tma_copy(t: torch.Tensor) -> torch.Tensor:
    """t's values in a fresh (B, H, L, D) buffer a tensor descriptor can address: rows
    padded to a multiple of 16 bytes with zeros (the view returned has t's shape)."""
    per_16 = 16 // t.element_size()
    padded = -(-t.shape[-1] // per_16) * per_16
    buf = torch.zeros((*t.shape[:-1], padded), dtype=t.dtype, device=t.device)
    view = buf[..., :t.shape[-1]]
    view.copy_(t)
    return view


def _ready_for_tma(arch: str, dtype: torch.dtype, tensors: tuple, kernels: tuple, head_dim: int, variant: str,
                   causal: bool) -> tuple:
    """On sm_90, 16-bit tensors not aligned for TMA run through pointer loads, unless a
    kernel has no spill-free pointer tile for the call (a full bias at some head dims):
    then the misaligned tensors are copied into aligned buffers first (_tma_copy)."""
    if arch != "sm90" or dtype == torch.float32 or _tma_ok(*tensors):
        return tensors
    if all(configs_for(kernel, head_dim, dtype, arch, variant, causal, False) for kernel in kernels):
        return tensors
    return tuple(t if _tma_ok(t) else _tma_copy(t) for t in tensors)


def _use_tma(arch: str, dtype: torch.dtype, tensors: tuple, kernels: tuple, head_dim: int, variant: str,
             causal: bool) -> bool:
    """TMA loads of the streamed tiles: on Hopper, for 16-bit inputs (fp32 dots run on
    FMA units, which TMA does not feed faster), where every tensor is aligned for it and
    every kernel of the call has a TMA tile (a few full-bias lists have pointer tiles only)."""
    if arch != "sm90" or dtype == torch.float32 or not _tma_ok(*tensors):
        return False
    return all(configs_for(kernel, head_dim, dtype, arch, variant, causal, True) for kernel in kernels)


def _bias_args(attn_bias: Optional[torch.Tensor], q: torch.Tensor, shape4) -> tuple:
    """(pointer, strides (b, h, m, n), lengths, plain, their strides (b, h), constexprs,
    variant) for a broadcastable bias.

    expand() is a view: broadcast dims get stride 0 and nothing is copied. A bias that
    does not depend on the query (KEY_BIAS, "keypad") also gets, per (batch, head), its
    length: one past its last key that is not -inf. Keys from there on are masked in
    every row, and the kernels skip their tiles instead of computing them. plain is 1
    where the bias is 0 on every key before that length (a key-padding mask): the
    kernels then run their loops of no bias over the length, and never load it.
    Measured on the device, with no synchronisation.
    """
    placeholder = dict(BIAS=NO_BIAS, BIAS_ALIGN=1, BIAS_CONTIG=False)
    if attn_bias is None:
        return q, (0, 0, 0, 0), q, q, (0, 0), placeholder, "none"
    bias = attn_bias.expand(shape4)
    if max(bias.stride()[2:]) * (_MAX_TILE_ROWS - 1) >= 2**31:
        # A tile's rows or columns would span 2**31 elements (see _addressable): compact
        # the bias in its own, unexpanded shape.
        bias = attn_bias.contiguous().expand(shape4)
    sb = tuple(bias.stride())
    constexprs = dict(BIAS_ALIGN=_align(*sb[:3]), BIAS_CONTIG=sb[3] == 1)
    if sb[2] != 0:
        return bias, sb, q, q, (0, 0), dict(constexprs, BIAS=FULL_BIAS), "full"
    own = attn_bias.reshape((1,) * (4 - attn_bias.dim()) + tuple(attn_bias.shape))[:, :, 0, :]
    n = shape4[3]
    keys = torch.arange(n, device=own.device, dtype=torch.int32)
    live = own != float("-inf")  # NaN counts as live: it must reach the output
    lens = ((keys + 1) * live).amax(-1)
    plain = ((own == 0) | (keys >= lens.unsqueeze(-1))).all(-1)
    lens, plain = (t.to(torch.int32).expand(own.shape[0], own.shape[1]).contiguous() for t in (lens, plain))
    sl = tuple(st if size > 1 else 0 for size, st in zip(lens.shape, lens.stride()))
    return bias, sb, lens, plain, sl, dict(constexprs, BIAS=KEY_BIAS), "keypad"


def _causal_args(causal: bool, offset: int, M: int, N: int) -> tuple[bool, int]:
    """(CAUSAL, OFF) for the kernels. Offsets beyond [-M, N - 1] mean the same as their
    bound (every row blind, or every key visible), so they are clamped into 32 bits;
    an offset that hides nothing is no mask at all."""
    if not causal:
        return False, 0
    offset = max(-M, min(int(offset), N - 1))
    if offset >= N - 1:
        return False, 0
    return True, offset


def _lengths_key(m: int, n: int) -> tuple[int, int]:
    return _next_pow2(m), _next_pow2(n)


# Tests set this to fill every buffer the kernels write with NaN before they run, so an
# element a kernel forgets to write cannot pass for a result.
POISON_OUTPUTS = False


def _new_like(t: torch.Tensor, **kw) -> torch.Tensor:
    out = torch.empty_like(t, **kw)
    return out.fill_(float("nan")) if POISON_OUTPUTS else out


def _new(shape, device) -> torch.Tensor:
    out = torch.empty(shape, device=device, dtype=torch.float32)
    return out.fill_(float("nan")) if POISON_OUTPUTS else out


# Offsets inside a tile (row index times row stride) are 32-bit, everything above them
# 64-bit. The most rows a tile of any shipped configuration has (the delta pass uses 64):
_MAX_TILE_ROWS = (max(INTERPRET_CONFIG.block_m, INTERPRET_CONFIG.block_n, 16) if INTERPRET else
                  max(max(c.block_m, c.block_n, 64) for arch in CONFIGS.values() for kern in arch.values()
                      for width in kern.values() for cands in width.values() for c in cands))


def _addressable(x: torch.Tensor) -> bool:
    """Whether the kernels can read or write x in place: last dim contiguous, and a
    tile's rows span fewer than 2**31 elements. The second holds for every layout a
    diffusion model makes (row stride D or H * D); a view with a row stride of 2**24 or
    more is copied to a compact layout rather than indexed wrongly."""
    strides = x.stride()
    return strides[-1] == 1 and strides[-2] * (_MAX_TILE_ROWS - 1) < 2**31


def _kernel_layout(x: torch.Tensor) -> torch.Tensor:
    return x if _addressable(x) else x.contiguous()


def _strides3(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride()[:3]


def _forward_impl(q, k, v, attn_bias, scale: float, allow_tf32: bool, store_lo: bool = False,
                  causal: bool = False, causal_offset: int = 0):
    """Launch the forward. Returns (out like q, lse, lse_shift, out_lo): lse (B, H, M) is
    the base-2 log of each row's sum relative to lse_shift, (B, H, M) in natural units
    with a bias and empty without one (see _attn_fwd): the natural LSE is
    lse_shift + lse * ln(2). out_lo, only if store_lo and the dtype is 16-bit (else
    None), is what rounding out lost, with out's strides."""
    B, H, M, D = q.shape
    N = k.shape[2]
    store_lo = store_lo and q.dtype != torch.float32
    out = _new_like(q)  # keeps q's layout, so a (B, M, H, D) view stays one
    out_lo = _new_like(out) if store_lo else None
    lse = _new((B, H, M), q.device)
    shift = _new((B, H, M) if attn_bias is not None else (0,), q.device)
    if M == 0 or B == 0 or H == 0:
        return out, lse, shift, out_lo
    if scale < 0:
        # The kernels take the row max on unscaled scores, which needs scale >= 0:
        # softmax(q k^T * scale) == softmax((-q) k^T * -scale).
        q, scale = -q, -scale
    q, k, v = (_kernel_layout(t) for t in (q, k, v))
    o = out if _addressable(out) else _new_like(out, memory_format=torch.contiguous_format)
    lo = out_lo if (out_lo is None or o is out) else _new_like(o)
    bias, sb, lens, plain, sl, bias_constexprs, variant = _bias_args(attn_bias, q, (B, H, M, N))
    causal, off = _causal_args(causal, causal_offset, M, N)
    kernel = "fwd_lo" if store_lo else "fwd"
    arch = arch_of(q.device)
    k, v = _ready_for_tma(arch, q.dtype, (k, v), (kernel,), D, variant, causal)
    d0, d1 = _pieces(D)
    m_key, n_key = _lengths_key(M, N)
    align = _align(*(st for t in (q, k, v, o) for st in _strides3(t)))
    assert lo is None or lo.stride() == o.stride()
    tma = _use_tma(arch, q.dtype, (k, v), (kernel,), D, variant, causal)
    args = dict(Q=q, K=k, V=v, **_stream_args(_DESCRIPTORS["fwd"][0][0], (k, v), tma, d0, d1),
                Bias=bias, Lens=lens, Plain=plain, Out=o, Lse=lse, LseShift=shift if attn_bias is not None else lse,
                OutLo=o if lo is None else lo)
    strides = (*_strides3(q), *_strides3(k), *_strides3(v), *sb, *sl, *_strides3(o))
    names = ("stride_qb", "stride_qh", "stride_qm", "stride_kb", "stride_kh", "stride_kn",
             "stride_vb", "stride_vh", "stride_vn", "stride_bb", "stride_bh", "stride_bm", "stride_bn",
             "stride_lb", "stride_lh", "stride_ob", "stride_oh", "stride_om")
    args.update(zip(names, strides))
    args.update(H=H, M=M, N=N, OFF=off, qk_scale=float(scale) * LOG2E, sm_scale=float(scale), M_KEY=m_key,
                N_KEY=n_key)
    constexprs = dict(HEAD_DIM=D, D0=d0, D1=d1, ALIGN=align, **bias_constexprs, CAUSAL=causal, TMA=tma,
                      PRECISION=_precision(q.dtype, allow_tf32), EMULATE_BF16=INTERPRET and q.dtype == torch.bfloat16,
                      STORE_LO=store_lo)
    _launch(kernel, D, q.dtype, M, "BLOCK_M", B, H, args, constexprs, variant)
    if o is not out:
        out.copy_(o)
        if store_lo:
            out_lo.copy_(lo)
    return out, lse, shift, out_lo


def _backward_impl(do, q, k, v, attn_bias, out, lse, shift, scale: float, allow_tf32: bool, dlse=None,
                   bias_grad: bool = False, out_lo=None, causal: bool = False, causal_offset: int = 0):
    """Launch the three backward kernels. Returns (dq, dk, dv, dbias): dq, dk, dv like
    their inputs; dbias shaped and typed like attn_bias if bias_grad, else None.

    lse, shift: the forward's row statistics (see _forward_impl). dlse: the gradient of
    the natural LSE times ln(2) (the gradient of the base-2 part lse), or None. Since
    d LSE / d s = p, it folds into delta: dS = P * (dP - (delta - dlse * log2(e))).
    out_lo: the forward's rounding residual of out (same shape and strides), or None.

    The bias gradient is dS, summed over the dims the bias broadcasts over. A bias that
    does not depend on the query (key padding, (B|1, H|1, 1, N)) is summed over the
    queries inside the dK/dV pass, into a (B, H, N) buffer; any other bias needs the
    whole dS, (B, H, M, N) in fp32, as every framework's attention does. A bias that
    does not depend on the key (size 1 or no dim at N) only shifts whole softmax rows:
    the output does not depend on it, and the LSE by exactly that shift, so its
    gradient is dlse (or zero) without computing dS.
    """
    B, H, M, D = q.shape
    N = k.shape[2]
    dq, dk, dv = _new_like(q), _new_like(k), _new_like(v)
    bias_grad = bias_grad and attn_bias is not None
    if bias_grad and (attn_bias.dim() == 0 or attn_bias.shape[-1] == 1):
        dq, dk, dv, _ = _backward_impl(do, q, k, v, attn_bias, out, lse, shift, scale, allow_tf32, dlse,
                                       out_lo=out_lo, causal=causal, causal_offset=causal_offset)
        if dlse is None:
            return dq, dk, dv, torch.zeros_like(attn_bias, memory_format=torch.contiguous_format)
        # d LSE / d bias = 1 for a bias added to a whole row; dlse is that gradient times ln(2).
        row = (dlse.to(torch.float32) * LOG2E).unsqueeze(-1)  # (B, H, M, 1)
        return dq, dk, dv, row.sum_to_size(attn_bias.shape).to(attn_bias.dtype).contiguous()
    causal, off = _causal_args(causal, causal_offset, M, N)
    # Which kernel writes the bias gradient: dQ the whole dS (B, H, M, N), or dK/dV dS
    # summed over the queries (B, H, N).
    per_query = bias_grad and attn_bias.dim() >= 2 and attn_bias.shape[-2] != 1
    per_key = bias_grad and not per_query
    if bias_grad:
        dbias_t = _new((B, H, M, N) if per_query else (B, H, N), q.device)
        if per_query and causal:
            dbias_t.zero_()  # the dQ kernel writes no dS for tiles above the diagonal
    if B == 0 or H == 0 or M == 0:
        for t in (dq, dk, dv) + ((dbias_t,) if bias_grad else ()):
            t.zero_()
        return dq, dk, dv, _reduce_bias_grad(dbias_t, attn_bias) if bias_grad else None
    negate = scale < 0
    if negate:
        q, scale = -q, -scale  # as in _forward_impl; dQ changes sign back below
    q, k, v, out, do = (_kernel_layout(t) for t in (q, k, v, out, do))
    if out_lo is not None and out_lo.stride() != out.stride():
        out, out_lo = out.contiguous(), out_lo.contiguous()
    dq_, dk_, dv_ = (t if _addressable(t) else _new_like(t, memory_format=torch.contiguous_format)
                     for t in (dq, dk, dv))
    if do.dtype != q.dtype:
        do = do.to(q.dtype)

    delta = _new((B, H, M), q.device)
    block_d = max(16, _next_pow2(D))
    block = 16 if INTERPRET else 64
    _attn_bwd_delta[(triton.cdiv(M, block), H, B)](
        out, out if out_lo is None else out_lo, do, delta,
        out.stride(0), out.stride(1), out.stride(2),
        do.stride(0), do.stride(1), do.stride(2),
        H, M, HEAD_DIM=D, BLOCK_M=block, BLOCK_D=block_d,
        ALIGN=_align(*out.stride()[:3], *do.stride()[:3]), HAS_LO=out_lo is not None)
    if dlse is not None:
        delta -= dlse.to(torch.float32) * LOG2E

    bias, sb, lens, plain, sl, bias_constexprs, variant = _bias_args(attn_bias, q, (B, H, M, N))
    arch = arch_of(q.device)
    # The kernels this call launches (above head dim 256 the pieces after the first, and
    # the dV launches, run without the bias gradient).
    split = D > limits.MAX_PIECE
    dkdv_kernels = (("dkdv_dbias",) + (("dkdv",) if split else ())) if per_key else ("dkdv",)
    dq_kernels = (("dq_dbias",) + (("dq",) if split else ())) if per_query else ("dq",)
    q, k, v, do = _ready_for_tma(arch, q.dtype, (q, k, v, do), dkdv_kernels + dq_kernels, D, variant, causal)
    d0, d1 = _pieces(D)
    m_key, n_key = _lengths_key(M, N)
    align = _align(*(st for t in (q, k, v, do, dq_, dk_, dv_) for st in _strides3(t)))
    constexprs = dict(HEAD_DIM=D, D0=d0, D1=d1, ALIGN=align, **bias_constexprs, CAUSAL=causal,
                      PRECISION=_precision(q.dtype, allow_tf32), EMULATE_BF16=INTERPRET and q.dtype == torch.bfloat16)
    # A kernel that does not write the bias gradient gets a placeholder pointer, and so
    # does a kernel without a bias shift.
    db = dbias_t if bias_grad else lse
    common = dict(Q=q, K=k, V=v, Bias=bias, Lens=lens, Plain=plain, DO=do, Lse=lse, LseShift=shift if shift.numel() else lse,
                  Delta=delta, H=H, M=M, N=N, OFF=off, qk_scale=float(scale) * LOG2E, sm_scale=float(scale),
                  M_KEY=m_key, N_KEY=n_key)
    names = ("stride_qb", "stride_qh", "stride_qm", "stride_kb", "stride_kh", "stride_kn",
             "stride_vb", "stride_vh", "stride_vn", "stride_bb", "stride_bh", "stride_bm", "stride_bn",
             "stride_lb", "stride_lh", "stride_dob", "stride_doh", "stride_dom")
    common.update(zip(names, (*_strides3(q), *_strides3(k), *_strides3(v), *sb, *sl, *_strides3(do))))

    tma = _use_tma(arch, q.dtype, (q, do, k, v), dkdv_kernels, D, variant, causal)
    kv = _stream_args(_DESCRIPTORS["dkdv"][1][0], (k, v), tma, d0, d1)
    args = dict(common, **_stream_args(_DESCRIPTORS["dkdv"][0][0], (q, do), tma, d0, d1), **kv, DK=dk_, DV=dv_,
                DBias=db, stride_dbb=db.stride(0) if per_key else 0, stride_dbh=db.stride(1) if per_key else 0)
    args.update(zip(("stride_dkb", "stride_dkh", "stride_dkn", "stride_dvb", "stride_dvh", "stride_dvn"),
                    (*_strides3(dk_), *_strides3(dv_))))
    # Above a head dim of 256 each gradient is computed one head-dim piece per launch
    # (the scores again for each): the accumulators and operand tiles of both pieces do
    # not fit in registers at once; dK/dV also one gradient per launch. The bias
    # gradient comes with the first dK launch.
    pieces = (0, 1) if D > limits.MAX_PIECE else (-1,)
    splits = [(p, g) for p in pieces for g in (("dk", "dv") if p >= 0 else ("dkdv",))]
    for piece, grads in splits:
        grad = per_key and piece <= 0 and grads != "dv"
        _launch("dkdv_dbias" if grad else "dkdv", D, q.dtype, N, "BLOCK_N", B, H, args,
                dict(constexprs, BIAS_GRAD=grad, TMA=tma, PIECE=piece, GRADS=grads), variant)

    # dQ streams the K and V that dK/dV held, through descriptors of the same names: the
    # same objects serve both when both use TMA (a launch encodes its tensor map from the
    # descriptor's base, shape and strides and the compiled kernel's box; the pre-launch
    # hook sets the box rows of the tile about to run, see _set_boxes).
    dkdv_tma, tma = tma, _use_tma(arch, q.dtype, (k, v), dq_kernels, D, variant, causal)
    if tma != dkdv_tma:
        kv = _stream_args(_DESCRIPTORS["dq"][0][0], (k, v), tma, d0, d1)
    args = dict(common, **kv, DQ=dq_, DBias=db)
    args.update(zip(("stride_dqb", "stride_dqh", "stride_dqm"), _strides3(dq_)))
    args.update(zip(("stride_dbb", "stride_dbh", "stride_dbm"), _strides3(db) if per_query else (0, 0, 0)))
    for piece in pieces:
        grad = per_query and piece <= 0
        _launch("dq_dbias" if grad else "dq", D, q.dtype, M, "BLOCK_M", B, H, args,
                dict(constexprs, BIAS_GRAD=grad, TMA=tma, PIECE=piece), variant)
    for final, tmp in ((dq, dq_), (dk, dk_), (dv, dv_)):
        if final is not tmp:
            final.copy_(tmp)
    if negate:
        dq.neg_()
    return dq, dk, dv, _reduce_bias_grad(dbias_t, attn_bias) if bias_grad else None


def _reduce_bias_grad(ds: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
    """dS, (B, H, M, N) or summed over the queries (B, H, N), -> attn_bias's own shape and
    dtype: summed over the dims where the bias has size 1 or none (sum_to_size)."""
    if ds.dim() == 3:
        ds = ds.unsqueeze(2)
    return ds.sum_to_size(attn_bias.shape).to(attn_bias.dtype).contiguous()


# =====================================================================================
# torch.library ops: opaque to torch.compile (no graph break), with fake implementations
# for tracing and a registered autograd formula.
# =====================================================================================


@torch.library.custom_op("attnkit::flash_attention_forward", mutates_args=())
def _flash_forward_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_bias: Optional[torch.Tensor],
    scale: float, allow_tf32: bool, store_lo: bool, causal: bool, causal_offset: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, lse, lse_shift, out_lo): the natural LSE is lse_shift + lse * ln(2) (see
    _forward_impl); lse_shift is empty without a bias, out_lo an empty placeholder
    unless store_lo (16-bit only). The row statistics are differentiable only through
    that sum, the one way this module combines them."""
    return _forward_body(q, k, v, attn_bias, scale, allow_tf32, store_lo, causal, causal_offset)


def _forward_body(q, k, v, attn_bias, scale, allow_tf32, store_lo, causal, causal_offset):
    # Here rather than in the Python wrappers: torch.compile traces those, and runs this.
    _check_shared_memory(q, attn_bias, causal, store_lo)
    out, lse, shift, out_lo = _forward_impl(q, k, v, attn_bias, scale, allow_tf32, store_lo, causal,
                                            causal_offset)
    return out, lse, shift, (q.new_empty(0) if out_lo is None else out_lo)


def _forward(q, k, v, attn_bias, scale, allow_tf32, store_lo, causal, causal_offset):
    """The forward op, or, where nothing needs the op's dispatch, its body: eager calls
    (not traced by torch.compile, no dispatch mode such as a FLOP counter or fake
    tensors, no torch.func transform, plain tensors) skip torch.library's dispatch, most
    of the host time of a small call (measured on a CPU: about half of the launcher's
    own time). Inference runs the body; training (store_lo: a gradient to record) runs
    _eager_flash(), the same body and backward in a plain autograd.Function, whose backward
    skips the backward op's dispatch too. A diffusion model's denoising loop is the
    first case, fine-tuning at small shapes the second."""
    if (not torch.compiler.is_compiling()
            and all(type(t) is torch.Tensor for t in (q, k, v, attn_bias) if t is not None)
            and _get_current_dispatch_mode() is None and not torch._C._are_functorch_transforms_active()):
        if not store_lo:
            return _forward_body(q, k, v, attn_bias, scale, allow_tf32, store_lo, causal, causal_offset)
        return _eager_flash().apply(q, k, v, attn_bias, scale, allow_tf32, store_lo, causal, causal_offset)
    return _flash_forward_op(q, k, v, attn_bias, scale, allow_tf32, store_lo, causal, causal_offset)


@_flash_forward_op.register_fake
def _(q, k, v, attn_bias, scale, allow_tf32, store_lo, causal, causal_offset):
    B, H, M, _ = q.shape
    out_lo = torch.empty_like(q) if store_lo and q.dtype != torch.float32 else q.new_empty(0)
    shift = q.new_empty((B, H, M) if attn_bias is not None else (0,), dtype=torch.float32)
    return torch.empty_like(q), q.new_empty((B, H, M), dtype=torch.float32), shift, out_lo


@torch.library.custom_op("attnkit::flash_attention_backward", mutates_args=())
def _flash_backward_op(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    attn_bias: Optional[torch.Tensor], out: torch.Tensor, lse: torch.Tensor, lse_shift: torch.Tensor,
    out_lo: torch.Tensor, dlse: Optional[torch.Tensor], scale: float, allow_tf32: bool, bias_grad: bool,
    causal: bool, causal_offset: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dbias); dbias is an empty placeholder unless bias_grad. out_lo: the
    forward's placeholder or residual."""
    return _backward_body(do, q, k, v, attn_bias, out, lse, lse_shift, out_lo, dlse, scale, allow_tf32, bias_grad,
                          causal, causal_offset)


def _backward_body(do, q, k, v, attn_bias, out, lse, lse_shift, out_lo, dlse, scale, allow_tf32, bias_grad, causal,
                   causal_offset):
    dq, dk, dv, dbias = _backward_impl(do, q, k, v, attn_bias, out, lse, lse_shift, scale, allow_tf32, dlse,
                                       bias_grad, out_lo if out_lo.numel() else None, causal, causal_offset)
    return dq, dk, dv, (q.new_empty(0) if dbias is None else dbias)


@_flash_backward_op.register_fake
def _(do, q, k, v, attn_bias, out, lse, lse_shift, out_lo, dlse, scale, allow_tf32, bias_grad, causal,
      causal_offset):
    dbias = (torch.empty(attn_bias.shape, dtype=attn_bias.dtype, device=attn_bias.device)
             if bias_grad and attn_bias is not None else q.new_empty(0))
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dbias


def _setup_context(ctx, inputs, output):
    q, k, v, attn_bias, scale, allow_tf32, store_lo, causal, causal_offset = inputs
    out, lse, shift, out_lo = output
    ctx.save_for_backward(q, k, v, attn_bias, out, lse, shift, out_lo)
    ctx.scale = scale
    ctx.allow_tf32 = allow_tf32
    ctx.causal = causal
    ctx.causal_offset = causal_offset


def _backward(ctx, dout, dlse, _dshift, _dout_lo, run=None):
    # The LSE is lse_shift + lse * ln(2): dlse (of the base-2 part) carries its whole
    # gradient, and _dshift is the same gradient again. run: the backward op (default)
    # or its body (_EagerFlash).
    run = _flash_backward_op if run is None else run
    q, k, v, attn_bias, out, lse, shift, out_lo = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    bias_grad = attn_bias is not None and ctx.needs_input_grad[3]
    dq, dk, dv, dbias = run(dout, q, k, v, attn_bias, out, lse, shift, out_lo, dlse, ctx.scale, ctx.allow_tf32,
                            bias_grad, ctx.causal, ctx.causal_offset)
    return dq, dk, dv, (dbias if bias_grad else None), None, None, None, None, None


_flash_forward_op.register_autograd(_backward, setup_context=_setup_context)

@functools.lru_cache(maxsize=None)
def _eager_flash() -> type:
    """_EagerFlash: the forward op with its autograd formula (_setup_context, _backward),
    without torch.library's dispatch, for eager training (see _forward). The same body
    runs both ways, so both give the same bits. Gradients of outputs nothing used stay
    None (the op's generated Function fills them with zeros: same results, more work).
    Made here rather than at module level, which the static report's --resume reads as
    kernel code. Its forward takes ctx itself: with a separate setup_context, every
    apply() binds its arguments through inspect.signature, about a seventh of the host
    time of a small forward and backward (measured on a CPU, the kernels stubbed)."""

    class _EagerFlash(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, attn_bias, scale, allow_tf32, store_lo, causal, causal_offset):
            inputs = (q, k, v, attn_bias, scale, allow_tf32, store_lo, causal, causal_offset)
            output = _forward_body(*inputs)
            _setup_context(ctx, inputs, output)
            ctx.set_materialize_grads(False)
            return output

        @staticmethod
        @torch.autograd.function.once_differentiable  # a second derivative raises, as through the ops
        def backward(ctx, dout, dlse, dshift, dout_lo):
            return _backward(ctx, dout, dlse, dshift, dout_lo, run=_backward_body)

    return _EagerFlash


# =====================================================================================
# Public functions
# =====================================================================================

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _prepare(q, k, v, attn_bias, scale):
    """Check the inputs (ValueError naming the limit and the value) and normalise
    attn_bias (bool -> additive float, converted once here) and scale."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dims (B, H, len, head_dim), got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name}.dtype={t.dtype} is not supported (float16, bfloat16, float32)")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, H, M, D = q.shape
    N = k.shape[2]
    if k.shape[0] != B or k.shape[1] != H or k.shape[3] != D:
        raise ValueError(f"k shape {tuple(k.shape)} does not match q shape {tuple(q.shape)} "
                         f"(expected ({B}, {H}, N, {D}))")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v shape {tuple(v.shape)} must equal k shape {tuple(k.shape)} "
                         f"(a value head dim different from the query head dim is not supported)")
    problems = input_problems(D, batch=B, heads=H, q_len=M, kv_len=N)
    if problems:
        raise ValueError("; ".join(problems))
    if q.device.type != "cuda" and not (INTERPRET and q.device.type == "cpu"):
        raise ValueError(
            f"device={q.device.type}: the triton flash attention runs on CUDA; on the CPU it runs "
            f"only under TRITON_INTERPRET=1 (set before attnkit.kernels is imported), for debugging")

    if scale is None:
        scale = D ** -0.5  # symbolic under torch.compile(dynamic=True); finite anyway
    else:
        scale = float(scale)
        if not math.isfinite(scale):
            raise ValueError(f"scale={scale} must be finite")

    if attn_bias is not None:
        if not isinstance(attn_bias, torch.Tensor):
            raise ValueError(f"attn_bias must be a torch.Tensor or None, got {type(attn_bias).__name__}")
        if attn_bias.device != q.device:
            raise ValueError(f"attn_bias is on {attn_bias.device}, q on {q.device}")
        if attn_bias.dim() > 4:
            raise ValueError(f"attn_bias has {attn_bias.dim()} dims; at most 4 (B, H, M, N)")
        try:
            torch.broadcast_shapes(tuple(attn_bias.shape), (B, H, M, N))
            ok = torch.broadcast_shapes(tuple(attn_bias.shape), (B, H, M, N)) == (B, H, M, N)
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"attn_bias shape {tuple(attn_bias.shape)} is not broadcastable to "
                             f"(B, H, M, N) = {(B, H, M, N)}")
        if not (attn_bias.dtype == torch.bool or attn_bias.is_floating_point()):
            raise ValueError(f"attn_bias.dtype={attn_bias.dtype}: expected an additive float bias or a bool mask")
        if attn_bias.dtype != torch.float32:
            # The kernels read the bias in float32, the one bias type the static report
            # compiles and the shipped tiles are chosen for: a 16-bit bias pointer changes
            # the compiled code (on sm_90 the key-padding tile at head dim 128 then needs
            # 296,000 bytes of shared memory, above the GPU's 232,448).
            attn_bias = _float32_bias(attn_bias)
    return attn_bias, scale


def _float32_bias(bias: torch.Tensor) -> torch.Tensor:
    """A bool mask (True = attend, as in torch's scaled_dot_product_attention) or a 16-bit
    bias as an additive float32 bias, its broadcast dims kept broadcast: .to() would write
    an expanded (stride 0) dim out in full, which turns a (B, 1, 1, N) key mask expanded to
    (B, H, M, N) into an M-times-larger copy that the kernels then read as a full bias (no
    key lengths, no skipped tiles). Converted once per stored element, then expanded
    again. A bias that needs a gradient is converted as it is (differentiable): its
    gradient must keep one value per element of the view it is, as torch gives it."""
    if bias.requires_grad:
        return bias.to(torch.float32)
    strides = bias.stride()
    stored = bias if 0 not in strides else bias[tuple(slice(0, 1) if st == 0 and n > 1 else slice(None)
                                                       for n, st in zip(bias.shape, strides))]
    if bias.dtype == torch.bool:
        out = torch.zeros(stored.shape, dtype=torch.float32, device=bias.device).masked_fill(~stored, float("-inf"))
    else:
        out = stored.to(torch.float32)
    return out if stored is bias else out.expand(bias.shape)


def _needs_grad(*tensors) -> bool:
    """Whether autograd will call the backward: then a 16-bit forward also keeps its
    rounding residual (one more output-sized tensor, see _attn_fwd)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _check_shared_memory(q: torch.Tensor, attn_bias: Optional[torch.Tensor], causal: bool, grads: bool) -> None:
    """ValueError, before anything runs, where this GPU has less shared memory per block
    than the call's default tiles need, the backward's included if it will run (grads;
    the forward op's store_lo): rather than a forward that runs and a backward that
    cannot launch (devices.NEEDS)."""
    if q.device.type != "cuda":
        return
    problem = devices.shared_memory_problem(torch.cuda.get_device_capability(q.device), q.dtype, q.shape[3],
                                            (_bias_variant(attn_bias, q.shape),), causal, grads)
    if problem:
        raise ValueError(problem)


def _bias_variant(attn_bias: Optional[torch.Tensor], q_shape) -> str:
    """The kernels' bias variant for a call, as _bias_args decides it, without touching
    the bias's values: "none", "keypad" where the bias expanded to (B, H, M, N) has query
    stride 0 (one query row of its own, M == 1, keeps its stride: "full"), else "full"."""
    if attn_bias is None:
        return "none"
    own = attn_bias.reshape((1,) * (4 - attn_bias.dim()) + tuple(attn_bias.shape))
    return "keypad" if own.expand(*q_shape[:3], own.shape[3]).stride(2) == 0 else "full"


def _check_causal(causal, causal_offset) -> tuple[bool, int]:
    if not isinstance(causal, bool):
        raise ValueError(f"causal={causal!r} must be a bool")
    if isinstance(causal_offset, bool) or not isinstance(causal_offset, (int, torch.SymInt)):
        raise ValueError(f"causal_offset={causal_offset!r} must be an int")
    if causal_offset and not causal:
        raise ValueError(f"causal_offset={causal_offset} without causal=True would be ignored: "
                         f"pass causal=True or drop the offset")
    return causal, int(causal_offset)


def flash_attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    attn_bias: Optional[torch.Tensor] = None, scale: Optional[float] = None, *, allow_tf32: bool = False,
    causal: bool = False, causal_offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): attention and the row log-sum-exp (natural log), both differentiable.

    lse[b, h, m] = log(sum_n exp(scale * q.k + bias)) over the keys row m sees, in
    float32, shape (B, H, M); -inf for a row that sees no key (all masked). Partial
    results over disjoint key sets combine exactly through it (ring / context-parallel
    attention). Arguments as in flash_attention.
    """
    causal, causal_offset = _check_causal(causal, causal_offset)
    attn_bias, scale = _prepare(q, k, v, attn_bias, scale)
    out, lse, shift, _ = _forward(q, k, v, attn_bias, scale, bool(allow_tf32),
                                  _needs_grad(q, k, v, attn_bias), causal, causal_offset)
    lse = lse * LN2
    return out, (lse + shift if attn_bias is not None else lse)


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    attn_bias: Optional[torch.Tensor] = None, scale: Optional[float] = None, *, allow_tf32: bool = False,
    causal: bool = False, causal_offset: int = 0,
) -> torch.Tensor:
    """softmax(q @ k^T * scale + attn_bias) @ v, FlashAttention-2 in Triton; differentiable.

    q: (B, H, M, D), k and v: (B, H, N, D), fp16 / bf16 / fp32, 8 <= D <= MAX_HEAD_DIM
    (limits.py); any strides with a contiguous last dim. attn_bias: None, an additive
    float tensor, or a bool mask (True = attend), broadcastable to (B, H, M, N); it is
    read through its strides, never expanded in memory (a bool or 16-bit bias as a float32
    copy in its own shape); a float bias that requires grad
    gets its gradient (see the module docstring for its memory). scale defaults to
    D ** -0.5. allow_tf32 lets fp32 inputs use tf32 tensor cores (otherwise fp32 is
    exact fp32). causal: query row i sees key j only if j <= i + causal_offset (offset
    0: top-left aligned, torch's scaled_dot_product_attention(is_causal=True); N - M:
    bottom-right); it combines with any bias, and key tiles a row cannot see are
    skipped, not computed. Returns q's dtype and layout. A query row that sees no key
    (all masked, or a negative offset) outputs zeros.
    """
    causal, causal_offset = _check_causal(causal, causal_offset)
    attn_bias, scale = _prepare(q, k, v, attn_bias, scale)
    out, _, _, _ = _forward(q, k, v, attn_bias, scale, bool(allow_tf32), _needs_grad(q, k, v, attn_bias),
                            causal, causal_offset)
    return out
