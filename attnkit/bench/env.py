"""Where a result was measured, and what the harness reads about its own process.

- :func:`environment`: device, versions, date, command line and the machine's load, as
  results.json records them;
- :func:`quiet_diffusers`: diffusers' info/warning logs off (they would bury the tables);
- memory of this process (Linux ``/proc``): :func:`status_kb`, :func:`reset_peak_rss`,
  :func:`cap_address_space`, :func:`available_memory_bytes`, :func:`free_memory`.
"""

from __future__ import annotations

import datetime as _dt
import gc
import os
import platform
import resource
import sys

import torch

from attnkit.backends.base import package_version

PACKAGES = ("torch", "diffusers", "triton", "xformers", "flash-attn", "sageattention", "attnkit", "numpy")


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


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages (runnable processes), or None off Linux.

    On a machine shared with other work, timings mean little without it: a load above
    the number of CPUs means the benchmark waited for cores.
    """
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except (OSError, ValueError):
        return None


def environment(device: torch.device, argv: list[str] | None = None) -> dict:
    """Everything results.json says about where and when it was measured."""
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
        "load_average_start": load_average(),
        "load_average_end": None,  # filled in when the run ends
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["capability"] = list(torch.cuda.get_device_capability(device))
        info["total_memory_bytes"] = props.total_memory
    return info


def quiet_diffusers() -> None:
    """diffusers' info/warning logs (on casting a model, on experimental backends) off."""
    try:
        from diffusers.utils import logging as dlogging

        dlogging.set_verbosity_error()
    except Exception:  # noqa: BLE001 - a logging tweak must never stop a run
        pass


# -- memory of this process ------------------------------------------------------------
def status_kb(field: str) -> int | None:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM, VmSize), or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset VmHWM (peak RSS) so that it covers only what runs next (Linux 4.0+)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes(reset: bool) -> int:
    """Peak RSS since the last :func:`reset_peak_rss` (``reset``: it succeeded), else of
    the whole process."""
    if reset:
        return (status_kb("VmHWM") or 0) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cap_address_space(extra_bytes: int) -> int | None:
    """Limit this process's address space to its current size + extra_bytes. The limit.

    An allocation beyond it raises "can't allocate memory" in torch, which ends a sweep
    cleanly instead of swapping or waking the kernel's OOM killer.
    """
    vm_kb = status_kb("VmSize")
    if vm_kb is None:
        return None
    limit = vm_kb * 1024 + int(extra_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limit


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo, or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def free_memory(device: torch.device | None = None) -> None:
    """Collect garbage (and CUDA's cached blocks) between configurations."""
    gc.collect()
    if torch.cuda.is_available() and (device is None or device.type == "cuda"):
        torch.cuda.empty_cache()
