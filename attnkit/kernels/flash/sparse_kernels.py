"""The block-sparse flash kernels (@triton.jit code only; flash/sparse.py launches them).

A block table (flash/sparse.py's BlockTable) says, per query tile of BLOCK_M rows, which
key tiles of BLOCK_N keys it visits: full ones (every score seen, no mask inside) and
partial ones, whose element mask is read from a compact store of only those tiles
(Store[slot] is a BLOCK_M x BLOCK_N array of bytes, 1 = seen). A key tile that is not
listed is never loaded. The backward's dK/dV pass walks the transposed table (per key
tile, the query tiles that visit it); the dQ pass walks the forward's.

Units as the dense kernels' (kernels.py, _fwd_tile): scores are scaled to base 2 first
(s * qk_scale, any sign of the scale), m is the row max in those units, and the row
statistic Lse is the base-2 log-sum-exp; a row that sees no key keeps m = -inf, l = 0,
outputs zeros and stores Lse = -inf, as the dense kernels do.

Table arguments, per program (b, h, tile t): FullNum, PartNum (int32 counts at
b * stride_nb + h * stride_nh + t); FullIdx, PartIdx, PartSlot (int32 lists at
b * stride_tb + h * stride_th + t * stride_tl, stride_te per entry). The batch and head
strides are 0 where the mask is broadcast over batch or heads."""

from __future__ import annotations

import triton
import triton.language as tl

from .kernels import _check_tiles, _dot, _held_pieces, _load_stream, _store_pieces, _tile_offsets, _zeros_pieces


@triton.jit
def _element_keep(Store, slot, offs_r, offs_c, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TRANS: tl.constexpr):
    """The element mask of a partial tile (rows = queries, columns = keys), from the
    compact store; transposed (keys x queries) for the dK/dV pass."""
    base = Store + slot.to(tl.int64) * (BLOCK_M * BLOCK_N)
    if TRANS:
        bits = tl.load(base + offs_r[None, :] * BLOCK_N + offs_c[:, None])
    else:
        bits = tl.load(base + offs_r[:, None] * BLOCK_N + offs_c[None, :])
    return bits != 0


@triton.jit
def _sparse_fwd_tile(
    acc0,
    acc1,
    m_i,
    l_i,
    q0,
    q1,
    k_src,
    v_src,
    Store,
    slot,
    b,
    h,
    start_n,
    n_left,
    geo,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PARTIAL: tl.constexpr,
    ALIGN: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    """One visited key tile of the online softmax. PARTIAL: keys from n_left on are not
    loaded and the element mask of the store's slot applies."""
    offs_m, offs_n, offs_d0, offs_d1 = geo
    k0, k1 = _load_stream(
        k_src, b, h, start_n, offs_n, offs_d0, offs_d1, n_left, HEAD_DIM, D0, D1, PARTIAL, ALIGN, False
    )
    s = _dot(q0, tl.trans(k0), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), PRECISION, EMULATE_BF16)
    if D1 > 0:
        s = _dot(q1, tl.trans(k1), s, PRECISION, EMULATE_BF16)
    s = s * qk_scale
    if PARTIAL:
        keep = _element_keep(Store, slot, offs_m, offs_n, BLOCK_M, BLOCK_N, False) & (offs_n[None, :] < n_left)
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_ref)
    p = tl.math.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v0, v1 = _load_stream(
        v_src, b, h, start_n, offs_n, offs_d0, offs_d1, n_left, HEAD_DIM, D0, D1, PARTIAL, ALIGN, False
    )
    acc0 = _dot(p.to(v0.dtype), v0, acc0 * alpha[:, None], PRECISION, EMULATE_BF16)
    if D1 > 0:
        acc1 = _dot(p.to(v1.dtype), v1, acc1 * alpha[:, None], PRECISION, EMULATE_BF16)
    return acc0, acc1, m_new, l_i


@triton.jit
def _sparse_fwd(
    Q,
    K,
    V,
    Out,
    Lse,
    FullNum,
    FullIdx,
    PartNum,
    PartIdx,
    PartSlot,
    Store,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_ob,
    stride_oh,
    stride_om,
    stride_nb,
    stride_nh,
    stride_tb,
    stride_th,
    stride_tl,
    stride_te,
    H,
    M,
    N,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ALIGN: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    """Grid (query tiles, H, B): the visited full key tiles, then the partial ones."""
    _check_tiles(HEAD_DIM, D0, D1, BLOCK_M, BLOCK_N)
    t = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    row0 = t * BLOCK_M
    m_left = M - row0
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    geo = _tile_offsets(BLOCK_M, BLOCK_N, D0, D1)
    offs_m, offs_n, offs_d0, offs_d1 = geo
    q_base = Q + tl.multiple_of(b64 * stride_qb + h64 * stride_qh, ALIGN)
    k_src = (K, K, K + tl.multiple_of(b64 * stride_kb + h64 * stride_kh, ALIGN), stride_kn)
    v_src = (V, V, V + tl.multiple_of(b64 * stride_vb + h64 * stride_vh, ALIGN), stride_vn)
    q0, q1 = _held_pieces(
        (Q, Q, q_base, stride_qm), b, h, row0, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, ALIGN, False, False
    )
    acc0, acc1 = _zeros_pieces(BLOCK_M, D0, D1, -1)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    at = b64 * stride_nb + h64 * stride_nh + t
    lists = b64 * stride_tb + h64 * stride_th + t.to(tl.int64) * stride_tl
    for e in range(0, tl.load(FullNum + at)):
        start_n = tl.load(FullIdx + lists + e * stride_te) * BLOCK_N
        acc0, acc1, m_i, l_i = _sparse_fwd_tile(
            acc0, acc1, m_i, l_i, q0, q1, k_src, v_src, Store, 0, b, h, start_n, N - start_n, geo, qk_scale,
            HEAD_DIM, D0, D1, BLOCK_M, BLOCK_N, False, ALIGN, PRECISION, EMULATE_BF16,
        )  # fmt: skip
    for e in range(0, tl.load(PartNum + at)):
        start_n = tl.load(PartIdx + lists + e * stride_te) * BLOCK_N
        slot = tl.load(PartSlot + lists + e * stride_te)
        acc0, acc1, m_i, l_i = _sparse_fwd_tile(
            acc0, acc1, m_i, l_i, q0, q1, k_src, v_src, Store, slot, b, h, start_n, N - start_n, geo, qk_scale,
            HEAD_DIM, D0, D1, BLOCK_M, BLOCK_N, True, ALIGN, PRECISION, EMULATE_BF16,
        )  # fmt: skip

    dead = l_i == 0.0
    inv_l = 1.0 / tl.where(dead, 1.0, l_i)
    stat = (b64 * H + h64) * M + row0 + offs_m
    lse = tl.where(dead, float("-inf"), m_i + tl.math.log2(tl.where(dead, 1.0, l_i)))
    tl.store(Lse + stat, lse, mask=offs_m < m_left)
    out_at = b64 * stride_ob + h64 * stride_oh + row0.to(tl.int64) * stride_om
    o0 = (acc0 * inv_l[:, None]).to(Out.dtype.element_ty)
    o1 = (acc1 * inv_l[:, None]).to(Out.dtype.element_ty)
    _store_pieces(Out + out_at, o0, o1, offs_m, offs_d0, offs_d1, stride_om, m_left, HEAD_DIM, D0, D1, ALIGN, -1)


@triton.jit
def _row_terms(Lse, Delta, stat, offs, rows_left):
    """(lse, delta) of query rows for the backward: rows past M and rows that saw no key
    get lse = +inf, so that their p is exactly 0 (never exp2(-inf - -inf) = NaN)."""
    lse = tl.load(Lse + stat + offs, mask=offs < rows_left, other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    delta = tl.load(Delta + stat + offs, mask=offs < rows_left, other=0.0)
    return lse, delta


@triton.jit
def _sparse_dq_tile(
    dq0,
    dq1,
    q0,
    q1,
    do0,
    do1,
    lse,
    delta,
    k_src,
    v_src,
    Store,
    slot,
    b,
    h,
    start_n,
    n_left,
    geo,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PARTIAL: tl.constexpr,
    ALIGN: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    """dQ += dS K over one visited key tile, dS = P * (dP - delta) (natural units; the
    scale is applied once at the end)."""
    offs_m, offs_n, offs_d0, offs_d1 = geo
    k0, k1 = _load_stream(
        k_src, b, h, start_n, offs_n, offs_d0, offs_d1, n_left, HEAD_DIM, D0, D1, PARTIAL, ALIGN, False
    )
    v0, v1 = _load_stream(
        v_src, b, h, start_n, offs_n, offs_d0, offs_d1, n_left, HEAD_DIM, D0, D1, PARTIAL, ALIGN, False
    )
    s = _dot(q0, tl.trans(k0), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), PRECISION, EMULATE_BF16)
    dp = _dot(do0, tl.trans(v0), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), PRECISION, EMULATE_BF16)
    if D1 > 0:
        s = _dot(q1, tl.trans(k1), s, PRECISION, EMULATE_BF16)
        dp = _dot(do1, tl.trans(v1), dp, PRECISION, EMULATE_BF16)
    arg = s * qk_scale - lse[:, None]
    if PARTIAL:
        keep = _element_keep(Store, slot, offs_m, offs_n, BLOCK_M, BLOCK_N, False) & (offs_n[None, :] < n_left)
        arg = tl.where(keep, arg, float("-inf"))
    p = tl.math.exp2(arg)
    ds = (p * (dp - delta[:, None])).to(k0.dtype)
    dq0 = _dot(ds, k0, dq0, PRECISION, EMULATE_BF16)
    if D1 > 0:
        dq1 = _dot(ds, k1, dq1, PRECISION, EMULATE_BF16)
    return dq0, dq1


@triton.jit
def _sparse_bwd_dq(
    Q,
    K,
    V,
    DO,
    DQ,
    Lse,
    Delta,
    FullNum,
    FullIdx,
    PartNum,
    PartIdx,
    PartSlot,
    Store,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_dob,
    stride_doh,
    stride_dom,
    stride_nb,
    stride_nh,
    stride_tb,
    stride_th,
    stride_tl,
    stride_te,
    H,
    M,
    N,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ALIGN: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    """Grid (query tiles, H, B): dQ of one query tile over the key tiles it visited.
    dQ is written with Q's strides."""
    _check_tiles(HEAD_DIM, D0, D1, BLOCK_M, BLOCK_N)
    t = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    row0 = t * BLOCK_M
    m_left = M - row0
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    geo = _tile_offsets(BLOCK_M, BLOCK_N, D0, D1)
    offs_m, offs_n, offs_d0, offs_d1 = geo
    q_base = Q + tl.multiple_of(b64 * stride_qb + h64 * stride_qh, ALIGN)
    do_base = DO + tl.multiple_of(b64 * stride_dob + h64 * stride_doh, ALIGN)
    k_src = (K, K, K + tl.multiple_of(b64 * stride_kb + h64 * stride_kh, ALIGN), stride_kn)
    v_src = (V, V, V + tl.multiple_of(b64 * stride_vb + h64 * stride_vh, ALIGN), stride_vn)
    q0, q1 = _held_pieces(
        (Q, Q, q_base, stride_qm), b, h, row0, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, ALIGN, False, False
    )
    do0, do1 = _held_pieces(
        (DO, DO, do_base, stride_dom),
        b,
        h,
        row0,
        offs_m,
        offs_d0,
        offs_d1,
        m_left,
        HEAD_DIM,
        D0,
        D1,
        ALIGN,
        False,
        False,
    )
    stat = (b64 * H + h64) * M + row0
    lse, delta = _row_terms(Lse, Delta, stat, offs_m, m_left)
    dq0, dq1 = _zeros_pieces(BLOCK_M, D0, D1, -1)

    at = b64 * stride_nb + h64 * stride_nh + t
    lists = b64 * stride_tb + h64 * stride_th + t.to(tl.int64) * stride_tl
    for e in range(0, tl.load(FullNum + at)):
        start_n = tl.load(FullIdx + lists + e * stride_te) * BLOCK_N
        dq0, dq1 = _sparse_dq_tile(
            dq0, dq1, q0, q1, do0, do1, lse, delta, k_src, v_src, Store, 0, b, h, start_n, N - start_n, geo,
            qk_scale, HEAD_DIM, D0, D1, BLOCK_M, BLOCK_N, False, ALIGN, PRECISION, EMULATE_BF16,
        )  # fmt: skip
    for e in range(0, tl.load(PartNum + at)):
        start_n = tl.load(PartIdx + lists + e * stride_te) * BLOCK_N
        slot = tl.load(PartSlot + lists + e * stride_te)
        dq0, dq1 = _sparse_dq_tile(
            dq0, dq1, q0, q1, do0, do1, lse, delta, k_src, v_src, Store, slot, b, h, start_n, N - start_n, geo,
            qk_scale, HEAD_DIM, D0, D1, BLOCK_M, BLOCK_N, True, ALIGN, PRECISION, EMULATE_BF16,
        )  # fmt: skip
    out_at = b64 * stride_qb + h64 * stride_qh + row0.to(tl.int64) * stride_qm
    _store_pieces(
        DQ + out_at,
        (dq0 * sm_scale).to(DQ.dtype.element_ty),
        (dq1 * sm_scale).to(DQ.dtype.element_ty),
        offs_m, offs_d0, offs_d1, stride_qm, m_left, HEAD_DIM, D0, D1, ALIGN, -1,
    )  # fmt: skip


@triton.jit
def _sparse_dkdv_tile(
    dk0,
    dk1,
    dv0,
    dv1,
    k0,
    k1,
    v0,
    v1,
    q_src,
    do_src,
    Lse,
    Delta,
    stat,
    Store,
    slot,
    b,
    h,
    start_m,
    m_left,
    n_left,
    geo,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PARTIAL: tl.constexpr,
    ALIGN: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    """dK, dV of the program's key tile over one query tile that visits it, computed
    transposed (keys x queries). Query rows past M are loaded as zeros with lse = +inf."""
    offs_m, offs_n, offs_d0, offs_d1 = geo
    q0, q1 = _load_stream(q_src, b, h, start_m, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, True, ALIGN, False)
    do0, do1 = _load_stream(
        do_src, b, h, start_m, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, True, ALIGN, False
    )
    lse, delta = _row_terms(Lse, Delta, stat + start_m, offs_m, m_left)
    sT = _dot(k0, tl.trans(q0), tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), PRECISION, EMULATE_BF16)
    dpT = _dot(v0, tl.trans(do0), tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), PRECISION, EMULATE_BF16)
    if D1 > 0:
        sT = _dot(k1, tl.trans(q1), sT, PRECISION, EMULATE_BF16)
        dpT = _dot(v1, tl.trans(do1), dpT, PRECISION, EMULATE_BF16)
    arg = sT * qk_scale - lse[None, :]
    if PARTIAL:
        keep = _element_keep(Store, slot, offs_m, offs_n, BLOCK_M, BLOCK_N, True) & (offs_n[:, None] < n_left)
        arg = tl.where(keep, arg, float("-inf"))
    pT = tl.math.exp2(arg)
    dv0 = _dot(pT.to(do0.dtype), do0, dv0, PRECISION, EMULATE_BF16)
    dsT = (pT * (dpT - delta[None, :])).to(q0.dtype)
    dk0 = _dot(dsT, q0, dk0, PRECISION, EMULATE_BF16)
    if D1 > 0:
        dv1 = _dot(pT.to(do1.dtype), do1, dv1, PRECISION, EMULATE_BF16)
        dk1 = _dot(dsT, q1, dk1, PRECISION, EMULATE_BF16)
    return dk0, dk1, dv0, dv1


@triton.jit
def _sparse_bwd_dkdv(
    Q,
    K,
    V,
    DO,
    DK,
    DV,
    Lse,
    Delta,
    FullNum,
    FullIdx,
    PartNum,
    PartIdx,
    PartSlot,
    Store,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_dob,
    stride_doh,
    stride_dom,
    stride_nb,
    stride_nh,
    stride_tb,
    stride_th,
    stride_tl,
    stride_te,
    H,
    M,
    N,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ALIGN: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    """Grid (key tiles, H, B): dK and dV of one key tile over the query tiles that visit
    it (the transposed table). dK and dV are written with K's and V's strides."""
    _check_tiles(HEAD_DIM, D0, D1, BLOCK_M, BLOCK_N)
    t = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    col0 = t * BLOCK_N
    n_left = N - col0
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    geo = _tile_offsets(BLOCK_M, BLOCK_N, D0, D1)
    offs_m, offs_n, offs_d0, offs_d1 = geo
    k_at = b64 * stride_kb + h64 * stride_kh
    v_at = b64 * stride_vb + h64 * stride_vh
    k0, k1 = _held_pieces(
        (K, K, K + tl.multiple_of(k_at, ALIGN), stride_kn), b, h, col0, offs_n, offs_d0, offs_d1, n_left,
        HEAD_DIM, D0, D1, ALIGN, False, False,
    )  # fmt: skip
    v0, v1 = _held_pieces(
        (V, V, V + tl.multiple_of(v_at, ALIGN), stride_vn), b, h, col0, offs_n, offs_d0, offs_d1, n_left,
        HEAD_DIM, D0, D1, ALIGN, False, False,
    )  # fmt: skip
    q_src = (Q, Q, Q + tl.multiple_of(b64 * stride_qb + h64 * stride_qh, ALIGN), stride_qm)
    do_src = (DO, DO, DO + tl.multiple_of(b64 * stride_dob + h64 * stride_doh, ALIGN), stride_dom)
    stat = (b64 * H + h64) * M
    dk0, dk1 = _zeros_pieces(BLOCK_N, D0, D1, -1)
    dv0, dv1 = _zeros_pieces(BLOCK_N, D0, D1, -1)

    at = b64 * stride_nb + h64 * stride_nh + t
    lists = b64 * stride_tb + h64 * stride_th + t.to(tl.int64) * stride_tl
    for e in range(0, tl.load(FullNum + at)):
        start_m = tl.load(FullIdx + lists + e * stride_te) * BLOCK_M
        dk0, dk1, dv0, dv1 = _sparse_dkdv_tile(
            dk0, dk1, dv0, dv1, k0, k1, v0, v1, q_src, do_src, Lse, Delta, stat, Store, 0, b, h, start_m,
            M - start_m, n_left, geo, qk_scale, HEAD_DIM, D0, D1, BLOCK_M, BLOCK_N, False, ALIGN, PRECISION,
            EMULATE_BF16,
        )  # fmt: skip
    for e in range(0, tl.load(PartNum + at)):
        start_m = tl.load(PartIdx + lists + e * stride_te) * BLOCK_M
        slot = tl.load(PartSlot + lists + e * stride_te)
        dk0, dk1, dv0, dv1 = _sparse_dkdv_tile(
            dk0, dk1, dv0, dv1, k0, k1, v0, v1, q_src, do_src, Lse, Delta, stat, Store, slot, b, h, start_m,
            M - start_m, n_left, geo, qk_scale, HEAD_DIM, D0, D1, BLOCK_M, BLOCK_N, True, ALIGN, PRECISION,
            EMULATE_BF16,
        )  # fmt: skip
    _store_pieces(
        DK + k_at + col0.to(tl.int64) * stride_kn,
        (dk0 * sm_scale).to(DK.dtype.element_ty),
        (dk1 * sm_scale).to(DK.dtype.element_ty),
        offs_n, offs_d0, offs_d1, stride_kn, n_left, HEAD_DIM, D0, D1, ALIGN, -1,
    )  # fmt: skip
    _store_pieces(
        DV + v_at + col0.to(tl.int64) * stride_vn,
        dv0.to(DV.dtype.element_ty),
        dv1.to(DV.dtype.element_ty),
        offs_n, offs_d0, offs_d1, stride_vn, n_left, HEAD_DIM, D0, D1, ALIGN, -1,
    )  # fmt: skip


SPARSE_KERNELS = {"sparse_fwd": _sparse_fwd, "sparse_dq": _sparse_bwd_dq, "sparse_dkdv": _sparse_bwd_dkdv}
_ = triton  # the module's kernels are @triton.jit functions
