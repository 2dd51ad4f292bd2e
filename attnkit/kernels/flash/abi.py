"""The flash kernels' calling convention on the host side: what every launch of
kernels.py (and of the int8 forward, which shares it) is compiled with and passed
besides its tensors. The static report (tools/static_report) compiles its rows from this
module and hashes it whole into its source key: a change here is a change of what the
report's rows are built from.

COMPILE_OPTIONS  the compile options of every launch
ABSENT, absent_arguments   the arguments a launch passes as None (compiled as constants)
align            the ALIGN constexpr of a launch's strides
causal_args      (CAUSAL, OFF) of a call's causality
precision        the PRECISION constexpr
FWD_STRIDES, BWD_STRIDES   the stride arguments of the forward and backward kernels, in order
TUNE_KEY         what an autotuner's choice depends on
"""

from __future__ import annotations

from typing import Optional

import torch

from ..launcher import INTERPRETED
from .kernels import KEY_BIAS, NO_BIAS

# Fused multiply-add contraction (s * scale + bias in one rounding), stated rather than
# left to TRITON_DEFAULT_FP_FUSION, whose default Triton plans to change. The static
# report compiles with the same options. Not passed to the interpreter, which has no such
# option.
COMPILE_OPTIONS = {} if INTERPRETED else {"enable_fp_fusion": True}

# The arguments a launch passes as None, by the constexprs that say it does not read them
# (kernels.py's docstring): Triton compiles a None argument as a constant, and the
# launcher packs nothing for it on each call.
ABSENT = (
    (lambda c: not c.get("TMA", False), ("KD0", "KD1", "VD0", "VD1", "QD0", "QD1", "DOD0", "DOD1")),
    (lambda c: c["BIAS"] == NO_BIAS, ("Bias", "stride_bb", "stride_bh", "stride_bm", "stride_bn", "LseShift")),
    (lambda c: c["BIAS"] != KEY_BIAS, ("Lens", "Plain", "stride_lb", "stride_lh")),
    (lambda c: not c.get("STORE_LO", True), ("OutLo",)),
    (lambda c: not c.get("BIAS_GRAD", True), ("DBias", "stride_dbb", "stride_dbh", "stride_dbm")),
)


def absent_arguments(fn, constexprs: dict) -> dict:
    """{name: None} for each argument of kernel fn (a flash kernel, or the int8 one)
    that a launch with these constexprs does not read; the static report compiles the
    same."""
    names = set(fn.arg_names)
    absent = {}
    for unread, group in ABSENT:
        if unread(constexprs):
            absent.update((n, None) for n in group if n in names)
    return absent


def align(*strides: int) -> int:
    """The largest power of two <= 16 that divides every stride (0 divides by anything).

    Passed to the kernels as ALIGN: a true hint that lets the compiler vectorise loads
    (e.g. head dim 40 in a (B, N, H, D) layout has a head stride of 40: 8-aligned).
    """
    a = 16
    for st in strides:
        while st % a:
            a //= 2
    return a


def causal_args(offset: Optional[int], M: int, N: int) -> tuple[bool, int]:
    """(CAUSAL, OFF) for the kernels of a call whose causality is ``offset`` (None: not
    causal). Offsets beyond [-M, N - 1] mean the same as their bound (every row blind,
    or every key visible), so they are clamped into 32 bits; an offset that hides
    nothing is no mask at all."""
    if offset is None:
        return False, 0
    offset = max(-M, min(int(offset), N - 1))
    if offset >= N - 1:
        return False, 0
    return True, offset


def precision(dtype: torch.dtype, allow_tf32: bool) -> str:
    """The PRECISION constexpr. Only fp32 operands look at it: "ieee" is true fp32,
    "tf32" the tensor-core format."""
    return "tf32" if (allow_tf32 or dtype != torch.float32) else "ieee"


# What an autotuner's choice depends on (of the arguments each kernel has): fp32 with and
# without tf32 (PRECISION) run on different units.
TUNE_KEY = ("HEAD_DIM", "M", "N", "CAUSAL", "TMA", "PIECE", "GRADS", "PRECISION")

_QKV = ("stride_qb", "stride_qh", "stride_qm", "stride_kb", "stride_kh", "stride_kn", "stride_vb", "stride_vh")
_BIAS = ("stride_vn", "stride_bb", "stride_bh", "stride_bm", "stride_bn", "stride_lb", "stride_lh")
FWD_STRIDES = (*_QKV, *_BIAS, "stride_ob", "stride_oh", "stride_om")
BWD_STRIDES = (*_QKV, *_BIAS, "stride_dob", "stride_doh", "stride_dom")
