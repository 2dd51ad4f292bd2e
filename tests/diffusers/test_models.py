"""Whole diffusers models with each attnkit processor against a float64 reference.

The models are built from configs (random weights, fixed seed, no hub) with the
attention layout of SD1.5 (head dims 40/80/160), SD2.1 (upcast_attention, linear
projection) and SDXL (text_time embedding, several transformer layers), at reduced
widths. The reference is the same model in float64 running diffusers' own
AttnProcessor. Tolerance: 2x the error of diffusers' stock processor in the same dtype
against that reference, plus epsilon (the rule of attnkit.testing).
"""

from __future__ import annotations

import pytest
import torch
from diffusers.models.attention_processor import AttnProcessor

import attnkit
from attnkit.testing import EPSILON, rel_error
from tests.diffusers._models import (
    cast_inputs,
    float64_copy,
    tiny_sd15_unet,
    tiny_sd21_unet,
    tiny_sdxl_unet,
    tiny_vae,
    unet_inputs,
)

MODELS = {"sd15": tiny_sd15_unet, "sd21": tiny_sd21_unet, "sdxl": tiny_sdxl_unet}


def _triton():
    """The Triton kernel through the processor: compiled on CUDA; on the CPU through
    Triton's interpreter (conftest switches it on), which runs the same kernel code."""
    pytest.importorskip("triton", reason="triton is not installed (Linux only)")
    return attnkit.TritonProcessor()


PROCESSORS = {
    "vanilla": attnkit.VanillaProcessor,
    "sliced": lambda: attnkit.SlicedProcessor(slice_size="auto"),
    "sdpa": attnkit.SDPAProcessor,
    "auto": attnkit.auto,
    "triton": _triton,
}

_cache: dict = {}


def _model_and_reference(name):
    """Build each model and its float64 copy once per test session."""
    if name not in _cache:
        model = MODELS[name]()
        _cache[name] = (model, float64_copy(model))
    return _cache[name]


def _forward(model, kw):
    with torch.no_grad():
        return model(**kw).sample


@pytest.mark.parametrize("proc_name", list(PROCESSORS))
@pytest.mark.parametrize("model_name", list(MODELS))
def test_unet_matches_float64_reference(seed, model_name, proc_name):
    model, ref_model = _model_and_reference(model_name)
    kw = unet_inputs(model, batch=2)
    ref = _forward(ref_model, cast_inputs(kw, torch.float64))
    model.set_attn_processor(AttnProcessor())
    baseline = rel_error(_forward(model, kw), ref)
    model.set_attn_processor(PROCESSORS[proc_name]())
    out = _forward(model, kw)
    err = rel_error(out, ref)
    assert err <= 2 * baseline + EPSILON[torch.float32], f"{err:.3e} vs stock {baseline:.3e}"


@pytest.mark.parametrize("proc_name", ["vanilla", "sliced", "sdpa", "auto", "triton"])
def test_unet_with_encoder_attention_mask(seed, proc_name):
    """A boolean encoder_attention_mask: the UNet turns it into a -10000 bias per key."""
    model, ref_model = _model_and_reference("sd15")
    kw = unet_inputs(model, batch=2)
    keep = torch.ones(2, 77, dtype=torch.bool)
    keep[0, 20:] = False
    keep[1, 50:] = False
    kw["encoder_attention_mask"] = keep
    ref = _forward(ref_model, cast_inputs(kw, torch.float64))
    unmasked = _forward(
        ref_model, cast_inputs({k: v for k, v in kw.items() if k != "encoder_attention_mask"}, torch.float64)
    )
    assert rel_error(unmasked, ref) > 1e-3, "the mask must change the output, or this test proves nothing"
    model.set_attn_processor(AttnProcessor())
    baseline = rel_error(_forward(model, kw), ref)
    model.set_attn_processor(PROCESSORS[proc_name]())
    err = rel_error(_forward(model, kw), ref)
    assert err <= 2 * baseline + EPSILON[torch.float32]


@pytest.mark.parametrize("proc_name", ["vanilla", "sdpa"])
def test_sd21_upcast_in_float16(seed, proc_name):
    """SD2.1 sets upcast_attention because its fp16 attention overflows; in fp16 our
    processors must hold scores in fp32 and stay as close as diffusers' stock one."""
    model, ref_model = _model_and_reference("sd21")
    half = tiny_sd21_unet().half()
    kw = unet_inputs(model, batch=1)
    ref = _forward(ref_model, cast_inputs(kw, torch.float64))
    kw16 = cast_inputs(kw, torch.float16)
    half.set_attn_processor(AttnProcessor())
    baseline = rel_error(_forward(half, kw16), ref)
    half.set_attn_processor(PROCESSORS[proc_name]())
    out = _forward(half, kw16)
    assert torch.isfinite(out).all()
    assert rel_error(out, ref) <= 2 * baseline + EPSILON[torch.float16]


@pytest.mark.parametrize("proc_name", ["vanilla", "sliced", "sdpa", "triton"])
def test_vae_matches_float64_reference(seed, proc_name):
    """The VAE's single-head attention on (B, C, H, W) with group norm and residual."""
    vae = tiny_vae()
    ref_vae = float64_copy(vae)
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        ref = ref_vae(x.double()).sample
        vae.set_attn_processor(AttnProcessor())
        baseline = rel_error(vae(x).sample, ref)
        vae.set_attn_processor(PROCESSORS[proc_name]())
        err = rel_error(vae(x).sample, ref)
    assert err <= 2 * baseline + EPSILON[torch.float32]


def _grads(m, inputs, weight):
    m.zero_grad(set_to_none=True)
    sample = inputs["sample"].detach().requires_grad_()
    out = m(**{**inputs, "sample": sample}).sample
    (out * weight).sum().backward()
    flat = [p.grad.flatten() for p in m.parameters() if p.grad is not None]
    m.zero_grad(set_to_none=True)
    return torch.cat(flat + [sample.grad.flatten()])


@pytest.fixture(scope="module")
def grad_reference(module_seed):
    """Inputs drawn fresh each run, and the float64 and stock-fp32 gradients, computed
    once for all processors (a float64 backward is the slow part)."""
    model, ref_model = _model_and_reference("sd15")
    kw = unet_inputs(model, batch=1, text_len=11)
    grad_out = torch.randn(1, 4, 8, 8)
    ref = _grads(ref_model, cast_inputs(kw, torch.float64), grad_out.double())
    model.set_attn_processor(AttnProcessor())
    baseline = rel_error(_grads(model, kw, grad_out), ref)
    return kw, grad_out, ref, baseline, module_seed


@pytest.mark.parametrize("proc_name", ["vanilla", "sliced", "sdpa", "auto", "triton"])
def test_unet_gradients_match_reference(grad_reference, proc_name):
    """People fine-tune through these processors: parameter and input gradients agree."""
    model, _ = _model_and_reference("sd15")
    kw, grad_out, ref, baseline, drawn_with = grad_reference
    model.set_attn_processor(PROCESSORS[proc_name]())
    err = rel_error(_grads(model, kw, grad_out), ref)
    assert err <= 2 * baseline + EPSILON[torch.float32], (
        f"{err:.3e} vs stock {baseline:.3e} (inputs drawn with seed={drawn_with})"
    )
