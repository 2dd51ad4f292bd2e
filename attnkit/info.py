"""``attnkit info`` (also ``python -m attnkit info``): what attnkit sees on this machine.

The first thing to run when attention is slow or a processor refuses to run: devices,
versions, every backend as available or not (with its reasons and declared limits),
what ``attnkit.auto()`` would choose for Stable Diffusion 1.5's attention shapes, and on a
GPU with a committed record, the rules taken from it and the record behind each.

    attnkit info            # human-readable report
    attnkit info --json     # the same data as JSON

From Python: :func:`collect` returns the data as a dict, :func:`report` the text.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Any

import torch

from . import __version__
from .backends import AttentionCall, Capabilities, DeviceInfo, capability_columns
from .backends.base import dtype_name, package_version
from .choose import gpu_rules, policy
from .choose.auto import ENV_VAR, AutoChooser
from .choose.policy import CANDIDATES, PRIORITIES, install_hint_of, installed_packages, reasons_of
from .choose.record_rules import RECORDS_DIR, describe_rule, record_of, rule_source
from .diffusers import hooks
from .info_model import model_plan
from .kernels.tile_rules import TILE_RULES

VERSIONED = ("torch", "diffusers", "triton", "xformers", "flash_attn", "flash_attn_3")

# Stable Diffusion 1.5 at 512x512: 8 heads of 40 / 80 / 160 over 64x64 / 32x32 / 16x16
# latents, self-attention and cross-attention to 77 text tokens.
SD15_SHAPES = ((40, 4096), (80, 1024), (160, 256))
SD15_TEXT_TOKENS = 77


def _devices() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"device": "cpu", "name": platform.processor() or platform.machine()}]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            out.append(
                {
                    "device": f"cuda:{i}",
                    "name": props.name,
                    "capability": f"{props.major}.{props.minor}",
                    "memory_gib": round(props.total_memory / 2**30, 1),
                }
            )
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append({"device": "mps", "name": "Apple GPU"})
    return out


def _primary_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def describe_capabilities(caps: Capabilities) -> str:
    """A backend's declared limits in one line (the README's limits table, as text)."""
    return "; ".join(f"{k}: {v}" for k, v in capability_columns(caps).items())


def _why(order_name: str) -> str:
    cls = order_name.split(" + ")[0]  # "sm_90 + triton ahead of sdpa: ..." (policy.order_for)
    if cls in PRIORITIES:
        return PRIORITIES[cls].why
    return f"{order_name} (set in the environment): auto() runs this backend only"


def record_rules(device: DeviceInfo, chooser: AutoChooser, packages: dict[str, str | None]) -> dict[str, Any]:
    """The GPU record of ``device`` (bench/results/<folder>/) and, per rule generated from
    it, what auto() chooses for the smallest call the rule covers and what the hardware
    class's order alone would choose: the rules that change a choice here, with their
    records."""
    folder = record_of(device)
    out: dict[str, Any] = {
        "device": device.name or device.type,
        "record": None if folder is None else f"{RECORDS_DIR}/{folder}",
        "recorded": [gpu.name for gpu in gpu_rules.GPUS.values()],
        "rules": [],
    }
    if folder is None:
        return out
    _, priority = policy.priority_for(device)
    for rule in gpu_rules.RULES:
        if rule.gpu != folder:
            continue
        call = AttentionCall(
            device,
            getattr(torch, rule.dtype),
            rule.head_dim,
            q_len=rule.min_q,
            kv_len=rule.min_kv,
            batch=2,
            heads=8,
            mask=rule.mask,
            requires_grad=rule.grad,
            causal=rule.causal,
            packages=packages,
        )
        label, _, _ = chooser.walk(call)
        # the class's order as a plain tuple: walked as given, without the rule
        without, _ = policy.walk(call, tuple(priority.order), chooser.backend, chooser.exclude)
        out["rules"].append(
            {
                "call": policy.describe_call(call, with_record=False),
                "rule": describe_rule(rule),
                "source": rule_source(rule),
                "backend": label,
                "without_rule": without,
                "changed": label != without,
            }
        )
    out["tiles"] = tile_rules(folder)
    return out


def tile_rules(folder: str) -> list[dict[str, Any]]:
    """The Triton kernels' default tiles that the GPU record ``folder`` changes
    (attnkit/kernels/tile_rules.py, generated by ``python -m tools.records``), each with
    the list it changes, the calls it covers and its record."""
    out = []
    for r in TILE_RULES:
        if r.gpu != folder:
            continue
        out.append(
            {
                "list": f"{r.target} {r.kernel} {r.width} head dims <= {r.band}, bias {r.variant}, "
                f"{'causal' if r.causal else 'not causal'}, {r.loads} loads",
                "calls": f"{r.dtype}, q_len >= {r.min_q}, kv_len >= {r.min_kv}",
                "tile": r.tile,
                "replaces": r.replaces,
                "source": f"{RECORDS_DIR}/{r.gpu}/{r.record} (the timed call ran {r.gain:.2f}x as fast with the "
                "autotuner's choices as with the defaults, same run)",
            }
        )
    return out


def collect() -> dict[str, Any]:
    """Everything ``attnkit info`` prints, as plain data."""
    device = _primary_device()
    dev_info = DeviceInfo.of(device)
    packages = installed_packages(refresh=True)
    versions = {"attnkit": __version__, "python": platform.python_version()}
    for name in VERSIONED:
        versions[name] = package_version(name)
    if versions["flash_attn_3"] is None:
        versions["flash_attn_3"] = package_version("flashattn-hopper")
    versions["torch"] = torch.__version__
    versions["cuda"] = torch.version.cuda
    if getattr(torch.version, "hip", None):
        versions["hip"] = torch.version.hip

    # Backends, judged for a typical call on the primary device: fp16 on GPUs, fp32 on CPU.
    dtype = torch.float32 if device.type == "cpu" else torch.float16
    probe = AttentionCall(dev_info, dtype, head_dim=64, q_len=1024, kv_len=1024, packages=packages)
    try:
        chooser = AutoChooser()  # as auto() is now: ATTNKIT_BACKEND included
        forced_error = None
    except ValueError as e:  # ATTNKIT_BACKEND names no backend: say so, describe the rest
        forced_error = str(e)
        saved = os.environ.pop(ENV_VAR)
        try:
            chooser = AutoChooser()
        finally:
            os.environ[ENV_VAR] = saved
    backends = []
    for label in CANDIDATES:
        backend = chooser.backend(label)
        reasons = reasons_of(backend, probe)
        caps = getattr(backend, "capabilities", None)
        backends.append(
            {
                "name": label,
                "available": not reasons,
                "reasons": reasons,
                "install": install_hint_of(backend, probe),
                "limits": describe_capabilities(caps) if isinstance(caps, Capabilities) else None,
            }
        )

    hw, order = chooser.order_for(probe)
    choices = []
    for head_dim, tokens in SD15_SHAPES:
        for dt in (torch.float16, torch.float32):
            for mask in ("none", "key_padding"):
                row = {"head_dim": head_dim, "tokens": tokens, "dtype": dtype_name(dt), "mask": mask}
                for kind, kv_len in (("self", tokens), ("cross", SD15_TEXT_TOKENS)):
                    call = AttentionCall(
                        dev_info,
                        dt,
                        head_dim,
                        q_len=tokens,
                        kv_len=kv_len,
                        batch=2,
                        heads=8,
                        mask=mask,
                        packages=packages,
                    )
                    label, table, _ = chooser.walk(call)
                    before = list(table)[: list(table).index(label)] if label else list(table)
                    row[kind] = {"backend": label, "skipped": {k: table[k] for k in before}}
                choices.append(row)
    return {
        "versions": versions,
        "diffusers_hooks": hooks.status(),
        "devices": _devices(),
        "primary_device": str(device),
        "probe": f"{dtype_name(dtype)}, head_dim=64, 1024 tokens, no mask",
        "backends": backends,
        "hardware_class": hw,
        "priority": list(order),
        "priority_why": _why(hw),
        "forced": chooser.forced,
        "forced_error": forced_error,
        "sd15": choices,
        "records": record_rules(dev_info, chooser, packages),
    }


def report(data: dict[str, Any] | None = None) -> str:
    """The text ``attnkit info`` prints."""
    data = collect() if data is None else data
    lines = ["attnkit info", "", "versions:"]
    for name, version in data["versions"].items():
        missing = "-" if name in ("cuda", "hip") else "not installed"
        lines.append(f"  {name:<13} {version if version is not None else missing}")
    hooks_ = data.get("diffusers_hooks", [])
    if hooks_:
        at_import = [h for h in hooks_ if not h.get("on_demand")]
        installed = [h["name"] for h in at_import if h["installed"]]
        lines += [
            "",
            f"changes to diffusers (attnkit/diffusers/hooks.py): {len(installed)} of {len(at_import)} installed"
            + (f": {', '.join(installed)}" if installed else ""),
        ]
        for h in at_import:
            if not h["installed"]:
                lines.append(f"  {h['name']}: not installed ({h['problem'] or 'hooks.uninstall()'})")
        for h in hooks_:
            if h.get("on_demand"):
                state = (
                    "installed" if h["installed"] else f"not installed ({h['problem']})" if h["problem"] else "not used"
                )
                lines.append(f"  on demand: {h['name']}: {state}")
    lines += ["", "devices:"]
    for dev in data["devices"]:
        extra = ""
        if "capability" in dev:
            extra = f" (compute capability {dev['capability']}, {dev['memory_gib']} GiB)"
        lines.append(f"  {dev['device']:<8} {dev['name']}{extra}")
    lines += ["", f"backends on {data['primary_device']} ({data['probe']}):"]
    width = max(len(b["name"]) for b in data["backends"])
    for b in data["backends"]:
        state = "available" if b["available"] else "unavailable: " + "; ".join(b["reasons"])
        lines.append(f"  {b['name']:<{width}}  {state}")
        if b.get("install"):
            lines.append(f"  {'':<{width}}  install: {b['install']}")
        if b["limits"]:
            lines.append(f"  {'':<{width}}  limits: {b['limits']}")
    if data.get("forced_error"):
        lines += ["", f"attention: {data['forced_error']}; auto() raises until it is fixed"]
    lines += [
        "",
        f"auto() on {data['primary_device']}: "
        + (f"forced by {data['hardware_class']}" if data.get("forced") else f"hardware class {data['hardware_class']}")
        + f", order {' > '.join(data['priority'])}",
        f"  why: {data['priority_why']}",
        "",
        "auto() for Stable Diffusion 1.5 shapes (batch 2, 8 heads; cross-attention to "
        f"{SD15_TEXT_TOKENS} text tokens):",
        f"  {'head_dim':>8} {'tokens':>6} {'dtype':<8} {'mask':<11} {'self':<12} cross",
    ]
    notes: dict[str, str] = {}
    for row in data["sd15"]:
        cells = []
        for kind in ("self", "cross"):
            cells.append(row[kind]["backend"] or "(none)")
            for name, reasons in row[kind]["skipped"].items():
                notes.setdefault(
                    f"{name} ({row['dtype']}, D={row['head_dim']}, mask={row['mask']})", "; ".join(reasons)
                )
        lines.append(
            f"  {row['head_dim']:>8} {row['tokens']:>6} {row['dtype']:<8} {row['mask']:<11} {cells[0]:<12} {cells[1]}"
        )
    if notes:
        lines += ["", "  skipped before the choice:"]
        seen_reasons: set[str] = set()
        for what, why in notes.items():
            name = what.split(" ", 1)[0]
            if (name, why) in seen_reasons:
                continue
            seen_reasons.add((name, why))
            lines.append(f"    {what}: {why}")
    rec = data.get("records")
    if rec is not None:
        lines.append("")
        if rec["record"] is None:
            lines.append(
                f"GPU record rules: none for {rec['device']} (recorded: {', '.join(rec['recorded'])}); "
                "auto() walks the hardware class's order"
            )
        else:
            lines.append(f"GPU record rules for {rec['device']} ({rec['record']}, `python -m tools.records`):")
            for r in rec["rules"]:
                if r["changed"]:
                    what = f"{r['backend'] or '(none)'} (the class's order alone: {r['without_rule'] or '(none)'})"
                else:
                    what = f"{r['backend'] or '(none)'} (the same without the rule)"
                lines.append(f"  {r['call']} -> {what}")
                lines.append(f"    {r['rule']}")
            if rec.get("tiles"):
                lines.append(
                    "  Triton default tiles (with ATTNKIT_TRITON_AUTOTUNE=0; ATTNKIT_TILE_RECORDS=0 keeps "
                    "the shipped ones):"
                )
                for t in rec["tiles"]:
                    lines.append(f"    {t['list']}; {t['calls']}: {t['tile']} instead of {t['replaces']}")
                    lines.append(f"      {t['source']}")
    lines += [
        "",
        "Force a backend with ATTNKIT_BACKEND=name; see processor.explain() after a run "
        "for the decisions auto() actually made.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="attnkit info", description="Devices, versions, attention backends and what attnkit.auto() chooses here."
    )
    parser.add_argument("--json", action="store_true", help="print the data as JSON")
    parser.add_argument(
        "--model",
        metavar="CONFIG",
        help="also say how attnkit reaches every attention module of this model: a folder with "
        "a diffusers config.json (a model's transformer/ or unet/ folder), a config.json, "
        "or a config shipped with attnkit (flux_dev_transformer, ...)",
    )
    args = parser.parse_args(argv)
    if args.model:
        try:
            name, routes = model_plan(args.model)
        except (OSError, ValueError) as e:
            print(f"attnkit info: {e}", file=sys.stderr)
            return 2
        if args.json:
            print(
                json.dumps(
                    {
                        "model": name,
                        "routes": {n: {"route": r.kind, "reason": r.reason} for n, r in routes.routes.items()},
                    },
                    indent=2,
                )
            )
        else:
            print(f"{name}: {routes.explain()}")
        return 0
    data = collect()
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        print(report(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
