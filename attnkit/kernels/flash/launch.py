"""The flash kernels' launch plans: everything of a forward or backward call but its
tensors, settled on a signature's first call (ForwardPlan, BackwardPlan; forward() and
backward() find or build them), and what they are made of: a bias's layout and its key
lengths, TMA loads, tensor descriptors. Each plan describes itself (describe(): its
launches' kernels, tiles, variants, TMA and grids).

Which tile a launch runs is flash/select.py's; what a launch is passed besides its
tensors, flash/abi.py's; how it runs, launcher.py's. Nothing here checks a caller's
input: ops.py does, before anything runs."""

from __future__ import annotations

from typing import Optional

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import devices, launcher, limits
from ..bias_form import BIAS_16BIT_ALIGN, FULL16, KEYPAD, NONE, bias_form
from ..launcher import Launch, new_from, new_like, plan_key, proto, run, settings
from ..limits import _next_pow2
from .abi import BWD_STRIDES, FWD_STRIDES, absent_arguments, align, causal_args, precision
from .kernels import DESCRIPTORS, FULL_BIAS, KERNELS, KEY_BIAS, LOG2E, NO_BIAS, _attn_bwd_delta
from .lengths import _key_lengths_kernel
from .select import MAX_TILE_ROWS, arch_of, bucket, configs_for, kernel_for, pieces, tile_launch


def tma_ok(*tensors: torch.Tensor) -> bool:
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


def tma_copy(t: torch.Tensor) -> torch.Tensor:
    """t's values in a fresh (B, H, L, D) buffer a tensor descriptor can address: rows
    padded to a multiple of 16 bytes with zeros (the view returned has t's shape)."""
    per_16 = 16 // t.element_size()
    padded = -(-t.shape[-1] // per_16) * per_16
    buf = torch.zeros((*t.shape[:-1], padded), dtype=t.dtype, device=t.device)
    view = buf[..., : t.shape[-1]]
    view.copy_(t)
    return view


def ready_for_tma(
    arch: str, dtype: torch.dtype, tensors: tuple, kernels: tuple, head_dim: int, variant: str, causal: bool
) -> tuple:
    """On sm_90, 16-bit tensors not aligned for TMA run through pointer loads, unless a
    kernel has no spill-free pointer tile for the call (a full bias at some head dims):
    then the misaligned tensors are copied into aligned buffers first (tma_copy)."""
    if arch != "sm90" or dtype == torch.float32 or tma_ok(*tensors):
        return tensors
    if all(configs_for(kernel, head_dim, dtype, arch, variant, causal, False) for kernel in kernels):
        return tensors
    return tuple(t if tma_ok(t) else tma_copy(t) for t in tensors)


def use_tma(
    arch: str, dtype: torch.dtype, tensors: tuple, kernels: tuple, head_dim: int, variant: str, causal: bool
) -> bool:
    """TMA loads of the streamed tiles: on Hopper, for 16-bit inputs (fp32 dots run on
    FMA units, which TMA does not feed faster), where every tensor is aligned for it and
    every kernel of the call has a TMA tile (a few full-bias lists have pointer tiles only)."""
    if arch != "sm90" or dtype == torch.float32 or not tma_ok(*tensors):
        return False
    return all(configs_for(kernel, head_dim, dtype, arch, variant, causal, True) for kernel in kernels)


def bias_layout(attn_bias: Optional[torch.Tensor], shape4) -> tuple:
    """(compact, strides (b, h, m, n), strides of the lengths (b, h), constexprs, variant)
    of a broadcastable bias, as bias_form() decides it.

    compact: the bias must be made contiguous in its own shape first (a tile's rows or
    columns would span 2**31 elements through its strides, see addressable). A 16-bit
    full bias here is one ops.prepare kept to be read as it is ("full16"); one that
    cannot be is refused, never read at the wrong alignment."""
    dtype = torch.float32 if attn_bias is None else attn_bias.dtype
    form = bias_form(attn_bias, shape4, q_dtype=dtype, needs_grad=False, max_tile_rows=MAX_TILE_ROWS)
    if form.variant == NONE:
        return False, (0, 0, 0, 0), (0, 0), dict(BIAS=NO_BIAS, BIAS_ALIGN=1, BIAS_CONTIG=False), "none"
    sb = form.strides
    constexprs = dict(BIAS_ALIGN=align(*sb[:3]), BIAS_CONTIG=sb[3] == 1)
    if form.variant == FULL16:
        # Read at the alignment the static report compiles it at.
        return form.compact, sb, (0, 0), dict(constexprs, BIAS=FULL_BIAS, BIAS_ALIGN=BIAS_16BIT_ALIGN), FULL16
    if form.variant != KEYPAD:
        if form.to_float32:  # ops.prepare converts every such bias first
            raise ValueError(
                f"a {attn_bias.dtype} bias of shape {tuple(attn_bias.shape)} and strides "
                f"{attn_bias.stride()} cannot be read as it is: convert it to float32 first"
            )
        return form.compact, sb, (0, 0), dict(constexprs, BIAS=FULL_BIAS), "full"
    own = attn_bias.shape[-4:-2] if attn_bias.dim() >= 3 else ()
    b_own, h_own = (1,) * (2 - len(own)) + tuple(own)
    lens_strides = ((h_own if b_own > 1 else 0), (1 if h_own > 1 else 0))
    return form.compact, sb, lens_strides, dict(constexprs, BIAS=KEY_BIAS), "keypad"


def lengths_launch(attn_bias: torch.Tensor, n: int) -> tuple:
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
        BLOCK_N=min(_next_pow2(max(n, 16)), 16 if settings().interpret else 1024),
    )
    kernel = _key_lengths_kernel
    launch = Launch(
        "lengths", kernel, kernel, static, 1, "BLOCK_N", b, h, meta={}, options={}, cuda=attn_bias.device.type == "cuda"
    )
    return launch, proto((b, h), attn_bias.device, torch.int32)


def key_lengths(attn_bias: torch.Tensor, n: int, lengths: Optional[tuple] = None) -> tuple:
    """(lengths, plain) of a key bias, int32 (B|1, H|1), contiguous: per (batch, head),
    one past its last key that is not -inf, and 1 where the bias is 0 on every key
    before that length. Measured on the device in one launch, with no synchronisation."""
    launch, proto = lengths or lengths_launch(attn_bias, n)
    lens = torch.empty_like(proto, memory_format=torch.contiguous_format)
    plain = torch.empty_like(proto, memory_format=torch.contiguous_format)
    run(launch, dict(Bias=attn_bias, Lens=lens, Plain=plain))
    return lens, plain


def addressable(x: torch.Tensor) -> bool:
    """Whether the kernels can read or write x in place: last dim contiguous, and a
    tile's rows span fewer than 2**31 elements. The second holds for every layout a
    diffusion model makes (row stride D or H * D); a view with a row stride of 2**24 or
    more is copied to a compact layout rather than indexed wrongly."""
    strides = x.stride()
    return strides[-1] == 1 and strides[-2] * (MAX_TILE_ROWS - 1) < 2**31


def _strides3(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride()[:3]


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

    def add(self, tensors: dict, launch: Launch, *streamed: torch.Tensor) -> None:
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


def check_shared_memory(q: torch.Tensor, attn_bias: Optional[torch.Tensor], causal: bool, grads: bool) -> None:
    """ValueError, before anything runs, where this GPU has less shared memory per block
    than the call's default tiles need, the backward's included if it will run (grads;
    the forward op's store_lo): rather than a forward that runs and a backward that
    cannot launch (devices.NEEDS). Run once per launch plan (ForwardPlan): a plan is the
    proof that its call passed."""
    if q.device.type != "cuda":
        return
    problem = devices.shared_memory_problem(
        torch.cuda.get_device_capability(q.device),
        q.dtype,
        q.shape[3],
        (table_variant(q, attn_bias),),
        causal,
        grads,
    )
    if problem:
        raise ValueError(problem)


def table_variant(q: torch.Tensor, attn_bias: Optional[torch.Tensor]) -> str:
    """The bias's variant in the device table ("none", "keypad" or "full"; its query
    stride alone decides it, not its values, dtype or the number of keys)."""
    if attn_bias is None:
        return "none"
    own = attn_bias.reshape((1,) * (4 - attn_bias.dim()) + tuple(attn_bias.shape))
    form = bias_form(own, (*q.shape[:3], own.shape[3]), q_dtype=q.dtype, needs_grad=True, max_tile_rows=1)
    return form.table_variant


def forward(
    q,
    k,
    v,
    attn_bias,
    scale: float,
    allow_tf32: bool,
    store_lo: bool = False,
    causal_offset: Optional[int] = None,
    placeholders: bool = True,
):
    """Launch the forward. Returns (out like q, lse, lse_shift, out_lo): lse (B, H, M) is
    the base-2 log of each row's sum relative to lse_shift, (B, H, M) in natural units
    with a bias and empty without one (see _attn_fwd; None instead of empty if not
    placeholders): the natural LSE is lse_shift + lse * ln(2). out_lo, only if store_lo
    and the dtype is 16-bit (else None), is what rounding out lost, with out's strides.
    causal_offset: None where the call is not causal, else its offset (ops.check_causal)."""
    found = forward_plan(q, k, v, attn_bias, scale, allow_tf32, store_lo, causal_offset)
    return found(q, k, v, attn_bias, placeholders)


def forward_plan(q, k, v, attn_bias, scale, allow_tf32, store_lo=False, causal_offset=None):
    """The forward's launch plan of this call signature (built on its first call: the
    shared-memory check runs then), called as plan(q, k, v, attn_bias, placeholders)."""
    key = plan_key("fwd", (q, k, v, attn_bias), scale, allow_tf32, store_lo, causal_offset)
    found = launcher.cached_plan(key)
    if found is None:
        found = launcher.plan(key, lambda: ForwardPlan(q, k, v, attn_bias, scale, allow_tf32, store_lo, causal_offset))
    return found


def _with_bias(tensors: dict, attn_bias: Optional[torch.Tensor], shift, plan) -> dict:
    """tensors and the bias's own (none without a bias: absent_arguments): the bias
    (made compact where the plan says so), the row shift and a key bias's lengths."""
    if attn_bias is not None:
        tensors["Bias"] = attn_bias.contiguous() if plan.bias_compact else attn_bias
        tensors["LseShift"] = shift
        if plan.lengths is not None:
            tensors["Lens"], tensors["Plain"] = key_lengths(attn_bias, plan.n, plan.lengths)
    return tensors


class ForwardPlan:
    """Everything of a forward call but its tensors (see launcher.plan)."""

    def __init__(self, q, k, v, attn_bias, scale, allow_tf32, store_lo, causal_offset):
        check_shared_memory(q, attn_bias, causal_offset is not None, store_lo)
        self.s = settings()  # those of plan_key: the plan's calls allocate under them
        B, H, M, D = q.shape
        N = k.shape[2]
        self.n = N
        self.store_lo = store_lo = store_lo and q.dtype != torch.float32
        self.lse = proto((B, H, M), q.device)
        self.shift = proto((B, H, M) if attn_bias is not None else (0,), q.device)
        self.empty = M == 0 or B == 0 or H == 0
        if self.empty:
            return
        # The kernels take the row max on unscaled scores, which needs scale >= 0:
        # softmax(q k^T * scale) == softmax((-q) k^T * -scale).
        self.negate = scale < 0
        scale = abs(scale)
        out = new_like(q, self.s)  # keeps q's layout, so a (B, M, H, D) view stays one
        q = -q if self.negate else q
        self.copies = tuple(not addressable(t) for t in (q, k, v))
        q, k, v = (t.contiguous() if c else t for t, c in zip((q, k, v), self.copies))
        self.o_in_place = addressable(out)
        o = out if self.o_in_place else torch.empty(out.shape, device="meta")
        compact, sb, sl, bias_constexprs, variant = bias_layout(attn_bias, (B, H, M, N))
        self.bias_compact = compact
        self.lengths = lengths_launch(attn_bias, N) if variant == "keypad" else None
        causal, off = causal_args(causal_offset, M, N)
        kernel = "fwd_lo" if store_lo else "fwd"
        arch = arch_of(q.device)
        ready = ready_for_tma(arch, q.dtype, (k, v), (kernel,), D, variant, causal)
        self.tma_copies = tuple(r is not t for r, t in zip(ready, (k, v)))
        k, v = ready
        d0, d1 = pieces(D)
        alignment = align(*(st for t in (q, k, v, o) for st in _strides3(t)))
        tma = use_tma(arch, q.dtype, (k, v), (kernel,), D, variant, causal)
        static = dict(zip(FWD_STRIDES, (*_strides3(q), *_strides3(k), *_strides3(v), *sb, *sl, *_strides3(o))))
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
            ALIGN=alignment,
            **bias_constexprs,
            CAUSAL=causal,
            TMA=tma,
            PRECISION=precision(q.dtype, allow_tf32),
            EMULATE_BF16=settings().interpret and q.dtype == torch.bfloat16,
            STORE_LO=store_lo,
        )
        static.update(absent_arguments(KERNELS[kernel], static))
        fn, tile = kernel_for(kernel, D, q.dtype, q.device, variant, causal, tma, (M, N))
        self.variant = variant
        self.launch = tile_launch(
            kernel,
            fn,
            tile,
            static,
            M,
            "BLOCK_M",
            B,
            H,
            cuda=q.device.type == "cuda",
            lengths_bucket=bucket(M, N, q, attn_bias),
            variant=variant,
        )
        self.streams = _Streams(DESCRIPTORS["fwd"][0][0], (k, v), tma, d0, d1)

    def describe(self) -> list[dict]:
        """Its launch (Launch.describe); none for an empty call."""
        return [] if self.empty else [self.launch.describe()]

    def __call__(self, q, k, v, attn_bias, placeholders=True):
        out = new_like(q, self.s)
        out_lo = new_like(out, self.s) if self.store_lo else None
        lse = new_from(self.lse, self.s)
        shift = new_from(self.shift, self.s) if placeholders or attn_bias is not None else None
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
            o = new_like(out, self.s, memory_format=torch.contiguous_format)
            lo = None if out_lo is None else new_like(o, self.s)
        tma_k, tma_v = self.tma_copies
        if tma_k:
            k = tma_copy(k)
        if tma_v:
            v = tma_copy(v)
        # Only what the launch reads (absent_arguments: the rest are None).
        tensors = _with_bias(dict(Q=q, K=k, V=v, Out=o, Lse=lse, OutLo=lo), attn_bias, shift, self)
        self.streams.add(tensors, self.launch, k, v)
        run(self.launch, tensors)
        if o is not out:
            out.copy_(o)
            if lo is not None:
                out_lo.copy_(lo)
        return out, lse, shift, out_lo


def backward(
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
    causal_offset: Optional[int] = None,
):
    """Launch the three backward kernels. Returns (dq, dk, dv, dbias): dq, dk, dv like
    their inputs; dbias shaped and typed like attn_bias if bias_grad, else None.

    lse, shift: the forward's row statistics (see forward). dlse: the gradient of
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
        dq, dk, dv, _ = backward(
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
        causal_offset,
    )
    found = launcher.cached_plan(key)
    if found is None:
        found = launcher.plan(
            key,
            lambda: BackwardPlan(do, q, k, v, attn_bias, out, out_lo, scale, allow_tf32, bias_grad, causal_offset),
        )
    return found(do, q, k, v, attn_bias, out, lse, shift, dlse, out_lo)


class BackwardPlan:
    """Everything of a backward call but its tensors (see launcher.plan)."""

    def __init__(self, do, q, k, v, attn_bias, out, out_lo, scale, allow_tf32, bias_grad, causal_offset):
        self.s = settings()  # those of plan_key: the plan's calls allocate under them
        B, H, M, D = q.shape
        N = k.shape[2]
        self.n, self.bias_grad = N, bias_grad
        causal, off = causal_args(causal_offset, M, N)
        # Which kernel writes the bias gradient: dQ the whole dS (B, H, M, N), or dK/dV dS
        # summed over the queries (B, H, N).
        self.per_query = per_query = bias_grad and attn_bias.dim() >= 2 and attn_bias.shape[-2] != 1
        per_key = bias_grad and not per_query
        self.dbias = proto((B, H, M, N) if per_query else (B, H, N), q.device)
        self.delta_proto = proto((B, H, M), q.device)
        self.zero_dbias = per_query and causal  # the dQ kernel writes no dS for tiles above the diagonal
        self.empty = B == 0 or H == 0 or M == 0
        if self.empty:
            return
        self.negate = scale < 0
        scale = abs(scale)
        grads = [new_like(t, self.s) for t in (q, k, v)]  # the layouts of the gradients a call returns
        q = -q if self.negate else q  # as in forward; dQ changes sign back below
        self.copies = tuple(not addressable(t) for t in (q, k, v, out, do))
        q, k, v, out, do = (t.contiguous() if c else t for t, c in zip((q, k, v, out, do), self.copies))
        self.lo_copy = out_lo is not None and out_lo.stride() != out.stride()
        if self.lo_copy:
            out, out_lo = out.contiguous(), out_lo.contiguous()
        self.grads_in_place = tuple(addressable(t) for t in grads)
        dq_, dk_, dv_ = (t if ok else torch.empty(t.shape, device="meta") for t, ok in zip(grads, self.grads_in_place))
        self.cast_do = do.dtype != q.dtype
        if self.cast_do:
            do = do.to(q.dtype)
        block = 16 if settings().interpret else 64
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
            ALIGN=align(*out.stride()[:3], *do.stride()[:3]),
            HAS_LO=out_lo is not None,
        )
        if out_lo is None:
            delta_static["OutLo"] = None  # not read (HAS_LO)
        cuda = q.device.type == "cuda"
        delta = _attn_bwd_delta
        self.delta = Launch("delta", delta, delta, delta_static, M, "BLOCK_M", B, H, meta={}, options={}, cuda=cuda)

        compact, sb, sl, bias_constexprs, variant = bias_layout(attn_bias, (B, H, M, N))
        self.bias_compact, self.variant = compact, variant
        self.lengths = lengths_launch(attn_bias, N) if variant == "keypad" else None
        arch = arch_of(q.device)
        # The kernels this call launches (above head dim 256 the pieces after the first, and
        # the dV launches, run without the bias gradient).
        split = D > limits.MAX_PIECE
        dkdv_kernels = (("dkdv_dbias",) + (("dkdv",) if split else ())) if per_key else ("dkdv",)
        dq_kernels = (("dq_dbias",) + (("dq",) if split else ())) if per_query else ("dq",)
        ready = ready_for_tma(arch, q.dtype, (q, k, v, do), dkdv_kernels + dq_kernels, D, variant, causal)
        self.tma_copies = tuple(r is not t for r, t in zip(ready, (q, k, v, do)))
        q, k, v, do = ready
        d0, d1 = pieces(D)
        lengths_bucket = bucket(M, N, q, attn_bias)
        alignment = align(*(st for t in (q, k, v, do, dq_, dk_, dv_) for st in _strides3(t)))
        common = dict(zip(BWD_STRIDES, (*_strides3(q), *_strides3(k), *_strides3(v), *sb, *sl, *_strides3(do))))
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
            ALIGN=alignment,
            **bias_constexprs,
            CAUSAL=causal,
            PRECISION=precision(q.dtype, allow_tf32),
            EMULATE_BF16=settings().interpret and q.dtype == torch.bfloat16,
        )
        dbias = torch.empty(self.dbias.shape, device="meta")

        tma = use_tma(arch, q.dtype, (q, do, k, v), dkdv_kernels, D, variant, causal)
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
        parts = (0, 1) if split else (-1,)
        self.dkdv = []
        for piece, which in [(p, g) for p in parts for g in (("dk", "dv") if p >= 0 else ("dkdv",))]:
            grad = per_key and piece <= 0 and which != "dv"
            kernel = "dkdv_dbias" if grad else "dkdv"
            fn, tile = kernel_for(kernel, D, q.dtype, q.device, variant, causal, tma, (M, N))
            launch_static = dict(static, BIAS_GRAD=grad, TMA=tma, PIECE=piece, GRADS=which)
            launch_static.update(absent_arguments(KERNELS[kernel], launch_static))
            self.dkdv.append(
                tile_launch(
                    kernel,
                    fn,
                    tile,
                    launch_static,
                    N,
                    "BLOCK_N",
                    B,
                    H,
                    cuda=cuda,
                    lengths_bucket=lengths_bucket,
                    variant=variant,
                )
            )
        # dQ streams the K and V that dK/dV held: through descriptors of the same layout.
        tma = use_tma(arch, q.dtype, (k, v), dq_kernels, D, variant, causal)
        self.dq_streams = _Streams(DESCRIPTORS["dq"][0][0], (k, v), tma, d0, d1)
        static = dict(common)
        static.update(zip(("stride_dqb", "stride_dqh", "stride_dqm"), _strides3(dq_)))
        static.update(zip(("stride_dbb", "stride_dbh", "stride_dbm"), _strides3(dbias) if per_query else (0, 0, 0)))
        self.dq = []
        for piece in parts:
            grad = per_query and piece <= 0
            kernel = "dq_dbias" if grad else "dq"
            fn, tile = kernel_for(kernel, D, q.dtype, q.device, variant, causal, tma, (M, N))
            launch_static = dict(static, BIAS_GRAD=grad, TMA=tma, PIECE=piece)
            launch_static.update(absent_arguments(KERNELS[kernel], launch_static))
            self.dq.append(
                tile_launch(
                    kernel,
                    fn,
                    tile,
                    launch_static,
                    M,
                    "BLOCK_M",
                    B,
                    H,
                    cuda=cuda,
                    lengths_bucket=lengths_bucket,
                    variant=variant,
                )
            )

    def describe(self) -> list[dict]:
        """Its launches in order (the delta pass, dK/dV, dQ: Launch.describe); none for an
        empty call."""
        if self.empty:
            return []
        return [x.describe() for x in (self.delta, *self.dkdv, *self.dq)]

    def __call__(self, do, q, k, v, attn_bias, out, lse, shift, dlse, out_lo):
        dq, dk, dv = new_like(q, self.s), new_like(k, self.s), new_like(v, self.s)
        bias_grad = self.bias_grad
        if bias_grad:
            dbias_t = new_from(self.dbias, self.s)
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
        dq_ = dq if in_q else new_like(dq, self.s, memory_format=torch.contiguous_format)
        dk_ = dk if in_k else new_like(dk, self.s, memory_format=torch.contiguous_format)
        dv_ = dv if in_v else new_like(dv, self.s, memory_format=torch.contiguous_format)
        if self.cast_do:
            do = do.to(q.dtype)
        delta = new_from(self.delta_proto, self.s)
        run(self.delta, dict(Out=out, OutLo=out_lo, DO=do, Delta=delta))
        if dlse is not None:
            delta -= dlse.to(torch.float32) * LOG2E
        tq, tk, tv, tdo = self.tma_copies
        if tq:
            q = tma_copy(q)
        if tk:
            k = tma_copy(k)
        if tv:
            v = tma_copy(v)
        if tdo:
            do = tma_copy(do)
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
            run(launch, tensors)
        for launch in self.dq:
            tensors = dict(common, DQ=dq_)
            self.dq_streams.add(tensors, launch, k, v)
            run(launch, tensors)
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
