"""torch.compile helpers: whether we are being traced, and trace-time constants.

A processor's decision (can this backend serve the call, which backend auto() takes) is
made in plain Python while torch.compile traces, and its answer becomes a constant of
the graph: no cache is read or written inside the compiled region (that would add
guards and force recompiles), and the selection costs nothing at run time.
"""

from __future__ import annotations

import importlib
import itertools
import weakref
from typing import Any, Callable, TypeVar

import torch

try:
    from torch.compiler import is_compiling
except ImportError:  # torch < 2.3

    def is_compiling() -> bool:
        return importlib.import_module("torch._dynamo").is_compiling()


F = TypeVar("F", bound=Callable)


def mark_compile_constant(fn: F) -> F:
    """Have torch.compile run ``fn`` in plain Python while tracing and treat its result
    as a constant of the graph (its arguments must be constants too). Idempotent.

    Called when a processor is made, not at import: it imports torch._dynamo, which
    takes about a second (diffusers has imported it by then anyway).
    """
    if not getattr(fn, "_attnkit_marked", False):
        mark = getattr(torch.compiler, "assume_constant_result", None)
        if mark is None:  # torch < 2.2
            mark = importlib.import_module("torch._dynamo").assume_constant_result
        mark(fn)  # marks the function itself
        setattr(fn, "_attnkit_marked", True)
    return fn


class CompileOwner:
    """A mixin for an object whose trace-time constants (mark_compile_constant) need it:
    they get its ``compile_token``, a string, in its stead.

    torch.compile calls a trace-time constant with constant arguments only, and before
    torch 2.13 an object of a user class is not one (InternalTorchDynamoError:
    "UserDefinedObjectVariable(...) is not a constant"). A string is, always: an int
    read from an object passed to the compiled function becomes symbolic when a second
    object brings another value. :func:`compile_owner` finds the object again. A copy or
    an unpickled object gets a token of its own, and leaves behind the caches that
    routes.py keeps on the original (``_attnkit_*``: they hold what was bound to it).
    Call ``_take_compile_token()`` in ``__init__``.
    """

    compile_token: str

    def _take_compile_token(self) -> None:
        self.compile_token = f"attnkit-{next(_TOKENS)}"
        _OWNERS[self.compile_token] = self

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "compile_token" and not k.startswith("_attnkit_")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._take_compile_token()


# token -> its live owner, for compile_owner (weak: an entry leaves with its owner)
_TOKENS = itertools.count(1)
_OWNERS: "weakref.WeakValueDictionary[str, CompileOwner]" = weakref.WeakValueDictionary()


def compile_owner(token: str) -> Any:
    """The object whose compile_token this is (typed Any: its caller knows its class)."""
    return _OWNERS[token]


__all__ = ["CompileOwner", "compile_owner", "is_compiling", "mark_compile_constant"]
