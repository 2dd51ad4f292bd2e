"""Processors by name, and serving every attention module of a model."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from torch import nn

from .chooser import auto
from .processor import PROCESSORS, AttnkitProcessor
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

    def __init__(self, routes: dict[str, Route], kept_names: dict[str, str]):
        super().__init__({name: ("attnkit" if r.served else kept_names[name]) for name, r in routes.items()})
        self.routes = routes

    def summary(self) -> str:
        counts = Counter(r.kind for r in self.routes.values())
        parts = [f"{counts[k]} {label}" for k, label in (
            ("dispatch", "through diffusers' dispatch_attention_fn"),
            ("protocol", "by attnkit's processor"),
            ("sdpa", "by their own processor with attnkit's attention"),
            ("forward", "by their own code with attnkit's attention"),
            ("kept", "kept")) if counts[k]]
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
    out = []
    processors = {id(getattr(m, "processor", None)) for m in model.modules()}
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
    from . import diffusers_backend

    routes: dict[str, Route] = {}
    kept_names: dict[str, str] = {}
    for name, module, route in attention_modules(model):
        old = getattr(module, "processor", None)
        if route is None:
            route = classify(old, module)
            if route.kind == "dispatch" and diffusers_backend.PROBLEM is not None:
                route = Route("kept", diffusers_backend.PROBLEM)
        routes[name] = route
        kept_names[name] = type(old if old is not None else module).__name__
    return Applied(routes, kept_names)


def apply(model: nn.Module, proc: AttnkitProcessor) -> Applied:
    """Serve every attention module of ``model`` that attnkit can serve exactly, with
    ``proc``'s choice of backend (``attnkit.auto()`` or a named processor).

    Works on any ``nn.Module`` (it walks the modules itself; the model needs no
    ``set_attn_processor``). Per module, by what its processor computes (see
    :mod:`attnkit.routes`): diffusers' transformer processors keep their own work and
    send their dispatch_attention_fn call to attnkit; processors computing diffusers'
    Attention protocol are replaced by ``proc``; other processors calling
    scaled_dot_product_attention run as they are with that call served by attnkit;
    everything else (IP-Adapter's weights, linear attention, hard-coded backends) keeps
    its processor. diffusers' process-wide active backend is never changed.

    Each module is given its name, for logs and errors. Returns an :class:`Applied`:
    {module name: "attnkit" | kept processor's class}, with ``.routes`` and
    ``.explain()``; the summary is logged at INFO.
    """
    if not isinstance(proc, AttnkitProcessor):
        raise TypeError(f"attnkit.apply takes an attnkit processor (attnkit.auto(), attnkit.processor(name)), "
                        f"not {type(proc).__name__}")
    routes: dict[str, Route] = {}
    kept_names: dict[str, str] = {}
    for name, module, route in attention_modules(model):
        module._attnkit_name = name
        old = getattr(module, "processor", None)
        if route is not None:  # no processor: its own forward
            if route.kind == "forward":
                bind_module(module, proc.chooser)
            routes[name] = route
            kept_names[name] = type(module).__name__
            continue
        route = classify(old, module)
        if route.kind == "dispatch":
            route = _route_dispatch(old, proc, route)
        elif route.kind == "protocol":
            _set(module, proc)
        elif route.kind == "sdpa":
            _set(module, bound_processor(old, proc.chooser))
        routes[name] = route
        kept_names[name] = type(old).__name__
    applied = Applied(routes, kept_names)
    logger.info("attnkit.apply(%s): %s", type(model).__name__, applied.summary())
    for name, route in routes.items():
        if not route.served:
            logger.info("attnkit.apply: kept %s: %s", name, route.reason)
    model._attnkit_applied = applied
    proc._applied.append((type(model).__name__, applied))
    return applied


def _route_dispatch(old: Any, proc: AttnkitProcessor, route: Route) -> Route:
    from . import diffusers_backend

    if diffusers_backend.PROBLEM is not None:
        return Route("kept", diffusers_backend.PROBLEM)
    old._attention_backend = diffusers_backend.member_for(proc)
    return route


def _set(module: nn.Module, new: Any) -> None:
    setter = getattr(module, "set_processor", None)
    if setter is not None:
        setter(new)
    else:
        module.processor = new


__all__ = ["PROCESSOR_NAMES", "Applied", "apply", "attention_modules", "plan", "processor"]
