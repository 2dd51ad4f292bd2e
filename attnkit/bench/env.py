"""Where a result was measured: device, versions, date and the command line."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys

import torch

from attnkit.backends.base import package_version

PACKAGES = ("torch", "diffusers", "triton", "xformers", "flash-attn", "attnkit", "numpy")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return f"CPU: {cpu_name()} ({torch.get_num_threads()} threads)"
    return device.type


def environment(device: torch.device, argv: list[str] | None = None) -> dict:
    info = {
        "device": device.type,
        "device_name": device_name(device),
        "capability": None,
        "total_memory_bytes": None,
        "versions": {name: package_version(name) for name in PACKAGES},
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["attnkit", "bench", *(argv if argv is not None else sys.argv[1:])]),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32 if device.type == "cuda" else None,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["capability"] = list(torch.cuda.get_device_capability(device))
        info["total_memory_bytes"] = props.total_memory
    return info
