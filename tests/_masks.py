"""The tests' one reference for masks: the mask variants the tests build by hand, and the
conversion of any mask to the additive float bias that the float64 reference adds to the
scores.

Written here, on purpose, independently of attnkit's own converter (attnkit.masks), which
is under test: a reference that called it would agree with it whatever it did.

Conventions (torch's scaled_dot_product_attention): a bool mask is True where a query
attends a key; an additive (float) mask is added to the scores, 0 to attend and -inf (or a
large negative value) to hide. Shapes broadcast against (B, H, M, N) scores: (M, N),
(B, 1, N), (B, 1, 1, N), (B, H, M, N)...
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def additive(mask: torch.Tensor | None, dtype: torch.dtype = torch.float64) -> torch.Tensor | None:
    """``mask`` as an additive bias in ``dtype``, same shape: None stays None; a bool mask
    gives 0 where True and -inf where False; a float mask is cast."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, NEG_INF)
    return mask.to(dtype)


def causal_bias(m: int, n: int, offset: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(m, n) additive: 0 where query i sees key j (j <= i + offset), -inf elsewhere.
    offset 0 is torch's is_causal (top-left); n - m is bottom-right; a negative offset
    leaves the first rows blind."""
    hidden = torch.arange(n)[None, :] > torch.arange(m)[:, None] + offset
    return additive(~hidden, dtype)


def key_padding_bias(keep: torch.Tensor, dtype: torch.dtype = torch.float64, dims: int = 4) -> torch.Tensor:
    """A key-padding mask from ``keep`` ((B, N) bool, True for the keys each batch item
    keeps) as an additive bias of ``dims`` dimensions: (B, N), (B, 1, N) or (B, 1, 1, N)."""
    assert keep.dtype == torch.bool and keep.dim() == 2, (keep.dtype, keep.shape)
    shapes = {2: keep.shape, 3: (keep.shape[0], 1, keep.shape[1]), 4: (keep.shape[0], 1, 1, keep.shape[1])}
    return additive(keep.reshape(shapes[dims]), dtype)
