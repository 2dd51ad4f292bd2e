"""What the flash-attention kernels can serve, readable without triton.

    from attnkit.kernels.limits import input_problems, MAX_HEAD_DIM

This module imports neither triton nor the kernels: attnkit's backend reads it to answer
"can you serve this call?" on machines where triton is not installed, and the kernel
package (flash/) takes its limits from here, so there is one copy of each.

Head dims. Triton tiles are powers of two, and tensor-core dots need a reduction length
of at least 16. Padding the head dim to the next power of two wastes a lot at the head
dims of diffusion models (40 -> 64 is 37.5% of the matrix work), so the head dim is cut
into at most two power-of-two pieces D0 >= D1 >= 16, each at most 256 wide (one TMA box
and one register tile): 40 = 32 + 16 (after padding 8 -> 16), 80 = 64 + 16,
160 = 128 + 32, 320 = 256 + 64, 384 = 256 + 128, 512 = 256 + 256. Each piece is its own
dot. Matrix work wasted by padding, (padded - D) / padded:

    head dim         8    24    40    64    72    80   100   128   160   256   320   512
    next pow2       16    32    64    64   128   128   128   128   256   256   512   512
      waste        50%   25%  37.5%   0%  43.8% 37.5% 21.9%   0%  37.5%   0%  37.5%   0%
    FlashAttn-2     32    32    64    64    96    96   128   128   160   256    -     -
    FlashAttn-3     64    64    64    64    96    96   128   128   192   256    -     -
    this kernel     16    32    48    64    80    80   128   128   160   256   320   512
      waste        50%   25%  16.7%   0%  10.0%   0%  21.9%   0%    0%   0%    0%    0%

(FlashAttention-2 instantiates its kernels for head dims in multiples of 32 up to 256,
FlashAttention-3 for 64, 96, 128, 192 and 256; a head dim runs in the next one up.)
"""

from __future__ import annotations

MIN_HEAD_DIM = 8
MAX_HEAD_DIM = 512
# The widest head-dim piece: a TMA box is at most 256 elements along each dim, and a
# wider piece would hold more accumulator registers per thread than a tile can spare.
MAX_PIECE = 256
# The grid is (query or key tiles, heads, batch); CUDA limits grid dims y and z to 65535.
MAX_GRID_YZ = 65535
# The tile lists are kept per head-dim band: the smallest of these bounds that holds the
# padded head dim (flash_attention.CONFIGS).
BANDS = (64, 96, 128, 192, 256, 320, 384, 512)


def _next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def split_head_dim(head_dim: int) -> tuple[int, int]:
    """The pieces (D0, D1) of a head dim: powers of two in [16, 256], D0 >= D1, D1 = 0
    when one piece covers it.

    The smallest padded total D0 + D1 >= head_dim wins; on a tie, one piece (fewer
    instructions). 40 -> (32, 16), 80 -> (64, 16), 100 -> (128, 0), 160 -> (128, 32),
    320 -> (256, 64), 512 -> (256, 256).
    """
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim={head_dim} is outside [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}]")
    whole = max(16, _next_pow2(head_dim))
    if head_dim > MAX_PIECE:
        d0 = MAX_PIECE
    else:
        d0 = max(16, whole // 2)
    rest = head_dim - d0
    if rest <= 0:
        return whole, 0
    d1 = max(16, _next_pow2(rest))
    if d1 <= d0 and (d0 + d1 < whole or whole > MAX_PIECE):
        return d0, d1
    return whole, 0


def padded_head_dim(head_dim: int) -> int:
    """D0 + D1: the head dim the matrix instructions see."""
    d0, d1 = split_head_dim(head_dim)
    return d0 + d1


def padding_waste(head_dim: int) -> float:
    """Fraction of the matrix work spent on padding at this head dim."""
    p = padded_head_dim(head_dim)
    return (p - head_dim) / p


def attention_flops(B: int, H: int, M: int, N: int, D: int, backward: bool = False, causal: bool = False) -> float:
    """Matrix FLOPs of attention, the convention FlashAttention's benchmarks use.

    Forward: two matmuls per (batch, head), s = q @ k^T (M x N x D multiply-adds) and
    o = p @ v (the same), at 2 FLOPs per multiply-add: 4 * M * N * D; times B * H. The
    softmax is not counted (it is not matrix work).
    Backward: five matmuls of that size (s = q k^T recomputed, dV = p^T dO, dP = dO v^T,
    dQ = dS k, dK = dS^T q): 2.5x the forward.
    causal: only the scores on or below the diagonal are work, about half of them
    (FlashAttention's benchmarks count exactly half; for M != N and other offsets the
    count of visible scores differs, and this convention still counts half).
    """
    flops = 4.0 * B * H * M * N * D
    if causal:
        flops *= 0.5
    return 2.5 * flops if backward else flops


def input_problems(
    head_dim: int, batch: int = 1, heads: int = 1, q_len: int = 1, kv_len: int = 1, v_head_dim: int | None = None
) -> list[str]:
    """Why the kernels cannot serve a call with these sizes: an empty list means they can.

    Each reason names the limit, the value and what to do. dtypes, devices and masks
    are the caller's to check (they need torch); these are the kernels' own limits.
    """
    out = []
    if head_dim < MIN_HEAD_DIM:
        out.append(
            f"head_dim={head_dim} is below {MIN_HEAD_DIM}: pad the heads to {MIN_HEAD_DIM} or use another backend"
        )
    elif head_dim > MAX_HEAD_DIM:
        out.append(f"head_dim={head_dim} exceeds {MAX_HEAD_DIM}: split the heads or use another backend")
    if v_head_dim is not None and v_head_dim != head_dim:
        out.append(
            f"v head_dim={v_head_dim} differs from q/k head_dim={head_dim}: not supported; pad v or use another backend"
        )
    if kv_len < 1:
        out.append(f"kv_len={kv_len}: attention over no keys is undefined (need at least one key)")
    if batch > MAX_GRID_YZ:
        out.append(f"batch={batch} exceeds {MAX_GRID_YZ} (CUDA grid limit): split the batch")
    if heads > MAX_GRID_YZ:
        out.append(f"heads={heads} exceeds {MAX_GRID_YZ} (CUDA grid limit): split the heads")
    return out
