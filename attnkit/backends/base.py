"""What every attention backend declares, and the description of one call.

A backend computes ``softmax(q @ k^T * scale + attn_bias) @ v`` on tensors of shape
(B, H, M, D) / (B, H, N, D) and nothing else: the diffusers-facing work (projections,
norms, reshapes, residuals) lives once in :mod:`attnkit.processor`.

Each backend states what it supports as data (:class:`Capabilities`), and
``not_supported_reasons(call)`` turns a mismatch into sentences a user can act on. An
empty list means "can run". The selector (:func:`attnkit.auto`) and the named processors
both use the same reasons, so a named processor refuses with exactly the words the
selector prints in ``explain()``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass, field
from typing import ClassVar, Mapping

import torch

# Mask kinds, from the most to the least restrictive. A backend that supports "bias"
# supports every kind; "key_padding" is a bias that depends only on (batch, key).
MASK_KINDS = ("none", "key_padding", "bias")

_DTYPE_NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def mask_kind(attn_bias: torch.Tensor | None) -> str:
    """Classify a bias broadcastable to (B, H, M, N) into one of MASK_KINDS."""
    if attn_bias is None:
        return "none"
    if attn_bias.dim() == 4 and attn_bias.shape[1] == 1 and attn_bias.shape[2] == 1:
        return "key_padding"
    return "bias"


def package_version(name: str) -> str | None:
    """The installed version of a distribution, or None if it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _version_tuple(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


@dataclass(frozen=True)
class DeviceInfo:
    """The hardware a call runs on: enough to choose a backend without touching it."""

    type: str  # "cpu", "cuda", "mps", ...
    capability: tuple[int, int] | None = None  # CUDA compute capability
    name: str | None = None

    @staticmethod
    def of(device: torch.device) -> "DeviceInfo":
        return _device_info(device.type, device.index)


_DEVICE_CACHE: dict[tuple[str, int | None], DeviceInfo] = {}


def _device_info(kind: str, index: int | None) -> DeviceInfo:
    key = (kind, index)
    info = _DEVICE_CACHE.get(key)
    if info is None:
        if kind == "cuda" and torch.cuda.is_available():
            idx = torch.cuda.current_device() if index is None else index
            info = DeviceInfo(
                "cuda", tuple(torch.cuda.get_device_capability(idx)), torch.cuda.get_device_name(idx)
            )
        else:
            info = DeviceInfo(kind)
        _DEVICE_CACHE[key] = info
    return info


@dataclass(frozen=True)
class AttentionCall:
    """What a backend needs to know to say whether it can serve a call.

    It is built from real tensors by :meth:`from_tensors`, or written by hand to ask
    "what would run on an H100 in fp16 at head dim 40?" without one.
    """

    device: DeviceInfo
    dtype: torch.dtype
    head_dim: int
    q_len: int = 1
    kv_len: int = 1
    batch: int = 1
    heads: int = 1
    mask: str = "none"
    requires_grad: bool = False
    # distribution name -> version (None: not installed). None means "look it up".
    packages: Mapping[str, str | None] | None = field(default=None, compare=False, hash=False)

    @staticmethod
    def from_tensors(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_bias: torch.Tensor | None = None
    ) -> "AttentionCall":
        b, h, m, d = q.shape
        return AttentionCall(
            device=DeviceInfo.of(q.device),
            dtype=q.dtype,
            head_dim=d,
            q_len=m,
            kv_len=k.shape[-2],
            batch=b,
            heads=h,
            mask=mask_kind(attn_bias),
            requires_grad=torch.is_grad_enabled()
            and (q.requires_grad or k.requires_grad or v.requires_grad),
        )

    def package(self, name: str) -> str | None:
        if self.packages is not None:
            return self.packages.get(name)
        return package_version(name)


@dataclass(frozen=True)
class Capabilities:
    """What a backend can serve. Every limit here is also in its error and the README."""

    devices: frozenset[str]
    dtypes: frozenset[torch.dtype]
    min_head_dim: int = 1
    max_head_dim: int | None = None
    head_dim_multiple: int = 1
    min_capability: tuple[int, int] | None = None  # CUDA only
    masks: frozenset[str] = frozenset(MASK_KINDS)
    backward: bool = True
    deterministic: bool = True
    package: str | None = None  # distribution that must be installed
    min_version: str | None = None


class Backend:
    """Base class of the attention backends: capabilities as data, reasons as strings."""

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities]

    # -- what it can serve -------------------------------------------------------
    def not_supported_reasons(self, call: AttentionCall) -> list[str]:
        """Readable reasons why this backend cannot serve ``call``; empty if it can."""
        caps = self.capabilities
        reasons: list[str] = []
        if caps.package is not None:
            version = call.package(caps.package)
            if version is None:
                reasons.append(
                    f"{caps.package} is not installed (pip install 'attnkit[{self.name}]')"
                )
            elif caps.min_version and _version_tuple(version) < _version_tuple(caps.min_version):
                reasons.append(f"{caps.package} {version} < {caps.min_version} (upgrade it)")
        if call.device.type not in caps.devices:
            reasons.append(
                f"device={call.device.type} (supported: {', '.join(sorted(caps.devices))})"
            )
        elif (
            call.device.type == "cuda"
            and caps.min_capability is not None
            and call.device.capability is not None
            and tuple(call.device.capability) < caps.min_capability
        ):
            have = ".".join(map(str, call.device.capability))
            need = ".".join(map(str, caps.min_capability))
            reasons.append(f"compute capability {have} < {need}")
        if call.dtype not in caps.dtypes:
            supported = ", ".join(dtype_name(d) for d in _sorted_dtypes(caps.dtypes))
            reasons.append(f"dtype={call.dtype} (supported: {supported})")
        d = call.head_dim
        if d < caps.min_head_dim:
            reasons.append(f"head_dim={d} < {caps.min_head_dim}")
        if caps.max_head_dim is not None and d > caps.max_head_dim:
            reasons.append(f"head_dim={d} > {caps.max_head_dim}")
        if caps.head_dim_multiple > 1 and d % caps.head_dim_multiple:
            reasons.append(f"head_dim={d} is not a multiple of {caps.head_dim_multiple}")
        if call.mask not in caps.masks:
            reasons.append(
                f"mask={call.mask} (supported: {', '.join(k for k in MASK_KINDS if k in caps.masks)})"
            )
        if call.requires_grad and not caps.backward:
            reasons.append("backward is not supported (inputs require grad)")
        reasons.extend(self.extra_reasons(call))
        return reasons

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        """Backend-specific reasons beyond the declared capabilities."""
        return []

    # -- the computation ---------------------------------------------------------
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_bias: torch.Tensor | None = None,
        scale: float | None = None,
        upcast: bool = False,
    ) -> torch.Tensor:
        """Attention on q: (B, H, M, D), k, v: (B, H, N, D) -> (B, H, M, D), q's dtype.

        attn_bias: None, or an additive float tensor broadcastable to (B, H, M, N)
        (stride 0 on broadcast dims; the processor never expands it in memory).
        scale: multiplier of q @ k^T (default D ** -0.5).
        upcast: the module asked for scores and softmax in float32 (SD2.1's
        upcast_attention / upcast_softmax); backends whose scores are already float32
        on chip may ignore it.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _sorted_dtypes(dtypes) -> list[torch.dtype]:
    order = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
    return [d for d in order if d in dtypes] + sorted(
        (d for d in dtypes if d not in order), key=str
    )


class BackendUnavailable(ValueError):
    """A named backend cannot serve a call. The message lists every reason.

    ``reasons`` holds the same reasons as data: {backend label: [reason, ...]} for
    every backend that was considered (one entry for a named backend), so callers (the
    benchmark, ``attnkit info``) never parse the message.
    """

    def __init__(self, message: str, reasons: Mapping[str, list[str]] | None = None):
        super().__init__(message)
        self.reasons: dict[str, list[str]] = {k: list(v) for k, v in (reasons or {}).items()}
