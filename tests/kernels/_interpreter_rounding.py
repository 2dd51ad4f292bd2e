"""Make Triton's interpreter round fp32 -> bf16 to nearest even, as GPUs do.

Triton's interpreter (triton 3.9.0) converts fp32 to bf16 by dropping the low 16 bits:
truncation, which is biased towards zero and has twice the error of rounding. A GPU's
conversion (`cvt.rn.bf16.f32` on sm_80 and newer) rounds to nearest, ties to even, as
torch does. Left alone, every bf16 result of the kernels on the CPU (the output, P before
the P @ V and dS @ Q products, dQ, dK, dV) would carry that extra error, and the bf16
tests would measure the interpreter rather than the kernel.

install() replaces the interpreter's converter for that one case (fp32 to bf16 with
the default rounding) and leaves every other conversion to Triton. It changes nothing
the compiled kernels run. tests/kernels/test_kernel_flash.py checks both that it is in effect
and that the interpreter still needs it.
"""

from __future__ import annotations

import numpy as np


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """The bf16 bit patterns (uint16) of fp32 values, rounded to nearest, ties to even.
    NaN stays NaN (quiet, sign kept); values past bf16's range round to inf."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) >> 16).astype(np.uint16)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded.reshape(x.shape)


def install() -> bool:
    """Patch the interpreter; False (and nothing changed) if this Triton has no such
    converter to patch."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_convert_float", None)
    if original is None:
        return False
    if getattr(original, "rounds_bf16_to_nearest", False):
        return True

    def convert(input, input_dtype, output_dtype, rounding_mode):
        if rounding_mode is None and input_dtype == tl.float32 and output_dtype == tl.bfloat16:
            return fp32_to_bf16_bits(input)
        return original(input, input_dtype, output_dtype, rounding_mode)

    convert.rounds_bf16_to_nearest = True
    convert.original = original
    interpreter._convert_float = convert
    return True
