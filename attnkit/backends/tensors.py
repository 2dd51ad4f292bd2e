"""The tensor work several backends share around their kernels: a bias narrowed to the
kernel's dtype (and the rows such a cast would get wrong, put right afterwards), the causal
mask, and the (B, N, H, D) layout that flash-attn and xformers take.

They live apart from :mod:`attnkit.backends.base`, which holds what a backend declares and
how a call is described: these act on a call's tensors, so each is written once and every
backend that needs it gets the same answer.
"""

from __future__ import annotations

import torch


def narrow_bias(attn_bias: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """An additive bias in ``dtype`` for a kernel that wants it there, and the rows the
    cast would get wrong.

    A plain cast turns finite values beyond ``dtype``'s range into -inf: a mask made with
    ``torch.finfo(torch.float32).min`` would fully mask a row in float16 (zeros) that
    float32 averages over V. Here values beyond the range saturate to its finite ends
    (-inf stays -inf), so bfloat16, whose range is float32's, computes what float32 does.
    float16 cannot (its scores keep q.k where float32's huge bias wipes them out), so for
    a float16 target the rows whose every key is masked by such a value are returned as
    ``dead`` (broadcastable to (B, H, M, 1)): :func:`fix_dead_rows` gives them mean(V),
    float32's answer. ``dead`` is None when the cast is exact by construction.
    """
    if attn_bias.dtype == dtype or not attn_bias.is_floating_point():
        return attn_bias, None
    have, want = torch.finfo(attn_bias.dtype), torch.finfo(dtype)
    if have.max <= want.max:  # fits: fp16 -> fp32, bf16 -> fp32, fp32 -> fp64
        return attn_bias.to(dtype), None
    low = attn_bias < want.min
    saturated = torch.where(torch.isneginf(attn_bias), attn_bias, attn_bias.clamp(want.min, want.max))
    dead = None
    if want.max < 1e38:  # float16: a saturated bias no longer dominates q.k
        dead = (low & torch.isfinite(attn_bias)).any(-1, keepdim=True) & low.all(-1, keepdim=True)
    return saturated.to(dtype), dead


def causal_mask(m: int, n: int, offset: int, device: torch.device | str) -> torch.Tensor:
    """(M, N) bool, True where key j is hidden from query i: j > i + offset. offset 0 is
    torch SDPA's is_causal (top-left); n - m aligns the diagonal bottom-right."""
    rows = torch.arange(m, device=device).unsqueeze(1)
    cols = torch.arange(n, device=device).unsqueeze(0)
    return cols > rows + offset


def fix_dead_rows(out: torch.Tensor, v: torch.Tensor, dead: torch.Tensor | None) -> torch.Tensor:
    """``out`` (B, H, M, Dv) with the rows ``dead`` (see :func:`narrow_bias`) replaced by
    the mean of v over the keys."""
    if dead is None:
        return out
    return torch.where(dead, v.mean(dim=-2, keepdim=True).to(out.dtype), out)


def bnhd_padded(x: torch.Tensor, width: int) -> torch.Tensor:
    """A (B, H, N, D) view as (B, N, H, width): free when the storage is already
    (B, N, H, D) with width == D; zero-padded (one copy) when width > D. For kernels that
    take (B, N, H, D) and need the head dim rounded up (flash-attn, xformers)."""
    x = x.transpose(1, 2)
    d = x.shape[-1]
    if d == width:
        return x if x.stride(-1) == 1 else x.contiguous()
    return torch.nn.functional.pad(x, (0, width - d))


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple
