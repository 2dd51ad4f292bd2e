"""The ways of setting a transformer's attention that table 5 compares, one per column.

Each setting is a function of the model and its attention modules that makes the setting
and says in words what it reached, or raises NotApplicable with the reason it cannot be
made here. The compiled columns add torch.compile of the repeated blocks
(:class:`RegionalCompiled`), installed only while their column runs, so the other columns
run the same blocks eager.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch import nn

import attnkit

from .context import Compiled, raise_cache_limits
from .measure import clip, describe, is_oom
from .presets import ROUTE_1, ROUTE_2


class NotApplicable(Exception):
    """A way of setting attention that does not apply to this model or machine."""


def route_of(stock: dict[nn.Module, Any]) -> str:
    """Which of the two routes the model's stock processors take."""

    return ROUTE_1 if any(hasattr(p, "_attention_backend") for p in stock.values()) else ROUTE_2


def _stock(model: nn.Module, modules: list[nn.Module]) -> str:
    return f"{len(modules)} attention modules, their own processors, diffusers' default backend"


def _diffusers_backend(name: str) -> Callable[[nn.Module, list[nn.Module]], str]:
    def set_backend(model: nn.Module, modules: list[nn.Module]) -> str:
        model.set_attention_backend(name)
        # diffusers sets the backend on processors that dispatch through it and passes
        # over the others without a word: count what it reached.
        reached = sum(1 for m in modules if getattr(m.processor, "_attention_backend", None) == name)
        if not reached:
            kinds = sorted({type(m.processor).__name__ for m in modules})
            raise NotApplicable(
                f"set_attention_backend({name!r}) reaches none of the {len(modules)} attention "
                f"modules (their {', '.join(kinds)} call attention themselves)"
            )
        return f"{reached} of {len(modules)} attention modules"

    return set_backend


def _attnkit_apply(model: nn.Module, modules: list[nn.Module]) -> str:
    where = attnkit.apply(model, attnkit.auto())  # {module: "attnkit..." or the processor kept}
    if not isinstance(where, dict):
        return clip(f"attnkit.apply returned {where!r}", 120)
    served = sum(1 for v in where.values() if str(v).startswith("attnkit"))
    kept = sorted({str(v) for v in where.values() if not str(v).startswith("attnkit")})
    if not served:
        raise NotApplicable(f"attnkit.apply kept every module's own processor ({', '.join(kept)})")
    return f"{served} of {len(where)} attention modules to attnkit" + (f", kept {', '.join(kept)}" if kept else "")


# In the order measured: the comparison the table is for first (diffusers' native backend
# against attnkit's two routes), then diffusers' fused kernels, then stock, which on a
# route-1 model is native again: the pair's difference is the run's noise floor.
SETTINGS: dict[str, Callable[[nn.Module, list[nn.Module]], str]] = {
    "native": _diffusers_backend("native"),
    "attnkit": _diffusers_backend("attnkit"),
    "attnkit.apply": _attnkit_apply,
    # lossy (docs/int8.md): its row carries its output's difference from the attnkit row's
    "attnkit int8": _diffusers_backend("attnkit_int8"),
    "flash": _diffusers_backend("flash"),
    "sage": _diffusers_backend("sage"),
    "stock": _stock,
}


# How each setting is made, as a user would write it (shown in the table).
HOW = {
    "stock": "as built (diffusers' default)",
    "native": "set_attention_backend('native')",
    "flash": "set_attention_backend('flash')",
    "sage": "set_attention_backend('sage')",
    "attnkit": "set_attention_backend('attnkit')",
    "attnkit.apply": "attnkit.apply(model, attnkit.auto())",
    "attnkit int8": "set_attention_backend('attnkit_int8') (lossy: INT8 Q.K under the quality guard)",
}


# The compiled rows: a setting above, then torch.compile (default mode; fullgraph first,
# without it where that fails) of the same model object, no copy of a 12B model: of each
# repeated block where the model declares them (``_repeated_blocks``: Flux, Wan), as
# diffusers' ``compile_repeated_blocks`` does, one compilation per block class (Flux:
# seconds instead of minutes for the whole model); else of the whole model (SD3).
COMPILED_SETTINGS = {"attnkit + torch.compile": "attnkit", "native + torch.compile": "native"}
# Lossy settings -> the exact setting their output is compared with (the row's check).
LOSSY_SETTINGS = {"attnkit int8": "attnkit"}
for _name, _base in COMPILED_SETTINGS.items():
    HOW[_name] = f"{HOW[_base]}, then torch.compile (repeated blocks, or the model)"


class RegionalCompiled:
    """torch.compile of each repeated block of `net` (``net._repeated_blocks``), installed as
    nn.Module.compile installs it (``_compiled_call_impl``) only while this row runs, so
    that the other rows of the table run the same blocks eager. fullgraph=True first for
    all of them; where a block's call fails under it, every block is compiled again
    without it. Without repeated blocks, the whole model (:class:`.context.Compiled`)."""

    def __init__(self, net: nn.Module, backend: str):
        raise_cache_limits()  # every block runs nn.Module._call_impl: one code object, many graphs
        kinds = set(getattr(net, "_repeated_blocks", None) or ())
        self.blocks = [m for m in net.modules() if type(m).__name__ in kinds]
        self.whole = None if self.blocks else Compiled(net, None, backend)
        self.backend, self.fullgraph, self.fullgraph_error, self.called = backend, True, None, False
        self.fns = self._compile(True) if self.blocks else []

    def _compile(self, fullgraph: bool) -> list:
        return [torch.compile(m._call_impl, fullgraph=fullgraph, backend=self.backend) for m in self.blocks]

    def install(self) -> None:
        for i, m in enumerate(self.blocks):
            m._compiled_call_impl = self._guarded(i) if self.fullgraph else self.fns[i]

    def _guarded(self, i: int) -> Callable:
        """Block i's compiled call under fullgraph=True: where it fails, every block is
        compiled again without fullgraph (the error kept), and the call retried."""

        def call(*args, **kwargs):
            if not self.fullgraph:
                return self.fns[i](*args, **kwargs)
            try:
                out = self.fns[i](*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - retried without fullgraph, the first error kept
                if is_oom(exc):
                    raise
                self.fullgraph, self.fullgraph_error = False, describe(exc, 200)
                self.fns = self._compile(False)
                self.install()
                out = self.fns[i](*args, **kwargs)
            self.called = True
            return out

        return call

    def uninstall(self) -> None:
        for m in self.blocks:
            m._compiled_call_impl = None

    def __call__(self, *args, **kwargs):
        if self.whole is not None:
            return self.whole(*args, **kwargs)
        raise TypeError("regional compilation: call the model itself with the blocks installed")

    def info(self) -> dict:
        if self.whole is not None:
            return {**self.whole.info(), "scope": "whole model"}
        kinds = sorted({type(m).__name__ for m in self.blocks})
        tried = self.called or self.fullgraph_error is not None
        return {
            "mode": "default",
            "backend": self.backend,
            "fullgraph": self.fullgraph if tried else None,
            "fullgraph_error": self.fullgraph_error,
            "scope": f"repeated blocks: {len(self.blocks)} ({', '.join(kinds)})",
        }


def resolve_settings(spec: str | None) -> list[str]:
    """`None`/"all" -> every setting, the compiled ones last; else a comma-separated list, checked."""
    known = [*SETTINGS, *COMPILED_SETTINGS]
    if spec is None or spec.strip() in ("", "all"):
        return known
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown attention setting(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    return list(dict.fromkeys(names))


def _default_backend() -> contextlib.AbstractContextManager:
    """diffusers' default active backend for the duration (restored after)."""
    try:
        from diffusers.models.attention_dispatch import attention_backend
        from diffusers.utils.constants import DIFFUSERS_ATTN_BACKEND
    except ImportError:  # a diffusers without attention backends: nothing to keep stock
        return contextlib.nullcontext()
    return attention_backend(DIFFUSERS_ATTN_BACKEND)
