"""The zoo cases of the first half of diffusers' model classes (AceStep... to Ideogram4PromptEnhancerHead),
with their stock attention: what a comparison of attention backends through them relies on.
``tests_for(cases)`` parametrizes the checks over one family's cases of this half, for
tests/zoo/test_<family>.py (see _checks.py).

For every case:
- the stock forward runs twice on the same inputs with identical bits, finite, in the
  expected shape (so a difference seen later comes from the attention, not from noise);
- every attention module of the model is called by the forward (so a comparison through
  the case covers every attention module);
- attention matters: perturbing the output of any one attention module changes the model
  output clearly (so a comparison through the case can fail).
Attention modules are found, not listed: every instance of diffusers' ``Attention``,
``MochiAttention``, ``AttentionModuleMixin``, ``SanaMultiscaleLinearAttention``, torch's
``nn.MultiheadAttention``, and every other diffusers (or transformers) module class whose
methods name an attention primitive (softmax, scaled_dot_product_attention,
dispatch_attention_fn, baddbmm; transformers' attention functions), or whose ``processor``
object's class does.
And one discovery test (in test_zoo_coverage.py): every ``ModelMixin`` class that diffusers
exports in this half of the alphabet has a case, or a reason in NO_ATTENTION.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect

import pytest
import torch
from diffusers.models.attention import AttentionModuleMixin
from diffusers.models.attention_processor import Attention, MochiAttention, SanaMultiscaleLinearAttention
from torch import nn

from tests.zoo import _zoo
from tests.zoo._zoo import copy_function
from tests.zoo._zoo_common import ZooCase

# This file's half of diffusers' exported ModelMixin classes, by sorted name: from FIRST up to
# the second half's first class (_zoo.SECOND_HALF_FROM), exclusive. The last class at the first
# writing was I2VGenXLUNet; Ideogram4PromptEnhancerHead (exported with transformers) sorts after it.
FIRST = "A"
CASES = [c for c in _zoo.CASES if not _zoo.in_second_half(c.name)]
NO_ATTENTION = {name: why for name, why in _zoo.NO_ATTENTION.items() if not _zoo.in_second_half(name)}

ATTENTION_BASES = (
    Attention,
    MochiAttention,
    AttentionModuleMixin,
    SanaMultiscaleLinearAttention,
    nn.MultiheadAttention,
)
# A module class whose own methods reference one of these names computes attention
# (transformers' modules call the function chosen by `config._attn_implementation`).
PRIMITIVES = frozenset(
    {"scaled_dot_product_attention", "dispatch_attention_fn", "softmax", "baddbmm", "multi_head_attention_forward"}
)
TRANSFORMERS_PRIMITIVES = frozenset({"ALL_ATTENTION_FUNCTIONS", "eager_attention_forward"})
# Module classes (or their bases) whose methods reference a primitive without computing attention.
NOT_ATTENTION_CLASSES = {
    "MoEGate": "softmax over the experts' logits: mixture-of-experts routing, not attention",
    "PreTrainedModel": (
        "transformers' model base class (a whole model, and in transformers 5 some encoder stacks too): "
        "names ALL_ATTENTION_FUNCTIONS only to check and set config._attn_implementation; the attention "
        "runs in the model's attention modules, which are found on their own"
    ),
}
# Noise of PERTURBATION times the std of one attention module's output (an attention half
# wrong) must move the model output by at least MIN_EFFECT (relative): 10x the loosest
# tolerance of a backend comparison (_served.py's FALLBACK_TOL, where no float64
# model builds; 2x stock's error + 1e-6 is ~1e-5 or less), so a wrong attention result
# cannot hide in it. The effect depends on the random weights: 40 draws of every case put
# the least at 1.2e-3 or more, and 300 draws of the next weakest at 1.5e-3 or more; the
# cases whose tails went lower (AuraFlow, HunyuanDiT and its ControlNets, the audio VAE)
# carry gains that keep 500-1,000 draws above 1.8e-3.
PERTURBATION = 0.5
MIN_EFFECT = 1e-3


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny models: on a shared machine, OpenMP threads waiting for each other cost more
    # than the work itself.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _code_names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _code_names(const)
    return names


@functools.lru_cache(maxsize=None)
def _calls_primitive(cls: type) -> bool:
    """Whether a method defined by ``cls`` or a base from diffusers / transformers names an
    attention primitive (read from the bytecode: no source parsing)."""
    for klass in cls.__mro__:
        if klass.__name__ in NOT_ATTENTION_CLASSES:
            continue
        module = klass.__module__
        if not (module.startswith("diffusers.") or module.startswith("transformers.")):
            continue
        wanted = PRIMITIVES | (TRANSFORMERS_PRIMITIVES if module.startswith("transformers.") else frozenset())
        for attr in vars(klass).values():
            func = getattr(attr, "__func__", attr)
            code = getattr(func, "__code__", None)
            if code is not None and _code_names(code) & wanted:
                return True
    return False


def _computes_attention(module: nn.Module) -> bool:
    if isinstance(module, ATTENTION_BASES) or _calls_primitive(type(module)):
        return True
    # Modules that keep their attention in a processor object (CosmosCausalAttention...).
    processor = getattr(module, "processor", None)
    return processor is not None and _calls_primitive(type(processor))


def attention_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Every module of ``model`` that computes attention, by qualified name."""
    return {name: m for name, m in model.named_modules() if _computes_attention(m)}


def _perturbed(out, gen: torch.Generator):
    if isinstance(out, torch.Tensor):
        if not out.is_floating_point():
            return out
        noise = torch.randn(out.shape, generator=gen).to(out)
        return out + PERTURBATION * out.detach().float().std().clamp_min(1e-3).to(out.dtype) * noise
    if isinstance(out, tuple):
        return tuple(_perturbed(o, gen) for o in out)
    if isinstance(out, list):
        return [_perturbed(o, gen) for o in out]
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


class Built:
    """A case's model, inputs and stock output, built once per test module."""

    def __init__(self, case: ZooCase, seed: int):
        self.case = case
        self.seed = seed
        self.model = case.build(seed=seed)
        self.inputs = case.make_inputs(self.model, seed=seed)
        with torch.no_grad():
            self.out = case.run(self.model, self.inputs)


_built: dict[str, Built] = {}


@pytest.fixture
def built(request, module_seed) -> Built:
    case: ZooCase = request.param
    missing = [m for m in case.extra.get("requires", ()) if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{case.id} needs {', '.join(missing)}, which `make setup` does not install")
    if case.id not in _built:
        _built[case.id] = Built(case, module_seed % 2**31)
    return _built[case.id]


def _params(cases):
    return [pytest.param(c, id=c.id) for c in cases]


def _expected_shape(b: Built) -> tuple[int, ...] | None:
    shape = b.case.extra.get("out_shape")
    if shape is not None:
        return tuple(shape)
    sample = b.inputs.get(b.case.extra.get("shape_like", "hidden_states"), b.inputs.get("sample"))
    return tuple(sample.shape) if isinstance(sample, torch.Tensor) else None


def test_stock_forward_is_deterministic_finite_and_shaped(built):
    b = built
    with torch.no_grad():
        again = b.case.run(b.model, b.inputs)
    assert len(again) == len(b.out)
    for first, second in zip(b.out, again):
        assert torch.isfinite(first).all(), "the stock forward gives NaN or inf"
        assert torch.equal(first, second), "two stock forwards on the same inputs differ"
        assert first.abs().max() > 0, "the output is all zeros: nothing to compare"
    shape = _expected_shape(b)
    if shape is not None:
        assert tuple(b.out[0].shape) == shape


def test_every_attention_module_is_called(built):
    b = built
    modules = attention_modules(b.model)
    assert modules, f"{b.case.name}: no attention module found"
    calls = dict.fromkeys(modules, 0)
    handles = []
    for name, m in modules.items():

        def count(_m, _args, _out, name=name):
            calls[name] += 1

        handles.append(m.register_forward_hook(count))
    try:
        with torch.no_grad():
            b.case.run(b.model, b.inputs)
    finally:
        for h in handles:
            h.remove()
    never = [f"{n} ({type(modules[n]).__name__})" for n, c in calls.items() if c == 0]
    assert not never, f"attention modules the forward never calls: {never}"


def test_attention_output_matters(built):
    """Perturbing the output of each attention module (one at a time) moves the model's
    output by more than MIN_EFFECT: a wrong attention anywhere would be seen."""
    b = built
    modules = attention_modules(b.model)
    weak = []
    for name, m in modules.items():
        gen = torch.Generator().manual_seed(b.seed)
        handle = m.register_forward_hook(lambda _m, _args, out: _perturbed(out, gen))
        try:
            with torch.no_grad():
                out = b.case.run(b.model, b.inputs)
        finally:
            handle.remove()
        effect = max(_rel(o, ref) for o, ref in zip(out, b.out))
        if not effect > MIN_EFFECT:
            weak.append(f"{name} ({type(m).__name__}): {effect:.2e}")
    assert not weak, f"attention modules whose output barely reaches the model output: {weak}"


def test_masks_reach_the_output(built):
    """Without its masks (all tokens valid) a masked case gives a clearly different output:
    the masks are used, and a backend that dropped them would be seen."""
    b = built
    unmasked = {k: v for k, v in b.inputs.items() if k not in b.case.extra["mask_keys"]}
    with torch.no_grad():
        out = b.case.run(b.model, unmasked)
    effect = max(_rel(o, ref) for o, ref in zip(out, b.out))
    assert effect > MIN_EFFECT, f"dropping {b.case.extra['mask_keys']} changes the output by only {effect:.2e}"


def test_rotary_inputs_reach_the_output(built):
    """Other random rotary angles (the same inputs drawn with another seed, rotary only)
    give a clearly different output: the rotary embedding passed in is used, and a backend
    path that dropped it would be seen."""
    b = built
    other = b.case.make_inputs(b.model, seed=b.seed + 1)
    inputs = dict(b.inputs.items())
    for key in b.case.extra["rotary_keys"]:
        inputs[key] = other[key]
    with torch.no_grad():
        out = b.case.run(b.model, inputs)
    effect = max(_rel(o, ref) for o, ref in zip(out, b.out))
    assert effect > MIN_EFFECT, f"other {b.case.extra['rotary_keys']} change the output by only {effect:.2e}"


def tests_for(cases) -> dict:
    """The per-case tests above, parametrized over ``cases`` (one family's cases of this
    half), with this module's fixtures: for a test module's globals. A test over an empty
    list is left out (it would collect as one skipped test)."""
    masked = [c for c in cases if c.extra.get("mask_keys")]
    rotary = [c for c in cases if c.extra.get("rotary_keys")]
    tests = {}
    for subset, test in (
        (cases, test_stock_forward_is_deterministic_finite_and_shaped),
        (cases, test_every_attention_module_is_called),
        (cases, test_attention_output_matters),
        (masked, test_masks_reach_the_output),
        (rotary, test_rotary_inputs_reach_the_output),
    ):
        if subset:
            tests[test.__name__] = pytest.mark.parametrize("built", _params(subset), indirect=True)(copy_function(test))
    if tests:
        tests.update(_one_thread=_one_thread, built=built)
    return tests
