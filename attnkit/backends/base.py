"""What every attention backend declares, and the description of one call.

A backend computes ``softmax(q @ k^T * scale + attn_bias) @ v`` on tensors of shape
(B, H, M, D) / (B, H, N, D) and nothing else: the diffusers-facing work (projections,
norms, reshapes, residuals) lives once in :mod:`attnkit.diffusers.processor`.

Each backend states what it supports as data (:class:`Capabilities`), and
``not_supported_reasons(call)`` turns a mismatch into sentences a user can act on. An
empty list means "can run". The selector (:func:`attnkit.auto`) and the named processors
both use the same reasons, so a named processor refuses with exactly the words the
selector prints in ``explain()``. (The tensor helpers several backends share around
their kernels, a bias narrowed to a kernel's dtype and the like, are in
:mod:`attnkit.backends.tensors`.)
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass, field
from typing import ClassVar, Mapping, NamedTuple

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
        return device_info(device.type, device.index)


# (device type, index) -> what it is: bounded by the devices of the machine; never stale (a
# device's capability and name do not change)
_DEVICE_CACHE: dict[tuple[str, int | None], DeviceInfo] = {}


def device_info(kind: str, index: int | None) -> DeviceInfo:
    key = (kind, index)
    info = _DEVICE_CACHE.get(key)
    if info is None:
        if kind == "cuda" and torch.cuda.is_available():
            idx = torch.cuda.current_device() if index is None else index
            major, minor = torch.cuda.get_device_capability(idx)
            info = DeviceInfo("cuda", (major, minor), torch.cuda.get_device_name(idx))
        else:
            info = DeviceInfo(kind)
        _DEVICE_CACHE[key] = info
    return info


class Signature(NamedTuple):
    """What decides whether a backend can serve a call, as one hashable key.

    Built once per call on the hot path (:func:`signature`) and used as the cache key of
    every per-call decision: a named processor's "can this backend serve it", auto()'s
    choice, the tuning cache. Under ``torch.compile`` the lengths and batch may be
    symbolic: they are None there (``for_compile``), meaning "any".
    """

    device_type: str
    device_index: int | None
    dtype: torch.dtype
    head_dim: int
    q_len: int | None
    kv_len: int | None
    batch: int | None
    heads: int | None
    mask: str
    grad: bool
    causal: bool = False
    dropout: bool = False
    lse: bool = False
    deterministic: bool = False

    def for_compile(self) -> "Signature":
        """The signature without the dims torch.compile may make symbolic (see
        :func:`compile_key`)."""
        return self._replace(q_len=None, kv_len=None, batch=None, heads=None)


def _key(q, k, v, attn_bias, causal: bool, dropout: bool, lse: bool, compiling: bool) -> tuple:
    """The fields of a Signature, in order, as a plain tuple."""
    dev = q.device
    b, h, m, d = q.shape
    n = k.shape[-2]
    if compiling:  # symbolic under torch.compile: "any"
        b = h = m = n = None
    return (
        dev.type,
        dev.index,
        q.dtype,
        d,
        m,
        n,
        b,
        h,
        "none" if attn_bias is None else mask_kind(attn_bias),
        torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad),
        causal,
        dropout,
        lse,
        torch.are_deterministic_algorithms_enabled(),
    )


def signature(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: torch.Tensor | None,
    causal: bool = False,
    dropout: bool = False,
    lse: bool = False,
) -> Signature:
    """The :class:`Signature` of attention on q (B, H, M, D), k/v (B, H, N, D)."""
    return Signature(*_key(q, k, v, attn_bias, causal, dropout, lse, False))


def compile_key(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: torch.Tensor | None,
    causal: bool = False,
    dropout: bool = False,
    lse: bool = False,
) -> tuple:
    """:func:`signature` for torch.compile's trace, as a plain tuple of constants (what a
    trace-time constant function may take; ``Signature(*key)`` rebuilds it). The batch,
    heads and lengths may be symbolic there: they are None ("any")."""
    return _key(q, k, v, attn_bias, causal, dropout, lse, True)


@dataclass(frozen=True)
class AttentionCall:
    """What a backend needs to know to say whether it can serve a call.

    It is built from a :class:`Signature` of real tensors (:meth:`from_tensors`,
    :meth:`from_signature`), or written by hand to ask "what would run on an H100 in fp16
    at head dim 40?" without one. None lengths (under torch.compile) mean "any".
    """

    device: DeviceInfo
    dtype: torch.dtype
    head_dim: int
    q_len: int | None = 1
    kv_len: int | None = 1
    batch: int | None = 1
    heads: int | None = 1
    mask: str = "none"
    requires_grad: bool = False
    causal: bool = False  # top-left aligned, as torch SDPA's is_causal
    dropout: bool = False  # dropout on the attention weights (training)
    lse: bool = False  # the caller also needs the row log-sum-exp
    deterministic: bool = False  # torch.use_deterministic_algorithms(True) is on
    # distribution name -> version (None: not installed). None means "look it up".
    packages: Mapping[str, str | None] | None = field(default=None, compare=False, hash=False)

    @staticmethod
    def from_signature(sig: Signature, packages: Mapping[str, str | None] | None = None) -> "AttentionCall":
        device = device_info(sig.device_type, sig.device_index)
        return AttentionCall(
            device,
            sig.dtype,
            sig.head_dim,
            sig.q_len,
            sig.kv_len,
            sig.batch,
            sig.heads,
            sig.mask,
            sig.grad,
            sig.causal,
            sig.dropout,
            sig.lse,
            sig.deterministic,
            packages,
        )

    @staticmethod
    def from_tensors(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_bias: torch.Tensor | None = None, **flags: bool
    ) -> "AttentionCall":
        return AttentionCall.from_signature(signature(q, k, v, attn_bias, **flags))

    def signature(self) -> Signature:
        return Signature(
            self.device.type,
            None,
            self.dtype,
            self.head_dim,
            self.q_len,
            self.kv_len,
            self.batch,
            self.heads,
            self.mask,
            self.requires_grad,
            self.causal,
            self.dropout,
            self.lse,
            self.deterministic,
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
    # What forward() implements beyond softmax(q k^T * scale + bias) v; off unless a
    # backend declares it, so that a call needing it is refused, never half-served.
    causal: bool = False  # is_causal (top-left aligned)
    dropout: bool = False  # dropout on the attention weights
    lse: bool = False  # can return the row log-sum-exp
    # Same inputs, same bits, forward and backward. With torch.use_deterministic_algorithms
    # on, a backend that is not is refused.
    deterministic: bool = True
    package: str | None = None  # distribution that must be installed
    min_version: str | None = None
    install_hint: str | None = None  # how to install `package`, shown beside the reason


class Backend:
    """Base class of the attention backends: capabilities as data, reasons as strings.

    A reason states the limit and the value ("head_dim=320 > 256"); how to install a
    missing package is not in the reason but in ``capabilities.install_hint``, so that
    reasons stay short and callers never parse them.
    """

    name: ClassVar[str]
    capabilities: Capabilities  # the class's declaration; an instance may narrow it (sdpa's pinned kernel)

    # -- what it can serve -------------------------------------------------------
    def not_supported_reasons(self, call: AttentionCall) -> list[str]:
        """Readable reasons why this backend cannot serve ``call``; empty if it can."""
        caps = self.capabilities
        reasons: list[str] = []
        if caps.package is not None:
            version = call.package(caps.package)
            if version is None:
                reasons.append(f"{caps.package} is not installed")
            elif caps.min_version and _version_tuple(version) < _version_tuple(caps.min_version):
                reasons.append(f"{caps.package} {version} < {caps.min_version}")
        device_reason = self.device_reason(call)
        if device_reason:
            reasons.append(device_reason)
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
            reasons.append(f"mask={call.mask} (supported: {', '.join(k for k in MASK_KINDS if k in caps.masks)})")
        if call.requires_grad and not caps.backward:
            reasons.append("backward is not supported (inputs require grad)")
        if call.causal and not caps.causal:
            reasons.append("is_causal=True is not supported")
        if call.dropout and not caps.dropout:
            reasons.append("dropout on the attention weights is not supported")
        if call.lse and not caps.lse:
            reasons.append("cannot return the log-sum-exp")
        if call.deterministic and not caps.deterministic:
            reasons.append("not deterministic (torch.use_deterministic_algorithms(True) is on)")
        reasons.extend(self.extra_reasons(call))
        return reasons

    def device_reason(self, call: AttentionCall) -> str | None:
        """Why this backend cannot run on the call's device, or None if it can."""
        caps = self.capabilities
        if call.device.type not in caps.devices:
            return f"device={call.device.type} (supported: {', '.join(sorted(caps.devices))})"
        cap = call.device.capability
        if call.device.type == "cuda" and caps.min_capability is not None and cap is not None:
            if tuple(cap) < caps.min_capability:
                have = ".".join(map(str, cap))
                need = ".".join(map(str, caps.min_capability))
                return f"compute capability {have} < {need}"
        return None

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        """Backend-specific reasons beyond the declared capabilities."""
        return []

    def install_hint(self, call: AttentionCall) -> str | None:
        """How to install what this backend needs, if that is what is missing."""
        caps = self.capabilities
        if caps.package is None or caps.install_hint is None:
            return None
        version = call.package(caps.package)
        if version is None or (caps.min_version and _version_tuple(version) < _version_tuple(caps.min_version)):
            return caps.install_hint
        return None

    # -- the computation ---------------------------------------------------------
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_bias: torch.Tensor | None = None,
        scale: float | None = None,
        upcast: bool = False,
        *,
        causal_offset: int | None = None,
        dropout_p: float = 0.0,
    ) -> torch.Tensor:
        """Attention on q: (B, H, M, D), k, v: (B, H, N, D) -> (B, H, M, Dv), q's dtype.

        attn_bias: None, or an additive float tensor broadcastable to (B, H, M, N)
        (stride 0 on broadcast dims; the processor never expands it in memory).
        scale: multiplier of q @ k^T (default D ** -0.5).
        upcast: the module asked for scores and softmax in float32 (SD2.1's
        upcast_attention / upcast_softmax); backends whose scores are already float32
        on chip may ignore it.
        causal_offset: None, or query i sees key j only if j <= i + causal_offset (0 is
        torch SDPA's is_causal); only backends that declare ``causal`` are given one.
        dropout_p: dropout on the attention weights; only backends that declare
        ``dropout`` are given one above 0.
        """
        raise NotImplementedError

    def forward_with_lse(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_bias: torch.Tensor | None = None,
        scale: float | None = None,
        upcast: bool = False,
        *,
        causal_offset: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` and the row log-sum-exp of the scaled, biased scores: (out,
        lse (B, H, M), float32, natural log; -inf where a row sees no key, out 0 there),
        both differentiable. Only backends that declare ``lse``."""
        raise NotImplementedError(f"the {self.name} backend cannot return the log-sum-exp")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _sorted_dtypes(dtypes) -> list[torch.dtype]:
    order = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
    return [d for d in order if d in dtypes] + sorted((d for d in dtypes if d not in order), key=str)


class BackendUnavailable(ValueError):
    """A named backend cannot serve a call. The message lists every reason.

    ``reasons`` holds the same reasons as data: {backend label: [reason, ...]} for
    every backend that was considered (one entry for a named backend), so callers (the
    benchmark, ``attnkit info``) never parse the message.
    """

    def __init__(self, message: str, reasons: Mapping[str, list[str]] | None = None):
        super().__init__(message)
        self.reasons: dict[str, list[str]] = {k: list(v) for k, v in (reasons or {}).items()}
