"""torch.compile of a model that has never run eagerly, on every route into it.

Each model is built, given attnkit by one route, and compiled before any call:

* transformers (Flux, Wan, SD3, Qwen-Image): ``model.set_attention_backend("attnkit")``
  and ``attnkit.apply(model, attnkit.auto())``; Flux also with
  ``set_attn_processor(attnkit.auto())``, and Flux, Wan and Qwen-Image under diffusers'
  ``with attention_backend("attnkit"):``, which makes nothing up front (auto()'s chooser
  is made while torch.compile traces: it once failed there with "Dynamo does not know
  how to enter a RLock context manager");
* an SD1.5-style UNet2DConditionModel: ``unet.set_attn_processor(attnkit.auto())`` and
  ``attnkit.apply``.

``fullgraph=True`` with backend="eager" on every model and route; with backend="inductor"
(C++ built per kernel on the CPU: tens of seconds a model) on one route per model, which
together cover every route; without fullgraph, no graph break and a single graph. Each
compiled output is compared with the same model's eager output, and that with the stock
model (diffusers' native backend / AttnProcessor2_0), all under the tolerance rule
against the stock model in float64: at most twice stock float32's error, plus epsilon.

CUDA only: ``mode="reduce-overhead"`` (CUDA graphs) on every backend attnkit offers,
three calls each, every graph captured (nothing on the path syncs with the host).
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch._dynamo as dynamo
from diffusers.models.attention_dispatch import attention_backend
from torch._dynamo.utils import counters

import attnkit
from attnkit.testing import rel_error
from tests.diffusers._models import tiny_sd15_unet, two_level_sd15_unet, unet_inputs
from tests.zoo._zoo import cast_floats
from tests.zoo.cases import flux, qwen, sd3, wan

EPS = 1e-6  # a few float32 units, as the zoo's rule
# inductor compiles the whole model, not only its attention: it fuses and reorders the
# reductions of norms and projections, so its float32 rounding is not stock's. 1e-5 is the
# largest float32-vs-float64 difference among the zoo's models (tests/zoo/_served.py,
# FALLBACK_TOL's note), about 80 float32 units: float32 rounding, in another order.
INDUCTOR_FLOOR = 1e-5


def _case(cases, name):
    return next(c for c in cases if c.name == name and not c.variant)


class _Zoo:
    """A zoo case: a tiny transformer and random inputs (rotary angles and ids random)."""

    def __init__(self, case):
        self.case = case

    def build(self, seed):
        model = self.case.build(seed)
        return model, self.case.make_inputs(model, seed)

    def run(self, model, inputs):
        return self.case.run(model, inputs)


class _UNet:
    def __init__(self, make):
        self.make = make

    def build(self, seed):
        model = self.make(seed)
        return model, unet_inputs(model, seed=seed)

    def run(self, model, inputs):
        return (model(**inputs).sample,)


MODELS = {
    "flux": _Zoo(_case(flux.CASES, "FluxTransformer2DModel")),
    "wan": _Zoo(_case(wan.CASES, "WanTransformer3DModel")),
    "sd3": _Zoo(_case(sd3.CASES, "SD3Transformer2DModel")),
    "qwen": _Zoo(_case(qwen.CASES, "QwenImageTransformer2DModel")),
    "unet": _UNet(tiny_sd15_unet),
    # two resolutions instead of four for inductor, whose C++ build grows with the blocks
    "unet2": _UNet(two_level_sd15_unet),
}
TRANSFORMERS = ("flux", "wan", "sd3", "qwen")


def _route(model, route: str, monkeypatch):
    """Give ``model`` attnkit by ``route``; returns the context the calls run in. Under
    ``attention_backend("attnkit")`` auto()'s chooser for the process is made at the first
    call: here the first is compiled (an earlier test's is set aside for this one)."""
    if route == "set_attention_backend":
        model.set_attention_backend("attnkit")
    elif route == "apply":
        attnkit.apply(model, attnkit.auto())
    elif route == "set_attn_processor":
        model.set_attn_processor(attnkit.auto())
    elif route == "attention_backend":
        from attnkit.diffusers import backend_call

        monkeypatch.setattr(backend_call.HOLDERS["attnkit"], "chooser", None)
        return attention_backend("attnkit")
    else:
        raise AssertionError(route)
    return contextlib.nullcontext()


class _Outputs:
    """The stock model's float32 and float64 outputs (diffusers' native backend, or
    AttnProcessor2_0 on the UNet: what the model has before attnkit), from a copy: the
    model under test is never called before it is compiled."""

    def __init__(self, spec, model, inputs):
        stock = copy.deepcopy(model)
        with torch.no_grad():
            self.stock = spec.run(stock, inputs)
            self.ref = spec.run(stock.double(), cast_floats(inputs, torch.float64))
        self.base = [rel_error(s, r) for s, r in zip(self.stock, self.ref)]

    def check(self, outs, eager, floor: float = 0.0) -> None:
        assert len(outs) == len(eager) == len(self.stock)
        for i, (out, ours, stock, ref, base) in enumerate(zip(outs, eager, self.stock, self.ref, self.base)):
            tol = 2 * base + EPS
            assert rel_error(ours, ref) <= tol, f"output {i}: eager {rel_error(ours, ref):.3g} > {tol:.3g}"
            assert rel_error(ours, stock) <= tol, f"output {i}: eager vs stock {rel_error(ours, stock):.3g}"
            tol = max(tol, floor)
            assert out.shape == stock.shape and out.dtype == stock.dtype, i
            assert torch.isfinite(out).all() and torch.isfinite(ours).all(), f"output {i}: not finite"
            assert rel_error(out, ref) <= tol, f"output {i}: compiled {rel_error(out, ref):.3g} > {tol:.3g}"
            assert rel_error(out, ours) <= tol, f"output {i}: compiled vs eager {rel_error(out, ours):.3g}"


@pytest.fixture(autouse=True)
def _fresh(restore_active_backend, monkeypatch):
    """No forced backend, one thread (tiny models), no compiled code from another test,
    diffusers' notes silenced."""
    import diffusers

    monkeypatch.delenv("ATTNKIT_BACKEND", raising=False)
    threads, verbosity = torch.get_num_threads(), diffusers.utils.logging.get_verbosity()
    torch.set_num_threads(1)
    diffusers.utils.logging.set_verbosity_error()
    dynamo.reset()
    yield
    dynamo.reset()
    torch.set_num_threads(threads)
    diffusers.utils.logging.set_verbosity(verbosity)


def _cases(backend):
    if backend == "eager":
        pairs = [(m, r) for m in TRANSFORMERS for r in ("set_attention_backend", "apply")]
        pairs += [(m, "attention_backend") for m in ("flux", "wan", "qwen")]
        pairs += [("flux", "set_attn_processor"), ("unet", "set_attn_processor"), ("unet", "apply")]
    else:  # one route per model, every route once
        pairs = [
            ("flux", "set_attention_backend"),
            ("wan", "apply"),
            ("sd3", "set_attention_backend"),
            ("qwen", "attention_backend"),
            ("unet2", "set_attn_processor"),
        ]
    return [pytest.param(m, r, backend, id=f"{m}-{r}-{backend}") for m, r in pairs]


@pytest.mark.parametrize("name,route,backend", _cases("eager") + _cases("inductor"))
def test_fullgraph_from_a_cold_model(seed, name, route, backend, monkeypatch):
    spec = MODELS[name]
    model, inputs = spec.build(seed)
    outputs = _Outputs(spec, model, inputs)
    context = _route(model, route, monkeypatch)
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    with context, torch.no_grad():
        out = spec.run(compiled, inputs)  # the model's first call
        eager = spec.run(model, inputs)
    outputs.check(out, eager, INDUCTOR_FLOOR if backend == "inductor" else 0.0)


@pytest.mark.parametrize("name,route", [(m, r) for m, r, _ in (p.values for p in _cases("eager"))])
def test_no_graph_break_from_a_cold_model(seed, name, route, monkeypatch):
    """Without fullgraph: one graph and no break, on the first call and the next."""
    spec = MODELS[name]
    model, inputs = spec.build(seed)
    graphs = []

    def count(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    context = _route(model, route, monkeypatch)
    compiled = torch.compile(model, backend=count)
    counters.clear()
    with context, torch.no_grad():
        first = spec.run(compiled, inputs)
        second = spec.run(compiled, inputs)
    assert dict(counters["graph_break"]) == {}
    assert len(graphs) == 1
    for a, b in zip(first, second):
        assert torch.isfinite(a).all() and torch.equal(a, b)


def test_check_finite_compiles_without_a_host_sync(seed, monkeypatch):
    """ATTNKIT_CHECK_FINITE=1 inside a full graph: a device-side assert instead of the
    eager check's count (a host sync, which fullgraph refuses as data-dependent)."""
    monkeypatch.setenv("ATTNKIT_CHECK_FINITE", "1")
    spec = MODELS["flux"]
    model, inputs = spec.build(seed)
    attnkit.apply(model, attnkit.auto())
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        out = spec.run(compiled, inputs)
        assert rel_error(out[0], spec.run(model, inputs)[0]) <= EPS
        inputs["hidden_states"][0, 0, 0] = float("nan")
        with pytest.raises(RuntimeError, match="ATTNKIT_CHECK_FINITE: .* of a compiled attention call"):
            spec.run(compiled, inputs)


# -- CUDA graphs --------------------------------------------------------------------------
def _offered():
    from attnkit.choose.policy import CANDIDATES

    return list(CANDIDATES)


@pytest.mark.cuda
@pytest.mark.parametrize("label", _offered())
@pytest.mark.parametrize("name", ["flux", "unet"])
def test_reduce_overhead_captures_every_backend(seed, name, label):
    """mode="reduce-overhead": the whole forward in CUDA graphs on each backend attnkit
    offers (through set_attention_backend("attnkit_<label>") on Flux, a named processor on
    the UNet), three calls, each equal to eager; a host sync on the path (.item(),
    bool(tensor), .tolist()) would leave the graph uncaptured."""
    from attnkit.backends import AttentionCall, DeviceInfo
    from attnkit.choose.policy import default_backend
    from attnkit.diffusers.processor import AttnkitProcessor

    dtype = torch.float16 if label.startswith("flash_attn") else torch.float32
    backend = default_backend(label)
    if isinstance(backend, Exception):
        pytest.skip(f"{label} could not be loaded: {backend}")
    device = torch.device("cuda")
    for head_dim in (16,) if name == "flux" else (40, 80, 160):  # the model's head dims
        call = AttentionCall(DeviceInfo.of(device), dtype, head_dim, 64, 77, 2, 2)
        reasons = backend.not_supported_reasons(call)
        if reasons:
            pytest.skip(f"{label} cannot serve this model's calls on this GPU: {'; '.join(reasons)}")
    spec = MODELS[name]
    model, inputs = spec.build(seed)
    model = model.to(device, dtype)
    inputs = {
        k: (
            v.to(device, dtype)
            if torch.is_tensor(v) and v.is_floating_point()
            else v.to(device)
            if torch.is_tensor(v)
            else v
        )
        for k, v in inputs.items()
    }
    if name == "flux":
        model.set_attention_backend(f"attnkit_{label}")
    else:
        model.set_attn_processor(AttnkitProcessor(backend))
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    counters.clear()
    with torch.no_grad():
        eager = spec.run(model, inputs)
        outs = [[t.clone() for t in spec.run(compiled, inputs)] for _ in range(3)]
    torch.cuda.synchronize()
    assert counters["inductor"]["cudagraph_skips"] == 0, "a CUDA graph was not captured"
    # inductor against eager in the same dtype, the whole model reordered: a few units of
    # float16's rounding (eps 9.8e-4), or 10x INDUCTOR_FLOOR in float32 (GPU reductions
    # split differently from the CPU's)
    tol = 5e-3 if dtype == torch.float16 else 10 * INDUCTOR_FLOOR
    for out in outs:
        for a, b in zip(out, eager):
            assert torch.isfinite(a).all()
            assert rel_error(a, b) <= tol
