"""attnkit.auto(): the priority rules per hardware class (on described devices), the
per-signature cache, ATTNKIT_BACKEND, fallback on a backend that raises, explain(),
and the tuning cache file."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os

import pytest
import torch
from diffusers.models.attention_processor import Attention

import attnkit
from attnkit import selector
from attnkit.backends import AttentionCall, BackendUnavailable, DeviceInfo
from attnkit.backends.sdpa import SDPABackend
from attnkit.selector import (
    CANDIDATES,
    LAST_RESORT,
    PRIORITIES,
    AutoProcessor,
    choose,
    hardware_class,
    read_cache,
    update_cache,
)
from attnkit.testing import assert_close_to_reference

ALL = {"flash_attn": "2.6.3", "flash_attn_3": "3.0.0b1", "xformers": "0.0.28", "triton": "3.1.0"}
NONE: dict = {}

H100 = DeviceInfo("cuda", (9, 0), "NVIDIA H100 80GB HBM3")
A100 = DeviceInfo("cuda", (8, 0), "NVIDIA A100-SXM4-80GB")
RTX4090 = DeviceInfo("cuda", (8, 9), "NVIDIA GeForce RTX 4090")
A10 = DeviceInfo("cuda", (8, 6), "NVIDIA A10")
T4 = DeviceInfo("cuda", (7, 5), "Tesla T4")
V100 = DeviceInfo("cuda", (7, 0), "Tesla V100-SXM2-16GB")
B200 = DeviceInfo("cuda", (10, 0), "NVIDIA B200")
MI300 = DeviceInfo("cuda", (9, 4), "AMD Instinct MI300X")
CPU = DeviceInfo("cpu")
MPS = DeviceInfo("mps")


def call(device, dtype=torch.float16, d=64, mask="none", grad=False, packages=ALL, m=1024, n=1024):
    return AttentionCall(device, dtype, d, q_len=m, kv_len=n, batch=2, heads=8, mask=mask,
                         requires_grad=grad, packages=packages)


@pytest.fixture(autouse=True)
def _no_forced_backend(monkeypatch):
    monkeypatch.delenv("ATTNKIT_BACKEND", raising=False)


# -- the rules, per hardware class --------------------------------------------------------
@pytest.mark.parametrize(
    "device, cls",
    [(H100, "sm_90"), (A100, "sm_80"), (RTX4090, "sm_86-89"), (A10, "sm_86-89"), (T4, "sm_75-"),
     (V100, "sm_75-"), (B200, "sm_100+"), (MI300, "rocm"), (CPU, "cpu"), (MPS, "mps"),
     (DeviceInfo("cuda"), "cuda"), (DeviceInfo("hpu"), "other")],
)
def test_hardware_class(device, cls):
    assert hardware_class(device) == cls


@pytest.mark.parametrize(
    "device, packages, dtype, d, mask, grad, expected",
    [
        # everything installed: each class's first choice
        (H100, ALL, torch.float16, 64, "none", False, "flash_attn3"),
        (H100, {**ALL, "flash_attn_3": None}, torch.bfloat16, 64, "none", False, "flash_attn"),
        (A100, ALL, torch.float16, 40, "none", False, "flash_attn"),
        (RTX4090, ALL, torch.float16, 80, "none", True, "flash_attn"),
        (T4, ALL, torch.float16, 40, "none", False, "xformers"),
        (V100, ALL, torch.float32, 160, "bias", False, "xformers"),
        (B200, ALL, torch.float16, 64, "none", False, "sdpa"),
        (MI300, ALL, torch.float16, 64, "none", False, "sdpa"),
        (CPU, ALL, torch.float32, 40, "none", False, "sdpa"),
        (CPU, ALL, torch.float16, 40, "key_padding", True, "sdpa"),
        (MPS, ALL, torch.float16, 64, "none", False, "sdpa"),
        # nothing optional installed: SDPA everywhere
        (H100, NONE, torch.float16, 64, "none", False, "sdpa"),
        (A100, NONE, torch.float16, 64, "none", False, "sdpa"),
        (T4, NONE, torch.float16, 64, "none", False, "sdpa"),
        # call kinds that flash_attn does not take go elsewhere
        (H100, ALL, torch.float16, 64, "key_padding", False, "sdpa"),
        (A100, ALL, torch.float16, 64, "bias", False, "sdpa"),
        (A100, ALL, torch.float32, 64, "none", False, "sdpa"),
        (A100, ALL, torch.float16, 512, "none", False, "sdpa"),
        (H100, ALL, torch.float32, 64, "none", True, "sdpa"),
        (RTX4090, ALL, torch.float16, 64, "key_padding", False, "sdpa"),
        # xformers takes fp32 and masks on Turing; beyond its limits SDPA serves
        (T4, ALL, torch.float16, 40, "key_padding", True, "xformers"),
        (T4, ALL, torch.float64, 40, "none", False, "sdpa"),
        # float64 only the universal kernels take
        (A100, ALL, torch.float64, 64, "bias", False, "sdpa"),
    ],
)
def test_choice_per_hardware_and_call_kind(device, packages, dtype, d, mask, grad, expected):
    label, table = choose(call(device, dtype, d, mask, grad, packages))
    assert label == expected, table
    assert table[label] == []
    order = list(table)
    for skipped in order[: order.index(label)]:
        assert table[skipped], f"{skipped} can run but was skipped"


def test_skipped_backends_say_why():
    _, table = choose(call(A100, torch.float32, 512, "bias", packages={"xformers": "0.0.28"}))
    reasons = " | ".join(table["flash_attn"])
    assert "flash_attn is not installed" in reasons
    assert "dtype=torch.float32 (supported: float16, bfloat16)" in reasons
    assert "head_dim=512 > 256" in reasons
    assert "mask=bias (supported: none)" in reasons
    _, table = choose(call(T4, packages=ALL), order=["flash_attn", "sdpa"])
    assert "compute capability 7.5 < 8.0" in table["flash_attn"]


def test_priority_lists_are_data_with_reasons():
    for cls, priority in PRIORITIES.items():
        assert priority.why and len(priority.why) > 40, cls
        assert set(priority.order) <= set(CANDIDATES), cls
        assert len(set(priority.order)) == len(priority.order), cls
        # the last resorts come last, in every list, so auto() can always run
        assert priority.order[-len(LAST_RESORT):] == LAST_RESORT, cls
        assert not set(LAST_RESORT) & set(priority.order[: -len(LAST_RESORT)]), cls
    for host in ("cpu", "mps", "xpu", "other", "rocm"):
        assert "triton" not in PRIORITIES[host].order


def test_never_triton_on_cpu_even_if_it_could_run():
    class _AnythingGoes(SDPABackend):
        name = "triton"

    label, table = choose(call(CPU, torch.float32), backends={"triton": _AnythingGoes()})
    assert label == "sdpa" and "triton" not in table


def test_last_resort_when_nothing_fused_can_run():
    class _Refuses(SDPABackend):
        def not_supported_reasons(self, call):
            return ["refused for the test"]

    label, table = choose(call(A100, packages=NONE), backends={"sdpa": _Refuses()})
    assert label == "sliced"
    assert table["sdpa"] == ["refused for the test"]


def test_triton_serves_what_the_fused_kernels_before_it_cannot():
    class _Refuses(SDPABackend):
        def not_supported_reasons(self, call):
            return ["refused for the test"]

    only_triton = {"triton": "3.1.0"}
    label, _ = choose(call(A100, packages=only_triton), backends={"sdpa": _Refuses()})
    assert label == "triton"
    # but not on Turing, where its tiles are not built
    label, table = choose(call(T4, packages=only_triton), backends={"sdpa": _Refuses()})
    assert label == "sliced" and "compute capability 7.5 < 8.0" in table["triton"]


def test_no_backend_at_all_raises_with_every_reason():
    with pytest.raises(BackendUnavailable, match="device=hpu"):
        choose(call(DeviceInfo("hpu"), packages=NONE))


def test_rules_are_pure_functions_of_the_description():
    c = call(H100, packages=ALL)
    assert choose(c) == choose(c)
    assert choose(c)[0] != choose(call(H100, packages=NONE))[0]


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown backend"):
        attnkit.auto(order=["sdpa", "fast"])
    with pytest.raises(ValueError, match="unknown backend"):
        attnkit.auto(exclude=["nope"])


# -- the processor on real CPU calls -------------------------------------------------------
def qkv(dtype=torch.float32, b=2, h=2, m=24, n=24, d=16, mask=None):
    q = torch.randn(b, m, h, d, dtype=dtype).transpose(1, 2)  # the processor's views
    k = torch.randn(b, n, h, d, dtype=dtype).transpose(1, 2)
    v = torch.randn(b, n, h, d, dtype=dtype).transpose(1, 2)
    bias = None
    if mask == "key_padding":
        keep = torch.rand(b, 1, 1, n) > 0.3
        keep[..., 0] = True
        bias = torch.zeros(b, 1, 1, n, dtype=dtype).masked_fill(~keep, float("-inf"))
    elif mask == "bias":
        bias = torch.randn(b, h, m, n, dtype=dtype)
        bias[:, :, 0, :] = float("-inf")  # a fully masked query row gives zeros
    return q, k, v, bias


def module():
    return Attention(query_dim=32, heads=2, dim_head=16)


@pytest.mark.parametrize("mask", ["none", "key_padding", "bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_auto_matches_reference(seed, mask, dtype):
    proc = attnkit.auto()
    q, k, v, bias = qkv(dtype, mask=None if mask == "none" else mask)
    out = proc.attention(module(), q, k, v, bias, 16**-0.5, False)
    assert_close_to_reference(out, q, k, v, bias, 16**-0.5)
    assert proc.decisions[0].backend == "sdpa"
    assert proc.decisions[0].call.mask == mask


def test_decision_is_cached_and_logged_once(seed, caplog, monkeypatch):
    proc = attnkit.auto()
    attn = module()
    attn.set_processor(proc)
    calls = []
    real = proc._table
    monkeypatch.setattr(proc, "_table", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    x = torch.randn(2, 10, 32)
    with caplog.at_level(logging.INFO, logger="attnkit"):
        for _ in range(3):
            attn(x)
        attn(torch.randn(2, 12, 32))  # a new query length: a new signature
    assert len(calls) == 2
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("attnkit.auto:")]
    assert len(lines) == 2
    assert "sdpa for cpu float32 D=16 M=10 N=10 mask=none" in lines[0]
    assert len(proc.decisions) == 2


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


def test_explain_lists_every_decision_and_reason(seed):
    proc = attnkit.auto(order=["flash_attn", "sdpa", "vanilla"])
    q, k, v, bias = qkv(mask="key_padding")
    proc.attention(module(), q, k, v, bias, None, False)
    text = proc.explain()
    assert "cpu float32 D=16 M=24 N=24 mask=key_padding -> sdpa" in text
    assert "mask=key_padding (supported: none)" in text
    rows = {line.split()[0]: line.split(None, 1)[1] for line in text.splitlines() if line.startswith("    ")}
    assert rows["sdpa"] == "chosen" and rows["vanilla"] == "can run"
    # and for a described device
    text = proc.explain(call(H100, packages=ALL))
    assert "-> flash_attn" in text


def test_explain_default_lists_class_order():
    text = attnkit.auto().explain(call(T4, packages=ALL))
    assert "order: sm_75-" in text and "-> xformers" in text


# -- ATTNKIT_BACKEND ---------------------------------------------------------------------
def test_forced_backend_runs_it(seed, monkeypatch):
    monkeypatch.setenv("ATTNKIT_BACKEND", "vanilla")
    proc = attnkit.auto()
    q, k, v, bias = qkv(mask="bias")
    out = proc.attention(module(), q, k, v, bias, None, False)
    assert_close_to_reference(out, q, k, v, bias)
    assert proc.decisions[0].backend == "vanilla" and proc.decisions[0].how == "forced"


def test_forced_backend_that_cannot_run_raises_its_reasons(seed, monkeypatch):
    monkeypatch.setenv("ATTNKIT_BACKEND", "flash_attn")
    proc = attnkit.auto()
    q, k, v, _ = qkv()
    with pytest.raises(BackendUnavailable) as err:
        proc.attention(module(), q, k, v, None, None, False)
    msg = str(err.value)
    assert "ATTNKIT_BACKEND=flash_attn" in msg and "device=cpu (supported: cuda)" in msg
    assert "Unset ATTNKIT_BACKEND" in msg


def test_forced_backend_never_falls_back(seed, monkeypatch):
    monkeypatch.setenv("ATTNKIT_BACKEND", "sdpa")
    proc = attnkit.auto()
    proc._slots["sdpa"].backend = _Broken()
    q, k, v, _ = qkv()
    with pytest.raises(RuntimeError, match="broken for the test"):
        proc.attention(module(), q, k, v, None, None, False)


def test_forced_unknown_name(monkeypatch):
    monkeypatch.setenv("ATTNKIT_BACKEND", "fastest")
    with pytest.raises(ValueError, match="ATTNKIT_BACKEND='fastest' is not a backend"):
        attnkit.auto()


# -- fallback ------------------------------------------------------------------------------
class _Broken(SDPABackend):
    """Declares it can run, then raises: a kernel that fails at run time."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        raise RuntimeError("broken for the test")


def test_fallback_on_a_backend_that_raises(seed, caplog):
    proc = attnkit.auto()
    broken = proc._slots["sdpa"].backend = _Broken()
    q, k, v, bias = qkv(mask="bias")
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        for _ in range(3):
            out = proc.attention(module(), q, k, v, bias, None, False)
            assert_close_to_reference(out, q, k, v, bias)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "sdpa failed" in warnings[0].getMessage()
    assert "falling back to sliced" in warnings[0].getMessage()
    assert broken.calls == 1  # the failure is remembered
    record = proc.decisions[0]
    assert record.backend == "sliced" and record.how == "fallback"
    assert "failed at run time (RuntimeError: broken for the test)" in proc.explain()


def test_fallback_when_everything_fails_raises_the_first_error(seed):
    proc = attnkit.auto(order=["sdpa", "vanilla"])
    proc._slots["sdpa"].backend = _Broken()
    proc._slots["vanilla"].backend = _Broken()
    q, k, v, _ = qkv()
    with pytest.raises(RuntimeError, match="broken for the test"):
        proc.attention(module(), q, k, v, None, None, False)


# -- tuning and its cache ------------------------------------------------------------------
def test_default_cache_path_honours_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert selector.default_cache_path() == tmp_path / "attnkit" / "autotune.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert selector.default_cache_path() == \
        __import__("pathlib").Path(os.path.expanduser("~")) / ".cache" / "attnkit" / "autotune.json"


def test_tune_times_candidates_and_round_trips(seed, tmp_path, monkeypatch):
    path = tmp_path / "tune.json"
    proc = attnkit.auto(tune=True, cache_path=path, order=["sdpa", "vanilla"], tune_iters=2)
    q, k, v, bias = qkv(mask="key_padding")
    out = proc.attention(module(), q, k, v, bias, None, False)
    assert_close_to_reference(out, q, k, v, bias)
    record = proc.decisions[0]
    assert record.how == "tuned" and set(record.ms) == {"sdpa", "vanilla"}
    assert record.backend == min(record.ms, key=record.ms.get)
    entries, dropped = read_cache(path)
    assert dropped == 0 and len(entries) == 1
    (key, entry), = entries.items()
    assert "mask=key_padding" in key and entry["backend"] == record.backend

    # a new process (processor) reads it back and does not time again
    monkeypatch.setattr(selector, "time_backend", _no_timing)
    again = attnkit.auto(tune=True, cache_path=path, order=["sdpa", "vanilla"])
    again.attention(module(), q, k, v, bias, None, False)
    assert again.decisions[0].how == "tune cache"
    assert again.decisions[0].backend == record.backend


def _no_timing(*args, **kwargs):
    raise AssertionError("timed again although the cache has this signature")


@pytest.mark.parametrize(
    "content",
    ["{not json", "[1, 2, 3]", '{"version": 99, "entries": {}}', '{"version": 1, "entries": []}', "\udcff"],
)
def test_corrupt_cache_is_ignored_with_one_warning(seed, tmp_path, caplog, content):
    path = tmp_path / "tune.json"
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    proc = attnkit.auto(tune=True, cache_path=path, order=["sdpa", "vanilla"], tune_iters=1)
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        for m in (8, 9, 10):
            q, k, v, _ = qkv(m=m)
            out = proc.attention(module(), q, k, v, None, None, False)
            assert_close_to_reference(out, q, k, v)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "ignoring the tuning cache" in warnings[0]
    entries, dropped = read_cache(path)  # rewritten, valid
    assert len(entries) == 3 and dropped == 0


def test_cache_entries_are_validated_not_trusted(seed, tmp_path, caplog, monkeypatch):
    path = tmp_path / "tune.json"
    q, k, v, _ = qkv()
    key = selector._cache_key(AttentionCall.from_tensors(q, k, v))
    path.write_text(json.dumps({"version": 1, "entries": {
        key: {"backend": "xformers", "ms": {"xformers": 0.001}},  # cannot run on this CPU
        "a": {"backend": "os.system", "ms": {}},
        "b": {"backend": "sdpa", "ms": {"sdpa": "fast"}},
        "c": {"backend": "sdpa", "ms": []},
        "d": "sdpa",
    }}))
    entries, dropped = read_cache(path)
    assert list(entries) == [key] and dropped == 4
    timed = []
    real = selector.time_backend
    monkeypatch.setattr(selector, "time_backend", lambda *a, **kw: timed.append(1) or real(*a, **kw))
    proc = attnkit.auto(tune=True, cache_path=path, order=["sdpa", "vanilla"], tune_iters=1)
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        proc.attention(module(), q, k, v, None, None, False)
    assert proc.decisions[0].backend in ("sdpa", "vanilla") and timed  # re-tuned
    assert any("ignored 4 invalid entries" in r.getMessage() for r in caplog.records)


def _writer(path, worker, count):
    for i in range(count):
        update_cache(path, {f"w{worker}-{i}": {"backend": "sdpa", "ms": {"sdpa": float(i)}}})


def test_concurrent_writers_do_not_corrupt_the_cache(tmp_path):
    path = tmp_path / "sub" / "tune.json"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(path), w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    entries, dropped = read_cache(path)
    assert dropped == 0
    assert set(entries) == {f"w{w}-{i}" for w in range(4) for i in range(15)}
    assert not [p for p in path.parent.iterdir() if p.suffix == ".tmp"]


def test_unwritable_cache_warns_once_and_still_runs(seed, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = attnkit.auto(tune=True, cache_path=blocker / "tune.json", order=["sdpa", "vanilla"], tune_iters=1)
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        for m in (8, 9):
            q, k, v, _ = qkv(m=m)
            assert_close_to_reference(proc.attention(module(), q, k, v, None, None, False), q, k, v)
    assert len([r for r in caplog.records if "cannot write the tuning cache" in r.getMessage()]) == 1


def test_backend_options_reach_the_backend(seed):
    proc = attnkit.auto(order=["sliced"], backend_options={"sliced": {"slice_size": 1}})
    q, k, v, bias = qkv(mask="bias")
    assert_close_to_reference(proc.attention(module(), q, k, v, bias, None, False), q, k, v, bias)
    assert proc._slots["sliced"].backend.slice_size == 1
    with pytest.raises(ValueError, match=r"backend_options\['sliced'\]: slice_size=0"):
        attnkit.auto(backend_options={"sliced": {"slice_size": 0}})


def test_processor_by_name_and_repr():
    proc = attnkit.processor("auto", tune=False, exclude=["xformers"])
    assert isinstance(proc, AutoProcessor)
    assert "exclude=['xformers']" in repr(proc)
