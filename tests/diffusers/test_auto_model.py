"""auto() on whole (small) diffusers models: parity with a float64 reference, and
torch.compile(fullgraph=True) with the selection outside the graph."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.attention_processor import AttnProcessor2_0

import attnkit
from attnkit.testing import EPSILON, rel_error
from tests.diffusers._models import cast_inputs, float64_copy, tiny_sd15_unet, tiny_sd21_unet, unet_inputs


@pytest.fixture(autouse=True)
def _no_forced_backend(monkeypatch):
    monkeypatch.delenv("ATTNKIT_BACKEND", raising=False)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # These models are tiny: on a busy machine, OpenMP threads waiting for each other
    # cost 50x more than the work itself.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _run(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


@pytest.mark.slow
@pytest.mark.parametrize("make", [tiny_sd15_unet, tiny_sd21_unet], ids=["sd15", "sd21"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_auto_model_parity_with_float64(seed, make, dtype):
    unet = make(seed=seed % 1000)
    inputs = unet_inputs(unet, batch=2)
    ref = _run(float64_copy(unet), cast_inputs(inputs, torch.float64))

    model = unet.to(dtype)
    low = cast_inputs(inputs, dtype)
    model.set_attn_processor(AttnProcessor2_0())  # diffusers' default, the baseline
    base = rel_error(_run(model, low), ref)
    proc = attnkit.auto()
    report = attnkit.apply(model, proc)
    assert set(report.values()) == {"attnkit"}
    err = rel_error(_run(model, low), ref)
    assert err <= 2 * base + EPSILON[dtype], f"auto {err:.3e} vs diffusers {base:.3e}"
    assert proc.decisions and all(d.backend == "sdpa" for d in proc.decisions)
    # every decision names the module that first needed it
    assert all("attn" in d.module for d in proc.decisions)


@pytest.mark.slow
def test_auto_under_torch_compile_fullgraph(seed):
    torch._dynamo.reset()
    unet = tiny_sd15_unet(seed=seed % 1000)
    inputs = unet_inputs(unet, batch=2)
    eager_proc = attnkit.auto()
    attnkit.apply(unet, eager_proc)
    expected = _run(unet, inputs)

    proc = attnkit.auto()
    attnkit.apply(unet, proc)  # a fresh processor: every decision is made while tracing
    from torch._dynamo.utils import counters

    counters.clear()
    compiled = torch.compile(unet, backend="eager", fullgraph=True)  # raises on a graph break
    out = _run(compiled, inputs)
    out2 = _run(compiled, unet_inputs(unet, batch=2))
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    assert torch.allclose(out, expected, atol=1e-5, rtol=1e-5)
    assert out2.shape == out.shape
    # the choice was made once per (dtype, head dim, mask) while tracing, not per call
    text = proc.explain()
    assert "[compiled] cpu float32 D=40 any M, N mask=none -> sdpa" in text
    assert "[compiled] cpu float32 D=160 any M, N mask=none -> sdpa" in text
    torch._dynamo.reset()
