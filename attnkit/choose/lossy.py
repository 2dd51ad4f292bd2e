"""auto(lossy="int8"): the lossy backend first where it can serve a call, under its quality
guard (:mod:`attnkit.choose.guard`); the exact walk serves everything else.

auto(lossy=block_mask), a FlexAttention BlockMask (attnkit.sparse_video's builders): every
call it fits (no mask of its own, its queries and keys the mask's lengths, no causal mask,
dropout or log-sum-exp) is computed as sparse attention under that mask
(block_masks.block_mask_attention), under the same guard, which compares sampled rows with
full attention.

With ``lossy=`` set (and no backend forced by ATTNKIT_BACKEND) this path runs before the
exact decision on every eager call and keeps its own state (per signature, whether int8
can serve it; per module and signature, the guard's figures). It is a mixin of its own so
that the AutoChooser's body stays the exact walk: a chooser without ``lossy=`` never
enters it, and where the guard falls back it hands the call to the chooser's exact
decision (``_decisions``, ``_decide``), which it only reads.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..backends import AttentionCall, Backend, Signature
from ..block_masks import block_mask_attention
from ..block_masks import check as check_block_mask
from ..text import describe_exception, describe_module
from .fixed import run_backend
from .guard import GuardState, checked_rows, compare, sample_inputs
from .policy import describe_call, installed_packages

logger = logging.getLogger("attnkit")


class Lossy:
    """The AutoChooser's lossy backend and its guard (a mixin: it reads the chooser's
    ``lossy``, ``guard``, ``_lossy_backend``, ``_lossy_reasons``, ``_guards``, its exact
    decisions and its warn-once notes, all set by the chooser's constructor)."""

    # No lossy backend: what a chooser pickled before these options existed unpickles as.
    lossy: Any = None  # "int8", a BlockMask (sparse attention) or None
    guard: dict | None = None
    # Set by the AutoChooser's constructor; declared here, without a value, for the type checker.
    _lossy_backend: Backend | Exception | None
    _lossy_reasons: dict[Signature, tuple[str, ...]]
    _guards: dict[tuple[int, Signature], GuardState]

    def _lossy(self) -> Backend | Exception:
        if self._lossy_backend is None:
            try:
                from ..backends.int8 import Int8Backend  # see tests/test_import_graph.py's LAZY_ALLOWED

                self._lossy_backend = Int8Backend()
            except Exception as exc:  # noqa: BLE001 - said as the reason it cannot serve
                self._lossy_backend = exc
        return self._lossy_backend

    @property
    def _sparse(self) -> bool:
        return self.lossy is not None and not isinstance(self.lossy, str)

    def _lossy_name(self) -> str:
        """The lossy backend in words: 'int8', or what the sparse BlockMask computes."""
        if not self._sparse:
            return str(self.lossy)
        rule = self.lossy.mask_mod
        if hasattr(rule, "description"):
            return f"sparse {rule.description}"
        m, n = self.lossy.seq_lengths
        return f"sparse attention under a BlockMask for {m} queries and {n} keys"

    def _sparse_reasons(self, sig: Signature, args) -> tuple[str, ...]:
        q, k, _, attn_bias, _, _, causal_offset, dropout_p, return_lse = args
        m, n = self.lossy.seq_lengths
        reasons = []
        if (q.shape[2], k.shape[2]) != (m, n):
            reasons.append(f"{q.shape[2]} queries and {k.shape[2]} keys, the sparse mask is for {m} and {n}")
        else:
            try:
                check_block_mask(self.lossy, q.shape[0], q.shape[1], m, n)
            except ValueError as exc:
                reasons.append(str(exc))
        if attn_bias is not None and not (attn_bias.dim() == 4 and attn_bias.shape[1:3] == (1, 1)):
            reasons.append("the call has a mask of its own that is not a key mask (B, N)")
        if causal_offset not in (None, 0):
            reasons.append(f"a causal mask with offset {causal_offset} (the sparse mask combines with 0 only)")
        if dropout_p or return_lse:
            reasons.append("dropout or the log-sum-exp")
        return tuple(reasons)

    def _run_lossy(self, args):
        if not self._sparse:
            return run_backend(self._lossy_backend, *args)
        q, k, v, attn_bias, scale = args[:5]
        causal_offset = args[6]
        masks = self.__dict__.setdefault("_sparse_masks", {})
        mask = masks.get(q.device)
        if mask is None:
            mask = masks[q.device] = self.lossy.to(q.device)
        keys = None if attn_bias is None else key_mask_of(attn_bias, q.shape[0], k.shape[2])
        return block_mask_attention(q, k, v, mask, scale, keys=keys, causal=causal_offset == 0)

    def _lossy_attention(self, who, sig, args):
        """The lossy backend's output for this call, under the guard; None where it does
        not serve the call (it cannot, or the guard fell back for this module and
        signature): the exact path then serves it."""
        reasons = self._lossy_reasons.get(sig)
        if reasons is None:
            if self._sparse:
                reasons = self._sparse_reasons(sig, args)
            else:
                backend = self._lossy()
                if isinstance(backend, Exception):
                    reasons = (f"the int8 backend could not be loaded: {describe_exception(backend)}",)
                else:
                    call = AttentionCall.from_signature(sig, installed_packages())
                    reasons = tuple(backend.not_supported_reasons(call))
            self._lossy_reasons[sig] = reasons
        if reasons:
            return None
        # Keyed by the caller object (a module, or the dispatch route's one caller): its
        # name is made once, not on every call of the hot path.
        state = self._guards.get((id(who), sig))
        if state is None:
            state = self._guards.setdefault(
                (id(who), sig), GuardState(describe_module(who), describe_call(AttentionCall.from_signature(sig)))
            )
        if state.fallen_back:
            return None
        module = state.module
        q, k, v, attn_bias, scale, upcast, causal_offset, _, _ = args
        try:
            out = self._run_lossy(args)
        except Exception as exc:  # noqa: BLE001 - the exact path serves it, and says why once
            state.fallen_back = True
            self._warn_once(
                ("lossy", module, sig),
                "attnkit: the %s backend failed on %s (%s): %s; that module "
                "runs exactly for this call signature from now on",
                self._lossy_name(),
                module,
                state.call,
                describe_exception(exc),
            )
            return None
        state.calls += 1
        if self.guard is None or not state.due(self.guard["every"]):
            return out
        exact = self._decisions.get(sig) or self._decide(sig, who, args)
        g = self.guard
        rows = checked_rows(q, k, g)
        q_s, bias_s = sample_inputs(q, k, v, attn_bias, causal_offset, rows)
        reference = run_backend(exact, q_s, k, v, bias_s, scale, upcast, None, 0.0, False)
        error, cosine, row_error = compare(out.index_select(2, rows), reference)
        state.checks += 1
        state.error, state.cosine, state.row_error = error, cosine, row_error
        state.worst_error = max(state.worst_error, error)
        state.history.append((state.calls, error, cosine, row_error))
        if error <= g["max_error"] and row_error <= g["max_row_error"] and cosine >= g["min_cosine"]:
            return out
        state.fallen_back = True
        logger.warning(
            "attnkit: %s attention in %s [%s] measured a worst row's relative L2 error of %.3g, %.3g over all "
            "and a cosine of %.6f on %d checked query rows (call %d), beyond the guard's %.3g / %.3g / %.6f: that "
            "module runs %s exactly for this call signature from now on, this call included (processor.explain() "
            "lists every module's figures)",
            self._lossy_name(),
            module,
            state.call,
            row_error,
            error,
            cosine,
            len(rows),
            state.calls,
            g["max_row_error"],
            g["max_error"],
            g["min_cosine"],
            exact.name,
        )
        return run_backend(exact, *args)

    def guard_states(self) -> list[GuardState]:
        """Every module and call signature the lossy backend served, with its guard's
        figures and state."""
        return list(getattr(self, "_guards", {}).values())

    def _describe_lossy(self) -> str:
        g = self.guard
        what = (
            f"{self._lossy_name()} (LOSSY SPARSE: keys outside the mask are dropped)"
            if self._sparse
            else "int8 (LOSSY: INT8 query-key products)"
        )
        head = (
            f"  lossy backend {what} first where it can serve a call, "
            + (
                "without a quality guard"
                if g is None
                else f"under the quality guard: {g['rows']} evenly spread and {g['risky_rows']} most at risk query "
                f"rows checked exactly on the first call of each module and signature and one in {g['every']} "
                f"after, falling back past a worst row's relative L2 error of {g['max_row_error']:g}, "
                f"{g['max_error']:g} over all, or a cosine below {g['min_cosine']:g}"
            )
            + "; inside torch.compile graphs the exact backends serve every call"
        )
        lines = [head]
        for sig, reasons in self._lossy_reasons.items():
            if reasons:
                lines.append(
                    f"    {'the sparse mask' if self._sparse else 'int8'} cannot serve "
                    f"{describe_call(AttentionCall.from_signature(sig))}: {'; '.join(reasons)}"
                )
        lines += [f"    {state.describe()}" for state in self._guards.values()]
        return "\n".join(lines)


__all__ = ["Lossy"]


def key_mask_of(attn_bias: torch.Tensor, b: int, n: int) -> torch.Tensor:
    """A (B|1, 1, 1, N) additive key mask as (B, N) booleans (True = attend), for a sparse
    mask to combine with. ValueError where it holds values other than 0 and -inf (a bias
    a BlockMask cannot express): the lossy path then falls back to exact, saying so."""
    row = attn_bias[:, 0, 0, :].detach()
    keep = row == 0
    if not bool((keep | (row == float("-inf"))).all()):
        raise ValueError("the call's key mask holds values other than 0 and -inf, which a BlockMask cannot express")
    return keep.expand(b, n).contiguous()
