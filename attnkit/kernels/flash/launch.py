"""Host side of the flash-attention kernels: which tile of tiles.py serves a call, its
grid, its arguments (strides, TMA descriptors, a key bias's lengths), and the launches
of the forward and of the three backward kernels (_forward_impl, _backward_impl).
Nothing here checks a caller's input: ops.py does, before anything runs."""

from __future__ import annotations

import functools
import os
import threading
from typing import Optional

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import devices, limits
from ..limits import _next_pow2, padded_head_dim, split_head_dim
from .kernels import DESCRIPTORS, FULL_BIAS, KERNELS, KEY_BIAS, LOG2E, NO_BIAS, _attn_bwd_delta
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


def configs_for(kernel: str, head_dim: int, dtype: torch.dtype, arch: str = "sm90",
                variant: str = "none", causal: bool = False, tma: bool = False) -> tuple[TileConfig, ...]:
    """The autotuning candidates of one kernel ("fwd", "dkdv", "dq", ...) at this head
    dim for one bias variant ("none", "keypad", "full"), causality and kind of loads,
    the default first."""
    padded = _padded(head_dim)
    cands = CONFIGS[arch][kernel][_width(dtype)][_band(padded)]
    loads = "tma" if tma else "ptr"
    return tuple(c for c in cands if variant in c.variants and causal in c.causal and loads in c.loads
                 and (c.dims is None or c.dims[0] <= padded <= c.dims[1]))


def _autotune_enabled() -> bool:
    return os.environ.get("ATTNKIT_TRITON_AUTOTUNE", "1") not in ("0", "")


# One triton.autotune wrapper per (target, kernel, width, band, variant), built on first
# use: each has its own candidates and its own cache of best configs, keyed by head dim,
# causality and by the query / key lengths rounded up to powers of two (M_KEY, N_KEY).
_TUNERS: dict[tuple, object] = {}


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


# What an autotuner's choice depends on (of the arguments each kernel has).
_TUNE_KEY = ("HEAD_DIM", "M_KEY", "N_KEY", "CAUSAL", "TMA", "PIECE", "GRADS")


def _kernel_for(kernel: str, head_dim: int, dtype: torch.dtype, device: torch.device, variant: str,
                causal: bool, tma: bool):
    """(callable kernel, fixed config or None): the autotuner, or the plain kernel."""
    arch = arch_of(device)
    if INTERPRET:
        if INTERPRET_SHIPPED_TILES:
            return KERNELS[kernel], configs_for(kernel, head_dim, dtype, arch, variant, causal, tma)[0]
        return KERNELS[kernel], INTERPRET_CONFIG
    cands = configs_for(kernel, head_dim, dtype, arch, variant, causal, tma)
    if not _autotune_enabled() or len(cands) == 1:
        return KERNELS[kernel], cands[0]
    key = (arch, kernel, _width(dtype), _band(_padded(head_dim)), variant, causal, tma)
    tuner = _TUNERS.get(key)
    if tuner is None:
        tuner = _TUNERS[key] = _make_tuner(kernel, cands)
    return tuner, None


def _make_tuner(kernel: str, cands: tuple[TileConfig, ...], **autotune_options):
    """A triton.autotune wrapper of one kernel over these candidates."""
    hook = _set_boxes(kernel)
    tuner = triton.autotune(
        configs=[
            triton.Config({"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "RELOAD": c.reload},
                          num_warps=c.num_warps, num_stages=c.num_stages, maxnreg=c.maxnreg, pre_hook=hook)
            for c in cands
        ],
        # Triton refuses a key that is not an argument: the forward has no PIECE or
        # GRADS, the dQ kernel no GRADS.
        key=[k for k in _TUNE_KEY if k in KERNELS[kernel].arg_names],
        **autotune_options,
    )(KERNELS[kernel])
    # The config the tuner chose, per value of its key and input dtypes (_launch), and
    # the lock that keeps a first call's choice from being read as another's.
    tuner.attnkit_chosen = {}
    tuner.attnkit_lock = threading.Lock()
    return tuner


# Fused multiply-add contraction (s * scale + bias in one rounding), stated rather than
# left to TRITON_DEFAULT_FP_FUSION, whose default Triton plans to change. The inspector
# compiles with the same options. Not passed to the interpreter, which has no such option.
_COMPILE_OPTIONS = {} if INTERPRET else {"enable_fp_fusion": True}


def _launch(kernel: str, head_dim: int, dtype: torch.dtype, grid_rows: int, rows_axis_block: str,
            b: int, h: int, args: dict, constexprs: dict, variant: str) -> None:
    """Launch one kernel over (tiles of grid_rows, h, b); args by name."""
    fn, cfg = _kernel_for(kernel, head_dim, dtype, args["Q"].device, variant, constexprs["CAUSAL"],
                          constexprs["TMA"])
    if cfg is None:
        # Once the tuner has chosen for this key, launch its choice directly: what the
        # tuner's wrapper does on every call (a dict of ~60 arguments, its key with the
        # dtype of each tensor, the pre-hook) costs as much host time as the rest of
        # the launcher. Its key is HEAD_DIM, the length buckets, CAUSAL, TMA, PIECE and
        # GRADS with the arguments' dtypes; in one tuner (a target, kernel, width and
        # bias variant) those dtypes follow from Q's and the bias's.
        key = (*(args[k] if k in args else constexprs[k] for k in fn.keys), args["Q"].dtype, args["Bias"].dtype)
        chosen = fn.attnkit_chosen.get(key)
        if chosen is None:
            def grid(meta):
                return (triton.cdiv(grid_rows, meta[rows_axis_block]), h, b)

            with fn.attnkit_lock:  # best_config is the tuner's one field for every caller
                fn[grid](**args, **constexprs, **_COMPILE_OPTIONS)
                fn.attnkit_chosen[key] = fn.best_config
            return
        meta = chosen.all_kwargs()
        if chosen.pre_hook is not None:
            chosen.pre_hook({**args, **meta})
        fn.fn[(triton.cdiv(grid_rows, meta[rows_axis_block]), h, b)](**args, **constexprs, **meta,
                                                                      **_COMPILE_OPTIONS)
    else:
        meta = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, RELOAD=cfg.reload)
        _set_boxes(kernel)({**args, **meta})
        regs = {} if INTERPRET or cfg.maxnreg is None else {"maxnreg": cfg.maxnreg}
        fn[(triton.cdiv(grid_rows, meta[rows_axis_block]), h, b)](
            **args, **constexprs, **meta, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            **_COMPILE_OPTIONS, **regs)


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


def _descriptors(t: torch.Tensor, d0: int, d1: int, rows: int) -> tuple:
    """Tensor descriptors over the whole (B, H, L, D) tensor t with boxes (1, 1, rows, D0)
    and (1, 1, rows, D1) (the box rows are set again before each launch). Out-of-bounds
    rows and columns read as zeros."""
    strides = [st if n > 1 else 16 // t.element_size() * max(1, n)
               for n, st in zip(t.shape, t.stride())]
    strides[-1] = 1
    desc0 = TensorDescriptor(t, list(t.shape), strides, [1, 1, rows, d0])
    desc1 = TensorDescriptor(t, list(t.shape), strides, [1, 1, rows, d1]) if d1 else desc0
    return desc0, desc1


def _stream_args(names: tuple, tensors: tuple, use_tma: bool, d0: int, d1: int) -> dict:
    """The descriptor arguments of a kernel: descriptors with TMA, else placeholders
    (the tensors themselves, never read)."""
    out = {}
    for (n0, n1), t in zip(zip(names[::2], names[1::2]), tensors):
        out[n0], out[n1] = _descriptors(t, d0, d1, 16) if use_tma else (t, t)
    return out


def _tma_copy(t: torch.Tensor) -> torch.Tensor:
    """t's values in a fresh (B, H, L, D) buffer a tensor descriptor can address: rows
    padded to a multiple of 16 bytes with zeros (the view returned has t's shape)."""
    per_16 = 16 // t.element_size()
    padded = -(-t.shape[-1] // per_16) * per_16
    buf = torch.zeros((*t.shape[:-1], padded), dtype=t.dtype, device=t.device)
    view = buf[..., :t.shape[-1]]
    view.copy_(t)
    return view


def _ready_for_tma(arch: str, dtype: torch.dtype, tensors: tuple, kernels: tuple, head_dim: int, variant: str,
                   causal: bool) -> tuple:
    """On sm_90, 16-bit tensors not aligned for TMA run through pointer loads, unless a
    kernel has no spill-free pointer tile for the call (a full bias at some head dims):
    then the misaligned tensors are copied into aligned buffers first (_tma_copy)."""
    if arch != "sm90" or dtype == torch.float32 or _tma_ok(*tensors):
        return tensors
    if all(configs_for(kernel, head_dim, dtype, arch, variant, causal, False) for kernel in kernels):
        return tensors
    return tuple(t if _tma_ok(t) else _tma_copy(t) for t in tensors)


def _use_tma(arch: str, dtype: torch.dtype, tensors: tuple, kernels: tuple, head_dim: int, variant: str,
             causal: bool) -> bool:
    """TMA loads of the streamed tiles: on Hopper, for 16-bit inputs (fp32 dots run on
    FMA units, which TMA does not feed faster), where every tensor is aligned for it and
    every kernel of the call has a TMA tile (a few full-bias lists have pointer tiles only)."""
    if arch != "sm90" or dtype == torch.float32 or not _tma_ok(*tensors):
        return False
    return all(configs_for(kernel, head_dim, dtype, arch, variant, causal, True) for kernel in kernels)


def _bias_args(attn_bias: Optional[torch.Tensor], q: torch.Tensor, shape4) -> tuple:
    """(pointer, strides (b, h, m, n), lengths, plain, their strides (b, h), constexprs,
    variant) for a broadcastable bias.

    expand() is a view: broadcast dims get stride 0 and nothing is copied. A bias that
    does not depend on the query (KEY_BIAS, "keypad") also gets, per (batch, head), its
    length: one past its last key that is not -inf. Keys from there on are masked in
    every row, and the kernels skip their tiles instead of computing them. plain is 1
    where the bias is 0 on every key before that length (a key-padding mask): the
    kernels then run their loops of no bias over the length, and never load it.
    Measured on the device, with no synchronisation.
    """
    placeholder = dict(BIAS=NO_BIAS, BIAS_ALIGN=1, BIAS_CONTIG=False)
    if attn_bias is None:
        return q, (0, 0, 0, 0), q, q, (0, 0), placeholder, "none"
    bias = attn_bias.expand(shape4)
    if max(bias.stride()[2:]) * (_MAX_TILE_ROWS - 1) >= 2**31:
        # A tile's rows or columns would span 2**31 elements (see _addressable): compact
        # the bias in its own, unexpanded shape.
        bias = attn_bias.contiguous().expand(shape4)
    sb = tuple(bias.stride())
    constexprs = dict(BIAS_ALIGN=_align(*sb[:3]), BIAS_CONTIG=sb[3] == 1)
    if sb[2] != 0:
        return bias, sb, q, q, (0, 0), dict(constexprs, BIAS=FULL_BIAS), "full"
    own = attn_bias.reshape((1,) * (4 - attn_bias.dim()) + tuple(attn_bias.shape))[:, :, 0, :]
    n = shape4[3]
    keys = torch.arange(n, device=own.device, dtype=torch.int32)
    live = own != float("-inf")  # NaN counts as live: it must reach the output
    lens = ((keys + 1) * live).amax(-1)
    plain = ((own == 0) | (keys >= lens.unsqueeze(-1))).all(-1)
    lens, plain = (t.to(torch.int32).expand(own.shape[0], own.shape[1]).contiguous() for t in (lens, plain))
    sl = tuple(st if size > 1 else 0 for size, st in zip(lens.shape, lens.stride()))
    return bias, sb, lens, plain, sl, dict(constexprs, BIAS=KEY_BIAS), "keypad"


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


def _lengths_key(m: int, n: int) -> tuple[int, int]:
    return _next_pow2(m), _next_pow2(n)


# Tests set this to fill every buffer the kernels write with NaN before they run, so an
# element a kernel forgets to write cannot pass for a result.
POISON_OUTPUTS = False


def _new_like(t: torch.Tensor, **kw) -> torch.Tensor:
    out = torch.empty_like(t, **kw)
    return out.fill_(float("nan")) if POISON_OUTPUTS else out


def _new(shape, device) -> torch.Tensor:
    out = torch.empty(shape, device=device, dtype=torch.float32)
    return out.fill_(float("nan")) if POISON_OUTPUTS else out


# Offsets inside a tile (row index times row stride) are 32-bit, everything above them
# 64-bit. The most rows a tile of any shipped configuration has (the delta pass uses 64):
_MAX_TILE_ROWS = (max(INTERPRET_CONFIG.block_m, INTERPRET_CONFIG.block_n, 16) if INTERPRET else
                  max(max(c.block_m, c.block_n, 64) for arch in CONFIGS.values() for kern in arch.values()
                      for width in kern.values() for cands in width.values() for c in cands))


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


def _forward_impl(q, k, v, attn_bias, scale: float, allow_tf32: bool, store_lo: bool = False,
                  causal: bool = False, causal_offset: int = 0):
    """Launch the forward. Returns (out like q, lse, lse_shift, out_lo): lse (B, H, M) is
    the base-2 log of each row's sum relative to lse_shift, (B, H, M) in natural units
    with a bias and empty without one (see _attn_fwd): the natural LSE is
    lse_shift + lse * ln(2). out_lo, only if store_lo and the dtype is 16-bit (else
    None), is what rounding out lost, with out's strides."""
    B, H, M, D = q.shape
    N = k.shape[2]
    store_lo = store_lo and q.dtype != torch.float32
    out = _new_like(q)  # keeps q's layout, so a (B, M, H, D) view stays one
    out_lo = _new_like(out) if store_lo else None
    lse = _new((B, H, M), q.device)
    shift = _new((B, H, M) if attn_bias is not None else (0,), q.device)
    if M == 0 or B == 0 or H == 0:
        return out, lse, shift, out_lo
    if scale < 0:
        # The kernels take the row max on unscaled scores, which needs scale >= 0:
        # softmax(q k^T * scale) == softmax((-q) k^T * -scale).
        q, scale = -q, -scale
    q, k, v = (_kernel_layout(t) for t in (q, k, v))
    o = out if _addressable(out) else _new_like(out, memory_format=torch.contiguous_format)
    lo = out_lo if (out_lo is None or o is out) else _new_like(o)
    bias, sb, lens, plain, sl, bias_constexprs, variant = _bias_args(attn_bias, q, (B, H, M, N))
    causal, off = _causal_args(causal, causal_offset, M, N)
    kernel = "fwd_lo" if store_lo else "fwd"
    arch = arch_of(q.device)
    k, v = _ready_for_tma(arch, q.dtype, (k, v), (kernel,), D, variant, causal)
    d0, d1 = _pieces(D)
    m_key, n_key = _lengths_key(M, N)
    align = _align(*(st for t in (q, k, v, o) for st in _strides3(t)))
    assert lo is None or lo.stride() == o.stride()
    tma = _use_tma(arch, q.dtype, (k, v), (kernel,), D, variant, causal)
    args = dict(Q=q, K=k, V=v, **_stream_args(DESCRIPTORS["fwd"][0][0], (k, v), tma, d0, d1),
                Bias=bias, Lens=lens, Plain=plain, Out=o, Lse=lse, LseShift=shift if attn_bias is not None else lse,
                OutLo=o if lo is None else lo)
    strides = (*_strides3(q), *_strides3(k), *_strides3(v), *sb, *sl, *_strides3(o))
    names = ("stride_qb", "stride_qh", "stride_qm", "stride_kb", "stride_kh", "stride_kn",
             "stride_vb", "stride_vh", "stride_vn", "stride_bb", "stride_bh", "stride_bm", "stride_bn",
             "stride_lb", "stride_lh", "stride_ob", "stride_oh", "stride_om")
    args.update(zip(names, strides))
    args.update(H=H, M=M, N=N, OFF=off, qk_scale=float(scale) * LOG2E, sm_scale=float(scale), M_KEY=m_key,
                N_KEY=n_key)
    constexprs = dict(HEAD_DIM=D, D0=d0, D1=d1, ALIGN=align, **bias_constexprs, CAUSAL=causal, TMA=tma,
                      PRECISION=_precision(q.dtype, allow_tf32), EMULATE_BF16=INTERPRET and q.dtype == torch.bfloat16,
                      STORE_LO=store_lo)
    _launch(kernel, D, q.dtype, M, "BLOCK_M", B, H, args, constexprs, variant)
    if o is not out:
        out.copy_(o)
        if store_lo:
            out_lo.copy_(lo)
    return out, lse, shift, out_lo


def _backward_impl(do, q, k, v, attn_bias, out, lse, shift, scale: float, allow_tf32: bool, dlse=None,
                   bias_grad: bool = False, out_lo=None, causal: bool = False, causal_offset: int = 0):
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
    B, H, M, D = q.shape
    N = k.shape[2]
    dq, dk, dv = _new_like(q), _new_like(k), _new_like(v)
    bias_grad = bias_grad and attn_bias is not None
    if bias_grad and (attn_bias.dim() == 0 or attn_bias.shape[-1] == 1):
        dq, dk, dv, _ = _backward_impl(do, q, k, v, attn_bias, out, lse, shift, scale, allow_tf32, dlse,
                                       out_lo=out_lo, causal=causal, causal_offset=causal_offset)
        if dlse is None:
            return dq, dk, dv, torch.zeros_like(attn_bias, memory_format=torch.contiguous_format)
        # d LSE / d bias = 1 for a bias added to a whole row; dlse is that gradient times ln(2).
        row = (dlse.to(torch.float32) * LOG2E).unsqueeze(-1)  # (B, H, M, 1)
        return dq, dk, dv, row.sum_to_size(attn_bias.shape).to(attn_bias.dtype).contiguous()
    causal, off = _causal_args(causal, causal_offset, M, N)
    # Which kernel writes the bias gradient: dQ the whole dS (B, H, M, N), or dK/dV dS
    # summed over the queries (B, H, N).
    per_query = bias_grad and attn_bias.dim() >= 2 and attn_bias.shape[-2] != 1
    per_key = bias_grad and not per_query
    if bias_grad:
        dbias_t = _new((B, H, M, N) if per_query else (B, H, N), q.device)
        if per_query and causal:
            dbias_t.zero_()  # the dQ kernel writes no dS for tiles above the diagonal
    if B == 0 or H == 0 or M == 0:
        for t in (dq, dk, dv) + ((dbias_t,) if bias_grad else ()):
            t.zero_()
        return dq, dk, dv, _reduce_bias_grad(dbias_t, attn_bias) if bias_grad else None
    negate = scale < 0
    if negate:
        q, scale = -q, -scale  # as in _forward_impl; dQ changes sign back below
    q, k, v, out, do = (_kernel_layout(t) for t in (q, k, v, out, do))
    if out_lo is not None and out_lo.stride() != out.stride():
        out, out_lo = out.contiguous(), out_lo.contiguous()
    dq_, dk_, dv_ = (t if _addressable(t) else _new_like(t, memory_format=torch.contiguous_format)
                     for t in (dq, dk, dv))
    if do.dtype != q.dtype:
        do = do.to(q.dtype)

    delta = _new((B, H, M), q.device)
    block_d = max(16, _next_pow2(D))
    block = 16 if INTERPRET else 64
    _attn_bwd_delta[(triton.cdiv(M, block), H, B)](
        out, out if out_lo is None else out_lo, do, delta,
        out.stride(0), out.stride(1), out.stride(2),
        do.stride(0), do.stride(1), do.stride(2),
        H, M, HEAD_DIM=D, BLOCK_M=block, BLOCK_D=block_d,
        ALIGN=_align(*out.stride()[:3], *do.stride()[:3]), HAS_LO=out_lo is not None)
    if dlse is not None:
        delta -= dlse.to(torch.float32) * LOG2E

    bias, sb, lens, plain, sl, bias_constexprs, variant = _bias_args(attn_bias, q, (B, H, M, N))
    arch = arch_of(q.device)
    # The kernels this call launches (above head dim 256 the pieces after the first, and
    # the dV launches, run without the bias gradient).
    split = D > limits.MAX_PIECE
    dkdv_kernels = (("dkdv_dbias",) + (("dkdv",) if split else ())) if per_key else ("dkdv",)
    dq_kernels = (("dq_dbias",) + (("dq",) if split else ())) if per_query else ("dq",)
    q, k, v, do = _ready_for_tma(arch, q.dtype, (q, k, v, do), dkdv_kernels + dq_kernels, D, variant, causal)
    d0, d1 = _pieces(D)
    m_key, n_key = _lengths_key(M, N)
    align = _align(*(st for t in (q, k, v, do, dq_, dk_, dv_) for st in _strides3(t)))
    constexprs = dict(HEAD_DIM=D, D0=d0, D1=d1, ALIGN=align, **bias_constexprs, CAUSAL=causal,
                      PRECISION=_precision(q.dtype, allow_tf32), EMULATE_BF16=INTERPRET and q.dtype == torch.bfloat16)
    # A kernel that does not write the bias gradient gets a placeholder pointer, and so
    # does a kernel without a bias shift.
    db = dbias_t if bias_grad else lse
    common = dict(Q=q, K=k, V=v, Bias=bias, Lens=lens, Plain=plain, DO=do, Lse=lse, LseShift=shift if shift.numel() else lse,
                  Delta=delta, H=H, M=M, N=N, OFF=off, qk_scale=float(scale) * LOG2E, sm_scale=float(scale),
                  M_KEY=m_key, N_KEY=n_key)
    names = ("stride_qb", "stride_qh", "stride_qm", "stride_kb", "stride_kh", "stride_kn",
             "stride_vb", "stride_vh", "stride_vn", "stride_bb", "stride_bh", "stride_bm", "stride_bn",
             "stride_lb", "stride_lh", "stride_dob", "stride_doh", "stride_dom")
    common.update(zip(names, (*_strides3(q), *_strides3(k), *_strides3(v), *sb, *sl, *_strides3(do))))

    tma = _use_tma(arch, q.dtype, (q, do, k, v), dkdv_kernels, D, variant, causal)
    kv = _stream_args(DESCRIPTORS["dkdv"][1][0], (k, v), tma, d0, d1)
    args = dict(common, **_stream_args(DESCRIPTORS["dkdv"][0][0], (q, do), tma, d0, d1), **kv, DK=dk_, DV=dv_,
                DBias=db, stride_dbb=db.stride(0) if per_key else 0, stride_dbh=db.stride(1) if per_key else 0)
    args.update(zip(("stride_dkb", "stride_dkh", "stride_dkn", "stride_dvb", "stride_dvh", "stride_dvn"),
                    (*_strides3(dk_), *_strides3(dv_))))
    # Above a head dim of 256 each gradient is computed one head-dim piece per launch
    # (the scores again for each): the accumulators and operand tiles of both pieces do
    # not fit in registers at once; dK/dV also one gradient per launch. The bias
    # gradient comes with the first dK launch.
    pieces = (0, 1) if D > limits.MAX_PIECE else (-1,)
    splits = [(p, g) for p in pieces for g in (("dk", "dv") if p >= 0 else ("dkdv",))]
    for piece, grads in splits:
        grad = per_key and piece <= 0 and grads != "dv"
        _launch("dkdv_dbias" if grad else "dkdv", D, q.dtype, N, "BLOCK_N", B, H, args,
                dict(constexprs, BIAS_GRAD=grad, TMA=tma, PIECE=piece, GRADS=grads), variant)

    # dQ streams the K and V that dK/dV held, through descriptors of the same names: the
    # same objects serve both when both use TMA (a launch encodes its tensor map from the
    # descriptor's base, shape and strides and the compiled kernel's box; the pre-launch
    # hook sets the box rows of the tile about to run, see _set_boxes).
    dkdv_tma, tma = tma, _use_tma(arch, q.dtype, (k, v), dq_kernels, D, variant, causal)
    if tma != dkdv_tma:
        kv = _stream_args(DESCRIPTORS["dq"][0][0], (k, v), tma, d0, d1)
    args = dict(common, **kv, DQ=dq_, DBias=db)
    args.update(zip(("stride_dqb", "stride_dqh", "stride_dqm"), _strides3(dq_)))
    args.update(zip(("stride_dbb", "stride_dbh", "stride_dbm"), _strides3(db) if per_query else (0, 0, 0)))
    for piece in pieces:
        grad = per_query and piece <= 0
        _launch("dq_dbias" if grad else "dq", D, q.dtype, M, "BLOCK_M", B, H, args,
                dict(constexprs, BIAS_GRAD=grad, TMA=tma, PIECE=piece), variant)
    for final, tmp in ((dq, dq_), (dk, dk_), (dv, dv_)):
        if final is not tmp:
            final.copy_(tmp)
    if negate:
        dq.neg_()
    return dq, dk, dv, _reduce_bias_grad(dbias_t, attn_bias) if bias_grad else None


def _reduce_bias_grad(ds: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
    """dS, (B, H, M, N) or summed over the queries (B, H, N), -> attn_bias's own shape and
    dtype: summed over the dims where the bias has size 1 or none (sum_to_size)."""
    if ds.dim() == 3:
        ds = ds.unsqueeze(2)
    return ds.sum_to_size(attn_bias.shape).to(attn_bias.dtype).contiguous()
