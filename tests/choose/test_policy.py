"""The priority rules per hardware class, as data and through the processor's real path.

The choice for an H100 with flash-attn installed is a pure function of the described
call (attnkit.choose.policy.walk), so it is tested here on a CPU. The same matrix then runs
through a diffusers Attention module and attnkit.auto(), with only the device's
description and the installed packages stood in for, so that a processor that ignored
the order, an exclusion or a reason would fail it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers.models.attention_processor import Attention

import attnkit
from attnkit.backends import AttentionCall, Backend, BackendUnavailable, DeviceInfo
from attnkit.backends import base as backends_base
from attnkit.backends.sdpa import SDPABackend
from attnkit.choose import auto as chooser_module
from attnkit.choose import policy, record_rules
from attnkit.choose.policy import CANDIDATES, LAST_RESORT, PRIORITIES, choose, hardware_class, walk
from attnkit.testing import make_bias

ALL = {"flash_attn": "2.6.3", "flash_attn_3": "3.0.0b1", "xformers": "0.0.28", "triton": "3.1.0"}
NONE: dict = {}
ROOT = Path(__file__).resolve().parents[2]

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
    return AttentionCall(
        device, dtype, d, q_len=m, kv_len=n, batch=2, heads=8, mask=mask, requires_grad=grad, packages=packages
    )


@pytest.fixture(autouse=True)
def _no_forced_backend(monkeypatch):
    monkeypatch.delenv("ATTNKIT_BACKEND", raising=False)


@pytest.mark.parametrize(
    "device, cls",
    [
        (H100, "sm_90"),
        (A100, "sm_80"),
        (RTX4090, "sm_86-89"),
        (A10, "sm_86-89"),
        (T4, "sm_75-"),
        (V100, "sm_75-"),
        (B200, "sm_100+"),
        (MI300, "rocm"),
        (CPU, "cpu"),
        (MPS, "mps"),
        (DeviceInfo("cuda"), "cuda"),
        (DeviceInfo("hpu"), "other"),
    ],
)
def test_hardware_class(device, cls):
    assert hardware_class(device) == cls


# (device, packages, dtype, head dim, mask, grad, expected)
MATRIX = [
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
]


def _ids(case):
    device, packages, dtype, d, mask, grad, expected = case
    cls = hardware_class(device)
    pk = "all" if packages == ALL else ("none" if not packages else "some")
    return f"{cls}-{pk}-{str(dtype)[6:]}-d{d}-{mask}{'-grad' if grad else ''}-{expected}"


@pytest.mark.parametrize("device, packages, dtype, d, mask, grad, expected", MATRIX, ids=[_ids(c) for c in MATRIX])
def test_choice_per_hardware_and_call_kind(device, packages, dtype, d, mask, grad, expected):
    label, table = choose(call(device, dtype, d, mask, grad, packages))
    assert label == expected, table
    assert table[label] == []
    order = list(table)
    for skipped in order[: order.index(label)]:
        assert table[skipped], f"{skipped} can run but was skipped"


# -- the same matrix through a real Attention module and auto() ---------------------------
class Described(Backend):
    """A candidate as auto() sees it on the described device: its real reasons (the
    call is described as that device's), computing with SDPA on the CPU and recording
    that it ran."""

    def __init__(self, real: Backend, ran: list):
        self.real, self.ran = real, ran
        self.name = real.name
        self.capabilities = real.capabilities

    def not_supported_reasons(self, call):
        return self.real.not_supported_reasons(call)

    def forward(self, q, k, v, attn_bias=None, scale=None, upcast=False):
        self.ran.append(self.label)
        return SDPABackend().forward(q, k, v, attn_bias, scale, upcast)


def described_auto(monkeypatch, device: DeviceInfo, packages, **options):
    """auto() as it behaves on ``device`` with ``packages`` installed: the processor's own
    code path, with the description of the CPU device and the package snapshot replaced."""
    monkeypatch.setattr(backends_base, "device_info", lambda kind, index: device)
    monkeypatch.setattr(chooser_module, "installed_packages", lambda: dict(packages))
    ran: list[str] = []
    stand_ins = {}
    for label in CANDIDATES:
        real = policy.make_backend(label)
        stand_ins[label] = Described(real, ran)
        stand_ins[label].label = label
    return attnkit.auto(backends=stand_ins, **options), ran


def _module_call(proc, dtype, d, mask, grad):
    attn = Attention(query_dim=2 * d, heads=2, dim_head=d).to(dtype)
    attn.requires_grad_(grad)
    attn.set_processor(proc)
    x = torch.randn(2, 6, 2 * d).to(dtype)
    m = None
    if mask == "key_padding":
        m = make_bias("key_padding", 2, 1, 1, 6, dtype).reshape(2, 1, 6)
    elif mask == "bias":
        m = make_bias("full", 2, 2, 6, 6, dtype)
    with torch.set_grad_enabled(grad):
        return attn(x, attention_mask=m)


@pytest.mark.parametrize("device, packages, dtype, d, mask, grad, expected", MATRIX, ids=[_ids(c) for c in MATRIX])
def test_the_processor_takes_the_same_choice(seed, monkeypatch, device, packages, dtype, d, mask, grad, expected):
    proc, ran = described_auto(monkeypatch, device, packages)
    out = _module_call(proc, dtype, d, mask, grad)
    assert torch.isfinite(out).all()
    assert ran == [expected], proc.explain()
    assert proc.decisions[0].backend == expected


def test_the_processor_honours_exclude(seed, monkeypatch):
    proc, ran = described_auto(monkeypatch, H100, ALL, exclude=["flash_attn3", "flash_attn"])
    _module_call(proc, torch.float16, 64, "none", False)
    assert ran == ["sdpa"]
    table = proc.decisions[0].table
    assert table["flash_attn3"] == ["excluded"] and table["flash_attn"] == ["excluded"]


def test_the_processor_honours_a_given_order(seed, monkeypatch):
    proc, ran = described_auto(monkeypatch, H100, ALL, order=["xformers", "sdpa"])
    _module_call(proc, torch.float16, 64, "none", False)
    assert ran == ["xformers"]
    assert list(proc.decisions[0].table) == ["xformers", "sdpa"]
    assert proc.decisions[0].order == "order=xformers>sdpa"


def test_the_processor_skips_what_cannot_run(seed, monkeypatch):
    """flash_attn3 is first on an H100 but takes no mask: the masked call goes on."""
    proc, ran = described_auto(monkeypatch, H100, ALL)
    _module_call(proc, torch.float16, 64, "bias", False)
    assert ran == ["sdpa"]
    assert "mask=bias (supported: none)" in proc.decisions[0].table["flash_attn3"]


def test_skipped_backends_say_why():
    _, table = choose(call(A100, torch.float32, 512, "bias", packages={"xformers": "0.0.28"}))
    reasons = " | ".join(table["flash_attn"])
    assert "flash_attn is not installed" in reasons
    assert "dtype=torch.float32 (supported: float16, bfloat16)" in reasons
    assert "head_dim=512 > 256" in reasons
    assert "mask=bias (supported: none)" in reasons
    _, table = choose(call(T4, packages=ALL), order=["flash_attn", "sdpa"])
    assert "compute capability 7.5 < 8.0" in table["flash_attn"]


def test_install_hints_are_data_not_part_of_the_reason():
    c = call(A100, packages=NONE)
    fa = policy.make_backend("flash_attn")
    assert fa.not_supported_reasons(c) == ["flash_attn is not installed"]
    assert "--no-build-isolation" in fa.install_hint(c)
    assert fa.install_hint(call(A100, packages=ALL)) is None
    assert "attnkit[xformers]" in policy.make_backend("xformers").install_hint(c)


def test_priority_lists_are_data_with_reasons():
    for cls, priority in PRIORITIES.items():
        assert priority.why and len(priority.why) > 40, cls
        assert set(priority.order) <= set(CANDIDATES), cls
        assert len(set(priority.order)) == len(priority.order), cls
        # the last resorts come last, in every list, so auto() can always run
        assert priority.order[-len(LAST_RESORT) :] == LAST_RESORT, cls
        assert not set(LAST_RESORT) & set(priority.order[: -len(LAST_RESORT)]), cls
    for host in ("cpu", "mps", "xpu", "other", "rocm"):
        assert "triton" not in PRIORITIES[host].order


def test_never_triton_on_cpu_even_if_it_could_run():
    class _AnythingGoes(SDPABackend):
        name = "triton"

    label, table = choose(call(CPU, torch.float32), backends={"triton": _AnythingGoes()})
    assert label == "sdpa" and "triton" not in table


class _Refuses(SDPABackend):
    def not_supported_reasons(self, call):
        return ["refused for the test"]


def test_last_resort_when_nothing_fused_can_run():
    label, table = choose(call(A100, packages=NONE), backends={"sdpa": _Refuses()})
    assert label == "sliced"
    assert table["sdpa"] == ["refused for the test"]


def test_triton_serves_what_the_fused_kernels_before_it_cannot():
    only_triton = {"triton": "3.1.0"}
    label, _ = choose(call(A100, packages=only_triton), backends={"sdpa": _Refuses()})
    assert label == "triton"
    # but not on Turing, where its tiles are not built
    label, table = choose(call(T4, packages=only_triton), backends={"sdpa": _Refuses()})
    assert label == "sliced" and "compute capability 7.5 < 8.0" in table["triton"]


def test_triton_is_not_chosen_where_the_gpus_shared_memory_cannot_hold_the_call(monkeypatch):
    """A call whose default tiles need more shared memory than the GPU has (here the
    fp32 backward at head dim 512 with a bias on an RTX 4090) is refused up front: the
    walk goes on to the next backend rather than a backward that cannot launch. The
    A100, with 163 KiB, and the forward alone keep the Triton kernel."""
    import attnkit.kernels.devices as devices

    monkeypatch.setattr(devices, "NEEDS", {("sm80", "dq", "32bit", 512, "full", False): 133_120})
    only_triton = {"triton": "3.1.0"}
    label, table = choose(
        call(RTX4090, torch.float32, 512, "bias", grad=True, packages=only_triton), backends={"sdpa": _Refuses()}
    )
    assert label == "sliced"
    assert any("133,120 B of shared memory per block" in r and "8.9 has 101,376 B" in r for r in table["triton"])
    for device, grad in ((A100, True), (RTX4090, False)):
        label, _ = choose(
            call(device, torch.float32, 512, "bias", grad=grad, packages=only_triton), backends={"sdpa": _Refuses()}
        )
        assert label == "triton"


def test_no_backend_at_all_raises_with_every_reason():
    with pytest.raises(BackendUnavailable, match="device=hpu") as err:
        choose(call(DeviceInfo("hpu"), packages=NONE))
    assert set(err.value.reasons) == set(PRIORITIES["other"].order)
    assert all(err.value.reasons.values())


def test_walk_marks_excluded_and_failed():
    label, table = walk(
        call(A100, packages=NONE),
        ("sdpa", "sliced", "vanilla"),
        exclude=["sdpa"],
        failed={"sliced": "RuntimeError: boom"},
    )
    assert label == "vanilla"
    assert table == {"sdpa": ["excluded"], "sliced": ["failed at run time (RuntimeError: boom)"], "vanilla": []}


def test_rules_are_pure_functions_of_the_description():
    c = call(H100, packages=ALL)
    assert choose(c) == choose(c)
    assert choose(c)[0] != choose(call(H100, packages=NONE))[0]


def test_deterministic_algorithms_refuse_nondeterministic_backends():
    det = AttentionCall(A100, torch.float16, 64, packages=ALL, deterministic=True)
    label, table = choose(det)
    assert label == "sdpa"
    assert "not deterministic (torch.use_deterministic_algorithms(True) is on)" in table["flash_attn"]


def test_deterministic_flag_comes_from_torch(seed):
    from attnkit.backends import signature

    q = torch.randn(1, 1, 4, 8)
    assert signature(q, q, q, None).deterministic is False
    torch.use_deterministic_algorithms(True)
    try:
        assert signature(q, q, q, None).deterministic is True
    finally:
        torch.use_deterministic_algorithms(False)


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown backend"):
        attnkit.auto(order=["sdpa", "fast"])
    with pytest.raises(ValueError, match="unknown backend"):
        attnkit.auto(exclude=["nope"])
    with pytest.raises(ValueError, match="unknown backend"):
        attnkit.auto(backends={"fastest": SDPABackend()})
    with pytest.raises(TypeError, match="not an attnkit Backend"):
        attnkit.auto(backends={"sdpa": object()})


# -- rules from the GPU records (attnkit/choose/gpu_rules.py) --------------------------------
H200 = DeviceInfo("cuda", (9, 0), "NVIDIA H200")
H100_PCIE = DeviceInfo("cuda", (9, 0), "NVIDIA H100 PCIe")  # sm_90, but no record of its own
FLUX = dict(m=4608, n=4608)  # FLUX.1 at 1024x1024: 4096 image tokens and 512 of text


# (device, dtype, head dim, mask, grad, lengths, expected): calls the records measured
# pick the Triton kernel; their neighbours, which no record measured, keep SDPA.
RECORDED = [
    (H100, torch.float16, 128, "key_padding", False, FLUX, "triton"),
    (H100, torch.float16, 128, "key_padding", True, FLUX, "triton"),
    (H100, torch.float16, 128, "key_padding", False, dict(m=8192, n=8192), "triton"),
    (H100, torch.float16, 512, "none", False, dict(m=4096, n=4096), "triton"),
    (H200, torch.float16, 128, "key_padding", False, FLUX, "triton"),
    (H200, torch.float16, 128, "key_padding", True, FLUX, "triton"),
    # not measured: another dtype, head dim, a shorter call, the VAE's backward
    (H100, torch.bfloat16, 128, "key_padding", False, FLUX, "sdpa"),
    (H100, torch.float16, 64, "key_padding", False, FLUX, "sdpa"),
    (H100, torch.float16, 128, "key_padding", False, dict(m=4096, n=512), "sdpa"),
    (H100, torch.float16, 512, "none", True, dict(m=4096, n=4096), "sdpa"),
    (H100, torch.float16, 128, "bias", False, FLUX, "sdpa"),  # measured behind (0.34)
    (H200, torch.float16, 512, "none", False, dict(m=4096, n=4096), "sdpa"),  # measured behind (0.77)
    (H200, torch.float16, 128, "bias", False, FLUX, "sdpa"),  # withdrawn: measured before 2ac832a
    # the same calls on a GPU without a record: the class's order
    (H100_PCIE, torch.float16, 128, "key_padding", False, FLUX, "sdpa"),
    (H100_PCIE, torch.float16, 512, "none", False, dict(m=4096, n=4096), "sdpa"),
    (DeviceInfo("cuda", (8, 0), "NVIDIA H100 80GB HBM3"), torch.float16, 128, "key_padding", False, FLUX, "sdpa"),
]


def _recorded_id(case):
    device, dtype, d, mask, grad, lengths, expected = case
    return (
        f"{record_rules.device_folder(device.name)}-sm{''.join(map(str, device.capability))}-{str(dtype)[6:]}-d{d}-"
        f"{mask}-{lengths['m']}x{lengths['n']}{'-grad' if grad else ''}-{expected}"
    )


@pytest.mark.parametrize(
    "device, dtype, d, mask, grad, lengths, expected", RECORDED, ids=[_recorded_id(c) for c in RECORDED]
)
def test_record_rules_decide_where_they_measured(device, dtype, d, mask, grad, lengths, expected):
    c = call(device, dtype, d, mask, grad, ALL, **lengths)
    label, table = choose(c)
    assert label == expected, table
    order = list(table)
    if expected == "triton":
        # the kernel moves just ahead of SDPA; what the record did not measure keeps its place
        (rule,) = record_rules.rules_for(c)
        assert order == ["flash_attn3", "flash_attn", "triton", "sdpa", "xformers", "sliced", "vanilla"]
        assert record_rules.rule_source(rule) in policy.describe_call(c)
        assert (ROOT / record_rules.rule_source(rule).split("#")[0]).is_file()
    else:
        assert order == list(PRIORITIES[hardware_class(device)].order)
        assert record_rules.rules_for(c) == () and "[record:" not in policy.describe_call(c)


def test_a_gpu_without_a_record_keeps_todays_order_for_every_call():
    for mask in ("none", "key_padding", "bias"):
        for d in (40, 64, 128, 256, 512):
            for grad in (False, True):
                for dtype in (torch.float16, torch.bfloat16, torch.float32):
                    c = call(H100_PCIE, dtype, d, mask, grad, ALL, m=8192, n=8192)
                    assert policy.order_for(c) == ("sm_90", PRIORITIES["sm_90"].order)
                    assert list(choose(c)[1]) == list(PRIORITIES["sm_90"].order)


def test_a_rule_never_picks_what_cannot_run():
    no_triton = {**ALL, "triton": None}
    label, table = choose(call(H100, torch.float16, 128, "key_padding", False, no_triton, **FLUX))
    assert label == "sdpa" and table["triton"] == ["triton is not installed"]
    assert list(table).index("triton") < list(table).index("sdpa")  # the rule applied; the walk went on
    label, table = choose(
        call(H100, torch.float16, 128, "key_padding", False, ALL, **FLUX), backends={"triton": _Refuses()}
    )
    assert label == "sdpa" and table["triton"] == ["refused for the test"]
    # flags the records never measured: no rule
    for flags in (dict(lse=True), dict(deterministic=True), dict(causal=True)):
        c = AttentionCall(H100, torch.float16, 128, 4608, 4608, 2, 24, "key_padding", packages=ALL, **flags)
        assert record_rules.rules_for(c) == (), flags


def test_an_order_given_by_the_caller_is_walked_as_given():
    c = call(H100, torch.float16, 128, "key_padding", False, ALL, **FLUX)
    assert choose(c, order=["sdpa", "triton"])[0] == "sdpa"
    assert choose(c, order=list(PRIORITIES["sm_90"].order))[0] == "sdpa"
    assert choose(c, exclude=["triton"])[0] == "sdpa"


def test_order_for_names_the_record_of_each_rule_that_moved_a_backend():
    c = call(H100, torch.float16, 128, "key_padding", False, ALL, **FLUX)
    name, order = policy.order_for(c)
    (rule,) = record_rules.rules_for(c)
    assert name == "sm_90 + " + record_rules.describe_rule(rule)
    assert (
        record_rules.describe_rule(rule)
        == f"triton ahead of sdpa: {rule.ratio:.2f}x in {record_rules.rule_source(rule)}"
    )
    assert record_rules.rule_source(rule) == "bench/results/nvidia-h100-80gb-hbm3/" + rule.record
    assert order.index("triton") < order.index("sdpa")
    assert policy.order_for(call(H100, **FLUX)) == ("sm_90", PRIORITIES["sm_90"].order)


def test_auto_explain_names_the_record_behind_its_choice(monkeypatch):
    proc, _ = described_auto(monkeypatch, H100, ALL)
    c = call(H100, torch.float16, 128, "key_padding", False, ALL, **FLUX)
    text = proc.explain(c)
    head = text.splitlines()[0]
    assert "-> triton" in head and "bench/results/nvidia-h100-80gb-hbm3/timing/timing.json#18" in head, text
    assert f"{record_rules.rules_for(c)[0].ratio:.2f}x" in head
    proc, _ = described_auto(monkeypatch, H100_PCIE, ALL)
    text = proc.explain(call(H100_PCIE, torch.float16, 128, "key_padding", False, ALL, **FLUX))
    assert "-> sdpa" in text.splitlines()[0] and "record" not in text
