"""auto()'s chooser: per call, the first backend that can serve it.

    unet.set_attn_processor(attnkit.auto())

(:func:`attnkit.auto` and its processor, :class:`~attnkit.diffusers.processor.AutoProcessor`,
are diffusers' side; the decision, here, knows nothing of diffusers.)

How a backend is chosen
-----------------------
Each call is reduced to its :class:`~attnkit.backends.Signature` (device, dtype, head
dim, lengths, batch, heads, mask kind, grad, ...). The first call of a signature walks
the device's priority list (:mod:`attnkit.choose.policy`) and takes the first backend with no
reason against it; the decision is cached, so later calls of the signature cost one
tuple and one dict lookup more than the backend itself. Each decision is logged once at
INFO on the "attnkit" logger, naming the first module that needed it and why the
backends before the chosen one were skipped; ``processor.explain()`` returns every
decision as a table.

Overrides
---------
* ``ATTNKIT_BACKEND=name`` in the environment (read when auto() is called) forces one
  backend: auto() then behaves as that named processor and raises
  :class:`BackendUnavailable` with its reasons for a call it cannot serve.
* ``auto(order=[...])`` replaces the per-hardware lists with your own order;
  ``auto(exclude=[...])`` never picks the named backends;
  ``auto(backend_options={"sliced": {"slice_size": 2}})`` passes constructor options;
  ``auto(backends={"sdpa": my_backend})`` supplies instances.

Failures at run time
--------------------
If the chosen backend raises (out of memory, a kernel that does not build, a package
broken at import), auto() logs a warning once, remembers the failure for that signature
and runs the next candidate: the result is still correct. (Inside a torch.compile'd
graph, errors are raised as they are: a graph cannot re-run a different backend.)

Tuning
------
``auto(tune=True)``: on the first call of a signature, every candidate that can serve
it is run on the real inputs and its output compared with the priority choice's (one
that differs beyond the project's tolerance rule is never chosen, and a warning names
it); the priority choice and those that passed are timed in ``tune_iters`` interleaved
rounds, and a candidate replaces the priority choice only when its median per-round gain
is at least ``tune_margin`` (0.05: 5% faster). What was measured is kept in a JSON file
shared by every process (:mod:`attnkit.choose.tune_cache`). With a single candidate
nothing is timed or written.

torch.compile
-------------
Under ``torch.compile`` the decision is made while tracing, in plain Python, by the same
walk, for the signature without its lengths (they may be symbolic there). Only the
chosen backend's computation is traced, so ``fullgraph=True`` works and the selection
costs nothing at run time.

Where the parts live
--------------------
This module holds the walk, the fall-back and the compile-time choice. The tuning
(:mod:`attnkit.choose.tuning`) and ``lossy="int8"``'s path under its guard
(:mod:`attnkit.choose.lossy`) are mixins of :class:`AutoChooser`; a decision's record and
the words it is told in are :mod:`attnkit.choose.decision`'s.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, cast

from .. import block_masks
from ..backends import AttentionCall, Backend, BackendUnavailable, Signature, signature
from ..backends.base import compile_key
from ..text import describe_exception, describe_module
from . import policy, tune_cache, tune_check
from .compiling import compile_owner, is_compiling, mark_compile_constant
from .decision import Decision, format_decision, log_line
from .fixed import ChooserBase, call_flags, check_finite_on, run_backend
from .guard import GuardState, guard_options
from .lossy import Lossy
from .policy import CANDIDATES, LOCK, describe_call, installed_packages
from .tuning import Tuned

logger = logging.getLogger("attnkit")

ENV_VAR = "ATTNKIT_BACKEND"
# Call signatures an AutoChooser keeps (its decisions, their records for explain(), the
# compiled choices): a process whose shapes never repeat (a server at every resolution)
# drops the oldest beyond this, and decides them again if they come back. The warn-once
# notes are forgotten together, at four times this.
DECISIONS_MAX = 4096


class _Slot:
    """A fixed holder for one candidate's instance, filled on first use. The compiled
    path reads instances through these, so the structure it guards on never changes."""

    __slots__ = ("backend",)

    def __init__(self, backend: Backend | Exception | None = None) -> None:
        self.backend = backend


class AutoChooser(Lossy, Tuned, ChooserBase):
    """The decision behind :func:`auto`: per signature, the first backend of the walk."""

    _dropped = 0  # what a chooser pickled before DECISIONS_MAX has
    # The signatures a chooser keeps decisions for (DECISIONS_MAX; a test sets a chooser's
    # own smaller bound on the instance).
    decisions_max = DECISIONS_MAX

    def __init__(
        self,
        *,
        tune: bool = False,
        cache_path: str | os.PathLike | None = None,
        order: Sequence[str] | None = None,
        exclude: Iterable[str] = (),
        backend_options: Mapping[str, Mapping[str, Any]] | None = None,
        backends: Mapping[str, Backend] | None = None,
        tune_iters: int = 7,
        tune_margin: float = tune_check.DEFAULT_MARGIN,
        lossy: Any = None,
        guard: Any = None,
    ) -> None:
        self.tune = bool(tune)
        if not (lossy is None or lossy == "int8" or type(lossy).__name__ == "BlockMask"):
            raise ValueError(
                f"lossy={lossy!r}: the lossy backend attnkit has is 'int8', or sparse attention under a FlexAttention "
                "BlockMask (attnkit.sparse_video.sliding_tile(...) or radial(...)) (None: exact backends only)"
            )
        if guard is not None and lossy is None:
            raise ValueError("guard= sets the quality guard of a lossy backend: pass lossy='int8' with it")
        self.lossy = lossy
        self.guard = guard_options(guard) if lossy is not None else None
        self._lossy_backend: Backend | Exception | None = None
        self._lossy_reasons: dict[Signature, tuple[str, ...]] = {}
        self._guards: dict[tuple[int, Signature], GuardState] = {}
        self.cache_path = Path(cache_path) if cache_path is not None else tune_cache.default_cache_path()
        self.order = None if order is None else policy.validate_labels(order, "order")
        self.exclude = frozenset(policy.validate_labels(exclude, "exclude"))
        backend_options = dict(backend_options or {})
        policy.validate_labels(backend_options, "backend_options")
        backends = dict(backends or {})
        policy.validate_labels(backends, "backends")
        if not isinstance(tune_iters, int) or isinstance(tune_iters, bool) or tune_iters < 1:
            raise ValueError(f"tune_iters={tune_iters!r}: use a positive int")
        self.tune_iters = tune_iters
        self.tune_margin = tune_check.check_margin(tune_margin)
        forced: str | None = os.environ.get(ENV_VAR, "").strip()
        if forced in ("", "auto"):
            forced = None
        elif forced not in CANDIDATES:
            raise ValueError(
                f"{ENV_VAR}={forced!r} is not a backend; set it to one of "
                f"{', '.join(CANDIDATES)} (or unset it to let auto() choose)"
            )
        self.forced: str | None = forced
        self.check_finite = check_finite_on()
        self._slots = {label: _Slot() for label in CANDIDATES}
        for label, opts in backend_options.items():
            # bad options are the caller's mistake: say so now, not as a skipped backend
            backend = policy.make_backend(label, opts)
            if isinstance(backend, (TypeError, ValueError)):
                raise ValueError(f"backend_options[{label!r}]: {backend}") from backend
            self._slots[label].backend = backend
        for label, backend in backends.items():
            if not isinstance(backend, Backend):
                raise TypeError(f"backends[{label!r}] is a {type(backend).__name__}, not an attnkit Backend")
            self._slots[label].backend = backend
        # Stale: never (what decides a signature's backend is in the signature, or in this
        # chooser's options, fixed at construction); a fall-back replaces an entry.
        # Bounded by DECISIONS_MAX, the oldest first.
        self._decisions: dict[Signature, Backend] = {}  # the hot path
        self._records: dict[Signature, Decision] = {}  # explain()
        self._compiled: dict[Signature, str] = {}  # signature without lengths -> label
        self._dropped = 0  # signatures dropped to keep DECISIONS_MAX
        self._warned: set = set()
        self._disk: dict[str, dict] | None = None
        self._take_compile_token()
        mark_compile_constant(_compiled_choice)

    # -- the per-call path ----------------------------------------------------------
    def _attention(
        self, who, q, k, v, attn_bias, scale, upcast, *, causal_offset=None, dropout_p=0.0, return_lse=False
    ):
        flags = call_flags(causal_offset, dropout_p, return_lse)
        args = (q, k, v, attn_bias, scale, upcast, causal_offset, dropout_p, return_lse)
        if is_compiling():
            label = _compiled_choice(self.compile_token, compile_key(q, k, v, attn_bias, *flags))
            return run_backend(self._slots[label].backend, *args)
        sig = signature(q, k, v, attn_bias, *flags)
        if self.lossy is not None and self.forced is None:
            out = self._lossy_attention(who, sig, args)
            if out is not None:
                return out
        backend = self._decisions.get(sig)
        if backend is None:
            backend = self._decide(sig, who, args)
        try:
            return run_backend(backend, *args)
        except Exception as exc:
            return self._fall_back(sig, exc, who, args)

    def resolved(self, sig: Signature) -> Backend | None:
        """The backend decided for ``sig`` (None before the first call of it, with
        ATTNKIT_CHECK_FINITE's checks on, or with a lossy backend, whose guard sees every
        call). After a fall-back it is the new one."""
        if self.check_finite or self.lossy is not None:
            return None
        return self._decisions.get(sig)

    # -- deciding -------------------------------------------------------------------
    def backend(self, label: str) -> Backend | Exception:
        """The instance auto() uses for ``label`` (made on first use)."""
        slot = self._slots[label]
        if slot.backend is None:
            slot.backend = policy.default_backend(label)
        return slot.backend

    def order_for(self, call: AttentionCall) -> tuple[str, tuple[str, ...]]:
        """(what the order is called, the order) for a call."""
        if self.forced is not None:
            return f"{ENV_VAR}={self.forced}", (self.forced,)
        if self.order is not None:
            return "order=" + ">".join(self.order), self.order
        return policy.order_for(call)

    def walk(self, call: AttentionCall, failed: Mapping[str, str] | None = None):
        """(label or None, table, order name): :func:`attnkit.choose.policy.walk` with this
        chooser's order, exclusions (not when forced) and instances."""
        name, order = self.order_for(call)
        exclude = () if self.forced is not None else self.exclude
        label, table = policy.walk(call, order, self.backend, exclude, failed)
        return label, table, name

    def _unavailable(self, call: AttentionCall, table, module: str) -> BackendUnavailable:
        if self.forced is not None:
            return BackendUnavailable(
                f"{ENV_VAR}={self.forced} forces attnkit backend {self.forced!r}, which cannot "
                f"serve {module} ({describe_call(call)}): {'; '.join(table[self.forced])}. "
                f"Unset {ENV_VAR} to let auto() choose (`attnkit info` lists every backend).",
                reasons=table,
            )
        return policy.no_backend_error(f"attnkit.auto() found no backend for {module} ({describe_call(call)})", table)

    def _decide(self, sig, who, args) -> Backend:
        with LOCK:
            backend = self._decisions.get(sig)
            if backend is not None:
                return backend
            call = AttentionCall.from_signature(sig, installed_packages())
            label, table, order = self.walk(call)
            module = describe_module(who)
            if label is None:
                raise self._unavailable(call, table, module)
            how = "forced" if self.forced else "priority"
            ms: dict[str, float] = {}
            tuned: dict[str, Any] = {}
            if self.tune and self.forced is None:
                label, how, ms, tuned = self._tuned(call, table, args)
            record = Decision(call, label, table, order, module, how, ms, **tuned)
            self._make_room(self._records, self._decisions)
            self._records[sig] = record
            # walk() never takes a label whose backend could not be made (its reasons say why)
            chosen = self._decisions[sig] = cast(Backend, self.backend(label))
            logger.info("%s", log_line(record))
            return chosen

    def _make_room(self, *tables: dict) -> None:
        """Under LOCK: drop the oldest signature of ``tables`` when they hold DECISIONS_MAX."""
        first = tables[0]
        if len(first) < self.decisions_max:
            return
        oldest = next(iter(first))
        for table in tables:
            table.pop(oldest, None)
        self._dropped += 1
        if len(self._warned) >= 4 * self.decisions_max:
            self._warned.clear()

    def _warn_once(self, what, msg, *args) -> None:
        if what not in self._warned:
            self._warned.add(what)
            logger.warning(msg, *args)

    def _note_once(self, what, msg, *args) -> None:
        if what not in self._warned:
            self._warned.add(what)
            logger.info(msg, *args)

    # -- failures at run time -------------------------------------------------------
    def _fall_back(self, sig, exc, who, args):
        """The next backends of the walk, tried in turn; the signature is handed to one only
        once it has served the call. When every backend fails, the input is at fault (a
        shape no backend takes, ...): the first error is raised and nothing is demoted."""
        if self.forced is not None:
            raise exc
        first = exc
        with LOCK:
            record = self._records.get(sig)
        if record is None:  # dropped meanwhile (DECISIONS_MAX): decided again, then fallen back from
            self._decide(sig, who, args)
            with LOCK:
                record = self._records.get(sig)
            if record is None:
                raise exc
        failed = dict(record.failed)
        failed_label = record.backend
        while True:
            failed[failed_label] = describe_exception(exc)
            label, table, _ = self.walk(record.call, failed)
            if label is None:
                raise first
            try:
                out = run_backend(self.backend(label), *args)
            except Exception as e:
                exc, failed_label = e, label
                continue
            for bad in [x for x in failed if x not in record.failed]:
                self._warn_once(
                    ("failed", sig, bad),
                    "attnkit.auto(): %s failed on %s (%s) in %s; falling back to %s for this signature "
                    "(explain() shows it)",
                    bad,
                    describe_call(record.call),
                    failed[bad],
                    describe_module(who),
                    label,
                )
            with LOCK:
                self._records[sig] = replace(record, backend=label, table=table, how="fallback", failed=failed)
                self._decisions[sig] = self.backend(label)
            return out

    # -- under torch.compile ------------------------------------------------------------
    def choose_for_compile(self, sig: Signature) -> str:
        """The label for a signature without lengths: what eager calls of it chose (after
        tuning or a failure), else the walk's first choice."""
        with LOCK:
            label = self._compiled.get(sig)
            if label is not None:
                return label
            call = AttentionCall.from_signature(sig, installed_packages())
            first, table, order = self.walk(call)
            if first is None:
                raise self._unavailable(call, table, "a compiled attention module")
            seen = Counter(r.backend for s, r in self._records.items() if s.for_compile() == sig)
            label = first
            if seen:
                common = seen.most_common(1)[0][0]
                if not table.get(common, ["not in the order"]):
                    label = common
            self.backend(label)
            self._make_room(self._compiled)
            self._compiled[sig] = label
            logger.info("%s", log_line(Decision(call, label, table, order, "torch.compile graph", "compile")))
            return label

    # -- explaining -----------------------------------------------------------------
    @property
    def decisions(self) -> list[Decision]:
        """Every decision so far, in the order they were made."""
        return list(self._records.values())

    def explain(self, call: AttentionCall | None = None) -> str:
        """The decision table: per call signature, the chosen backend and, for every
        candidate in priority order, why it can or cannot run (and timings if tuned).

        With ``call``, the table for that one (possibly hypothetical) call instead.
        """
        if call is not None:
            if call.packages is None:
                call = replace(call, packages=installed_packages())
            label, table, order = self.walk(call)
            return format_decision(Decision(call, label or "(none)", table, order, "-", "priority"))
        dropped = f" (and {self._dropped} older, no longer kept)" if self._dropped else ""
        lines = [f"{self.describe()}: {len(self._records)} call signature(s){dropped}"]
        if self.lossy is not None:
            lines.append(self._describe_lossy())
        if not self._records and not self._compiled and not self.guard_states() and not self._block_mask_calls():
            lines.append("  no attention call yet: run the model once, or pass an AttentionCall")
        for record in self._records.values():
            lines.append(format_decision(record))
        for sig, label in self._compiled.items():
            call = AttentionCall.from_signature(sig)
            lines.append(f"[compiled] {describe_call(call)} -> {label}")
        for (dev, dtype, d, m, n), (route, why, calls) in self._block_mask_calls().items():
            lines.append(f"[BlockMask] {dev} {dtype} D={d} M={m} N={n} -> {route} ({why}); {calls} call(s)")
        return "\n".join(lines)

    def note_block_mask(self, q, k, v) -> None:
        """A BlockMask call attnkit.block_masks computes for this chooser's model: counted
        by shape for explain(), with its route and why."""
        key = (q.device.type, str(q.dtype).replace("torch.", ""), q.shape[-1], q.shape[2], k.shape[2])
        table = self._block_mask_calls()
        seen = table.get(key)
        if seen is None:
            if len(table) >= DECISIONS_MAX:
                table.pop(next(iter(table)))
            seen = table[key] = [*block_masks.route(q, k, v), 0]
        seen[2] += 1

    def _block_mask_calls(self) -> dict:
        """Shape -> [route, why, calls] of the BlockMask calls noted, for explain(); stale
        never (a shape's route is fixed), bounded by DECISIONS_MAX. Made on first use (a
        chooser pickled before it has none)."""
        return vars(self).setdefault("_block_masked", {})

    def describe(self) -> str:
        opts = []
        if self.tune:
            opts.append(f"tune=True, cache_path={str(self.cache_path)!r}")
            if self.tune_margin != tune_check.DEFAULT_MARGIN:
                opts.append(f"tune_margin={self.tune_margin!r}")
        if self.order is not None:
            opts.append(f"order={list(self.order)!r}")
        if self.exclude:
            opts.append(f"exclude={sorted(self.exclude)!r}")
        if self.forced:
            opts.append(f"forced by {ENV_VAR}={self.forced!r}")
        if self.lossy is not None:
            named = repr(self.lossy) if isinstance(self.lossy, str) else self._lossy_name()
            opts.append(f"lossy={named}" + ("" if self.guard is not None else ", guard=False"))
        return f"AutoProcessor({', '.join(opts)})"


def _compiled_choice(token: str, key: tuple) -> str:
    """Run by torch.compile while tracing, in plain Python: the label of the backend the
    AutoChooser with this compile_token takes for a signature (a compile_key). The result
    is a constant of the graph; no selection code is traced."""
    return compile_owner(token).choose_for_compile(Signature(*key))


# auto()'s options: AutoChooser's keyword arguments, read from it so that the two never differ
AUTO_OPTIONS = tuple(name for name in inspect.signature(AutoChooser.__init__).parameters if name != "self")


__all__ = ["AUTO_OPTIONS", "AutoChooser", "Decision", "ENV_VAR", "format_decision", "log_line"]
