"""Quantisation of Q and K for the INT8 attention kernel (int8/kernels.py), in torch: the
reference form, which the fused Triton pass (int8/quant_kernel.py) computes bit for bit.

    q8, qs, k8, ks, pieces = quantize_qk(q, k, scale)                # K scales per block of 128 keys
    q8, qs, k8, ks, pieces = quantize_qk(q, k, scale, k_block=1)     # per key
    q_hat, k_hat = dequantize(q8, qs, k8, ks, head_dim, scale)       # what the kernel multiplies

K is smoothed first: k - mean over its tokens (per batch and head). Every score of a
query row then changes by the same q.mean, which the softmax does not see, so the
smoothing itself is exact (tests/kernels/test_int8.py checks it in float64); it removes
the per-channel offsets of K that a scale would otherwise have to cover.

Q is quantised per token (a row), smoothed K per block of ``k_block`` consecutive keys (128 by default)
(one scale for the block, its largest magnitude), both symmetrically: x8 = round(x / s)
with s = max|x| / 127, so |x - x8 * s| <= s / 2 per element. A per-block K scale is what
lets the kernel's main loop dequantise a score with one multiply by its row's factor
(qs[m] * ks[block], per tile) instead of an outer product per score; docs/int8.md
measures what it costs in accuracy against per-key scales (``k_block=1``). The softmax
scale's magnitude is folded into the query scales and its sign into q8 (qs >= 0, so the
kernel may take a row's maximum on the integer products). Rows and blocks of zeros get
scale 0 (x8 = 0).
"""

from __future__ import annotations

import torch

from .. import limits

QMAX = 127
K_BLOCK = 128  # keys per K scale: a multiple of every int8 tile's BLOCK_N (ops.TILES)


def qk_pieces(head_dim: int) -> tuple[int, int]:
    """(DQ0, DQ1): the zero-padded head dim of q8 and k8 as one or two power-of-two
    pieces of at least 32 (an int8 tensor-core product reduces over 32), DQ0 >= DQ1:
    40 -> (64, 0), 80 -> (64, 32), 128 -> (128, 0), 160 -> (128, 32), 320 -> (256, 64),
    512 -> (256, 256): no piece above 256, as in the exact kernel."""
    if not limits.MIN_HEAD_DIM <= head_dim <= limits.MAX_HEAD_DIM:
        raise ValueError(f"head_dim={head_dim}: the int8 kernel takes {limits.MIN_HEAD_DIM}-{limits.MAX_HEAD_DIM}")
    padded = -(-head_dim // 32) * 32
    if padded > 256:
        return 256, 1 << (padded - 256 - 1).bit_length()
    d0 = 1 << (padded.bit_length() - 1)
    rest = padded - d0
    if rest == 0:
        return d0, 0
    d1 = 1 << (rest - 1).bit_length()
    if d1 == d0:  # 224 = 128 + 96: one piece of 256 costs what two of 128 do
        return d0 * 2, 0
    return d0, d1


def _quantise(x: torch.Tensor, amax: torch.Tensor, width: int, sign: float = 1.0) -> tuple:
    """(x8 (..., width) int8 zero-padded, scale = amax / 127) of float32 x (..., D), with
    ``amax`` broadcast over x's rows (x8 = sign * round(x / scale))."""
    scale = amax / QMAX
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    x8 = torch.zeros((*x.shape[:-1], width), dtype=torch.int8, device=x.device)
    rounded = torch.round(x * inv[..., None]).clamp_(-QMAX, QMAX)
    x8[..., : x.shape[-1]] = (-rounded if sign < 0 else rounded).to(torch.int8)
    return x8, scale


def smooth(k: torch.Tensor) -> torch.Tensor:
    """k - its mean over tokens (dim 2), in float32: the same shift of every score of a
    query row, which the softmax does not see."""
    k32 = k.to(torch.float32)
    return k32 - k32.mean(dim=2, keepdim=True)


def block_amax(x: torch.Tensor, block: int) -> torch.Tensor:
    """(B, H, cdiv(N, block)): the largest magnitude of each block of ``block`` rows of
    x (B, H, N, D); the last block may be short."""
    B, H, N, D = x.shape
    per_row = x.abs().amax(dim=-1)
    if block == 1:
        return per_row
    pad = -N % block
    if pad:
        per_row = torch.nn.functional.pad(per_row, (0, pad))
    return per_row.view(B, H, -1, block).amax(dim=-1)


def per_key(ks: torch.Tensor, n: int, k_block: int) -> torch.Tensor:
    """ks (B, H, cdiv(n, k_block)) as one scale per key (B, H, n)."""
    return ks if k_block == 1 else ks.repeat_interleave(k_block, dim=-1)[..., :n]


def quantize_qk(q: torch.Tensor, k: torch.Tensor, scale: float, k_block: int = K_BLOCK) -> tuple:
    """(q8, qs, k8, ks, (DQ0, DQ1)) for (B, H, M, D) q and (B, H, N, D) k: int8 q8 and
    k8 contiguous with the head dim padded to DQ0 + DQ1, float32 scales qs (B, H, M) per
    token (|scale| folded in; its sign in q8) and ks (B, H, cdiv(N, k_block)) per block of
    keys, all contiguous."""
    if not isinstance(k_block, int) or k_block < 1:
        raise ValueError(f"k_block={k_block!r}: keys per K scale, a positive int")
    pieces = qk_pieces(q.shape[-1])
    width = sum(pieces)
    q32 = q.to(torch.float32)
    q8, qs = _quantise(q32, q32.abs().amax(dim=-1), width, -1.0 if scale < 0 else 1.0)
    ksm = smooth(k)
    amax = block_amax(ksm, k_block)
    k8, ks = _quantise(ksm, per_key(amax, k.shape[2], k_block), width)
    return q8, (qs * abs(scale)).contiguous(), k8, (amax / QMAX).contiguous(), pieces


def dequantize(q8, qs, k8, ks, head_dim: int, scale: float, k_block: int = K_BLOCK) -> tuple:
    """(q_hat, k_hat) in float64, (B, H, L, head_dim): the values whose products the
    kernel computes (q_hat . k_hat * scale = the kernel's score, exactly up to the
    float32 rounding of qs * ks), for scales made with ``k_block``."""
    n = k8.shape[2]
    if ks.shape[-1] != -(-n // k_block):
        raise ValueError(f"ks has {ks.shape[-1]} scales for {n} keys, not one per block of {k_block}")
    q_hat = q8[..., :head_dim].to(torch.float64) * (qs.to(torch.float64) / scale)[..., None]
    k_hat = k8[..., :head_dim].to(torch.float64) * per_key(ks.to(torch.float64), n, k_block)[..., None]
    return q_hat, k_hat
