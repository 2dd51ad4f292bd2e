"""attnkit as one of diffusers' attention backends: ``set_attention_backend("attnkit")``.

diffusers' transformer processors (Flux, Qwen-Image, Wan, LTX, ...) do their per-model
work (rotary embeddings, joint text+image concatenation, norms) and then call
``dispatch_attention_fn``, which looks a backend function up by name. That call is the
seam: attnkit replaces only the attention, through the same decision as its processors
(auto()'s walk, ``explain()``, ``ATTNKIT_BACKEND``, run-time fallback, the compile-time
choice). Names registered when attnkit is imported:

* ``"attnkit"``: auto() (one chooser for the process);
* ``"attnkit_int8"``: auto(lossy="int8"): the lossy INT8 backend first where it can serve
  a call, under its quality guard (attnkit/choose/guard.py), exact backends elsewhere;
* ``"attnkit_<backend>"`` (``attnkit_sdpa``, ``attnkit_triton``, ...): one named backend,
  refusing what it cannot serve;
* ``"attnkit_<n>"``: made by :func:`member_for` for a processor you pass to
  ``attnkit.apply``, so that its options (``tune``, ``exclude``, ...) hold for that model.

Registering only adds names; nothing about diffusers' own backends or its process-wide
active backend changes. diffusers keeps backends in a private registry that accepts
only members of its ``AttentionBackendName`` enum: :mod:`attnkit.diffusers.hooks` adds
members to that enum and entries to the registry (and takes them out), checked when it
is imported: if diffusers changed them, :data:`PROBLEM` says how (naming the diffusers
version) and every use raises it.

What a registered name runs when diffusers calls it (the backend function, what it
takes and refuses, and the served calls kept for repeated calls) is :mod:`attnkit.diffusers.backend_call`.
"""

from __future__ import annotations

import functools
import itertools
import logging
import weakref
from typing import Any, Callable

from ..choose.auto import AutoChooser
from ..choose.compiling import is_compiling, mark_compile_constant
from ..choose.fixed import FixedChooser
from ..choose.policy import CANDIDATES, default_backend
from ..errors import DiffusersBackendUnavailable
from ..masks import expand_kv_heads
from . import hooks_base, hooks_registry
from .backend_call import (
    _LOCK,
    DISPATCH_WHO,
    HOLDERS,
    KNOWN_ARGS,
    _ChooserHolder,
    _make_chooser,
    attention,
    check_qkv,
    mask_to_bias,
)

logger = logging.getLogger("attnkit")

PREFIX = hooks_base.PREFIX

diffusers_dispatch = hooks_base.diffusers_dispatch
# why diffusers' registry cannot be used on this diffusers, or None
PROBLEM: str | None = hooks_registry.check_registry()


def recheck() -> str | None:
    """Check diffusers' registry again and return :data:`PROBLEM` (checked once, when
    this module is imported): for a process that changed diffusers after importing
    attnkit (tests that stand in for another diffusers)."""
    global PROBLEM
    PROBLEM = hooks_registry.check_registry()
    return PROBLEM


def problem() -> str | None:
    """Why attnkit's names cannot be used in diffusers' registry now (None: they can):
    :data:`PROBLEM`, or the names taken out by ``hooks.uninstall()``."""
    if PROBLEM is not None:
        return PROBLEM
    if not hooks_registry.NAMES.installed:
        return (
            "attnkit's backend names are not in diffusers' registry (taken out by "
            "attnkit.diffusers.hooks.uninstall(); hooks.install() puts them back)"
        )
    return None


def require() -> None:
    """Raise :class:`DiffusersBackendUnavailable` if the registry cannot be used."""
    why = problem()
    if why is not None:
        raise DiffusersBackendUnavailable(why)


class _EveryName(frozenset):
    """diffusers keeps the keyword arguments a backend function declares and drops the
    others silently; registered as attnkit's "supported" names, this keeps them all, so
    that attnkit refuses what it does not implement instead of never seeing it. (A
    Python method: torch.compile traces it; a built-in such as ``bool`` would be faster
    and breaks the graph, "missing sq_contains".)"""

    def __contains__(self, name: object) -> bool:
        return True


_COUNTER = itertools.count(1)


def _register(value: str, chooser_factory: Callable[[], Any] | None, chooser: Any = None):
    """Register ``value`` in diffusers' registry, backed by the chooser the factory makes
    (once, on first use), or by ``chooser``, held weakly: the name is taken out of the
    registry again when that chooser is freed (see :func:`member_for`). Returns the enum
    member."""
    require()
    mark_compile_constant(_make_chooser)  # idempotent
    _sweep()
    with _LOCK:

        def entry():
            holder = HOLDERS[value] = _ChooserHolder(value, chooser_factory, chooser)
            fn = functools.partial(attention, _holder=holder)
            functools.update_wrapper(fn, attention)
            return fn

        member, added = hooks_registry.add_backend(value, entry, _EveryName(KNOWN_ARGS))
        if added and chooser is not None:
            weakref.finalize(chooser, _freed, value)
        return member


# Names whose chooser was freed, taken out of diffusers' registry at the next
# registration or look-up (_sweep), never from the finalizer itself: a garbage collection
# can run in the middle of a torch.compile trace, and a registry changed under it fails
# dynamo's guard on the registry's size ("Guard failed on the same frame it was created").
_FREED: list[str] = []


def _freed(value: str) -> None:
    """A registered chooser was freed: its served calls go now, its name at the next _sweep."""
    holder = HOLDERS.get(value)
    if holder is not None:
        holder.served = {}
    _FREED.append(value)


def _sweep() -> None:
    if is_compiling():  # the registry read by the trace stays as it was
        return
    while _FREED:
        try:
            value = _FREED.pop()
        except IndexError:  # another thread took the last one
            return
        _unregister(value)


def _unregister(value: str) -> None:
    """Take the name of a freed chooser out of diffusers' registry and enum (nothing can
    call it any more: every model that routed to it held the chooser). Left as it is
    while it is diffusers' process-wide backend, whose calls then say what happened."""
    with _LOCK:
        if hooks_registry.remove_backend(value):
            HOLDERS.pop(value, None)


def forget_name(value: str) -> None:
    """``value`` was taken out of diffusers' registry (hooks.uninstall()): its holder and
    the chooser that routed to it are forgotten; the chooser gets a new name if it is
    routed to again."""
    with _LOCK:
        HOLDERS.pop(value, None)
        for chooser, member in list(MEMBERS.items()):
            if member.value == value:
                MEMBERS.pop(chooser, None)


def member_for(processor) -> Any:
    """The backend name that routes dispatch_attention_fn to ``processor``'s chooser (an
    attnkit processor, e.g. ``attnkit.auto(tune=True)``): made once per chooser.

    The registry holds that chooser weakly; what routes to it must hold it (see
    :func:`lease`), and when the chooser is freed its name leaves the registry."""
    chooser = processor.chooser
    with _LOCK:
        member = MEMBERS.get(chooser)
        if member is None:
            member = MEMBERS[chooser] = _register(f"{PREFIX}_{next(_COUNTER)}", None, chooser)
    return member


# chooser -> its registered name (weak keys: a copied or unpickled chooser gets its own)
MEMBERS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


class Lease:
    """What a processor that routes its dispatch_attention_fn calls to a chooser's name
    holds, so that the chooser lives as long as the processor: the registry does not hold
    it. A copied model shares the chooser (``copy.deepcopy``), and a pickled one saves
    nothing (it loads as the stock model)."""

    __slots__ = ("chooser", "__weakref__")

    def __init__(self, chooser) -> None:
        self.chooser = chooser

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        return type(None), ()


def prepare(name: str) -> None:
    """Make the chooser behind attnkit's backend ``name`` now (set_attention_backend
    calls it), so that torch.compile never meets its lazy creation while tracing."""
    if problem() is not None:
        return
    member = diffusers_dispatch.AttentionBackendName._value2member_map_.get(name)
    fn = diffusers_dispatch._AttentionBackendRegistry._backends.get(member) if member is not None else None
    holder = getattr(fn, "keywords", {}).get("_holder")
    if holder is not None:
        holder.get()


def registered_names() -> list[str]:
    """Every attnkit name in diffusers' registry."""
    _sweep()
    return hooks_registry.attnkit_names()


def _register_defaults() -> None:
    _register(PREFIX, AutoChooser)
    # auto() with the lossy int8 backend first, under its quality guard (opt-in only)
    _register(f"{PREFIX}_int8", functools.partial(AutoChooser, lossy="int8"))
    for label in CANDIDATES:
        _register(f"{PREFIX}_{label}", functools.partial(_fixed, label))


def _fixed(label):
    backend = default_backend(label)
    if isinstance(backend, Exception):
        raise DiffusersBackendUnavailable(f"attnkit backend {label!r} could not be loaded: {backend}") from backend
    return FixedChooser(backend)


def register_defaults() -> None:
    """Register "attnkit" and "attnkit_<backend>" in diffusers' registry (the hook of the
    backend names, :mod:`attnkit.diffusers.hooks`, calls it when it is installed:
    registering is a change to diffusers, never a side effect of an import)."""
    if PROBLEM is None:
        _register_defaults()


__all__ = [
    "DISPATCH_WHO",
    "PROBLEM",
    "recheck",
    "DiffusersBackendUnavailable",
    "Lease",
    "attention",
    "check_qkv",
    "expand_kv_heads",
    "mask_to_bias",
    "member_for",
    "problem",
    "registered_names",
    "require",
]
