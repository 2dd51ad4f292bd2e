"""What attnkit does at diffusers' model-level entry points, so that each of them says what
it does and what it does not reach (:mod:`attnkit.diffusers.hooks` puts these in
diffusers' place; nothing here changes diffusers):

* ``set_attn_processor`` (diffusers' ``AttentionMixin``), given an attnkit processor:
  every attention module it reaches is given its name in the model (for logs and
  errors), the routes are kept for ``processor.explain()``, and the modules attnkit keeps
  on their own processor (linear attention, a flex mask, weights of their own) are said
  in one warning for the model;
* ``set_default_attn_processor``: attnkit's processors stand for the diffusers processor
  they compute while diffusers picks the default;
* ``set_attention_backend("attnkit...")``: the chooser is made there (torch.compile
  never meets its lazy creation) and a model the dispatcher does not wholly reach is
  told so, once;
* ``with attention_backend("attnkit..."):`` (and any process-wide attnkit backend): the
  first call of each model run meanwhile is looked at, and a model the dispatcher does
  not wholly reach gets the same warning, once.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from torch import nn

from ..choose.compiling import is_compiling
from ..text import describe_module
from . import backend as diffusers_backend
from . import binding, hooks
from .apply import Applied, plan, remember
from .flex import accept_attnkit, is_attnkit_name, is_flex
from .routes import METHODS
from .stock import NAME, SERVE, current_processor, is_attnkit, stock_of

logger = logging.getLogger("attnkit")

_WARNED: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()  # models told what the dispatcher misses
_LOCK = threading.RLock()


# -- set_attn_processor(attnkit processor) -----------------------------------------------------
def _attnkit_processors(processor: Any) -> list:
    given = processor.values() if isinstance(processor, dict) else (processor,)
    out: list[Any] = []
    for proc in given:
        if getattr(type(proc), "_attnkit_processor", False) and all(p is not proc for p in out):
            out.append(proc)
    return out


def set_attn_processor(original, model: nn.Module, processor: Any, *args, **kwargs):
    """diffusers' ``set_attn_processor`` (``original``) on ``model``, then, for attnkit's
    processors, the modules named, the routes kept and the kept modules said."""
    ours = _attnkit_processors(processor)  # before diffusers empties a dict of them
    if not ours:
        return original(model, processor, *args, **kwargs)
    with binding.collect_kept() as kept:
        result = original(model, processor, *args, **kwargs)
    _after_set(model, ours, kept)
    return result


def _stock_for_default(module: nn.Module) -> Any:
    """The diffusers processor an attnkit processor on ``module`` stands for: the one it
    replaced, or the module's standard one (for a processor given at construction, or one
    that replaced a user's own); None where attnkit cannot tell."""
    stock = stock_of(module)
    if stock is not None and not is_attnkit(stock) and not binding.is_foreign(stock):
        return stock
    return binding.standard_of(module)


def set_default_attn_processor(original, model: nn.Module, *args, **kwargs):
    """diffusers' ``set_default_attn_processor`` (``original``) accepts only its own
    processor classes and raises "Cannot call `set_default_attn_processor` when attention
    processors are of type ..." for any other. attnkit's processors compute what a
    diffusers processor computes, so each stands for that processor while diffusers
    decides which default to set (its result replaces every processor, as it does
    without attnkit)."""
    swapped = []
    for module in model.modules():
        proc = module.__dict__.get("processor", module._modules.get("processor"))
        if proc is None or not is_attnkit(proc) or not hasattr(module, "set_processor"):
            continue
        stock = _stock_for_default(module)
        if stock is not None:
            swapped.append((module, proc))
            getattr(module, "set_processor")(stock)
    try:
        return original(model, *args, **kwargs)
    except BaseException:
        for module, proc in swapped:
            getattr(module, "set_processor")(proc)
        raise


def _after_set(model: nn.Module, ours: list, kept: list) -> None:
    """Name the modules attnkit's processors were bound to, keep their routes for
    explain(), and say which ones are kept."""
    names: dict[int, str] = {}
    for proc in ours:
        routes, kept_names, served, named = {}, {}, {}, {}
        for name, module in model.named_modules():
            serve = module.__dict__.get(SERVE)
            if serve is None or serve[0] is not proc:
                continue
            name = name or type(model).__name__
            names[id(module)] = name
            module.__dict__[NAME] = name
            route = serve[3]
            routes[name] = route
            stock = stock_of(module)
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
        ", ".join(type(p).__name__ for p in ours),
        type(model).__name__,
        total,
        served_count,
        "; ".join(parts),
        binding.STRICT_VAR,
    )


# -- set_attention_backend("attnkit") ----------------------------------------------------------
def after_set_attention_backend(model: nn.Module, backend: Any) -> None:
    """``model.set_attention_backend(backend)`` ran: for an attnkit name, its chooser is
    made now, the processors that accept flex alone accept attnkit's names (LTX-2's
    decoder, AnyFlow FAR: :func:`attnkit.diffusers.flex.accept_attnkit`) and the model is
    told what the dispatcher does not reach in it; for another name, those processors
    accept only their own names again."""
    name = getattr(backend, "value", backend)
    ours = is_attnkit_name(name)
    for module in model.modules():  # processors that accept flex alone accept attnkit's names, or no longer
        proc = getattr(module, "processor", None) if isinstance(module, nn.Module) else None
        if proc is not None and hasattr(proc, "_attention_backend"):
            accept_attnkit(proc, ours)
    if ours:
        diffusers_backend.prepare(name.lower())
        _tell_once(model, f"set_attention_backend({name.lower()!r})")


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


def unreached_by_dispatch(
    model: nn.Module, how: str = "set_attention_backend('attnkit')", context: bool = False
) -> str:
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
        if route.kind in ("protocol", "sdpa", "forward") or (route.kind == "flex" and _flex_only(module)):
            missed[name] = _HOW[route.kind].format(route.reason.split()[0])
        elif context and route.kind == "dispatch":
            own = getattr(current_processor(module), "_attention_backend", None) if module is not None else None
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
    "flex": "{} names diffusers' flex backend itself (a BlockMask), which a backend set by name does not change",
}


def _flex_only(module: nn.Module | None) -> bool:
    """Whether a module of the flex route runs no call a backend set by name reaches: its
    processor names no backend of its own, or names flex (Wan-Animate-2's reference pass
    runs its own backend; its generation pass, flex, is not reached)."""
    proc = current_processor(module) if module is not None else None
    return not hasattr(proc, "_attention_backend") or is_flex(getattr(proc, "_attention_backend", None))


def _served_already(module: nn.Module | None) -> bool:
    """Whether attnkit already serves ``module`` (set_attn_processor or apply before)."""
    if module is None:
        return False
    return is_attnkit(current_processor(module)) or METHODS in module.__dict__


# -- with attention_backend("attnkit"): the first call of each model ----------------------------
_CONTEXT_HOW = "with attention_backend('attnkit') (diffusers' process-wide backend)"


def first_call_under_context(model: nn.Module) -> None:
    """A model is called while an attnkit name is diffusers' process-wide backend (hooks'
    ModelMixin.__call__): its first call says what the dispatcher does not reach in it."""
    if not is_compiling() and model not in _WARNED:
        _tell_once(model, _CONTEXT_HOW, context=True)


watching = hooks.watching
install_backend_warning = hooks.install  # its name in attnkit.apply before this module (attnkit/moved_paths.py)

# what attnkit.diffusers.hooks calls from diffusers' functions (hooks.install() puts them in place)
hooks.connect(
    set_processor=binding.around_set_processor,
    set_attn_processor=set_attn_processor,
    set_default_attn_processor=set_default_attn_processor,
    set_attention_backend=after_set_attention_backend,
    first_call=first_call_under_context,
    register_names=diffusers_backend.register_defaults,
    forget_name=diffusers_backend.forget_name,
)

__all__ = [
    "after_set_attention_backend",
    "first_call_under_context",
    "install_backend_warning",
    "set_attn_processor",
    "set_default_attn_processor",
    "unreached_by_dispatch",
    "watching",
]
