"""The chooser contract: what a processor (or any route) asks for the attention itself.

A chooser chooses a backend and runs it on (B, H, N, D) tensors: :class:`FixedChooser`
is one named backend; :class:`~attnkit.choose.auto.AutoChooser` is auto()'s walk. Every
route of attnkit (its diffusers processor, dispatch_attention_fn, a stock processor's
scaled_dot_product_attention call, context parallelism's shards) calls
``chooser.attention(who, q, k, v, attn_bias, scale, upcast, ...)``, and a chooser calls a
backend through :func:`run_backend`.
"""

from __future__ import annotations

import os
from typing import Protocol

import torch
from torch import nn

from ..backends import AttentionCall, Backend, BackendUnavailable, Signature, signature
from ..backends.base import compile_key
from ..text import describe_module
from .compiling import CompileOwner, compile_owner, is_compiling, mark_compile_constant

# ATTNKIT_CHECK_FINITE=1: stop at the first attention whose inputs or output hold NaN or
# inf, naming the module (a debugging aid for black images; it synchronises every call).
CHECK_FINITE_VAR = "ATTNKIT_CHECK_FINITE"


def _check_finite(who: nn.Module | None, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        bad = ~torch.isfinite(t)
        if name == "attn_bias":
            bad = torch.isnan(t)  # -inf is how a mask says "ignore"
        if is_compiling():
            # Inside a graph: no host sync (CUDA graphs stay capturable), an assert the
            # device raises instead; the module is named by eager calls only.
            torch._assert_async(
                ~bad.any(),
                f"{CHECK_FINITE_VAR}: {name} of a compiled attention call holds a "
                f"non-finite value ({t.dtype}); run the model eagerly to have the module named",
            )
            continue
        count = int(bad.sum())
        if count:
            raise FloatingPointError(
                f"{CHECK_FINITE_VAR}: {name} of {describe_module(who)} holds {count} non-finite "
                f"value(s) ({t.dtype}, shape {tuple(t.shape)}). In fp16 this is usually an overflow "
                "above 65504 before attention: run the model in bfloat16 or float32, or set "
                "upcast_attention on the module; unset the variable to skip this check."
            )


class Chooser(Protocol):
    """What a processor asks for the attention itself: it chooses a backend (one fixed
    backend, or auto()'s walk) and runs it on (B, H, N, D) tensors. ``who`` is the
    module, for logs and errors."""

    def attention(
        self,
        who: nn.Module | None,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_bias: torch.Tensor | None,
        scale: float | None,
        upcast: bool,
        *,
        causal_offset: int | None = None,
        dropout_p: float = 0.0,
        return_lse: bool = False,
    ): ...


def run_backend(backend: Backend, q, k, v, attn_bias, scale, upcast, causal_offset, dropout_p, return_lse):
    """Call ``backend`` as a call asks: forward_with_lse when the caller needs the LSE,
    and the causal and dropout arguments only when they are set (a backend that does
    not declare them is never handed one)."""
    if return_lse:
        return backend.forward_with_lse(q, k, v, attn_bias, scale, upcast, causal_offset=causal_offset)
    if causal_offset is None and dropout_p == 0.0:
        return backend.forward(q, k, v, attn_bias, scale, upcast)
    return backend.forward(q, k, v, attn_bias, scale, upcast, causal_offset=causal_offset, dropout_p=dropout_p)


def finite_checked(who, run, q, k, v, attn_bias, scale, upcast, causal_offset, dropout_p, return_lse):
    """``run(...)`` with ATTNKIT_CHECK_FINITE's checks of its inputs and output, naming
    ``who``: every route's calls pass here (a debugging aid: it syncs with the device)."""
    _check_finite(who, q=q, k=k, v=v, **({} if attn_bias is None else {"attn_bias": attn_bias}))
    out = run(
        who, q, k, v, attn_bias, scale, upcast, causal_offset=causal_offset, dropout_p=dropout_p, return_lse=return_lse
    )
    _check_finite(who, output=out[0] if return_lse else out)
    return out


def check_finite_on() -> bool:
    return os.environ.get(CHECK_FINITE_VAR, "") not in ("", "0")


def call_flags(causal_offset, dropout_p: float, return_lse: bool) -> tuple[bool, bool, bool]:
    """(causal, dropout, lse): the flags of a call's signature, as plain bools. Under
    torch.compile(dynamic=True) ``dropout_p > 0.0`` is symbolic, and the trace-time
    choice takes constants only."""
    return causal_offset is not None, True if dropout_p > 0.0 else False, return_lse


class ChooserBase(CompileOwner):
    """What every chooser's ``attention`` does before its own ``_attention``: the
    ATTNKIT_CHECK_FINITE checks, read when the chooser is made, for every route."""

    check_finite = False

    def attention(self, who, q, k, v, attn_bias, scale, upcast, *, causal_offset=None, dropout_p=0.0, return_lse=False):
        if self.check_finite:
            return finite_checked(
                who, self._attention, q, k, v, attn_bias, scale, upcast, causal_offset, dropout_p, return_lse
            )
        return self._attention(
            who,
            q,
            k,
            v,
            attn_bias,
            scale,
            upcast,
            causal_offset=causal_offset,
            dropout_p=dropout_p,
            return_lse=return_lse,
        )

    def _attention(
        self, who, q, k, v, attn_bias, scale, upcast, *, causal_offset=None, dropout_p=0.0, return_lse=False
    ):
        raise NotImplementedError

    def resolved(self, sig: Signature) -> Backend | None:
        """The backend that calls of ``sig`` run once decided, when nothing else is done
        per call (a caller may then keep it per call signature and call its ``forward``
        itself, retrying through :meth:`attention` if it raises); None otherwise (not
        decided yet, refused, or ATTNKIT_CHECK_FINITE's checks on)."""
        return None


class FixedChooser(ChooserBase):
    """One named backend. A call it cannot serve raises :class:`BackendUnavailable` with
    every reason; it never silently hands the call to another backend."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._reasons: dict[Signature, list[str]] = {}
        self.check_finite = check_finite_on()
        self._take_compile_token()
        mark_compile_constant(_fixed_problem)

    def _attention(
        self, who, q, k, v, attn_bias, scale, upcast, *, causal_offset=None, dropout_p=0.0, return_lse=False
    ):
        flags = call_flags(causal_offset, dropout_p, return_lse)
        if is_compiling():
            problem = _fixed_problem(self.compile_token, compile_key(q, k, v, attn_bias, *flags))
            if problem:
                raise BackendUnavailable(problem, reasons={self.backend.name: [problem]})
        else:
            sig = signature(q, k, v, attn_bias, *flags)
            reasons = self._reasons.get(sig)
            if reasons is None:
                reasons = self._reasons[sig] = self.backend.not_supported_reasons(AttentionCall.from_signature(sig))
            if reasons:
                raise BackendUnavailable(self.refusal(who, reasons), reasons={self.backend.name: reasons})
        return run_backend(self.backend, q, k, v, attn_bias, scale, upcast, causal_offset, dropout_p, return_lse)

    def resolved(self, sig: Signature) -> Backend | None:
        if self.check_finite or self._reasons.get(sig) != []:
            return None
        return self.backend

    def refusal(self, who: nn.Module | None, reasons: list[str]) -> str:
        what = describe_module(who) if who is not None else "this call"
        return (
            f"attnkit backend {self.backend.name!r} cannot serve {what}: "
            + "; ".join(reasons)
            + ". Choose another processor (attnkit.auto() picks one that can run; "
            "`attnkit info` lists every backend and its limits)."
        )

    def describe(self) -> str:
        return repr(self.backend)


def _fixed_problem(token: str, key: tuple) -> str:
    """Run by torch.compile while tracing (a trace-time constant): "" when the backend of
    the FixedChooser with this compile_token can serve calls of this signature (a
    compile_key), else the refusal message."""
    chooser = compile_owner(token)
    reasons = chooser.backend.not_supported_reasons(AttentionCall.from_signature(Signature(*key)))
    return chooser.refusal(None, reasons) if reasons else ""


__all__ = [
    "CHECK_FINITE_VAR",
    "Chooser",
    "ChooserBase",
    "FixedChooser",
    "call_flags",
    "check_finite_on",
    "finite_checked",
    "run_backend",
]
