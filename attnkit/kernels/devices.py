"""Which tile lists a GPU runs, and the calls its shared memory cannot hold; without triton.

    import attnkit.kernels.devices as devices
    devices.shared_memory_problem((8, 9), torch.float32, 512, ("full",), False, backward=True)

The tile lists (flash_attention.CONFIGS) are compiled and checked for two targets:
"sm80" (Ampere's mma.sync, no TMA) and "sm90" (Hopper's warp-group MMA and TMA). Every
GPU from compute capability 8.0 runs one of them, and they differ in the shared memory
one block may use (the opt-in maximum; CUDA C++ Programming Guide, technical
specifications per compute capability):

    capability   GPUs                          shared memory per block   tile lists
    8.0          A100, A30                     163 KiB (166,912 B)       sm80
    8.6, 8.9     RTX 30xx / 40xx, A10, L4, L40   99 KiB (101,376 B)      sm80
    8.7          Jetson Orin                   163 KiB                   sm80
    9.0          H100, H200, GH200             227 KiB (232,448 B)       sm90
    10.0         B200, GB200                   227 KiB                   sm90
    12.0         RTX 50xx, RTX PRO Blackwell     99 KiB                  sm80

Consumer Blackwell (12.x) has no warp-group MMA, and the sm90 lists' Hopper tiles need up
to 227 KiB: it runs the sm80 lists. Each sm80 default fits 99 KiB where a tile that does
and compiles clean (no spill, no duplicated work) exists (`python -m tools.static_report`
checks it); where none does, the default is A100's clean tile and the call is in NEEDS
below. On a GPU with less shared memory than the call needs the backend refuses it up
front (auto() then picks another backend, before the forward rather than at a backward
that cannot launch) and flash_attention raises a ValueError naming the limit. The check
counts the bias-gradient kernels (*_dbias) whenever gradients are needed: a call's
signature does not say whether its mask needs one.
"""

from __future__ import annotations

import re

from . import limits


def record_folder(name: str) -> str:
    """A device name as ``bench/results/`` names its record: lower case, dashes
    ("NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3")."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# The opt-in maximum of shared memory per block, in bytes, by compute capability.
SHARED_MEMORY = {
    (8, 0): 166_912,
    (8, 6): 101_376,
    (8, 7): 166_912,
    (8, 9): 101_376,
    (9, 0): 232_448,
    (10, 0): 232_448,
    (12, 0): 101_376,
}
# The least of them among GPUs that run the sm80 lists: their defaults must fit it.
SM80_LEAST = 101_376

# The shipped default tiles that need more shared memory than SM80_LEAST, as the static
# report (bench/results/static/report.json) measured them on their target:
# (target, kernel, "16bit" or "32bit", head-dim band, bias variant, causal) -> bytes, the
# most over the band's head dims, loads and launches. tests/static_report/test_kernel_inspect.py checks
# that this table is exactly what the committed report says.
NEEDS: dict[tuple[str, str, str, int, str, bool], int] = {
    ("sm80", "dkdv", "16bit", 96, "full", True): 107_264,
    ("sm80", "dkdv", "16bit", 512, "full", False): 101_760,
    ("sm80", "dkdv", "16bit", 512, "full", True): 101_760,
    ("sm80", "dkdv", "16bit", 512, "keypad", True): 165_760,
    ("sm80", "dkdv", "32bit", 512, "full", False): 133_312,
    ("sm80", "dkdv", "32bit", 512, "full", True): 133_312,
    ("sm80", "dkdv", "32bit", 512, "keypad", False): 132_352,
    ("sm80", "dkdv", "32bit", 512, "keypad", True): 132_352,
    ("sm80", "dkdv", "32bit", 512, "none", False): 132_224,
    ("sm80", "dkdv", "32bit", 512, "none", True): 132_224,
    ("sm80", "dkdv_dbias", "16bit", 320, "keypad", True): 104_320,
    ("sm80", "dkdv_dbias", "16bit", 384, "full", True): 128_768,
    ("sm80", "dkdv_dbias", "16bit", 512, "full", False): 137_600,
    ("sm80", "dkdv_dbias", "16bit", 512, "full", True): 101_760,
    ("sm80", "dkdv_dbias", "16bit", 512, "keypad", True): 165_760,
    ("sm80", "dkdv_dbias", "32bit", 512, "full", False): 133_312,
    ("sm80", "dkdv_dbias", "32bit", 512, "full", True): 133_312,
    ("sm80", "dkdv_dbias", "32bit", 512, "keypad", False): 132_352,
    ("sm80", "dkdv_dbias", "32bit", 512, "keypad", True): 132_352,
    ("sm80", "dq", "32bit", 512, "full", False): 131_072,
    ("sm80", "dq", "32bit", 512, "full", True): 131_072,
    ("sm80", "dq", "32bit", 512, "keypad", False): 132_160,
    ("sm80", "dq", "32bit", 512, "keypad", True): 132_160,
    ("sm80", "dq", "32bit", 512, "none", False): 132_096,
    ("sm80", "dq", "32bit", 512, "none", True): 132_096,
    ("sm80", "dq_dbias", "16bit", 512, "full", False): 102_400,
    ("sm80", "dq_dbias", "16bit", 512, "full", True): 102_400,
    ("sm80", "dq_dbias", "32bit", 512, "full", False): 133_120,
    ("sm80", "dq_dbias", "32bit", 512, "full", True): 133_120,
    ("sm80", "dq_dbias", "32bit", 512, "keypad", False): 132_160,
    ("sm80", "dq_dbias", "32bit", 512, "keypad", True): 132_160,
}

_FORWARD = ("fwd", "fwd_lo")
_BACKWARD = ("dkdv", "dq", "dkdv_dbias", "dq_dbias")


def target(capability: tuple[int, int]) -> str:
    """The tile lists a GPU of this compute capability runs: "sm90" for Hopper and
    datacenter Blackwell (9.x to 11.x), "sm80" for Ampere, Ada and consumer Blackwell."""
    return "sm90" if 9 <= capability[0] <= 11 else "sm80"


def band(head_dim: int) -> int:
    """The head-dim band (the key of a tile list) of a head dim."""
    padded = limits.padded_head_dim(head_dim)
    for bound in limits.BANDS:
        if padded <= bound:
            return bound
    raise ValueError(f"padded head dim {padded} exceeds {limits.MAX_HEAD_DIM}")


def shared_memory_problem(
    capability: tuple[int, int] | None, dtype, head_dim: int, variants, causal: bool, backward: bool
) -> str | None:
    """Why a GPU of this capability cannot run a call (the forward, and the backward if
    `backward`): a default tile needs more shared memory than it has. None if it can,
    or if the capability is unknown. variants: the table variants the call's bias may run
    as (bias_form: BiasForm.table_variant of a bias, variants_of_call of a call)."""
    have = SHARED_MEMORY.get(tuple(capability)) if capability else None
    if have is None:
        return None
    width = "32bit" if str(dtype) in ("torch.float32", "float32") else "16bit"
    arch = target(capability)
    b = band(head_dim)
    kernels = _FORWARD + (_BACKWARD if backward else ())
    # The most shared memory, and on a tie the kernel every such call runs (dkdv rather
    # than dkdv_dbias, which runs only for a bias that needs a gradient).
    need, _, kernel = max(
        (
            (NEEDS.get((arch, k, width, b, v, causal), 0), not k.endswith("_dbias"), k)
            for k in kernels
            for v in variants
        ),
        default=(0, True, ""),
    )
    if need <= have:
        return None
    what = "backward" if kernel in _BACKWARD else "forward"
    lower = max((bound for bound in limits.BANDS if bound < b), default=0) + 1
    return (
        f"the Triton {what} ({kernel}) at head dim {head_dim} in {width.replace('bit', '-bit')} "
        f"{'with a bias' if variants != ('none',) else 'without a bias'}{', causal' if causal else ''} "
        f"needs {need:,} B of shared memory per block (its tile for padded head dims {lower}-{b}), and a "
        f"GPU of compute capability {capability[0]}.{capability[1]} has {have:,} B: use another backend "
        f"for it (attnkit.auto() does; ATTNKIT_BACKEND=sdpa)"
    )
