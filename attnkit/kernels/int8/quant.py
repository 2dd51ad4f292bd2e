"""Quantisation of Q and K for the INT8 attention kernel (int8/kernels.py), in torch.

    q8, qs, k8, ks, pieces = quantize_qk(q, k, scale)
    q_hat, k_hat = dequantize(q8, qs, k8, ks, head_dim)   # what the kernel multiplies

K is smoothed first: k - mean over its tokens (per batch and head). Every score of a
query row then changes by the same q.mean, which the softmax does not see, so the
smoothing itself is exact (tests/kernels/test_int8.py checks it in float64); it removes
the per-channel offsets of K that a per-token scale would otherwise have to cover.

Each token (a row of Q, a row of smoothed K) is quantised symmetrically:
x8 = round(x / s) with s = max|x| / 127, so |x - x8 * s| <= s / 2 per element. The
softmax scale is folded into the query scales. Rows of zeros get scale 0 (x8 = 0).
"""

from __future__ import annotations

import torch

from .. import limits

QMAX = 127


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


def _per_token(x: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x8 (..., width) int8 zero-padded, scale (...,) float32) of x (..., D), in float32."""
    amax = x.abs().amax(dim=-1)
    scale = amax / QMAX
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    x8 = torch.zeros((*x.shape[:-1], width), dtype=torch.int8, device=x.device)
    x8[..., : x.shape[-1]] = torch.round(x * inv[..., None]).clamp_(-QMAX, QMAX).to(torch.int8)
    return x8, scale


def smooth(k: torch.Tensor) -> torch.Tensor:
    """k - its mean over tokens (dim 2), in float32: the same shift of every score of a
    query row, which the softmax does not see."""
    k32 = k.to(torch.float32)
    return k32 - k32.mean(dim=2, keepdim=True)


def quantize_qk(q: torch.Tensor, k: torch.Tensor, scale: float) -> tuple:
    """(q8, qs, k8, ks, (DQ0, DQ1)) for (B, H, M, D) q and (B, H, N, D) k: int8 q8 and
    k8 contiguous with the head dim padded to DQ0 + DQ1, float32 per-token scales qs
    (B, H, M) (the softmax scale folded in) and ks (B, H, N)."""
    pieces = qk_pieces(q.shape[-1])
    width = sum(pieces)
    q8, qs = _per_token(q.to(torch.float32), width)
    k8, ks = _per_token(smooth(k), width)
    return q8, (qs * scale).contiguous(), k8, ks.contiguous(), pieces


def dequantize(q8, qs, k8, ks, head_dim: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_hat, k_hat) in float64, (B, H, L, head_dim): the values whose products the
    kernel computes (q_hat . k_hat * scale = the kernel's score, exactly up to the
    float32 rounding of qs * ks)."""
    q_hat = q8[..., :head_dim].to(torch.float64) * (qs.to(torch.float64) / scale)[..., None]
    k_hat = k8[..., :head_dim].to(torch.float64) * ks.to(torch.float64)[..., None]
    return q_hat, k_hat
