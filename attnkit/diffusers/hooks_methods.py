"""The hooks on diffusers' methods: ``set_processor`` of its attention modules,
``set_attn_processor``, ``set_default_attn_processor`` and ``set_attention_backend`` of
its models, and its registry's ``set_active_backend`` (with ``ModelMixin.__call__`` while
an attnkit name is the process-wide backend). Each is a check, an install and the
:class:`~attnkit.diffusers.hooks_base.Hook` that holds them; what each wrapped method
does for attnkit is the handler attnkit's side connects (hooks_base.HANDLER_NAMES).
"""

from __future__ import annotations

import contextlib
import functools
import inspect

from torch import nn

from .hooks_base import (
    _HANDLERS,
    _LOCK,
    IMPORT_PROBLEM,
    PREFIX,
    WRAPPED,
    Hook,
    _ap,
    _handler,
    _needs,
    _replace,
    _restore,
    diffusers_dispatch,
)
from .hooks_registry import check_registry


# set_processor -------------------------------------------------------------------------------------
def _processor_classes() -> list[type]:
    classes: list[type] = [_ap.Attention]
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
    if mixin is None:  # installed only where the check passed
        raise RuntimeError("diffusers.models.attention.AttentionMixin is missing")
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
    seen: set[type] = set()
    todo: list[type] = [model_mixin]
    while todo:
        subclasses: list[type] = todo.pop().__subclasses__()
        for sub in subclasses:
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
    current = diffusers_dispatch._AttentionBackendRegistry.__dict__.get("set_active_backend")
    if not isinstance(current, classmethod) or not inspect.isfunction(current.__func__):
        return "_AttentionBackendRegistry.set_active_backend is not a classmethod"
    return None


def _watching_call(self, *args, **kwargs):
    """ModelMixin.__call__ while an attnkit name is diffusers' process-wide backend."""
    _HANDLERS["first call"](self)
    return nn.Module.__call__(self, *args, **kwargs)


setattr(_watching_call, WRAPPED, True)
setattr(_subclass_hook, WRAPPED, True)
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
    registry = diffusers_dispatch._AttentionBackendRegistry
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


# -- the table of these hooks (attnkit.diffusers.hooks.HOOKS) -------------------------------------
SET_PROCESSOR: Hook = Hook(
    "set_processor",
    "Attention.set_processor, AttentionModuleMixin.set_processor",
    "a module keeps no record of the processor attnkit replaced: a module attnkit cannot compute raises at its "
    "first call instead of running its own processor, and undo() restores the default processor",
    _check_set_processor,
    _install_set_processor,
    lambda: _restore(SET_PROCESSOR._saved),
)
SET_ATTN_PROCESSOR: Hook = Hook(
    "set_attn_processor",
    "AttentionMixin.set_attn_processor",
    "set_attn_processor does not say which modules attnkit keeps on their own processor, and explain() names "
    "modules by class",
    _check_set_attn_processor,
    _install_set_attn_processor,
    lambda: _restore(SET_ATTN_PROCESSOR._saved),
)
SET_DEFAULT: Hook = Hook(
    "set_default_attn_processor",
    "ModelMixin subclasses' set_default_attn_processor, ModelMixin.__init_subclass__",
    "set_default_attn_processor raises on a model whose processors are attnkit's (diffusers accepts only its own)",
    _check_set_default,
    _install_set_default,
    lambda: _restore(SET_DEFAULT._saved),
)
SET_ATTENTION_BACKEND: Hook = Hook(
    "set_attention_backend",
    "ModelMixin.set_attention_backend",
    "set_attention_backend('attnkit') does not say which modules the dispatcher does not reach, and the chooser "
    "is made at the first call",
    _check_set_attention_backend,
    _install_set_attention_backend,
    lambda: _restore(SET_ATTENTION_BACKEND._saved),
)
ACTIVE_BACKEND: Hook = Hook(
    "active backend",
    "_AttentionBackendRegistry.set_active_backend, ModelMixin.__call__ (while an attnkit name is "
    "the process-wide backend)",
    "the attention_backend('attnkit') context does not say which models it does not reach",
    _check_active_backend,
    _install_active_backend,
    _uninstall_active_backend,
)
