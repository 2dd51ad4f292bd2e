"""triton: attnkit's own FlashAttention-2 kernel (attnkit.kernels.flash_attention).

Takes (B, H, M, D) views with any strides (last dim contiguous) as the processor makes
them, any head dim from 8 to 256 (split into power-of-two pieces, not padded to the next
power of two), any M and N, and an additive bias of any broadcast kind read through its
strides. Forward and backward are deterministic (no atomics; every output element has
one writer).

Triton is imported only when the backend computes, so asking what it supports works
without triton installed.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import torch

from .base import MASK_KINDS, AttentionCall, Backend, Capabilities, DeviceInfo

# The kernels' own limits (attnkit.kernels.flash_attention.MIN_HEAD_DIM / MAX_HEAD_DIM and
# the CUDA grid limit on its batch and head axes), repeated here so that asking needs no
# triton import.
_MIN_HEAD_DIM = 8
_MAX_HEAD_DIM = 256
_MAX_GRID_YZ = 65535

CPU_REASON = (
    "device=cpu: the triton backend runs on CUDA; on the CPU it runs only under "
    "TRITON_INTERPRET=1, for debugging"
)


def _interpreting() -> bool:
    """Whether the kernels run (or will run) in Triton's CPU interpreter.

    Triton fixes this when the kernels are defined, so once they are imported their
    module's flag is the truth; before that, the environment variable is.
    """
    mod = sys.modules.get("attnkit.kernels.flash_attention")
    if mod is not None:
        return bool(mod.INTERPRET)
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class TritonBackend(Backend):
    name = "triton"
    capabilities = Capabilities(
        devices=frozenset({"cuda"}),
        dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
        min_head_dim=_MIN_HEAD_DIM,
        max_head_dim=_MAX_HEAD_DIM,
        # 8.0: bf16 tensor-core MMA starts with Ampere, and the tile configurations are
        # compiled and checked (registers, shared memory) for sm_80 and sm_90 only
        # (python -m attnkit.kernels.inspect). Turing would need its own fp16-only tiles.
        min_capability=(8, 0),
        masks=frozenset(MASK_KINDS),
        backward=True,
        # Same inputs, same bits, forward and backward: no atomics. (The autotuner picks
        # a tile configuration per shape once per process; set ATTNKIT_TRITON_AUTOTUNE=0
        # for the same configuration, hence the same bits, in every process.)
        deterministic=True,
        package="triton",
        min_version="3.0",
        install_hint="pip install 'attnkit[triton]' (Linux; triton ships with CUDA builds of torch)",
    )

    def __init__(self, allow_tf32: bool = False):
        # fp32 inputs are multiplied in true fp32 unless tf32 is allowed explicitly.
        self.allow_tf32 = bool(allow_tf32)

    def __repr__(self) -> str:
        return "TritonBackend(allow_tf32=True)" if self.allow_tf32 else "TritonBackend()"

    def not_supported_reasons(self, call: AttentionCall) -> list[str]:
        if call.device.type == "cpu" and _interpreting():
            # The interpreter executes the CUDA kernels on CPU tensors: judge the call as
            # a CUDA call of unknown capability.
            call = replace(call, device=DeviceInfo("cuda"))
        return super().not_supported_reasons(call)

    def device_reason(self, call: AttentionCall) -> str | None:
        if call.device.type == "cpu":
            return CPU_REASON
        return super().device_reason(call)

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        reasons = []
        if call.batch > _MAX_GRID_YZ:
            reasons.append(f"batch={call.batch} > {_MAX_GRID_YZ} (CUDA grid limit)")
        if call.heads > _MAX_GRID_YZ:
            reasons.append(f"heads={call.heads} > {_MAX_GRID_YZ} (CUDA grid limit)")
        if call.kv_len < 1:
            reasons.append(f"kv_len={call.kv_len}: needs at least one key")
        return reasons

    def forward(self, q, k, v, attn_bias=None, scale=None, upcast=False):
        # upcast is already the case: scores, softmax and accumulators are fp32 on chip.
        from attnkit.kernels import flash_attention

        return flash_attention(q, k, v, attn_bias, scale, allow_tf32=self.allow_tf32)
