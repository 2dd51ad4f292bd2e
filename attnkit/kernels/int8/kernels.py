"""The INT8 attention forward in Triton: softmax(dequant(q8 k8^T) + attn_bias) v, with the
query-key products on integer tensor cores and P.V in the inputs' 16-bit dtype.

This module holds the @triton.jit code only; int8/quant.py the quantisation, int8/ops.py
the host side. It reuses the exact kernel's helpers (flash/kernels.py) for everything
but the scores: tiles of V and of the output in head-dim pieces, the bias and its key
lengths, causal masks, the order of the loops.

Inputs (int8/quant.py makes them):

* q8 (B, H, M, DQ0 + DQ1) and k8 (B, H, N, DQ0 + DQ1), int8, contiguous, the head dim
  zero-padded to two power-of-two pieces of at least 32 (an int8 tensor-core product
  reduces over 32): q per token and k - mean_n(k) per block of KB keys, quantised
  symmetrically to [-127, 127] (the softmax scale's sign in q8);
* qs (B, H, M) and ks (B, H, cdiv(N, KB)), float32, >= 0: the tokens' and the key
  blocks' scales, |softmax scale| folded into qs. A score is (q8 . k8) * qs[m] *
  ks[n // KB]: the product of two int8 vectors is exact in int32 (at most 512 * 127^2 <
  2^24, so exact in float32 too), and with KB a multiple of BLOCK_N one tile's keys
  share their scale (_int8_tile).

Subtracting K's mean over tokens adds the same q.mean to every score of a query row,
which the softmax does not see: it is exact, and it takes out the per-channel offsets
that make a per-token int8 scale coarse.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..flash.kernels import SHARED

# The exact kernels' device functions (flash/kernels.py's SHARED), under the names the code
# below calls them by.
_causal_keep = SHARED["causal_keep"]
_dot = SHARED["dot"]
_key_bias_info = SHARED["key_bias_info"]
_load_bias = SHARED["load_bias"]
_load_pieces = SHARED["load_pieces"]
_load_tile = SHARED["load_tile"]
_row_range = SHARED["row_range"]
_store_pieces = SHARED["store_pieces"]
_zeros_pieces = SHARED["zeros_pieces"]

LOG2E = tl.constexpr(1.4426950408889634)  # a constexpr: read inside @triton.jit code


@triton.jit
def _int8_products(
    q0,
    q1,
    K8,
    start_n,
    offs_n,
    offs_dq0,
    offs_dq1,
    n_left,
    stride_k8n,
    DQ0: tl.constexpr,
    DQ1: tl.constexpr,
    MASK: tl.constexpr,
):
    """q8 . k8 for the keys start_n + offs_n: int32 products on integer tensor cores, exact."""
    base = K8 + tl.cast(start_n, tl.int64) * stride_k8n
    k0 = _load_tile(base, offs_n, offs_dq0, stride_k8n, n_left, DQ0, MASK, False, 16)
    s = tl.dot(q0, tl.trans(k0), out_dtype=tl.int32)
    if DQ1 > 0:
        k1 = _load_tile(base, offs_n, offs_dq1, stride_k8n, n_left, DQ0 + DQ1, MASK, False, 16)
        s += tl.dot(q1, tl.trans(k1), out_dtype=tl.int32)
    return s


@triton.jit
def _int8_tile(
    acc0,
    acc1,
    m_i,
    l_i,
    q8,
    K8,
    KS,
    v_src,
    bs,
    geo,
    row0,
    start_n,
    m_left,
    n_left,
    diag,
    stride_k8n,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    DQ0: tl.constexpr,
    DQ1: tl.constexpr,
    KB: tl.constexpr,
    BIAS: tl.constexpr,
    MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    ALIGN: tl.constexpr,
    BIAS_ALIGN: tl.constexpr,
    BIAS_CONTIG: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
    PV16: tl.constexpr,
):
    """One K/V tile of the online softmax: update (acc, m, l) for the program's queries.

    Dequantisation. With a K scale per block of KB keys (KB > 1, a multiple of BLOCK_N)
    the tile's keys share one scale, so a score is its integer product times its row's
    factor qs[m] * ks[block]: no outer product per score. Without a bias that factor
    takes log2(e) too and the loop is the exact kernel's (flash/kernels.py _fwd_tile):
    the row max is taken on the integer products (the factor is >= 0: quant.py puts the
    softmax scale's sign in q8) and p = exp2(s * factor - m) is one conversion and one
    FFMA per score; masked tiles scale before masking. With a bias, or per-key scales
    (KB == 1: qs[m] * ks[n] per score), scores stay in natural units and p =
    exp2((s - m) * log2(e)), the subtraction first, so a huge finite bias never
    overflows (as the exact kernel with a bias)."""
    offs_m, offs_n, offs_d0, offs_d1, offs_dq0, offs_dq1 = geo
    q0, q1, qs = q8
    s_int = _int8_products(q0, q1, K8, start_n, offs_n, offs_dq0, offs_dq1, n_left, stride_k8n, DQ0, DQ1, MASK)
    if KB == 1 or BIAS != 0:
        if KB == 1:
            if MASK:
                ks = tl.load(KS + start_n + offs_n, mask=offs_n < n_left, other=0.0)
            else:
                ks = tl.load(KS + start_n + offs_n)
            s = s_int.to(tl.float32) * (qs[:, None] * ks[None, :])
        else:
            s = s_int.to(tl.float32) * (qs * tl.load(KS + start_n // KB))[:, None]
        if BIAS != 0:
            s = s + _load_bias(
                bs, row0, start_n, offs_m, offs_n, m_left, n_left, BIAS, True, MASK, BIAS_ALIGN, BIAS_CONTIG
            )
        if MASK:
            s = tl.where(_causal_keep(offs_m, offs_n, n_left, diag, CAUSAL), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2((m_i - m_ref) * LOG2E)
        p = tl.math.exp2((s - m_ref[:, None]) * LOG2E)
    else:
        row = qs * (tl.load(KS + start_n // KB) * LOG2E)  # base-2 units
        if MASK:
            s = s_int.to(tl.float32) * row[:, None]
            s = tl.where(_causal_keep(offs_m, offs_n, n_left, diag, CAUSAL), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - m_ref[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(s_int, 1).to(tl.float32) * row)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s_int.to(tl.float32) * row[:, None] - m_ref[:, None])
        alpha = tl.math.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, 1)
    v_base, stride_vn = v_src
    v_base = v_base + tl.multiple_of(tl.cast(start_n, tl.int64) * stride_vn, ALIGN)
    v0, v1 = _load_pieces(v_base, offs_n, offs_d0, offs_d1, stride_vn, n_left, HEAD_DIM, D0, D1, MASK, ALIGN)
    if PV16:  # the tile's P.V accumulated in float16 (fp16 inputs), added to the float32 accumulator
        acc0 = acc0 * alpha[:, None] + tl.dot(p.to(tl.float16), v0, out_dtype=tl.float16).to(tl.float32)
        if D1 > 0:
            acc1 = acc1 * alpha[:, None] + tl.dot(p.to(tl.float16), v1, out_dtype=tl.float16).to(tl.float32)
    else:
        acc0 = _dot(p.to(v0.dtype), v0, acc0 * alpha[:, None], "tf32", EMULATE_BF16)
        if D1 > 0:
            acc1 = _dot(p.to(v1.dtype), v1, acc1 * alpha[:, None], "tf32", EMULATE_BF16)
    return acc0, acc1, m_new, l_i


@triton.jit
def _attn_fwd_int8(
    Q8,
    K8,
    QS,
    KS,
    V,
    Bias,
    Lens,
    Plain,
    Out,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_bb,
    stride_bh,
    stride_bm,
    stride_bn,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    stride_om,
    H,
    M,
    N,
    OFF,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    DQ0: tl.constexpr,
    DQ1: tl.constexpr,
    KB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BIAS: tl.constexpr,
    CAUSAL: tl.constexpr,
    ALIGN: tl.constexpr,
    BIAS_ALIGN: tl.constexpr,
    BIAS_CONTIG: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
    PV16: tl.constexpr,
):
    """Grid (cdiv(M, BLOCK_M), H, B): one program per BLOCK_M query rows of one head.
    q8, k8, qs and ks are contiguous (int8/quant.py); V, the bias and the output are read
    and written through their strides, as by the exact kernel."""
    tl.static_assert(DQ0 >= 32 and (DQ0 & (DQ0 - 1)) == 0, "DQ0: a power of two >= 32")
    tl.static_assert(
        DQ1 == 0 or (DQ1 >= 32 and DQ1 <= DQ0 and (DQ1 & (DQ1 - 1)) == 0), "DQ1: 0 or a power of two in [32, DQ0]"
    )
    tl.static_assert(KB == 1 or KB % BLOCK_N == 0, "KB: 1 (a scale per key) or a multiple of BLOCK_N")
    # Stand-ins for the arguments passed as None (see flash/kernels.py's docstring).
    if BIAS == 0:
        Bias, stride_bb, stride_bh, stride_bm, stride_bn = V, 0, 0, 0, 0
    if BIAS != 1:
        Lens, Plain, stride_lb, stride_lh = QS, QS, 0, 0
    b = tl.program_id(2)
    h = tl.program_id(1)
    row0 = tl.program_id(0) * BLOCK_M
    m_left = M - row0
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    bh = b64 * H + h64
    DQ: tl.constexpr = DQ0 + DQ1
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d0 = tl.arange(0, D0)
    if D1 > 0:
        offs_d1 = D0 + tl.arange(0, D1)
    else:
        offs_d1 = offs_d0
    offs_dq0 = tl.arange(0, DQ0)
    if DQ1 > 0:
        offs_dq1 = DQ0 + tl.arange(0, DQ1)
    else:
        offs_dq1 = offs_dq0
    geo = (offs_m, offs_n, offs_d0, offs_d1, offs_dq0, offs_dq1)

    q_base = Q8 + (bh * M + row0) * DQ
    q0 = _load_tile(q_base, offs_m, offs_dq0, DQ, m_left, DQ0, True, False, 16)
    if DQ1 > 0:
        q1 = _load_tile(q_base, offs_m, offs_dq1, DQ, m_left, DQ, True, False, 16)
    else:
        q1 = q0
    qs = tl.load(QS + bh * M + row0 + offs_m, mask=offs_m < m_left, other=0.0)
    q8 = (q0, q1, qs)
    k8 = K8 + bh * N * DQ
    ks = KS + bh * ((N + KB - 1) // KB)  # one scale per block of KB keys
    v_src = (V + tl.multiple_of(b64 * stride_vb + h64 * stride_vh, ALIGN), stride_vn)
    bs = (Bias + tl.multiple_of(b64 * stride_bb + h64 * stride_bh, BIAS_ALIGN), stride_bm, stride_bn)

    acc0, acc1 = _zeros_pieces(BLOCK_M, D0, D1, -1)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    n_keys, plain = _key_bias_info(Lens, Plain, b64, h64, stride_lb, stride_lh, N, BIAS)
    n_unmasked, n_hi = _row_range(row0, BLOCK_M, M, N, n_keys, OFF, CAUSAL, BLOCK_N)
    if BIAS == 0 or plain:
        for start_n in range(0, n_unmasked, BLOCK_N):
            acc0, acc1, m_i, l_i = _int8_tile(
                acc0,
                acc1,
                m_i,
                l_i,
                q8,
                k8,
                ks,
                v_src,
                bs,
                geo,
                row0,
                start_n,
                m_left,
                n_hi - start_n,
                row0 + OFF - start_n,
                DQ,
                HEAD_DIM,
                D0,
                D1,
                DQ0,
                DQ1,
                KB,
                0,
                False,
                CAUSAL,
                ALIGN,
                BIAS_ALIGN,
                BIAS_CONTIG,
                EMULATE_BF16,
                PV16,
            )
        for start_n in range(n_unmasked, n_hi, BLOCK_N):
            acc0, acc1, m_i, l_i = _int8_tile(
                acc0,
                acc1,
                m_i,
                l_i,
                q8,
                k8,
                ks,
                v_src,
                bs,
                geo,
                row0,
                start_n,
                m_left,
                n_hi - start_n,
                row0 + OFF - start_n,
                DQ,
                HEAD_DIM,
                D0,
                D1,
                DQ0,
                DQ1,
                KB,
                0,
                True,
                CAUSAL,
                ALIGN,
                BIAS_ALIGN,
                BIAS_CONTIG,
                EMULATE_BF16,
                PV16,
            )
    else:
        for start_n in range(0, n_unmasked, BLOCK_N):
            acc0, acc1, m_i, l_i = _int8_tile(
                acc0,
                acc1,
                m_i,
                l_i,
                q8,
                k8,
                ks,
                v_src,
                bs,
                geo,
                row0,
                start_n,
                m_left,
                n_hi - start_n,
                row0 + OFF - start_n,
                DQ,
                HEAD_DIM,
                D0,
                D1,
                DQ0,
                DQ1,
                KB,
                BIAS,
                False,
                CAUSAL,
                ALIGN,
                BIAS_ALIGN,
                BIAS_CONTIG,
                EMULATE_BF16,
                PV16,
            )
        for start_n in range(n_unmasked, n_hi, BLOCK_N):
            acc0, acc1, m_i, l_i = _int8_tile(
                acc0,
                acc1,
                m_i,
                l_i,
                q8,
                k8,
                ks,
                v_src,
                bs,
                geo,
                row0,
                start_n,
                m_left,
                n_hi - start_n,
                row0 + OFF - start_n,
                DQ,
                HEAD_DIM,
                D0,
                D1,
                DQ0,
                DQ1,
                KB,
                BIAS,
                True,
                CAUSAL,
                ALIGN,
                BIAS_ALIGN,
                BIAS_CONTIG,
                EMULATE_BF16,
                PV16,
            )

    # Rows that saw no key have l = 0: they output 0.
    inv_l = 1.0 / tl.where(l_i == 0.0, 1.0, l_i)
    out_at = b64 * stride_ob + h64 * stride_oh + tl.cast(row0, tl.int64) * stride_om
    _store_pieces(
        Out + tl.multiple_of(out_at, ALIGN),
        (acc0 * inv_l[:, None]).to(Out.dtype.element_ty),
        (acc1 * inv_l[:, None]).to(Out.dtype.element_ty),
        offs_m,
        offs_d0,
        offs_d1,
        stride_om,
        m_left,
        HEAD_DIM,
        D0,
        D1,
        ALIGN,
        -1,
    )
