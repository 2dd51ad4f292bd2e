"""Processors by name, and serving every attention module of a model."""

from __future__ import annotations

import logging
import weakref
from collections import Counter
from typing import Any

from torch import nn

from . import binding, stock
from .flex import flex_copy
from .processor import PROCESSORS, AttnkitProcessor, auto
from .routes import Route, bind_module, bound_processor, classify, classify_forward

logger = logging.getLogger("attnkit")

PROCESSOR_NAMES = tuple(PROCESSORS) + ("auto",)


def processor(name: str, **options: Any) -> AttnkitProcessor:
    """A processor by name: vanilla, sliced, sdpa, xformers, flash_attn, triton or auto."""
    if name == "auto":
        return auto(**options)
    try:
        cls = PROCESSORS[name]
    except KeyError:
        raise ValueError(f"unknown processor {name!r}; choose one of {', '.join(PROCESSOR_NAMES)}") from None
    return cls(**options)


class Applied(dict):
    """What :func:`apply` did: {module name: "attnkit" | the kept processor's class name},
    with ``routes`` ({module name: Route}) saying how and why, and ``explain()``."""

    def __init__(
        self,
        routes: dict[str, Route],
        kept_names: dict[str, str],
        modules: dict[str, nn.Module] | None = None,
        named: dict[str, nn.Module] | None = None,
    ):
        super().__init__({name: ("attnkit" if r.served else kept_names[name]) for name, r in routes.items()})
        self.routes = routes
        # weakly: a processor keeps every Applied it served (explain()), never the models
        self._modules = weakref.WeakValueDictionary(modules or {})
        self._named = weakref.WeakValueDictionary(named or {})  # the modules given their name
        self._model: weakref.ReferenceType[nn.Module] | None = None

    def undo(self) -> None:
        """Put back every processor (and module method) this apply replaced: the model
        then computes exactly what it did before."""
        for module in list(self._modules.values()):
            stock.undo(module)
        for module in list(self._named.values()):
            module.__dict__.pop(stock.NAME, None)
        self._modules.clear()
        self._named.clear()
        model = self._model() if self._model is not None else None
        if model is not None:
            model.__dict__.pop("_attnkit_applied", None)
            stock.forget(model)

    def summary(self) -> str:
        counts = Counter(r.kind for r in self.routes.values())
        parts = [
            f"{counts[k]} {label}"
            for k, label in (
                ("dispatch", "through diffusers' dispatch_attention_fn"),
                ("flex", "by their own processor, with attnkit computing its flex backend's calls"),
                ("protocol", "by attnkit's processor"),
                ("sdpa", "by their own processor with attnkit's attention"),
                ("forward", "by their own code with attnkit's attention"),
                ("kept", "kept"),
            )
            if counts[k]
        ]
        return f"{len(self.routes)} attention modules: " + ", ".join(parts)

    def explain(self, per_module: bool = False) -> str:
        """The routes and their reasons: modules that share both are grouped (a count and
        their first names), or one line per module with ``per_module=True``."""
        lines = [self.summary()]
        if per_module:
            width = max((len(n) for n in self.routes), default=0)
            for name, route in self.routes.items():
                lines.append(f"  {name:<{width}}  {route.kind:<8}  {route.reason}")
            return "\n".join(lines)
        groups: dict[Route, list[str]] = {}
        for name, route in self.routes.items():
            groups.setdefault(route, []).append(name)
        for route, names in groups.items():
            shown = ", ".join(names[:3]) + (f", ... ({len(names)} modules)" if len(names) > 3 else "")
            lines.append(f"  {route.kind:<8}  {shown}: {route.reason}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Applied({self.summary()})"


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module, Route | None]]:
    """(name, module, route) of every module of ``model`` that computes attention: those
    that run a processor (route None: decided by the processor), and those whose own
    forward attnkit can see computing it (route given)."""
    out: list[tuple[str, nn.Module, Route | None]] = []
    # processors with weights are submodules: their module's business (the one running
    # now, or the one attnkit's processor keeps, see binding.served_by)
    processors = {id(p) for m in model.modules() for p in (getattr(m, "processor", None), stock.stock_of(m))}
    for name, module in model.named_modules():
        if isinstance(module, AttnkitProcessor) or id(module) in processors:
            continue  # a processor with weights (IP-Adapter) is its module's business
        name = name or type(model).__name__
        if callable(getattr(module, "processor", None)) or hasattr(module, "set_processor"):
            out.append((name, module, None))
        else:
            route = classify_forward(module)
            if route is not None:
                out.append((name, module, route))
    return out


def plan(model: nn.Module) -> Applied:
    """What :func:`apply` would do to ``model``, without changing it: every attention
    module's route and the reason (``attnkit.plan(model).explain()``; ``attnkit info
    --model DIR`` prints it for a model's config)."""
    if not isinstance(model, nn.Module):
        return AppliedPipeline({name: plan(c) for name, c in _components(model, "plan").items()})
    routes: dict[str, Route] = {}
    kept_names: dict[str, str] = {}
    for name, module, route in attention_modules(model):
        old = stock.stock_of(module)
        if route is None:
            route = _route(old, module, say=False)[1]
        routes[name] = route
        kept_names[name] = type(old if old is not None else module).__name__
    return Applied(routes, kept_names)


def _route(old: Any, module: nn.Module, say: bool = True) -> tuple[Any, Route]:
    """(the processor apply serves ``module`` by, its route): ``old`` itself, or the
    module's standard processor where ``old`` is a foreign one without weights
    (binding.routing_basis)."""
    basis, route, note = binding.routing_basis(old, module, replacing=False, say=say)
    if route is None:
        route = classify(basis, module)
        if note:
            route = Route(route.kind, note + route.reason)
    return basis, route


def apply(model: nn.Module, proc: AttnkitProcessor) -> Applied:
    """Serve every attention module of ``model`` that attnkit can serve exactly, with
    ``proc``'s choice of backend (``attnkit.auto()`` or a named processor).

    Works on any ``nn.Module`` (it walks the modules itself; the model needs no
    ``set_attn_processor``). Per module, by what its processor computes (see
    :mod:`attnkit.diffusers.routes`): diffusers' transformer processors keep their own work and
    send their dispatch_attention_fn call to attnkit (those that name diffusers' flex
    backend themselves, with a BlockMask, have that call computed by attnkit: the flex
    route, :mod:`attnkit.diffusers.flex`); processors computing diffusers'
    Attention protocol are replaced by ``proc``; other processors calling
    scaled_dot_product_attention run as they are with that call served by attnkit;
    everything else (IP-Adapter's weights, linear attention, hard-coded backends) keeps
    its processor. diffusers' process-wide active backend is never changed.

    Each module is given its name, for logs and errors. Returns an :class:`Applied`:
    {module name: "attnkit" | kept processor's class}, with ``.routes`` and
    ``.explain()``; the summary is logged at INFO.
    """
    if not isinstance(proc, AttnkitProcessor):
        raise TypeError(
            f"attnkit.apply takes an attnkit processor (attnkit.auto(), attnkit.processor(name)), "
            f"not {type(proc).__name__}"
        )
    if not isinstance(model, nn.Module):
        return AppliedPipeline({name: apply(c, proc) for name, c in _components(model, "apply").items()})
    routes: dict[str, Route] = {}
    kept_names: dict[str, str] = {}
    touched: dict[str, nn.Module] = {}
    named: dict[str, nn.Module] = {}
    for name, module, route in attention_modules(model):
        named[name] = module
        module.__dict__[stock.NAME] = name
        if route is not None:  # no processor: its own forward
            if route.kind == "forward":
                bind_module(module, proc.chooser)
                stock.protect_pickle(module)
                touched[name] = module
            routes[name] = route
            kept_names[name] = type(module).__name__
            continue
        old = stock.stock_of(module)
        basis, route = _route(old, module)
        if route.served:
            stock.record(module, old)
            touched[name] = module
        if route.kind == "dispatch":
            _set(module, binding.dispatch_copy(basis, proc))
        elif route.kind == "flex":
            _set(module, flex_copy(basis, proc))
        elif route.kind == "protocol":
            _set(module, proc)
        elif route.kind == "sdpa":
            _set(module, bound_processor(basis, proc.chooser))
        routes[name] = route
        kept_names[name] = type(old).__name__
    applied = Applied(routes, kept_names, touched, named)
    logger.info("attnkit.apply(%s): %s", type(model).__name__, applied.summary())
    for name, route in routes.items():
        if not route.served:
            logger.info("attnkit.apply: kept %s: %s", name, route.reason)
    setattr(model, "_attnkit_applied", applied)
    applied._model = weakref.ref(model)
    stock.protect_pickle(model)
    remember(proc, type(model).__name__, applied)
    return applied


def remember(proc: AttnkitProcessor, model_name: str, applied: Applied) -> None:
    """Keep ``applied`` on ``proc`` for its explain(), dropping those of freed models."""
    proc._applied = [(n, a) for n, a in proc._applied if a._model is None or a._model() is not None]
    proc._applied.append((model_name, applied))


class AppliedPipeline(dict):
    """What :func:`apply` did to a pipeline: {component name: :class:`Applied`}, for every
    component with attention (the UNet or transformer, the VAE, text encoders, ...)."""

    def summary(self) -> str:
        return "; ".join(f"{name}: {applied.summary()}" for name, applied in self.items())

    def explain(self, per_module: bool = False) -> str:
        return "\n".join(f"{name}: {applied.explain(per_module)}" for name, applied in self.items())

    def undo(self) -> None:
        """Undo every component's (see :meth:`Applied.undo`)."""
        for applied in self.values():
            applied.undo()

    def __repr__(self) -> str:
        return f"AppliedPipeline({self.summary()})"


def _components(pipe: Any, what: str) -> dict[str, nn.Module]:
    """A diffusers pipeline's components that compute attention."""
    components = getattr(pipe, "components", None)
    if not isinstance(components, dict):
        raise TypeError(
            f"attnkit.{what} takes a model (an nn.Module such as pipe.unet or pipe.transformer) or a diffusers "
            f"pipeline (with .components), not {type(pipe).__name__}"
        )
    out = {name: c for name, c in components.items() if isinstance(c, nn.Module) and attention_modules(c)}
    if not out:
        raise ValueError(
            f"attnkit.{what}: no component of {type(pipe).__name__} computes attention "
            f"(components: {', '.join(components) or 'none'})"
        )
    return out


def _set(module: nn.Module, new: Any) -> None:
    setter = getattr(module, "set_processor", None)
    if setter is not None:
        setter(new)
    else:
        module.processor = new


__all__ = [
    "PROCESSOR_NAMES",
    "Applied",
    "AppliedPipeline",
    "apply",
    "attention_modules",
    "plan",
    "processor",
    "remember",
]
