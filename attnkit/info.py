"""``attnkit info`` (also ``python -m attnkit info``): what attnkit sees on this machine.

The first thing to run when attention is slow or a processor refuses to run: devices,
versions, every backend as available or not (with its reasons and declared limits), and
what ``attnkit.auto()`` would choose for Stable Diffusion 1.5's attention shapes.

    attnkit info            # human-readable report
    attnkit info --json     # the same data as JSON

From Python: :func:`collect` returns the data as a dict, :func:`report` the text.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import replace
from typing import Any

import torch

from .backends import AttentionCall, DeviceInfo
from .backends.base import MASK_KINDS, Capabilities, _sorted_dtypes, dtype_name, package_version
from .selector import (
    CANDIDATES,
    _default_backend,
    _reasons,
    choose,
    installed_packages,
    priority_for,
)

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
    """A backend's declared limits in one line (the README table says the same)."""
    parts = [
        "devices: " + ", ".join(sorted(caps.devices)),
        "dtypes: " + ", ".join(dtype_name(d) for d in _sorted_dtypes(caps.dtypes)),
    ]
    if caps.max_head_dim:
        head = f"head_dim {caps.min_head_dim}..{caps.max_head_dim}"
    else:
        head = "any head_dim" if caps.min_head_dim <= 1 else f"head_dim >= {caps.min_head_dim}"
    if caps.head_dim_multiple > 1:
        head += f", multiple of {caps.head_dim_multiple}"
    parts.append(head)
    if caps.min_capability:
        parts.append("compute capability >= " + ".".join(map(str, caps.min_capability)))
    parts.append("masks: " + ", ".join(k for k in MASK_KINDS if k in caps.masks))
    parts.append("backward: " + ("yes" if caps.backward else "no"))
    parts.append("deterministic: " + ("yes" if caps.deterministic else "no"))
    if caps.package:
        parts.append("needs " + caps.package + (f" >= {caps.min_version}" if caps.min_version else ""))
    return "; ".join(parts)


def collect() -> dict[str, Any]:
    """Everything ``attnkit info`` prints, as plain data."""
    from . import __version__

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
    backends = []
    for label in CANDIDATES:
        backend = _default_backend(label)
        reasons = _reasons(backend, probe)
        caps = getattr(backend, "capabilities", None)
        backends.append(
            {
                "name": label,
                "available": not reasons,
                "reasons": reasons,
                "limits": describe_capabilities(caps) if isinstance(caps, Capabilities) else None,
            }
        )

    hw, priority = priority_for(dev_info)
    choices = []
    for head_dim, tokens in SD15_SHAPES:
        for dt in (torch.float16, torch.float32):
            for mask in ("none", "key_padding"):
                row = {"head_dim": head_dim, "tokens": tokens, "dtype": dtype_name(dt), "mask": mask}
                for kind, kv_len in (("self", tokens), ("cross", SD15_TEXT_TOKENS)):
                    call = AttentionCall(
                        dev_info, dt, head_dim, q_len=tokens, kv_len=kv_len, batch=2, heads=8,
                        mask=mask, packages=packages,
                    )
                    try:
                        label, table = choose(call)
                        skipped = {k: v for k, v in table.items() if v and list(table).index(k) < list(table).index(label)}
                    except Exception as e:  # no backend at all: say why
                        label, skipped = None, {"error": [str(e)]}
                    row[kind] = {"backend": label, "skipped": skipped}
                choices.append(row)
    return {
        "versions": versions,
        "devices": _devices(),
        "primary_device": str(device),
        "probe": f"{dtype_name(dtype)}, head_dim=64, 1024 tokens, no mask",
        "backends": backends,
        "hardware_class": hw,
        "priority": list(priority.order),
        "priority_why": priority.why,
        "sd15": choices,
    }


def report(data: dict[str, Any] | None = None) -> str:
    """The text ``attnkit info`` prints."""
    data = collect() if data is None else data
    lines = ["attnkit info", "", "versions:"]
    for name, version in data["versions"].items():
        missing = "-" if name in ("cuda", "hip") else "not installed"
        lines.append(f"  {name:<13} {version if version is not None else missing}")
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
        if b["limits"]:
            lines.append(f"  {'':<{width}}  limits: {b['limits']}")
    lines += [
        "",
        f"auto() on {data['primary_device']}: hardware class {data['hardware_class']}, "
        f"order {' > '.join(data['priority'])}",
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
                notes.setdefault(f"{name} ({row['dtype']}, D={row['head_dim']}, mask={row['mask']})", "; ".join(reasons))
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
    lines += [
        "",
        "Force a backend with ATTNKIT_BACKEND=name; see processor.explain() after a run "
        "for the decisions auto() actually made.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="attnkit info",
        description="Devices, versions, attention backends and what attnkit.auto() chooses here.",
    )
    parser.add_argument("--json", action="store_true", help="print the data as JSON")
    args = parser.parse_args(argv)
    data = collect()
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        print(report(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
