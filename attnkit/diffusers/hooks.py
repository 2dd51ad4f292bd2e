"""Every change attnkit makes to diffusers, gathered in one module.

attnkit changes diffusers' own classes and tables in the few places below, and nowhere
else (``tests/diffusers/test_hooks.py`` compares diffusers' classes, module globals, enum
and registry, in a fresh interpreter, before and after attnkit). Each is a :class:`Hook`: checked against the installed diffusers before it is
installed (a hook whose target is missing or changed is not installed, and one warning
says which, on which diffusers version, and what works without it), installed by
``import attnkit`` (:func:`install`, idempotent) and taken out by :func:`uninstall`.

The hooks (:data:`HOOKS`; the table in docs/models.md, "What attnkit changes in
diffusers"): attnkit's backend names in diffusers' enum and registry; ``set_processor``
of diffusers' attention modules; ``set_attn_processor``, ``set_default_attn_processor``
and ``set_attention_backend`` of its models; and its registry's ``set_active_backend``,
with ``ModelMixin.__call__`` while an attnkit name is the process-wide backend. One more
is installed on demand (:data:`ON_DEMAND`), by the attnkit function that needs it, not by
``import attnkit``: context parallelism over gloo (``hooks_parallel``), by
``attnkit.diffusers.context_parallel.enable_parallelism``.

Each hook is written in one of the modules this one gathers: ``hooks_base`` (the Hook
class, and what every hook shares), ``hooks_methods`` (the hooks on diffusers' methods)
``hooks_registry`` (the backend names) and ``hooks_parallel`` (context parallelism over
gloo). Like this module, they import nothing of
attnkit but each other: what changes diffusers sits below what it calls.

What a served model holds (its processors, the methods ``attnkit.apply`` sets on its
modules, the module globals the sdpa and flex routes add for a chooser, removed with the
chooser)
belongs to that model: ``undo()`` takes it out, and :func:`uninstall` leaves served
models as they are.

:func:`uninstall` takes every hook out: diffusers' own functions are put back, and
attnkit's backend names leave the registry, except a name still in use (diffusers'
process-wide backend, or named by a live processor's ``set_attention_backend``), which
stays, and is said so in what it returns.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from .hooks_base import _LOCK, IMPORT_PROBLEM, PREFIX, TESTED, Hook, connect, diffusers_version
from .hooks_methods import (
    ACTIVE_BACKEND,
    SET_ATTENTION_BACKEND,
    SET_ATTN_PROCESSOR,
    SET_DEFAULT,
    SET_PROCESSOR,
    watching,
)
from .hooks_parallel import GLOO
from .hooks_registry import _STAYED, NAMES, add_backend, attnkit_names, check_registry, in_use, remove_backend

logger = logging.getLogger("attnkit")


# the sdpa and flex routes: a module global per chooser ---------------------------------------------
def set_global(namespace: dict, name: str, value: Any, owner: Any = None) -> None:
    """``namespace[name] = value`` in a diffusers module's globals: the sdpa route's rebound
    code reads its attention there (attnkit.diffusers.routes), the flex route's its
    dispatch_attention_fn (attnkit.diffusers.flex). With ``owner`` (the
    chooser), the name leaves the module when the owner is freed. Not a hook: it belongs
    to the models that chooser serves, and goes with it."""
    namespace[name] = value
    if owner is not None:
        weakref.finalize(owner, namespace.pop, name, None)


# -- the table ---------------------------------------------------------------------------------------
HOOKS: tuple[Hook, ...] = (NAMES, SET_PROCESSOR, SET_ATTN_PROCESSOR, SET_DEFAULT, SET_ATTENTION_BACKEND, ACTIVE_BACKEND)
# installed by what needs them (each says which), not by install(); uninstall() takes them out too
ON_DEMAND: tuple[Hook, ...] = (GLOO,)


def install() -> list[Hook]:
    """Install every hook that diffusers allows (idempotent), and the on-demand hooks
    that were asked for (install_on_demand) before an uninstall(); one warning names the
    hooks it could not install, with why and what works without them. Returns those."""
    missing = [hook for hook in HOOKS if not hook.install()]
    missing += [hook for hook in ON_DEMAND if hook.wanted and not hook.install()]
    if missing and IMPORT_PROBLEM is None:
        logger.warning(
            "attnkit: diffusers %s: %d of attnkit's %d changes to diffusers could not be installed, and attnkit works "
            "without them: %s. attnkit was tested with diffusers %s",
            diffusers_version(),
            len(missing),
            len(HOOKS),
            "; ".join(f"{h.name} ({h.problem}): {h.without}" for h in missing),
            TESTED,
        )
    return missing


def install_on_demand(hook: Hook) -> bool:
    """Install an on-demand hook (one of :data:`ON_DEMAND`) for the call that needs it;
    from then on install() puts it back after an uninstall(). False: diffusers does not
    allow it (``hook.problem`` says why)."""
    with _LOCK:
        hook.wanted = True
        return hook.install()


def uninstall() -> list[tuple[str, str]]:
    """Take every hook out of diffusers: its own functions are back, and attnkit's backend
    names leave the registry except those still in use. Models attnkit serves keep their
    processors (``undo()`` takes them out). Returns the names that stayed, with why.
    :func:`install` puts everything back."""
    with _LOCK:
        for hook in reversed(HOOKS + ON_DEMAND):
            hook.uninstall()
        return list(_STAYED)


def status() -> list[dict[str, Any]]:
    """Each hook: name, where, installed, problem, on_demand (``attnkit info`` prints it)."""
    return [
        {"name": h.name, "where": h.where, "installed": h.installed, "problem": h.problem, "on_demand": h in ON_DEMAND}
        for h in HOOKS + ON_DEMAND
    ]


__all__ = [
    "GLOO",
    "HOOKS",
    "Hook",
    "ON_DEMAND",
    "PREFIX",
    "add_backend",
    "attnkit_names",
    "check_registry",
    "connect",
    "in_use",
    "install",
    "install_on_demand",
    "remove_backend",
    "set_global",
    "status",
    "uninstall",
    "watching",
]
