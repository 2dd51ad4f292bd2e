"""A pytest plugin that gives every diffusers attention module attnkit's processor at
construction: ``-p tools.diffusers_tests.plugin``.

After ``import attnkit`` it registers a global module-registration hook
(``torch.nn.modules.module.register_module_module_registration_hook``), which torch calls
whenever a submodule is assigned to a parent (``self.attn = Attention(...)``,
``nn.ModuleList([...])``). When that submodule is a diffusers attention module (an
``attention_processor.Attention`` or an ``attention.AttentionModuleMixin`` with
``set_processor``), it is fully constructed, with the processor diffusers chose for it;
the hook calls ``submodule.set_processor(PROC)`` with one shared ``attnkit.auto()``.
attnkit's wrapper of ``set_processor`` notes the processor it replaces and binds the
module by the route ``attnkit.apply`` would take, as ``model.set_attn_processor(auto())``
does. A model that sets processors of its own in its ``__init__``, after its attention
modules were built, gets attnkit's back (``modules_reset``); a test that sets a processor
of its own after construction replaces attnkit's, as it would for a user.

Not reached: an attention module built on its own, never assigned to a parent (a test
that calls ``Attention(...)`` directly), and attention that is no diffusers attention
module (a text encoder's).

What it counts goes into each test's ``user_properties`` (the record plugin writes them):
``attnkit_modules_set`` (modules given attnkit's processor during the test),
``attnkit_modules_reset`` (given it back after their model's ``__init__`` set its own),
``attnkit_set_errors`` (``set_processor`` raised: re-raised, so the test fails with it) and
``attnkit_chooser_calls`` (attention calls that reached an ``auto()`` chooser: the first
call of each signature on the dispatch route, every call on the others) and
``attnkit_backend_calls`` (attention calls an attnkit backend computed, every route); and the
session's totals, with the backends the shared chooser decided on, into the record's
``finish`` line.
"""

from __future__ import annotations

import functools
import logging
import sys
import weakref
from collections import Counter

import pytest
import torch

import attnkit

logger = logging.getLogger("tools.diffusers_tests.plugin")

PROC = None  # the one attnkit.auto() every module gets
COUNTS: Counter = Counter()  # modules_set, set_errors, chooser_calls
CLASSES: Counter = Counter()  # attention module class -> modules set
BACKENDS: Counter = Counter()  # backend name -> attention calls it computed
KEYS = ("modules_set", "modules_reset", "set_errors", "chooser_calls", "backend_calls")
_SEEN: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
_HANDLE = None


def _attention_classes() -> tuple[type, ...]:
    classes = []
    from diffusers.models import attention_processor

    classes.append(attention_processor.Attention)
    try:
        from diffusers.models.attention import AttentionModuleMixin
    except ImportError:  # diffusers before the mixin
        pass
    else:
        classes.append(AttentionModuleMixin)
    return tuple(classes)


def _hook(classes: tuple[type, ...], module: torch.nn.Module, name: str, submodule: torch.nn.Module):
    if not isinstance(submodule, classes) or not callable(getattr(submodule, "set_processor", None)):
        return None
    if submodule in _SEEN or getattr(submodule, "processor", None) is PROC:
        return None
    _SEEN.add(submodule)
    try:
        submodule.set_processor(PROC)
    except Exception:
        COUNTS["set_errors"] += 1
        logger.exception(
            "set_processor(attnkit.auto()) raised on %s.%s (%s)", type(module).__name__, name, type(submodule).__name__
        )
        raise
    COUNTS["modules_set"] += 1
    CLASSES[type(submodule).__name__] += 1
    return None


def _constructing() -> bool:
    """Whether a module's ``__init__`` is on the stack (a model setting processors of its
    own while it is built, after its attention modules were)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "__init__" and isinstance(frame.f_locals.get("self"), torch.nn.Module):
            return True
        frame = frame.f_back
    return False


def _keep_at_construction(cls: type) -> None:
    """A model that sets a processor of its own on its attention modules in its
    ``__init__`` (JoyImageEditPlus: a batched-RoPE processor on every block) would
    replace attnkit's before any test sees it: give attnkit's back, over the model's
    choice (which attnkit's wrapper notes as what it replaces), as
    ``set_attn_processor(auto())`` after construction would. A processor set after
    construction (a test's own) is left alone."""
    original = cls.__dict__.get("set_processor")
    if original is None or getattr(original, "_dt_keeping", False):
        return

    @functools.wraps(original)
    def set_processor(self, processor, *args, **kwargs):
        result = original(self, processor, *args, **kwargs)
        if (
            self in _SEEN
            and processor is not PROC
            and not getattr(type(processor), "_attnkit_processor", False)
            and _constructing()
        ):
            original(self, PROC)
            COUNTS["modules_reset"] += 1
        return result

    set_processor._dt_keeping = True
    cls.set_processor = set_processor


def _count_calls(chooser_cls: type) -> None:
    """Count every attention call a chooser of ``chooser_cls`` computes (each route calls
    ``chooser.attention``; copies of the shared processor made by deepcopy count too)."""
    original = chooser_cls.attention
    if getattr(original, "_dt_counting", False):
        return

    @functools.wraps(original)
    def attention(self, *args, **kwargs):
        COUNTS["chooser_calls"] += 1
        return original(self, *args, **kwargs)

    attention._dt_counting = True
    chooser_cls.attention = attention


_DEPTH = [0]  # a backend calling another (sliced calls vanilla) counts once


def _count_backend_calls() -> None:
    """Count every attention attnkit's backends compute: the dispatch route keeps a plan
    per call signature after its first call and calls the backend directly, past the
    chooser, so ``chooser_calls`` alone undercounts."""
    from attnkit.backends import BACKEND_NAMES, backend_class

    for name in BACKEND_NAMES:
        try:
            cls = backend_class(name)
        except Exception:  # noqa: BLE001 - a backend whose module does not import here computes nothing
            continue
        for method in ("forward", "forward_with_lse"):
            original = cls.__dict__.get(method)
            if original is None or getattr(original, "_dt_counting", False):
                continue
            setattr(cls, method, _counting(original, name))


def _counting(original, name: str):
    @functools.wraps(original)
    def method(self, *args, **kwargs):
        if _DEPTH[0] == 0:
            COUNTS["backend_calls"] += 1
            BACKENDS[name] += 1
        _DEPTH[0] += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _DEPTH[0] -= 1

    method._dt_counting = True
    return method


def pytest_configure(config):
    global PROC, _HANDLE
    PROC = attnkit.auto()
    _count_calls(type(PROC.chooser))
    _count_backend_calls()
    classes = _attention_classes()
    for cls in classes:
        _keep_at_construction(cls)
    _HANDLE = torch.nn.modules.module.register_module_module_registration_hook(functools.partial(_hook, classes))
    logger.info(
        "attnkit.auto() is set on every diffusers attention module at construction (%s)",
        ", ".join(c.__name__ for c in classes),
    )


def pytest_unconfigure(config):
    global _HANDLE
    if _HANDLE is not None:
        _HANDLE.remove()
        _HANDLE = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item._dt_attnkit_before = Counter(COUNTS)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    if call.when == "teardown":  # the teardown report is made after this, with the properties
        before = getattr(item, "_dt_attnkit_before", Counter())
        for key in KEYS:
            item.user_properties.append((f"attnkit_{key}", COUNTS[key] - before[key]))
    yield


@pytest.hookimpl(tryfirst=True)  # before the record plugin writes its `finish` line
def pytest_sessionfinish(session, exitstatus):
    from .record import SESSION_EXTRA

    decided = Counter(d.backend for d in PROC.chooser.decisions) if PROC is not None else Counter()
    session.config.stash.setdefault(SESSION_EXTRA, {})["attnkit"] = {
        "modules_set": COUNTS["modules_set"],
        "modules_reset": COUNTS["modules_reset"],
        "set_errors": COUNTS["set_errors"],
        "chooser_calls": COUNTS["chooser_calls"],
        "backend_calls": COUNTS["backend_calls"],
        "backend_calls_by_backend": dict(BACKENDS.most_common()),
        "classes": dict(CLASSES.most_common()),
        "decisions_by_backend": dict(decided),
        "processor": repr(PROC),
    }
