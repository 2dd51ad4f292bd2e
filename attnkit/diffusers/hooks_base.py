"""What every hook of :mod:`attnkit.diffusers.hooks` shares: diffusers' modules (or why
they could not be imported), the lock, the handlers attnkit's side connects, the
:class:`Hook` class, and how a hook puts a function in a class's place and back.

Like hooks.py, the hooks_* modules import nothing of attnkit but each other: what
changes diffusers sits below what it calls (the handlers, connected at import).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

PREFIX = "attnkit"
WRAPPED = "_attnkit_wrapped"  # set on every function attnkit puts in diffusers' place
# The diffusers releases attnkit's registry hook was written for; any other is checked by
# what it has (check_registry), not by its number.
TESTED = "0.35 to 0.42"

try:
    import diffusers
    from diffusers.models import attention_dispatch as diffusers_dispatch
    from diffusers.models import attention_processor as _ap
except Exception as exc:  # diffusers missing or broken: every hook says so at first use
    diffusers = diffusers_dispatch = _ap = None  # type: ignore[assignment]  # the optional import's idiom
    IMPORT_PROBLEM: str | None = f"diffusers could not be imported ({type(exc).__name__}: {exc})"
else:
    IMPORT_PROBLEM = None

_LOCK = threading.RLock()


def diffusers_version() -> str:
    return getattr(diffusers, "__version__", "?")


# -- what the hooks call: attnkit's side, connected by attnkit.diffusers.wrappers ----------------------
# the hooks modules import nothing of attnkit (what changes diffusers sits below what it calls):
#   "set_processor"(original, module, processor, ...)       Attention.set_processor, around diffusers'
#   "set_attn_processor"(original, model, processor, ...)   AttentionMixin.set_attn_processor, around
#   "set_default_attn_processor"(original, model, ...)      around each model class's own
#   "set_attention_backend"(model, backend)                 after diffusers' ModelMixin.set_attention_backend
#   "first call"(model)                                      a model called while an attnkit name is process-wide
#   "register names"()                                       attnkit's default names, when NAMES is installed
#   "forget name"(value)                                     a name uninstall() took out of the registry
HANDLER_NAMES = (
    "set_processor",
    "set_attn_processor",
    "set_default_attn_processor",
    "set_attention_backend",
    "first call",
    "register names",
    "forget name",
)
# HANDLER_NAMES -> what attnkit's side connected (one each)
_HANDLERS: dict[str, Callable] = {}


def connect(**handlers: Callable) -> None:
    """Give the hooks attnkit's side (keywords: HANDLER_NAMES with ``_`` for spaces)."""
    for key, fn in handlers.items():
        name = key.replace("_", " ") if key in ("first_call", "register_names", "forget_name") else key
        if name not in HANDLER_NAMES:
            raise TypeError(f"hooks.connect({key}=...): not one of {', '.join(HANDLER_NAMES)}")
        _HANDLERS[name] = fn


def _handler(name: str) -> Callable:
    return _HANDLERS[name]


# -- the hooks -------------------------------------------------------------------------------------
@dataclass
class Hook:
    """One change to diffusers: ``install()`` and ``uninstall()`` are idempotent;
    ``check()`` says why it cannot be installed on this diffusers (None: it can)."""

    name: str
    where: str  # the diffusers names it changes
    without: str  # what does not happen when it is not installed
    _check: Callable[[], str | None]
    _install: Callable[[], None]
    _uninstall: Callable[[], None]
    installed: bool = False
    problem: str | None = None
    wanted: bool = False  # an on-demand hook (hooks.ON_DEMAND) asked for: install() puts it back too
    _saved: list = field(default_factory=list)

    def check(self) -> str | None:
        if IMPORT_PROBLEM is not None:
            return IMPORT_PROBLEM
        missing = [name for name in HANDLER_NAMES if name not in _HANDLERS]
        if missing:  # attnkit's own fault: import attnkit connects them
            raise RuntimeError(
                f"attnkit.diffusers.hooks: no handler for {', '.join(missing)} "
                "(import attnkit.diffusers.wrappers first)"
            )
        return self._check()

    def install(self) -> bool:
        with _LOCK:
            if self.installed:
                return True
            self.problem = self.check()
            if self.problem is not None:
                return False
            try:
                self._install()
            except Exception as exc:  # noqa: BLE001  (a diffusers the checks did not foresee: as it was)
                self._uninstall()
                self.problem = f"installing it failed ({type(exc).__name__}: {exc})"
                return False
            self.installed = True
            return True

    def uninstall(self) -> None:
        with _LOCK:
            if self.installed:
                self._uninstall()
                self.installed = False


def _replace(owner: type, attr: str, new: Any, saved: list) -> None:
    """``owner.attr = new``, the class's own entry (or its absence) kept in ``saved``."""
    saved.append((owner, attr, owner.__dict__.get(attr, _ABSENT)))
    setattr(owner, attr, new)


_ABSENT = object()


def _restore(saved: list) -> None:
    while saved:
        owner, attr, old = saved.pop()
        if old is _ABSENT:
            with contextlib.suppress(AttributeError):
                delattr(owner, attr)
        else:
            setattr(owner, attr, old)


def _function_of(owner: Any, attr: str) -> Callable | None:
    fn = owner.__dict__.get(attr) if owner is not None else None
    return fn if inspect.isfunction(fn) else None


def _needs(owner: Any, attr: str, params: tuple[str, ...], label: str) -> str | None:
    fn = _function_of(owner, attr)
    if fn is None:
        return f"{label} is missing or not a plain function"
    have = inspect.signature(fn).parameters
    missing = [p for p in params if p not in have]
    return f"{label} takes no {', '.join(missing)}" if missing else None
