"""The attention backends, by name. Each module computes attention on (B, H, N, D) only.

Backends are imported lazily: importing attnkit never imports triton, xformers or
flash_attn.
"""

from __future__ import annotations

import importlib

from .base import (
    MASK_KINDS,
    AttentionCall,
    Backend,
    BackendUnavailable,
    Capabilities,
    DeviceInfo,
    mask_kind,
)

# name -> "module:Class"
_REGISTRY = {
    "vanilla": "attnkit.backends.vanilla:VanillaBackend",
    "sliced": "attnkit.backends.sliced:SlicedBackend",
    "sdpa": "attnkit.backends.sdpa:SDPABackend",
    "xformers": "attnkit.backends.xformers:XFormersBackend",
    "flash_attn": "attnkit.backends.flash_attn:FlashAttnBackend",
    "triton": "attnkit.backends.triton:TritonBackend",
}

BACKEND_NAMES = tuple(_REGISTRY)


def backend_class(name: str) -> type[Backend]:
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown attention backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}"
        ) from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def get_backend(name: str, **options) -> Backend:
    """A backend instance by name, with its options (e.g. slice_size for sliced)."""
    return backend_class(name)(**options)


__all__ = [
    "MASK_KINDS",
    "BACKEND_NAMES",
    "AttentionCall",
    "Backend",
    "BackendUnavailable",
    "Capabilities",
    "DeviceInfo",
    "backend_class",
    "get_backend",
    "mask_kind",
]
