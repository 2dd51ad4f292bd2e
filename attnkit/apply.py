"""Processors by name, and setting them on a whole model."""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from .chooser import auto
from .processor import PROCESSORS, AttnkitProcessor

logger = logging.getLogger("attnkit")

PROCESSOR_NAMES = tuple(PROCESSORS) + ("auto",)


def processor(name: str, **options: Any) -> AttnkitProcessor:
    """A processor by name: vanilla, sliced, sdpa, xformers, flash_attn, triton or auto."""
    if name == "auto":
        return auto(**options)
    try:
        cls = PROCESSORS[name]
    except KeyError:
        raise ValueError(f"unknown processor {name!r}; choose one of {', '.join(PROCESSOR_NAMES)}") from None
    return cls(**options)


def _keeps_own_processor(proc: Any) -> bool:
    """Processors with weights or extra inputs (IP-Adapter, custom diffusion) stay."""
    name = type(proc).__name__
    return isinstance(proc, nn.Module) or "IPAdapter" in name or "AddedKV" in name or "Joint" in name


def apply(model: nn.Module, proc: AttnkitProcessor) -> dict[str, str]:
    """Set ``proc`` on every attention module of ``model`` that it can serve.

    Unlike ``model.set_attn_processor(proc)``, processors that carry weights or extra
    inputs (IP-Adapter, custom diffusion, added-KV and joint attention) are kept, and
    each module is given its name so logs and errors say which layer they mean.
    Returns {module name: "attnkit" | name of the processor kept}.
    """
    from diffusers.models.attention_processor import Attention

    for name, module in model.named_modules():
        if isinstance(module, Attention):
            module._attnkit_name = name
    current = model.attn_processors
    new: dict[str, Any] = {}
    report: dict[str, str] = {}
    for key, old in current.items():
        if _keeps_own_processor(old):
            new[key] = old
            report[key] = type(old).__name__
        else:
            new[key] = proc
            report[key] = "attnkit"
    kept = [k for k, v in report.items() if v != "attnkit"]
    if kept:
        logger.info("attnkit.apply kept %d processors of their own: %s", len(kept), ", ".join(kept))
    model.set_attn_processor(new)
    return report


__all__ = ["PROCESSOR_NAMES", "apply", "processor"]
