"""How the kernels read a bias, decided in one place, from metadata alone.

    from attnkit.kernels.bias_form import bias_form, variants_of_call

Every part of attnkit that depends on a bias's kernel form asks here: the conversion
before a launch (flash/ops.py: a bool mask or a 16-bit bias the kernels do not read as it
is becomes float32), the launch's constants and variant (flash/launch.py), the forward's
shared-memory check, the INT8 kernel (through the launcher), and, from a call's
description rather than its tensors, the backend's refusals and the device table
(variants_of_call). The decision reads shapes, strides, dtypes and, where the tensor has
storage, its address: it runs on fake and meta tensors and inside a torch.compile trace.

This module imports neither triton nor the kernels (the backend reads it where triton is
not installed).

The forms ("variants", the names the tile lists and the static report use):
- "none": no bias.
- "keypad": a bias that does not depend on the query (its query stride 0 once expanded to
  (B, H, M, N)): the kernels read one row per (batch, head) and measure its length, and
  skip the key tiles past it. Read in float32.
- "full16": a full bias in the inputs' 16-bit dtype, read as it is (no float32 copy of
  B*H*M*N elements): its last dim contiguous, its row, head and batch strides and its
  address multiples of BIAS_16BIT_ALIGN elements, in a call autograd will not
  differentiate (the backward reads float32).
- "full": every other bias, read in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor

NONE, KEYPAD, FULL, FULL16 = "none", "keypad", "full", "full16"

# The alignment (in elements) a full 16-bit bias is read at as it is: its row, head and
# batch strides even, so that a bias tile is copied in 4-byte pieces (cp.async copies
# no less). The kernels then take BIAS_ALIGN = 2 whatever larger power of two divides
# the strides, the code the static report compiles for the "full16" rows. A 16-bit bias
# with an odd stride, or one of another layout, is converted to float32 first.
BIAS_16BIT_ALIGN = 2

# Offsets inside a tile (row index times row stride) are 32-bit: a bias whose tile of
# rows would span this many elements is made contiguous in its own shape first.
_SPAN_LIMIT = 2**31


@dataclass(frozen=True)
class BiasForm:
    """How the kernels read one bias in one call.

    variant: "none", "keypad", "full" or "full16" (above).
    to_float32: the bias is converted to an additive float32 bias before the launch.
    compact: it is made contiguous in its own shape first (a tile's rows would span
        2**31 elements or more through its strides).
    strides: its (b, h, m, n) strides once expanded to (B, H, M, N), of the compact copy
        where there is one ((0, 0, 0, 0) without a bias).
    """

    variant: str
    to_float32: bool
    compact: bool
    strides: tuple

    @property
    def table_variant(self) -> str:
        """The variant the device table (devices.NEEDS) and the shared-memory check key
        on: "full16" counts as "full"."""
        return FULL if self.variant == FULL16 else self.variant


_NO_BIAS = BiasForm(NONE, False, False, (0, 0, 0, 0))


def bias_form(
    attn_bias: Optional[torch.Tensor], shape4, *, q_dtype: torch.dtype, needs_grad: bool, max_tile_rows: int
) -> BiasForm:
    """The kernel form of ``attn_bias`` (broadcastable to ``shape4`` = (B, H, M, N)) in a
    call whose inputs are in ``q_dtype``, with or without a backward (``needs_grad``).
    ``max_tile_rows``: the most rows a tile of the launcher's configurations has.

    A bias whose query stride is 0 once expanded is "keypad", whatever its dtype or shape
    ((B, 1, 1, N), (B, H, 1, N), (1, N), ...); one query row of its own (M == 1) keeps its
    stride and is "full". A tensor without storage (fake, or traced by torch.compile) has
    no address yet: its layout alone decides, and the forward decides again on the real
    tensor (ops._forward_body)."""
    if attn_bias is None:
        return _NO_BIAS
    expanded = attn_bias.expand(*shape4)
    sb = tuple(expanded.stride())
    compact = max(sb[2:]) * (max_tile_rows - 1) >= _SPAN_LIMIT
    if compact:
        sb = tuple(torch.empty(attn_bias.shape, dtype=attn_bias.dtype, device="meta").expand(*shape4).stride())
    to_float32 = attn_bias.dtype != torch.float32
    if sb[2] == 0:
        return BiasForm(KEYPAD, to_float32, compact, sb)
    if (
        to_float32
        and attn_bias.dtype == q_dtype
        and not needs_grad
        and not compact
        and attn_bias.element_size() == 2
        and sb[3] == 1
        and all(st % BIAS_16BIT_ALIGN == 0 for st in sb[:3])
        and _address_aligned(attn_bias)
    ):
        return BiasForm(FULL16, False, False, sb)
    return BiasForm(FULL, to_float32, compact, sb)


def _address_aligned(attn_bias: torch.Tensor) -> bool:
    if torch.compiler.is_compiling() or isinstance(attn_bias, FakeTensor) or attn_bias.is_meta:
        return True  # no storage yet: the layout alone decides
    try:
        address = attn_bias.data_ptr()
    except (RuntimeError, NotImplementedError):  # fake or functional tensors: no storage
        return True
    return address % (BIAS_16BIT_ALIGN * attn_bias.element_size()) == 0


# A call's mask kind (attnkit.backends.base.MASK_KINDS) -> the table variants bias_form()
# may give its bias: a "bias" whose rows are all equal (query stride 0) runs as "keypad".
_TABLE_VARIANTS = {"none": (NONE,), "key_padding": (KEYPAD,), "bias": (KEYPAD, FULL)}


def variants_of_call(mask: str, q_len: Optional[int]) -> tuple[str, ...]:
    """The table variants (see BiasForm.table_variant) a call of this mask kind and query
    length may run as, for what is decided from a call's description, before its tensors
    exist (the backend's refusals, the device table). One query row (q_len 1) keeps a
    key-padding bias's query stride, and bias_form() makes it "full"."""
    variants = _TABLE_VARIANTS[mask]
    if mask != "none" and q_len == 1:
        return (KEYPAD, FULL)
    return variants
