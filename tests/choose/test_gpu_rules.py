"""attnkit/choose/gpu_rules.py is generated from the committed GPU records (tools/records,
`python -m tools.records`): the file in the tree is what the generator writes, its rules
carry the figures the records' READMEs state, and the generator makes a rule only where a
record measured the kernel ahead, for the class it measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnkit.choose import gpu_rules, record_rules
from tools.records import generate as gen

ROOT = Path(__file__).resolve().parents[2]
H100, H200 = "nvidia-h100-80gb-hbm3", "nvidia-h200"


def test_the_module_is_what_the_generator_writes():
    text = gen.OUTPUT.read_text()
    assert text == gen.generate(), (
        "attnkit/choose/gpu_rules.py differs from what the records under bench/results give: run "
        "`python -m tools.records` (never edit it by hand)"
    )


def test_check_fails_on_a_hand_edit(tmp_path, capsys):
    copy = tmp_path / "gpu_rules.py"
    copy.write_text(gen.OUTPUT.read_text())
    assert gen.main(["--check", "--file", str(copy)]) == 0
    copy.write_text(copy.read_text().replace("1.841", "1.9", 1))
    assert gen.main(["--check", "--file", str(copy)]) == 1
    assert "python -m tools.records" in capsys.readouterr().out


def _rule(gpu, mask, d, grad):
    found = [r for r in gpu_rules.RULES if (r.gpu, r.mask, r.head_dim, r.grad) == (gpu, mask, d, grad)]
    assert len(found) == 1, f"{gpu} {mask} D={d} grad={grad}: {found}"
    return found[0]


# The figures the records' READMEs and summaries state (autotuning off, then on; fp16),
# and the rule each one is under.
KEY_FIGURES = [
    (H100, "key_padding", 128, False, ("2.91", "1.84")),  # README: "Flux-like key padding: forward 2.91"
    (H100, "key_padding", 128, True, ("2.44", "1.87")),  # "forward and backward 2.44"
    (H100, "none", 512, False, ("1.61",)),  # "The SD VAE at D=512: 1.61"
    (H200, "key_padding", 128, False, ("2.53", "1.27")),  # "2.53 (tuned 1.27)"
    (H200, "key_padding", 128, True, ("1.91", "1.70")),  # "1.91 (tuned 1.70)"
]


@pytest.mark.parametrize(
    "gpu, mask, d, grad, figures",
    KEY_FIGURES,
    ids=[f"{g[:11]}-{m}-d{d}{'-grad' if gr else ''}" for g, m, d, gr, _ in KEY_FIGURES],
)
def test_rules_carry_the_figures_of_the_records(gpu, mask, d, grad, figures):
    rule = _rule(gpu, mask, d, grad)
    pages = " ".join(p.read_text() for p in (ROOT / "bench" / "results" / gpu).rglob("*.md"))
    for figure in figures:
        assert figure in pages, f"{figure} is not a figure of bench/results/{gpu}'s READMEs and summaries"
    assert tuple(f"{ratio:.2f}" for _, ratio in rule.rows) == figures
    assert f"{rule.ratio:.2f}" == min(figures, key=float)
    assert (rule.prefer, rule.over, rule.dtype, rule.causal) == ("triton", ("sdpa",), "float16", False)
    # the record row named is the one that measured the least ratio, and says so
    path, row = rule.record.rsplit("#", 1)
    case = json.loads((ROOT / "bench" / "results" / gpu / path).read_text())[int(row)]
    assert round(case["speedup_vs_sdpa"], 3) == rule.ratio
    assert case["shape"][2:] == [rule.min_q, rule.min_kv, d] and case["backward"] == grad


def test_no_rule_where_a_record_measured_the_kernel_behind_or_did_not_measure():
    by_class = {(r.gpu, r.mask, r.head_dim, r.grad) for r in gpu_rules.RULES}
    assert (H200, "none", 512, False) not in by_class  # the H200 timed the VAE at 0.77
    assert (H100, "none", 128, False) not in by_class  # 0.75
    assert (H100, "bias", 128, False) not in by_class  # the full bias, 0.34
    assert (H100, "none", 512, True) not in by_class  # the VAE's backward was not timed
    assert all(r.dtype == "float16" for r in gpu_rules.RULES)  # only fp16 was timed
    assert all(r.ratio >= gpu_rules.THRESHOLD for r in gpu_rules.RULES)


def test_a_withdrawn_measurement_makes_no_rule_and_is_named():
    # the H200's full 16-bit bias ran at 1.13 before every bias became float32
    assert not [r for r in gpu_rules.RULES if r.gpu == H200 and r.mask == "bias"]
    assert "nvidia-h200/tiles-43e61c8/timing.json#13 (d128 full bias, 1.128)" in gen.OUTPUT.read_text()


def test_record_folders_are_named_as_the_library_names_devices():
    for folder, gpu in gpu_rules.GPUS.items():
        assert gen.device_folder(gpu.name) == record_rules.device_folder(gpu.name) == folder


# -- the generator on records made up for the test ------------------------------------------
def _record(results: Path, folder: str, name: str, runs: dict[str, tuple[str, list[dict]]]):
    gpu = results / folder
    gpu.mkdir(parents=True)
    (gpu / "results.json").write_text(
        json.dumps({"environment": {"device": "cuda", "device_name": name, "capability": [9, 0]}})
    )
    for sub, (date, rows) in runs.items():
        (gpu / sub).mkdir()
        (gpu / sub / "timing.json").write_text(json.dumps(rows))
        (gpu / sub / "summary.md").write_text(
            f"# x\n\ntorch 2.11.0, triton 3.6.0, {date} UTC\n\n## Speed beside torch's SDPA (fp16)\n"
        )


def _case(case, ratio, d=128, bias="none", autotune=False, backward=False, m=4096, n=4096):
    return {
        "case": case,
        "shape": [1, 1, m, n, d],
        "causal": False,
        "bias": bias,
        "backward": backward,
        "autotune": autotune,
        "speedup_vs_sdpa": ratio,
    }


def test_threshold_newest_run_and_class(tmp_path):
    _record(
        tmp_path,
        "nvidia-x1",
        "NVIDIA X1",
        {
            "old": ("2026-01-01 10:00", [_case("a", 2.0, d=64), _case("b", 3.0, d=96), _case("c", 1.2, d=256)]),
            "new": (
                "2026-02-01 10:00",
                [
                    _case("a", 0.9, d=64),  # the newer run of a: behind, no rule
                    _case("b", 3.0, d=96, autotune=True),
                    _case("b", 1.04, d=96),  # one setting under the threshold
                    _case("d", 1.06, d=80, bias="full"),
                    _case("d", 1.5, d=80, bias="full", autotune=True),
                    {"case": "e", "skipped": "time budget"},
                    {"case": "f", "error": "OutOfResources", "shape": [1] * 5},
                ],
            ),
        },
    )
    text = gen.generate(tmp_path, withdrawn_table={})
    namespace: dict = {}
    exec(text, namespace)
    rules = namespace["RULES"]
    assert [(r.head_dim, r.mask, r.ratio, r.record) for r in rules] == [
        (80, "bias", 1.06, "new/timing.json#3"),
        (256, "none", 1.2, "old/timing.json#2"),
    ]
    assert namespace["GPUS"] == {"nvidia-x1": namespace["GPU"]("NVIDIA X1", (9, 0))}


def test_unreadable_records_say_which_file_and_what(tmp_path):
    _record(tmp_path, "nvidia-x2", "NVIDIA X2", {"run": ("2026-01-01 10:00", [_case("a", 2.0)])})
    (tmp_path / "nvidia-x2" / "run" / "summary.md").write_text("# no heading\n")
    with pytest.raises(gen.RecordError, match=r"summary.md: no heading"):
        gen.generate(tmp_path, withdrawn_table={})
    _record(tmp_path, "wrong-folder", "NVIDIA X3", {})
    with pytest.raises(gen.RecordError, match=r"would be recorded in nvidia-x3/, not wrong-folder/"):
        gen.read_gpus(tmp_path)


def test_a_withdrawal_must_name_a_measurement(tmp_path):
    _record(tmp_path, "nvidia-x4", "NVIDIA X4", {"run": ("2026-01-01 10:00", [_case("a", 2.0)])})
    assert "RULES = (\n)" not in gen.generate(tmp_path, withdrawn_table={})
    assert "RULES = (\n)" in gen.generate(tmp_path, withdrawn_table={("nvidia-x4/run/timing.json", "a"): "made up"})
    with pytest.raises(gen.RecordError, match="which no record holds"):
        gen.generate(tmp_path, withdrawn_table={("nvidia-x4/run/timing.json", "zz"): "made up"})


# -- `attnkit info` ---------------------------------------------------------------------------
ALL = {"flash_attn": "2.6.3", "flash_attn_3": "3.0.0b1", "xformers": "0.0.28", "triton": "3.1.0"}


def test_info_names_the_record_behind_each_rule_that_changes_a_choice(monkeypatch):
    from attnkit import info
    from attnkit.backends import DeviceInfo
    from attnkit.choose.auto import AutoChooser

    monkeypatch.delenv("ATTNKIT_BACKEND", raising=False)
    h100 = DeviceInfo("cuda", (9, 0), "NVIDIA H100 80GB HBM3")
    data = info.record_rules(h100, AutoChooser(), ALL)
    assert data["record"] == "bench/results/nvidia-h100-80gb-hbm3"
    assert len(data["rules"]) == len([r for r in gpu_rules.RULES if r.gpu == H100]) > 0
    for row in data["rules"]:
        assert (row["backend"], row["without_rule"], row["changed"]) == ("triton", "sdpa", True), row
        assert (ROOT / row["source"].split("#")[0]).is_file()
    text = info.report({**info.collect(), "records": data})
    for row in data["rules"]:
        assert f"{row['call']} -> triton (the class's order alone: sdpa)" in text
        assert row["rule"] in text
    # where the rule's backend cannot run, the choice is the class's and the report says so
    data = info.record_rules(h100, AutoChooser(), {**ALL, "triton": None})
    assert all((r["backend"], r["changed"]) == ("sdpa", False) for r in data["rules"])
    # a GPU without a record
    data = info.record_rules(DeviceInfo("cuda", (9, 0), "NVIDIA H100 PCIe"), AutoChooser(), ALL)
    assert data["record"] is None and data["rules"] == []
    assert "GPU record rules: none for NVIDIA H100 PCIe" in info.report({**info.collect(), "records": data})


def test_auto_names_the_rule_in_the_order_it_walked(monkeypatch):
    """auto()'s decision names the class order with the rule that moved a backend (and the
    record behind it) only where a rule moved one; an order of the caller's own is
    walked as given and named as such."""
    from attnkit.backends import AttentionCall, DeviceInfo
    from attnkit.choose.auto import AutoChooser

    monkeypatch.delenv("ATTNKIT_BACKEND", raising=False)
    rule = next(r for r in gpu_rules.RULES if r.gpu == H100 and not r.grad)
    h100 = DeviceInfo("cuda", (9, 0), gpu_rules.GPUS[H100].name)
    assert rule.dtype == "float16", rule.dtype  # the records timed fp16
    call = AttentionCall(
        device=h100, dtype=torch.float16, head_dim=rule.head_dim, q_len=rule.min_q, kv_len=rule.min_kv, mask=rule.mask
    )
    name, order = AutoChooser().order_for(call)
    assert name.startswith("sm_90 + triton ahead of sdpa") and rule.record in name, name
    assert order.index("triton") < order.index("sdpa")
    plain = AttentionCall(device=h100, dtype=call.dtype, head_dim=rule.head_dim, q_len=16, kv_len=16, mask="none")
    assert AutoChooser().order_for(plain)[0] == "sm_90"
    name, order = AutoChooser(order=("sdpa", "triton")).order_for(call)
    assert name == "order=sdpa>triton" and order == ("sdpa", "triton")
