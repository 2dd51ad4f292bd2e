"""Host side of the flash-attention kernels: which tile of tiles.py serves a call, its
grid, its arguments (strides, TMA descriptors, a key bias's lengths), and the launches
of the forward and of the three backward kernels (_forward_impl, _backward_impl).
Nothing here checks a caller's input: ops.py does, before anything runs."""

from __future__ import annotations

import functools
import inspect
import os
import threading
from typing import Optional

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import devices, limits
from ..bias_form import BIAS_16BIT_ALIGN, FULL16, KEYPAD, NONE, bias_form
from ..limits import _next_pow2, padded_head_dim, split_head_dim
from ..tile_records import TILE_RULES
from .kernels import DESCRIPTORS, FULL_BIAS, KERNELS, KEY_BIAS, LOG2E, NO_BIAS, _attn_bwd_delta
from .lengths import _key_lengths_kernel
from .tile_config import TileConfig
from .tiles import CONFIGS

# Triton's interpreter runs the same kernels on CPU tensors (for tests and debugging);
# TRITON_INTERPRET must be set before triton defines the kernels, so before this package
# is imported. The rest of the package reads it here (tests switch it).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

# Under the interpreter, tiles are small so that tests cross many tile boundaries;
# tests set INTERPRET_SHIPPED_TILES to run each kernel with the default tile the
# interpreted target (INTERPRET_ARCH) ships for the call's variant instead.
INTERPRET_CONFIG = TileConfig(32, 32, 4, 1)
INTERPRET_SHIPPED_TILES = False
ARCHS = ("sm80", "sm90")
# Head-dim bands of the candidate lists: a head dim uses the first band that holds its
# padded size (limits.padded_head_dim).
_BANDS = limits.BANDS


def _band(padded: int) -> int:
    return devices.band(padded)  # padding a padded head dim leaves it as it is


# The launchers ask for these on every call; they depend on the head dim only.
@functools.lru_cache(maxsize=None)
def _pieces(head_dim: int) -> tuple[int, int]:
    """limits.split_head_dim, remembered."""
    return split_head_dim(head_dim)


@functools.lru_cache(maxsize=None)
def _padded(head_dim: int) -> int:
    """limits.padded_head_dim, remembered."""
    return padded_head_dim(head_dim)


def _width(dtype: torch.dtype) -> str:
    return "32bit" if dtype == torch.float32 else "16bit"


# Under Triton's interpreter the launcher takes the path of this target (its TMA loads
# included), so that the CPU tests run what a GPU of that target runs; tests switch it.
INTERPRET_ARCH = "sm90"


def arch_of(device: torch.device) -> str:
    """The CONFIGS target of a device (devices.target): "sm90" for Hopper and datacenter
    Blackwell, "sm80" for Ampere, Ada and consumer Blackwell (99 KiB of shared memory per
    block, no warp-group MMA); INTERPRET_ARCH on the CPU."""
    if device.type != "cuda":
        return INTERPRET_ARCH
    return _cuda_target(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_target(index: int) -> str:
    """devices.target of CUDA device `index` (a capability does not change)."""
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
    dim for one bias variant ("none", "keypad", "full"), causality and kind of loads,
    the default first."""
    padded = _padded(head_dim)
    cands = CONFIGS[arch][kernel][_width(dtype)][_band(padded)]
    loads = "tma" if tma else "ptr"
    return tuple(
        c
        for c in cands
        if variant in c.variants
        and causal in c.causal
        and loads in c.loads
        and (c.dims is None or c.dims[0] <= padded <= c.dims[1])
    )


def _autotune_enabled() -> bool:
    return os.environ.get("ATTNKIT_TRITON_AUTOTUNE", "1") not in ("0", "")


# One triton.autotune wrapper per (target, kernel, width, band, variant, causal, loads,
# candidates), built on first use: each has its own candidates and its own cache of best configs. The tuner is keyed
# by the exact lengths, but consulted only for the first call of a length bucket (the
# lengths rounded up to powers of two, _Launch.bucket): its choice is kept per bucket in
# attnkit_chosen, and later signatures of the bucket settle on it without tuning. Bounded
# by the shipped tile lists (one wrapper a list at most); never stale: a wrapper is what
# its key names, and a plan built under ATTNKIT_TRITON_AUTOTUNE=0 does not use one.
_TUNERS: dict[tuple, object] = {}
_TUNERS_LOCK = threading.Lock()


def _set_boxes(kernel: str):
    """A pre-launch hook that sizes the kernel's tensor descriptors for the tile
    configuration about to run (the box rows are its block sizes)."""

    def hook(nargs):
        for names, rows_key in DESCRIPTORS[kernel]:
            for name in names:
                desc = nargs[name]
                if isinstance(desc, TensorDescriptor):
                    desc.block_shape = [1, 1, nargs[rows_key], desc.block_shape[3]]

    return hook


# What an autotuner's choice depends on (of the arguments each kernel has): fp32 with and
# without tf32 (PRECISION) run on different units.
_TUNE_KEY = ("HEAD_DIM", "M", "N", "CAUSAL", "TMA", "PIECE", "GRADS", "PRECISION")

# The arguments a launch passes as None, by the constexprs that say it does not read them
# (kernels.py's docstring): Triton compiles a None argument as a constant, and the
# launcher packs nothing for it on each call.
_ABSENT = (
    (lambda c: not c.get("TMA", False), ("KD0", "KD1", "VD0", "VD1", "QD0", "QD1", "DOD0", "DOD1")),
    (lambda c: c["BIAS"] == NO_BIAS, ("Bias", "stride_bb", "stride_bh", "stride_bm", "stride_bn", "LseShift")),
    (lambda c: c["BIAS"] != KEY_BIAS, ("Lens", "Plain", "stride_lb", "stride_lh")),
    (lambda c: not c.get("STORE_LO", True), ("OutLo",)),
    (lambda c: not c.get("BIAS_GRAD", True), ("DBias", "stride_dbb", "stride_dbh", "stride_dbm")),
)


def absent_arguments(fn, constexprs: dict) -> dict:
    """{name: None} for each argument of kernel fn (a flash kernel, or the int8 one)
    that a launch with these constexprs does not read; the static report compiles the
    same."""
    names = set(fn.arg_names)
    absent = {}
    for unread, group in _ABSENT:
        if unread(constexprs):
            absent.update((n, None) for n in group if n in names)
    return absent


# Under the interpreter, the GPU record (a folder of bench/results) the launcher takes the
# device for, for its default tiles (tile_records.py); None: none (tests set it).
INTERPRET_GPU: Optional[str] = None


@functools.lru_cache(maxsize=None)
def _cuda_record(index: int) -> str:
    return devices.record_folder(torch.cuda.get_device_name(index))


def _record_of(device: torch.device) -> Optional[str]:
    """The GPU record folder of a device's name (INTERPRET_GPU on the CPU)."""
    if device.type != "cuda":
        return INTERPRET_GPU
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
    """The rule of tile_records.py (generated from the GPU records) that makes another
    shipped candidate this call's default on its GPU, or None: a GPU, list or length
    without one keeps the shipped order, and so does every call with
    ATTNKIT_TILE_RECORDS=0 (in every plan_key, read when a plan is built: bench/gpu_tiles.py
    times the shipped defaults with it, so that a record measures them against the
    autotuner's choices)."""
    if lengths is None or os.environ.get("ATTNKIT_TILE_RECORDS", "1") in ("0", ""):
        return None
    folder = _record_of(device)
    if folder is None:
        return None
    key = (
        folder,
        arch_of(device),
        kernel,
        _width(dtype),
        _band(_padded(head_dim)),
        variant,
        causal,
        "tma" if tma else "ptr",
    )
    dtype_name = str(dtype).replace("torch.", "")
    for rule in TILE_RULES:
        if rule[:8] == key and rule.dtype == dtype_name and lengths[0] >= rule.min_q and lengths[1] >= rule.min_kv:
            return rule
    return None


def _default_tile(
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


def _kernel_for(
    kernel: str,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    variant: str,
    causal: bool,
    tma: bool,
    lengths: Optional[tuple] = None,
):
    """(callable kernel, fixed config or None): the autotuner, or the plain kernel with
    its default tile (the GPU's recorded one where tile_records.py has a rule for the
    call's list and lengths (M, N), else the list's first)."""
    arch = arch_of(device)
    if INTERPRET:
        if INTERPRET_SHIPPED_TILES:
            cands = configs_for(kernel, head_dim, dtype, arch, variant, causal, tma)
            return KERNELS[kernel], _default_tile(cands, kernel, head_dim, dtype, device, variant, causal, tma, lengths)
        return KERNELS[kernel], INTERPRET_CONFIG
    cands = configs_for(kernel, head_dim, dtype, arch, variant, causal, tma)
    if not _autotune_enabled() or len(cands) == 1:
        return KERNELS[kernel], _default_tile(cands, kernel, head_dim, dtype, device, variant, causal, tma, lengths)
    # The candidates too: within a band, some hold only for part of its head dims (a tile's
    # dims), and a tuner made for one head dim must not time another's list.
    key = (arch, kernel, _width(dtype), _band(_padded(head_dim)), variant, causal, tma, cands)
    tuner = _TUNERS.get(key)
    if tuner is None:
        with _TUNERS_LOCK:  # one tuner per key, whichever thread comes first: its choices are kept
            tuner = _TUNERS.get(key)
            if tuner is None:
                tuner = _TUNERS[key] = _make_tuner(kernel, cands)
    return tuner, None


def _make_tuner(kernel: str, cands: tuple[TileConfig, ...], **autotune_options):
    """A triton.autotune wrapper of one kernel over these candidates."""
    hook = _set_boxes(kernel)
    tuner = triton.autotune(
        configs=[
            triton.Config(
                {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "RELOAD": c.reload},
                num_warps=c.num_warps,
                num_stages=c.num_stages,
                maxnreg=c.maxnreg,
                pre_hook=hook,
            )
            for c in cands
        ],
        # Triton refuses a key that is not an argument: the forward has no PIECE or
        # GRADS, the dQ kernel no GRADS.
        key=[k for k in _TUNE_KEY if k in KERNELS[kernel].arg_names],
        **autotune_options,
    )(KERNELS[kernel])
    # The config the tuner chose per length bucket (_Launch.bucket, kept by _run), and the
    # lock that keeps a first call's choice from being read as another's.
    tuner.attnkit_chosen = {}
    tuner.attnkit_lock = threading.Lock()
    return tuner


# Fused multiply-add contraction (s * scale + bias in one rounding), stated rather than
# left to TRITON_DEFAULT_FP_FUSION, whose default Triton plans to change. The inspector
# compiles with the same options. Not passed to the interpreter, which has no such option.
_COMPILE_OPTIONS = {} if INTERPRET else {"enable_fp_fusion": True}


class _Launch:
    """One kernel launch of a launch plan, settled once per call signature: the kernel
    (an autotuner or the plain kernel), its tile once known, its grid, and every
    argument that is not one of the call's tensors (strides, lengths, scales,
    constexprs). After its first launch it holds the compiled kernel that Triton chose
    and built, and launches it directly (_run): no autotuner wrapper, no argument
    binding or specialisation per call."""

    __slots__ = (
        "kernel",
        "jit",
        "fn",
        "meta",
        "options",
        "static",
        "grid_rows",
        "axis",
        "b",
        "h",
        "grid",
        "compiled",
        "template",
        "slots",
        "boxes",
        "device",
        "cuda",
        "bucket",
    )

    def __init__(
        self,
        kernel: str,
        jit,
        fn,
        tile: Optional[TileConfig],
        static: dict,
        grid_rows: int,
        axis: str,
        b: int,
        h: int,
        options: Optional[dict] = None,
        cuda: bool = False,
        bucket: Optional[tuple] = None,
    ):
        # bucket: what an autotuner's choice is kept under (see _TUNERS).
        self.kernel, self.jit, self.fn, self.static, self.cuda = kernel, jit, fn, static, cuda
        # (head dim, rounded lengths, causal, TMA, piece, gradients, precision, dtypes): the
        # tuner's own key with the lengths rounded (bench/gpu_tiles.py logs the choices by it).
        self.bucket = (
            None
            if bucket is None
            else (static.get("HEAD_DIM"), *bucket[:2], *(static.get(k) for k in _TUNE_KEY[3:]), *bucket[2:])
        )
        self.grid_rows, self.axis, self.b, self.h = grid_rows, axis, b, h
        self.compiled = self.template = self.slots = self.device = None
        self.boxes = DESCRIPTORS.get(kernel, ())
        if tile is None and options is None:  # an autotuner: the tile is known after its first launch
            self.meta = self.grid = None
            self.options = dict(_COMPILE_OPTIONS)
        elif tile is None:  # a kernel without tiles (the delta pass): its block sizes are in static
            self._settle({}, dict(options))
        else:
            regs = {} if INTERPRET or tile.maxnreg is None else {"maxnreg": tile.maxnreg}
            self._settle(
                dict(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, RELOAD=tile.reload),
                dict(num_warps=tile.num_warps, num_stages=tile.num_stages, **_COMPILE_OPTIONS, **regs),
            )

    def _settle(self, meta: dict, options: dict) -> None:
        # meta last: another thread reads a launch as settled once meta is set
        rows = meta[self.axis] if self.axis in meta else self.static[self.axis]
        self.grid = (triton.cdiv(self.grid_rows, rows), self.h, self.b)
        self.options = options
        self.meta = meta

    def rows(self, name: str) -> int:
        """The box rows of a descriptor argument, once the tile is known (else 16: the
        autotuner's pre-launch hook sets them for each candidate)."""
        for names, rows_key in self.boxes:
            if name in names and self.meta is not None:
                return self.meta[rows_key]
        return 16

    def arguments(self, tensors: dict) -> dict:
        """Every named argument of a launch with these tensors (the tile's block sizes
        included once known). An argument the launch passes as None (absent_arguments)
        stays None whatever tensors say."""
        return {**tensors, **self.static, **(self.meta or {})}

    def _settle_config(self, config) -> None:
        """Settle on a triton.Config (an autotuner's choice, or its default)."""
        self._settle(
            config.kwargs,
            dict(
                self.options,
                num_warps=config.num_warps,
                num_stages=config.num_stages,
                **({} if config.maxnreg is None else {"maxnreg": config.maxnreg}),
            ),
        )

    def _keep(self, compiled, device: Optional[int]) -> None:
        """Keep Triton's compiled kernel for direct launches where its launcher takes the
        kernel's arguments in their declared order (Triton 3.3 onwards: the compiled
        kernel's source names them); otherwise every launch goes through Triton."""
        names = getattr(getattr(getattr(compiled, "src", None), "fn", None), "arg_names", None)
        if (
            not hasattr(triton, "knobs")
            or names is None
            or list(names) != list(self.jit.arg_names)
            or not hasattr(compiled, "run")
        ):
            return
        params = inspect.signature(self.jit.fn).parameters
        merged = {**self.static, **self.meta}
        template, slots = [], []
        for pos, name in enumerate(names):
            if name in merged:
                template.append(merged[name])
            elif name in _TENSOR_ARGS:
                template.append(None)
                slots.append((pos, name))
            elif params[name].default is not params[name].empty:
                template.append(params[name].default)
            else:
                return  # an argument this launch does not know: leave it to Triton
        self.template, self.slots, self.device = template, tuple(slots), device
        self.compiled = compiled


# The arguments that are tensors of the call (filled in per launch); every other
# argument of a kernel is settled in its launch plan.
_TENSOR_ARGS = frozenset(
    (
        "Q",
        "K",
        "V",
        "Bias",
        "Lens",
        "Plain",
        "Out",
        "Lse",
        "LseShift",
        "OutLo",
        "DO",
        "Delta",
        "DK",
        "DV",
        "DQ",
        "DBias",
        "KD0",
        "KD1",
        "VD0",
        "VD1",
        "QD0",
        "QD1",
        "DOD0",
        "DOD1",
        "Q8",
        "K8",
        "QS",
        "KS",
    )
)  # the int8 kernel's (attnkit/kernels/int8)


def _launch_compiled(compiled, grid: tuple, stream: int, values: list) -> None:
    """A compiled kernel's own launch: what Triton's launch does once it has found the
    kernel for its arguments (CompiledKernel.__getitem__'s runner)."""
    compiled.run(
        grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, None, None, None, *values
    )


def _launch_triton(fn, grid, kwargs: dict):
    """A launch through Triton (its autotuner, or the kernel's own binding and cache):
    returns the compiled kernel that ran (None under the interpreter)."""
    return fn[grid](**kwargs)


def _no_launch_hooks() -> bool:
    """Whether no launch hook is set in Triton's knobs (a profiler sets them; Triton 3.9
    keeps empty hook chains where older versions keep None)."""
    runtime = triton.knobs.runtime
    return all(
        h is None or getattr(h, "calls", None) == [] for h in (runtime.launch_enter_hook, runtime.launch_exit_hook)
    )


def _run(launch: _Launch, tensors: dict) -> None:
    """Launch one kernel of a plan with the call's tensors (by argument name).

    A settled launch runs its compiled kernel directly. The first launch goes through
    Triton (the autotuner where there is one: it benchmarks its candidates once per
    length bucket, whose later signatures run its choice, and never during a CUDA-graph
    capture, where the list's first tile runs instead), which compiles and returns the
    kernel kept for the next. A launch hook set in Triton's
    knobs (a profiler) sends every launch through Triton, which calls it."""
    current = triton.runtime.driver.active.get_current_device() if launch.cuda else None
    # A compiled kernel is loaded on the device that was current when it was compiled:
    # under another one, the launch goes through Triton, as it would have.
    if launch.compiled is not None and current == launch.device and _no_launch_hooks():
        # (Descriptors come with the tile's box rows: _Streams.add.)
        values = launch.template.copy()
        for pos, name in launch.slots:
            values[pos] = tensors[name]
        stream = 0 if current is None else triton.runtime.driver.active.get_current_stream(current)
        _launch_compiled(launch.compiled, launch.grid, stream, values)
        return
    kwargs = {**tensors, **launch.static}  # an argument passed as None stays None
    if launch.meta is None:
        fn = launch.fn
        chosen = None if launch.bucket is None else fn.attnkit_chosen.get(launch.bucket)
        if chosen is None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            chosen = fn.configs[0]  # no benchmarking inside a capture: the default tile
        if chosen is None:

            def grid(meta):
                return (triton.cdiv(launch.grid_rows, meta[launch.axis]), launch.h, launch.b)

            with fn.attnkit_lock:  # best_config is the tuner's one field for every caller
                # Another thread may have tuned this bucket meanwhile: its choice holds.
                chosen = None if launch.bucket is None else fn.attnkit_chosen.get(launch.bucket)
                if chosen is None:
                    compiled = _launch_triton(fn, grid, {**kwargs, **launch.options})
                    best = fn.best_config
                    if launch.bucket is not None:
                        fn.attnkit_chosen[launch.bucket] = best
            if chosen is None:
                launch._settle_config(best)
                launch._keep(compiled, current)
                return
        launch._settle_config(chosen)  # a bucket's choice (or the default tile in a capture)
    if launch.boxes:
        _set_boxes(launch.kernel)({**kwargs, **launch.meta})
    compiled = _launch_triton(launch.jit, launch.grid, {**kwargs, **launch.meta, **launch.options})
    if launch.compiled is None:
        launch._keep(compiled, current)


def _precision(dtype: torch.dtype, allow_tf32: bool) -> str:
    # Only fp32 operands look at it: "ieee" is true fp32, "tf32" the tensor-core format.
    return "tf32" if (allow_tf32 or dtype != torch.float32) else "ieee"


def _align(*strides: int) -> int:
    """The largest power of two <= 16 that divides every stride (0 divides by anything).

    Passed to the kernels as ALIGN: a true hint that lets the compiler vectorise loads
    (e.g. head dim 40 in a (B, N, H, D) layout has a head stride of 40: 8-aligned).
    """
    a = 16
    for st in strides:
        while st % a:
            a //= 2
    return a


def _tma_ok(*tensors: torch.Tensor) -> bool:
    """Whether a tensor descriptor can address each (B, H, L, D) tensor: 16-byte aligned
    base and positive strides (dims of size 1 excepted; a broadcast dim has stride 0),
    contiguous last dim, no empty dim."""
    for t in tensors:
        size, shape, strides = t.element_size(), t.shape, t.stride()
        if t.data_ptr() % 16 or strides[-1] != 1 or min(shape) == 0:
            return False
        if any((st * size) % 16 or st <= 0 for n, st in zip(shape[:-1], strides[:-1]) if n > 1):
            return False
    return True


def _tma_copy(t: torch.Tensor) -> torch.Tensor:
    """t's values in a fresh (B, H, L, D) buffer a tensor descriptor can address: rows
    padded to a multiple of 16 bytes with zeros (the view returned has t's shape)."""
    per_16 = 16 // t.element_size()
    padded = -(-t.shape[-1] // per_16) * per_16
    buf = torch.zeros((*t.shape[:-1], padded), dtype=t.dtype, device=t.device)
    view = buf[..., : t.shape[-1]]
    view.copy_(t)
    return view


def _ready_for_tma(
    arch: str, dtype: torch.dtype, tensors: tuple, kernels: tuple, head_dim: int, variant: str, causal: bool
) -> tuple:
    """On sm_90, 16-bit tensors not aligned for TMA run through pointer loads, unless a
    kernel has no spill-free pointer tile for the call (a full bias at some head dims):
    then the misaligned tensors are copied into aligned buffers first (_tma_copy)."""
    if arch != "sm90" or dtype == torch.float32 or _tma_ok(*tensors):
        return tensors
    if all(configs_for(kernel, head_dim, dtype, arch, variant, causal, False) for kernel in kernels):
        return tensors
    return tuple(t if _tma_ok(t) else _tma_copy(t) for t in tensors)


def _use_tma(
    arch: str, dtype: torch.dtype, tensors: tuple, kernels: tuple, head_dim: int, variant: str, causal: bool
) -> bool:
    """TMA loads of the streamed tiles: on Hopper, for 16-bit inputs (fp32 dots run on
    FMA units, which TMA does not feed faster), where every tensor is aligned for it and
    every kernel of the call has a TMA tile (a few full-bias lists have pointer tiles only)."""
    if arch != "sm90" or dtype == torch.float32 or not _tma_ok(*tensors):
        return False
    return all(configs_for(kernel, head_dim, dtype, arch, variant, causal, True) for kernel in kernels)


def _bias_layout(attn_bias: Optional[torch.Tensor], shape4) -> tuple:
    """(compact, strides (b, h, m, n), strides of the lengths (b, h), constexprs, variant)
    of a broadcastable bias, as bias_form() decides it (see _bias_args).

    compact: the bias must be made contiguous in its own shape first (a tile's rows or
    columns would span 2**31 elements through its strides, see _addressable). A 16-bit
    full bias here is one ops._prepare kept to be read as it is ("full16"); one that
    cannot be is refused, never read at the wrong alignment."""
    dtype = torch.float32 if attn_bias is None else attn_bias.dtype
    form = bias_form(attn_bias, shape4, q_dtype=dtype, needs_grad=False, max_tile_rows=_MAX_TILE_ROWS)
    if form.variant == NONE:
        return False, (0, 0, 0, 0), (0, 0), dict(BIAS=NO_BIAS, BIAS_ALIGN=1, BIAS_CONTIG=False), "none"
    sb = form.strides
    constexprs = dict(BIAS_ALIGN=_align(*sb[:3]), BIAS_CONTIG=sb[3] == 1)
    if form.variant == FULL16:
        # Read at the alignment the static report compiles it at.
        return form.compact, sb, (0, 0), dict(constexprs, BIAS=FULL_BIAS, BIAS_ALIGN=BIAS_16BIT_ALIGN), FULL16
    if form.variant != KEYPAD:
        if form.to_float32:  # ops._prepare converts every such bias first
            raise ValueError(
                f"a {attn_bias.dtype} bias of shape {tuple(attn_bias.shape)} and strides "
                f"{attn_bias.stride()} cannot be read as it is: convert it to float32 first"
            )
        return form.compact, sb, (0, 0), dict(constexprs, BIAS=FULL_BIAS), "full"
    own = attn_bias.shape[-4:-2] if attn_bias.dim() >= 3 else ()
    b_own, h_own = (1,) * (2 - len(own)) + tuple(own)
    lens_strides = ((h_own if b_own > 1 else 0), (1 if h_own > 1 else 0))
    return form.compact, sb, lens_strides, dict(constexprs, BIAS=KEY_BIAS), "keypad"


def _lengths_launch(attn_bias: torch.Tensor, n: int) -> tuple:
    """The launch that measures a key bias's lengths (lengths.py), for this bias layout
    (one program per (batch, head) of the bias's own shape), and the stand-in its
    outputs are allocated like."""
    own = attn_bias.reshape((1,) * (4 - attn_bias.dim()) + tuple(attn_bias.shape))
    b, h = own.shape[0], own.shape[1]
    sb, sh, _, sn = own.stride()
    static = dict(
        stride_b=sb,
        stride_h=sh,
        stride_n=sn,
        H_OWN=h,
        N=n,
        BLOCK_N=min(_next_pow2(max(n, 16)), 16 if INTERPRET else 1024),
    )
    launch = _Launch(
        "lengths",
        _key_lengths_kernel,
        _key_lengths_kernel,
        None,
        static,
        1,
        "BLOCK_N",
        b,
        h,
        options={},
        cuda=attn_bias.device.type == "cuda",
    )
    return launch, _proto((b, h), attn_bias.device, torch.int32)


def _key_lengths(attn_bias: torch.Tensor, n: int, lengths: Optional[tuple] = None) -> tuple:
    """(lengths, plain) of a key bias, int32 (B|1, H|1), contiguous: per (batch, head),
    one past its last key that is not -inf, and 1 where the bias is 0 on every key
    before that length. Measured on the device in one launch, with no synchronisation."""
    launch, proto = lengths or _lengths_launch(attn_bias, n)
    lens = torch.empty_like(proto, memory_format=torch.contiguous_format)
    plain = torch.empty_like(proto, memory_format=torch.contiguous_format)
    _run(launch, dict(Bias=attn_bias, Lens=lens, Plain=plain))
    return lens, plain


def _bias_args(attn_bias: Optional[torch.Tensor], q: torch.Tensor, shape4) -> tuple:
    """(pointer, strides (b, h, m, n), lengths, plain, their strides (b, h), constexprs,
    variant) for a broadcastable bias.

    expand() is a view: broadcast dims get stride 0 and nothing is copied. A bias that
    does not depend on the query (KEY_BIAS, "keypad") also gets, per (batch, head), its
    length: one past its last key that is not -inf. Keys from there on are masked in
    every row, and the kernels skip their tiles instead of computing them. plain is 1
    where the bias is 0 on every key before that length (a key-padding mask): the
    kernels then run their loops of no bias over the length, and never load it.
    The launch plans take the layout once per call signature (_bias_layout) and the
    lengths per call (_key_lengths).
    """
    compact, sb, sl, constexprs, variant = _bias_layout(attn_bias, shape4)
    if attn_bias is None:
        return q, sb, q, q, sl, constexprs, variant
    bias = attn_bias.contiguous() if compact else attn_bias
    if variant != "keypad":
        return bias, sb, q, q, sl, constexprs, variant
    lens, plain = _key_lengths(attn_bias, shape4[3])
    return bias, sb, lens, plain, sl, constexprs, variant


def _causal_args(causal: bool, offset: int, M: int, N: int) -> tuple[bool, int]:
    """(CAUSAL, OFF) for the kernels. Offsets beyond [-M, N - 1] mean the same as their
    bound (every row blind, or every key visible), so they are clamped into 32 bits;
    an offset that hides nothing is no mask at all."""
    if not causal:
        return False, 0
    offset = max(-M, min(int(offset), N - 1))
    if offset >= N - 1:
        return False, 0
    return True, offset


def _bucket(m: int, n: int, q: torch.Tensor, attn_bias: Optional[torch.Tensor]) -> tuple:
    """What an autotuner's choice for a launch is kept under (its attnkit_chosen): the lengths
    rounded up to powers of two and the dtypes (the kernel, head dim, causality, TMA
    and pieces come with the launch's static arguments)."""
    return _next_pow2(m), _next_pow2(n), str(q.dtype), None if attn_bias is None else str(attn_bias.dtype)


# Tests set this to fill every buffer the kernels write with NaN before they run, so an
# element a kernel forgets to write cannot pass for a result.
POISON_OUTPUTS = False


def _new_like(t: torch.Tensor, **kw) -> torch.Tensor:
    out = torch.empty_like(t, **kw)
    return out.fill_(float("nan")) if POISON_OUTPUTS else out


def _proto(shape, device, dtype=torch.float32) -> torch.Tensor:
    """A 4-byte stand-in of a contiguous buffer a plan allocates on every call: empty_like
    of it costs about two thirds of torch.empty with a shape, a dtype and a device."""
    return torch.empty(1, dtype=dtype, device=device).expand(shape)


def _new_from(proto: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(proto, memory_format=torch.contiguous_format)
    return out.fill_(float("nan")) if POISON_OUTPUTS and out.is_floating_point() else out


# Offsets inside a tile (row index times row stride) are 32-bit, everything above them
# 64-bit. The most rows a tile of any shipped configuration has (the delta pass uses 64):
_MAX_TILE_ROWS = (
    max(INTERPRET_CONFIG.block_m, INTERPRET_CONFIG.block_n, 16)
    if INTERPRET
    else max(
        max(c.block_m, c.block_n, 64)
        for arch in CONFIGS.values()
        for kern in arch.values()
        for width in kern.values()
        for cands in width.values()
        for c in cands
    )
)


def _addressable(x: torch.Tensor) -> bool:
    """Whether the kernels can read or write x in place: last dim contiguous, and a
    tile's rows span fewer than 2**31 elements. The second holds for every layout a
    diffusion model makes (row stride D or H * D); a view with a row stride of 2**24 or
    more is copied to a compact layout rather than indexed wrongly."""
    strides = x.stride()
    return strides[-1] == 1 and strides[-2] * (_MAX_TILE_ROWS - 1) < 2**31


def _kernel_layout(x: torch.Tensor) -> torch.Tensor:
    return x if _addressable(x) else x.contiguous()


def _strides3(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride()[:3]


# Launch plans, one per call signature (plan_key: every tensor's shape, strides, dtype,
# device and 16-byte alignment, the call's other arguments, and switches()): everything of
# a call but its tensors, built on its first call. Stale only if something a plan is
# built from is left out of plan_key. A model calls a few signatures over and over; a
# stream of new ones (lengths that change every call) starts the table afresh past
# _PLAN_LIMIT, the bound of every table keyed by plan_key or call_key.
_PLANS: dict[tuple, object] = {}
_PLAN_LIMIT = 4096


def switches() -> tuple:
    """What a launch is built from besides its call: the module switches (the
    interpreter's, set by tests) and the two environment variables read when a plan is
    built (ATTNKIT_TRITON_AUTOTUNE, ATTNKIT_TILE_RECORDS). In every plan_key: a change of
    one is a new plan, never one built under the old value."""
    env = os.environ
    return (
        INTERPRET,
        INTERPRET_ARCH,
        INTERPRET_SHIPPED_TILES,
        INTERPRET_GPU,
        POISON_OUTPUTS,
        env.get("ATTNKIT_TRITON_AUTOTUNE", "1"),
        env.get("ATTNKIT_TILE_RECORDS", "1"),
    )


def _tensor_key(t: Optional[torch.Tensor]):
    if t is None:
        return None
    return t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15


def call_key(kind: str, tensors: tuple, *arguments) -> tuple:
    """The one way attnkit's kernels key what they keep per call: ``kind``, then each
    tensor's shape, strides, dtype, device and 16-byte alignment (None for an absent
    one), and the call's other ``arguments`` (hashable). The checks of a call's inputs
    and of its shared memory are kept by it (they read no switch but those they pass as
    arguments); a launch plan by plan_key()."""
    return (kind, tuple(map(_tensor_key, tensors)), arguments)


def plan_key(kind: str, tensors: tuple, *arguments) -> tuple:
    """The key of a launch plan: call_key() and switches(). A new input a launch depends
    on is a tensor or an argument here, or a switch; nothing else is read."""
    return (*call_key(kind, tensors, *arguments), switches())


def clear_plans() -> None:
    """Forget every launch plan (tests that switch the module's settings call it)."""
    _PLANS.clear()


def _plan(key: tuple, build):
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _PLAN_LIMIT:
            _PLANS.clear()
        plan = _PLANS[key] = build()
    return plan


_FWD_STRIDES = (
    "stride_qb",
    "stride_qh",
    "stride_qm",
    "stride_kb",
    "stride_kh",
    "stride_kn",
    "stride_vb",
    "stride_vh",
    "stride_vn",
    "stride_bb",
    "stride_bh",
    "stride_bm",
    "stride_bn",
    "stride_lb",
    "stride_lh",
    "stride_ob",
    "stride_oh",
    "stride_om",
)


class _Streams:
    """The descriptor arguments of one launch: tensor descriptors of the streamed
    tensors with TMA (their shapes and strides settled once), else none (the launch
    passes None for them: absent_arguments).

    TensorDescriptor checks its base's alignment, strides and box when made (about 5 us
    a descriptor on a CPU); a plan's key holds each input's alignment and layout, so
    what the first check passed holds for every call of the plan, and later
    descriptors are copies of the first over another base."""

    __slots__ = ("names", "tma", "layouts", "cols", "checked")

    def __init__(self, names: tuple, tensors: tuple, tma: bool, d0: int, d1: int):
        self.names, self.tma, self.cols = tuple(zip(names[::2], names[1::2])), tma, (d0, d1)
        self.layouts = tuple(_descriptor_layout(t) for t in tensors) if tma else None
        self.checked = {}

    def add(self, tensors: dict, launch: _Launch, *streamed: torch.Tensor) -> None:
        if not self.tma:  # the launch passes None for them (absent_arguments)
            return
        checked = self.checked.get(launch.meta is None)
        if checked is None or launch.meta is None:
            d0, d1 = self.cols
            checked = []
            for (n0, n1), t, (shape, strides) in zip(self.names, streamed, self.layouts):
                rows = launch.rows(n0)
                desc0 = TensorDescriptor(t, shape, strides, [1, 1, rows, d0])
                checked.append((desc0, TensorDescriptor(t, shape, strides, [1, 1, rows, d1]) if d1 else desc0))
            for (n0, n1), (desc0, desc1) in zip(self.names, checked):
                tensors[n0], tensors[n1] = desc0, desc1
            # Kept without their bases, which must not outlive the call.
            self.checked[launch.meta is None] = [(_rebased(d0, None), _rebased(d1, None)) for d0, d1 in checked]
            return
        for (n0, n1), t, (desc0, desc1) in zip(self.names, streamed, checked):
            tensors[n0] = new0 = _rebased(desc0, t)
            tensors[n1] = new0 if desc1 is desc0 else _rebased(desc1, t)


def _rebased(checked: TensorDescriptor, t: torch.Tensor) -> TensorDescriptor:
    """A copy of a checked descriptor over base t (same layout, alignment and box)."""
    if not hasattr(checked, "__dict__"):
        return checked if t is None else TensorDescriptor(t, checked.shape, checked.strides, checked.block_shape)
    desc = object.__new__(TensorDescriptor)
    desc.__dict__ = {**checked.__dict__, "base": t}
    return desc


def _descriptor_layout(t: torch.Tensor) -> tuple[list, list]:
    """The shape and strides a tensor descriptor over t is made with (_descriptors)."""
    strides = [st if n > 1 else 16 // t.element_size() * max(1, n) for n, st in zip(t.shape, t.stride())]
    strides[-1] = 1
    return list(t.shape), strides


def _forward_impl(
    q,
    k,
    v,
    attn_bias,
    scale: float,
    allow_tf32: bool,
    store_lo: bool = False,
    causal: bool = False,
    causal_offset: int = 0,
    placeholders: bool = True,
):
    """Launch the forward. Returns (out like q, lse, lse_shift, out_lo): lse (B, H, M) is
    the base-2 log of each row's sum relative to lse_shift, (B, H, M) in natural units
    with a bias and empty without one (see _attn_fwd; None instead of empty if not
    placeholders): the natural LSE is lse_shift + lse * ln(2). out_lo, only if store_lo
    and the dtype is 16-bit (else None), is what rounding out lost, with out's strides."""
    key = plan_key("fwd", (q, k, v, attn_bias), scale, allow_tf32, store_lo, causal, causal_offset)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _plan(key, lambda: _ForwardPlan(q, k, v, attn_bias, scale, allow_tf32, store_lo, causal, causal_offset))
    return plan(q, k, v, attn_bias, placeholders)


def _with_bias(tensors: dict, attn_bias: Optional[torch.Tensor], shift, plan) -> dict:
    """tensors and the bias's own (none without a bias: absent_arguments): the bias
    (made compact where the plan says so), the row shift and a key bias's lengths."""
    if attn_bias is not None:
        tensors["Bias"] = attn_bias.contiguous() if plan.bias_compact else attn_bias
        tensors["LseShift"] = shift
        if plan.lengths is not None:
            tensors["Lens"], tensors["Plain"] = _key_lengths(attn_bias, plan.n, plan.lengths)
    return tensors


class _ForwardPlan:
    """Everything of a forward call but its tensors (see _PLANS)."""

    def __init__(self, q, k, v, attn_bias, scale, allow_tf32, store_lo, causal, causal_offset):
        B, H, M, D = q.shape
        N = k.shape[2]
        self.n = N
        self.store_lo = store_lo = store_lo and q.dtype != torch.float32
        self.lse = _proto((B, H, M), q.device)
        self.shift = _proto((B, H, M) if attn_bias is not None else (0,), q.device)
        self.empty = M == 0 or B == 0 or H == 0
        if self.empty:
            return
        # The kernels take the row max on unscaled scores, which needs scale >= 0:
        # softmax(q k^T * scale) == softmax((-q) k^T * -scale).
        self.negate = scale < 0
        scale = abs(scale)
        out = _new_like(q)  # keeps q's layout, so a (B, M, H, D) view stays one
        q = -q if self.negate else q
        self.copies = tuple(not _addressable(t) for t in (q, k, v))
        q, k, v = (t.contiguous() if c else t for t, c in zip((q, k, v), self.copies))
        self.o_in_place = _addressable(out)
        o = out if self.o_in_place else torch.empty(out.shape, device="meta")
        compact, sb, sl, bias_constexprs, variant = _bias_layout(attn_bias, (B, H, M, N))
        self.bias_compact = compact
        self.lengths = _lengths_launch(attn_bias, N) if variant == "keypad" else None
        causal, off = _causal_args(causal, causal_offset, M, N)
        kernel = "fwd_lo" if store_lo else "fwd"
        arch = arch_of(q.device)
        ready = _ready_for_tma(arch, q.dtype, (k, v), (kernel,), D, variant, causal)
        self.tma_copies = tuple(r is not t for r, t in zip(ready, (k, v)))
        k, v = ready
        d0, d1 = _pieces(D)
        align = _align(*(st for t in (q, k, v, o) for st in _strides3(t)))
        tma = _use_tma(arch, q.dtype, (k, v), (kernel,), D, variant, causal)
        static = dict(zip(_FWD_STRIDES, (*_strides3(q), *_strides3(k), *_strides3(v), *sb, *sl, *_strides3(o))))
        static.update(
            H=H,
            M=M,
            N=N,
            OFF=off,
            qk_scale=float(scale) * LOG2E,
            sm_scale=float(scale),
            HEAD_DIM=D,
            D0=d0,
            D1=d1,
            ALIGN=align,
            **bias_constexprs,
            CAUSAL=causal,
            TMA=tma,
            PRECISION=_precision(q.dtype, allow_tf32),
            EMULATE_BF16=INTERPRET and q.dtype == torch.bfloat16,
            STORE_LO=store_lo,
        )
        static.update(absent_arguments(KERNELS[kernel], static))
        fn, tile = _kernel_for(kernel, D, q.dtype, q.device, variant, causal, tma, (M, N))
        self.launch = _Launch(
            kernel,
            KERNELS[kernel],
            fn,
            tile,
            static,
            M,
            "BLOCK_M",
            B,
            H,
            cuda=q.device.type == "cuda",
            bucket=_bucket(M, N, q, attn_bias),
        )
        self.streams = _Streams(DESCRIPTORS["fwd"][0][0], (k, v), tma, d0, d1)

    def __call__(self, q, k, v, attn_bias, placeholders=True):
        out = _new_like(q)
        out_lo = _new_like(out) if self.store_lo else None
        lse = _new_from(self.lse)
        shift = _new_from(self.shift) if placeholders or attn_bias is not None else None
        if self.empty:
            return out, lse, shift, out_lo
        if self.negate:
            q = -q
        copy_q, copy_k, copy_v = self.copies
        if copy_q:
            q = q.contiguous()
        if copy_k:
            k = k.contiguous()
        if copy_v:
            v = v.contiguous()
        if self.o_in_place:
            o, lo = out, out_lo
        else:
            o = _new_like(out, memory_format=torch.contiguous_format)
            lo = None if out_lo is None else _new_like(o)
        tma_k, tma_v = self.tma_copies
        if tma_k:
            k = _tma_copy(k)
        if tma_v:
            v = _tma_copy(v)
        # Only what the launch reads (absent_arguments: the rest are None).
        tensors = _with_bias(dict(Q=q, K=k, V=v, Out=o, Lse=lse, OutLo=lo), attn_bias, shift, self)
        self.streams.add(tensors, self.launch, k, v)
        _run(self.launch, tensors)
        if o is not out:
            out.copy_(o)
            if lo is not None:
                out_lo.copy_(lo)
        return out, lse, shift, out_lo


def _backward_impl(
    do,
    q,
    k,
    v,
    attn_bias,
    out,
    lse,
    shift,
    scale: float,
    allow_tf32: bool,
    dlse=None,
    bias_grad: bool = False,
    out_lo=None,
    causal: bool = False,
    causal_offset: int = 0,
):
    """Launch the three backward kernels. Returns (dq, dk, dv, dbias): dq, dk, dv like
    their inputs; dbias shaped and typed like attn_bias if bias_grad, else None.

    lse, shift: the forward's row statistics (see _forward_impl). dlse: the gradient of
    the natural LSE times ln(2) (the gradient of the base-2 part lse), or None. Since
    d LSE / d s = p, it folds into delta: dS = P * (dP - (delta - dlse * log2(e))).
    out_lo: the forward's rounding residual of out (same shape and strides), or None.

    The bias gradient is dS, summed over the dims the bias broadcasts over. A bias that
    does not depend on the query (key padding, (B|1, H|1, 1, N)) is summed over the
    queries inside the dK/dV pass, into a (B, H, N) buffer; any other bias needs the
    whole dS, (B, H, M, N) in fp32, as every framework's attention does. A bias that
    does not depend on the key (size 1 or no dim at N) only shifts whole softmax rows:
    the output does not depend on it, and the LSE by exactly that shift, so its
    gradient is dlse (or zero) without computing dS.
    """
    bias_grad = bias_grad and attn_bias is not None
    if bias_grad and (attn_bias.dim() == 0 or attn_bias.shape[-1] == 1):
        dq, dk, dv, _ = _backward_impl(
            do,
            q,
            k,
            v,
            attn_bias,
            out,
            lse,
            shift,
            scale,
            allow_tf32,
            dlse,
            out_lo=out_lo,
            causal=causal,
            causal_offset=causal_offset,
        )
        if dlse is None:
            return dq, dk, dv, torch.zeros_like(attn_bias, memory_format=torch.contiguous_format)
        # d LSE / d bias = 1 for a bias added to a whole row; dlse is that gradient times ln(2).
        row = (dlse.to(torch.float32) * LOG2E).unsqueeze(-1)  # (B, H, M, 1)
        return dq, dk, dv, row.sum_to_size(attn_bias.shape).to(attn_bias.dtype).contiguous()
    key = plan_key(
        "bwd",
        (do, q, k, v, out, lse, shift, out_lo, attn_bias, dlse),
        bias_grad,
        scale,
        allow_tf32,
        causal,
        causal_offset,
    )
    plan = _PLANS.get(key)
    if plan is None:
        plan = _plan(
            key,
            lambda: _BackwardPlan(
                do, q, k, v, attn_bias, out, out_lo, scale, allow_tf32, bias_grad, causal, causal_offset
            ),
        )
    return plan(do, q, k, v, attn_bias, out, lse, shift, dlse, out_lo)


_BWD_STRIDES = (
    "stride_qb",
    "stride_qh",
    "stride_qm",
    "stride_kb",
    "stride_kh",
    "stride_kn",
    "stride_vb",
    "stride_vh",
    "stride_vn",
    "stride_bb",
    "stride_bh",
    "stride_bm",
    "stride_bn",
    "stride_lb",
    "stride_lh",
    "stride_dob",
    "stride_doh",
    "stride_dom",
)


class _BackwardPlan:
    """Everything of a backward call but its tensors (see _PLANS)."""

    def __init__(self, do, q, k, v, attn_bias, out, out_lo, scale, allow_tf32, bias_grad, causal, causal_offset):
        B, H, M, D = q.shape
        N = k.shape[2]
        self.n, self.bias_grad = N, bias_grad
        causal, off = _causal_args(causal, causal_offset, M, N)
        # Which kernel writes the bias gradient: dQ the whole dS (B, H, M, N), or dK/dV dS
        # summed over the queries (B, H, N).
        self.per_query = per_query = bias_grad and attn_bias.dim() >= 2 and attn_bias.shape[-2] != 1
        per_key = bias_grad and not per_query
        self.dbias = _proto((B, H, M, N) if per_query else (B, H, N), q.device)
        self.delta_proto = _proto((B, H, M), q.device)
        self.zero_dbias = per_query and causal  # the dQ kernel writes no dS for tiles above the diagonal
        self.empty = B == 0 or H == 0 or M == 0
        if self.empty:
            return
        self.negate = scale < 0
        scale = abs(scale)
        grads = [_new_like(t) for t in (q, k, v)]  # the layouts of the gradients a call returns
        q = -q if self.negate else q  # as in _forward_impl; dQ changes sign back below
        self.copies = tuple(not _addressable(t) for t in (q, k, v, out, do))
        q, k, v, out, do = (t.contiguous() if c else t for t, c in zip((q, k, v, out, do), self.copies))
        self.lo_copy = out_lo is not None and out_lo.stride() != out.stride()
        if self.lo_copy:
            out, out_lo = out.contiguous(), out_lo.contiguous()
        self.grads_in_place = tuple(_addressable(t) for t in grads)
        dq_, dk_, dv_ = (t if ok else torch.empty(t.shape, device="meta") for t, ok in zip(grads, self.grads_in_place))
        self.cast_do = do.dtype != q.dtype
        if self.cast_do:
            do = do.to(q.dtype)
        block = 16 if INTERPRET else 64
        delta_static = dict(
            stride_ob=out.stride(0),
            stride_oh=out.stride(1),
            stride_om=out.stride(2),
            stride_db=do.stride(0),
            stride_dh=do.stride(1),
            stride_dm=do.stride(2),
            H=H,
            M=M,
            HEAD_DIM=D,
            BLOCK_M=block,
            BLOCK_D=max(16, _next_pow2(D)),
            ALIGN=_align(*out.stride()[:3], *do.stride()[:3]),
            HAS_LO=out_lo is not None,
        )
        if out_lo is None:
            delta_static["OutLo"] = None  # not read (HAS_LO)
        cuda = q.device.type == "cuda"
        self.delta = _Launch(
            "delta", _attn_bwd_delta, _attn_bwd_delta, None, delta_static, M, "BLOCK_M", B, H, options={}, cuda=cuda
        )

        compact, sb, sl, bias_constexprs, variant = _bias_layout(attn_bias, (B, H, M, N))
        self.bias_compact = compact
        self.lengths = _lengths_launch(attn_bias, N) if variant == "keypad" else None
        arch = arch_of(q.device)
        # The kernels this call launches (above head dim 256 the pieces after the first, and
        # the dV launches, run without the bias gradient).
        split = D > limits.MAX_PIECE
        dkdv_kernels = (("dkdv_dbias",) + (("dkdv",) if split else ())) if per_key else ("dkdv",)
        dq_kernels = (("dq_dbias",) + (("dq",) if split else ())) if per_query else ("dq",)
        ready = _ready_for_tma(arch, q.dtype, (q, k, v, do), dkdv_kernels + dq_kernels, D, variant, causal)
        self.tma_copies = tuple(r is not t for r, t in zip(ready, (q, k, v, do)))
        q, k, v, do = ready
        d0, d1 = _pieces(D)
        bucket = _bucket(M, N, q, attn_bias)
        align = _align(*(st for t in (q, k, v, do, dq_, dk_, dv_) for st in _strides3(t)))
        common = dict(zip(_BWD_STRIDES, (*_strides3(q), *_strides3(k), *_strides3(v), *sb, *sl, *_strides3(do))))
        common.update(
            H=H,
            M=M,
            N=N,
            OFF=off,
            qk_scale=float(scale) * LOG2E,
            sm_scale=float(scale),
            HEAD_DIM=D,
            D0=d0,
            D1=d1,
            ALIGN=align,
            **bias_constexprs,
            CAUSAL=causal,
            PRECISION=_precision(q.dtype, allow_tf32),
            EMULATE_BF16=INTERPRET and q.dtype == torch.bfloat16,
        )
        dbias = torch.empty(self.dbias.shape, device="meta")

        tma = _use_tma(arch, q.dtype, (q, do, k, v), dkdv_kernels, D, variant, causal)
        self.dkdv_streams = (
            _Streams(DESCRIPTORS["dkdv"][0][0], (q, do), tma, d0, d1),
            _Streams(DESCRIPTORS["dkdv"][1][0], (k, v), tma, d0, d1),
        )
        static = dict(
            common, stride_dbb=dbias.stride(0) if per_key else 0, stride_dbh=dbias.stride(1) if per_key else 0
        )
        static.update(
            zip(
                ("stride_dkb", "stride_dkh", "stride_dkn", "stride_dvb", "stride_dvh", "stride_dvn"),
                (*_strides3(dk_), *_strides3(dv_)),
            )
        )
        # Above a head dim of 256 each gradient is computed one head-dim piece per launch
        # (the scores again for each): the accumulators and operand tiles of both pieces do
        # not fit in registers at once; dK/dV also one gradient per launch. The bias
        # gradient comes with the first dK launch.
        pieces = (0, 1) if split else (-1,)
        self.dkdv = []
        for piece, which in [(p, g) for p in pieces for g in (("dk", "dv") if p >= 0 else ("dkdv",))]:
            grad = per_key and piece <= 0 and which != "dv"
            kernel = "dkdv_dbias" if grad else "dkdv"
            fn, tile = _kernel_for(kernel, D, q.dtype, q.device, variant, causal, tma, (M, N))
            launch_static = dict(static, BIAS_GRAD=grad, TMA=tma, PIECE=piece, GRADS=which)
            launch_static.update(absent_arguments(KERNELS[kernel], launch_static))
            self.dkdv.append(
                _Launch(kernel, KERNELS[kernel], fn, tile, launch_static, N, "BLOCK_N", B, H, cuda=cuda, bucket=bucket)
            )
        # dQ streams the K and V that dK/dV held: through descriptors of the same layout.
        tma = _use_tma(arch, q.dtype, (k, v), dq_kernels, D, variant, causal)
        self.dq_streams = _Streams(DESCRIPTORS["dq"][0][0], (k, v), tma, d0, d1)
        static = dict(common)
        static.update(zip(("stride_dqb", "stride_dqh", "stride_dqm"), _strides3(dq_)))
        static.update(zip(("stride_dbb", "stride_dbh", "stride_dbm"), _strides3(dbias) if per_query else (0, 0, 0)))
        self.dq = []
        for piece in pieces:
            grad = per_query and piece <= 0
            kernel = "dq_dbias" if grad else "dq"
            fn, tile = _kernel_for(kernel, D, q.dtype, q.device, variant, causal, tma, (M, N))
            launch_static = dict(static, BIAS_GRAD=grad, TMA=tma, PIECE=piece)
            launch_static.update(absent_arguments(KERNELS[kernel], launch_static))
            self.dq.append(
                _Launch(kernel, KERNELS[kernel], fn, tile, launch_static, M, "BLOCK_M", B, H, cuda=cuda, bucket=bucket)
            )

    def __call__(self, do, q, k, v, attn_bias, out, lse, shift, dlse, out_lo):
        dq, dk, dv = _new_like(q), _new_like(k), _new_like(v)
        bias_grad = self.bias_grad
        if bias_grad:
            dbias_t = _new_from(self.dbias)
            if self.zero_dbias:
                dbias_t.zero_()
        if self.empty:
            for t in (dq, dk, dv) + ((dbias_t,) if bias_grad else ()):
                t.zero_()
            return dq, dk, dv, _reduce_bias_grad(dbias_t, attn_bias) if bias_grad else None
        if self.negate:
            q = -q
        cq, ck, cv, co, cdo = self.copies
        if cq:
            q = q.contiguous()
        if ck:
            k = k.contiguous()
        if cv:
            v = v.contiguous()
        if co:
            out = out.contiguous()
        if cdo:
            do = do.contiguous()
        if self.lo_copy:
            out, out_lo = out.contiguous(), out_lo.contiguous()
        in_q, in_k, in_v = self.grads_in_place
        dq_ = dq if in_q else _new_like(dq, memory_format=torch.contiguous_format)
        dk_ = dk if in_k else _new_like(dk, memory_format=torch.contiguous_format)
        dv_ = dv if in_v else _new_like(dv, memory_format=torch.contiguous_format)
        if self.cast_do:
            do = do.to(q.dtype)
        delta = _new_from(self.delta_proto)
        _run(self.delta, dict(Out=out, OutLo=out_lo, DO=do, Delta=delta))
        if dlse is not None:
            delta -= dlse.to(torch.float32) * LOG2E
        tq, tk, tv, tdo = self.tma_copies
        if tq:
            q = _tma_copy(q)
        if tk:
            k = _tma_copy(k)
        if tv:
            v = _tma_copy(v)
        if tdo:
            do = _tma_copy(do)
        # Only what a launch may read: absent_arguments makes the rest None (the bias
        # gradient of a launch that does not write it too).
        common = _with_bias(dict(Q=q, K=k, V=v, DO=do, Lse=lse, Delta=delta), attn_bias, shift, self)
        if bias_grad:
            common["DBias"] = dbias_t
        qdo, kv = self.dkdv_streams
        for launch in self.dkdv:
            tensors = dict(common, DK=dk_, DV=dv_)
            qdo.add(tensors, launch, q, do)
            kv.add(tensors, launch, k, v)
            _run(launch, tensors)
        for launch in self.dq:
            tensors = dict(common, DQ=dq_)
            self.dq_streams.add(tensors, launch, k, v)
            _run(launch, tensors)
        for final, tmp in ((dq, dq_), (dk, dk_), (dv, dv_)):
            if final is not tmp:
                final.copy_(tmp)
        if self.negate:
            dq.neg_()
        return dq, dk, dv, _reduce_bias_grad(dbias_t, attn_bias) if bias_grad else None


def _reduce_bias_grad(ds: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
    """dS, (B, H, M, N) or summed over the queries (B, H, N), -> attn_bias's own shape and
    dtype: summed over the dims where the bias has size 1 or none (sum_to_size)."""
    if ds.dim() == 3:
        ds = ds.unsqueeze(2)
    return ds.sum_to_size(attn_bias.shape).to(attn_bias.dtype).contiguous()
