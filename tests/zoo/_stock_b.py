"""Stock checks of the model zoo, second half (the cases of the classes from
Ideogram4Transformer2DModel on). ``tests_for(cases)`` parametrizes them over one family's cases
of this half, for tests/zoo/test_<family>.py (see _checks.py).

Every case must be usable by a comparison of attention backends, so with diffusers' own
(stock) attention each case is checked for:
- determinism: two forwards with the same inputs are bit-identical, finite, of the expected shapes;
- coverage: every attention module of the model runs in the forward (so a comparison through the
  case touches all of them), and no attention computation runs outside a known attention module
  (so a module class that computes attention cannot be missed);
- sensitivity: perturbing the output of every attention module changes the model output
  measurably (so a comparison through the case can fail).
And the half's class list (in test_zoo_coverage.py): every diffusers model class of this half is
a case or is declared attention-free, and the attention-free ones hold no attention module.

An attention module is a diffusers ``Attention``, an ``AttentionModuleMixin``, or a module of a
class the case names in ``extra["attention_classes"]``. An attention computation is a call of
``F.scaled_dot_product_attention`` or of diffusers' ``dispatch_attention_fn`` (any backend, flex
included); hand-written attention (matmul + softmax, linear attention) is found by name only.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from tests.zoo import _zoo
from tests.zoo._zoo import copy_function

# The split of diffusers' model classes between the two halves of the zoo: this half holds every
# exported ModelMixin subclass from this name on (in Python's string order).
FIRST_CLASS = _zoo.SECOND_HALF_FROM
HALF_CASES = [c for c in _zoo.CASES if _zoo.in_second_half(c.name)]
HALF_NO_ATTENTION = {name: why for name, why in _zoo.NO_ATTENTION.items() if _zoo.in_second_half(name)}

# Scaling every attention output by 1.25 (plus a little noise) must move the model output by at
# least this much, relative to its size (combined over the outputs): 10^4 times float32 round-off.
# The weakest cases (adaLN-gated joint transformers: SD3, Qwen-Image, PRX, their ControlNets) move
# by 2e-3 to 5e-3 with random weights; most move by 1e-2 to 1e-1.
MIN_RELATIVE_CHANGE = 1e-3

SLOW = os.environ.get("ATTNKIT_ZOO_SLOW") == "1"


def _param(case):
    marks = []
    if "slow" in case.extra and not SLOW:
        marks.append(pytest.mark.skip(reason=f"slow case ({case.extra['slow']}); run with ATTNKIT_ZOO_SLOW=1"))
    return pytest.param(case, id=case.id, marks=marks)


@pytest.fixture(scope="module", autouse=True)
def _quiet_single_thread():
    """These models are tiny: one thread is faster than a pool spinning on a shared CPU.
    diffusers' info/warning logs (dtype casts, flex without compile) are noise here."""
    import diffusers

    threads = torch.get_num_threads()
    verbosity = diffusers.utils.logging.get_verbosity()
    torch.set_num_threads(1)
    diffusers.utils.logging.set_verbosity_error()
    yield
    torch.set_num_threads(threads)
    diffusers.utils.logging.set_verbosity(verbosity)


_built: dict = {}


def _model_and_inputs(case, seed):
    """Each case's model and inputs, built once per module (random weights and inputs from the
    module's seed); the tests below leave them unchanged."""
    if case.id not in _built:
        model = case.build(seed)
        _built[case.id] = (model, case.make_inputs(model, seed))
    return _built[case.id]


def _run(case, model, inputs):
    with torch.no_grad():
        return case.run(model, inputs)


# ---------------------------------------------------------------------------------------------
# Attention modules and attention computations
# ---------------------------------------------------------------------------------------------


def _attention_modules(case, model):
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention

    named = set(case.extra.get("attention_classes", ()))
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, (Attention, AttentionModuleMixin)) or type(m).__name__ in named
    ]


def _uncalled_allowed(case, name):
    fragments = case.extra.get("uncalled_attention", ((), ""))[0]
    return any(f".{f}" in f".{name}" for f in fragments)


class _AttentionCalls(TorchFunctionMode):
    """Counts F.scaled_dot_product_attention calls made while no attention module is running."""

    def __init__(self, inside):
        super().__init__()
        self.inside = inside
        self.outside = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention and not self.inside[0]:
            self.outside.append("F.scaled_dot_product_attention")
        return func(*args, **(kwargs or {}))


@pytest.fixture
def dispatch_spy(monkeypatch):
    """Wraps diffusers' dispatch_attention_fn where the model files imported it: every call is
    checked against the `inside` depth counter the test installs."""
    import diffusers.models.attention_dispatch as dispatch

    original = dispatch.dispatch_attention_fn
    state = {"inside": [0], "outside": []}

    def spy(*args, **kwargs):
        if not state["inside"][0]:
            state["outside"].append("dispatch_attention_fn")
        return original(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith("diffusers") and getattr(module, "dispatch_attention_fn", None) is original:
            monkeypatch.setattr(module, "dispatch_attention_fn", spy)
    return state


# ---------------------------------------------------------------------------------------------
# (a) determinism, finiteness, shapes
# ---------------------------------------------------------------------------------------------


def test_stock_forward_is_deterministic(case, module_seed):
    model, inputs = _model_and_inputs(case, module_seed)
    first = _run(case, model, inputs)
    second = _run(case, model, inputs)
    assert tuple(tuple(o.shape) for o in first) == EXPECTED_SHAPES[case.id]
    for i, (a, b) in enumerate(zip(first, second)):
        assert a.dtype == torch.float32, f"output {i}: {a.dtype}"
        assert torch.isfinite(a).all(), f"output {i} is not finite"
        assert torch.equal(a, b), f"output {i} differs between two runs with the same inputs"


# ---------------------------------------------------------------------------------------------
# (b) every attention module runs; no attention outside them
# ---------------------------------------------------------------------------------------------


def test_every_attention_module_runs(case, module_seed, dispatch_spy):
    model, inputs = _model_and_inputs(case, module_seed)
    modules = _attention_modules(case, model)
    assert modules, "the case has no attention module"

    inside = dispatch_spy["inside"]
    calls = {name: 0 for name, _ in modules}
    handles = []
    for name, m in modules:

        def enter(mod, args, name=name):
            inside[0] += 1
            calls[name] += 1

        def leave(mod, args, out):
            inside[0] -= 1

        handles.append(m.register_forward_pre_hook(enter))
        handles.append(m.register_forward_hook(leave))
    # A model run inside a host model (an adapter): the host's own attention modules are known too.
    for host in (v for v in inputs.values() if isinstance(v, torch.nn.Module)):
        own = {id(m) for _, m in modules}
        for _, m in _attention_modules(case, host):
            if id(m) not in own:
                handles.append(m.register_forward_pre_hook(lambda mod, args: inside.__setitem__(0, inside[0] + 1)))
                handles.append(m.register_forward_hook(lambda mod, args, out: inside.__setitem__(0, inside[0] - 1)))
    mode = _AttentionCalls(inside)
    try:
        with mode:
            _run(case, model, inputs)
    finally:
        for h in handles:
            h.remove()

    not_called = [n for n, c in calls.items() if c == 0 and not _uncalled_allowed(case, n)]
    assert not not_called, f"attention modules the forward never calls: {not_called}"
    wrongly_listed = [n for n, c in calls.items() if c and _uncalled_allowed(case, n)]
    assert not wrongly_listed, f"modules listed as never called did run: {wrongly_listed}"
    outside = mode.outside + dispatch_spy["outside"]
    assert not outside, (
        f"{len(outside)} attention call(s) outside any attention module ({sorted(set(outside))}): "
        "a module class computing attention is missing from extra['attention_classes']"
    )


# ---------------------------------------------------------------------------------------------
# (c) the output depends on every attention module's output
# ---------------------------------------------------------------------------------------------


def _perturbed(out, gen):
    """A clear change of an attention output: scaled by 1.25 plus noise of a tenth of its spread."""
    if isinstance(out, torch.Tensor) and out.is_floating_point():
        noise = torch.randn(out.shape, generator=gen).to(out)
        return out * 1.25 + 0.1 * out.detach().std().nan_to_num() * noise
    if isinstance(out, (tuple, list)):
        return type(out)(_perturbed(o, gen) for o in out)
    return out


def test_attention_changes_the_output(case, module_seed):
    model, inputs = _model_and_inputs(case, module_seed)
    reference = _run(case, model, inputs)

    gen = torch.Generator().manual_seed(module_seed)
    handles = [
        m.register_forward_hook(lambda mod, args, out: _perturbed(out, gen))
        for name, m in _attention_modules(case, model)
    ]
    try:
        changed = _run(case, model, inputs)
    finally:
        for h in handles:
            h.remove()

    diff = torch.cat([(a - b).flatten() for a, b in zip(changed, reference)])
    size = torch.cat([b.flatten() for b in reference])
    assert torch.isfinite(diff).all()
    relative = (diff.norm() / size.norm().clamp_min(1e-12)).item()
    assert relative > MIN_RELATIVE_CHANGE, (
        f"perturbing every attention output moved the model output by {relative:.2e} only "
        f"(needed > {MIN_RELATIVE_CHANGE:.0e}): a comparison through this case could not fail"
    )


# Output shapes of every case (structural: from the configs and input sizes of the cases).
EXPECTED_SHAPES = {
    "Ideogram4Transformer2DModel": ((1, 11, 16),),
    "Ideogram4Transformer2DModel-masked": ((2, 11, 16),),
    "Ideogram4Transformer2DModel-fullpad": ((2, 11, 16),),
    "JoyImageEditPlusTransformer3DModel": ((1, 6, 4, 1, 2, 2),),
    "JoyImageEditPlusTransformer3DModel-masked": ((2, 6, 4, 1, 2, 2),),
    "JoyImageEditPlusTransformer3DModel-fullpad": ((2, 6, 4, 1, 2, 2),),
    "JoyImageEditTransformer3DModel": ((2, 4, 1, 4, 6),),
    "JoyImageEditTransformer3DModel-mrope-multi": ((1, 2, 4, 1, 4, 6),),
    "Kandinsky3UNet": ((1, 4, 8, 8),),
    "Kandinsky3UNet-masked": ((2, 4, 8, 8),),
    "Kandinsky5Transformer3DModel": ((2, 2, 4, 6, 4),),
    "Kandinsky6Transformer3DModel": ((1, 2, 4, 6, 4), (1, 5, 6)),
    "Kandinsky6Transformer3DModel-masked": ((2, 2, 4, 6, 4), (2, 5, 6)),
    "Kandinsky6SRTransformer3DModel": ((1, 2, 8, 16, 8),),
    "Kandinsky6SRTransformer3DModel-sparse": ((1, 2, 8, 16, 8),),
    "Krea2Transformer2DModel": ((1, 6, 16),),
    "Krea2Transformer2DModel-masked": ((2, 6, 16),),
    "LTX2VideoDiffusionDecoderModel": ((1, 3, 3, 12, 12),),
    "LTX2VideoTransformer3DModel": ((2, 32, 4), (2, 5, 4)),
    "LTX2VideoTransformer3DModel-masked": ((2, 32, 4), (2, 5, 4)),
    "LTX2VideoTransformer3DModel-ltx23": ((2, 32, 4), (2, 5, 4)),
    "LTXVideoTransformer3DModel": ((2, 32, 4),),
    "LTXVideoTransformer3DModel-masked": ((2, 32, 4),),
    "LTXVideoTransformer3DModel-fullpad": ((2, 32, 4),),
    "LatteTransformer3DModel": ((2, 8, 3, 8, 8),),
    "LongCatAudioDiTTransformer": ((1, 10, 8),),
    "LongCatAudioDiTTransformer-masked": ((2, 10, 8),),
    "LongCatImageTransformer2DModel": ((2, 6, 8),),
    "OvisImageTransformer2DModel": ((2, 6, 8),),
    "Lumina2Transformer2DModel": ((2, 4, 8, 8),),
    "Lumina2Transformer2DModel-masked": ((2, 4, 8, 8),),
    "LuminaNextDiT2DModel": ((2, 4, 8, 8),),
    "LuminaNextDiT2DModel-masked": ((2, 4, 8, 8),),
    "MMAudioVAE": ((2, 16, 24),),
    "MiniMaxH3Transformer3DModel": ((2, 8, 16), (2, 5, 6)),
    "MiniMaxMusic3RVQDepthDecoder": ((2, 7, 32),),
    "MiniMaxMusic3Transformer1DModel": ((2, 8, 10),),
    "MochiTransformer3DModel": ((2, 4, 2, 8, 8),),
    "MochiTransformer3DModel-masked": ((2, 4, 2, 8, 8),),
    "MochiTransformer3DModel-fullpad": ((2, 4, 2, 8, 8),),
    "MotifVideoTransformer3DModel": ((2, 4, 2, 3, 4),),
    "MotifVideoTransformer3DModel-masked": ((2, 4, 2, 3, 4),),
    "UNetMotionModel": ((2, 4, 3, 8, 8),),
    "MotionAdapter": ((2, 4, 3, 8, 8),),
    "MultiControlNetModel": ((2, 16, 8, 8), (2, 16, 8, 8), (2, 16, 4, 4), (2, 32, 4, 4), (2, 32, 4, 4)),
    "NucleusMoEImageTransformer2DModel": ((2, 6, 64),),
    "NucleusMoEImageTransformer2DModel-masked": ((2, 6, 64),),
    "NucleusMoEImageTransformer2DModel-fullpad": ((2, 6, 64),),
    "OmniGenTransformer2DModel": ((2, 4, 6, 6),),
    "OmniGenTransformer2DModel-masked": ((2, 4, 6, 6),),
    "PRXTransformer2DModel": ((2, 4, 6, 8),),
    "PRXTransformer2DModel-masked": ((2, 4, 6, 8),),
    "PRXTransformer2DModel-fullpad": ((2, 4, 6, 8),),
    "PixArtTransformer2DModel": ((2, 8, 8, 8),),
    "PixArtTransformer2DModel-masked": ((2, 8, 8, 8),),
    "PixArtTransformer2DModel-fullpad": ((2, 8, 8, 8),),
    "PriorTransformer": ((2, 24),),
    "PriorTransformer-masked": ((2, 24),),
    "QwenImageTransformer2DModel": ((2, 6, 16),),
    "QwenImageTransformer2DModel-masked": ((2, 6, 16),),
    "QwenImageTransformer2DModel-fullpad": ((2, 6, 16),),
    "QwenImageTransformer2DModel-edit": ((2, 10, 16),),
    "QwenImageControlNetModel": ((2, 6, 32), (2, 6, 32)),
    "QwenImageControlNetModel-masked": ((2, 6, 32), (2, 6, 32)),
    "QwenImageMultiControlNetModel": ((2, 6, 32), (2, 6, 32)),
    "QwenImage21Transformer2DModel": ((2, 8, 4),),
    "QwenImage21Transformer2DModel-edit-masked": ((2, 17, 4),),
    "RFD4ProteinaTransformer": ((2, 7, 3), (2, 7, 4), (2, 7, 10), (2, 7, 7)),
    "RFD4ProteinaTransformer-masked": ((2, 7, 3), (2, 7, 4), (2, 7, 10), (2, 7, 7)),
    "RFD4ProteinaAutoencoder": ((2, 6, 4), (2, 6, 4), (2, 6, 37, 3)),
    "SD3Transformer2DModel": ((2, 4, 8, 8),),
    "SD3Transformer2DModel-sd35": ((2, 4, 8, 8),),
    "SD3ControlNetModel": ((2, 16, 32),),
    "SD3ControlNetModel-single": ((2, 16, 32),),
    "SD3MultiControlNetModel": ((2, 16, 32),),
    "SanaTransformer2DModel": ((2, 4, 6, 8),),
    "SanaTransformer2DModel-masked": ((2, 4, 6, 8),),
    "SanaTransformer2DModel-fullpad": ((2, 4, 6, 8),),
    "SanaTransformer2DModel-sprint": ((2, 4, 6, 8),),
    "SanaControlNetModel": ((2, 48, 32), (2, 48, 32)),
    "SanaVideoTransformer3DModel": ((2, 4, 2, 4, 6),),
    "SanaVideoTransformer3DModel-masked": ((2, 4, 2, 4, 6),),
    "SanaWMTransformer3DModel": ((1, 4, 4, 6, 8),),
    "SanaWMTransformer3DModel-masked": ((2, 4, 4, 6, 8),),
    "SanaWMLTX2RefinerTransformer3DModel": ((2, 32, 4),),
    "SanaWMLTX2RefinerTransformer3DModel-masked": ((2, 32, 4),),
    "SkyReelsV2Transformer3DModel": ((2, 4, 4, 4, 6),),
    "SkyReelsV2Transformer3DModel-i2v": ((2, 4, 4, 4, 6),),
    "SkyReelsV2Transformer3DModel-df": ((1, 4, 4, 4, 6),),
    "WanTransformer3DModel": ((2, 4, 4, 4, 6),),
    "WanTransformer3DModel-i2v": ((2, 4, 4, 4, 6),),
    "WanTransformer3DModel-ti2v": ((2, 4, 4, 4, 6),),
    "WanVACETransformer3DModel": ((2, 4, 4, 4, 6),),
    "WanAnimateTransformer3DModel": ((1, 4, 5, 8, 8),),
    "WanAnimate2Transformer3DModel": ((4, 2, 4, 4),),
    "WanAnimate2Transformer3DModel-generate": ((4, 2, 4, 4), (4, 3, 4, 4)),
    "WanAnimate2Transformer3DModel-generate-eager-mask": ((4, 2, 4, 4), (4, 3, 4, 4)),
    "ZImageTransformer2DModel": ((4, 1, 8, 8), (4, 1, 8, 8)),
    "ZImageTransformer2DModel-masked": ((4, 1, 8, 8), (4, 1, 8, 8)),
    "ZImageControlNetModel": ((2, 96, 32), (2, 96, 32)),
    "StableAudioDiTModel": ((2, 4, 10),),
    "StableAudioDiTModel-masked": ((2, 4, 10),),
    "StableAudio3DiTModel": ((2, 8, 12),),
    "StableAudio3DiTModel-masked": ((2, 8, 12),),
    "StableAudio3DiTModel-plain": ((2, 8, 12),),
    "StableCascadeUNet": ((2, 4, 8, 8),),
    "StableCascadeUNet-decoder": ((2, 4, 8, 8),),
    "SparseControlNetModel": ((6, 16, 8, 8), (6, 16, 8, 8), (6, 16, 4, 4), (6, 32, 4, 4), (6, 32, 4, 4)),
    "T5FilmDecoder": ((2, 12, 8),),
    "T5FilmDecoder-masked": ((2, 12, 8),),
    "Transformer2DModel": ((2, 32, 6, 6),),
    "Transformer2DModel-masked": ((2, 32, 6, 6),),
    "Transformer2DModel-patched": ((2, 8, 8, 8),),
    "Transformer2DModel-vectorized": ((2, 16, 16),),
    "TransformerTemporalModel": ((6, 32, 4, 4),),
    "UNet1DModel": ((2, 2, 64),),
    "UNet2DModel": ((2, 3, 8, 8),),
    "UNet2DConditionModel": ((2, 4, 8, 8),),
    "UNet2DConditionModel-masked": ((2, 4, 8, 8),),
    "UNet2DConditionModel-sdxl": ((2, 4, 8, 8),),
    "UNet2DConditionModel-simple": ((2, 4, 8, 8),),
    "UNet3DConditionModel": ((2, 4, 3, 8, 8),),
    "UNetSpatioTemporalConditionModel": ((2, 3, 4, 8, 8),),
    "UNetControlNetXSModel": ((2, 4, 8, 8),),
    "UVit2DModel": ((2, 32, 8, 8),),
    "UniDiffuserModel": ((2, 4, 8, 8), (2, 1, 10), (2, 5, 12)),
    "VQModel": ((2, 3, 16, 16),),
    "VQModel-movq": ((2, 3, 16, 16),),
}


def tests_for(cases) -> dict:
    """The per-case tests above, parametrized over ``cases`` (one family's cases of this half),
    with this module's fixtures: for a test module's globals (nothing for no cases)."""
    if not cases:
        return {}
    params = pytest.mark.parametrize("case", [_param(c) for c in cases])
    tests = {
        test.__name__: params(copy_function(test))
        for test in (
            test_stock_forward_is_deterministic,
            test_every_attention_module_runs,
            test_attention_changes_the_output,
        )
    }
    return {**tests, "_quiet_single_thread": _quiet_single_thread, "dispatch_spy": dispatch_spy}
