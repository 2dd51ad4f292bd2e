"""Which tile of tiles.py serves a flash kernel's launch: the target of a device, the
candidates of a list, a GPU's recorded default (tile_rules.py), the autotuner over a
list, and the Launch a plan makes of them (tile_launch).

Under Triton's interpreter the launcher takes the path of sm_90, or of the target in
launcher.settings().arch (its TMA loads included), with a small tile (INTERPRET_TILE) so
that tests cross many tile boundaries, or with the tile its target ships
(settings().shipped_tiles)."""

from __future__ import annotations

import functools
import threading
from typing import Optional

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import devices, limits
from ..launcher import INTERPRETED, Launch, make_tuner, settings
from ..tile_rules import TILE_RULES
from .abi import COMPILE_OPTIONS, TUNE_KEY
from .kernels import DESCRIPTORS, KERNELS
from .tile_config import TileConfig
from .tiles import CONFIGS

INTERPRET_TILE = TileConfig(32, 32, 4, 1)
ARCHS = ("sm80", "sm90")


def band(padded: int) -> int:
    """The head-dim band of a padded head dim (devices.band)."""
    return devices.band(padded)


# Remembered per head dim: at most 1,024 (the kernels take 8 to 512); never stale.
@functools.lru_cache(maxsize=1024)
def pieces(head_dim: int) -> tuple[int, int]:
    """limits.split_head_dim, remembered (the launchers ask on every new signature)."""
    return limits.split_head_dim(head_dim)


@functools.lru_cache(maxsize=1024)
def padded(head_dim: int) -> int:
    """limits.padded_head_dim, remembered."""
    return limits.padded_head_dim(head_dim)


def width(dtype: torch.dtype) -> str:
    return "32bit" if dtype == torch.float32 else "16bit"


def arch_of(device: torch.device) -> str:
    """The CONFIGS target of a device (devices.target): "sm90" for Hopper and datacenter
    Blackwell, "sm80" for Ampere, Ada and consumer Blackwell (99 KiB of shared memory per
    block, no warp-group MMA); "sm90" on the CPU. settings().arch, where set, on every
    device."""
    forced = settings().arch
    if forced is not None:
        return forced
    if device.type != "cuda":
        return "sm90"
    return _cuda_target(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_target(index: int) -> str:
    """devices.target of CUDA device `index` (a capability does not change; one entry a
    device)."""
    return devices.target(torch.cuda.get_device_capability(index))


def configs_for(
    kernel: str,
    head_dim: int,
    dtype: torch.dtype,
    arch: str = "sm90",
    variant: str = "none",
    causal: bool = False,
    tma: bool = False,
) -> tuple[TileConfig, ...]:
    """The autotuning candidates of one kernel ("fwd", "dkdv", "dq", ...) at this head
    dim for one bias variant ("none", "keypad", "full", "full16"), causality and kind of
    loads, the default first."""
    size = padded(head_dim)
    cands = CONFIGS[arch][kernel][width(dtype)][band(size)]
    loads = "tma" if tma else "ptr"
    found = tuple(
        c
        for c in cands
        if variant in c.variants
        and causal in c.causal
        and loads in c.loads
        and (c.dims is None or c.dims[0] <= size <= c.dims[1])
    )
    only = settings().candidates
    return found if only is None or not found else tuple(only(kernel, found, tma))


@functools.lru_cache(maxsize=None)
def _cuda_record(index: int) -> str:
    """The record folder of CUDA device `index` (one entry a device; a name does not change)."""
    return devices.record_folder(torch.cuda.get_device_name(index))


def record_of(device: torch.device) -> Optional[str]:
    """The GPU record folder of a device's name (settings().gpu on the CPU)."""
    if device.type != "cuda":
        return settings().gpu
    return _cuda_record(device.index if device.index is not None else torch.cuda.current_device())


def recorded_tile(
    kernel: str,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    variant: str,
    causal: bool,
    tma: bool,
    lengths: Optional[tuple] = None,
):
    """The rule of tile_rules.py (generated from the GPU records) that makes another
    shipped candidate this call's default on its GPU, or None: a GPU, list or length
    without one keeps the shipped order, and so does every call with
    ATTNKIT_TILE_RECORDS=0 (settings().tile_records: bench/gpu_tiles.py times the shipped
    defaults with it, so that a record measures them against the autotuner's choices)."""
    s = settings()
    if lengths is None or not s.tile_records:
        return None
    folder = record_of(device)
    if folder is None:
        return None
    key = (
        folder,
        arch_of(device),
        kernel,
        width(dtype),
        band(padded(head_dim)),
        variant,
        causal,
        "tma" if tma else "ptr",
    )
    dtype_name = str(dtype).replace("torch.", "")
    for rule in TILE_RULES if s.tile_rules is None else s.tile_rules:
        if rule[:8] == key and rule.dtype == dtype_name and lengths[0] >= rule.min_q and lengths[1] >= rule.min_kv:
            return rule
    return None


def default_tile(
    cands: tuple,
    kernel: str,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    variant: str,
    causal: bool,
    tma: bool,
    lengths: Optional[tuple],
) -> TileConfig:
    """The tile a call runs without autotuning: its GPU's recorded default where a rule
    covers the call and names a candidate serving it, else the list's first."""
    rule = recorded_tile(kernel, head_dim, dtype, device, variant, causal, tma, lengths)
    if rule is not None:
        for c in cands:
            if str(c) == rule.tile:
                return c
    return cands[0]


# One triton.autotune wrapper per (target, kernel, width, band, variant, causal, loads,
# candidates), built on first use: each has its own candidates and its own cache of best
# configs. The tuner is keyed by the exact lengths, but consulted only for the first call
# of a length bucket (the lengths rounded up to powers of two, bucket()): its choice is
# kept per bucket in attnkit_chosen, and later signatures of the bucket settle on it
# without tuning. Bounded by the shipped tile lists (one wrapper a list at most); never
# stale: a wrapper is what its key names, and a plan built with autotuning off does not
# use one.
_TUNERS: dict[tuple, object] = {}
_TUNERS_LOCK = threading.Lock()


def tuner_choices() -> dict[tuple, dict]:
    """What each autotuner chose so far: its key (target, kernel, width, band, variant,
    causal, loads, candidates) -> {length bucket: the tile its later calls run}
    (bench/gpu_tiles.py records them)."""
    with _TUNERS_LOCK:
        tuners = list(_TUNERS.items())
    return {key: dict(getattr(t, "attnkit_chosen", {})) for key, t in tuners}


def kernel_for(
    kernel: str,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    variant: str,
    causal: bool,
    tma: bool,
    lengths: Optional[tuple] = None,
):
    """(callable kernel, fixed tile or None): the autotuner, or the plain kernel with its
    default tile (the GPU's recorded one where tile_rules.py has a rule for the call's
    list and lengths (M, N), else the list's first)."""
    s = settings()
    arch = arch_of(device)
    if s.interpret:
        if s.shipped_tiles:
            cands = configs_for(kernel, head_dim, dtype, arch, variant, causal, tma)
            return KERNELS[kernel], default_tile(cands, kernel, head_dim, dtype, device, variant, causal, tma, lengths)
        return KERNELS[kernel], s.interpret_tile or INTERPRET_TILE
    cands = configs_for(kernel, head_dim, dtype, arch, variant, causal, tma)
    if not s.autotune or len(cands) == 1:
        return KERNELS[kernel], default_tile(cands, kernel, head_dim, dtype, device, variant, causal, tma, lengths)
    # The candidates too: within a band, some hold only for part of its head dims (a tile's
    # dims), and a tuner made for one head dim must not time another's list.
    key = (arch, kernel, width(dtype), band(padded(head_dim)), variant, causal, tma, cands)
    tuner = _TUNERS.get(key)
    if tuner is None:
        with _TUNERS_LOCK:  # one tuner per key, whichever thread comes first: its choices are kept
            tuner = _TUNERS.get(key)
            if tuner is None:
                tuner = _TUNERS[key] = tuner_of(kernel, cands)
    return tuner, None


def set_boxes(kernel: str):
    """A pre-launch hook that sizes the kernel's tensor descriptors for the tile
    configuration about to run (the box rows are its block sizes)."""

    def hook(nargs):
        for names, rows_key in DESCRIPTORS[kernel]:
            for name in names:
                desc = nargs[name]
                if isinstance(desc, TensorDescriptor):
                    desc.block_shape = [1, 1, nargs[rows_key], desc.block_shape[3]]

    return hook


def tuner_of(kernel: str, cands: tuple[TileConfig, ...], **autotune_options):
    """A triton.autotune wrapper of one flash kernel over these candidates (see
    launcher.make_tuner)."""
    hook = set_boxes(kernel)
    configs = [
        triton.Config(
            {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "RELOAD": c.reload},
            num_warps=c.num_warps,
            num_stages=c.num_stages,
            maxnreg=c.maxnreg,
            pre_hook=hook,
        )
        for c in cands
    ]
    return make_tuner(KERNELS[kernel], configs, list(TUNE_KEY), **autotune_options)


def bucket(m: int, n: int, q: torch.Tensor, attn_bias: Optional[torch.Tensor]) -> tuple:
    """What an autotuner's choice for a launch is kept under, with its static tune key:
    the lengths rounded up to powers of two and the dtypes."""
    return limits._next_pow2(m), limits._next_pow2(n), str(q.dtype), None if attn_bias is None else str(attn_bias.dtype)


def tile_launch(
    kernel: str,
    fn,
    tile: Optional[TileConfig],
    static: dict,
    grid_rows: int,
    axis: str,
    b: int,
    h: int,
    *,
    cuda: bool,
    lengths_bucket: Optional[tuple] = None,
    variant: Optional[str] = None,
) -> Launch:
    """The Launch of a flash kernel with its tile (or its autotuner, fn, when tile is
    None): the tile's constexprs and compile options, its descriptors' boxes, and the
    autotuner's bucket key ((head dim, rounded lengths, causal, TMA, piece, gradients,
    precision, dtypes): the tuner's own key with the lengths rounded; bench/gpu_tiles.py
    logs the choices by it)."""
    interpret = settings().interpret
    key = None
    if lengths_bucket is not None:
        key = (static.get("HEAD_DIM"), *lengths_bucket[:2], *(static.get(k) for k in TUNE_KEY[3:]), *lengths_bucket[2:])
    options = dict(COMPILE_OPTIONS)
    meta = None
    if tile is not None:
        meta = dict(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, RELOAD=tile.reload)
        regs = {} if interpret or tile.maxnreg is None else {"maxnreg": tile.maxnreg}
        options = dict(num_warps=tile.num_warps, num_stages=tile.num_stages, **COMPILE_OPTIONS, **regs)
    boxes = DESCRIPTORS.get(kernel, ())
    return Launch(
        kernel,
        KERNELS[kernel],
        fn,
        static,
        grid_rows,
        axis,
        b,
        h,
        meta=meta,
        options=options,
        cuda=cuda,
        bucket=key,
        boxes=boxes,
        set_boxes=set_boxes(kernel) if boxes else None,
        variant=variant,
        tile_name=None if tile is None else str(tile),
    )


# Offsets inside a tile (row index times row stride) are 32-bit, everything above them
# 64-bit. The most rows a tile of any shipped configuration has (the delta pass uses 64):
MAX_TILE_ROWS = (
    max(INTERPRET_TILE.block_m, INTERPRET_TILE.block_n, 16)
    if INTERPRETED
    else max(
        max(c.block_m, c.block_n, 64)
        for arch in CONFIGS.values()
        for kern in arch.values()
        for width_lists in kern.values()
        for cands in width_lists.values()
        for c in cands
    )
)
