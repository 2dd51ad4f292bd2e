"""What an attnkit backend name runs when diffusers' ``dispatch_attention_fn`` calls it:
the holder of the name's chooser (made on first use, or held weakly), the backend
function (:func:`attention`), and the served call (_ServedCall) that runs a call signature it has served
before directly. The names themselves are registered by :mod:`attnkit.diffusers.backend`.

What the backend function takes: diffusers' (B, S, H, D) tensors, as views (no copy);
``attn_mask`` as diffusers' native backend reads it (a (B, S_kv) key-padding mask, or any
mask broadcastable to (B, H, S_q, S_kv), boolean True = attend or additive float);
``scale``; ``is_causal`` (top-left, as torch's SDPA); ``dropout_p``; ``enable_gqa``;
``return_lse``. Anything else it is given is refused with :class:`UnsupportedModule`,
never dropped: diffusers filters keyword arguments by the backend's signature and drops
the others without a word, so attnkit's entry tells it to pass everything.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

import torch

from ..backends import signature
from ..block_masks import block_mask_attention
from ..block_masks import check as check_block_mask
from ..block_masks import hides_nothing as block_mask_hides_nothing
from ..choose.compiling import is_compiling
from ..errors import DiffusersBackendUnavailable, UnsupportedModule
from ..masks import expand_kv_heads, hides_nothing, keep_to_bias, route_bias
from ..text import Caller
from .context_parallel import context_parallel

DISPATCH_WHO = "through dispatch_attention_fn"
# What attnkit's backend function implements of dispatch_attention_fn's arguments.
KNOWN_ARGS = (
    "query",
    "key",
    "value",
    "attn_mask",
    "dropout_p",
    "is_causal",
    "scale",
    "enable_gqa",
    "return_lse",
    "_parallel_config",
)

# the lock of the registered names and their holders (attnkit.diffusers.backend takes it too)
_LOCK = threading.RLock()


class _ChooserHolder:
    """The chooser behind one registered name: made on first use by ``factory`` (creating
    auto()'s at import would read ATTNKIT_BACKEND before a user sets it), or a chooser
    given and held weakly (a processor's, see :func:`attnkit.diffusers.backend.member_for`:
    the models it serves hold it, this registry never does).

    Under torch.compile the chooser is made by :func:`_make_chooser`, a trace-time
    constant run in plain Python, before the trace reads it: a model compiled before its
    first call (``with attention_backend("attnkit")``, which makes nothing up front) never
    traces the lock or the chooser's constructor, and the graph reads the built chooser
    (one guard on it, as after an eager call)."""

    __slots__ = ("name", "factory", "_strong", "_weak", "served")

    def __init__(self, name: str, factory: Callable[[], Any] | None, chooser: Any = None) -> None:
        self.name, self.factory = name, factory
        self._strong: Any = None
        # a weak reference, or _gone once a weakly held chooser is replaced by None
        self._weak: Callable[[], Any] | None = weakref.ref(chooser) if chooser is not None else None
        # the plain call's served calls, per call signature (see attention); made for the chooser
        # held now, and dropped when another is set
        self.served: dict[tuple, _ServedCall] = {}

    @property
    def chooser(self):
        """The chooser, or None (not made yet, or freed)."""
        return self._strong if self._weak is None else self._weak()

    @chooser.setter
    def chooser(self, chooser) -> None:
        with _LOCK:
            self.served = {}
            if self._weak is None:
                self._strong = chooser
            else:
                self._weak = weakref.ref(chooser) if chooser is not None else _gone

    def get(self):
        chooser = self._strong
        if chooser is not None:  # the hot path: no lock
            return chooser
        if self._weak is not None:
            chooser = self._weak()
            if chooser is None:
                raise DiffusersBackendUnavailable(
                    f"attention backend {self.name!r} belonged to an attnkit processor that no longer exists; "
                    f'set attnkit\'s backend again (set_attention_backend("attnkit"), attnkit.apply)'
                )
            return chooser
        with _LOCK:
            if self._strong is None:
                self._strong = self.factory()
        return self._strong

    def traced(self):
        """get() for torch.compile's trace: the chooser made outside the traced code first."""
        _make_chooser(self.name)
        return self.get()


def _gone():
    return None


# registered name -> its holder, for _make_chooser (a trace-time constant takes a string):
# one per registered attnkit name (a chooser's own name leaves with it, backend.registered_names)
HOLDERS: dict[str, _ChooserHolder] = {}


def _make_chooser(name: str) -> bool:
    """Run by torch.compile while tracing, in plain Python: make the chooser behind the
    registered name ``name`` if it is not made yet."""
    HOLDERS[name].get()
    return True


# -- the backend function ----------------------------------------------------------------
def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
    _parallel_config: Any = None,
    *,
    _holder: _ChooserHolder,
    **unknown: Any,
):
    """dispatch_attention_fn's call, served by an attnkit chooser.

    query: (B, S_q, H, D); key, value: (B, S_kv, H_kv, D) (H_kv < H with enable_gqa).
    Returns (B, S_q, H, Dv), and the log-sum-exp (B, S_q, H) float32 with return_lse.
    """
    if unknown:
        raise UnsupportedModule(
            f"attnkit's diffusers backend was given {', '.join(sorted(unknown))}, which it does not "
            "implement; set another attention backend on this model (set_attention_backend) or "
            "leave it to its own processor (attnkit.apply keeps processors it cannot serve)"
        )
    if attn_mask is not None and is_block_mask(attn_mask):
        block_mask: Any = attn_mask
        check_block_mask(block_mask, query.shape[0], query.shape[2], query.shape[1], key.shape[1])
        if block_mask_hides_nothing(block_mask):
            attn_mask = None  # every key seen whole: the call is the same without it
        else:
            return _block_masked(
                query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, _parallel_config,
                _holder.get(),
            )  # fmt: skip
    if is_compiling():
        return _attend(
            _holder.traced(),
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            return_lse,
            _parallel_config,
        )
    chooser = _holder._strong or _holder.get()
    if _parallel_config is not None or return_lse or is_causal or dropout_p != 0.0:
        return _attend(
            chooser, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, _parallel_config
        )
    # The plain call (no causal mask, dropout, LSE or context parallelism): once a call
    # signature has been served, its backend is kept per signature and called directly
    # (see _ServedCall); the first call of each signature goes the whole way, checks and all.
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        return _attend(chooser, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, False, None)
    call_key = served_key(query, key, value, attn_mask, enable_gqa)
    served = _holder.served
    found = served.get(call_key)
    if found is not None:
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        bias = None if attn_mask is None or found.drops_mask else found.bias_of(attn_mask, q.dtype)
        try:
            return found.backend.forward(q, k, v, bias, scale, False).transpose(1, 2)
        except Exception:  # noqa: BLE001  (the whole way now: auto()'s fall-back, or the error as it is)
            served.pop(call_key, None)
            return _attend(chooser, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, False, None)
    out = _attend(
        chooser,
        query,
        key,
        value,
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        enable_gqa,
        False,
        None,
        record=(served, call_key),
    )
    return out


def served_key(query, key, value, attn_mask: torch.Tensor | None, enable_gqa: bool) -> tuple:
    """The key of a plain call's served call: the shapes of q, k, v, q's dtype and device
    (a k or v of another dtype or device fails in the kept backend, which sends the call
    the whole way, checks and all), the mask's shape, dtype, device and whether it hides
    nothing (masks.hides_nothing: then it is served as no mask), enable_gqa, whether a
    gradient is needed and torch's deterministic mode: everything the first call's checks
    and decision read."""
    mask_key = None
    if attn_mask is not None:
        mask_key = (
            attn_mask.shape,
            attn_mask.dtype,
            attn_mask.device,
            attn_mask.requires_grad,
            hides_nothing(attn_mask),
        )
    return (
        query.shape,
        key.shape,
        value.shape,
        query.dtype,
        query.device,
        mask_key,
        enable_gqa,
        torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad),
        torch.are_deterministic_algorithms_enabled(),
    )


class _ServedCall:
    """What a served call signature of the plain call runs: the backend its holder's
    chooser decided (a holder drops its served calls when its chooser is replaced), and how its
    mask becomes the bias that backend takes (the view the checks made of it, and whether
    it is a boolean mask to turn into 0 / -inf). It holds no chooser, so that a chooser
    the registry holds weakly is freed with its models. The checks of
    the first call (shapes, mask shape and dtype, the chooser's decision) hold for every
    call with the same key: the shapes, dtypes and devices of q, k, v and the mask,
    enable_gqa, whether a gradient is needed and torch's deterministic mode.

    A transformer passes one mask tensor to each of its layers: the bias made of it is
    kept (``last``: a weak reference to the mask, its version counter, the bias) and
    used again while the same tensor comes back unchanged (an in-place change bumps its
    version). Not for a mask that needs a gradient (each forward builds its own graph)
    or an inference tensor (it has no version counter)."""

    __slots__ = ("backend", "mask_shape", "keep_mask", "drops_mask", "last", "__weakref__")

    def __init__(self, backend, mask_shape, keep_mask: bool, drops_mask: bool = False) -> None:
        self.backend, self.mask_shape, self.keep_mask = backend, mask_shape, keep_mask
        self.drops_mask = drops_mask  # a mask that hides nothing: the backend runs without it
        self.last: tuple[weakref.ReferenceType[torch.Tensor], int, torch.Tensor] | None = None

    def bias_of(self, attn_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The bias the backend takes for ``attn_mask`` (a mask of this served call's key)."""
        last = self.last  # one read: another thread may replace it meanwhile
        if last is not None and last[0]() is attn_mask and last[1] == attn_mask._version:
            return last[2]
        bias = attn_mask if self.mask_shape is None else attn_mask.view(self.mask_shape)
        if self.keep_mask:
            bias = keep_to_bias(bias, dtype)
        if not attn_mask.requires_grad and not attn_mask.is_inference():
            self.last = (weakref.ref(attn_mask), attn_mask._version, bias)
        return bias


SERVED_MAX = 1024  # call signatures kept per backend name; more (shapes that never repeat) start again


def _attend(
    chooser,
    query,
    key,
    value,
    attn_mask,
    dropout_p,
    is_causal,
    scale,
    enable_gqa,
    return_lse,
    parallel_config,
    record=None,
):
    """The whole way: every check, the mask conversion, the chooser. With ``record``
    ((served, key)), a plain call's _ServedCall is kept there once it has been served."""
    if parallel_config is not None:
        return context_parallel(
            chooser, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, parallel_config
        )
    # a key batch of 1 broadcast over the queries', or key heads repeated (GQA): never kept
    expanded = key.shape[:1] != query.shape[:1] or key.shape[2:3] != query.shape[2:3]
    key, value = check_qkv(query, key, value)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    k, v = expand_kv_heads(q, k, v, enable_gqa)
    bias = mask_to_bias(attn_mask, q, k)
    out = chooser.attention(
        _CALLER,
        q,
        k,
        v,
        bias,
        scale,
        False,
        causal_offset=0 if is_causal else None,
        dropout_p=float(dropout_p),
        return_lse=return_lse,
    )
    if return_lse:
        out, lse = out
        return out.transpose(1, 2), lse.transpose(1, 2)
    resolved = getattr(chooser, "resolved", None)  # a chooser of the protocol alone: never kept
    if record is not None and not expanded and resolved is not None:
        backend = resolved(signature(q, k, v, bias))
        if backend is not None:
            kept, call_key = record
            if len(kept) >= SERVED_MAX:
                kept.clear()
            mask_shape = (
                None if attn_mask is None or bias is None or bias.shape == attn_mask.shape else tuple(bias.shape)
            )
            keep_mask = attn_mask is not None and attn_mask.dtype == torch.bool
            kept[call_key] = _ServedCall(backend, mask_shape, keep_mask, attn_mask is not None and bias is None)
    return out.transpose(1, 2)


_CALLER = Caller(DISPATCH_WHO)


def check_qkv(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
    """key and value for ``query``, or a ValueError before any backend sees (B, S, H, D)
    tensors no attention can take: an input error, never a backend's failure (auto()
    then demotes nothing). A key/value batch of 1 broadcasts over the queries' batch, as
    diffusers' native backend (torch's SDPA) takes it."""
    qs, ks = query.shape, key.shape
    if ks == value.shape and qs[0] == ks[0] and qs[-1] == ks[-1] and len(qs) == 4:
        return key, value  # the common case, in a third of a microsecond
    vs = value.shape
    if len(qs) == len(ks) == len(vs) == 4 and qs[3] == ks[3] and ks[:3] == vs[:3]:
        if ks[0] == qs[0]:
            return key, value
        if ks[0] == 1:
            return key.expand(qs[0], *ks[1:]), value.expand(qs[0], *vs[1:])
    raise ValueError(
        f"dispatch_attention_fn was given query {tuple(qs)}, key {tuple(ks)} and value {tuple(vs)} "
        f"(batch, tokens, heads, head_dim): query and key need the same head_dim and batch (or a key batch of 1), "
        f"and key and value the same batch, tokens and heads. Check the projections and the head split before "
        f"the call"
    )


def is_block_mask(attn_mask: Any) -> bool:
    """Whether attn_mask is a FlexAttention BlockMask (by its type's name: importing
    flex_attention is not needed to ask)."""
    return not isinstance(attn_mask, torch.Tensor) and type(attn_mask).__name__ == "BlockMask"


def _block_masked(
    query, key, value, block_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, parallel, chooser=None
):
    """A call with a FlexAttention BlockMask, computed exactly by attnkit.block_masks (its
    element mask where it has a mask_mod, its block lists where it has none: what
    compiled FlexAttention computes), one query block at a time against the key blocks
    it visits. What that does not implement is refused, naming the argument."""
    given = [
        name
        for name, on in (
            ("dropout_p", dropout_p != 0.0),
            ("is_causal", is_causal),
            ("return_lse", return_lse),
            ("a context-parallel config", parallel is not None),
            ("torch.compile", is_compiling()),
        )
        if on
    ]
    if given:
        raise UnsupportedModule(
            f"attnkit computes a flex-attention BlockMask exactly in eager mode, without {', '.join(given)}; "
            "set diffusers' flex backend on this model for that (attnkit.apply keeps its processor)"
        )
    key, value = check_qkv(query, key, value)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    k, v = expand_kv_heads(q, k, v, enable_gqa)
    note = getattr(chooser, "note_block_mask", None)  # explain() lists it (any chooser may)
    if note is not None:
        note(q, k, v)
    return block_mask_attention(q, k, v, block_mask, scale).transpose(1, 2)


def mask_to_bias(attn_mask: Any, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """diffusers' attn_mask as an additive bias broadcastable to (B, H, M, N), read as
    diffusers' native backend reads it: a 2-D (B, N) mask is key padding; any other
    mask broadcasts to (B, H, M, N) from the right, as torch SDPA broadcasts it; True
    (or 0.0) = attend. Never expanded in memory. None for a mask that hides nothing
    (masks.route_bias)."""
    if attn_mask is None:
        return None
    if not isinstance(attn_mask, torch.Tensor):
        b, _, m, _ = q.shape
        n = k.shape[-2]
        raise ValueError(
            f"attn_mask is a {type(attn_mask).__module__}.{type(attn_mask).__name__}; pass a torch.Tensor of "
            f"shape (batch={b}, keys={n}) or broadcastable to (batch, heads, queries={m}, keys), boolean "
            "(True = attend) or additive float (torch.as_tensor turns a list or a numpy array into one)"
        )
    return route_bias(attn_mask, q.dtype, (*q.shape[:3], k.shape[-2]), key_padding=True)
