"""Which attention processors can run here, in which order they are measured, and
putting one on a UNet."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import attnkit
from attnkit.backends import AttentionCall, DeviceInfo

from .measure import STATUS_NA, STATUS_OK, describe, unavailable_reason

# What users come for first (auto, torch's SDPA, the fused kernels), the slow references
# last: a run cut short by its time budget loses the references, not the headline.
MEASURE_ORDER = ("auto", "sdpa", "triton", "flash_attn", "xformers", "vanilla", "sliced")
REFERENCES = ("vanilla", "sliced")


def resolve_names(spec: str | None) -> list[str]:
    """`None`/"all" -> every processor in :data:`MEASURE_ORDER`; else a comma-separated
    list, checked, in the order given."""
    if spec is None or spec.strip() in ("", "all"):
        known = [n for n in MEASURE_ORDER if n in attnkit.PROCESSOR_NAMES]
        others = [n for n in attnkit.PROCESSOR_NAMES if n not in MEASURE_ORDER]
        return [n for n in known if n not in REFERENCES] + others + [n for n in known if n in REFERENCES]
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in attnkit.PROCESSOR_NAMES]
    if unknown:
        raise ValueError(f"unknown processor(s) {', '.join(unknown)}; choose from {', '.join(attnkit.PROCESSOR_NAMES)}")
    return list(dict.fromkeys(names))


def attention_calls(
    unet: nn.Module, device: torch.device, dtype: torch.dtype, batch: int, tokens: int
) -> list[AttentionCall]:
    """The distinct kinds of attention call the UNet makes (head dim, self/cross)."""
    from diffusers.models.attention_processor import Attention

    info = DeviceInfo.of(device)
    seen: dict[tuple, AttentionCall] = {}
    for module in unet.modules():
        if not isinstance(module, Attention):
            continue
        heads = module.heads
        head_dim = module.to_q.out_features // heads
        kv = 77 if module.is_cross_attention else tokens
        key = (heads, head_dim, kv == tokens)
        if key not in seen:
            seen[key] = AttentionCall(
                device=info, dtype=dtype, head_dim=head_dim, q_len=tokens, kv_len=kv, batch=2 * batch, heads=heads
            )
    return list(seen.values())


def make_processor(name: str) -> tuple[Any | None, str]:
    """(processor, "") or (None, why it cannot be made here)."""
    try:
        return attnkit.processor(name), ""
    except ImportError as exc:
        return None, f"backend not importable: {describe(exc)}"
    except attnkit.BackendUnavailable as exc:
        return None, unavailable_reason(exc)
    except Exception as exc:  # noqa: BLE001 - a broken backend must not stop the run
        return None, describe(exc)


def precheck(
    name: str, proc: Any, unet: nn.Module, device: torch.device, dtype: torch.dtype, batch: int, tokens: int
) -> str:
    """Why this processor cannot serve this UNet here ("" if nothing is known against it).

    Asks the backend's own ``not_supported_reasons`` about each kind of call the UNet
    makes; auto chooses per call and is not asked.
    """
    if name == "auto":
        return ""
    if name == "triton" and device.type != "cuda":
        # Under TRITON_INTERPRET=1 the kernels run on CPU tensors in Triton's interpreter:
        # a debugging aid thousands of times slower than a kernel, not something to time.
        return "device=cpu: Triton kernels run on CUDA (its CPU interpreter is for debugging, not timing)"
    backend = getattr(proc, "backend", None)
    if backend is None or not hasattr(backend, "not_supported_reasons"):
        return ""
    reasons: list[str] = []
    try:
        for call in attention_calls(unet, device, dtype, batch, tokens):
            for reason in backend.not_supported_reasons(call):
                if reason not in reasons:
                    reasons.append(reason)
    except Exception as exc:  # noqa: BLE001
        return f"could not check: {describe(exc)}"
    return "; ".join(reasons)


def availability(
    names: list[str], unet: nn.Module, device: torch.device, dtype: torch.dtype, batch: int, tokens: int
) -> dict[str, tuple[Any | None, str, str]]:
    """name -> (processor or None, status, reason)."""
    out = {}
    for name in names:
        proc, reason = make_processor(name)
        if proc is not None:
            reason = precheck(name, proc, unet, device, dtype, batch, tokens)
        out[name] = (None, STATUS_NA, reason) if reason else (proc, STATUS_OK, "")
    return out


def set_processor(unet: nn.Module, proc: Any) -> None:
    """Put `proc` on every attention module of the UNet attnkit can serve."""
    attnkit.apply(getattr(unet, "_orig_mod", unet), proc)
