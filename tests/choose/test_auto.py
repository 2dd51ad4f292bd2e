"""attnkit.auto() on real CPU calls: the per-signature cache and its log, explain(),
ATTNKIT_BACKEND, fallback on a backend that raises, instances and options."""

from __future__ import annotations

import logging

import pytest
import torch
from diffusers.models.attention_processor import Attention

import attnkit
from attnkit.backends import AttentionCall, BackendUnavailable, DeviceInfo
from attnkit.backends.sdpa import SDPABackend
from attnkit.backends.sliced import SlicedBackend
from attnkit.backends.vanilla import VanillaBackend
from attnkit.diffusers.processor import AutoProcessor
from attnkit.testing import assert_close_to_reference, make_bias, make_qkv

H100 = DeviceInfo("cuda", (9, 0), "NVIDIA H100 80GB HBM3")
T4 = DeviceInfo("cuda", (7, 5), "Tesla T4")
ALL = {"flash_attn": "2.6.3", "flash_attn_3": "3.0.0b1", "xformers": "0.0.28", "triton": "3.1.0"}


@pytest.fixture(autouse=True)
def _no_forced_backend(monkeypatch):
    monkeypatch.delenv("ATTNKIT_BACKEND", raising=False)


def qkv(dtype=torch.float32, m=24, n=24, mask="none"):
    """The processor's strided (B, N, H, D) views, and a bias of one kind."""
    q, k, v = make_qkv(2, 2, m, n, 16, dtype, layout="bnhd")
    kind = {"none": "none", "key_padding": "key_padding", "bias": "full"}[mask]
    bias = make_bias(kind, 2, 2, m, n, dtype)
    if bias is not None and mask == "bias":
        bias[:, :, 0, :] = float("-inf")  # a fully masked query row gives zeros
    return q, k, v, bias


def module():
    return Attention(query_dim=32, heads=2, dim_head=16)


@pytest.mark.parametrize("mask", ["none", "key_padding", "bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_auto_matches_reference(seed, mask, dtype):
    proc = attnkit.auto()
    q, k, v, bias = qkv(dtype, mask=mask)
    out = proc.chooser.attention(module(), q, k, v, bias, 16**-0.5, False)
    assert_close_to_reference(out, q, k, v, bias, 16**-0.5)
    assert proc.decisions[0].backend == "sdpa"
    assert proc.decisions[0].call.mask == mask


class Counting(SDPABackend):
    """SDPA that counts its capability checks and its calls."""

    def __init__(self):
        super().__init__()
        self.checks = self.calls = 0

    def not_supported_reasons(self, call):
        self.checks += 1
        return super().not_supported_reasons(call)

    def forward(self, *args, **kwargs):
        self.calls += 1
        return super().forward(*args, **kwargs)


def test_decision_is_cached_per_signature_and_logged_once(seed, caplog):
    counting = Counting()
    proc = attnkit.auto(backends={"sdpa": counting})
    attn = module()
    attn.set_processor(proc)
    x = torch.randn(2, 10, 32)
    with caplog.at_level(logging.INFO, logger="attnkit"):
        for _ in range(3):
            attn(x)
        attn(torch.randn(2, 12, 32))  # a new query length: a new signature
        attn(torch.randn(3, 12, 32))  # a new batch: a new signature too
    assert counting.checks == 3 and counting.calls == 5
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("attnkit.auto:")]
    assert len(lines) == 3
    assert "sdpa for cpu float32 D=16 M=10 N=10 mask=none" in lines[0]
    assert len(proc.decisions) == 3


def test_decisions_are_bounded_oldest_first(seed, monkeypatch):
    """A process whose shapes never repeat keeps DECISIONS_MAX signatures: the oldest
    go first, explain() says how many went, and one that comes back is decided again."""
    proc = attnkit.auto()
    proc.chooser.decisions_max = 3  # this chooser's own bound (AutoChooser.decisions_max: DECISIONS_MAX)
    attn = module()
    attn.set_processor(proc)
    lengths = [4, 5, 6, 7, 8]
    for n in lengths:
        out = attn(torch.randn(1, n, 32))
        assert torch.isfinite(out).all()
    kept = [r.call.q_len for r in proc.decisions]
    assert kept == [6, 7, 8], kept
    assert len(proc.chooser._decisions) == 3
    assert "3 call signature(s) (and 2 older, no longer kept)" in proc.explain()
    q, k, v = make_qkv(1, 2, 4, 4, 16)
    out = proc.chooser.attention(attn, q, k, v, None, None, False)  # a dropped signature, decided again
    assert_close_to_reference(out, q, k, v)
    assert [r.call.q_len for r in proc.decisions] == [7, 8, 4]


def test_log_names_the_module_and_the_skipped(seed, caplog):
    unet_like = torch.nn.Module()
    unet_like.block = module()
    proc = attnkit.auto(order=["xformers", "sdpa", "vanilla"])
    # attnkit.apply names the modules of a diffusers model; name this one by hand
    unet_like.block._attnkit_name = "down_blocks.0.attentions.0.transformer_blocks.0.attn1"
    unet_like.block.set_processor(proc)
    with caplog.at_level(logging.INFO, logger="attnkit"):
        unet_like.block(torch.randn(1, 8, 32))
    msg = [r.getMessage() for r in caplog.records if r.getMessage().startswith("attnkit.auto:")][0]
    assert msg.startswith("attnkit.auto: down_blocks.0.attentions.0.transformer_blocks.0.attn1")
    assert ": sdpa for" in msg and "xformers: " in msg and "device=cpu (supported: cuda)" in msg
    assert msg.endswith("[priority, order=xformers>sdpa>vanilla]")


def test_explain_lists_every_decision_and_reason(seed):
    proc = attnkit.auto(order=["flash_attn", "sdpa", "vanilla"])
    q, k, v, bias = qkv(mask="key_padding")
    proc.chooser.attention(module(), q, k, v, bias, None, False)
    text = proc.explain()
    assert "cpu float32 D=16 M=24 N=24 mask=key_padding -> sdpa" in text
    assert "mask=key_padding (supported: none)" in text
    rows = {line.split()[0]: line.split(None, 1)[1] for line in text.splitlines() if line.startswith("    ")}
    assert rows["sdpa"] == "chosen" and rows["vanilla"] == "can run"
    # and for a described device: the processor's own order
    text = proc.explain(AttentionCall(H100, torch.float16, 64, packages=ALL))
    assert "-> flash_attn" in text and "order: order=flash_attn>sdpa>vanilla" in text


def test_explain_default_lists_class_order():
    text = attnkit.auto().explain(AttentionCall(T4, torch.float16, 64, packages=ALL))
    assert "order: sm_75-" in text and "-> xformers" in text


# -- ATTNKIT_BACKEND ---------------------------------------------------------------------
def test_forced_backend_runs_it(seed, monkeypatch):
    monkeypatch.setenv("ATTNKIT_BACKEND", "vanilla")
    proc = attnkit.auto()
    q, k, v, bias = qkv(mask="bias")
    out = proc.chooser.attention(module(), q, k, v, bias, None, False)
    assert_close_to_reference(out, q, k, v, bias)
    assert proc.decisions[0].backend == "vanilla" and proc.decisions[0].how == "forced"


def test_forced_backend_ignores_exclude(seed, monkeypatch):
    monkeypatch.setenv("ATTNKIT_BACKEND", "vanilla")
    proc = attnkit.auto(exclude=["vanilla"])
    q, k, v, _ = qkv()
    proc.chooser.attention(module(), q, k, v, None, None, False)
    assert proc.decisions[0].backend == "vanilla"


def test_forced_backend_that_cannot_run_raises_its_reasons(seed, monkeypatch):
    monkeypatch.setenv("ATTNKIT_BACKEND", "flash_attn")
    proc = attnkit.auto()
    q, k, v, _ = qkv()
    with pytest.raises(BackendUnavailable) as err:
        proc.chooser.attention(module(), q, k, v, None, None, False)
    msg = str(err.value)
    assert "ATTNKIT_BACKEND=flash_attn" in msg and "device=cpu (supported: cuda)" in msg
    assert "Unset ATTNKIT_BACKEND" in msg
    assert "device=cpu (supported: cuda)" in err.value.reasons["flash_attn"]


class _Broken(SDPABackend):
    """Declares it can run, then raises: a kernel that fails at run time."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        raise RuntimeError("broken for the test")


def test_forced_backend_never_falls_back(seed, monkeypatch):
    monkeypatch.setenv("ATTNKIT_BACKEND", "sdpa")
    proc = attnkit.auto(backends={"sdpa": _Broken()})
    q, k, v, _ = qkv()
    with pytest.raises(RuntimeError, match="broken for the test"):
        proc.chooser.attention(module(), q, k, v, None, None, False)


def test_forced_unknown_name(monkeypatch):
    monkeypatch.setenv("ATTNKIT_BACKEND", "fastest")
    with pytest.raises(ValueError, match="ATTNKIT_BACKEND='fastest' is not a backend"):
        attnkit.auto()


def test_info_reports_the_forced_backend(monkeypatch):
    from attnkit import info

    monkeypatch.setenv("ATTNKIT_BACKEND", "vanilla")
    data = info.collect()
    assert data["forced"] == "vanilla" and data["priority"] == ["vanilla"]
    assert all(r["self"]["backend"] == "vanilla" for r in data["sd15"])
    assert "forced by ATTNKIT_BACKEND=vanilla" in info.report(data)
    monkeypatch.setenv("ATTNKIT_BACKEND", "fastest")
    data = info.collect()
    assert "ATTNKIT_BACKEND='fastest' is not a backend" in info.report(data)


# -- fallback ------------------------------------------------------------------------------
def test_fallback_on_a_backend_that_raises(seed, caplog):
    broken = _Broken()
    proc = attnkit.auto(backends={"sdpa": broken})
    q, k, v, bias = qkv(mask="bias")
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        for _ in range(3):
            out = proc.chooser.attention(module(), q, k, v, bias, None, False)
            assert_close_to_reference(out, q, k, v, bias)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "sdpa failed" in warnings[0].getMessage()
    assert "falling back to sliced" in warnings[0].getMessage()
    assert broken.calls == 1  # the failure is remembered
    record = proc.decisions[0]
    assert record.backend == "sliced" and record.how == "fallback"
    assert "failed at run time (RuntimeError: broken for the test)" in proc.explain()


def test_fallback_when_everything_fails_raises_the_first_error(seed):
    proc = attnkit.auto(order=["sdpa", "vanilla"], backends={"sdpa": _Broken(), "vanilla": _Broken()})
    q, k, v, _ = qkv()
    with pytest.raises(RuntimeError, match="broken for the test"):
        proc.chooser.attention(module(), q, k, v, None, None, False)


def test_backend_options_reach_the_backend(seed):
    proc = attnkit.auto(order=["sliced"], backend_options={"sliced": {"slice_size": 1}})
    q, k, v, bias = qkv(mask="bias")
    assert_close_to_reference(proc.chooser.attention(module(), q, k, v, bias, None, False), q, k, v, bias)
    assert proc.chooser.backend("sliced").slice_size == 1
    with pytest.raises(ValueError, match=r"backend_options\['sliced'\]: slice_size=0"):
        attnkit.auto(backend_options={"sliced": {"slice_size": 0}})


def test_injected_instances_are_used(seed):
    mine = SlicedBackend(slice_size=1)
    proc = attnkit.auto(order=["sliced", "vanilla"], backends={"sliced": mine})
    q, k, v, _ = qkv()
    proc.chooser.attention(module(), q, k, v, None, None, False)
    assert proc.chooser.backend("sliced") is mine
    assert isinstance(proc.chooser.backend("vanilla"), VanillaBackend)


def test_processor_by_name_and_repr():
    proc = attnkit.processor("auto", tune=False, exclude=["xformers"])
    assert isinstance(proc, AutoProcessor)
    assert "exclude=['xformers']" in repr(proc)
    with pytest.raises(ValueError, match="choose one of vanilla, sliced, sdpa"):
        attnkit.processor("fastest")
