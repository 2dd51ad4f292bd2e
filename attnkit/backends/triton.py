"""triton: attnkit's own FlashAttention-2 kernel (attnkit.kernels.flash).

Takes (B, H, M, D) views with any strides (last dim contiguous) as the processor makes
them, any head dim from 8 to 512 (split into power-of-two pieces, not padded to the next
power of two), any M and N, an additive bias of any broadcast kind read through its
strides, causal masking at any offset (tiles above the diagonal skipped), and returns the
log-sum-exp (differentiable) for context parallelism. Forward and backward are deterministic (no atomics; every output element has
one writer).

Triton is imported only when the backend computes, so asking what it supports works
without triton installed.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import torch

# attnkit.kernels.limits imports no triton: the submodule import keeps the package's own
# triton import from raising where triton is missing (see kernels/__init__.py)
import attnkit.kernels.devices as devices
import attnkit.kernels.limits as limits
from attnkit.kernels.bias_form import variants_of_call

from .base import MASK_KINDS, AttentionCall, Backend, Capabilities, DeviceInfo

CPU_REASON = (
    "device=cpu: the triton backend runs on CUDA; on the CPU it runs only under TRITON_INTERPRET=1, for debugging"
)


def _interpreting() -> bool:
    """Whether the kernels run (or will run) in Triton's CPU interpreter.

    Triton fixes this when the kernels are defined, so once they are imported their
    module's flag is the truth; before that, the environment variable is.
    """
    mod = sys.modules.get("attnkit.kernels.launcher")
    if mod is not None:
        return bool(mod.INTERPRETED)
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class TritonBackend(Backend):
    name = "triton"
    capabilities = Capabilities(
        devices=frozenset({"cuda"}),
        dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
        min_head_dim=limits.MIN_HEAD_DIM,
        max_head_dim=limits.MAX_HEAD_DIM,
        # 8.0: bf16 tensor-core MMA starts with Ampere, and the tile configurations are
        # compiled and checked (registers, shared memory) for sm_80 and sm_90 only
        # (python -m tools.static_report), and sm_86 / sm_89 compile the sm_80 defaults clean
        # (its consumer section). Not Turing: Triton emits no tensor-core MMA for sm_75 (its
        # rows fall back to FMA and spill); it would need that and fp16-only tiles in 64 KiB.
        min_capability=(8, 0),
        masks=frozenset(MASK_KINDS),
        backward=True,
        causal=True,  # any offset; tiles above the diagonal are skipped
        lse=True,  # flash_attention_with_lse, differentiable through the log-sum-exp
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
        # The kernels' own limits beyond the declared ones (grid, keys). The head dim is
        # given clamped: its range is declared above, and said once.
        d = min(max(call.head_dim, limits.MIN_HEAD_DIM), limits.MAX_HEAD_DIM)
        reasons = limits.input_problems(
            d, call.batch or 1, call.heads or 1, call.q_len or 1, 1 if call.kv_len is None else call.kv_len
        )
        # A GPU with less shared memory per block than the call's tiles need (the
        # backward's too if it will run): refused here, not at a backward that cannot launch.
        if call.device.type == "cuda" and call.device.capability is not None:
            variants = variants_of_call(call.mask, call.q_len)
            why = devices.shared_memory_problem(
                call.device.capability, call.dtype, d, variants, call.causal, call.requires_grad
            )
            if why:
                reasons.append(why)
        return reasons

    def forward(self, q, k, v, attn_bias=None, scale=None, upcast=False, *, causal_offset=None, dropout_p=0.0):
        # upcast is already the case: scores, softmax and accumulators are fp32 on chip.
        from attnkit.kernels import flash_attention

        return flash_attention(
            q,
            k,
            v,
            attn_bias,
            scale,
            allow_tf32=self.allow_tf32,
            causal=causal_offset is not None,
            causal_offset=causal_offset or 0,
        )

    def forward_with_lse(self, q, k, v, attn_bias=None, scale=None, upcast=False, *, causal_offset=None):
        from attnkit.kernels import flash_attention_with_lse

        return flash_attention_with_lse(
            q,
            k,
            v,
            attn_bias,
            scale,
            allow_tf32=self.allow_tf32,
            causal=causal_offset is not None,
            causal_offset=causal_offset or 0,
        )
