"""How a module given an attnkit processor is served, decided when the processor is set.

``model.set_attn_processor(attnkit.auto())`` hands one processor to every attention
module. A module's own processor is what decides what it computes (linear attention,
a joint text+image concatenation, two outputs), so attnkit must know what it replaced:
diffusers' ``set_processor`` is wrapped, once, to note the processor an attnkit one
replaces (:data:`STOCK`), and to bind the module there and then (:data:`SERVE`), by the
same routes :func:`attnkit.apply` takes (see :mod:`attnkit.diffusers.routes`):

* ``protocol``: attnkit's processor computes diffusers' Attention protocol itself;
* ``dispatch``: a copy of the replaced processor, with its ``dispatch_attention_fn``
  backend pointed at attnkit;
* ``flex``: a copy of the replaced processor whose calls naming diffusers' flex backend
  (a BlockMask) attnkit computes (:mod:`attnkit.diffusers.flex`);
* ``sdpa``: a copy of the replaced processor whose ``scaled_dot_product_attention`` is
  attnkit's;
* ``kept``: attnkit cannot compute it exactly (linear attention, a flex mask, weights
  of its own): the first call raises :class:`UnsupportedModule` with the reason.

Binding at set time reads source code, which torch.compile cannot trace; done here, a
model compiled before its first call needs nothing at trace time.

What attnkit notes on the module (the stock processor, what serves it), how a served
module pickles as the stock module it was (``torch.save(model)`` loads in a process
without attnkit), and :func:`undo`, which puts the stock processor back, are
:mod:`attnkit.diffusers.stock`'s.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import os
import threading
import types
import weakref
from typing import Any

from diffusers.models import attention_processor as ap
from torch import nn

from ..errors import UnsupportedModule
from ..text import describe_module
from . import backend as diffusers_backend
from .flex import flex_copy
from .protocol import check_module_problem
from .routes import Route, bound_processor, classify
from .stock import (
    _UNSET,
    SERVE,
    STOCK,
    current_processor,
    default_stock,
    forget,
    is_attnkit,
    protect_pickle,
    record,
    stock_of,
    undo,
)

logger = logging.getLogger("attnkit")

STRICT_VAR = "ATTNKIT_STRICT"

KEEP_HINT = (
    "attnkit.apply(model, processor) serves every attention module it can and keeps this one with its own "
    "processor (`attnkit.plan(model).explain()` shows what it would do)"
)


def served_by(proc, module: nn.Module):
    """Bind ``module`` to attnkit processor ``proc``: what serves its calls (None: the
    processor computes the protocol itself; else a callable taking the processor's
    arguments). Stored on the module, with the route and why."""
    recorded = module.__dict__.get(STOCK, _UNSET)
    stock = default_stock(module) if recorded is _UNSET or recorded is None else recorded
    basis, route, note = routing_basis(stock, module, replacing=True)
    generic = False
    if route is None:
        route = classify(basis, module)
        if note:
            route = Route(route.kind, note + route.reason)
        generic, problem = _generic(basis, module)
        if generic and problem is None and route.kind != "protocol":
            if not is_foreign(stock):  # a foreign processor's replacement is said by routing_basis
                _say_what_differs(basis, module)
            route = Route(
                "protocol",
                f"{type(basis).__name__} replaced: attnkit's processor computes the module's "
                "Attention protocol with every option of its configuration",
            )
        generic = generic and problem is None
    if route.kind == "protocol" or generic:
        inner = None
    elif route.kind == "dispatch":
        inner = dispatch_copy(basis, proc)
    elif route.kind == "flex":
        inner = flex_copy(basis, proc)
    elif route.kind == "sdpa":
        inner = bound_processor(basis, proc.chooser)
    elif getattr(proc, "strict", False):
        inner = functools.partial(_refuse, route.reason, type(basis).__name__)
    else:
        inner = basis  # kept: the module's own processor computes it, as before attnkit
        if basis is recorded and isinstance(basis, nn.Module):
            # diffusers took it out of the module's submodules when attnkit's was set: back
            # among them, its weights stay the model's (state_dict, .to(), parameters())
            module._modules["processor"] = basis
        _note_kept(module, route)
    module.__dict__[SERVE] = (proc, inner, accepted_keywords(inner), route)
    return module.__dict__[SERVE]


def strict_default() -> bool:
    """Whether attnkit's processors refuse, rather than keep, a module they cannot serve
    exactly when they are not told (``ATTNKIT_STRICT=1``: for CI)."""
    return os.environ.get(STRICT_VAR, "").strip() not in ("", "0")


def is_foreign(proc: Any) -> bool:
    """Whether ``proc`` is a processor of neither diffusers nor attnkit (a user's, a
    tutorial's, another library's): attnkit cannot read what it computes."""
    if proc is None or is_attnkit(proc):
        return False
    where = type(proc).__module__ or ""
    return where != "diffusers" and not where.startswith("diffusers.")


def standard_of(module: nn.Module) -> Any:
    """The diffusers processor whose attention is ``module``'s standard one, or None if
    attnkit cannot tell: the diffusers processor a foreign one replaced on it (noted by
    the wrapped ``set_processor``), else the module class's default processor; for a
    legacy Attention, diffusers' default only where the protocol fits it (a joint or
    causal module is given its processor by its model)."""
    origin = _ORIGIN.get(module)
    if origin is not None:
        return origin
    if getattr(module, "_default_processor_cls", None) is not None:
        return default_stock(module)
    if isinstance(module, ap.Attention) and check_module_problem(module, None) is None:
        return default_stock(module)
    return None


def routing_basis(stock: Any, module: nn.Module, replacing: bool, say: bool = True) -> tuple[Any, Route | None, str]:
    """(the processor whose computation decides ``module``'s route, a Route already
    decided or None, what to put before the route's reason). That is ``stock`` itself,
    except for a foreign processor (see :func:`is_foreign`): replacing it
    (``set_attn_processor``; or ``apply`` where it carries no weights) gives the module its
    standard attention (:func:`standard_of`), and says so once per processor class (with
    ``say``); where attnkit cannot tell what that is, the foreign processor is kept, with
    the reason."""
    if not is_foreign(stock) or (not replacing and isinstance(stock, nn.Module)):
        return stock, None, ""
    name = type(stock).__name__
    standard = standard_of(module)
    if standard is None:
        return (
            stock,
            Route(
                "kept",
                f"{name} is not a processor of diffusers' or attnkit's, and attnkit cannot tell "
                f"which standard attention this module has ({check_module_problem(module, None)}):"
                " kept as it is",
            ),
            "",
        )
    if say and type(stock) not in _REPLACED:
        _REPLACED.add(type(stock))
        logger.warning(
            "attnkit replaced %s on %s (and on every module it runs on): it is not a processor of diffusers' or "
            "attnkit's, so attnkit cannot read what it computes; the module computes its standard attention "
            "instead, as diffusers' %s does, with attnkit's attention (undo() puts %s back)",
            name,
            describe_module(module),
            type(standard).__name__,
            name,
        )
    return standard, None, f"{name} (not diffusers' or attnkit's) replaced by the module's {type(standard).__name__}: "


# foreign processor classes attnkit has said it replaced (said once per class and process;
# bounded by the classes a process defines)
_REPLACED: set = set()
# module -> the diffusers processor a foreign one replaced on it (see standard_of)
_ORIGIN: "weakref.WeakKeyDictionary[nn.Module, Any]" = weakref.WeakKeyDictionary()


# What diffusers' modules drop without a warning when their processor does not take it.
QUIET = frozenset({"ip_adapter_masks", "ip_hidden_states"})


def accepted_keywords(inner: Any) -> frozenset[str] | None:
    """The argument names diffusers' module passes ``inner`` (None for attnkit's protocol
    and refusals, which take everything). attnkit's processor advertises every name a
    diffusers processor takes, so that the module passes them all; the stock processor it
    runs must then get only what its module would have given it: the names of its
    ``__call__``'s parameters, as diffusers reads them (a ``**kwargs`` takes no name)."""
    call = getattr(type(inner), "__call__", None) if inner is not None else None
    if not isinstance(call, types.FunctionType):
        return None
    return frozenset(inspect.signature(call).parameters)


def keep_accepted(module: nn.Module, inner: Any, accepted: frozenset[str], kwargs: dict) -> dict:
    """``kwargs`` as ``module`` would have given ``inner``: what it does not take dropped,
    with diffusers' own warning for the names it does not drop quietly."""
    unused = [k for k in kwargs if k not in accepted and k not in QUIET]
    if unused:
        cls = type(inner)
        stock = cls.__mro__[1] if getattr(cls, "_attnkit_chooser", None) is not None else cls
        logger.warning(
            "%s: keyword arguments %s are not expected by %s and will be ignored (as diffusers does)",
            describe_module(module),
            unused,
            stock.__name__,
        )
    return {k: v for k, v in kwargs.items() if k in accepted}


def _generic(stock: Any, module: nn.Module) -> tuple[bool, str | None]:
    """(whether ``stock`` is one of diffusers' two generic processors on a legacy Attention
    module, why the protocol does not fit that module or None). Where it fits, attnkit's
    processor set on the module computes the protocol with every option of the module
    (qk-norm under AttnProcessor, attn.scale under AttnProcessor2_0), as it always has."""
    if type(stock) not in _GENERIC or not isinstance(module, ap.Attention):
        return False, None
    return True, check_module_problem(module, None)


_GENERIC = (ap.AttnProcessor, ap.AttnProcessor2_0)


# (module class, processor class, what differs) said once per process by _say_what_differs:
# bounded by the classes a process defines
_SAID: set = set()


def _say_what_differs(stock: Any, module: nn.Module) -> None:
    """Warn (once per kind of module) where attnkit's protocol computes what the generic
    processor it replaces skips: not silent, and what apply would keep exactly."""
    what = (
        "the module's qk-norm (norm_q / norm_k)"
        if type(stock).__name__ == "AttnProcessor"
        else f"the module's attn.scale ({float(getattr(module, 'scale')):.6g}, not 1/sqrt(head_dim))"
    )
    key = (type(module), type(stock), what)
    if key not in _SAID:
        _SAID.add(key)
        logger.warning(
            "attnkit's processor on %s applies %s, which the %s it replaces skips: its output differs from stock's "
            "(attnkit follows the module's configuration; attnkit.apply reproduces what %s computes)",
            describe_module(module),
            what,
            type(stock).__name__,
            type(stock).__name__,
        )


def protocol_fits(module: nn.Module) -> bool:
    """Whether ``module`` is served by the protocol, decided without reading source (as
    torch.compile traces it): a legacy Attention module the protocol fits (see
    :func:`_generic`), whose replaced processor is unknown or one of diffusers' generic two."""
    stock = module.__dict__.get(STOCK)
    return (
        type(module) is ap.Attention
        and (stock is None or type(stock) in _GENERIC)
        and check_module_problem(module, None) is None
    )


def dispatch_copy(stock: Any, proc) -> Any:
    """A copy of the dispatching processor ``stock`` whose backend is ``proc``'s chooser
    (the stock one is left as it was: undo() puts it back)."""
    inner = copy.copy(stock)
    inner._attention_backend = diffusers_backend.member_for(proc)
    inner._attnkit_copy = True
    inner._attnkit_lease = diffusers_backend.Lease(proc.chooser)  # the registry holds the chooser weakly
    return inner


def _refuse(reason: str, kept: str, attn: nn.Module, *args: Any, **kwargs: Any):
    raise UnsupportedModule(
        f"attnkit's processor (strict: strict=True or {STRICT_VAR}=1) cannot serve {describe_module(attn)}: "
        f"{reason}. Without strict mode (the default), attnkit keeps this module on its own processor ({kept}), "
        f"which computes what it computed before attnkit, and serves the others "
        f"(`attnkit.plan(model).explain()` shows every module's route)"
    )


# -- the modules an attnkit processor keeps, said once per model ------------------------------
_BATCH = threading.local()  # .kept: [(module, Route)] while a model's set_attn_processor runs
_SAID_KEPT: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()


def _note_kept(module: nn.Module, route: Route) -> None:
    """A module bound as kept: said once for the whole model by the wrapped
    set_attn_processor (see :func:`collect_kept`), or here, once per module, when the
    processor was set on the module alone."""
    batch = getattr(_BATCH, "kept", None)
    if batch is not None:
        batch.append((module, route))
    elif module not in _SAID_KEPT:
        _SAID_KEPT.add(module)
        logger.warning(
            "attnkit's processor keeps %s on its own processor, which computes what it computed before "
            "attnkit: %s (strict=True or %s=1 refuses it instead)",
            describe_module(module),
            route.reason,
            STRICT_VAR,
        )


class collect_kept:
    """``with collect_kept() as kept:`` the modules bound as kept meanwhile, in this thread
    (nested uses leave them to the outermost)."""

    def __enter__(self) -> list:
        self.outer = getattr(_BATCH, "kept", None)
        if self.outer is None:
            _BATCH.kept = []
        return _BATCH.kept if self.outer is None else []

    def __exit__(self, *exc) -> None:
        if self.outer is None:
            _BATCH.kept = None


# -- after diffusers' set_processor (attnkit.diffusers.hooks wraps it) ----------------------------
def around_set_processor(original, module: nn.Module, processor: Any, *args, **kwargs):
    """diffusers' ``module.set_processor(processor)`` (``original``), then
    :func:`after_set_processor`."""
    old = current_processor(module)
    result = original(module, processor, *args, **kwargs)
    after_set_processor(module, old, processor)
    return result


def after_set_processor(module: nn.Module, old: Any, processor: Any) -> None:
    """``module.set_processor(processor)`` replaced ``old``: an attnkit processor notes
    what it replaced and the module's route; any other forgets attnkit's notes (and, for a
    user's own processor, remembers the diffusers processor it replaced: the module's
    standard)."""
    if getattr(type(processor), "_attnkit_processor", False):
        record(module, old)
        served_by(processor, module)
    elif not is_attnkit(processor):
        forget(module)
        if not is_foreign(processor):
            _ORIGIN.pop(module, None)
        elif old is not None and not is_foreign(old) and not is_attnkit(old):
            _ORIGIN[module] = old  # what the foreign processor replaced: the module's standard


__all__ = [
    "KEEP_HINT",
    "after_set_processor",
    "around_set_processor",
    "is_attnkit",
    "protect_pickle",
    "record",
    "served_by",
    "stock_of",
    "undo",
]
