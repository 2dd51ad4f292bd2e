"""FlashAttention-2 in Triton: softmax(q k^T * scale + attn_bias) v without an M x N matrix.

Read top to bottom: the @triton.jit kernels, then the launchers that choose tiles and
grids, then the torch.library custom ops with their autograd, then the public functions.

The algorithm (Dao, "FlashAttention-2", 2023):

* forward: each program owns BLOCK_M query rows; their Q tile stays in registers while
  K/V tiles of BLOCK_N keys stream through. The softmax is computed online in fp32 in
  base 2: the factor log2(e) is folded into the scale, so every exponential is one
  exp2. The program writes its O rows and their log-sum-exp (LSE, stored in base 2).
* backward: delta = rowsum(dO * O) first; then one pass per key tile computes dK and dV
  (streaming Q, dO), and one pass per query tile computes dQ (streaming K, V). Each
  output element is written by exactly one program: no atomics, so the backward is
  deterministic too.
* the gradient of attn_bias, when it requires one, is dS = P * (dP - delta) summed over
  the dims the bias broadcasts over. A bias without a query dim (key padding) is summed
  over the queries inside the dK/dV pass, into (B, H, N); any other bias gets dS whole,
  (B, H, M, N) in fp32, written by the dQ pass, then summed on the host. These variants
  (`dkdv_dbias`, `dq_dbias`) hold more registers and have their own tile candidates.

Head dims are cut into at most two power-of-two pieces D0 >= D1 >= 16, each its own
dot (limits.split_head_dim: 40 = 32 + 16, 80 = 64 + 16, 160 = 128 + 32), rather than
padded to the next power of two; limits.py tabulates the waste against FlashAttention-2/3.
Head dim 8 still pays 50%: a tensor-core dot cannot reduce over fewer than 16.

Everything else the callers of a diffusion model produce:

* M and N from 1 up, any remainder: full tiles run without bounds checks and one last
  masked tile handles the remainder.
* attn_bias broadcastable to (B, H, M, N), read through its strides (0 on broadcast
  dims); a key-padding bias (stride 0 over queries) is loaded as one row per tile.
  A row whose keys are all -inf outputs zeros (and its LSE is -inf).
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

LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2): log(x) == log2(x) * LN2

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
    tl.static_assert(D0 >= 16 and (D0 & (D0 - 1)) == 0, "D0 must be a power of two >= 16")
    tl.static_assert(D1 == 0 or (D1 >= 16 and D1 <= D0 and (D1 & (D1 - 1)) == 0),
                     "D1 must be 0 or a power of two in [16, D0]")
    tl.static_assert(D0 + D1 >= HEAD_DIM, "the pieces must cover the head dim")
    tl.static_assert(BLOCK_M >= 16 and (BLOCK_M & (BLOCK_M - 1)) == 0, "BLOCK_M: power of two >= 16")
    tl.static_assert(BLOCK_N >= 16 and (BLOCK_N & (BLOCK_N - 1)) == 0, "BLOCK_N: power of two >= 16")


@triton.jit
def _load_pieces(base, offs_r, offs_d0, offs_d1, stride_r, rows_left, HEAD_DIM: tl.constexpr,
                 D0: tl.constexpr, D1: tl.constexpr, MASK_R: tl.constexpr, ALIGN: tl.constexpr):
    """Both head-dim pieces of a tile (_load_tile each); the second is the first again
    when there is one piece (a placeholder, never read)."""
    x0 = _load_tile(base, offs_r, offs_d0, stride_r, rows_left, HEAD_DIM, MASK_R, D0 > HEAD_DIM, ALIGN)
    if D1 > 0:
        x1 = _load_tile(base, offs_r, offs_d1, stride_r, rows_left, HEAD_DIM, MASK_R, D0 + D1 > HEAD_DIM, ALIGN)
    else:
        x1 = x0
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
def _load_bias(base, offs_m, offs_n, stride_bm, stride_bn, m_left, n_left,
               BIAS_PER_KEY: tl.constexpr, MASK_M: tl.constexpr, MASK_N: tl.constexpr,
               BIAS_ALIGN: tl.constexpr, BIAS_CONTIG: tl.constexpr):
    """The bias tile [len(offs_m), len(offs_n)] in fp32 and base-2 units, 0 outside.

    BIAS_PER_KEY: the bias does not depend on the query (key padding, stride 0 over M):
    one row is loaded and broadcast, not BLOCK_M copies of it. BIAS_CONTIG: stride_bn
    is 1 (vector loads along keys); BIAS_ALIGN divides stride_bm.
    """
    if BIAS_CONTIG:
        col_off = offs_n
    else:
        col_off = offs_n * stride_bn
    if BIAS_PER_KEY:
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
    return b.to(tl.float32) * 1.4426950408889634  # natural-log units -> base 2


@triton.jit
def _fwd_tile(acc0, acc1, m_i, l_i, q0, q1, q_base, stride_qm,
              k_base, v_base, b_base, stride_kn, stride_vn, stride_bm, stride_bn,
              offs_m, offs_n, offs_d0, offs_d1, m_left, n_left, qk_scale,
              HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr,
              HAS_BIAS: tl.constexpr, BIAS_PER_KEY: tl.constexpr, MASK_N: tl.constexpr,
             ALIGN: tl.constexpr, BIAS_ALIGN: tl.constexpr, BIAS_CONTIG: tl.constexpr,
              PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr, RELOAD: tl.constexpr):
    """One K/V tile of the online softmax: update (acc, m, l) for the program's queries.

    RELOAD: load the Q tile here, every iteration (from L1/L2), instead of holding it in
    registers across the loop: fewer registers at large head dims (see CONFIGS).
    """
    if RELOAD:
        q0, q1 = _load_pieces(q_base, offs_m, offs_d0, offs_d1, stride_qm, m_left, HEAD_DIM, D0, D1, True, ALIGN)
    # s = q @ k^T over the head-dim pieces, in base-2 units: qk_scale = scale * log2(e).
    k0 = _load_tile(k_base, offs_n, offs_d0, stride_kn, n_left, HEAD_DIM, MASK_N, D0 > HEAD_DIM, ALIGN)
    s = _dot(q0, tl.trans(k0), tl.zeros([q0.shape[0], k0.shape[0]], dtype=tl.float32),
             PRECISION, EMULATE_BF16)
    if D1 > 0:
        k1 = _load_tile(k_base, offs_n, offs_d1, stride_kn, n_left, HEAD_DIM, MASK_N, D0 + D1 > HEAD_DIM, ALIGN)
        s = _dot(q1, tl.trans(k1), s, PRECISION, EMULATE_BF16)
    s = s * qk_scale
    if HAS_BIAS:
        # Rows beyond M are masked (a full bias has no memory there); key columns only
        # in the last tile.
        s += _load_bias(b_base, offs_m, offs_n, stride_bm, stride_bn, m_left, n_left,
                        BIAS_PER_KEY, True, MASK_N, BIAS_ALIGN, BIAS_CONTIG)
    if MASK_N:
        s = tl.where(offs_n[None, :] < n_left, s, float("-inf"))

    # Online softmax. A row that has seen only -inf keeps m = -inf; exponentiate
    # against 0 instead so that exp2(-inf - -inf) never makes a NaN: its p and alpha
    # are 0, and its l stays 0.
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_ref)
    p = tl.math.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)

    # acc = acc * alpha + p @ v; p is rounded to the input dtype for the tensor-core dot,
    # as in FlashAttention (a no-op for fp32 inputs).
    v0 = _load_tile(v_base, offs_n, offs_d0, stride_vn, n_left, HEAD_DIM, MASK_N, D0 > HEAD_DIM, ALIGN)
    acc0 = _dot(p.to(v0.dtype), v0, acc0 * alpha[:, None], PRECISION, EMULATE_BF16)
    if D1 > 0:
        v1 = _load_tile(v_base, offs_n, offs_d1, stride_vn, n_left, HEAD_DIM, MASK_N, D0 + D1 > HEAD_DIM, ALIGN)
        acc1 = _dot(p.to(v1.dtype), v1, acc1 * alpha[:, None], PRECISION, EMULATE_BF16)
    return acc0, acc1, m_new, l_i


@triton.jit
def _attn_fwd(
    Q, K, V, Bias, Out, Lse, OutLo,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_bb, stride_bh, stride_bm, stride_bn,
    stride_ob, stride_oh, stride_om,
    H, M, N, qk_scale,
    M_KEY, N_KEY,  # autotuning keys only (lengths rounded to powers of two)
    HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr, BIAS_PER_KEY: tl.constexpr,
    ALIGN: tl.constexpr, BIAS_ALIGN: tl.constexpr, BIAS_CONTIG: tl.constexpr,
    PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr, RELOAD: tl.constexpr,
    STORE_LO: tl.constexpr,
):
    """Grid (cdiv(M, BLOCK_M), H, B): one program per BLOCK_M query rows of one head.

    STORE_LO (16-bit outputs that a backward will need): also write what rounding the
    output to its dtype lost, OutLo = (O - O.to(dtype)).to(dtype), with Out's strides,
    so that the backward's delta = rowsum(dO * O) sees O to about 16 more bits."""
    _check_tiles(HEAD_DIM, D0, D1, BLOCK_M, BLOCK_N)

    pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    row0 = pid_m.to(tl.int64) * BLOCK_M
    m_left = M - pid_m * BLOCK_M

    q_base = Q + tl.multiple_of(b * stride_qb + h * stride_qh + row0 * stride_qm, ALIGN)
    k_base = K + tl.multiple_of(b * stride_kb + h * stride_kh, ALIGN)
    v_base = V + tl.multiple_of(b * stride_vb + h * stride_vh, ALIGN)
    b_base = Bias + tl.multiple_of(b * stride_bb + h * stride_bh + row0 * stride_bm, BIAS_ALIGN)
    o_base = Out + tl.multiple_of(b * stride_ob + h * stride_oh + row0 * stride_om, ALIGN)

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d0 = tl.arange(0, D0)
    if D1 > 0:
        offs_d1 = D0 + tl.arange(0, D1)
    else:
        offs_d1 = offs_d0  # placeholder, never read

    # Placeholders ([1, 1]) stand for what does not exist: a second piece when D1 = 0,
    # a held Q tile when the tiles reload it. They are never read.
    if RELOAD:
        q0 = tl.zeros([1, 1], dtype=tl.float32)
        q1 = q0
    else:
        q0, q1 = _load_pieces(q_base, offs_m, offs_d0, offs_d1, stride_qm, m_left, HEAD_DIM, D0, D1, True, ALIGN)
    acc0 = tl.zeros([BLOCK_M, D0], dtype=tl.float32)
    if D1 > 0:
        acc1 = tl.zeros([BLOCK_M, D1], dtype=tl.float32)
    else:
        acc1 = tl.zeros([1, 1], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    # Full key tiles without bounds checks, then the remainder with them.
    n_full = (N // BLOCK_N) * BLOCK_N
    for start_n in range(0, n_full, BLOCK_N):
        acc0, acc1, m_i, l_i = _fwd_tile(
            acc0, acc1, m_i, l_i, q0, q1, q_base, stride_qm,
            k_base + tl.multiple_of(tl.cast(start_n, tl.int64) * stride_kn, ALIGN),
            v_base + tl.multiple_of(tl.cast(start_n, tl.int64) * stride_vn, ALIGN),
            b_base + tl.cast(start_n, tl.int64) * stride_bn,
            stride_kn, stride_vn, stride_bm, stride_bn,
            offs_m, offs_n, offs_d0, offs_d1, m_left, N - start_n, qk_scale,
            HEAD_DIM, D0, D1, HAS_BIAS, BIAS_PER_KEY, False, ALIGN, BIAS_ALIGN, BIAS_CONTIG,
            PRECISION, EMULATE_BF16, RELOAD)
    if n_full < N:
        acc0, acc1, m_i, l_i = _fwd_tile(
            acc0, acc1, m_i, l_i, q0, q1, q_base, stride_qm,
            k_base + tl.multiple_of(tl.cast(n_full, tl.int64) * stride_kn, ALIGN),
            v_base + tl.multiple_of(tl.cast(n_full, tl.int64) * stride_vn, ALIGN),
            b_base + tl.cast(n_full, tl.int64) * stride_bn,
            stride_kn, stride_vn, stride_bm, stride_bn,
            offs_m, offs_n, offs_d0, offs_d1, m_left, N - n_full, qk_scale,
            HEAD_DIM, D0, D1, HAS_BIAS, BIAS_PER_KEY, True, ALIGN, BIAS_ALIGN, BIAS_CONTIG,
            PRECISION, EMULATE_BF16, RELOAD)

    # Rows whose keys were all masked have l = 0: they output 0 and their LSE is -inf.
    dead = l_i == 0.0
    inv_l = 1.0 / tl.where(dead, 1.0, l_i)
    lse = tl.where(dead, float("-inf"), m_i + tl.math.log2(tl.where(dead, 1.0, l_i)))
    tl.store(Lse + (b * H + h) * M + row0 + offs_m, lse, mask=offs_m < m_left)
    o0 = acc0 * inv_l[:, None]
    o0_hi = o0.to(Out.dtype.element_ty)
    _store_tile(o_base, o0_hi, offs_m, offs_d0, stride_om, m_left, HEAD_DIM, D0 > HEAD_DIM, ALIGN)
    lo_base = OutLo + tl.multiple_of(b * stride_ob + h * stride_oh + row0 * stride_om, ALIGN)
    if STORE_LO:
        _store_tile(lo_base, (o0 - o0_hi.to(tl.float32)).to(Out.dtype.element_ty), offs_m, offs_d0,
                    stride_om, m_left, HEAD_DIM, D0 > HEAD_DIM, ALIGN)
    if D1 > 0:
        o1 = acc1 * inv_l[:, None]
        o1_hi = o1.to(Out.dtype.element_ty)
        _store_tile(o_base, o1_hi, offs_m, offs_d1, stride_om, m_left, HEAD_DIM, D0 + D1 > HEAD_DIM, ALIGN)
        if STORE_LO:
            _store_tile(lo_base, (o1 - o1_hi.to(tl.float32)).to(Out.dtype.element_ty), offs_m, offs_d1,
                        stride_om, m_left, HEAD_DIM, D0 + D1 > HEAD_DIM, ALIGN)


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
def _dkdv_tile(dk0, dk1, dv0, dv1, db, k0, k1, v0, v1, k_base, v_base, stride_kn, stride_vn,
               q_base, do_base, b_base, lse_base, delta_base,
               stride_qm, stride_dom, stride_bm, stride_bn,
               offs_m, offs_n, offs_d0, offs_d1, m_left, n_left, qk_scale,
               HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr,
               HAS_BIAS: tl.constexpr, BIAS_PER_KEY: tl.constexpr, MASK_M: tl.constexpr,
               ALIGN: tl.constexpr, BIAS_ALIGN: tl.constexpr, BIAS_CONTIG: tl.constexpr,
               PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr, RELOAD: tl.constexpr,
               BIAS_GRAD: tl.constexpr):
    """One Q/dO tile of the dK/dV pass, computed transposed (keys x queries).

    RELOAD: load the program's K and V tiles here (see _fwd_tile). BIAS_GRAD: add dS
    summed over this tile's queries to db (the gradient of a bias that does not depend
    on the query)."""
    if RELOAD:
        k0 = _load_tile(k_base, offs_n, offs_d0, stride_kn, n_left, HEAD_DIM, True, D0 > HEAD_DIM, ALIGN)
        v0 = _load_tile(v_base, offs_n, offs_d0, stride_vn, n_left, HEAD_DIM, True, D0 > HEAD_DIM, ALIGN)
        if D1 > 0:
            k1 = _load_tile(k_base, offs_n, offs_d1, stride_kn, n_left, HEAD_DIM, True, D0 + D1 > HEAD_DIM,
                            ALIGN)
            v1 = _load_tile(v_base, offs_n, offs_d1, stride_vn, n_left, HEAD_DIM, True, D0 + D1 > HEAD_DIM,
                            ALIGN)
    q0 = _load_tile(q_base, offs_m, offs_d0, stride_qm, m_left, HEAD_DIM, MASK_M, D0 > HEAD_DIM, ALIGN)
    sT = _dot(k0, tl.trans(q0), tl.zeros([k0.shape[0], q0.shape[0]], dtype=tl.float32),
              PRECISION, EMULATE_BF16)
    if D1 > 0:
        q1 = _load_tile(q_base, offs_m, offs_d1, stride_qm, m_left, HEAD_DIM, MASK_M, D0 + D1 > HEAD_DIM, ALIGN)
        sT = _dot(k1, tl.trans(q1), sT, PRECISION, EMULATE_BF16)
    sT = sT * qk_scale
    if HAS_BIAS:
        # The key rows of this tile may run past N (the tile is the program's own and
        # is masked on load); the query columns only in the last tile.
        if BIAS_PER_KEY:
            if BIAS_CONTIG:
                bT = tl.load(b_base + offs_n, mask=offs_n < n_left, other=0.0)
            else:
                bT = tl.load(b_base + offs_n * stride_bn, mask=offs_n < n_left, other=0.0)
            sT += (bT.to(tl.float32) * 1.4426950408889634)[:, None]
        else:
            sT += tl.trans(_load_bias(b_base, offs_m, offs_n, stride_bm, stride_bn, m_left, n_left,
                                      False, MASK_M, True, BIAS_ALIGN, BIAS_CONTIG))
    # The forward's LSE, in base 2. Rows beyond M load +inf and dead rows (LSE -inf)
    # become +inf, so that their p is exactly 0 instead of exp2(-inf - -inf) = NaN.
    if MASK_M:
        lse = tl.load(lse_base + offs_m, mask=offs_m < m_left, other=float("inf"))
        delta = tl.load(delta_base + offs_m, mask=offs_m < m_left, other=0.0)
    else:
        lse = tl.load(lse_base + offs_m)
        delta = tl.load(delta_base + offs_m)
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    pT = tl.math.exp2(sT - lse[None, :])

    do0 = _load_tile(do_base, offs_m, offs_d0, stride_dom, m_left, HEAD_DIM, MASK_M, D0 > HEAD_DIM, ALIGN)
    dv0 = _dot(pT.to(do0.dtype), do0, dv0, PRECISION, EMULATE_BF16)
    dpT = _dot(v0, tl.trans(do0), tl.zeros([k0.shape[0], q0.shape[0]], dtype=tl.float32),
               PRECISION, EMULATE_BF16)
    if D1 > 0:
        do1 = _load_tile(do_base, offs_m, offs_d1, stride_dom, m_left, HEAD_DIM, MASK_M, D0 + D1 > HEAD_DIM, ALIGN)
        dv1 = _dot(pT.to(do1.dtype), do1, dv1, PRECISION, EMULATE_BF16)
        dpT = _dot(v1, tl.trans(do1), dpT, PRECISION, EMULATE_BF16)
    # dS = P * (dP - delta): the gradient of the logits (natural units), which is also
    # the gradient of an additive bias; the scale of dK is applied once at the end.
    dsT = pT * (dpT - delta[None, :])
    if BIAS_GRAD:
        db += tl.sum(dsT, 1)
    dsT = dsT.to(q0.dtype)
    dk0 = _dot(dsT, q0, dk0, PRECISION, EMULATE_BF16)
    if D1 > 0:
        dk1 = _dot(dsT, q1, dk1, PRECISION, EMULATE_BF16)
    return dk0, dk1, dv0, dv1, db


@triton.jit
def _attn_bwd_dkdv(
    Q, K, V, Bias, DO, Lse, Delta, DK, DV, DBias,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_bb, stride_bh, stride_bm, stride_bn,
    stride_dob, stride_doh, stride_dom,
    stride_dkb, stride_dkh, stride_dkn,
    stride_dvb, stride_dvh, stride_dvn,
    stride_dbb, stride_dbh,
    H, M, N, qk_scale, sm_scale,
    M_KEY, N_KEY,
    HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr, BIAS_PER_KEY: tl.constexpr,
    ALIGN: tl.constexpr, BIAS_ALIGN: tl.constexpr, BIAS_CONTIG: tl.constexpr,
    PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr, RELOAD: tl.constexpr,
    BIAS_GRAD: tl.constexpr,
):
    """Grid (cdiv(N, BLOCK_N), H, B): dK and dV of BLOCK_N keys, streaming every query.

    BIAS_GRAD: also write dS summed over all queries, DBias[b, h, n] (contiguous in
    n): the gradient of a bias that does not depend on the query, such as key padding.
    (The dQ kernel writes the gradient of any other bias.)"""
    _check_tiles(HEAD_DIM, D0, D1, BLOCK_M, BLOCK_N)

    pid_n = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    col0 = pid_n.to(tl.int64) * BLOCK_N
    n_left = N - pid_n * BLOCK_N

    q_base = Q + tl.multiple_of(b * stride_qb + h * stride_qh, ALIGN)
    do_base = DO + tl.multiple_of(b * stride_dob + h * stride_doh, ALIGN)
    b_base = Bias + tl.multiple_of(b * stride_bb + h * stride_bh + col0 * stride_bn, BIAS_ALIGN)
    lse_base = Lse + (b * H + h) * M
    delta_base = Delta + (b * H + h) * M
    k_base = K + tl.multiple_of(b * stride_kb + h * stride_kh + col0 * stride_kn, ALIGN)
    v_base = V + tl.multiple_of(b * stride_vb + h * stride_vh + col0 * stride_vn, ALIGN)

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d0 = tl.arange(0, D0)
    if D1 > 0:
        offs_d1 = D0 + tl.arange(0, D1)
    else:
        offs_d1 = offs_d0  # placeholder, never read

    if RELOAD:
        k0 = tl.zeros([1, 1], dtype=tl.float32)
        k1 = k0
        v0 = k0
        v1 = k0
    else:
        k0 = _load_tile(k_base, offs_n, offs_d0, stride_kn, n_left, HEAD_DIM, True, D0 > HEAD_DIM, ALIGN)
        v0 = _load_tile(v_base, offs_n, offs_d0, stride_vn, n_left, HEAD_DIM, True, D0 > HEAD_DIM, ALIGN)
        if D1 > 0:
            k1 = _load_tile(k_base, offs_n, offs_d1, stride_kn, n_left, HEAD_DIM, True, D0 + D1 > HEAD_DIM,
                            ALIGN)
            v1 = _load_tile(v_base, offs_n, offs_d1, stride_vn, n_left, HEAD_DIM, True, D0 + D1 > HEAD_DIM,
                            ALIGN)
        else:
            k1 = k0
            v1 = v0
    if BIAS_GRAD:
        db = tl.zeros([BLOCK_N], dtype=tl.float32)
    else:
        db = tl.zeros([1], dtype=tl.float32)  # placeholder, never read
    dk0 = tl.zeros([BLOCK_N, D0], dtype=tl.float32)
    dv0 = tl.zeros([BLOCK_N, D0], dtype=tl.float32)
    if D1 > 0:
        dk1 = tl.zeros([BLOCK_N, D1], dtype=tl.float32)
        dv1 = tl.zeros([BLOCK_N, D1], dtype=tl.float32)
    else:
        dk1 = tl.zeros([1, 1], dtype=tl.float32)
        dv1 = tl.zeros([1, 1], dtype=tl.float32)

    m_full = (M // BLOCK_M) * BLOCK_M
    for start_m in range(0, m_full, BLOCK_M):
        dk0, dk1, dv0, dv1, db = _dkdv_tile(
            dk0, dk1, dv0, dv1, db, k0, k1, v0, v1, k_base, v_base, stride_kn, stride_vn,
            q_base + tl.multiple_of(tl.cast(start_m, tl.int64) * stride_qm, ALIGN),
            do_base + tl.multiple_of(tl.cast(start_m, tl.int64) * stride_dom, ALIGN),
            b_base + tl.cast(start_m, tl.int64) * stride_bm, lse_base + start_m, delta_base + start_m,
            stride_qm, stride_dom, stride_bm, stride_bn,
            offs_m, offs_n, offs_d0, offs_d1, M - start_m, n_left, qk_scale,
            HEAD_DIM, D0, D1, HAS_BIAS, BIAS_PER_KEY, False, ALIGN, BIAS_ALIGN, BIAS_CONTIG,
            PRECISION, EMULATE_BF16, RELOAD, BIAS_GRAD)
    if m_full < M:
        dk0, dk1, dv0, dv1, db = _dkdv_tile(
            dk0, dk1, dv0, dv1, db, k0, k1, v0, v1, k_base, v_base, stride_kn, stride_vn,
            q_base + tl.multiple_of(tl.cast(m_full, tl.int64) * stride_qm, ALIGN),
            do_base + tl.multiple_of(tl.cast(m_full, tl.int64) * stride_dom, ALIGN),
            b_base + tl.cast(m_full, tl.int64) * stride_bm, lse_base + m_full, delta_base + m_full,
            stride_qm, stride_dom, stride_bm, stride_bn,
            offs_m, offs_n, offs_d0, offs_d1, M - m_full, n_left, qk_scale,
            HEAD_DIM, D0, D1, HAS_BIAS, BIAS_PER_KEY, True, ALIGN, BIAS_ALIGN, BIAS_CONTIG,
            PRECISION, EMULATE_BF16, RELOAD, BIAS_GRAD)

    if BIAS_GRAD:
        tl.store(DBias + b * stride_dbb + h * stride_dbh + col0 + offs_n, db, mask=offs_n < n_left)
    dk_base = DK + tl.multiple_of(b * stride_dkb + h * stride_dkh + col0 * stride_dkn, ALIGN)
    dv_base = DV + tl.multiple_of(b * stride_dvb + h * stride_dvh + col0 * stride_dvn, ALIGN)
    _store_tile(dk_base, (dk0 * sm_scale).to(DK.dtype.element_ty), offs_n, offs_d0, stride_dkn, n_left,
                HEAD_DIM, D0 > HEAD_DIM, ALIGN)
    _store_tile(dv_base, dv0.to(DV.dtype.element_ty), offs_n, offs_d0, stride_dvn, n_left,
                HEAD_DIM, D0 > HEAD_DIM, ALIGN)
    if D1 > 0:
        _store_tile(dk_base, (dk1 * sm_scale).to(DK.dtype.element_ty), offs_n, offs_d1, stride_dkn, n_left,
                    HEAD_DIM, D0 + D1 > HEAD_DIM, ALIGN)
        _store_tile(dv_base, dv1.to(DV.dtype.element_ty), offs_n, offs_d1, stride_dvn, n_left,
                    HEAD_DIM, D0 + D1 > HEAD_DIM, ALIGN)


@triton.jit
def _dq_tile(dq0, dq1, q0, q1, do0, do1, q_base, do_base, stride_qm, stride_dom, lse, delta,
             k_base, v_base, b_base, db_base, stride_kn, stride_vn, stride_bm, stride_bn, stride_dbm,
             offs_m, offs_n, offs_d0, offs_d1, m_left, n_left, qk_scale,
             HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr,
             HAS_BIAS: tl.constexpr, BIAS_PER_KEY: tl.constexpr, MASK_N: tl.constexpr,
             ALIGN: tl.constexpr, BIAS_ALIGN: tl.constexpr, BIAS_CONTIG: tl.constexpr,
             PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr, RELOAD: tl.constexpr,
             BIAS_GRAD: tl.constexpr):
    """One K/V tile of the dQ pass. RELOAD: load the Q and dO tiles here (see _fwd_tile).
    BIAS_GRAD: store the dS tile (fp32) at db_base, the gradient of the bias."""
    if RELOAD:
        q0 = _load_tile(q_base, offs_m, offs_d0, stride_qm, m_left, HEAD_DIM, True, D0 > HEAD_DIM, ALIGN)
        do0 = _load_tile(do_base, offs_m, offs_d0, stride_dom, m_left, HEAD_DIM, True, D0 > HEAD_DIM, ALIGN)
        if D1 > 0:
            q1 = _load_tile(q_base, offs_m, offs_d1, stride_qm, m_left, HEAD_DIM, True, D0 + D1 > HEAD_DIM,
                            ALIGN)
            do1 = _load_tile(do_base, offs_m, offs_d1, stride_dom, m_left, HEAD_DIM, True, D0 + D1 > HEAD_DIM,
                             ALIGN)
    k0 = _load_tile(k_base, offs_n, offs_d0, stride_kn, n_left, HEAD_DIM, MASK_N, D0 > HEAD_DIM, ALIGN)
    v0 = _load_tile(v_base, offs_n, offs_d0, stride_vn, n_left, HEAD_DIM, MASK_N, D0 > HEAD_DIM, ALIGN)
    s = _dot(q0, tl.trans(k0), tl.zeros([q0.shape[0], k0.shape[0]], dtype=tl.float32),
             PRECISION, EMULATE_BF16)
    dp = _dot(do0, tl.trans(v0), tl.zeros([q0.shape[0], k0.shape[0]], dtype=tl.float32),
              PRECISION, EMULATE_BF16)
    if D1 > 0:
        k1 = _load_tile(k_base, offs_n, offs_d1, stride_kn, n_left, HEAD_DIM, MASK_N, D0 + D1 > HEAD_DIM, ALIGN)
        v1 = _load_tile(v_base, offs_n, offs_d1, stride_vn, n_left, HEAD_DIM, MASK_N, D0 + D1 > HEAD_DIM, ALIGN)
        s = _dot(q1, tl.trans(k1), s, PRECISION, EMULATE_BF16)
        dp = _dot(do1, tl.trans(v1), dp, PRECISION, EMULATE_BF16)
    s = s * qk_scale
    if HAS_BIAS:
        s += _load_bias(b_base, offs_m, offs_n, stride_bm, stride_bn, m_left, n_left,
                        BIAS_PER_KEY, True, MASK_N, BIAS_ALIGN, BIAS_CONTIG)
    if MASK_N:
        s = tl.where(offs_n[None, :] < n_left, s, float("-inf"))
    p = tl.math.exp2(s - lse[:, None])
    ds = p * (dp - delta[:, None])
    if BIAS_GRAD:
        db_ptrs = db_base + offs_m[:, None] * stride_dbm + offs_n[None, :]
        if MASK_N:
            tl.store(db_ptrs, ds, mask=(offs_m[:, None] < m_left) & (offs_n[None, :] < n_left))
        else:
            tl.store(db_ptrs, ds, mask=offs_m[:, None] < m_left)
    ds = ds.to(k0.dtype)
    dq0 = _dot(ds, k0, dq0, PRECISION, EMULATE_BF16)
    if D1 > 0:
        dq1 = _dot(ds, k1, dq1, PRECISION, EMULATE_BF16)
    return dq0, dq1


@triton.jit
def _attn_bwd_dq(
    Q, K, V, Bias, DO, Lse, Delta, DQ, DBias,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_bb, stride_bh, stride_bm, stride_bn,
    stride_dob, stride_doh, stride_dom,
    stride_dqb, stride_dqh, stride_dqm,
    stride_dbb, stride_dbh, stride_dbm,
    H, M, N, qk_scale, sm_scale,
    M_KEY, N_KEY,
    HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr, BIAS_PER_KEY: tl.constexpr,
    ALIGN: tl.constexpr, BIAS_ALIGN: tl.constexpr, BIAS_CONTIG: tl.constexpr,
    PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr, RELOAD: tl.constexpr,
    BIAS_GRAD: tl.constexpr,
):
    """Grid (cdiv(M, BLOCK_M), H, B): dQ of BLOCK_M queries, streaming every key.

    BIAS_GRAD: also write dS itself, DBias[b, h, m, n] (fp32, contiguous in n), the
    gradient of a bias that depends on the query; each element has one writer."""
    _check_tiles(HEAD_DIM, D0, D1, BLOCK_M, BLOCK_N)

    pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    row0 = pid_m.to(tl.int64) * BLOCK_M
    m_left = M - pid_m * BLOCK_M

    q_base = Q + tl.multiple_of(b * stride_qb + h * stride_qh + row0 * stride_qm, ALIGN)
    do_base = DO + tl.multiple_of(b * stride_dob + h * stride_doh + row0 * stride_dom, ALIGN)
    k_base = K + tl.multiple_of(b * stride_kb + h * stride_kh, ALIGN)
    v_base = V + tl.multiple_of(b * stride_vb + h * stride_vh, ALIGN)
    b_base = Bias + tl.multiple_of(b * stride_bb + h * stride_bh + row0 * stride_bm, BIAS_ALIGN)
    db_base = DBias + b * stride_dbb + h * stride_dbh + row0 * stride_dbm

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d0 = tl.arange(0, D0)
    if D1 > 0:
        offs_d1 = D0 + tl.arange(0, D1)
    else:
        offs_d1 = offs_d0  # placeholder, never read

    if RELOAD:
        q0 = tl.zeros([1, 1], dtype=tl.float32)
        q1 = q0
        do0 = q0
        do1 = q0
    else:
        q0 = _load_tile(q_base, offs_m, offs_d0, stride_qm, m_left, HEAD_DIM, True, D0 > HEAD_DIM, ALIGN)
        do0 = _load_tile(do_base, offs_m, offs_d0, stride_dom, m_left, HEAD_DIM, True, D0 > HEAD_DIM, ALIGN)
        if D1 > 0:
            q1 = _load_tile(q_base, offs_m, offs_d1, stride_qm, m_left, HEAD_DIM, True, D0 + D1 > HEAD_DIM,
                            ALIGN)
            do1 = _load_tile(do_base, offs_m, offs_d1, stride_dom, m_left, HEAD_DIM, True, D0 + D1 > HEAD_DIM,
                             ALIGN)
        else:
            q1 = q0
            do1 = do0
    dq0 = tl.zeros([BLOCK_M, D0], dtype=tl.float32)
    if D1 > 0:
        dq1 = tl.zeros([BLOCK_M, D1], dtype=tl.float32)
    else:
        dq1 = tl.zeros([1, 1], dtype=tl.float32)
    lse_ptrs = Lse + (b * H + h) * M + row0 + offs_m
    lse = tl.load(lse_ptrs, mask=offs_m < m_left, other=float("inf"))
    # Dead rows (all keys masked, LSE -inf) get p = 0 rather than NaN.
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    delta = tl.load(Delta + (b * H + h) * M + row0 + offs_m, mask=offs_m < m_left, other=0.0)

    n_full = (N // BLOCK_N) * BLOCK_N
    for start_n in range(0, n_full, BLOCK_N):
        dq0, dq1 = _dq_tile(
            dq0, dq1, q0, q1, do0, do1, q_base, do_base, stride_qm, stride_dom, lse, delta,
            k_base + tl.multiple_of(tl.cast(start_n, tl.int64) * stride_kn, ALIGN),
            v_base + tl.multiple_of(tl.cast(start_n, tl.int64) * stride_vn, ALIGN),
            b_base + tl.cast(start_n, tl.int64) * stride_bn, db_base + tl.cast(start_n, tl.int64),
            stride_kn, stride_vn, stride_bm, stride_bn, stride_dbm,
            offs_m, offs_n, offs_d0, offs_d1, m_left, N - start_n, qk_scale,
            HEAD_DIM, D0, D1, HAS_BIAS, BIAS_PER_KEY, False, ALIGN, BIAS_ALIGN, BIAS_CONTIG,
            PRECISION, EMULATE_BF16, RELOAD, BIAS_GRAD)
    if n_full < N:
        dq0, dq1 = _dq_tile(
            dq0, dq1, q0, q1, do0, do1, q_base, do_base, stride_qm, stride_dom, lse, delta,
            k_base + tl.multiple_of(tl.cast(n_full, tl.int64) * stride_kn, ALIGN),
            v_base + tl.multiple_of(tl.cast(n_full, tl.int64) * stride_vn, ALIGN),
            b_base + tl.cast(n_full, tl.int64) * stride_bn, db_base + tl.cast(n_full, tl.int64),
            stride_kn, stride_vn, stride_bm, stride_bn, stride_dbm,
            offs_m, offs_n, offs_d0, offs_d1, m_left, N - n_full, qk_scale,
            HEAD_DIM, D0, D1, HAS_BIAS, BIAS_PER_KEY, True, ALIGN, BIAS_ALIGN, BIAS_CONTIG,
            PRECISION, EMULATE_BF16, RELOAD, BIAS_GRAD)

    dq_base = DQ + tl.multiple_of(b * stride_dqb + h * stride_dqh + row0 * stride_dqm, ALIGN)
    _store_tile(dq_base, (dq0 * sm_scale).to(DQ.dtype.element_ty), offs_m, offs_d0, stride_dqm, m_left,
                HEAD_DIM, D0 > HEAD_DIM, ALIGN)
    if D1 > 0:
        _store_tile(dq_base, (dq1 * sm_scale).to(DQ.dtype.element_ty), offs_m, offs_d1, stride_dqm, m_left,
                    HEAD_DIM, D0 + D1 > HEAD_DIM, ALIGN)


# =====================================================================================
# Launchers: head-dim pieces, tile configurations, grids
# =====================================================================================


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # Reload the loop-invariant operand tiles (Q; K and V in the dK/dV pass) every
    # iteration instead of holding them in registers: for large head dims.
    reload: bool = False

    def __str__(self) -> str:
        r = "-r" if self.reload else ""
        return f"M{self.block_m}-N{self.block_n}-w{self.num_warps}-s{self.num_stages}{r}"


# The autotuning candidates, by target, kernel, input width and padded head dim (the
# smallest bound that holds it). `python -m attnkit.kernels.inspect` compiles every
# entry for its target (sm_80 for "sm80", sm_90 for "sm90"), with no bias, a key-padding
# bias and a full bias, and fails if one spills registers or exceeds shared memory; the
# entries that failed were removed rather than shipped. Hopper gets its own lists: its warp-group
# MMA reads operands from shared memory, so what spills differs (the reload variant
# helps on sm_80 and hurts on sm_90). The first entry of each list is the one used
# without autotuning (ATTNKIT_TRITON_AUTOTUNE=0).
# For the dK/dV kernel, block_n is the key tile the program keeps and block_m the query
# tile it streams; for the forward and dQ kernels block_m is kept and block_n streamed.
_C = TileConfig
# fp32 inputs: exact fp32 dots run on FMA units, whose Triton lowering holds whole
# head-dim rows of both operands in registers, so fp32 needs 16-row tiles, the reload
# variant and mostly 8 warps; larger tiles (M32, or M16-N32 on 4 warps at head dim >= 80)
# spill on both targets. Every entry below compiles with no stack and in shared memory
# on sm_80 and sm_90 for head dims 40/64/80/128/160/256 and all three bias variants
# (`python -m attnkit.kernels.inspect --dtype fp32`, part of its default gate). Registers
# per thread, the most over the three biases, sm_80/sm_90:
#
#                     D=40    64      80      128     160     256
#   fwd  M16-N32-w8  128/134 79/69   -       -       -       188/182
#   fwd  M16-N16-w4  80/88   80/76   128/128 136/139 142/144 -
#   fwd  M16-N16-w8  -       -       128/126 80/70   111/134 150/108
#   dkdv M16-N32-w8  128/111 103/128 -       -       186/180 -
#   dkdv M16-N16-w8  -       -       139/128 126/122 -       -
#   dkdv M16-N16-w4  -       -       150/148 168/146 180/182 255/250
#   dq   M16-N32-w8  128/130 78/86   128/138 128/104 -       176/182
#   dq   M16-N16-w8  74/78   80/72   128/108 80/82   128/104 128/128
#   dq   M16-N16-w4  80/84   96/90   -       -       182/149 246/246
#
# ("-": not shipped there; some of those spill 8-1800 B on one target.) tf32
# (allow_tf32=True) uses tensor cores and the 16-bit lists' speed class.
_FP32 = {
    "fwd": {64: (_C(16, 32, 8, 2, True), _C(16, 16, 4, 2, True)),
            128: (_C(16, 16, 4, 2, True), _C(16, 16, 8, 2, True)),
            192: (_C(16, 16, 4, 2, True), _C(16, 16, 8, 2, True)),
            256: (_C(16, 32, 8, 2, True), _C(16, 16, 8, 2, True))},
    "dkdv": {64: (_C(16, 32, 8, 2, True),),
             128: (_C(16, 16, 8, 2, True), _C(16, 16, 4, 2, True)),
             192: (_C(16, 32, 8, 2, True), _C(16, 16, 4, 2, True)),
             256: (_C(16, 16, 4, 2, True),)},
    "dq": {64: (_C(16, 32, 8, 2, True), _C(16, 16, 8, 2, True), _C(16, 16, 4, 2, True)),
           128: (_C(16, 32, 8, 2, True), _C(16, 16, 8, 2, True)),
           192: (_C(16, 16, 8, 2, True), _C(16, 16, 4, 2, True)),
           # M16-N32 first would need 102400 B of shared memory: more than sm_86 has.
           256: (_C(16, 16, 8, 2, True), _C(16, 32, 8, 2, True), _C(16, 16, 4, 2, True))},
}
CONFIGS: dict[str, dict[str, dict[str, dict[int, tuple[TileConfig, ...]]]]] = {
    "sm80": {
        "fwd": {"16bit": {
            64: (_C(64, 64, 4, 3), _C(128, 64, 8, 3), _C(128, 32, 8, 3)),
            128: (_C(128, 32, 8, 3), _C(64, 32, 4, 3, True)),
            192: (_C(64, 32, 4, 2),),
            256: (_C(64, 32, 8, 2, True), _C(32, 32, 4, 2, True)),
        }, "32bit": _FP32["fwd"]},
        "dkdv": {"16bit": {
            64: (_C(32, 64, 4, 3), _C(32, 128, 8, 3)),
            128: (_C(32, 64, 8, 2, True), _C(32, 32, 4, 2, True)),
            192: (_C(16, 32, 8, 2, True), _C(16, 16, 4, 2, True)),
            256: (_C(16, 32, 8, 2, True), _C(32, 16, 4, 2, True), _C(16, 16, 4, 2, True)),
        }, "32bit": _FP32["dkdv"]},
        "dq": {"16bit": {
            64: (_C(64, 32, 4, 3), _C(128, 32, 8, 3)),
            128: (_C(64, 32, 8, 2, True), _C(64, 64, 8, 2, True)),
            192: (_C(64, 32, 8, 2, True),),
            256: (_C(32, 32, 8, 2, True), _C(64, 32, 8, 2, True), _C(16, 32, 4, 2, True)),
        }, "32bit": _FP32["dq"]},
    },
    "sm90": {
        "fwd": {"16bit": {
            64: (_C(128, 32, 8, 3), _C(64, 32, 4, 3)),
            128: (_C(128, 32, 8, 3), _C(64, 32, 4, 3)),
            192: (_C(128, 32, 8, 2), _C(64, 64, 8, 2), _C(64, 32, 4, 2), _C(64, 32, 8, 3)),
            256: (_C(64, 32, 8, 2),),
        }, "32bit": _FP32["fwd"]},
        "dkdv": {"16bit": {
            64: (_C(32, 64, 4, 3), _C(32, 128, 8, 3)),
            128: (_C(32, 64, 8, 2),),
            192: (_C(16, 64, 8, 2),),
            256: (_C(16, 32, 8, 2, True), _C(16, 16, 4, 2, True)),
        }, "32bit": _FP32["dkdv"]},
        "dq": {"16bit": {
            64: (_C(64, 32, 4, 3), _C(128, 32, 8, 3)),
            128: (_C(64, 32, 8, 2), _C(64, 32, 4, 3), _C(128, 32, 8, 2)),
            192: (_C(64, 32, 8, 2), _C(128, 32, 8, 2)),
            256: (_C(32, 32, 8, 2, True), _C(16, 32, 4, 2, True)),
        }, "32bit": _FP32["dq"]},
    },
}
# With the bias gradient (BIAS_GRAD): dK/dV also sums dS over the queries (BLOCK_N more
# fp32 registers), dQ also stores dS tiles (their addresses and masks stay live). Built
# from the lists above, less what spilled that way, plus smaller tiles where nothing
# was left; checked the same way (the inspector's dkdv_dbias and dq_dbias kernels).
# fwd_lo: the forward that also stores its rounding residual (STORE_LO, 16-bit only; a
# store after the loop); the same candidates.
for _arch in ("sm80", "sm90"):
    CONFIGS[_arch]["fwd_lo"] = CONFIGS[_arch]["fwd"]
CONFIGS["sm80"]["dkdv_dbias"] = {
    "16bit": {64: (_C(32, 64, 4, 3),),
              **{d: CONFIGS["sm80"]["dkdv"]["16bit"][d] for d in (128, 192, 256)}},
    "32bit": {64: (_C(16, 16, 4, 2, True),),
              128: (_C(16, 16, 8, 2, True),),
              192: (_C(16, 32, 8, 2, True),),
              256: (_C(16, 16, 4, 2, True),)},
}
CONFIGS["sm80"]["dq_dbias"] = {
    "16bit": {64: CONFIGS["sm80"]["dq"]["16bit"][64],
              128: (_C(32, 32, 8, 2, True), _C(32, 32, 4, 2, True)),
              192: (_C(32, 32, 8, 2, True), _C(16, 32, 4, 2, True)),
              256: (_C(16, 32, 4, 2, True),)},
    "32bit": {64: (_C(16, 16, 4, 2, True), _C(16, 32, 8, 2, True)),
              128: (_C(16, 16, 8, 2, True), _C(16, 32, 8, 2, True)),
              192: (_C(16, 16, 8, 2, True),),
              256: (_C(16, 16, 8, 2, True),)},
}
CONFIGS["sm90"]["dkdv_dbias"] = {
    "16bit": CONFIGS["sm90"]["dkdv"]["16bit"],
    "32bit": {64: (_C(16, 32, 8, 2, True),),
              128: (_C(16, 16, 4, 2, True), _C(16, 16, 8, 2, True)),
              192: (_C(16, 32, 8, 2, True),),
              256: (_C(16, 16, 4, 2, True),)},
}
CONFIGS["sm90"]["dq_dbias"] = {
    "16bit": {64: (_C(64, 32, 8, 3),),
              128: (_C(64, 32, 8, 2),),
              192: (_C(64, 32, 8, 2),),
              256: (_C(16, 32, 4, 2, True),)},
    "32bit": {64: (_C(16, 16, 4, 2, True), _C(16, 16, 8, 2, True)),
              128: (_C(16, 16, 8, 2, True),),
              192: (_C(16, 16, 8, 2, True),),
              256: (_C(16, 16, 8, 2, True),)},
}
del _C

# Under the interpreter, tiles are small so that tests cross many tile boundaries.
INTERPRET_CONFIG = TileConfig(32, 32, 4, 1)
ARCHS = ("sm80", "sm90")


def _band(padded: int) -> int:
    for bound in (64, 128, 192, 256):
        if padded <= bound:
            return bound
    raise ValueError(f"padded head dim {padded} exceeds {MAX_HEAD_DIM}")


def _width(dtype: torch.dtype) -> str:
    return "32bit" if dtype == torch.float32 else "16bit"


def arch_of(device: torch.device) -> str:
    """The CONFIGS target of a device: "sm90" for compute capability 9.0 and newer
    (newer ones are not checked separately), "sm80" below."""
    if device.type != "cuda":
        return "sm80"
    return "sm90" if torch.cuda.get_device_capability(device)[0] >= 9 else "sm80"


def configs_for(kernel: str, head_dim: int, dtype: torch.dtype, arch: str = "sm90") -> tuple[TileConfig, ...]:
    """The autotuning candidates of one kernel ("fwd", "dkdv", "dq") at this head dim."""
    return CONFIGS[arch][kernel][_width(dtype)][_band(padded_head_dim(head_dim))]


def _autotune_enabled() -> bool:
    return os.environ.get("ATTNKIT_TRITON_AUTOTUNE", "1") not in ("0", "")


# One triton.autotune wrapper per (target, kernel, width, band), built on first use: each
# has its own candidates and its own cache of best configs, keyed by head dim and by the
# query / key lengths rounded up to powers of two (M_KEY, N_KEY).
_TUNERS: dict[tuple[str, str, str, int], object] = {}
# The *_dbias entries are the same kernels when they also write the bias gradient
# (BIAS_GRAD): more live registers, so their own candidates.
_KERNELS = {"fwd": _attn_fwd, "dkdv": _attn_bwd_dkdv, "dq": _attn_bwd_dq,
            "fwd_lo": _attn_fwd, "dkdv_dbias": _attn_bwd_dkdv, "dq_dbias": _attn_bwd_dq}


def _kernel_for(kernel: str, head_dim: int, dtype: torch.dtype, device: torch.device):
    """(callable kernel, fixed config or None): the autotuner, or the plain kernel."""
    if INTERPRET:
        return _KERNELS[kernel], INTERPRET_CONFIG
    arch = arch_of(device)
    cands = configs_for(kernel, head_dim, dtype, arch)
    if not _autotune_enabled():
        return _KERNELS[kernel], cands[0]
    key = (arch, kernel, _width(dtype), _band(padded_head_dim(head_dim)))
    tuner = _TUNERS.get(key)
    if tuner is None:
        tuner = triton.autotune(
            configs=[
                triton.Config({"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "RELOAD": c.reload},
                              num_warps=c.num_warps, num_stages=c.num_stages)
                for c in cands
            ],
            key=["HEAD_DIM", "M_KEY", "N_KEY"],
        )(_KERNELS[kernel])
        _TUNERS[key] = tuner
    return tuner, None


# Fused multiply-add contraction (s * scale + bias in one rounding), stated rather than
# left to TRITON_DEFAULT_FP_FUSION, whose default Triton plans to change. The inspector
# compiles with the same options. Not passed to the interpreter, which has no such option.
_COMPILE_OPTIONS = {} if INTERPRET else {"enable_fp_fusion": True}


def _launch(kernel: str, head_dim: int, dtype: torch.dtype, grid_rows: int, rows_axis_block: str,
            b: int, h: int, args: tuple, constexprs: dict) -> None:
    fn, cfg = _kernel_for(kernel, head_dim, dtype, args[0].device)
    if cfg is None:
        def grid(meta):
            return (triton.cdiv(grid_rows, meta[rows_axis_block]), h, b)

        fn[grid](*args, **constexprs, **_COMPILE_OPTIONS)
    else:
        block = cfg.block_m if rows_axis_block == "BLOCK_M" else cfg.block_n
        fn[(triton.cdiv(grid_rows, block), h, b)](
            *args, **constexprs, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, RELOAD=cfg.reload,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **_COMPILE_OPTIONS)


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


def _bias_args(attn_bias: Optional[torch.Tensor], q: torch.Tensor, shape4) -> tuple:
    """(pointer, strides (b, h, m, n), constexprs) for a broadcastable bias.

    expand() is a view: broadcast dims get stride 0 and nothing is copied.
    """
    if attn_bias is None:
        return q, (0, 0, 0, 0), dict(HAS_BIAS=False, BIAS_PER_KEY=False, BIAS_ALIGN=1, BIAS_CONTIG=False)
    bias = attn_bias.expand(shape4)
    if max(bias.stride()[2:]) * (_MAX_TILE_ROWS - 1) >= 2**31:
        # A tile's rows or columns would span 2**31 elements (see _addressable): compact
        # the bias in its own, unexpanded shape.
        bias = attn_bias.contiguous().expand(shape4)
    sb = tuple(bias.stride())
    return bias, sb, dict(HAS_BIAS=True, BIAS_PER_KEY=sb[2] == 0, BIAS_ALIGN=_align(*sb[:3]),
                          BIAS_CONTIG=sb[3] == 1)


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
    return x.stride(-1) == 1 and x.stride(-2) * (_MAX_TILE_ROWS - 1) < 2**31


def _kernel_layout(x: torch.Tensor) -> torch.Tensor:
    return x if _addressable(x) else x.contiguous()


def _forward_impl(q, k, v, attn_bias, scale: float, allow_tf32: bool, store_lo: bool = False):
    """Launch the forward. Returns (out like q, LSE (B, H, M) fp32 in base 2, out_lo):
    out_lo, only if store_lo and the dtype is 16-bit (else None), is what rounding out
    lost, with out's strides (see _attn_fwd)."""
    B, H, M, D = q.shape
    N = k.shape[2]
    store_lo = store_lo and q.dtype != torch.float32
    out = _new_like(q)  # keeps q's layout, so a (B, M, H, D) view stays one
    out_lo = _new_like(out) if store_lo else None
    lse = _new((B, H, M), q.device)
    if M == 0 or B == 0 or H == 0:
        return out, lse, out_lo
    q, k, v = (_kernel_layout(t) for t in (q, k, v))
    o = out if _addressable(out) else _new_like(out, memory_format=torch.contiguous_format)
    lo = out_lo if (out_lo is None or o is out) else _new_like(o)
    bias, sb, bias_constexprs = _bias_args(attn_bias, q, (B, H, M, N))
    d0, d1 = split_head_dim(D)
    m_key, n_key = _lengths_key(M, N)
    align = _align(*(st for t in (q, k, v, o) for st in t.stride()[:3]))
    assert lo is None or lo.stride() == o.stride()
    args = (q, k, v, bias, o, lse, o if lo is None else lo,
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            *sb,
            o.stride(0), o.stride(1), o.stride(2),
            H, M, N, float(scale) * LOG2E, m_key, n_key)
    constexprs = dict(HEAD_DIM=D, D0=d0, D1=d1, ALIGN=align, **bias_constexprs,
                      PRECISION=_precision(q.dtype, allow_tf32),
                      EMULATE_BF16=INTERPRET and q.dtype == torch.bfloat16)
    _launch("fwd_lo" if store_lo else "fwd", D, q.dtype, M, "BLOCK_M", B, H, args,
            dict(constexprs, STORE_LO=store_lo))
    if o is not out:
        out.copy_(o)
        if store_lo:
            out_lo.copy_(lo)
    return out, lse, out_lo


def _backward_impl(do, q, k, v, attn_bias, out, lse, scale: float, allow_tf32: bool, dlse=None,
                   bias_grad: bool = False, out_lo=None):
    """Launch the three backward kernels. Returns (dq, dk, dv, dbias): dq, dk, dv like
    their inputs; dbias shaped and typed like attn_bias if bias_grad, else None.

    dlse: the gradient of the base-2 LSE output, or None. Since d lse2 / d s = p * log2(e),
    it folds into delta: dS = P * (dP - (delta - dlse * log2(e))). out_lo: the forward's
    rounding residual of out (same shape and strides), or None.

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
        dq, dk, dv, _ = _backward_impl(do, q, k, v, attn_bias, out, lse, scale, allow_tf32, dlse,
                                       out_lo=out_lo)
        if dlse is None:
            return dq, dk, dv, torch.zeros_like(attn_bias, memory_format=torch.contiguous_format)
        # d lse2 / d bias = log2(e) for a bias added to a whole row.
        row = (dlse.to(torch.float32) * LOG2E).unsqueeze(-1)  # (B, H, M, 1)
        return dq, dk, dv, row.sum_to_size(attn_bias.shape).to(attn_bias.dtype).contiguous()
    # Which kernel writes the bias gradient: dQ the whole dS (B, H, M, N), or dK/dV dS
    # summed over the queries (B, H, N).
    per_query = bias_grad and attn_bias.dim() >= 2 and attn_bias.shape[-2] != 1
    per_key = bias_grad and not per_query
    if bias_grad:
        dbias_t = _new((B, H, M, N) if per_query else (B, H, N), q.device)
    if B == 0 or H == 0 or M == 0:
        for t in (dq, dk, dv) + ((dbias_t,) if bias_grad else ()):
            t.zero_()
        return dq, dk, dv, _reduce_bias_grad(dbias_t, attn_bias) if bias_grad else None
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

    bias, sb, bias_constexprs = _bias_args(attn_bias, q, (B, H, M, N))
    d0, d1 = split_head_dim(D)
    m_key, n_key = _lengths_key(M, N)
    align = _align(*(st for t in (q, k, v, do, dq_, dk_, dv_) for st in t.stride()[:3]))
    constexprs = dict(HEAD_DIM=D, D0=d0, D1=d1, ALIGN=align, **bias_constexprs,
                      PRECISION=_precision(q.dtype, allow_tf32),
                      EMULATE_BF16=INTERPRET and q.dtype == torch.bfloat16)
    common = (q.stride(0), q.stride(1), q.stride(2),
              k.stride(0), k.stride(1), k.stride(2),
              v.stride(0), v.stride(1), v.stride(2),
              *sb,
              do.stride(0), do.stride(1), do.stride(2))
    qk_scale = float(scale) * LOG2E
    # A kernel that does not write the bias gradient gets a placeholder pointer.
    db = dbias_t if bias_grad else lse
    _launch("dkdv_dbias" if per_key else "dkdv", D, q.dtype, N, "BLOCK_N", B, H,
            (q, k, v, bias, do, lse, delta, dk_, dv_, db, *common,
             dk_.stride(0), dk_.stride(1), dk_.stride(2),
             dv_.stride(0), dv_.stride(1), dv_.stride(2),
             *((db.stride(0), db.stride(1)) if per_key else (0, 0)),
             H, M, N, qk_scale, float(scale), m_key, n_key),
            dict(constexprs, BIAS_GRAD=per_key))
    _launch("dq_dbias" if per_query else "dq", D, q.dtype, M, "BLOCK_M", B, H,
            (q, k, v, bias, do, lse, delta, dq_, db, *common,
             dq_.stride(0), dq_.stride(1), dq_.stride(2),
             *((db.stride(0), db.stride(1), db.stride(2)) if per_query else (0, 0, 0)),
             H, M, N, qk_scale, float(scale), m_key, n_key),
            dict(constexprs, BIAS_GRAD=per_query))
    for final, tmp in ((dq, dq_), (dk, dk_), (dv, dv_)):
        if final is not tmp:
            final.copy_(tmp)
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
    scale: float, allow_tf32: bool, store_lo: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, lse2, out_lo); out_lo is an empty placeholder unless store_lo (16-bit only)."""
    out, lse, out_lo = _forward_impl(q, k, v, attn_bias, scale, allow_tf32, store_lo)
    return out, lse, (q.new_empty(0) if out_lo is None else out_lo)


@_flash_forward_op.register_fake
def _(q, k, v, attn_bias, scale, allow_tf32, store_lo):
    B, H, M, _ = q.shape
    out_lo = torch.empty_like(q) if store_lo and q.dtype != torch.float32 else q.new_empty(0)
    return torch.empty_like(q), q.new_empty((B, H, M), dtype=torch.float32), out_lo


@torch.library.custom_op("attnkit::flash_attention_backward", mutates_args=())
def _flash_backward_op(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    attn_bias: Optional[torch.Tensor], out: torch.Tensor, lse: torch.Tensor, out_lo: torch.Tensor,
    dlse: Optional[torch.Tensor], scale: float, allow_tf32: bool, bias_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dbias); dbias is an empty placeholder unless bias_grad. out_lo: the
    forward's placeholder or residual."""
    dq, dk, dv, dbias = _backward_impl(do, q, k, v, attn_bias, out, lse, scale, allow_tf32, dlse, bias_grad,
                                       out_lo if out_lo.numel() else None)
    return dq, dk, dv, (q.new_empty(0) if dbias is None else dbias)


@_flash_backward_op.register_fake
def _(do, q, k, v, attn_bias, out, lse, out_lo, dlse, scale, allow_tf32, bias_grad):
    dbias = (torch.empty(attn_bias.shape, dtype=attn_bias.dtype, device=attn_bias.device)
             if bias_grad and attn_bias is not None else q.new_empty(0))
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dbias


def _setup_context(ctx, inputs, output):
    q, k, v, attn_bias, scale, allow_tf32, store_lo = inputs
    out, lse, out_lo = output
    ctx.save_for_backward(q, k, v, attn_bias, out, lse, out_lo)
    ctx.scale = scale
    ctx.allow_tf32 = allow_tf32


def _backward(ctx, dout, dlse, _dout_lo):
    q, k, v, attn_bias, out, lse, out_lo = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    bias_grad = attn_bias is not None and ctx.needs_input_grad[3]
    dq, dk, dv, dbias = _flash_backward_op(dout, q, k, v, attn_bias, out, lse, out_lo, dlse, ctx.scale,
                                           ctx.allow_tf32, bias_grad)
    return dq, dk, dv, (dbias if bias_grad else None), None, None, None


_flash_forward_op.register_autograd(_backward, setup_context=_setup_context)


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
        if attn_bias.dtype == torch.bool:
            # True = attend, as in torch's scaled_dot_product_attention. Converted once, in
            # the mask's own (broadcast) shape.
            attn_bias = torch.zeros(attn_bias.shape, dtype=torch.float32, device=attn_bias.device
                                    ).masked_fill(~attn_bias, float("-inf"))
        elif not attn_bias.is_floating_point():
            raise ValueError(f"attn_bias.dtype={attn_bias.dtype}: expected an additive float bias or a bool mask")
        elif attn_bias.dtype not in (torch.float32, q.dtype):
            attn_bias = attn_bias.to(torch.float32)  # differentiable: a gradient flows back
    return attn_bias, scale


def _needs_grad(*tensors) -> bool:
    """Whether autograd will call the backward: then a 16-bit forward also keeps its
    rounding residual (one more output-sized tensor, see _attn_fwd)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def flash_attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    attn_bias: Optional[torch.Tensor] = None, scale: Optional[float] = None, *, allow_tf32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): attention and the row log-sum-exp (natural log), both differentiable.

    lse[b, h, m] = log(sum_n exp(scale * q.k + bias)) in float32, shape (B, H, M); -inf
    for a row whose keys are all masked. Partial results over disjoint key sets combine
    exactly through it (ring / context-parallel attention).
    """
    attn_bias, scale = _prepare(q, k, v, attn_bias, scale)
    out, lse2, _ = _flash_forward_op(q, k, v, attn_bias, scale, bool(allow_tf32), _needs_grad(q, k, v, attn_bias))
    return out, lse2 * LN2


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    attn_bias: Optional[torch.Tensor] = None, scale: Optional[float] = None, *, allow_tf32: bool = False,
) -> torch.Tensor:
    """softmax(q @ k^T * scale + attn_bias) @ v, FlashAttention-2 in Triton; differentiable.

    q: (B, H, M, D), k and v: (B, H, N, D), fp16 / bf16 / fp32, 8 <= D <= 256; any
    strides with a contiguous last dim. attn_bias: None, an additive float tensor, or a
    bool mask (True = attend), broadcastable to (B, H, M, N); it is read through its
    strides, never expanded in memory; a float bias that requires grad gets its gradient
    (see the module docstring for its memory). scale defaults to D ** -0.5. allow_tf32
    lets fp32 inputs use tf32 tensor cores (otherwise fp32 is exact fp32). Returns q's
    dtype and layout. A query row whose keys are all masked outputs zeros.
    """
    attn_bias, scale = _prepare(q, k, v, attn_bias, scale)
    out, _, _ = _flash_forward_op(q, k, v, attn_bias, scale, bool(allow_tf32), _needs_grad(q, k, v, attn_bias))
    return out
