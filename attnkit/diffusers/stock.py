"""What attnkit notes on a module whose processor it replaces (the stock processor it
replaced, what serves the module, its name in its model), how that is undone, and how
such a module pickles as the stock module it was: ``torch.save(model)`` loads in a
process without attnkit.

:mod:`attnkit.diffusers.binding` decides how a module is served; this module is what
every route (``set_attn_processor``, ``attnkit.apply``) leaves on the module, and takes
back.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch.nn.functional as F
from diffusers.models import attention_processor as ap
from torch import nn

from .routes import METHODS

STOCK = "_attnkit_stock"  # the processor attnkit replaced on this module
# (attnkit processor, what serves the call or None for the protocol, the names it takes or None)
SERVE = "_attnkit_serve"
_GETSTATE = "__getstate__"
NAME = "_attnkit_name"  # the module's name in its model, for logs and errors
_UNSET = object()


def is_attnkit(proc: Any) -> bool:
    """Whether ``proc`` is attnkit's: its processor, a stock processor bound to attnkit's
    attention, or a copy pointed at attnkit's dispatch backend."""
    return (
        getattr(type(proc), "_attnkit_processor", False)
        or getattr(type(proc), "_attnkit_chooser", None) is not None
        or bool(getattr(proc, "__dict__", {}).get("_attnkit_copy"))
    )


def current_processor(module: nn.Module) -> Any:
    try:
        return module.processor
    except AttributeError:  # being constructed: no processor yet
        return None


def stock_of(module: nn.Module) -> Any:
    """The processor this module ran before attnkit's (its current one if attnkit has not
    replaced it)."""
    stock = module.__dict__.get(STOCK, _UNSET)
    return current_processor(module) if stock is _UNSET else stock


def default_stock(module: nn.Module) -> Any:
    """What diffusers would give ``module`` by default: for a module handed an attnkit
    processor at construction, whose replaced processor is unknown."""
    cls = getattr(module, "_default_processor_cls", None)
    if cls is not None:
        return cls()
    if isinstance(module, ap.Attention):
        if hasattr(F, "scaled_dot_product_attention") and getattr(module, "scale_qk", True):
            return ap.AttnProcessor2_0()
        return ap.AttnProcessor()
    return None


def record(module: nn.Module, stock: Any) -> None:
    """Note that attnkit replaces ``stock`` on ``module`` (the first replacement only: a
    second attnkit processor keeps the record of what the model had), and make the
    module pickle as the stock module it was."""
    if STOCK not in module.__dict__ and stock is not None and not is_attnkit(stock):
        module.__dict__[STOCK] = stock
    protect_pickle(module)


def forget(module: nn.Module) -> None:
    """Drop what attnkit noted on ``module`` (a non-attnkit processor was set)."""
    for key in (STOCK, SERVE, _GETSTATE, NAME):
        module.__dict__.pop(key, None)


def undo(module: nn.Module) -> None:
    """Put back what ``module`` had before attnkit: its processor and its own methods."""
    stock = module.__dict__.get(STOCK, _UNSET)
    for name in module.__dict__.pop(METHODS, ()):
        module.__dict__.pop(name, None)
    if stock is not _UNSET:
        setter = getattr(module, "set_processor", None)
        if setter is not None:
            setter(stock)
        else:
            module.processor = stock
    forget(module)


# -- pickling: a served module is saved as the stock module it was ---------------------------
def protect_pickle(module: nn.Module) -> None:
    if _GETSTATE not in module.__dict__:
        module.__dict__[_GETSTATE] = types.MethodType(_stock_state, module)


def _stock_state(self: nn.Module) -> dict:
    """nn.Module's pickled state, with attnkit's changes taken out: a model saved with
    torch.save loads where attnkit is not installed, as the stock model (attnkit.apply
    again after loading). copy.deepcopy keeps attnkit's processors."""
    state = nn.Module.__getstate__(self)
    if _called_from_copy():
        return state
    stock = state.get(STOCK, _UNSET)
    if stock is _UNSET and is_attnkit(state.get("processor")):  # given attnkit's at construction
        stock = default_stock(self)
    for name in state.get(METHODS, ()):
        state.pop(name, None)
    for key in [k for k in state if k.startswith("_attnkit_")] + [_GETSTATE]:
        state.pop(key, None)
    if stock is not _UNSET:
        if isinstance(stock, nn.Module):  # a processor with weights lives among the submodules
            state.pop("processor", None)
            state["_modules"] = {**state["_modules"], "processor": stock}
        else:
            state["processor"] = stock
    return state


def _called_from_copy() -> bool:
    try:
        frame = sys._getframe(2)
    except ValueError:
        return False
    return frame.f_globals.get("__name__") == "copy"
