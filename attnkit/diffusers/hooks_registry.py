"""The hook of attnkit's backend names: members of diffusers' ``AttentionBackendName``
enum and entries of its private ``_AttentionBackendRegistry``, added and taken out here
and nowhere else (:func:`check_registry` says first whether that registry is still the
one attnkit was written for).
"""

from __future__ import annotations

import contextlib
import enum
import gc
import inspect
from typing import Any, Callable

from .hooks_base import _LOCK, IMPORT_PROBLEM, PREFIX, TESTED, Hook, _handler, diffusers_dispatch, diffusers_version


# backend names: the enum's members and the registry's entries --------------------------------------
def check_registry() -> str | None:
    """What attnkit relies on in diffusers' private registry, or what changed (None: all there)."""
    if IMPORT_PROBLEM is not None:
        return IMPORT_PROBLEM
    names = getattr(diffusers_dispatch, "AttentionBackendName", None)
    registry = getattr(diffusers_dispatch, "_AttentionBackendRegistry", None)
    missing = []
    if not (isinstance(names, type) and issubclass(names, enum.Enum) and issubclass(names, str)):
        missing.append("AttentionBackendName (a str Enum)")
    else:
        for attr in ("_member_map_", "_value2member_map_", "_member_names_"):
            if not hasattr(names, attr):
                missing.append(f"AttentionBackendName.{attr}")
    if registry is None:
        missing.append("_AttentionBackendRegistry")
    else:
        for attr, kind in (("_backends", dict), ("_constraints", dict), ("_supported_arg_names", dict)):
            if not isinstance(getattr(registry, attr, None), kind):
                missing.append(f"_AttentionBackendRegistry.{attr} ({kind.__name__})")
    dispatch = getattr(diffusers_dispatch, "dispatch_attention_fn", None)
    if dispatch is None:
        missing.append("dispatch_attention_fn")
    else:
        params = inspect.signature(dispatch).parameters
        for arg in ("query", "key", "value", "attn_mask", "backend"):
            if arg not in params:
                missing.append(f"dispatch_attention_fn({arg}=...)")
    if missing:
        return (
            f"diffusers {diffusers_version()} changed the attention registry attnkit plugs into "
            f"(missing or different: {', '.join(missing)}); attnkit's diffusers backend needs a "
            f"diffusers release from {TESTED} (processors still work with any diffusers)"
        )
    return None


def _pickled_as_default(protocol):
    return type(None), ()


def add_backend(value: str, make_entry: Callable[[], Callable], supported: frozenset) -> tuple[Any, bool]:
    """(the AttentionBackendName member ``value``, whether its registry entry was added
    now): the member is added to the enum if it is not there, and ``make_entry()`` made
    its registry entry if it has none. A member is pickled as None (diffusers' "the
    process-wide backend"): a model saved with an attnkit name loads without attnkit, as
    the stock model."""
    with _LOCK:
        if not NAMES.installed:
            why = NAMES.problem or "taken out by attnkit.diffusers.hooks.uninstall()"
            raise RuntimeError(
                f"attnkit's backend names are not installed in diffusers ({why}); "
                "attnkit.diffusers.hooks.install() puts them back"
            )
        names = diffusers_dispatch.AttentionBackendName
        member = names._value2member_map_.get(value)
        if member is None:
            member = str.__new__(names, value)
            member._name_ = value.upper()
            member._value_ = value
            setattr(member, "__objclass__", names)  # what Enum gives its own members
            setattr(member, "__reduce_ex__", _pickled_as_default)
            names._member_map_[member._name_] = member
            names._value2member_map_[value] = member
            names._member_names_.append(member._name_)
        registry = diffusers_dispatch._AttentionBackendRegistry
        if member in registry._backends:
            return member, False
        registry._backends[member] = make_entry()
        registry._constraints[member] = []
        registry._supported_arg_names[member] = supported
        cp = getattr(registry, "_supports_context_parallel", None)  # diffusers >= 0.36
        if isinstance(cp, set):
            cp.add(member.value)
        return member, True


def in_use(value: str) -> str | None:
    """Why the attnkit name ``value`` must stay in diffusers' registry (None: it may go):
    it is the process-wide backend, or a live processor names it."""
    if diffusers_dispatch is None:
        return None
    member = diffusers_dispatch.AttentionBackendName._value2member_map_.get(value)
    if member is None:
        return None
    if getattr(diffusers_dispatch._AttentionBackendRegistry, "_active_backend", None) is member:
        return "diffusers' process-wide backend"
    for holder in gc.get_referrers(member):
        if isinstance(holder, dict) and holder.get("_attention_backend") is member:
            return "a processor's backend (set_attention_backend)"
        if isinstance(holder, dict) and holder.get("_attnkit_flex_backend") is member:
            return "a processor's flex calls (attnkit's flex route)"
    return None


def remove_backend(value: str, keep_active: bool = True) -> bool:
    """Take the attnkit name ``value`` out of diffusers' registry and enum; with
    ``keep_active``, not while it is diffusers' process-wide backend. Returns whether it
    was taken out."""
    if diffusers_dispatch is None:
        return False
    with _LOCK:
        names = diffusers_dispatch.AttentionBackendName
        registry = diffusers_dispatch._AttentionBackendRegistry
        member = names._value2member_map_.get(value)
        if member is None:
            return False
        if keep_active and getattr(registry, "_active_backend", None) is member:
            return False
        for table in (registry._backends, registry._constraints, registry._supported_arg_names):
            table.pop(member, None)
        cp = getattr(registry, "_supports_context_parallel", None)
        if isinstance(cp, set):
            cp.discard(value)
        names._value2member_map_.pop(value, None)
        names._member_map_.pop(member._name_, None)
        with contextlib.suppress(ValueError):
            names._member_names_.remove(member._name_)
        return True


def attnkit_names() -> list[str]:
    """Every attnkit name in diffusers' registry."""
    if diffusers_dispatch is None or check_registry() is not None:
        return []
    return [
        m.value for m in list(diffusers_dispatch._AttentionBackendRegistry._backends) if str(m.value).startswith(PREFIX)
    ]


_STAYED: list[tuple[str, str]] = []  # (name, why) the last uninstall() left in the registry


def _install_names() -> None:
    NAMES.installed = True  # add_backend checks it
    _handler("register names")()


def _uninstall_names() -> None:
    forget = _handler("forget name")
    _STAYED.clear()
    for value in attnkit_names():
        why = in_use(value)
        if why is not None:
            _STAYED.append((value, why))
        elif remove_backend(value):
            forget(value)


NAMES = Hook(
    "backend names",
    "AttentionBackendName members, _AttentionBackendRegistry entries",
    "set_attention_backend('attnkit') and attention_backend('attnkit') are unknown to diffusers, and modules "
    "that call dispatch_attention_fn are kept on their own processor by attnkit's processors",
    check_registry,
    _install_names,
    _uninstall_names,
)
