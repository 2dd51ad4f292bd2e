"""Nothing of a model or a chooser outlives ``undo()``, or the model and processor being
dropped: no table of attnkit's or diffusers' holds a chooser, a dispatch plan, a module
or a tensor strongly.

Each cycle builds a model, gives it an attnkit processor (``attnkit.apply`` or
``set_attn_processor``), runs it (twice: the second call of a signature runs the
dispatch route's kept plan), undoes or drops what it did, and keeps only weak
references. A long-lived process (a server loading models, a notebook) would otherwise
keep one chooser, with its plans and caches, per processor it ever set.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import attnkit
from attnkit.diffusers import backend as diffusers_backend
from attnkit.diffusers import backend_call
from tests.zoo._zoo import BY_ID

CYCLES = 20


@pytest.fixture(autouse=True)
def _no_forced_backend(monkeypatch):
    monkeypatch.delenv("ATTNKIT_BACKEND", raising=False)


def _plans_of(chooser) -> list:
    """The dispatch route's plans made for ``chooser`` (its registered name's holder)."""
    member = diffusers_backend.MEMBERS.get(chooser)
    holder = backend_call.HOLDERS.get(member.value) if member is not None else None
    return list(holder.served.values()) if holder is not None else []


def _cycle(case_id: str, route: str) -> dict[str, list[weakref.ref]]:
    case = BY_ID[case_id]
    model = case.build(0)
    inputs = case.make_inputs(model, 0)
    proc = attnkit.auto()
    applied = attnkit.apply(model, proc) if route == "apply" else model.set_attn_processor(proc)
    with torch.no_grad():
        out = case.run(model, inputs)
        case.run(model, inputs)
    assert proc.decisions, f"{case_id}: attnkit computed no attention through {route}"
    refs = {
        "chooser": [weakref.ref(proc.chooser)],
        "plan": [weakref.ref(p) for p in _plans_of(proc.chooser)],
        "module": [weakref.ref(m) for m in model.modules()],
        "tensor": [weakref.ref(t) for t in (*inputs.values(), *out) if isinstance(t, torch.Tensor)],
    }
    if route == "apply":
        applied.undo()
        # after undo() the model is stock: the processor and its chooser go with the last
        # reference to them, while the model lives on
        del applied, proc
        gc.collect()
        assert refs["chooser"][0]() is None, f"{case_id}: the chooser outlived undo() with its model alive"
    elif route in ("replaced", "default"):
        from diffusers.models.attention_processor import AttnProcessor2_0

        if route == "default":  # diffusers' own way back to its default processors
            model.set_default_attn_processor()
        else:
            model.set_attn_processor(AttnProcessor2_0())
        del proc
        gc.collect()
        assert refs["chooser"][0]() is None, f"{case_id}: the chooser outlived its processor's replacement"
    del model, inputs, out
    return refs


@pytest.mark.parametrize("route", ["apply", "set_attn_processor"])
@pytest.mark.parametrize(
    "case_id", ["FluxTransformer2DModel-masked", "SD3Transformer2DModel", "UNet2DConditionModel", "AutoencoderKLWan"]
)
def test_nothing_outlives_undo_or_the_model(case_id, route):
    if route == "set_attn_processor" and not hasattr(BY_ID[case_id].model_class(), "set_attn_processor"):
        pytest.skip(f"{case_id} has no set_attn_processor")
    registered = set(diffusers_backend.registered_names())
    refs = [_cycle(case_id, route) for _ in range(CYCLES)]
    gc.collect()
    for kind in ("chooser", "plan", "module", "tensor"):
        alive = sum(r() is not None for cycle in refs for r in cycle[kind])
        total = sum(len(cycle[kind]) for cycle in refs)
        assert alive == 0, f"{alive} of {total} {kind} objects of {CYCLES} cycles are still alive"
    if case_id.startswith("Flux"):  # the dispatch route made plans, and they went
        assert sum(len(cycle["plan"]) for cycle in refs) >= CYCLES
    # the names made for each processor's chooser left diffusers' registry with it
    assert set(diffusers_backend.registered_names()) <= registered, sorted(
        set(diffusers_backend.registered_names()) - registered
    )


@pytest.mark.parametrize("route", ["replaced", "default"])
def test_the_chooser_leaves_when_diffusers_processor_replaces_it(route):
    refs = [_cycle("UNet2DConditionModel", route) for _ in range(3)]
    gc.collect()
    assert all(r() is None for cycle in refs for kind in cycle.values() for r in kind)


def test_a_model_given_a_processor_it_does_not_hold_keeps_working():
    """``attnkit.apply(model, attnkit.auto())`` with the processor not held by the caller:
    the model holds the chooser (diffusers' registry holds it weakly), so garbage
    collection changes nothing it computes."""
    case = BY_ID["FluxTransformer2DModel-masked"]
    model = case.build(0)
    inputs = case.make_inputs(model, 0)
    with torch.no_grad():
        stock = case.run(model, inputs)
        attnkit.apply(model, attnkit.auto())
        gc.collect()
        first = case.run(model, inputs)
        gc.collect()
        again = case.run(model, inputs)
    for a, b, s in zip(first, again, stock):
        assert torch.equal(a, b)
        assert attnkit.testing.rel_error(a, s) < 1e-5


def test_a_deep_copied_model_shares_the_chooser_and_outlives_the_original():
    """copy.deepcopy keeps attnkit: the copy routes its dispatch calls to the same chooser,
    which then lives as long as either model."""
    import copy

    case = BY_ID["FluxTransformer2DModel-masked"]
    model = case.build(0)
    inputs = case.make_inputs(model, 0)
    proc = attnkit.auto()
    attnkit.apply(model, proc)
    with torch.no_grad():
        expected = case.run(model, inputs)
    twin = copy.deepcopy(model)
    chooser = weakref.ref(proc.chooser)
    del model, proc
    gc.collect()
    assert chooser() is not None
    with torch.no_grad():
        got = case.run(twin, inputs)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    del twin
    gc.collect()
    assert chooser() is None
