"""What attnkit adds to diffusers' model-level entry points, so that each of them says what
it does and what it does not reach:

* ``set_attn_processor`` (diffusers' ``AttentionMixin``), given an attnkit processor:
  every attention module it reaches is given its name in the model (for logs and
  errors), the routes are kept for ``processor.explain()``, and the modules attnkit keeps
  on their own processor (linear attention, a flex mask, weights of their own) are said
  in one warning for the model;
* ``set_attention_backend("attnkit...")``: the chooser is made there (torch.compile
  never meets its lazy creation) and a model the dispatcher does not wholly reach is
  told so, once;
* ``with attention_backend("attnkit..."):`` (and any process-wide attnkit backend): the
  first call of each model run meanwhile is looked at, and a model the dispatcher does
  not wholly reach gets the same warning, once. Only while the process-wide backend is
  one of attnkit's: diffusers' ``ModelMixin.__call__`` is attnkit's for that time, and
  is taken away when another backend is set (the context's exit).

:func:`install` wraps them once (``import attnkit``); the registry itself is
:mod:`attnkit.diffusers.backend`'s, ``set_processor`` :mod:`attnkit.diffusers.binding`'s.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from typing import Any

from torch import nn

from .._text import describe_module
from ..choose._compile import is_compiling
from . import backend as diffusers_backend
from . import binding
from .apply import Applied, plan, remember
from .routes import METHODS

logger = logging.getLogger("attnkit")

_WARNED: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()  # models told what the dispatcher misses
_LOCK = threading.RLock()


# -- set_attn_processor(attnkit processor) -----------------------------------------------------
def _attnkit_processors(processor: Any) -> list:
    given = processor.values() if isinstance(processor, dict) else (processor,)
    out = []
    for proc in given:
        if getattr(type(proc), "_attnkit_processor", False) and all(p is not proc for p in out):
            out.append(proc)
    return out


def _wrap_set_attn_processor(original):
    @functools.wraps(original)
    def set_attn_processor(self, processor, *args, **kwargs):
        ours = _attnkit_processors(processor)  # before diffusers empties a dict of them
        if not ours:
            return original(self, processor, *args, **kwargs)
        with binding.collect_kept() as kept:
            result = original(self, processor, *args, **kwargs)
        _after_set(self, ours, kept)
        return result

    set_attn_processor._attnkit_wrapped = True
    return set_attn_processor


def _stock_for_default(module: nn.Module) -> Any:
    """The diffusers processor an attnkit processor on ``module`` stands for: the one it
    replaced, or the module's standard one (for a processor given at construction, or one
    that replaced a user's own); None where attnkit cannot tell."""
    stock = binding.stock_of(module)
    if stock is not None and not binding.is_attnkit(stock) and not binding.is_foreign(stock):
        return stock
    return binding.standard_of(module)


def _wrap_set_default_attn_processor(original):
    """diffusers' ``set_default_attn_processor`` accepts only its own processor classes
    and raises "Cannot call `set_default_attn_processor` when attention processors are of
    type ..." for any other. attnkit's processors compute what a diffusers processor
    computes, so each stands for that processor while diffusers decides which default to
    set (its result replaces every processor, as it does without attnkit)."""

    @functools.wraps(original)
    def set_default_attn_processor(self, *args, **kwargs):
        swapped = []
        for module in self.modules():
            proc = module.__dict__.get("processor", module._modules.get("processor"))
            if proc is None or not binding.is_attnkit(proc) or not hasattr(module, "set_processor"):
                continue
            stock = _stock_for_default(module)
            if stock is not None:
                swapped.append((module, proc))
                module.set_processor(stock)
        try:
            return original(self, *args, **kwargs)
        except BaseException:
            for module, proc in swapped:
                module.set_processor(proc)
            raise

    set_default_attn_processor._attnkit_wrapped = True
    return set_default_attn_processor


def _wrap_model_class(cls: type) -> None:
    original = cls.__dict__.get("set_default_attn_processor")
    if original is not None and not getattr(original, "_attnkit_wrapped", False):
        cls.set_default_attn_processor = _wrap_set_default_attn_processor(original)


def _model_subclass_hook(cls, **kwargs):
    """ModelMixin.__init_subclass__ while attnkit is imported: wraps the
    set_default_attn_processor of model classes defined after attnkit (diffusers imports
    its model modules lazily)."""
    super(_ModelMixin(), cls).__init_subclass__(**kwargs)
    _wrap_model_class(cls)


def _ModelMixin():
    from diffusers import ModelMixin

    return ModelMixin


def _wrap_model_classes() -> None:
    ModelMixin = _ModelMixin()
    seen, todo = set(), [ModelMixin]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                _wrap_model_class(sub)
                todo.append(sub)
    if "__init_subclass__" not in ModelMixin.__dict__:
        ModelMixin.__init_subclass__ = classmethod(_model_subclass_hook)


def _after_set(model: nn.Module, ours: list, kept: list) -> None:
    """Name the modules attnkit's processors were bound to, keep their routes for
    explain(), and say which ones are kept."""
    names: dict[int, str] = {}
    for proc in ours:
        routes, kept_names, served, named = {}, {}, {}, {}
        for name, module in model.named_modules():
            serve = module.__dict__.get(binding.SERVE)
            if serve is None or serve[0] is not proc:
                continue
            name = name or type(model).__name__
            names[id(module)] = name
            module.__dict__[binding.NAME] = name
            route = serve[3]
            routes[name] = route
            stock = binding.stock_of(module)
            kept_names[name] = type(stock if stock is not None else module).__name__
            named[name] = module
            served[name] = module
        applied = Applied(routes, kept_names, served, named)
        applied._model = weakref.ref(model)
        remember(proc, type(model).__name__, applied)
    if not kept:
        return
    by_reason: dict[str, list[str]] = {}
    for module, route in kept:
        by_reason.setdefault(route.reason, []).append(names.get(id(module), describe_module(module)))
    total = sum(len(v) for v in by_reason.values())
    served_count = sum(1 for _ in names) - total
    parts = []
    for reason, modules in by_reason.items():
        shown = ", ".join(modules[:3]) + (f", ... ({len(modules)} modules)" if len(modules) > 3 else "")
        parts.append(f"{shown}: {reason}")
    logger.warning(
        "set_attn_processor(%s) on %s keeps %d attention module(s) on their own processor, which attnkit cannot "
        "compute exactly; they compute what they computed before attnkit, and attnkit serves the other %d. %s. "
        "strict=True (or %s=1) refuses them instead; processor.explain() lists every module",
        ", ".join(type(p).__name__ for p in ours), type(model).__name__, total, served_count, "; ".join(parts),
        binding.STRICT_VAR,
    )


# -- set_attention_backend("attnkit") ----------------------------------------------------------
def _wrap_set_attention_backend(original):
    @functools.wraps(original)
    def set_attention_backend(self, backend, *args, **kwargs):
        result = original(self, backend, *args, **kwargs)
        name = getattr(backend, "value", backend)
        if isinstance(name, str) and name.lower().startswith(diffusers_backend.PREFIX):
            diffusers_backend.prepare(name.lower())
            _tell_once(self, f"set_attention_backend({name.lower()!r})")
        return result

    set_attention_backend._attnkit_wrapped = True
    return set_attention_backend


def _tell_once(model: nn.Module, how: str, context: bool = False) -> None:
    from diffusers import ModelMixin

    with _LOCK:
        if model in _WARNED:
            return
        # its models within (a ControlNet-XS's UNet) are said with it, not again
        _WARNED.update(m for m in model.modules() if isinstance(m, ModelMixin))
    unreached = unreached_by_dispatch(model, how, context)
    if unreached:
        logger.warning("%s", unreached)


def unreached_by_dispatch(model: nn.Module, how: str = "set_attention_backend('attnkit')",
                          context: bool = False) -> str:
    """What an attnkit backend set through diffusers' dispatcher (``how``) leaves on stock
    attention in ``model``: the attention modules whose processor or code does not call
    diffusers' dispatch_attention_fn; with ``context`` (a process-wide backend: the
    ``attention_backend`` context), also those whose processor names a backend of its
    own, which a process-wide one does not override ("" if there are none)."""
    routes = plan(model).routes
    modules = dict(model.named_modules())
    missed = {}
    for name, route in routes.items():
        module = modules.get(name)
        if _served_already(module):
            continue
        if route.kind in ("protocol", "sdpa", "forward"):
            missed[name] = _HOW[route.kind].format(route.reason.split()[0])
        elif context and route.kind == "dispatch":
            own = getattr(binding.current_processor(module), "_attention_backend", None)
            value = str(getattr(own, "value", own))
            if own is not None and not value.startswith(diffusers_backend.PREFIX):
                missed[name] = f"its processor names its own backend ({value!r}, set_attention_backend)"
    if not missed:
        return ""
    names = list(missed)
    shown = ", ".join(names[:3]) + (f", ... ({len(names)} modules)" if len(names) > 3 else "")
    return (
        f"{how} does not reach {len(missed)} of the {len(routes)} attention modules of {type(model).__name__} "
        f"({shown}): e.g. {names[0]}: {missed[names[0]]}, so they keep their stock attention. "
        f"attnkit.apply(model, attnkit.auto()) serves them."
    )


_HOW = {
    "protocol": "{} computes diffusers' Attention protocol itself, without dispatch_attention_fn",
    "sdpa": "{} calls scaled_dot_product_attention itself, not dispatch_attention_fn",
    "forward": "{} computes attention in its own forward, not through dispatch_attention_fn",
}


def _served_already(module: nn.Module | None) -> bool:
    """Whether attnkit already serves ``module`` (set_attn_processor or apply before)."""
    if module is None:
        return False
    return binding.is_attnkit(binding.current_processor(module)) or METHODS in module.__dict__


# -- with attention_backend("attnkit"): the first call of each model ----------------------------
_CONTEXT_HOW = "with attention_backend('attnkit') (diffusers' process-wide backend)"
_SAVED = []  # ModelMixin's own __call__ entry (or nothing), while attnkit's is installed


def _watching_call(self, *args, **kwargs):
    """ModelMixin.__call__ while an attnkit backend is diffusers' process-wide one: the
    first call of each model says what the dispatcher does not reach in it."""
    if not is_compiling() and self not in _WARNED:
        _tell_once(self, _CONTEXT_HOW, context=True)
    return nn.Module.__call__(self, *args, **kwargs)


def _on_active_backend(ours: bool) -> None:
    from diffusers import ModelMixin

    with _LOCK:
        installed = ModelMixin.__dict__.get("__call__") is _watching_call
        if ours and not installed:
            _SAVED[:] = [ModelMixin.__dict__["__call__"]] if "__call__" in ModelMixin.__dict__ else []
            ModelMixin.__call__ = _watching_call
        elif not ours and installed:
            if _SAVED:
                ModelMixin.__call__ = _SAVED.pop()
            else:
                del ModelMixin.__call__


def watching() -> bool:
    """Whether the first calls of models are being looked at now (an attnkit backend is
    diffusers' process-wide one)."""
    from diffusers import ModelMixin

    return ModelMixin.__dict__.get("__call__") is _watching_call


# -- installing ---------------------------------------------------------------------------------
def install() -> None:
    """Wrap diffusers' model-level entry points (idempotent)."""
    from diffusers import ModelMixin

    original = ModelMixin.__dict__.get("set_attention_backend")
    if original is not None and not getattr(original, "_attnkit_wrapped", False):
        ModelMixin.set_attention_backend = _wrap_set_attention_backend(original)
    try:
        from diffusers.models.attention import AttentionMixin
    except ImportError:  # an older diffusers: each model class has its own (kept modules said per module)
        AttentionMixin = None
    original = AttentionMixin.__dict__.get("set_attn_processor") if AttentionMixin is not None else None
    if original is not None and not getattr(original, "_attnkit_wrapped", False):
        AttentionMixin.set_attn_processor = _wrap_set_attn_processor(original)
    _wrap_model_classes()
    diffusers_backend.watch_active_backend(_on_active_backend)


install_backend_warning = install  # its name in attnkit.apply before this module (attnkit/_moved.py)

__all__ = ["install", "install_backend_warning", "unreached_by_dispatch", "watching"]
