"""Whole tiny transformers (Flux, Wan, SD3, built from diffusers' configs as the zoo builds
them) with attnkit.auto(lossy="int8") against attnkit.auto() in the same dtype: the
output's relative error is what the INT8 attention costs a model (printed; docs/int8.md
quotes it), and every attention module ran int8 under the guard without falling back.
The kernels run in Triton's interpreter on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch

import attnkit
from attnkit.testing import rel_error
from tests.zoo._zoo import cast_floats
from tests.zoo.cases import flux, sd3, wan

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter paths; the GPU record measures it")


def _case(cases, name):
    return next(c for c in cases if c.name == name and not c.variant)


CASES = {
    "flux": _case(flux.CASES, "FluxTransformer2DModel"),
    "wan": _case(wan.CASES, "WanTransformer3DModel"),
    "sd3": _case(sd3.CASES, "SD3Transformer2DModel"),
}
# The relative error of the whole model's output against exact attention in the same
# dtype, above which the test fails: the int8 kernel's error per attention call on
# random inputs is about 1% (tests/kernels/test_int8.py), and the guard's threshold 5%.
MODEL_ERROR = 0.05


@pytest.mark.parametrize("name", list(CASES))
def test_a_whole_model_with_int8_attention(name, seed, capsys):
    case = CASES[name]
    model = case.build(seed).to(torch.bfloat16)
    inputs = cast_floats(case.make_inputs(model, seed), torch.bfloat16)
    exact_model, int8_model = copy.deepcopy(model), copy.deepcopy(model)
    attnkit.apply(exact_model, attnkit.auto())
    processor = attnkit.auto(lossy="int8")
    attnkit.apply(int8_model, processor)
    with torch.no_grad():
        exact = case.run(exact_model, inputs)
        lossy = case.run(int8_model, inputs)
    states = processor.chooser.guard_states()
    assert states and not any(s.fallen_back for s in states), processor.explain()
    errors = [rel_error(a, b) for a, b in zip(lossy, exact)]
    with capsys.disabled():
        print(
            f"\n{name}: int8 attention, whole-model output relative error against exact attention "
            f"(bf16): {', '.join(f'{e:.4f}' for e in errors)}; {len(states)} module/signature(s), worst sampled "
            f"attention error {max(s.worst_error for s in states):.4f}"
        )
    assert all(e < MODEL_ERROR for e in errors), errors
