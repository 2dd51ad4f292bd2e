"""Small text helpers shared by logs, errors, `attnkit info` and the benchmark: how a
failure, a module and the code making an attention call are named."""

from __future__ import annotations

import inspect
import sys

from torch import nn


def short(text: object, limit: int = 90) -> str:
    """``text`` on one line (whitespace collapsed), cut to ``limit`` characters with "…"."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def describe_exception(exc: BaseException, limit: int = 200) -> str:
    """ "Type: first line of the message", cut to ``limit``: how a failure is named in a log
    line or a table cell."""
    lines = str(exc).strip().splitlines()
    return short(f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__, limit)


def describe_module(attn: nn.Module | str | None) -> str:
    """A short label for error messages and logs: the module's name when known."""
    if attn is None:
        return "this call"
    if isinstance(attn, str):
        return attn
    if isinstance(attn, Caller):
        return attn.describe()
    name = getattr(attn, "_attnkit_name", None)
    heads = getattr(attn, "heads", "?")
    inner = getattr(getattr(attn, "to_q", None), "out_features", None)
    dims = f"heads={heads}" + (f", head_dim={inner // heads}" if inner and isinstance(heads, int) else "")
    label = f"{type(attn).__name__}({dims})"
    return f"{name} [{label}]" if name else label


_SNAPSHOT = sys.version_info < (3, 13)
_LIBRARIES = ("diffusers.", "torch.", "attnkit.")


class Caller:
    """Who makes an attention call that arrives without its module (a processor's
    dispatch_attention_fn or scaled_dot_product_attention call): found on the call stack
    only when a log line or an error names it, never on the hot path."""

    __slots__ = ("how",)

    def __init__(self, how: str) -> None:
        self.how = how

    def module(self) -> nn.Module | None:
        """The attention module whose call this is (None if none is on the stack)."""
        return self._find()[0]

    def describe(self) -> str:
        module, model = self._find()
        if module is None:
            return self.how
        if getattr(module, "_attnkit_name", None) is None and model is not None and model is not module:
            name = next((n for n, m in model.named_modules() if m is module), None)
            if name:
                module._attnkit_name = name
        return f"{describe_module(module)} ({self.how})"

    @staticmethod
    def _find() -> tuple[nn.Module | None, nn.Module | None]:
        """(the innermost attention module, the outermost module) on the call stack."""
        frame = sys._getframe(2)
        module = model = None
        while frame is not None:
            attn = owner = None
            code = frame.f_code
            if "attn" in code.co_varnames or "self" in code.co_varnames:
                local = frame.f_locals
                attn, owner = local.get("attn"), local.get("self")
                if (
                    _SNAPSHOT
                    and code.co_flags & inspect.CO_OPTIMIZED
                    and str(frame.f_globals.get("__name__")).startswith(_LIBRARIES)
                ):
                    # Before Python 3.13, f_locals of a function's frame is a copy kept on
                    # the frame until it returns: it would hold the locals of a library's
                    # long-lived frame (a pipeline's latents of an earlier step) alive.
                    # Code of the caller's own is left as it is (a debugger may be reading it).
                    local.clear()
            if module is None and isinstance(attn, nn.Module):
                module = attn
            if isinstance(owner, nn.Module):
                if module is None and hasattr(owner, "processor"):
                    module = owner
                model = owner  # the outermost module on the stack: the model
            frame = frame.f_back
        return module, model

    def __repr__(self) -> str:
        return self.how
