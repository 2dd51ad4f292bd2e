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
    Signature,
    _sorted_dtypes,
    dtype_name,
    mask_kind,
    signature,
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
        raise ValueError(f"unknown attention backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}") from None
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
    "Signature",
    "backend_class",
    "capability_columns",
    "get_backend",
    "limits_table",
    "mask_kind",
    "signature",
]


def capability_columns(caps: Capabilities) -> dict[str, str]:
    """A backend's declared limits, one readable value per column: the README's limits
    table and ``attnkit info`` both show these."""
    dims = f"{caps.min_head_dim}–{caps.max_head_dim}" if caps.max_head_dim else f"≥ {caps.min_head_dim}"
    if caps.head_dim_multiple > 1:
        dims += f", multiple of {caps.head_dim_multiple}"
    cap = ".".join(map(str, caps.min_capability)) if caps.min_capability and "cuda" in caps.devices else "–"
    pkg = caps.package or "–"
    if caps.package and caps.min_version:
        pkg += f" ≥ {caps.min_version}"
    yes = {True: "yes", False: "no"}
    return {
        "devices": ", ".join(sorted(caps.devices)),
        "dtypes": ", ".join(dtype_name(d) for d in _sorted_dtypes(caps.dtypes)),
        "head dim": dims,
        "min CUDA capability": cap,
        "masks": ", ".join(k for k in MASK_KINDS if k in caps.masks),
        "backward": yes[caps.backward],
        "causal": yes[caps.causal],
        "dropout": yes[caps.dropout],
        "lse": yes[caps.lse],
        "deterministic": yes[caps.deterministic],
        "needs": pkg,
    }


def limits_table() -> str:
    """The declared limits of every backend as a markdown table (it is in the README)."""
    rows: list[str] = []
    for name in BACKEND_NAMES:
        cols = capability_columns(backend_class(name).capabilities)
        if not rows:
            header = ["backend"] + list(cols)
            rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        rows.append("| " + " | ".join([f"`{name}`"] + list(cols.values())) + " |")
    return "\n".join(rows)
