"""torch.compile helpers: whether we are being traced, and trace-time constants.

A processor's decision (can this backend serve the call, which backend auto() takes) is
made in plain Python while torch.compile traces, and its answer becomes a constant of
the graph: no cache is read or written inside the compiled region (that would add
guards and force recompiles), and the selection costs nothing at run time.
"""

from __future__ import annotations

import importlib
from typing import Callable, TypeVar

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
        fn._attnkit_marked = True
    return fn


__all__ = ["is_compiling", "mark_compile_constant"]
