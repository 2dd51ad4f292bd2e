"""Every change attnkit makes to diffusers, in one module.

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
with ``ModelMixin.__call__`` while an attnkit name is the process-wide backend.

What a served model holds (its processors, the methods ``attnkit.apply`` sets on its
modules, the module global the sdpa route adds for a chooser, removed with the chooser)
belongs to that model: ``undo()`` takes it out, and :func:`uninstall` leaves served
models as they are.

:func:`uninstall` takes every hook out: diffusers' own functions are put back, and
attnkit's backend names leave the registry, except a name still in use (diffusers'
process-wide backend, or named by a live processor's ``set_attention_backend``), which
stays, and is said so in what it returns.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import gc
import inspect
import logging
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn

logger = logging.getLogger("attnkit")

PREFIX = "attnkit"
WRAPPED = "_attnkit_wrapped"  # set on every function attnkit puts in diffusers' place
# The diffusers releases attnkit's registry hook was written for; any other is checked by
# what it has (check_registry), not by its number.
TESTED = "0.35 to 0.42"

try:
    import diffusers
    from diffusers.models import attention_dispatch as _dispatch
    from diffusers.models import attention_processor as _ap
except Exception as exc:  # diffusers missing or broken: every hook says so at first use
    diffusers = _dispatch = _ap = None
    IMPORT_PROBLEM: str | None = f"diffusers could not be imported ({type(exc).__name__}: {exc})"
else:
    IMPORT_PROBLEM = None

_LOCK = threading.RLock()


def diffusers_version() -> str:
    return getattr(diffusers, "__version__", "?")


# -- what the hooks call: attnkit's side, connected by attnkit.diffusers.wrappers ----------------------
# hooks.py imports nothing of attnkit (what changes diffusers sits below what it calls):
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


# set_processor -------------------------------------------------------------------------------------
def _processor_classes() -> list[type]:
    classes = [_ap.Attention]
    with contextlib.suppress(ImportError):
        from diffusers.models.attention import AttentionModuleMixin

        classes.append(AttentionModuleMixin)
    return classes


def _check_set_processor() -> str | None:
    problems = [
        p
        for cls in _processor_classes()
        if (p := _needs(cls, "set_processor", ("self", "processor"), f"{cls.__name__}.set_processor"))
    ]
    return "; ".join(problems) or None


def _install_set_processor() -> None:
    around = _handler("set_processor")
    for cls in _processor_classes():
        original = cls.__dict__["set_processor"]
        if getattr(original, WRAPPED, False):
            continue

        def make(original):
            @functools.wraps(original)
            def set_processor(self, processor, *args, **kwargs):
                return around(original, self, processor, *args, **kwargs)

            setattr(set_processor, WRAPPED, True)
            return set_processor

        _replace(cls, "set_processor", make(original), SET_PROCESSOR._saved)


# set_attn_processor --------------------------------------------------------------------------------
def _attention_mixin() -> type | None:
    try:
        from diffusers.models.attention import AttentionMixin
    except ImportError:
        return None
    return AttentionMixin


def _check_set_attn_processor() -> str | None:
    mixin = _attention_mixin()
    if mixin is None:
        return "diffusers.models.attention.AttentionMixin is missing"
    return _needs(mixin, "set_attn_processor", ("self", "processor"), "AttentionMixin.set_attn_processor")


def _install_set_attn_processor() -> None:
    around = _handler("set_attn_processor")
    mixin = _attention_mixin()
    original = mixin.__dict__["set_attn_processor"]

    @functools.wraps(original)
    def set_attn_processor(self, processor, *args, **kwargs):
        return around(original, self, processor, *args, **kwargs)

    setattr(set_attn_processor, WRAPPED, True)
    _replace(mixin, "set_attn_processor", set_attn_processor, SET_ATTN_PROCESSOR._saved)


# set_default_attn_processor ------------------------------------------------------------------------
def _model_mixin() -> type:
    from diffusers import ModelMixin

    return ModelMixin


def _check_set_default() -> str | None:
    model_mixin = _model_mixin()
    if not isinstance(model_mixin.__dict__.get("__init_subclass__", None), (type(None), classmethod)):
        return "ModelMixin.__init_subclass__ is not a classmethod"
    return None


def _wrap_default(cls: type) -> None:
    around = _handler("set_default_attn_processor")
    original = cls.__dict__.get("set_default_attn_processor")
    if not inspect.isfunction(original) or getattr(original, WRAPPED, False):
        return

    @functools.wraps(original)
    def set_default_attn_processor(self, *args, **kwargs):
        return around(original, self, *args, **kwargs)

    setattr(set_default_attn_processor, WRAPPED, True)
    _replace(cls, "set_default_attn_processor", set_default_attn_processor, SET_DEFAULT._saved)


def _subclass_hook(cls, **kwargs):
    """ModelMixin.__init_subclass__ while attnkit's hooks are installed: wraps the
    set_default_attn_processor of model classes defined later (diffusers imports its model
    modules lazily)."""
    own = _OWN_INIT_SUBCLASS[0] if _OWN_INIT_SUBCLASS else None
    if own is not None:  # ModelMixin's own, where a diffusers has one
        own.__func__(cls, **kwargs)
    else:
        super(_model_mixin(), cls).__init_subclass__(**kwargs)
    with _LOCK:
        if SET_DEFAULT.installed:
            _wrap_default(cls)


def _install_set_default() -> None:
    model_mixin = _model_mixin()
    seen, todo = set(), [model_mixin]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                _wrap_default(sub)
                todo.append(sub)
    _OWN_INIT_SUBCLASS[:] = [model_mixin.__dict__.get("__init_subclass__")]
    _replace(model_mixin, "__init_subclass__", classmethod(_subclass_hook), SET_DEFAULT._saved)


_OWN_INIT_SUBCLASS: list = []  # ModelMixin's own __init_subclass__ (a classmethod) or None, while hooked


# set_attention_backend -----------------------------------------------------------------------------
def _check_set_attention_backend() -> str | None:
    return _needs(_model_mixin(), "set_attention_backend", ("self", "backend"), "ModelMixin.set_attention_backend")


def _install_set_attention_backend() -> None:
    after = _handler("set_attention_backend")
    model_mixin = _model_mixin()
    original = model_mixin.__dict__["set_attention_backend"]

    @functools.wraps(original)
    def set_attention_backend(self, backend, *args, **kwargs):
        result = original(self, backend, *args, **kwargs)
        after(self, backend)
        return result

    setattr(set_attention_backend, WRAPPED, True)
    _replace(model_mixin, "set_attention_backend", set_attention_backend, SET_ATTENTION_BACKEND._saved)


# the process-wide backend: set_active_backend, and ModelMixin.__call__ while it is attnkit's -------
def _check_active_backend() -> str | None:
    problem = check_registry()
    if problem is not None:
        return problem
    current = _dispatch._AttentionBackendRegistry.__dict__.get("set_active_backend")
    if not isinstance(current, classmethod) or not inspect.isfunction(current.__func__):
        return "_AttentionBackendRegistry.set_active_backend is not a classmethod"
    return None


def _watching_call(self, *args, **kwargs):
    """ModelMixin.__call__ while an attnkit name is diffusers' process-wide backend."""
    _HANDLERS["first call"](self)
    return nn.Module.__call__(self, *args, **kwargs)


_CALL_SAVED: list = []  # ModelMixin.__call__'s own entry while _watching_call is in its place


def _watch_calls(ours: bool) -> None:
    model_mixin = _model_mixin()
    with _LOCK:
        installed = model_mixin.__dict__.get("__call__") is _watching_call
        if ours and not installed and ACTIVE_BACKEND.installed:
            _replace(model_mixin, "__call__", _watching_call, _CALL_SAVED)
        elif not ours and installed:
            _restore(_CALL_SAVED)


def watching() -> bool:
    """Whether the first calls of models are being looked at now (an attnkit name is
    diffusers' process-wide backend)."""
    return IMPORT_PROBLEM is None and _model_mixin().__dict__.get("__call__") is _watching_call


def _install_active_backend() -> None:
    registry = _dispatch._AttentionBackendRegistry
    original = registry.__dict__["set_active_backend"].__func__

    @functools.wraps(original)
    def set_active_backend(cls, backend, *args, **kwargs):
        result = original(cls, backend, *args, **kwargs)
        _watch_calls(str(getattr(backend, "value", backend)).lower().startswith(PREFIX))
        return result

    setattr(set_active_backend, WRAPPED, True)
    _replace(registry, "set_active_backend", classmethod(set_active_backend), ACTIVE_BACKEND._saved)
    active = getattr(registry, "_active_backend", None)
    _watch_calls(str(getattr(active, "value", active)).lower().startswith(PREFIX))


def _uninstall_active_backend() -> None:
    _watch_calls(False)
    _restore(ACTIVE_BACKEND._saved)


# backend names: the enum's members and the registry's entries --------------------------------------
def check_registry() -> str | None:
    """What attnkit relies on in diffusers' private registry, or what changed (None: all there)."""
    if IMPORT_PROBLEM is not None:
        return IMPORT_PROBLEM
    names = getattr(_dispatch, "AttentionBackendName", None)
    registry = getattr(_dispatch, "_AttentionBackendRegistry", None)
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
    dispatch = getattr(_dispatch, "dispatch_attention_fn", None)
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
        names = _dispatch.AttentionBackendName
        member = names._value2member_map_.get(value)
        if member is None:
            member = str.__new__(names, value)
            member._name_ = value.upper()
            member._value_ = value
            member.__objclass__ = names
            member.__reduce_ex__ = _pickled_as_default
            names._member_map_[member._name_] = member
            names._value2member_map_[value] = member
            names._member_names_.append(member._name_)
        registry = _dispatch._AttentionBackendRegistry
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
    if _dispatch is None:
        return None
    member = _dispatch.AttentionBackendName._value2member_map_.get(value)
    if member is None:
        return None
    if getattr(_dispatch._AttentionBackendRegistry, "_active_backend", None) is member:
        return "diffusers' process-wide backend"
    for holder in gc.get_referrers(member):
        if isinstance(holder, dict) and holder.get("_attention_backend") is member:
            return "a processor's backend (set_attention_backend)"
    return None


def remove_backend(value: str, keep_active: bool = True) -> bool:
    """Take the attnkit name ``value`` out of diffusers' registry and enum; with
    ``keep_active``, not while it is diffusers' process-wide backend. Returns whether it
    was taken out."""
    if _dispatch is None:
        return False
    with _LOCK:
        names = _dispatch.AttentionBackendName
        registry = _dispatch._AttentionBackendRegistry
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
    if _dispatch is None or check_registry() is not None:
        return []
    return [m.value for m in list(_dispatch._AttentionBackendRegistry._backends) if str(m.value).startswith(PREFIX)]


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


# the sdpa route: a module global per chooser -------------------------------------------------------
def set_global(namespace: dict, name: str, value: Any, owner: Any = None) -> None:
    """``namespace[name] = value`` in a diffusers module's globals: the sdpa route's rebound
    code reads its attention there (attnkit.diffusers.routes). With ``owner`` (the
    chooser), the name leaves the module when the owner is freed. Not a hook: it belongs
    to the models that chooser serves, and goes with it."""
    namespace[name] = value
    if owner is not None:
        weakref.finalize(owner, namespace.pop, name, None)


# -- the table ---------------------------------------------------------------------------------------
SET_PROCESSOR = Hook(
    "set_processor",
    "Attention.set_processor, AttentionModuleMixin.set_processor",
    "a module keeps no record of the processor attnkit replaced: a module attnkit cannot compute raises at its "
    "first call instead of running its own processor, and undo() restores the default processor",
    _check_set_processor,
    _install_set_processor,
    lambda: _restore(SET_PROCESSOR._saved),
)
SET_ATTN_PROCESSOR = Hook(
    "set_attn_processor",
    "AttentionMixin.set_attn_processor",
    "set_attn_processor does not say which modules attnkit keeps on their own processor, and explain() names "
    "modules by class",
    _check_set_attn_processor,
    _install_set_attn_processor,
    lambda: _restore(SET_ATTN_PROCESSOR._saved),
)
SET_DEFAULT = Hook(
    "set_default_attn_processor",
    "ModelMixin subclasses' set_default_attn_processor, ModelMixin.__init_subclass__",
    "set_default_attn_processor raises on a model whose processors are attnkit's (diffusers accepts only its own)",
    _check_set_default,
    _install_set_default,
    lambda: _restore(SET_DEFAULT._saved),
)
SET_ATTENTION_BACKEND = Hook(
    "set_attention_backend",
    "ModelMixin.set_attention_backend",
    "set_attention_backend('attnkit') does not say which modules the dispatcher does not reach, and the chooser "
    "is made at the first call",
    _check_set_attention_backend,
    _install_set_attention_backend,
    lambda: _restore(SET_ATTENTION_BACKEND._saved),
)
ACTIVE_BACKEND = Hook(
    "active backend",
    "_AttentionBackendRegistry.set_active_backend, ModelMixin.__call__ (while an attnkit name is "
    "the process-wide backend)",
    "the attention_backend('attnkit') context does not say which models it does not reach",
    _check_active_backend,
    _install_active_backend,
    _uninstall_active_backend,
)
NAMES = Hook(
    "backend names",
    "AttentionBackendName members, _AttentionBackendRegistry entries",
    "set_attention_backend('attnkit') and attention_backend('attnkit') are unknown to diffusers, and modules "
    "that call dispatch_attention_fn are kept on their own processor by attnkit's processors",
    check_registry,
    _install_names,
    _uninstall_names,
)

HOOKS: tuple[Hook, ...] = (NAMES, SET_PROCESSOR, SET_ATTN_PROCESSOR, SET_DEFAULT, SET_ATTENTION_BACKEND, ACTIVE_BACKEND)


def install() -> list[Hook]:
    """Install every hook that diffusers allows (idempotent); one warning names those it
    does not, with why and what works without them. Returns the hooks not installed."""
    missing = [hook for hook in HOOKS if not hook.install()]
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


def uninstall() -> list[tuple[str, str]]:
    """Take every hook out of diffusers: its own functions are back, and attnkit's backend
    names leave the registry except those still in use. Models attnkit serves keep their
    processors (``undo()`` takes them out). Returns the names that stayed, with why.
    :func:`install` puts everything back."""
    with _LOCK:
        for hook in reversed(HOOKS):
            hook.uninstall()
        return list(_STAYED)


def status() -> list[dict[str, Any]]:
    """Each hook: name, where, installed, problem (``attnkit info`` prints it)."""
    return [{"name": h.name, "where": h.where, "installed": h.installed, "problem": h.problem} for h in HOOKS]


__all__ = [
    "HOOKS",
    "Hook",
    "PREFIX",
    "add_backend",
    "attnkit_names",
    "check_registry",
    "connect",
    "in_use",
    "install",
    "remove_backend",
    "set_global",
    "status",
    "uninstall",
    "watching",
]
