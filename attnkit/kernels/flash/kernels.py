"""FlashAttention-2 in Triton: softmax(q k^T * scale + attn_bias) v without an M x N matrix.

This module holds the @triton.jit code only; flash/tiles.py the tile lists, flash/abi.py
their calling convention, flash/select.py and flash/launch.py the host code that launches
them (through attnkit/kernels/launcher.py), flash/ops.py the custom ops, their autograd and
the public functions. The static report (tools/static_report) keys its rows by a hash
of this module's code (comments and docstrings left out): edit host code elsewhere.

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
* attn_bias broadcastable to (B, H, M, N), in float32, or for the inference forward a full
  bias in the inputs' 16-bit dtype with even strides (BIAS_ALIGN 2: "full16"), widened to
  float32 as each tile loads (any other bool or 16-bit bias is converted once, in its own
  shape, by the launcher), read through its strides (0 on broadcast dims); a key-padding
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

Arguments a launch does not read are passed as None: Triton takes a None argument as a
compile-time constant, so the launcher packs nothing for it on every call
(launch.absent_arguments says which: the tensor descriptors without TMA, the bias, its
strides and the row shift without a bias, the key lengths without a key bias, OutLo
without STORE_LO, DBias without BIAS_GRAD). Where code outside such a branch names it
(a base pointer, a tuple of sources), the kernel first rebinds it to a tensor it already
has; a name used only inside a branch that its constexpr leaves out (the forward's
LseShift and OutLo, the dK/dV kernel's DBias) is not rebound: used anywhere else, it
fails to compile, never reads memory.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2): log(x) == log2(x) * LN2

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
def _load_tile(
    base,
    offs_r,
    offs_c,
    stride_r,
    rows_left,
    COL_LIMIT: tl.constexpr,
    MASK_R: tl.constexpr,
    MASK_C: tl.constexpr,
    ALIGN: tl.constexpr,
):
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
def _check_tiles(
    HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """Compile-time checks of the tile shapes every attention kernel assumes."""
    tl.static_assert(D0 >= 16 and D0 <= 256 and (D0 & (D0 - 1)) == 0, "D0 must be a power of two in [16, 256]")
    tl.static_assert(
        D1 == 0 or (D1 >= 16 and D1 <= D0 and (D1 & (D1 - 1)) == 0), "D1 must be 0 or a power of two in [16, D0]"
    )
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
def _load_pieces(
    base,
    offs_r,
    offs_d0,
    offs_d1,
    stride_r,
    rows_left,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    MASK_R: tl.constexpr,
    ALIGN: tl.constexpr,
):
    """Both head-dim pieces of a tile through pointers (_load_tile each); the second is
    the first again when there is one piece (a placeholder, never read)."""
    x0 = _load_tile(base, offs_r, offs_d0, stride_r, rows_left, HEAD_DIM, MASK_R, D0 > HEAD_DIM, ALIGN)
    if D1 > 0:
        x1 = _load_tile(base, offs_r, offs_d1, stride_r, rows_left, HEAD_DIM, MASK_R, D0 + D1 > HEAD_DIM, ALIGN)
    else:
        x1 = x0
    return x0, x1


@triton.jit
def _load_stream(
    src,
    b,
    h,
    start,
    offs_r,
    offs_d0,
    offs_d1,
    rows_left,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    MASK_R: tl.constexpr,
    ALIGN: tl.constexpr,
    TMA: tl.constexpr,
):
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
def _held_pieces(
    src,
    b,
    h,
    start,
    offs_r,
    offs_d0,
    offs_d1,
    rows_left,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    ALIGN: tl.constexpr,
    TMA: tl.constexpr,
    RELOAD: tl.constexpr,
):
    """The tile a program holds through its loop (rows masked): loaded now, or [1, 1]
    placeholders when the loop reloads it every iteration (RELOAD)."""
    if RELOAD:
        x0 = tl.zeros([1, 1], dtype=tl.float32)
        x1 = x0
    else:
        x0, x1 = _load_stream(src, b, h, start, offs_r, offs_d0, offs_d1, rows_left, HEAD_DIM, D0, D1, True, ALIGN, TMA)
    return x0, x1


@triton.jit
def _store_tile(
    base, x, offs_r, offs_c, stride_r, rows_left, COL_LIMIT: tl.constexpr, MASK_C: tl.constexpr, ALIGN: tl.constexpr
):
    """Store x to base[r, c], rows below rows_left (and columns below COL_LIMIT)."""
    ptrs = base + tl.multiple_of(offs_r * stride_r, ALIGN)[:, None] + offs_c[None, :]
    if MASK_C:
        tl.store(ptrs, x, mask=(offs_r[:, None] < rows_left) & (offs_c[None, :] < COL_LIMIT))
    else:
        tl.store(ptrs, x, mask=offs_r[:, None] < rows_left)


@triton.jit
def _store_pieces(
    base,
    x0,
    x1,
    offs_r,
    offs_d0,
    offs_d1,
    stride_r,
    rows_left,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    ALIGN: tl.constexpr,
    PIECE: tl.constexpr,
):
    """Store the head-dim pieces of a tile a program computed (PIECE as in
    _zeros_pieces), already in the output dtype."""
    if PIECE == -1 or PIECE == 0:
        _store_tile(base, x0, offs_r, offs_d0, stride_r, rows_left, HEAD_DIM, D0 > HEAD_DIM, ALIGN)
    if D1 > 0 and (PIECE == -1 or PIECE == 1):
        _store_tile(base, x1, offs_r, offs_d1, stride_r, rows_left, HEAD_DIM, D0 + D1 > HEAD_DIM, ALIGN)


@triton.jit
def _load_bias(
    bs,
    start_m,
    start_n,
    offs_m,
    offs_n,
    m_left,
    n_left,
    BIAS: tl.constexpr,
    MASK_M: tl.constexpr,
    MASK_N: tl.constexpr,
    BIAS_ALIGN: tl.constexpr,
    BIAS_CONTIG: tl.constexpr,
):
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
def _fwd_tile(
    acc0,
    acc1,
    m_i,
    l_i,
    qs,
    kv,
    bs,
    geo,
    scales,
    b,
    h,
    row0,
    start_n,
    m_left,
    n_left,
    diag,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    BIAS: tl.constexpr,
    MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    ALIGN: tl.constexpr,
    BIAS_ALIGN: tl.constexpr,
    BIAS_CONTIG: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
    RELOAD: tl.constexpr,
    TMA: tl.constexpr,
):
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
        q0, q1 = _load_stream(q_src, b, h, row0, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, True, ALIGN, False)
    k0, k1 = _load_stream(k_src, b, h, start_n, offs_n, offs_d0, offs_d1, n_left, HEAD_DIM, D0, D1, MASK, ALIGN, TMA)
    s = _dot(q0, tl.trans(k0), tl.zeros([q0.shape[0], k0.shape[0]], dtype=tl.float32), PRECISION, EMULATE_BF16)
    if D1 > 0:
        s = _dot(q1, tl.trans(k1), s, PRECISION, EMULATE_BF16)
    if BIAS != 0:
        # Rows beyond M are masked (a full bias has no memory there); key columns only
        # in masked tiles.
        s = s * sm_scale + _load_bias(
            bs, row0, start_n, offs_m, offs_n, m_left, n_left, BIAS, True, MASK, BIAS_ALIGN, BIAS_CONTIG
        )
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
def _fwd_loops(
    acc0,
    acc1,
    m_i,
    l_i,
    qs,
    kv,
    bs,
    geo,
    scales,
    b,
    h,
    row0,
    OFF,
    n_unmasked,
    n_hi,
    m_left,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BIAS: tl.constexpr,
    CAUSAL: tl.constexpr,
    ALIGN: tl.constexpr,
    BIAS_ALIGN: tl.constexpr,
    BIAS_CONTIG: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
    RELOAD: tl.constexpr,
    TMA: tl.constexpr,
    WARP_SPEC: tl.constexpr,
):
    """The key tiles that need no mask, then the masked ones (the diagonal band, the
    last keys); tiles above the diagonal or past the last live key are never loaded.

    WARP_SPEC marks the unmasked loop for Triton's automatic warp specialization. The
    launcher leaves it off: with triton 3.9 on sm_90 it compiles to the same machine
    code (8 warps) or fails to compile (4 warps); the static report checks it again on
    every run (python -m tools.static_report)."""
    for start_n in tl.range(0, n_unmasked, BLOCK_N, warp_specialize=WARP_SPEC):
        acc0, acc1, m_i, l_i = _fwd_tile(
            acc0,
            acc1,
            m_i,
            l_i,
            qs,
            kv,
            bs,
            geo,
            scales,
            b,
            h,
            row0,
            start_n,
            m_left,
            n_hi - start_n,
            row0 + OFF - start_n,
            HEAD_DIM,
            D0,
            D1,
            BIAS,
            False,
            CAUSAL,
            ALIGN,
            BIAS_ALIGN,
            BIAS_CONTIG,
            PRECISION,
            EMULATE_BF16,
            RELOAD,
            TMA,
        )
    for start_n in range(n_unmasked, n_hi, BLOCK_N):
        acc0, acc1, m_i, l_i = _fwd_tile(
            acc0,
            acc1,
            m_i,
            l_i,
            qs,
            kv,
            bs,
            geo,
            scales,
            b,
            h,
            row0,
            start_n,
            m_left,
            n_hi - start_n,
            row0 + OFF - start_n,
            HEAD_DIM,
            D0,
            D1,
            BIAS,
            True,
            CAUSAL,
            ALIGN,
            BIAS_ALIGN,
            BIAS_CONTIG,
            PRECISION,
            EMULATE_BF16,
            RELOAD,
            TMA,
        )
    return acc0, acc1, m_i, l_i


@triton.jit
def _attn_fwd(
    Q,
    K,
    V,
    KD0,
    KD1,
    VD0,
    VD1,
    Bias,
    Lens,
    Plain,
    Out,
    Lse,
    LseShift,
    OutLo,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
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
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BIAS: tl.constexpr,
    CAUSAL: tl.constexpr,
    TMA: tl.constexpr,
    ALIGN: tl.constexpr,
    BIAS_ALIGN: tl.constexpr,
    BIAS_CONTIG: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
    RELOAD: tl.constexpr,
    STORE_LO: tl.constexpr,
    WARP_SPEC: tl.constexpr = False,
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
    # Stand-ins for the arguments passed as None (see the module's docstring).
    if not TMA:
        KD0, KD1, VD0, VD1 = K, K, V, V
    if BIAS == 0:
        Bias, stride_bb, stride_bh, stride_bm, stride_bn = Q, 0, 0, 0, 0
    if BIAS != 1:
        Lens, Plain, stride_lb, stride_lh = Lse, Lse, 0, 0
    b = tl.program_id(2)
    h = tl.program_id(1)
    row0 = tl.program_id(0) * BLOCK_M
    m_left = M - row0
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    geo = _tile_offsets(BLOCK_M, BLOCK_N, D0, D1)
    offs_m, offs_n, offs_d0, offs_d1 = geo

    q_src = (Q, Q, Q + tl.multiple_of(b64 * stride_qb + h64 * stride_qh, ALIGN), stride_qm)
    kv = (
        (KD0, KD1, K + tl.multiple_of(b64 * stride_kb + h64 * stride_kh, ALIGN), stride_kn),
        (VD0, VD1, V + tl.multiple_of(b64 * stride_vb + h64 * stride_vh, ALIGN), stride_vn),
    )
    bs = (Bias + tl.multiple_of(b64 * stride_bb + h64 * stride_bh, BIAS_ALIGN), stride_bm, stride_bn)
    # The Q tile stays in registers through the loop, unless the tiles reload it.
    q0, q1 = _held_pieces(q_src, b, h, row0, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, ALIGN, False, RELOAD)
    qs = (q0, q1, q_src)
    acc0, acc1 = _zeros_pieces(BLOCK_M, D0, D1, -1)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    n_keys, plain = _key_bias_info(Lens, Plain, b64, h64, stride_lb, stride_lh, N, BIAS)
    n_unmasked, n_hi = _row_range(row0, BLOCK_M, M, N, n_keys, OFF, CAUSAL, BLOCK_N)
    if BIAS == 0 or plain:
        acc0, acc1, m_i, l_i = _fwd_loops(
            acc0,
            acc1,
            m_i,
            l_i,
            qs,
            kv,
            bs,
            geo,
            (qk_scale, sm_scale),
            b,
            h,
            row0,
            OFF,
            n_unmasked,
            n_hi,
            m_left,
            HEAD_DIM,
            D0,
            D1,
            BLOCK_N,
            0,
            CAUSAL,
            ALIGN,
            BIAS_ALIGN,
            BIAS_CONTIG,
            PRECISION,
            EMULATE_BF16,
            RELOAD,
            TMA,
            WARP_SPEC,
        )
    else:
        acc0, acc1, m_i, l_i = _fwd_loops(
            acc0,
            acc1,
            m_i,
            l_i,
            qs,
            kv,
            bs,
            geo,
            (qk_scale, sm_scale),
            b,
            h,
            row0,
            OFF,
            n_unmasked,
            n_hi,
            m_left,
            HEAD_DIM,
            D0,
            D1,
            BLOCK_N,
            BIAS,
            CAUSAL,
            ALIGN,
            BIAS_ALIGN,
            BIAS_CONTIG,
            PRECISION,
            EMULATE_BF16,
            RELOAD,
            TMA,
            WARP_SPEC,
        )

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
    _store_pieces(
        Out + tl.multiple_of(out_at, ALIGN),
        o0_hi,
        o1_hi,
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
    if STORE_LO:
        _store_pieces(
            OutLo + tl.multiple_of(out_at, ALIGN),
            (o0 - o0_hi.to(tl.float32)).to(Out.dtype.element_ty),
            (o1 - o1_hi.to(tl.float32)).to(Out.dtype.element_ty),
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


@triton.jit
def _attn_bwd_delta(
    Out,
    OutLo,
    DO,
    Delta,
    stride_ob,
    stride_oh,
    stride_om,
    stride_db,
    stride_dh,
    stride_dm,
    H,
    M,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ALIGN: tl.constexpr,
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
    o = _load_tile(
        Out + b * stride_ob + h * stride_oh + row0 * stride_om,
        offs_m,
        offs_d,
        stride_om,
        m_left,
        HEAD_DIM,
        True,
        BLOCK_D > HEAD_DIM,
        ALIGN,
    )
    do = _load_tile(
        DO + b * stride_db + h * stride_dh + row0 * stride_dm,
        offs_m,
        offs_d,
        stride_dm,
        m_left,
        HEAD_DIM,
        True,
        BLOCK_D > HEAD_DIM,
        ALIGN,
    )
    o = o.to(tl.float32)
    if HAS_LO:
        o += _load_tile(
            OutLo + b * stride_ob + h * stride_oh + row0 * stride_om,
            offs_m,
            offs_d,
            stride_om,
            m_left,
            HEAD_DIM,
            True,
            BLOCK_D > HEAD_DIM,
            ALIGN,
        ).to(tl.float32)
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
def _dkdv_tile(
    dk0,
    dk1,
    dv0,
    dv1,
    db,
    ks,
    vs,
    q_src,
    do_src,
    bs,
    stats,
    geo,
    scales,
    b,
    h,
    col0,
    start_m,
    m_left,
    n_left,
    diag,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    BIAS: tl.constexpr,
    MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    ALIGN: tl.constexpr,
    BIAS_ALIGN: tl.constexpr,
    BIAS_CONTIG: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
    RELOAD: tl.constexpr,
    BIAS_GRAD: tl.constexpr,
    TMA: tl.constexpr,
    PIECE: tl.constexpr,
    GRADS: tl.constexpr,
):
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
        k0, k1 = _load_stream(k_src, b, h, col0, offs_n, offs_d0, offs_d1, n_left, HEAD_DIM, D0, D1, True, ALIGN, False)
    q0, q1 = _load_stream(q_src, b, h, start_m, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, MASK, ALIGN, TMA)
    sT = _dot(k0, tl.trans(q0), tl.zeros([k0.shape[0], q0.shape[0]], dtype=tl.float32), PRECISION, EMULATE_BF16)
    if D1 > 0:
        sT = _dot(k1, tl.trans(q1), sT, PRECISION, EMULATE_BF16)
    lse, shift, delta = _row_stats(stats, start_m, offs_m, m_left, BIAS, MASK)
    if BIAS != 0:
        # The key rows of this tile may run past N (the tile is the program's own and is
        # masked on load); the query columns only in masked tiles.
        sT = sT * sm_scale + tl.trans(
            _load_bias(bs, start_m, col0, offs_m, offs_n, m_left, n_left, BIAS, MASK, True, BIAS_ALIGN, BIAS_CONTIG)
        )
        arg = (sT - shift[None, :]) * 1.4426950408889634 - lse[None, :]
    else:
        arg = sT * qk_scale - lse[None, :]
    if MASK and CAUSAL:
        # Key j is seen by the tile's queries from offs_n[j] - diag on.
        arg = tl.where(offs_m[None, :] >= (offs_n - diag)[:, None], arg, float("-inf"))
    pT = tl.math.exp2(arg)

    do0, do1 = _load_stream(do_src, b, h, start_m, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, MASK, ALIGN, TMA)
    if GRADS != "dk":
        if PIECE != 1:
            dv0 = _dot(pT.to(do0.dtype), do0, dv0, PRECISION, EMULATE_BF16)
        if D1 > 0 and PIECE != 0:
            dv1 = _dot(pT.to(do1.dtype), do1, dv1, PRECISION, EMULATE_BF16)
    if GRADS != "dv":
        if RELOAD:
            v0, v1 = _load_stream(
                v_src, b, h, col0, offs_n, offs_d0, offs_d1, n_left, HEAD_DIM, D0, D1, True, ALIGN, False
            )
        dpT = _dot(v0, tl.trans(do0), tl.zeros([k0.shape[0], q0.shape[0]], dtype=tl.float32), PRECISION, EMULATE_BF16)
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
def _dkdv_loops(
    dk0,
    dk1,
    dv0,
    dv1,
    db,
    ks,
    vs,
    q_src,
    do_src,
    bs,
    stats,
    geo,
    scales,
    b,
    h,
    col0,
    OFF,
    m_lo,
    m_unmasked,
    m_full,
    m_hi,
    n_left,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BIAS: tl.constexpr,
    CAUSAL: tl.constexpr,
    ALIGN: tl.constexpr,
    BIAS_ALIGN: tl.constexpr,
    BIAS_CONTIG: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
    RELOAD: tl.constexpr,
    BIAS_GRAD: tl.constexpr,
    TMA: tl.constexpr,
    PIECE: tl.constexpr,
    GRADS: tl.constexpr,
):
    """Query tiles [m_unmasked, m_full) unmasked, then [m_lo, m_unmasked) masked (the
    diagonal band) and [max(m_full, m_lo), m_hi) masked (the last rows). The unmasked
    loop comes first in the program: it is the one that runs most."""
    for start_m in range(m_unmasked, m_full, BLOCK_M):
        dk0, dk1, dv0, dv1, db = _dkdv_tile(
            dk0,
            dk1,
            dv0,
            dv1,
            db,
            ks,
            vs,
            q_src,
            do_src,
            bs,
            stats,
            geo,
            scales,
            b,
            h,
            col0,
            start_m,
            m_hi - start_m,
            n_left,
            start_m + OFF - col0,
            HEAD_DIM,
            D0,
            D1,
            BIAS,
            False,
            CAUSAL,
            ALIGN,
            BIAS_ALIGN,
            BIAS_CONTIG,
            PRECISION,
            EMULATE_BF16,
            RELOAD,
            BIAS_GRAD,
            TMA,
            PIECE,
            GRADS,
        )
    for start_m in range(m_lo, m_unmasked, BLOCK_M):
        dk0, dk1, dv0, dv1, db = _dkdv_tile(
            dk0,
            dk1,
            dv0,
            dv1,
            db,
            ks,
            vs,
            q_src,
            do_src,
            bs,
            stats,
            geo,
            scales,
            b,
            h,
            col0,
            start_m,
            m_hi - start_m,
            n_left,
            start_m + OFF - col0,
            HEAD_DIM,
            D0,
            D1,
            BIAS,
            True,
            CAUSAL,
            ALIGN,
            BIAS_ALIGN,
            BIAS_CONTIG,
            PRECISION,
            EMULATE_BF16,
            RELOAD,
            BIAS_GRAD,
            TMA,
            PIECE,
            GRADS,
        )
    for start_m in range(tl.maximum(m_full, m_lo), m_hi, BLOCK_M):
        dk0, dk1, dv0, dv1, db = _dkdv_tile(
            dk0,
            dk1,
            dv0,
            dv1,
            db,
            ks,
            vs,
            q_src,
            do_src,
            bs,
            stats,
            geo,
            scales,
            b,
            h,
            col0,
            start_m,
            m_hi - start_m,
            n_left,
            start_m + OFF - col0,
            HEAD_DIM,
            D0,
            D1,
            BIAS,
            True,
            CAUSAL,
            ALIGN,
            BIAS_ALIGN,
            BIAS_CONTIG,
            PRECISION,
            EMULATE_BF16,
            RELOAD,
            BIAS_GRAD,
            TMA,
            PIECE,
            GRADS,
        )
    return dk0, dk1, dv0, dv1, db


@triton.jit
def _attn_bwd_dkdv(
    Q,
    K,
    V,
    QD0,
    QD1,
    DOD0,
    DOD1,
    KD0,
    KD1,
    VD0,
    VD1,
    Bias,
    Lens,
    Plain,
    DO,
    Lse,
    LseShift,
    Delta,
    DK,
    DV,
    DBias,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_bb,
    stride_bh,
    stride_bm,
    stride_bn,
    stride_lb,
    stride_lh,
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dkb,
    stride_dkh,
    stride_dkn,
    stride_dvb,
    stride_dvh,
    stride_dvn,
    stride_dbb,
    stride_dbh,
    H,
    M,
    N,
    OFF,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BIAS: tl.constexpr,
    CAUSAL: tl.constexpr,
    TMA: tl.constexpr,
    ALIGN: tl.constexpr,
    BIAS_ALIGN: tl.constexpr,
    BIAS_CONTIG: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
    RELOAD: tl.constexpr,
    BIAS_GRAD: tl.constexpr,
    PIECE: tl.constexpr = -1,
    GRADS: tl.constexpr = "dkdv",
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
    # Stand-ins for the arguments passed as None (see the module's docstring).
    if not TMA:
        QD0, QD1, DOD0, DOD1, KD0, KD1, VD0, VD1 = Q, Q, DO, DO, K, K, V, V
    if BIAS == 0:
        Bias, stride_bb, stride_bh, stride_bm, stride_bn, LseShift = Q, 0, 0, 0, 0, Lse
    if BIAS != 1:
        Lens, Plain, stride_lb, stride_lh = Lse, Lse, 0, 0
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
            dk0,
            dk1,
            dv0,
            dv1,
            db,
            ks,
            vs,
            q_src,
            do_src,
            bs,
            stats,
            geo,
            (qk_scale, sm_scale),
            b,
            h,
            col0,
            OFF,
            m_lo,
            m_unmasked,
            m_full,
            m_hi,
            n_left,
            HEAD_DIM,
            D0,
            D1,
            BLOCK_M,
            0,
            CAUSAL,
            ALIGN,
            BIAS_ALIGN,
            BIAS_CONTIG,
            PRECISION,
            EMULATE_BF16,
            RELOAD,
            BIAS_GRAD,
            TMA,
            PIECE,
            GRADS,
        )
    else:
        dk0, dk1, dv0, dv1, db = _dkdv_loops(
            dk0,
            dk1,
            dv0,
            dv1,
            db,
            ks,
            vs,
            q_src,
            do_src,
            bs,
            stats,
            geo,
            (qk_scale, sm_scale),
            b,
            h,
            col0,
            OFF,
            m_lo,
            m_unmasked,
            m_full,
            m_hi,
            n_left,
            HEAD_DIM,
            D0,
            D1,
            BLOCK_M,
            BIAS,
            CAUSAL,
            ALIGN,
            BIAS_ALIGN,
            BIAS_CONTIG,
            PRECISION,
            EMULATE_BF16,
            RELOAD,
            BIAS_GRAD,
            TMA,
            PIECE,
            GRADS,
        )

    if BIAS == 1:
        # Keys past the last live one have no gradient; the loop of no bias (plain) did
        # not mask them, and each key's row of dK, dV and the bias gradient is its own.
        live = offs_n[:, None] < n_keys - col0
        dk0, dk1, dv0, dv1 = (
            tl.where(live, dk0, 0.0),
            tl.where(live, dk1, 0.0),
            tl.where(live, dv0, 0.0),
            tl.where(live, dv1, 0.0),
        )
        if BIAS_GRAD:
            db = tl.where(offs_n < n_keys - col0, db, 0.0)
    col0_64 = col0.to(tl.int64)
    if BIAS_GRAD:
        tl.store(DBias + b64 * stride_dbb + h64 * stride_dbh + col0_64 + offs_n, db, mask=offs_n < n_left)
    if GRADS != "dv":
        dk_at = DK + tl.multiple_of(b64 * stride_dkb + h64 * stride_dkh + col0_64 * stride_dkn, ALIGN)
        _store_pieces(
            dk_at,
            (dk0 * sm_scale).to(DK.dtype.element_ty),
            (dk1 * sm_scale).to(DK.dtype.element_ty),
            offs_n,
            offs_d0,
            offs_d1,
            stride_dkn,
            n_left,
            HEAD_DIM,
            D0,
            D1,
            ALIGN,
            PIECE,
        )
    if GRADS != "dk":
        dv_at = DV + tl.multiple_of(b64 * stride_dvb + h64 * stride_dvh + col0_64 * stride_dvn, ALIGN)
        _store_pieces(
            dv_at,
            dv0.to(DV.dtype.element_ty),
            dv1.to(DV.dtype.element_ty),
            offs_n,
            offs_d0,
            offs_d1,
            stride_dvn,
            n_left,
            HEAD_DIM,
            D0,
            D1,
            ALIGN,
            PIECE,
        )


@triton.jit
def _dq_tile(
    dq0,
    dq1,
    qs,
    dos,
    kv,
    bs,
    geo,
    scales,
    row_stats,
    db_src,
    b,
    h,
    row0,
    start_n,
    m_left,
    n_left,
    diag,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    BIAS: tl.constexpr,
    MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    ALIGN: tl.constexpr,
    BIAS_ALIGN: tl.constexpr,
    BIAS_CONTIG: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
    RELOAD: tl.constexpr,
    BIAS_GRAD: tl.constexpr,
    TMA: tl.constexpr,
    PIECE: tl.constexpr,
):
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
        q0, q1 = _load_stream(q_src, b, h, row0, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, True, ALIGN, False)
        do0, do1 = _load_stream(
            do_src, b, h, row0, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, True, ALIGN, False
        )
    k0, k1 = _load_stream(k_src, b, h, start_n, offs_n, offs_d0, offs_d1, n_left, HEAD_DIM, D0, D1, MASK, ALIGN, TMA)
    v0, v1 = _load_stream(v_src, b, h, start_n, offs_n, offs_d0, offs_d1, n_left, HEAD_DIM, D0, D1, MASK, ALIGN, TMA)
    s = _dot(q0, tl.trans(k0), tl.zeros([q0.shape[0], k0.shape[0]], dtype=tl.float32), PRECISION, EMULATE_BF16)
    dp = _dot(do0, tl.trans(v0), tl.zeros([q0.shape[0], k0.shape[0]], dtype=tl.float32), PRECISION, EMULATE_BF16)
    if D1 > 0:
        s = _dot(q1, tl.trans(k1), s, PRECISION, EMULATE_BF16)
        dp = _dot(do1, tl.trans(v1), dp, PRECISION, EMULATE_BF16)
    if BIAS != 0:
        s = s * sm_scale + _load_bias(
            bs, row0, start_n, offs_m, offs_n, m_left, n_left, BIAS, True, MASK, BIAS_ALIGN, BIAS_CONTIG
        )
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
def _dq_loops(
    dq0,
    dq1,
    qs,
    dos,
    kv,
    bs,
    geo,
    scales,
    row_stats,
    db_src,
    b,
    h,
    row0,
    OFF,
    n_unmasked,
    n_hi,
    m_left,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BIAS: tl.constexpr,
    CAUSAL: tl.constexpr,
    ALIGN: tl.constexpr,
    BIAS_ALIGN: tl.constexpr,
    BIAS_CONTIG: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
    RELOAD: tl.constexpr,
    BIAS_GRAD: tl.constexpr,
    TMA: tl.constexpr,
    PIECE: tl.constexpr,
):
    """The unmasked key tiles, then the masked ones, as in _fwd_loops."""
    for start_n in range(0, n_unmasked, BLOCK_N):
        dq0, dq1 = _dq_tile(
            dq0,
            dq1,
            qs,
            dos,
            kv,
            bs,
            geo,
            scales,
            row_stats,
            db_src,
            b,
            h,
            row0,
            start_n,
            m_left,
            n_hi - start_n,
            row0 + OFF - start_n,
            HEAD_DIM,
            D0,
            D1,
            BIAS,
            False,
            CAUSAL,
            ALIGN,
            BIAS_ALIGN,
            BIAS_CONTIG,
            PRECISION,
            EMULATE_BF16,
            RELOAD,
            BIAS_GRAD,
            TMA,
            PIECE,
        )
    for start_n in range(n_unmasked, n_hi, BLOCK_N):
        dq0, dq1 = _dq_tile(
            dq0,
            dq1,
            qs,
            dos,
            kv,
            bs,
            geo,
            scales,
            row_stats,
            db_src,
            b,
            h,
            row0,
            start_n,
            m_left,
            n_hi - start_n,
            row0 + OFF - start_n,
            HEAD_DIM,
            D0,
            D1,
            BIAS,
            True,
            CAUSAL,
            ALIGN,
            BIAS_ALIGN,
            BIAS_CONTIG,
            PRECISION,
            EMULATE_BF16,
            RELOAD,
            BIAS_GRAD,
            TMA,
            PIECE,
        )
    return dq0, dq1


@triton.jit
def _attn_bwd_dq(
    Q,
    K,
    V,
    KD0,
    KD1,
    VD0,
    VD1,
    Bias,
    Lens,
    Plain,
    DO,
    Lse,
    LseShift,
    Delta,
    DQ,
    DBias,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_bb,
    stride_bh,
    stride_bm,
    stride_bn,
    stride_lb,
    stride_lh,
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dqb,
    stride_dqh,
    stride_dqm,
    stride_dbb,
    stride_dbh,
    stride_dbm,
    H,
    M,
    N,
    OFF,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    D0: tl.constexpr,
    D1: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BIAS: tl.constexpr,
    CAUSAL: tl.constexpr,
    TMA: tl.constexpr,
    ALIGN: tl.constexpr,
    BIAS_ALIGN: tl.constexpr,
    BIAS_CONTIG: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
    RELOAD: tl.constexpr,
    BIAS_GRAD: tl.constexpr,
    PIECE: tl.constexpr = -1,
):
    """Grid (cdiv(M, BLOCK_M), H, B): dQ of BLOCK_M queries, streaming the keys they see.

    BIAS_GRAD: also write dS itself, DBias[b, h, m, n] (fp32, contiguous in n), the
    gradient of a bias that depends on the query; each element has one writer. Keys a
    row does not see (skipped tiles) get no write: the launcher zeroes DBias first
    when tiles can be skipped."""
    _check_tiles(HEAD_DIM, D0, D1, BLOCK_M, BLOCK_N)
    # Stand-ins for the arguments passed as None (see the module's docstring).
    if not TMA:
        KD0, KD1, VD0, VD1 = K, K, V, V
    if BIAS == 0:
        Bias, stride_bb, stride_bh, stride_bm, stride_bn, LseShift = Q, 0, 0, 0, 0, Lse
    if BIAS != 1:
        Lens, Plain, stride_lb, stride_lh = Lse, Lse, 0, 0
    if not BIAS_GRAD:
        DBias, stride_dbb, stride_dbh, stride_dbm = Delta, 0, 0, 0
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
    kv = (
        (KD0, KD1, K + tl.multiple_of(b64 * stride_kb + h64 * stride_kh, ALIGN), stride_kn),
        (VD0, VD1, V + tl.multiple_of(b64 * stride_vb + h64 * stride_vh, ALIGN), stride_vn),
    )
    bs = (Bias + tl.multiple_of(b64 * stride_bb + h64 * stride_bh, BIAS_ALIGN), stride_bm, stride_bn)
    db_src = (DBias + b64 * stride_dbb + h64 * stride_dbh + row0.to(tl.int64) * stride_dbm, stride_dbm)
    # The Q and dO tiles stay in registers through the loop, unless the tiles reload them.
    q0, q1 = _held_pieces(q_src, b, h, row0, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, ALIGN, False, RELOAD)
    do0, do1 = _held_pieces(
        do_src, b, h, row0, offs_m, offs_d0, offs_d1, m_left, HEAD_DIM, D0, D1, ALIGN, False, RELOAD
    )
    dq0, dq1 = _zeros_pieces(BLOCK_M, D0, D1, PIECE)
    stat = (b64 * H + h64) * M
    row_stats = _row_stats((Lse + stat, LseShift + stat, Delta + stat), row0, offs_m, m_left, BIAS, True)

    n_keys, plain = _key_bias_info(Lens, Plain, b64, h64, stride_lb, stride_lh, N, BIAS)
    n_unmasked, n_hi = _row_range(row0, BLOCK_M, M, N, n_keys, OFF, CAUSAL, BLOCK_N)
    qs = (q0, q1, q_src)
    dos = (do0, do1, do_src)
    if BIAS == 0 or plain:
        dq0, dq1 = _dq_loops(
            dq0,
            dq1,
            qs,
            dos,
            kv,
            bs,
            geo,
            (qk_scale, sm_scale),
            row_stats,
            db_src,
            b,
            h,
            row0,
            OFF,
            n_unmasked,
            n_hi,
            m_left,
            HEAD_DIM,
            D0,
            D1,
            BLOCK_N,
            0,
            CAUSAL,
            ALIGN,
            BIAS_ALIGN,
            BIAS_CONTIG,
            PRECISION,
            EMULATE_BF16,
            RELOAD,
            BIAS_GRAD,
            TMA,
            PIECE,
        )
    else:
        dq0, dq1 = _dq_loops(
            dq0,
            dq1,
            qs,
            dos,
            kv,
            bs,
            geo,
            (qk_scale, sm_scale),
            row_stats,
            db_src,
            b,
            h,
            row0,
            OFF,
            n_unmasked,
            n_hi,
            m_left,
            HEAD_DIM,
            D0,
            D1,
            BLOCK_N,
            BIAS,
            CAUSAL,
            ALIGN,
            BIAS_ALIGN,
            BIAS_CONTIG,
            PRECISION,
            EMULATE_BF16,
            RELOAD,
            BIAS_GRAD,
            TMA,
            PIECE,
        )

    dq_at = DQ + tl.multiple_of(b64 * stride_dqb + h64 * stride_dqh + row0.to(tl.int64) * stride_dqm, ALIGN)
    _store_pieces(
        dq_at,
        (dq0 * sm_scale).to(DQ.dtype.element_ty),
        (dq1 * sm_scale).to(DQ.dtype.element_ty),
        offs_m,
        offs_d0,
        offs_d1,
        stride_dqm,
        m_left,
        HEAD_DIM,
        D0,
        D1,
        ALIGN,
        PIECE,
    )


# The kernel each launcher name runs. The *_dbias entries are the same kernels when they
# also write the bias gradient (BIAS_GRAD): more live registers, so their own tile lists.
KERNELS = {
    "fwd": _attn_fwd,
    "dkdv": _attn_bwd_dkdv,
    "dq": _attn_bwd_dq,
    "fwd_lo": _attn_fwd,
    "dkdv_dbias": _attn_bwd_dkdv,
    "dq_dbias": _attn_bwd_dq,
}
# The tensor descriptors of each kernel (TMA), and which block size is their box rows:
# the operands each kernel streams through its loop, and the dK/dV kernel's K and V,
# which it holds (loaded once, like the rest of its operands, through TMA too).
DESCRIPTORS = {
    "fwd": ((("KD0", "KD1", "VD0", "VD1"), "BLOCK_N"),),
    "dq": ((("KD0", "KD1", "VD0", "VD1"), "BLOCK_N"),),
    "dkdv": ((("QD0", "QD1", "DOD0", "DOD1"), "BLOCK_M"), (("KD0", "KD1", "VD0", "VD1"), "BLOCK_N")),
}
for _k in ("fwd_lo", "dkdv_dbias", "dq_dbias"):
    DESCRIPTORS[_k] = DESCRIPTORS[_k.split("_")[0]]

# The device functions the int8 forward (attnkit/kernels/int8/kernels.py) shares with these
# kernels, by public names: the same @triton.jit functions.
SHARED = dict(
    causal_keep=_causal_keep,
    dot=_dot,
    key_bias_info=_key_bias_info,
    load_bias=_load_bias,
    load_pieces=_load_pieces,
    load_tile=_load_tile,
    row_range=_row_range,
    store_pieces=_store_pieces,
    zeros_pieces=_zeros_pieces,
)
