"""xformers: xformers.ops.memory_efficient_attention (optional extra ``attnkit[xformers]``).

xformers works on (B, M, H, K) tensors. The processor hands us (B, H, M, D) views of
(B, M, H, D) storage, so ``q.transpose(1, 2)`` is the layout xformers wants, for free.

What xformers itself requires, and what this backend does about it:

* a tensor ``attn_bias`` must have exactly the shape (B, H, M, N): we ``expand`` ours
  (broadcast dims keep stride 0, nothing is copied);
* every stride of the bias but the last must be a multiple of 16 bytes (8 fp16 / 4 fp32
  elements) and the last stride 1: a bias whose rows are not aligned (N not a multiple
  of 8) is copied once into storage padded to a multiple of 8 keys and sliced back;
* the bias dtype must be the query's;
* the fused kernels want head dims that are a multiple of 8 (tensor-core alignment): q,
  k and v are zero-padded to one and the output sliced back; the scale stays
  ``D ** -0.5`` of the real head dim (or ``attn.scale``), passed explicitly;
* a query row whose keys are all masked (-inf) gives zeros here, whatever the kernel
  writes for it.

No CPU kernel exists in current xformers (0.0.35 installs on CPU machines but every op
refuses device=cpu), so the backend declares CUDA only and the processor says so.

``op`` pins xformers' operator instead of letting its dispatcher choose: "cutlass",
"flash" or "flash3" (each declares that operator's own limits), or any xformers op
object (passed through unchecked).
"""

from __future__ import annotations

from typing import Any

import torch

from .base import MASK_KINDS, Backend, Capabilities
from .tensors import bnhd_padded, fix_dead_rows, narrow_bias, round_up

_HALF = frozenset({torch.float16, torch.bfloat16})
_ALL_MASKS = frozenset(MASK_KINDS)
_INSTALL = "pip install 'attnkit[xformers]' (the xformers build must match your torch)"

# memory_efficient_attention with xformers' own dispatch: its broadest operator is the
# CUTLASS one (fp16/bf16/fp32, head dim up to 65536, any tensor bias, sm_50 and newer).
_DEFAULT_CAPS = Capabilities(
    devices=frozenset({"cuda"}),
    dtypes=_HALF | {torch.float32},
    max_head_dim=65536,
    min_capability=(5, 0),
    masks=_ALL_MASKS,
    backward=True,
    deterministic=False,
    package="xformers",
    min_version="0.0.23",
    install_hint=_INSTALL,
)

# Pinned operators (xformers.ops.fmha.{cutlass,flash,flash3}): their declared limits.
_OP_CAPS = {
    "cutlass": _DEFAULT_CAPS,
    # xformers' FlashAttention-2 operator takes no tensor bias.
    "flash": Capabilities(
        devices=frozenset({"cuda"}),
        dtypes=_HALF,
        max_head_dim=256,
        min_capability=(8, 0),
        masks=frozenset({"none"}),
        backward=True,
        deterministic=False,
        package="xformers",
        min_version="0.0.23",
        install_hint=_INSTALL,
    ),
    # FlashAttention-3 (Hopper) as bundled by xformers.
    "flash3": Capabilities(
        devices=frozenset({"cuda"}),
        dtypes=_HALF,
        max_head_dim=256,
        min_capability=(9, 0),
        masks=frozenset({"none"}),
        backward=True,
        deterministic=False,
        package="xformers",
        min_version="0.0.28",
        install_hint=_INSTALL,
    ),
}

OP_NAMES = tuple(_OP_CAPS)


def import_xops():
    try:
        import xformers.ops as xops
    except Exception as e:  # ImportError, or a broken build raising at import
        raise ImportError(
            f"the xformers backend needs xformers, which could not be imported ({e}); "
            "install the build matching your torch (pip install 'attnkit[xformers]'), "
            "or choose another processor (`attnkit info` lists them)"
        ) from e
    return xops


def _resolve_op(op: Any):
    """An op name -> the xformers (forward, backward) operator pair."""
    if op is None or not isinstance(op, str):
        return op
    xops = import_xops()
    if op == "cutlass":
        return xops.MemoryEfficientAttentionCutlassOp
    if op == "flash":
        return xops.MemoryEfficientAttentionFlashAttentionOp
    from xformers.ops.fmha import flash3  # op == "flash3"

    return (flash3.FwOp, flash3.BwOp)


def aligned_bias(attn_bias: torch.Tensor, b: int, h: int, m: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """``attn_bias`` as xformers takes it: shape (B, H, M, N), q's dtype (already cast by
    the caller), rows 16-byte aligned.

    Broadcast dims stay stride 0 (xformers accepts them). Storage is copied only when
    its rows are not aligned, and then into a buffer padded to a multiple of 8 keys,
    sliced back to N.
    """
    bias = attn_bias.to(dtype)
    while bias.dim() < 4:
        bias = bias.unsqueeze(0)
    align = max(1, 16 // bias.element_size())
    aligned = (
        (bias.stride(-1) == 1 or bias.shape[-1] == 1)
        and bias.data_ptr() % 16 == 0
        and all(bias.stride(i) % align == 0 for i in range(3) if bias.shape[i] > 1)
    )
    if not aligned:
        padded_n = -(-n // 8) * 8
        buf = torch.empty((*bias.shape[:-1], padded_n), dtype=dtype, device=bias.device)[..., :n]
        buf.copy_(bias)
        bias = buf
    return bias.expand(b, h, m, n)


class XFormersBackend(Backend):
    name = "xformers"
    capabilities = _DEFAULT_CAPS

    def __init__(self, op: Any = None):
        if isinstance(op, str) and op not in _OP_CAPS:
            raise ValueError(
                f"op={op!r}: choose one of {', '.join(OP_NAMES)}, an xformers operator, or None to let xformers choose"
            )
        self.op = op
        if isinstance(op, str):
            self.capabilities = _OP_CAPS[op]
        self._resolved = None

    def __repr__(self) -> str:
        return f"XFormersBackend(op={self.op!r})" if self.op is not None else "XFormersBackend()"

    def forward(self, q, k, v, attn_bias=None, scale=None, upcast=False):
        # upcast: xformers keeps scores and softmax in float32 on chip already.
        xops = import_xops()
        if self.op is not None and self._resolved is None:
            self._resolved = _resolve_op(self.op)
        b, h, m, d = q.shape
        n, dv = k.shape[-2], v.shape[-1]
        scale = d**-0.5 if scale is None else float(scale)
        width = round_up(max(d, dv), 8)
        qt, kt, vt = bnhd_padded(q, width), bnhd_padded(k, width), bnhd_padded(v, width)
        bias = dead = None
        if attn_bias is not None:
            narrowed, dead = narrow_bias(attn_bias, q.dtype)
            bias = aligned_bias(narrowed, b, h, m, n, q.dtype)
        out = xops.memory_efficient_attention(qt, kt, vt, attn_bias=bias, p=0.0, scale=scale, op=self._resolved)
        out = out[..., :dv].transpose(1, 2)  # (B, H, M, Dv) view
        if attn_bias is not None:
            # rows whose keys are all masked: zeros (the kernels may write NaN there).
            out = out.masked_fill(torch.isneginf(attn_bias).all(dim=-1, keepdim=True), 0.0)
        return fix_dead_rows(out, v, dead).to(q.dtype)
