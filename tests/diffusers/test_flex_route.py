"""The flex route (attnkit/diffusers/flex.py): processors that name diffusers' flex backend
themselves run their own code, with that call computed by attnkit; what attnkit cannot
honour of it is refused naming the module and the argument; under torch.compile a
BlockMask call stays on diffusers' (compiled) flex backend; and nothing of it outlives
undo() and the chooser. The zoo (tests/zoo, the Kandinsky6SR, LTX2VideoDiffusionDecoder,
AnyFlowFAR and WanAnimate2 cases) holds every served model to the mask's meaning.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import attnkit
from attnkit import block_masks
from attnkit.diffusers import backend as diffusers_backend
from attnkit.diffusers import flex
from attnkit.errors import UnsupportedModule
from tests.zoo._zoo import BY_ID

CASE = "LTX2VideoDiffusionDecoderModel"


@pytest.fixture(autouse=True)
def _no_forced_backend(monkeypatch):
    monkeypatch.delenv("ATTNKIT_BACKEND", raising=False)


def _model():
    case = BY_ID[CASE]
    model = case.build(0)
    return case, model, case.make_inputs(model, 0)


def _diffusers_module():
    from diffusers.models.autoencoders import ltx2_diffusion_decoder

    return ltx2_diffusion_decoder


def _ours(namespace: dict) -> list[str]:
    return [k for k in namespace if k.startswith(f"_attnkit_{flex.DISPATCH}_")]


def _applied_global(model) -> str:
    """attnkit.apply(model, auto()) on the LTX-2 decoder: the name of the global its flex
    route reads dispatch_attention_fn under (the chooser is held by the model)."""
    gc.collect()  # choosers of earlier tests go, with their globals
    namespace = vars(_diffusers_module())
    before = set(_ours(namespace))
    attnkit.apply(model, attnkit.auto())
    (name,) = set(_ours(namespace)) - before
    return name


@pytest.mark.parametrize("how", ["apply", "set_attn_processor"])
def test_served_on_the_flex_route_by_attnkit(how, monkeypatch):
    case, model, inputs = _model()
    with torch.no_grad(), block_masks.recording() as calls:
        stock = case.run(model, inputs)
        proc = attnkit.auto()
        routes = (attnkit.apply(model, proc) if how == "apply" else attnkit.plan(model)).routes
        if how == "set_attn_processor":
            model.set_attn_processor(proc)
        served = case.run(model, inputs)
    assert routes and all(r.kind == "flex" for r in routes.values()), routes
    assert "accepts no other" in next(iter(routes.values())).reason
    assert calls, "attnkit computed no BlockMask call"
    for a, b in zip(served, stock):
        assert attnkit.testing.rel_error(a, b) < 1e-5


def test_what_attnkit_cannot_honour_is_refused_naming_module_and_argument():
    case, model, inputs = _model()
    name = _applied_global(model)
    namespace = vars(_diffusers_module())
    diverting = namespace[name]

    def with_dropout(*args, **kwargs):
        return diverting(*args, **{**kwargs, "dropout_p": 0.25})

    namespace[name] = with_dropout
    try:
        with torch.no_grad(), pytest.raises(UnsupportedModule, match=r"decoder\..*attn.*dropout_p=0\.25"):
            case.run(model, inputs)
    finally:
        namespace[name] = diverting
    q = torch.randn(1, 8, 2, 16)
    from torch.nn.attention.flex_attention import create_block_mask

    mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, 8, 8, device="cpu", BLOCK_SIZE=8)
    for kwargs, named in (
        (dict(attn_mask=mask, is_causal=True), "is_causal=True"),
        (dict(attn_mask=mask, attention_kwargs={"return_lse": True}), "return_lse=True"),
        (dict(attn_mask=mask, parallel_config=object()), "context-parallel"),
        (dict(attn_mask=torch.ones(1, 8, dtype=torch.bool)), "2-D tensor attn_mask"),
        (dict(attention_kwargs={"window": 3}), "attention_kwargs window"),
    ):
        with pytest.raises(UnsupportedModule, match=named):
            diverting(q, q, q, backend="flex", **kwargs)


def test_a_call_naming_another_backend_goes_on_as_it_was():
    _, model, _ = _model()
    name = _applied_global(model)
    namespace = vars(_diffusers_module())
    q, k, v = (torch.randn(1, 8, 2, 16) for _ in range(3))
    expected = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
    assert torch.allclose(namespace[name](q, k, v, backend="native"), expected, atol=1e-6)


def test_under_torch_compile_a_block_mask_stays_on_diffusers_flex(monkeypatch):
    """Compiled FlexAttention computes a BlockMask exactly: the flex route leaves that call
    to diffusers' flex backend (read here through is_compiling)."""
    case, model, inputs = _model()
    with torch.no_grad():
        stock = case.run(model, inputs)
    attnkit.apply(model, attnkit.auto())
    monkeypatch.setattr(flex, "is_compiling", lambda: True)
    with torch.no_grad(), block_masks.recording() as calls:
        out = case.run(model, inputs)
    assert not calls
    for a, b in zip(out, stock):
        assert torch.equal(a, b)


def test_nothing_of_the_flex_route_outlives_undo_and_the_chooser():
    gc.collect()
    namespace = vars(_diffusers_module())
    before = set(_ours(namespace))
    registered = set(diffusers_backend.registered_names())
    refs = []
    for _ in range(3):
        case, model, inputs = _model()
        stock_classes = {type(m.processor) for m in model.modules() if hasattr(m, "processor")}
        proc = attnkit.auto()
        applied = attnkit.apply(model, proc)
        with torch.no_grad():
            case.run(model, inputs)
        assert set(_ours(namespace)) - before, "the flex route read no global of its own"
        applied.undo()
        assert {type(m.processor) for m in model.modules() if hasattr(m, "processor")} == stock_classes
        refs.append(weakref.ref(proc.chooser))
        del applied, proc
        gc.collect()
        assert refs[-1]() is None, "the chooser outlived undo() with its model alive"
        del model, inputs
    gc.collect()
    assert set(_ours(namespace)) == before, sorted(set(_ours(namespace)) - before)
    assert set(diffusers_backend.registered_names()) <= registered


def test_a_processor_that_accepts_flex_alone_is_served_only_while_it_is_set_to_flex():
    from diffusers.models.autoencoders.ltx2_diffusion_decoder import LTX2VideoVaeNeighborhoodAttnProcessor
    from diffusers.models.transformers.transformer_kandinsky6_sr import Kandinsky6SRAttnProcessor

    from attnkit.diffusers.routes import classify

    assert classify(Kandinsky6SRAttnProcessor()).kind == "flex"
    proc = LTX2VideoVaeNeighborhoodAttnProcessor()
    assert classify(proc).kind == "flex"
    proc._attention_backend = "native"  # its own check would refuse it: kept, as diffusers runs it
    route = classify(proc)
    assert route.kind == "kept" and "checks which backend" in route.reason, route


def test_explain_lists_the_block_mask_calls_with_their_route():
    """A BlockMask call is attnkit.block_masks', not a backend's: explain() lists it by
    shape with its route and why, counted."""
    case, model, inputs = _model()
    proc = attnkit.auto()
    attnkit.apply(model, proc)
    with torch.no_grad(), block_masks.recording() as calls:
        case.run(model, inputs)
    text = proc.explain()
    lines = [line for line in text.splitlines() if line.startswith("[BlockMask]")]
    assert lines and all("-> chunked (device=cpu: the block-sparse kernel runs on CUDA)" in x for x in lines), text
    assert sum(int(x.rsplit("; ", 1)[1].split()[0]) for x in lines) == len(calls)


def test_set_attention_backend_attnkit_serves_a_processor_that_accepts_flex_alone(caplog):
    """LTX-2's decoder refuses any backend but flex by its own check: set by name, attnkit
    is accepted and computes its BlockMask; another name set later takes that back (the
    processor refuses as diffusers wrote it), and the class is never changed."""
    import copy
    import pickle

    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    from attnkit.diffusers.routes import classify

    case, model, inputs = _model()
    procs = [m.processor for m in model.modules() if type(getattr(m, "processor", None)).__name__.startswith("LTX2")]
    assert procs and all(flex.accepts_flex_alone(p) for p in procs)
    cls_supported = type(procs[0])._SUPPORTED_BACKENDS
    with torch.no_grad():
        stock = case.run(model, inputs)
    active = _AttentionBackendRegistry._active_backend
    try:
        with caplog.at_level("WARNING", logger="attnkit"):
            model.set_attention_backend("attnkit")
        assert "does not reach" not in caplog.text, caplog.text
        route = classify(procs[0])
        assert route.kind == "dispatch" and "accepts attnkit's backend names" in route.reason, route
        with torch.no_grad(), block_masks.recording() as calls:
            served = case.run(model, inputs)
        assert calls and all(c.route == "chunked" for c in calls), calls
        for a, b in zip(served, stock):
            assert attnkit.testing.rel_error(a, b) < 1e-5
        # a copy accepts as the model does; a pickle saves diffusers' own check
        assert isinstance(copy.deepcopy(procs[0]).__dict__[flex.SUPPORTED], flex.WithAttnkit)
        assert type(pickle.loads(pickle.dumps(procs[0]._SUPPORTED_BACKENDS))) is tuple
        model.set_attention_backend("flex")
        assert all(flex.SUPPORTED not in vars(p) for p in procs)
        with torch.no_grad(), block_masks.recording() as calls:
            again = case.run(model, inputs)
        assert not calls, "diffusers' flex backend was named, and attnkit computed its calls"
        for a, b in zip(again, stock):
            assert torch.equal(a, b)
        model.set_attention_backend("native")
        with torch.no_grad(), pytest.raises(ValueError, match="requires the 'flex' attention backend"):
            case.run(model, inputs)
    finally:  # set_attention_backend also sets diffusers' process-wide backend
        _AttentionBackendRegistry.set_active_backend(active)
    assert type(procs[0])._SUPPORTED_BACKENDS is cls_supported == ("flex", "_native_flex")
