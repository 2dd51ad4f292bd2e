"""Every diffusers model class with attention, through attnkit: served and equal to stock,
or clearly kept. The tests of one family's cases come from ``tests_for(cases)``: each
tests/zoo/test_<family>.py takes them in (with the stock checks: _checks.py).

For each case of the zoo (a tiny config of every model class, with real masks and random
rotary angles; see _zoo.py and cases/): the model with diffusers' own attention, then with
``attnkit.apply(model, attnkit.auto())`` and with ``attnkit.apply(model,
VanillaProcessor())`` (attnkit's own math, so that nothing passes because two paths
run the same torch kernel), and, where diffusers' ``set_attention_backend`` reaches the
model's processors, with ``model.set_attention_backend("attnkit")``. Each output is held
to the tolerance rule against the model run in float64 with stock attention: its error at
most twice stock float32's, plus epsilon.

Modules attnkit keeps must say why, and the reason must be one of those listed in KEPT
(non-softmax attention, a hard-coded backend, torch's own multi-head attention, weights
of their own): a model whose softmax attention attnkit merely keeps fails here.

A flex BlockMask is held to its meaning: the stock references run with diffusers' flex
backend computing it densely (tests/zoo/_flex.py: its block lists, which eager flex
ignores, and its mask_mod), and attnkit's computing of it (block_mask_attention, through
the attnkit backend) counts as attnkit computing the module's attention.
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import block_masks
from attnkit.testing import rel_error
from tests.zoo._flex import flex_meaning
from tests.zoo._zoo import cast_floats, copy_function, missing_requirement

# Processors and modules attnkit keeps as they are: (kind, why that is right).
KEPT = {
    "SanaLinearAttnProcessor2_0": ("linear", "ReLU linear attention, not softmax attention"),
    "SanaLinearAttnProcessor3_0": ("linear", "ReLU linear attention, not softmax attention"),
    "SanaMultiscaleAttnProcessor2_0": ("linear", "ReLU linear attention, not softmax attention"),
    "MMAudioAttnProcessor": ("hard-coded", "hard-codes diffusers' native backend"),
    "QwenImage21AttnProcessor": ("process-wide", "runs diffusers' process-wide backend: set_attention_backend"),
    "CosmosAttnProcessor2_0": ("process-wide", "runs diffusers' process-wide backend: set_attention_backend"),
    "CosmosAttnProcessor2_5": ("process-wide", "runs diffusers' process-wide backend: set_attention_backend"),
    "MultiheadAttention": ("torch", "torch's own nn.MultiheadAttention (it can return its weights)"),
    "HunyuanDiTAttentionPool": ("torch", "attention pooling through torch's multi_head_attention_forward"),
}

# Processors that refuse, themselves, any backend but diffusers' flex one (their flex
# BlockMask): model.set_attention_backend("attnkit") makes them accept attnkit's names
# (attnkit.diffusers.flex.accept_attnkit), and attnkit computes their BlockMask.
FLEX_ONLY = {"LTX2VideoVaeNeighborhoodAttnProcessor", "AnyFlowCausalAttnProcessor"}

SEED = 0
EPS = 1e-6  # a few float32 units
# Where the float64 model cannot be built (a module pinned to float32 inside), ours is held
# to stock float32 directly: 1e-4 is 10x the largest float32-vs-float64 difference of the
# cases that do build in float64 (about 1e-5, through ~10 attention layers).
FALLBACK_TOL = 1e-4


def _params(cases):
    out = []
    for case in cases:
        marks = []
        if "slow" in case.extra:
            marks.append(pytest.mark.skip(reason=f"slow case ({case.extra['slow']})"))
        need = missing_requirement(case)
        if need:
            marks.append(pytest.mark.skip(reason=f"needs {need}, which the test set-up does not install"))
        out.append(pytest.param(case, id=case.id, marks=marks))
    return out


@pytest.fixture(scope="module", autouse=True)
def _quiet_single_thread():
    """Tiny models: one thread beats a pool on a shared CPU; diffusers' notes are noise."""
    import diffusers

    threads, verbosity = torch.get_num_threads(), diffusers.utils.logging.get_verbosity()
    torch.set_num_threads(1)
    diffusers.utils.logging.set_verbosity_error()
    yield
    torch.set_num_threads(threads)
    diffusers.utils.logging.set_verbosity(verbosity)


@pytest.fixture(autouse=True)
def _no_forced_backend(monkeypatch):
    monkeypatch.delenv("ATTNKIT_BACKEND", raising=False)


_BLOCK_MASKED: list = []  # listeners told of each BlockMask call attnkit computes (the test's)


class _Heard(list):
    """BlockMask calls attnkit computed (block_masks.recording), each told to the listeners."""

    def append(self, item):
        for listener in _BLOCK_MASKED:
            listener()
        super().append(item)


@pytest.fixture(autouse=True)
def _count_block_masked():
    """attnkit computes a flex BlockMask without its chooser (attnkit.block_masks): the
    counters below hear of those calls too."""
    from attnkit import block_masks

    with block_masks.recording(_Heard()):
        yield
    _BLOCK_MASKED.clear()


def _run(case, model, inputs):
    with torch.no_grad():
        return case.run(model, inputs)


def _leaves(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _leaves(v)]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _leaves(v)]
    return []


def inputs_for(case, model):
    """The case's inputs for this model instance (some inputs hold the model's own
    submodules): the same random values for every build, from the same seed."""
    return case.make_inputs(model, SEED)


class _References:
    """Stock float32 and float64 outputs of one case, made once."""

    def __init__(self, case):
        self.case = case
        model = case.build(SEED)
        inputs = inputs_for(case, model)
        with flex_meaning():
            self.stock = _run(case, model, inputs)
        self.ref = None
        try:
            m64 = case.build(SEED, dtype=torch.float64)
            inputs64 = cast_floats(inputs_for(case, m64), torch.float64)
        except RuntimeError:
            return
        same = all(
            a.dtype == b.dtype or torch.equal(a.to(b.dtype), b) if a.shape == b.shape else False
            for a, b in zip(_leaves(inputs64), _leaves(cast_floats(inputs, torch.float64)))
        )
        if not same:  # inputs drawn in the model's dtype: not the same draw, no reference
            return
        try:
            with flex_meaning():
                self.ref = _run(case, m64, inputs64)
        except RuntimeError:  # a module pinned to float32 inside (dtype mismatch)
            self.ref = None

    def check(self, outs, what: str) -> None:
        assert len(outs) == len(self.stock)
        for out, stock in zip(outs, self.stock):
            assert out.shape == stock.shape and out.dtype == stock.dtype, what
            assert torch.isfinite(out).all(), f"{what}: non-finite output"
        if self.ref is not None:
            for out, stock, ref in zip(outs, self.stock, self.ref):
                err, base = rel_error(out, ref), rel_error(stock, ref)
                tol = 2 * base + EPS
                assert err <= tol, f"{what}: error {err:.2e} against float64 > 2 x stock's {base:.2e} + {EPS}"
        else:
            for out, stock in zip(outs, self.stock):
                err = rel_error(out, stock)
                assert err <= FALLBACK_TOL, f"{what}: differs from stock float32 by {err:.2e} > {FALLBACK_TOL}"


_refs: dict[str, _References] = {}


def _refs_of(case) -> _References:
    if case.id not in _refs:
        _refs[case.id] = _References(case)
    return _refs[case.id]


def _kept_class(model, name: str) -> str:
    module = dict(model.named_modules())[name] if name in dict(model.named_modules()) else None
    proc = getattr(module, "processor", None)
    return type(proc).__name__ if proc is not None else type(module).__name__


def test_apply_serves_and_matches_stock(case, proc_name):
    refs = _refs_of(case)
    model = case.build(SEED)
    proc = attnkit.processor(proc_name)
    calls = _count_calls(proc)
    applied = attnkit.apply(model, proc)
    outs = _run(case, model, inputs_for(case, model))
    refs.check(outs, f"{case.id} with attnkit.apply(model, {proc_name})")
    for name, route in applied.routes.items():
        assert route.reason, name
        if not route.served:
            cls = _kept_class(model, name)
            assert cls in KEPT, f"{name}: {cls} kept ({route.reason}), which is not among the accepted reasons"
    served = [n for n, r in applied.routes.items() if r.served]
    if served:
        assert calls[0] >= 1, f"{len(served)} modules reported served but attnkit computed no attention"


def _count_calls(proc) -> list[int]:
    """A counter of the attention calls ``proc``'s chooser serves."""
    calls = [0]
    real = proc.chooser.attention

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    proc.chooser.attention = counting
    _BLOCK_MASKED.append(lambda: calls.__setitem__(0, calls[0] + 1))
    return calls


def _reached_by_set_attention_backend(model) -> bool:
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention

    return any(
        isinstance(m, (Attention, AttentionModuleMixin))
        and hasattr(getattr(m, "processor", None), "_attention_backend")
        for m in model.modules()
    )


def test_set_attention_backend_attnkit_matches_stock(case):
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    refs = _refs_of(case)
    model = case.build(SEED)
    if not _reached_by_set_attention_backend(model):
        pytest.skip(
            "diffusers' set_attention_backend reaches no processor of this model (none has an _attention_backend: "
            "legacy processors, or a backend named in the code)"
        )
    needs_flex = [m for m in model.modules() if type(getattr(m, "processor", None)).__name__ in FLEX_ONLY]
    active = _AttentionBackendRegistry._active_backend
    try:
        model.set_attention_backend("attnkit")
        with block_masks.recording() as calls:
            outs = _run(case, model, inputs_for(case, model))
    finally:  # set_attention_backend also sets diffusers' process-wide backend
        _AttentionBackendRegistry.set_active_backend(active)
    if needs_flex and "no mask" not in case.note:  # their BlockMask calls reached attnkit, not diffusers' flex
        assert calls, f"{case.id}: no BlockMask call reached attnkit"
    refs.check(outs, f"{case.id} with set_attention_backend('attnkit')")


def test_set_attn_processor_serves_exactly_or_keeps(case, caplog):
    """``model.set_attn_processor(attnkit processor)`` on every model that has it: each
    module served by what its own processor computed (as attnkit.apply decides), and the
    model equal to stock under the tolerance rule; a module attnkit cannot compute
    exactly (linear attention, a flex mask, a hard-coded backend) keeps its own processor
    and gives stock's output bit for bit on the inputs it gets, with one warning for the
    model naming it. Never a silent change of the math (Sana's linear attention was
    replaced by softmax attention; CogVideoX's two outputs were returned as one).
    attnkit's vanilla backend computes every served call, so a route that silently did
    nothing would count no call. With strict=True, a kept module is refused at the
    first call instead, naming it and the non-strict default."""
    import copy
    import logging

    refs = _refs_of(case)
    model = case.build(SEED)
    if not hasattr(model, "set_attn_processor"):
        pytest.skip(f"{type(model).__name__} has no set_attn_processor")
    modules = dict(model.named_modules())
    planned = {
        name: route for name, route in attnkit.plan(model).routes.items() if hasattr(modules[name], "set_processor")
    }
    kept = {name for name, route in planned.items() if not route.served}
    stock_modules = {name: copy.deepcopy(modules[name]) for name in kept}
    proc = attnkit.processor("vanilla", strict=False)
    served_by_module = _count_calls_per_module(proc, [modules[name] for name in planned])
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        model.set_attn_processor(proc)
    said = [r.getMessage() for r in caplog.records if r.name == "attnkit" and "keeps" in r.getMessage()]
    if kept:
        assert len(said) == 1, said
        assert f"keeps {len(kept)} attention module" in said[0] and "strict=True" in said[0], said[0]
        assert sorted(kept)[0] in said[0] or len(kept) > 3, said[0]
    else:
        assert not said, said
    seen = _calls_of(model, [modules[name] for name in kept])
    ran = _modules_that_run(model, [modules[name] for name in planned])
    outs = _run(case, model, inputs_for(case, model))
    refs.check(outs, f"{case.id} with model.set_attn_processor(vanilla)")
    assert ran, "no attention module of the model ran"
    silent = [
        name
        for name, module in modules.items()
        if id(module) in ran and not served_by_module.get(id(module)) and name not in kept
    ]
    assert not silent, f"modules that ran without attnkit computing their attention: {silent}"
    for name in kept:
        assert not served_by_module.get(id(modules[name])), f"{name} is kept, yet attnkit computed its attention"
        for args, kwargs, out in seen.get(id(modules[name]), []):
            with torch.no_grad():
                expected = stock_modules[name](*args, **kwargs)
            for a, b in zip(_leaves(out), _leaves(expected)):
                assert torch.equal(a, b), f"{name}: kept, but its output differs from its stock processor's"
    _check_set_default_attn_processor(case, model)
    if kept:
        strict = case.build(SEED)
        strict.set_attn_processor(attnkit.processor("vanilla", strict=True))
        with pytest.raises(attnkit.UnsupportedModule, match=r"strict.* cannot serve .*Without strict mode"):
            _run(case, strict, inputs_for(case, strict))


def _check_set_default_attn_processor(case, model) -> None:
    """diffusers' ``set_default_attn_processor`` on a model running attnkit's processors
    sets what it sets on the stock model (it raised "Cannot call set_default_attn_processor
    when attention processors are of type ..." for any processor not of diffusers)."""
    if not hasattr(model, "set_default_attn_processor"):
        return
    stock = case.build(SEED)

    def outcome(m):
        try:
            m.set_default_attn_processor()
        except ValueError as e:
            return f"ValueError: {str(e).split(' of type ')[0]}"
        return {name: type(p).__name__ for name, p in m.attn_processors.items()}

    expected, got = outcome(stock), outcome(model)
    assert got == expected, f"{case.id}: set_default_attn_processor gave {got}, stock gives {expected}"


def test_attention_backend_context_says_what_it_does_not_reach(case, caplog):
    """``with attention_backend("attnkit"):`` is diffusers' process-wide backend, which
    reaches only modules whose processor calls dispatch_attention_fn. The first call of a
    model inside it gives one warning when some attention module of the model ran without
    attnkit computing its attention, naming none that attnkit did compute; nothing when
    every module that ran was computed by attnkit, nothing at a second call, and nothing
    stays installed after the context."""
    import logging
    import re
    import types

    from diffusers.models.attention_dispatch import attention_backend

    from attnkit.diffusers import backend as diffusers_backend
    from attnkit.diffusers import backend_call, wrappers

    model = case.build(SEED)
    modules = dict(model.named_modules())
    routes = attnkit.plan(model).routes
    attention = [modules[name] for name in routes]
    holder = backend_call.HOLDERS[diffusers_backend.PREFIX]
    chooser = holder.get()
    holder.served.clear()  # a signature served before would skip the counting below
    counts = _count_calls_per_module(types.SimpleNamespace(chooser=chooser), attention)
    ran = _modules_that_run(model, attention)
    try:
        with caplog.at_level(logging.WARNING, logger="attnkit"):
            with attention_backend(diffusers_backend.PREFIX):
                assert wrappers.watching()
                _run(case, model, inputs_for(case, model))
                first = [r.getMessage() for r in caplog.records if "does not reach" in r.getMessage()]
                _run(case, model, inputs_for(case, model))
            after = [r.getMessage() for r in caplog.records if "does not reach" in r.getMessage()]
    finally:
        for name in ("attention", "resolved"):
            chooser.__dict__.pop(name, None)
        holder.served.clear()
    assert not wrappers.watching(), "attnkit's model-call watcher outlived the context"
    again = [m for m in after[len(first) :] if f"modules of {type(model).__name__} (" in m]
    assert not again, f"a second call of the model warned again: {again}"
    reached = {name for name, m in modules.items() if counts.get(id(m))}
    # modules attnkit serves on no route (linear attention, flex masks: see KEPT) are not
    # the context's to reach
    unreached = [name for name, m in modules.items() if id(m) in ran and not counts.get(id(m)) and routes[name].served]
    if unreached:
        assert len(first) == 1, f"{case.id}: {unreached} ran on stock attention, warnings: {first}"
        # (the model run: MotionAdapter's case runs the UNetMotionModel made from it)
        assert re.search(r"modules of \w+ \(", first[0]) and "attnkit.apply" in first[0], first[0]
    else:
        assert not first or len(first) == 1, first
    for message in first:
        shown = re.search(r"attention modules of \w+ \((.*?)\): e\.g\.", message).group(1)
        named = {n for n in shown.split(", ") if not n.startswith("...")}
        assert not named & reached, f"the warning names modules attnkit computed: {sorted(named & reached)}"


def _calls_of(model, modules) -> dict[int, list]:
    """{id(module): [(args, kwargs, output)]} of the next forward, for the given modules."""
    seen: dict[int, list] = {}

    def record(module, args, kwargs, out):
        seen.setdefault(id(module), []).append((args, kwargs, out))

    for module in modules:
        module.register_forward_hook(record, with_kwargs=True)
    return seen


def _count_calls_per_module(proc, modules=()) -> dict[int, int]:
    """{id(attention module): calls attnkit's chooser served for it}.

    A call signature the dispatch route has served once runs again without the chooser:
    the backend its ``resolved()`` gave is kept and called directly. Those calls are
    counted too, for the one of ``modules`` running them (forward hooks say which)."""
    from attnkit.text import Caller

    counts: dict[int, int] = {}
    real = proc.chooser.attention

    def counting(who, *args, **kwargs):
        module = who.module() if isinstance(who, Caller) else who
        counts[id(module)] = counts.get(id(module), 0) + 1
        return real(who, *args, **kwargs)

    proc.chooser.attention = counting
    running: list[int] = []

    def enter(module, args):
        running.append(id(module))

    def leave(module, args, out):  # returns None: the output stays the module's
        running.pop()

    for module in modules:
        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave)

    def block_masked():
        if running:
            counts[running[-1]] = counts.get(running[-1], 0) + 1

    _BLOCK_MASKED.append(block_masked)
    real_resolved = getattr(proc.chooser, "resolved", None)
    if real_resolved is not None:

        def resolved(sig):
            backend = real_resolved(sig)
            return None if backend is None else _CountedBackend(backend, counts, running)

        proc.chooser.resolved = resolved
    return counts


class _CountedBackend:
    """A backend kept for a call signature, counting its calls for the module running."""

    def __init__(self, backend, counts: dict[int, int], running: list[int]):
        self._backend, self._counts, self._running = backend, counts, running

    def forward(self, *args, **kwargs):
        if self._running:
            self._counts[self._running[-1]] = self._counts.get(self._running[-1], 0) + 1
        return self._backend.forward(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._backend, name)


def _modules_that_run(model, modules) -> set[int]:
    """ids of the given modules that the next forward calls (pre-hooks that record)."""
    ran: set[int] = set()
    for module in modules:
        module.register_forward_pre_hook(lambda m, args: ran.add(id(m)))
    return ran


def tests_for(cases) -> dict:
    """The tests above, parametrized over ``cases`` (one family's), with this module's
    fixtures: for a test module's globals. Each test module gets its own copies."""
    params = _params(cases)
    if not params:
        return {}
    case = pytest.mark.parametrize("case", params)
    return {
        "_quiet_single_thread": _quiet_single_thread,
        "_no_forced_backend": _no_forced_backend,
        "_count_block_masked": _count_block_masked,
        "test_apply_serves_and_matches_stock": case(
            pytest.mark.parametrize("proc_name", ["auto", "vanilla"])(
                copy_function(test_apply_serves_and_matches_stock)
            )
        ),
        "test_set_attention_backend_attnkit_matches_stock": case(
            copy_function(test_set_attention_backend_attnkit_matches_stock)
        ),
        "test_set_attn_processor_serves_exactly_or_keeps": case(
            copy_function(test_set_attn_processor_serves_exactly_or_keeps)
        ),
        "test_attention_backend_context_says_what_it_does_not_reach": case(
            copy_function(test_attention_backend_context_says_what_it_does_not_reach)
        ),
    }
