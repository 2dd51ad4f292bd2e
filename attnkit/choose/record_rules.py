"""The rules generated from the committed GPU records, and how they apply to one call.

:mod:`attnkit.choose.gpu_rules` (written by ``python -m tools.records``) holds, per GPU
record under ``bench/results/<gpu>/``, the classes of calls where attnkit's Triton kernel
was measured ahead of SDPA. A rule holds only on the GPU that was recorded (the same
device name and compute capability, nothing nearer) and only for calls of the class it
was measured on, so a GPU without a record, and every call a record did not measure, keeps
its hardware class's order. :mod:`attnkit.choose.policy` walks that order; this module says
which rules cover a call, moves their backends within the order, and names the record row
behind each, so that logs, errors, ``explain()``, ``attnkit info`` and the README's table
(:func:`rules_table`) can show it.
"""

from __future__ import annotations

import re
from typing import Sequence

from ..backends import AttentionCall, DeviceInfo
from ..backends.base import dtype_name
from . import gpu_rules

RECORDS_DIR = "bench/results"
Rule = gpu_rules.Rule


def device_folder(name: str) -> str:
    """A device name as ``bench/results/`` names its record: lower case, dashes
    ("NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"; the launcher's own copy,
    attnkit.kernels.devices.record_folder, names the records of its default tiles alike)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def record_of(device: DeviceInfo) -> str | None:
    """The record folder of ``device`` (a key of ``gpu_rules.GPUS``), or None: the same
    device name and the same compute capability, nothing nearer (an H100 PCIe is not
    the H100 SXM that was recorded)."""
    if device.type != "cuda" or not device.name or device.capability is None:
        return None
    folder = device_folder(device.name)
    gpu = gpu_rules.GPUS.get(folder)
    if gpu is None or tuple(device.capability) != tuple(gpu.capability):
        return None
    return folder


def covers(rule: Rule, call: AttentionCall) -> bool:
    """Whether ``call`` is of the class ``rule`` was measured on (its GPU aside): the same
    mask kind, dtype, head dim, causal and grad, lengths at least the measured ones, and
    none of what the records never measured (dropout, LSE, deterministic mode)."""
    return (
        call.mask == rule.mask
        and dtype_name(call.dtype) == rule.dtype
        and call.head_dim == rule.head_dim
        and call.causal == rule.causal
        and call.requires_grad == rule.grad
        and not (call.dropout or call.lse or call.deterministic)
        and call.q_len is not None
        and call.kv_len is not None
        and call.q_len >= rule.min_q
        and call.kv_len >= rule.min_kv
    )


def rules_for(call: AttentionCall) -> tuple[Rule, ...]:
    """The record rules that cover ``call`` on its device (none on a GPU without a record)."""
    folder = record_of(call.device)
    if folder is None:
        return ()
    return tuple(r for r in gpu_rules.RULES if r.gpu == folder and covers(r, call))


def rule_source(rule: Rule) -> str:
    """Where a rule comes from: "bench/results/<gpu>/<path>#<row>"."""
    return f"{RECORDS_DIR}/{rule.gpu}/{rule.record}"


def describe_rule(rule: Rule) -> str:
    """One line: "triton ahead of sdpa: 1.84x in bench/results/.../timing.json#18"."""
    return f"{rule.prefer} ahead of {'/'.join(rule.over)}: {rule.ratio:.2f}x in {rule_source(rule)}"


def apply_rules(call: AttentionCall, order: Sequence[str]) -> tuple[tuple[str, ...], tuple[Rule, ...]]:
    """(order, rules that moved something): each rule covering ``call`` moves its
    preferred backend just ahead of the first backend it was measured against, when it
    stands behind it. Backends the record did not measure keep their places."""
    out = list(order)
    applied = []
    for rule in rules_for(call):
        if rule.prefer not in out:
            continue
        against = [out.index(x) for x in rule.over if x in out]
        at = out.index(rule.prefer)
        if against and at > min(against):
            out.insert(min(against), out.pop(at))
            applied.append(rule)
    return tuple(out), tuple(applied)


def rules_table() -> str:
    """The rules of every GPU record as a markdown table (it is in the README, kept equal
    by a test)."""
    rows = [
        "| GPU | capability | calls | order | measured (SDPA time / triton time) | record (least) |",
        "|---|---|---|---|---|---|",
    ]
    for rule in gpu_rules.RULES:
        gpu = gpu_rules.GPUS[rule.gpu]
        calls = (
            f"{rule.dtype}, head dim {rule.head_dim}, mask {rule.mask}"
            f"{', causal' if rule.causal else ''}, {'forward and backward' if rule.grad else 'forward'}, "
            f"M ≥ {rule.min_q}, N ≥ {rule.min_kv}"
        )
        ratios = ", ".join(f"{ratio:.2f}" for _, ratio in rule.rows)
        rows.append(
            f"| {gpu.name} | {'.'.join(map(str, gpu.capability))} | {calls} | "
            f"{rule.prefer} ahead of {', '.join(rule.over)} | {ratios} | "
            f"`{RECORDS_DIR}/{rule.gpu}/{rule.record}` |"
        )
    return "\n".join(rows)


__all__ = [
    "RECORDS_DIR",
    "Rule",
    "apply_rules",
    "covers",
    "describe_rule",
    "device_folder",
    "record_of",
    "rule_source",
    "rules_for",
    "rules_table",
]
