"""int8_attention: attention with the query-key products in INT8 (int8/kernels.py), for
inference. Lossy: docs/int8.md says what it costs in accuracy and when to use it.

    from attnkit.kernels.int8 import int8_attention
    out = int8_attention(q, k, v, attn_bias=None, scale=None, causal=False, causal_offset=0, k_block=128,
                         pv_accumulate="fp32")

The arguments are flash_attention's: q (B, H, M, D), k and v (B, H, N, D), 16-bit, head
dims 8-512, any strides with a contiguous last dim; attn_bias None, additive float or bool
(True = attend), broadcastable to (B, H, M, N), read as the exact kernel reads it (a key
bias as lengths, padded key tiles skipped); causal with an offset. A call that needs
gradients is refused (ValueError): the kernel has no backward, and a quantised
gradient would be a silent loss of a different kind. fp32 inputs are refused too: a
caller who chose fp32 asked for accuracy. ``k_block``: keys per K scale (int8/quant.py):
128, the default, lets the main loop dequantise with one multiply per score; 1 (a scale
per key) is the more accurate form, with an outer product per score (docs/int8.md
measures both). ``pv_accumulate``: "fp32", the default, or "fp16" (float16 inputs only):
each tile's P.V accumulated in float16 on the tensor cores before it joins the float32
accumulator, which GeForce GPUs (RTX 30xx / 40xx) run at twice the float32-accumulate
rate; docs/int8.md gives its error.
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import launcher
from ..flash import launch as fl
from ..flash import ops as fo
from ..flash import select
from ..flash.abi import COMPILE_OPTIONS, absent_arguments, align, causal_args
from ..launcher import Launch, new_like, plan_key, run, settings
from .kernels import _attn_fwd_int8
from .quant import K_BLOCK, qk_pieces
from .quant_kernel import quantize_qk_fused

# The tile of a call, by target, head dim and bias variant (no autotuning yet), chosen from
# the static report's int8 rows (python -m tools.static_report --kernel int8 --config ...):
# the fastest-looking tile that compiles without spilling for every variant and causality
# of its band. BLOCK_N divides quant.K_BLOCK (one K scale per tile). Without a bias or with
# key padding 128 x 128 on 8 warps (sm_80 above head dim 64: 128 x 64, as 128 x 128 spills
# there); a full bias holds a float32 tile of it beside the scores, so narrower tiles.
# Head dims above 128 hold more of V's and the output's columns per query row, so fewer
# rows; with key padding to 384 one stage (two spilled 8-16 B); with a full bias at 320-512
# on sm_90 and 384 on sm_80 even 16 x 32 spills 8-16 B (the report lists them: every
# smaller tile computed exponentials twice). Under the
# interpreter the exact kernel's small tile (select.INTERPRET_TILE), so that tests cross
# tiles, unless settings().shipped_tiles. Launched through attnkit's launcher (launcher.py:
# its plans, Launch and run), as the exact kernel.
# (target or None for both, largest head dim, bias variants, (block_m, block_n, warps, stages))
TILES = (
    ("sm90", 128, ("none", "keypad"), (128, 128, 8, 2)),
    ("sm90", 64, ("full",), (128, 64, 8, 2)),
    ("sm90", 128, ("full",), (128, 32, 8, 2)),
    ("sm80", 64, ("none", "keypad"), (128, 128, 8, 2)),
    ("sm80", 128, ("none", "keypad"), (128, 64, 8, 2)),
    ("sm80", 64, ("full",), (128, 64, 4, 2)),
    ("sm80", 128, ("full",), (128, 32, 8, 2)),
    (None, 192, ("none", "keypad", "full"), (128, 32, 8, 2)),
    (None, 256, ("none", "keypad", "full"), (32, 32, 4, 2)),
    (None, 384, ("keypad",), (16, 32, 4, 1)),
    (None, 512, ("none", "keypad", "full"), (16, 32, 4, 2)),
)
K_BLOCKS = (1, K_BLOCK)  # keys per K scale int8_attention takes: per key, or per block


def tile_for(target: str, head_dim: int, variant: str) -> tuple[int, int, int, int]:
    """(block_m, block_n, num_warps, num_stages) of the int8 forward on a target ("sm80",
    "sm90") for a head dim and a bias variant ("none", "keypad", "full")."""
    for t, top, variants, tile in TILES:
        if (t is None or t == target) and head_dim <= top and variant in variants:
            return tile
    raise ValueError(f"no int8 tile for {target}, head dim {head_dim}, bias {variant}")


def _check(q, k, v, attn_bias) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
            raise ValueError(
                f"{name}.dtype=torch.float32: the int8 attention takes float16 or bfloat16 inputs "
                "(an fp32 model asked for accuracy: use an exact backend)"
            )
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v, attn_bias)):
        raise ValueError(
            "int8 attention is forward only: a call that needs gradients (an input requires grad "
            "under autograd) is refused; run it under torch.no_grad() or use an exact backend"
        )


def int8_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    *,
    causal: bool = False,
    causal_offset: int = 0,
    k_block: int = K_BLOCK,
    pv_accumulate: str = "fp32",
) -> torch.Tensor:
    """softmax(q8 k8^T (dequantised) + attn_bias) v: see the module docstring."""
    causal_offset = fo.check_causal(causal, causal_offset)
    if k_block not in K_BLOCKS:
        raise ValueError(f"k_block={k_block!r}: keys per K scale, one of {', '.join(map(str, K_BLOCKS))}")
    if pv_accumulate not in ("fp32", "fp16"):
        raise ValueError(f"pv_accumulate={pv_accumulate!r}: 'fp32' (the default) or 'fp16'")
    pv16 = pv_accumulate == "fp16"
    if pv16 and isinstance(v, torch.Tensor) and v.dtype != torch.float16:
        raise ValueError(
            f"pv_accumulate='fp16' takes float16 inputs, not {v.dtype}: tensor cores accumulate a "
            "bfloat16 product in float32 only"
        )
    if not fo.eager_call(q, k, v, attn_bias):
        _check(q, k, v, attn_bias)
        attn_bias, scale = fo.prepare(q, k, v, attn_bias, scale)
        if attn_bias is not None and attn_bias.dtype != torch.float32:
            attn_bias = fo.float32_bias(attn_bias)
        if q.numel() == 0:
            return torch.empty_like(q)
        return _launch_plan(q, k, v, attn_bias, scale, causal_offset, k_block, pv16)(q, k, v, attn_bias, scale)
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, attn_bias))
    key = plan_key("int8 call", (q, k, v, attn_bias), scale, causal_offset, needs_grad, k_block, pv16)
    call = launcher.cached_plan(key)
    if call is None:
        call = launcher.plan(key, lambda: Int8Call(q, k, v, attn_bias, scale))
    bias = fo.float32_bias(attn_bias) if call.to_float32 else attn_bias  # the kernel reads float32 biases only
    if q.numel() == 0:
        return torch.empty_like(q)
    found = call.launch
    if found is None:
        found = call.launch = _launch_plan(q, k, v, bias, call.scale, causal_offset, k_block, pv16)
    return found(q, k, v, bias, call.scale)


class Int8Call:
    """What an eager int8 call decides before its launch plan, once per signature
    (launcher.plan_key of the call as given, whether it needs a gradient included): it
    passed the checks (a plan exists only for a call that did), its scale, whether its
    bias is converted to float32, and its launch plan (the converted bias's layout
    follows from the given one's): one key per call, as flash's CallPlan."""

    __slots__ = ("scale", "to_float32", "launch")

    def __init__(self, q, k, v, attn_bias, scale):
        _check(q, k, v, attn_bias)
        _, self.scale = fo.prepare(q, k, v, attn_bias, scale)
        self.to_float32 = attn_bias is not None and attn_bias.dtype != torch.float32
        self.launch = None


def _launch_plan(q, k, v, attn_bias, scale, causal_offset: Optional[int], k_block, pv16=False) -> "Int8Plan":
    key = plan_key("int8", (q, k, v, attn_bias), scale, causal_offset, k_block, pv16)
    found = launcher.cached_plan(key)
    if found is None:
        found = launcher.plan(key, lambda: Int8Plan(q, k, v, attn_bias, causal_offset, k_block, pv16))
    return found


class Int8Plan:
    """Everything of an int8 call but its tensors, settled on a signature's first call
    (as the exact kernel's launch plans: the same table, Launch and run, so later calls
    launch the compiled kernel directly)."""

    def __init__(self, q, k, v, attn_bias, causal_offset: Optional[int], k_block, pv16=False):
        self.s = s = settings()
        self.k_block = k_block  # those of plan_key: the plan's calls allocate under them
        B, H, M, D = q.shape
        N = k.shape[2]
        self.n = N
        out = new_like(q, self.s)
        self.copy_v = not fl.addressable(v)
        v = v.contiguous() if self.copy_v else v
        self.o_in_place = fl.addressable(out)
        o = out if self.o_in_place else torch.empty(out.shape, device="meta")
        compact, sb, sl, bias_constexprs, variant = fl.bias_layout(attn_bias, (B, H, M, N))
        self.bias_compact = compact
        self.lengths = fl.lengths_launch(attn_bias, N) if variant == "keypad" else None
        causal, off = causal_args(causal_offset, M, N)
        d0, d1 = select.pieces(D)
        self.dq0, self.dq1 = qk_pieces(D)
        alignment = align(*v.stride()[:3], *o.stride()[:3])
        if s.interpret and not s.shipped_tiles:
            tile = s.interpret_tile or select.INTERPRET_TILE
            bm, bn, warps, stages = tile.block_m, tile.block_n, 4, 1
        else:
            bm, bn, warps, stages = tile_for(select.arch_of(q.device), D, variant)
        self.tile = (bm, bn, warps, stages)
        static = dict(zip(_STRIDES, (*v.stride()[:3], *sb, *sl, *o.stride()[:3])))
        static.update(
            H=H,
            M=M,
            N=N,
            OFF=off,
            HEAD_DIM=D,
            D0=d0,
            D1=d1,
            DQ0=self.dq0,
            DQ1=self.dq1,
            KB=k_block,
            BLOCK_M=bm,
            BLOCK_N=bn,
            CAUSAL=causal,
            ALIGN=alignment,
            EMULATE_BF16=s.interpret and q.dtype == torch.bfloat16,
            PV16=pv16,
            **bias_constexprs,
        )
        static.update(absent_arguments(_attn_fwd_int8, static))
        # The tile in static (the kernel has no RELOAD, which a TileConfig's launch passes).
        options = {} if s.interpret else {"num_warps": warps, "num_stages": stages, **COMPILE_OPTIONS}
        self.variant = variant
        kernel = _attn_fwd_int8
        self.launch = Launch(
            "int8",
            kernel,
            kernel,
            static,
            M,
            "BLOCK_M",
            B,
            H,
            meta={},
            options=options,
            cuda=q.device.type == "cuda",
            variant=variant,
            tile_name=f"M{bm}-N{bn}-w{warps}-s{stages}",
        )

    def describe(self) -> list[dict]:
        """Its launch (Launch.describe)."""
        return [self.launch.describe()]

    def __call__(self, q, k, v, attn_bias, scale):
        out = new_like(q, self.s)
        # The scale folds into qs, of either sign: the scores are taken in natural units.
        # one fused Triton pass per tensor (K's token mean first), bit-equal to quant.py's torch form
        q8, qs, k8, ks, _ = quantize_qk_fused(q, k, scale, self.k_block)
        if self.copy_v:
            v = v.contiguous()
        o = out if self.o_in_place else new_like(out, self.s, memory_format=torch.contiguous_format)
        tensors = dict(Q8=q8, K8=k8, QS=qs, KS=ks, V=v, Out=o)  # the bias's only with a bias (absent_arguments)
        if attn_bias is not None:
            tensors["Bias"] = attn_bias.contiguous() if self.bias_compact else attn_bias
            if self.lengths is not None:
                tensors["Lens"], tensors["Plain"] = fl.key_lengths(attn_bias, self.n, self.lengths)
        run(self.launch, tensors)
        if o is not out:
            out.copy_(o)
        return out


_STRIDES = (
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
