"""auto(tune=True): the tuning of a signature, on its first call.

The candidates that can serve the call are checked against the priority choice's output
and timed with it (:mod:`attnkit.choose.tune_check`), or the entry the cache file holds for
the signature is taken; what was measured is written to the file
(:mod:`attnkit.choose.tune_cache`, where the file's format and its rules are described).
"""

from __future__ import annotations

import logging
import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from ..backends.base import Backend, dtype_name
from ..text import describe_exception
from . import tune_check
from .fixed import run_backend
from .policy import CANDIDATES, LAST_RESORT, describe_call
from .tune_cache import (  # the names attnkit.choose.tuning had before tune_cache.py, importable here still
    CACHE_VERSION,
    LOCK_TIMEOUT_S,
    STALE_TMP_S,
    CacheError,
    CacheNotWritten,
    NotRegularFile,
    cache_key,
    default_cache_path,
    read_cache,
    read_raw,
    update_cache,
    valid_entry,
)

logger = logging.getLogger("attnkit")


# -- auto(tune=True): what the AutoChooser does with the timings and the cache file --------------------
class Tuned:
    """The AutoChooser's tuning (a mixin: it reads the chooser's ``order``,
    ``cache_path``, ``tune_iters``, ``tune_margin``, ``backend()`` and its warn-once
    notes): on the first call of a signature, the candidates that can serve it are checked
    against the priority choice's output and timed with it on the real inputs, or the
    cache file's entry for it is taken; what was measured is kept in the file."""

    _disk: dict[str, dict] | None = None
    # What the chooser this is mixed into has (AutoChooser): declared for the type check.
    order: tuple[str, ...] | None
    cache_path: Path
    tune_iters: int

    if TYPE_CHECKING:

        def backend(self, label: str) -> Backend | Exception: ...
        def _warn_once(self, what: object, msg: str, *args: Any) -> None: ...
        def _note_once(self, what: object, msg: str, *args: Any) -> None: ...

    def _made(self, label: str) -> Backend:
        """The backend of a label that can serve the call: its instance was made (one that
        could not be made has reasons, and is never a candidate)."""
        return cast(Backend, self.backend(label))

    tune_margin: float = tune_check.DEFAULT_MARGIN  # what a chooser pickled before the option existed has

    def _tuned(self, call, table, args) -> tuple[str, str, dict[str, float], dict[str, Any]]:
        """(label, how, ms, the Decision's tuning fields) for the first call of a signature."""
        ok = [label for label, reasons in table.items() if not reasons]
        priority = ok[0]
        candidates = ok
        if self.order is None:
            # the last resorts are timed only when nothing else can run
            candidates = [x for x in ok if x not in LAST_RESORT] or ok[:1]
        if priority not in candidates:
            candidates = [priority] + candidates
        if len(candidates) == 1:
            self._note_once(
                ("single", candidates[0]),
                "attnkit.auto(tune=True): only %s can serve calls like %s here; nothing to time",
                candidates[0],
                describe_call(call),
            )
            return candidates[0], "priority", {}, {}
        margin = self.tune_margin
        key = cache_key(call)
        cached = self._load_disk().get(key)
        if cached is not None and tune_check.trusted(cached, candidates, priority, margin):
            info = {
                "priority": priority,
                "gain": dict(cached["gain"]),
                "diff": dict(cached["diff"]),
                "note": tune_check.describe_tuning(cached["backend"], priority, cached["gain"], cached["diff"], margin),
            }
            return cached["backend"], "tune cache", dict(cached.get("ms", {})), info
        what = describe_call(call)
        diff: dict[str, float | str] = {}
        # the check: every candidate's output against the priority choice's, on these inputs
        check_args = args if args[7] == 0.0 else args[:7] + (0.0,) + args[8:]  # dropout is random: none here
        try:
            with torch.no_grad():
                reference = run_backend(self._made(priority), *check_args)
                bounds = tune_check.output_bound(check_args)
        except Exception as exc:
            logger.warning(
                "attnkit.auto(tune=True): %s, the priority choice, failed on %s while tuning (%s); "
                "nothing is tuned for this signature",
                priority,
                what,
                describe_exception(exc),
            )
            return priority, "priority", {}, {}
        passed = [priority]
        for label in candidates:
            if label == priority:
                continue
            try:
                with torch.no_grad():
                    fraction = tune_check.output_difference(
                        run_backend(self._made(label), *check_args), reference, bounds
                    )
            except Exception as exc:
                logger.warning(
                    "attnkit.auto(tune=True): %s failed on %s while tuning (%s); skipped",
                    label,
                    what,
                    describe_exception(exc),
                )
                diff[label] = "failed"
                continue
            if fraction <= 1.0:
                diff[label] = round(fraction, 6)
                passed.append(label)
                continue
            diff[label] = "differs"
            self._warn_once(
                ("differs", label, key),
                "attnkit.auto(tune=True): %s's output differs from that of %s (the priority choice) on %s: %s; "
                "it is never chosen for this signature",
                label,
                priority,
                what,
                "it has NaN or inf where the priority choice's has none, or another shape"
                if math.isinf(fraction)
                else f"its worst query row is {fraction:.3g} times the bound of {bounds[0]:.3g} allowed in "
                f"{dtype_name(call.dtype)} (twice the tolerance rule: {tune_check.FACTOR:g}x plain torch's error "
                f"against float64, plus rounding, relative to the output's rms row norm)",
            )
        del reference
        ms: dict[str, float] = {}
        gain: dict[str, float] = {}
        if len(passed) > 1:
            failed: dict[str, BaseException] = {}
            try:
                times = tune_check.time_rounds(
                    {label: self._made(label) for label in passed}, args, rounds=self.tune_iters, failed=failed
                )
            except Exception as exc:
                logger.warning(
                    "attnkit.auto(tune=True): %s, the priority choice, failed on %s while tuning (%s); "
                    "nothing is tuned for this signature",
                    priority,
                    what,
                    describe_exception(exc),
                )
                return priority, "priority", {}, {}
            for label, error in failed.items():
                logger.warning(
                    "attnkit.auto(tune=True): %s failed while timing %s (%s); skipped",
                    label,
                    what,
                    describe_exception(error),
                )
                diff[label] = "failed"
            ms = {label: round(statistics.median(t), 6) for label, t in times.items()}
            gain = tune_check.round_gains(times, priority)
        best = tune_check.choose_tuned(priority, gain, diff, margin, candidates)
        entry = {
            "backend": best,
            "ms": ms,
            "priority": priority,
            "margin": margin,
            "rounds": self.tune_iters,
            "gain": gain,
            "diff": diff,
            "checked": tune_check.CHECKED,
        }
        self._load_disk()[key] = entry  # read above: the table itself
        self._save(key, entry)
        info = {
            "priority": priority,
            "gain": dict(gain),
            "diff": dict(diff),
            "note": tune_check.describe_tuning(best, priority, gain, diff, margin),
        }
        return best, "tuned", ms, info

    def _load_disk(self) -> dict[str, dict]:
        if self._disk is None:
            self._disk = {}
            try:
                self._disk, others = read_cache(self.cache_path, CANDIDATES)
                if others:
                    logger.info(
                        "attnkit.auto(tune=True): %s holds %d entries this attnkit does not use (kept)",
                        self.cache_path,
                        others,
                    )
            except FileNotFoundError:
                logger.info(
                    "attnkit.auto(tune=True): no tuning cache at %s yet; timings will be saved there", self.cache_path
                )
            except CacheError as exc:
                self._warn_once(
                    ("read", str(self.cache_path)),
                    "attnkit.auto(tune=True): cannot use the tuning cache %s: %s",
                    self.cache_path,
                    exc,
                )
            except Exception as exc:  # a cache problem never fails a model call
                self._warn_once(
                    ("read", str(self.cache_path)),
                    "attnkit.auto(tune=True): cannot read the tuning cache %s (%s)",
                    self.cache_path,
                    describe_exception(exc),
                )
        return self._disk

    def _save(self, key: str, entry: dict) -> None:
        try:
            for note in update_cache(self.cache_path, {key: entry}, CANDIDATES):
                logger.warning("attnkit.auto(tune=True): %s", note)
        except CacheNotWritten as exc:
            self._warn_once(
                ("write", str(self.cache_path)), "attnkit.auto(tune=True): %s; tuned choices are not saved", exc
            )
        except Exception as exc:  # a cache problem never fails a model call
            self._warn_once(
                ("write", str(self.cache_path)),
                "attnkit.auto(tune=True): cannot write the tuning cache %s (%s); tuned choices are not saved",
                self.cache_path,
                describe_exception(exc),
            )


__all__ = [
    "CACHE_VERSION",
    "CacheError",
    "CacheNotWritten",
    "LOCK_TIMEOUT_S",
    "NotRegularFile",
    "STALE_TMP_S",
    "Tuned",
    "cache_key",
    "default_cache_path",
    "read_cache",
    "read_raw",
    "update_cache",
    "valid_entry",
]
