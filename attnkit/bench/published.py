"""Published Stable Diffusion numbers that `attnkit bench` reproduces, as printed.

Every number here is transcribed from its source, named in SOURCES; nothing is derived
except where a comment says so. Devices are keyed by the name the source prints;
:func:`match_device` maps the name torch reports (``torch.cuda.get_device_name()``) to it.
"""

from __future__ import annotations

import re

SOURCES = {
    "diffusers-v0.18-memory-and-speed": (
        "Hugging Face diffusers documentation v0.18.2, 'Memory and speed' "
        "(docs/source/en/optimization/fp16): latency ladder on NVIDIA TITAN RTX and the "
        "'Memory Efficient Attention' it/s table (512x512, batch size 1, fp16)"
    ),
    "pytorch2-diffusers-post": (
        "Hugging Face blog, 'Accelerated Diffusers with PyTorch 2.0' (Pedro Cuenca, Patrick "
        "von Platen, Suraj Patil, March 2023): batch-size sweeps, speedup over vanilla and "
        "xFormers attention, with and without torch.compile (numbers stated in its text; "
        "its bar charts are images and are not transcribed)"
    ),
}

# The published tables' names for attnkit's processors.
PUBLISHED_NAMES = {"vanilla": "Base Attention", "xformers": "Memory Efficient Attention"}

# -- Table 1: it/s, 512x512, batch size 1 (one prompt), fp16 ---------------------------
# "Base Attention FP16" is diffusers' vanilla attention (attnkit's "vanilla"); "Memory
# Efficient Attention FP16" is xFormers (attnkit's "xformers"). Keys: the source's names.
IT_PER_S_FP16 = {
    "NVIDIA Tesla T4": {"vanilla": 3.5, "xformers": 5.5},
    "NVIDIA 3060 RTX": {"vanilla": 4.6, "xformers": 7.8},
    "NVIDIA A10G": {"vanilla": 8.88, "xformers": 15.6},
    "NVIDIA RTX A6000": {"vanilla": 11.7, "xformers": 21.09},
    "NVIDIA TITAN RTX": {"vanilla": 12.51, "xformers": 18.22},
    # printed as "29.it/s"
    "A100-SXM4-40GB": {"vanilla": 18.6, "xformers": 29.0},
    "A100-SXM-80GB": {"vanilla": 18.7, "xformers": 29.5},
}
IT_PER_S_SOURCE = "diffusers-v0.18-memory-and-speed"
IT_PER_S_SETTING = "512x512, batch size 1 (one prompt), fp16, 50 steps (diffusers 0.18 era)"

# -- Table 2: the latency ladder ---------------------------------------------------------
# "obtained on NVIDIA TITAN RTX by generating a single image of size 512x512 from the
# prompt 'a photo of an astronaut riding a horse on mars' with 50 DDIM steps."
# (step name, seconds per image, cumulative speedup as printed)
LADDER_TITAN_RTX = [
    ("original (fp32)", 9.50, 1.0),
    ("fp16", 3.61, 2.63),
    ("channels last", 3.30, 2.88),
    ("traced UNet", 3.21, 2.96),
    ("memory efficient attention", 2.63, 3.61),
]
LADDER_DEVICE = "NVIDIA TITAN RTX"
LADDER_SOURCE = "diffusers-v0.18-memory-and-speed"

# -- Table 3: the PyTorch 2.0 post, as stated in its text ------------------------------
# The per-batch bars are figures; these are the statements that carry numbers.
# speedup: (low, high) factor of PyTorch 2.0 SDPA over the named baseline.
PT2_CLAIMS = [
    {
        "dtype": "float32",
        "gpu": "A100",
        "versus": "vanilla",
        "speedup": (1.5, 1.5),
        "text": "about 50% speedup on A100 (no compile)",
    },
    {
        "dtype": "float32",
        "gpu": "RTX 4090",
        "versus": "vanilla",
        "speedup": (1.35, 1.5),
        "text": "between 35% and 50% on 4090 GPUs, depending on batch size",
    },
    {
        "dtype": "float32",
        "gpu": "A100",
        "versus": "xformers",
        "speedup": (1.0, 1.02),
        "text": "moderate speedups of up to 2% on datacenter cards such as A100 or T4",
    },
    {
        "dtype": "float32",
        "gpu": "Tesla T4",
        "versus": "xformers",
        "speedup": (1.0, 1.02),
        "text": "moderate speedups of up to 2% on datacenter cards such as A100 or T4",
    },
    {
        "dtype": "float32",
        "gpu": "RTX 3090",
        "versus": "xformers",
        "speedup": (1.0, 1.20),
        "text": "up to 20% speed improvement on 3090",
    },
    {
        "dtype": "float32",
        "gpu": "RTX 4090",
        "versus": "xformers",
        "speedup": (1.10, 1.45),
        "text": "between 10% and 45% on 4090, depending on batch size",
    },
    {
        "dtype": "float32",
        "gpu": "all",
        "versus": "no compile",
        "speedup": (1.02, 1.03),
        "text": "torch.compile(): additional boost of (typically) 2% and 3%",
    },
    {
        "dtype": "float16",
        "gpu": "all but RTX 4090",
        "versus": "vanilla",
        "speedup": (1.20, 1.28),
        "text": "between 20% and 28% over standard attention, across all the GPUs we tested, except for the 4090",
    },
]
# Largest batch sizes stated in the post (512x512, float32).
PT2_MAX_BATCH = [
    {
        "gpu": "A100-SXM4-40GB",
        "processor": "vanilla",
        "max_batch": None,
        "oom_at": 10,
        "text": "A single 40GB A100 GPU runs out of memory with a batch size of 10",
    },
    {
        "gpu": "RTX 3090",
        "processor": "vanilla",
        "max_batch": None,
        "oom_at": 8,
        "text": "24 GB high-end consumer cards such as 3090 and 4090 cannot generate 8 images at once",
    },
    {
        "gpu": "RTX 4090",
        "processor": "vanilla",
        "max_batch": None,
        "oom_at": 8,
        "text": "24 GB high-end consumer cards such as 3090 and 4090 cannot generate 8 images at once",
    },
    {
        "gpu": "RTX 3090",
        "processor": "sdpa",
        "max_batch": 48,
        "oom_at": None,
        "text": "Using PyTorch 2.0 and diffusers we could achieve batch sizes of 48 for 3090 and 4090",
    },
    {
        "gpu": "RTX 4090",
        "processor": "sdpa",
        "max_batch": 48,
        "oom_at": None,
        "text": "Using PyTorch 2.0 and diffusers we could achieve batch sizes of 48 for 3090 and 4090",
    },
    {"gpu": "A100-SXM4-40GB", "processor": "sdpa", "max_batch": 64, "oom_at": None, "text": "and 64 for A100"},
]
PT2_SOURCE = "pytorch2-diffusers-post"

# -- matching torch's device names to the sources' ---------------------------------------
# Each seed key with the patterns (on the normalised name) that mean the same device.
_DEVICE_PATTERNS = {
    "NVIDIA Tesla T4": [r"\bt4\b"],
    "NVIDIA 3060 RTX": [r"\b3060\b"],
    "NVIDIA A10G": [r"\ba10g\b"],
    "NVIDIA RTX A6000": [r"\ba6000\b"],
    "NVIDIA TITAN RTX": [r"\btitan rtx\b"],
    "A100-SXM4-40GB": [r"\ba100[- ]sxm4?[- ]40gb\b"],
    "A100-SXM-80GB": [r"\ba100[- ]sxm4?[- ]80gb\b"],
}


def _normalise(name: str) -> str:
    return re.sub(r"\s+", " ", name.lower().replace("_", " ")).strip()


def match_device(device_name: str | None) -> str | None:
    """The seed table's key for a device torch names, or None if the seed did not measure it.

    >>> match_device("NVIDIA A100-SXM4-80GB")
    'A100-SXM-80GB'
    >>> match_device("NVIDIA H100 80GB HBM3") is None
    True
    """
    if not device_name:
        return None
    name = _normalise(device_name)
    # A Ti or laptop variant is a different device: never match "RTX 3060 Ti" to "3060".
    if re.search(r"\b(ti|laptop|mobile)\b", name):
        return None
    for key, patterns in _DEVICE_PATTERNS.items():
        if any(re.search(p, name) for p in patterns):
            return key
    return None


def published_row(device_name: str | None) -> dict | None:
    """The seed's it/s row for this device: {"device", "source", "setting", "it_per_s"}."""
    key = match_device(device_name)
    if key is None:
        return None
    return {
        "device": key,
        "source": SOURCES[IT_PER_S_SOURCE],
        "setting": IT_PER_S_SETTING,
        "it_per_s": dict(IT_PER_S_FP16[key]),
    }


def published_ladder(device_name: str | None) -> list[tuple[str, float, float]] | None:
    """The seed ladder when this device is the one it was measured on, else None."""
    if device_name and _normalise(device_name).endswith("titan rtx"):
        return list(LADDER_TITAN_RTX)
    return None
