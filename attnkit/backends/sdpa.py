"""sdpa: torch.nn.functional.scaled_dot_product_attention, scale and mask passed through.

Optionally pinned to one of torch's kernels (flash, efficient, math, cudnn) through
torch.nn.attention.sdpa_kernel; a pinned kernel declares that kernel's own limits, so
the processor refuses a call it cannot take instead of letting torch fall back.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from ..masks import hidden_to_bias
from .base import AttentionCall, Backend, BackendUnavailable, Capabilities, dtype_name, mask_kind
from .tensors import causal_mask, fix_dead_rows, narrow_bias

_HALF = frozenset({torch.float16, torch.bfloat16})
_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})

# What each pinned kernel accepts (torch 2.x, sdp_utils.cpp). Unpinned, torch picks the
# best kernel per call and always has the math kernel to fall back on.
_KERNEL_CAPS = {
    # lse: torch's CPU flash kernel returns it (without a gradient): see extra_reasons
    None: Capabilities(
        devices=frozenset({"cpu", "cuda", "mps", "xpu"}), dtypes=_FLOATS, causal=True, dropout=True, lse=True
    ),
    "math": Capabilities(devices=frozenset({"cpu", "cuda", "mps", "xpu"}), dtypes=_FLOATS, causal=True, dropout=True),
    # torch's CPU flash kernel takes every float dtype, head dim and mask; the CUDA
    # one's extra limits are in SDPABackend.extra_reasons.
    "flash": Capabilities(
        devices=frozenset({"cpu", "cuda"}),
        dtypes=_FLOATS,
        min_capability=(8, 0),
        causal=True,
        dropout=True,
        deterministic=False,
    ),
    "efficient": Capabilities(
        devices=frozenset({"cuda"}),
        dtypes=_HALF | {torch.float32},
        max_head_dim=256,
        head_dim_multiple=8,
        min_capability=(5, 0),
        causal=True,
        dropout=True,
        deterministic=False,
    ),
    "cudnn": Capabilities(
        devices=frozenset({"cuda"}),
        dtypes=_HALF,
        max_head_dim=128,
        head_dim_multiple=8,
        min_capability=(8, 0),
        causal=True,
        dropout=True,
        deterministic=False,
    ),
}

KERNELS = ("flash", "efficient", "math", "cudnn")


def _sdpa_backend_enum(kernel: str):
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
    }[kernel]


class SDPABackend(Backend):
    name = "sdpa"
    capabilities = _KERNEL_CAPS[None]

    def __init__(self, kernel: str | None = None):
        if kernel is not None and kernel not in KERNELS:
            raise ValueError(f"kernel={kernel!r}: choose one of {', '.join(KERNELS)}, or None to let torch choose")
        if kernel is not None:
            try:
                from torch.nn.attention import sdpa_kernel  # noqa: F401  (torch >= 2.3)
            except ImportError as e:
                raise ValueError(
                    f"kernel={kernel!r} needs torch.nn.attention.sdpa_kernel (torch >= 2.3); "
                    f"torch {torch.__version__} is installed: upgrade torch, or leave the kernel "
                    "unpinned (SDPAProcessor()) and let torch choose"
                ) from e
        self.kernel = kernel
        self.capabilities = _KERNEL_CAPS[kernel]

    def __repr__(self) -> str:
        return f"SDPABackend(kernel={self.kernel!r})" if self.kernel else "SDPABackend()"

    def not_supported_reasons(self, call: AttentionCall) -> list[str]:
        """The declared reasons; for a pinned kernel, one more that names it, the call
        and the SDPA settings that can serve it (the processor's refusal only names the
        backend, 'sdpa')."""
        reasons = super().not_supported_reasons(call)
        if reasons and self.kernel is not None:
            reasons.append(self._pinned_note(call))
        return reasons

    def _pinned_note(self, call: AttentionCall) -> str:
        able = [
            other
            for other in (None,) + KERNELS
            if other != self.kernel and not Backend.not_supported_reasons(_pinned(other), call)
        ]
        if able:
            instead = ", ".join(
                "no pin (SDPAProcessor(): torch chooses per call)" if other is None else f"kernel={other!r}"
                for other in able
            )
            instead = f"use {instead}; or attnkit.auto()"
        else:
            instead = "no SDPA kernel serves it here: use attnkit.auto()"
        return f"the pinned kernel={self.kernel!r} cannot serve this call ({_describe_call(call)}): {instead}"

    def extra_reasons(self, call):
        reasons = []
        if call.lse:
            # torch's CPU flash kernel returns the log-sum-exp, without a gradient for it
            if call.device.type != "cpu":
                reasons.append(
                    f"device={call.device.type}: torch's SDPA returns the log-sum-exp on the CPU only "
                    "(triton, vanilla and sliced return it everywhere)"
                )
            if call.requires_grad:
                reasons.append("torch's SDPA gives its log-sum-exp no gradient (vanilla, sliced and triton do)")
        if self.kernel != "flash" or call.device.type != "cuda":
            return reasons
        if call.dtype not in _HALF:
            reasons.append(f"dtype={call.dtype} (torch's CUDA flash kernel: float16, bfloat16)")
        if call.head_dim > 256:
            reasons.append(f"head_dim={call.head_dim} > 256 (torch's CUDA flash kernel)")
        elif call.head_dim % 8:
            reasons.append(f"head_dim={call.head_dim} is not a multiple of 8 (torch's CUDA flash kernel)")
        if call.mask != "none":
            reasons.append(f"mask={call.mask} (torch's CUDA flash kernel takes no mask)")
        return reasons

    def forward(self, q, k, v, attn_bias=None, scale=None, upcast=False, *, causal_offset=None, dropout_p=0.0):
        out_dtype = q.dtype
        # The fused CUDA kernels keep scores in float32 on chip, so upcast costs nothing
        # there. The math kernel (CPU, or pinned) would hold fp16 scores: run it in fp32.
        if upcast and out_dtype in _HALF and (q.device.type != "cuda" or self.kernel == "math"):
            q, k, v = q.float(), k.float(), v.float()
        dead = None
        kernel = self.kernel
        is_causal = causal_offset == 0 and attn_bias is None
        if causal_offset is not None and not is_causal:
            # SDPA's is_causal is offset 0 and takes no mask besides: as an additive bias
            hidden = causal_mask(q.shape[-2], k.shape[-2], causal_offset, q.device)
            causal = hidden_to_bias(hidden, q.dtype)
            attn_bias = causal if attn_bias is None else attn_bias + causal
        if attn_bias is not None:
            if kernel == "flash" and torch.is_grad_enabled() and attn_bias.requires_grad:
                reason = (
                    "torch's flash SDPA kernel gives an attention mask no gradient, and this mask "
                    "requires one (a learned bias)"
                )
                raise BackendUnavailable(
                    f"the pinned SDPA kernel='flash' cannot serve {_describe_tensors(q, k, v, attn_bias)}: "
                    f"{reason}. Use SDPAProcessor() without a pinned kernel, kernel='math', or "
                    "attnkit.auto(), which routes the call to a backend that does",
                    reasons={self.name: [reason]},
                )
            attn_bias, dead = narrow_bias(attn_bias, q.dtype)
            if kernel is None and q.device.type == "cpu" and _needs_grad(q, k, v):
                # torch's CPU flash backward stores the log-sum-exp in the inputs' dtype: a
                # row whose keys are all masked by a large finite value (finfo.min, -1e9 in
                # fp32) loses log(N) in it and gets gradients N times too large. The math
                # kernel's backward is exact.
                kernel = "math"
        extra = {}
        if is_causal:
            extra["is_causal"] = True
        if dropout_p > 0.0:
            extra["dropout_p"] = dropout_p
        if kernel is None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, scale=scale, **extra)
        else:
            from torch.nn.attention import sdpa_kernel

            try:
                with sdpa_kernel(_sdpa_backend_enum(kernel)):
                    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, scale=scale, **extra)
            except RuntimeError as e:
                if self.kernel is None or not _no_kernel(e):
                    raise
                raise self._refused(q, k, v, attn_bias, scale, extra) from e
        if dead is not None:
            out = fix_dead_rows(out, v, dead)
        return out if out.dtype == out_dtype else out.to(out_dtype)

    def _refused(self, q, k, v, attn_bias, scale, extra) -> BackendUnavailable:
        """torch found no kernel under the pin: the error names the pinned kernel, the
        call, torch's reasons (the warnings it gives while checking the kernel, caught by
        trying the call again) and what to use instead."""
        reasons = []
        # warnings cannot be caught inside a graph; only a pinned kernel is refused
        if self.kernel is not None and not torch.compiler.is_compiling():
            reasons = _torch_reasons(self.kernel, q, k, v, attn_bias, scale, extra)
        if not reasons:
            call = AttentionCall.from_tensors(
                q, k, v, attn_bias, causal=bool(extra.get("is_causal")), dropout="dropout_p" in extra
            )
            reasons = Backend.not_supported_reasons(self, call)
        if not reasons:
            reasons = ["torch's SDPA found no kernel for it under this pin and gave no reason"]
        others = "SDPAProcessor() without a pinned kernel (torch then chooses one that can)"
        if self.kernel != "math":
            others += ", kernel='math' (it takes every call torch's SDPA takes)"
        return BackendUnavailable(
            f"the pinned SDPA kernel={self.kernel!r} cannot serve {_describe_tensors(q, k, v, attn_bias)}: "
            + "; ".join(reasons)
            + f". Use {others}, or attnkit.auto()",
            reasons={self.name: reasons},
        )

    def forward_with_lse(self, q, k, v, attn_bias=None, scale=None, upcast=False, *, causal_offset=None):
        """torch's CPU flash kernel with its log-sum-exp, for calls without gradients
        (declared in extra_reasons). A row that sees no key: out 0, lse -inf."""
        out_dtype = q.dtype
        if attn_bias is not None and attn_bias.dtype != q.dtype and attn_bias.is_floating_point():
            wide = torch.promote_types(attn_bias.dtype, q.dtype)  # never narrow a mask here
            q, k, v, attn_bias = q.to(wide), k.to(wide), v.to(wide), attn_bias.to(wide)
        is_causal = causal_offset == 0 and attn_bias is None
        if causal_offset is not None and not is_causal:
            hidden = causal_mask(q.shape[-2], k.shape[-2], causal_offset, q.device)
            causal = hidden_to_bias(hidden, q.dtype)
            attn_bias = causal if attn_bias is None else attn_bias + causal
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, is_causal, attn_mask=attn_bias, scale=scale
        )
        if attn_bias is not None:  # the kernel gives such rows lse 0: it is -inf
            dead = torch.isneginf(attn_bias).all(dim=-1)
            lse = lse.masked_fill(dead.expand(lse.shape), float("-inf"))
        lse = lse.float() if lse.dtype != torch.float64 else lse
        return out.to(out_dtype), lse


def _needs_grad(q, k, v) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def _pinned(kernel: str | None) -> SDPABackend:
    """One SDPABackend per kernel, to ask which of them can serve a call."""
    backend = _PINNED.get(kernel)
    if backend is None:
        backend = _PINNED[kernel] = SDPABackend(kernel)
    return backend


# one backend per SDPA kernel name (bounded by them; never stale)
_PINNED: dict[str | None, SDPABackend] = {}


def _no_kernel(e: RuntimeError) -> bool:
    """torch's error for "the enabled kernels cannot take this call" (its wording differs
    by version and device: 2.13 on the CPU says the first for flash, the second for the
    kernels that have no CPU implementation)."""
    text = str(e)
    return "No available kernel" in text or "No viable backend" in text


def _torch_reasons(kernel: str, q, k, v, attn_bias, scale, extra) -> list[str]:
    """Why torch refused the pinned kernel, in its own words: it says so in warnings
    while it checks the kernel, shown once per process at best; the call is tried again to
    catch them (it fails in the checks, before any work)."""
    from torch.nn.attention import sdpa_kernel

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(_sdpa_backend_enum(kernel)):
                F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, scale=scale, **extra)
        except RuntimeError:
            pass
    return [_strip_torch_warning(str(w.message)) for w in caught if "kernel not used because" not in str(w.message)]


def _strip_torch_warning(text: str) -> str:
    return text.split(" (Triggered internally at")[0].strip().rstrip(".")


def _describe_call(call: AttentionCall) -> str:
    """ "cpu float32 B=1 H=2 M=4 N=4 D=16 mask=none grad": the declared call, briefly."""
    lengths = "" if call.q_len is None else f" B={call.batch} H={call.heads} M={call.q_len} N={call.kv_len}"
    flags = [
        name
        for name, on in (
            ("grad", call.requires_grad),
            ("causal", call.causal),
            ("dropout", call.dropout),
            ("lse", call.lse),
        )
        if on
    ]
    return f"{call.device.type} {dtype_name(call.dtype)}{lengths} D={call.head_dim} mask={call.mask}" + "".join(
        " " + f for f in flags
    )


def _describe_tensors(q, k, v, attn_bias) -> str:
    """ "q (1, 2, 5, 8), k (1, 2, 7, 8), v (1, 2, 7, 16) float32 on cpu, mask=bias (1, 2, 5, 7)
    float32 requiring grad": the call as torch got it, briefly."""
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} {dtype_name(q.dtype)} on {q.device.type}"
    if attn_bias is None:
        return shapes + ", no mask"
    grad = " requiring grad" if attn_bias.requires_grad else ""
    return f"{shapes}, mask={mask_kind(attn_bias)} {tuple(attn_bias.shape)} {dtype_name(attn_bias.dtype)}{grad}"
