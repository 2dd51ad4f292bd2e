"""What the INT8 attention's K-scale forms cost in accuracy (docs/int8.md's table).

    python bench/int8_accuracy.py            # on the CPU: Triton's interpreter
    python bench/int8_accuracy.py --quick    # fewer head dims, one model

Each form (attnkit/kernels/int8/quant.py: K scales per key, ``k_block=1``, or per block of
K_BLOCK keys, the default, which lets the main loop dequantise with one multiply per
score) is measured on the same inputs, drawn fresh from one seed:

* one attention call per head dim, fp16, random Q/K/V (B=1, H=2, 256 x 256 tokens): the
  relative L2 error against float64 attention, its worst row's, and plain fp16 torch
  attention's error beside them (the tolerance rule's baseline);
* whole tiny transformers (Flux, Wan, SD3, built from diffusers' configs as the model zoo
  builds them, bf16): ``attnkit.auto(lossy="int8")`` with the guard off against
  ``attnkit.auto()`` in the same dtype, the output's relative L2 error;
* P.V accumulated in float16 (``pv_accumulate="fp16"``, for GeForce tensor cores): the
  kernel's difference from float32 accumulation, and that rounding emulated per MMA.

The integer products are exact in the interpreter as on a GPU, so the figures are the
kernel's. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import attnkit  # noqa: E402
import attnkit.kernels.int8 as int8  # noqa: E402
from attnkit import testing  # noqa: E402
from attnkit.kernels.int8.quant import K_BLOCK  # noqa: E402

FORMS = {"per key (k_block=1)": 1, f"per {K_BLOCK} keys (default)": K_BLOCK}
HEAD_DIMS = (40, 64, 80, 128, 160, 320)


def _row_errors(out, ref):
    diff = (out.double() - ref).norm(dim=-1)
    return (diff.norm() / ref.norm()).item(), (diff / ref.norm(dim=-1).clamp_min(1e-30)).max().item()


def per_call(head_dims, seed: int) -> list[list[str]]:
    rows = []
    for d in head_dims:
        gen = torch.Generator().manual_seed(seed + d)
        q, k, v = (torch.randn(1, 2, 256, d, generator=gen).half() for _ in range(3))
        ref = testing.reference_attention(q.double(), k.double(), v.double())
        base = testing.rel_error(testing.torch_math_attention(q, k, v), ref)
        cells = [f"call, fp16, D={d}"]
        for k_block in FORMS.values():
            with torch.no_grad():
                out = int8.int8_attention(q, k, v, k_block=k_block)
            overall, worst = _row_errors(out, ref)
            cells.append(f"{overall:.2%} (worst row {worst:.1%})")
        rows.append([*cells, f"{base:.2%}"])
    return rows


def pv16_rounding(q, k, v, block_n: int = 128, k_step: int = 16) -> float:
    """The relative L2 error that accumulating P.V in float16 adds, emulated in float64 as
    a tensor core does it: each MMA sums ``k_step`` keys' products exactly and rounds to
    float16, and each tile of ``block_n`` keys joins the float32 accumulator (the
    interpreter's float16 product rounds only once, so it understates this)."""
    s = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
    p = torch.softmax(s, dim=-1).half().double()  # P rounded to the inputs' dtype, as the kernel does
    exact = p @ v.double()
    out = torch.zeros_like(exact)
    for t in range(0, k.shape[2], block_n):
        tile = torch.zeros_like(exact)
        for c in range(t, min(t + block_n, k.shape[2]), k_step):
            tile = (tile + p[..., c : c + k_step] @ v.double()[..., c : c + k_step, :]).half().double()
        out = out + tile
    return testing.rel_error(out, exact)


def pv16(head_dims, seed: int) -> list[list[str]]:
    """P.V accumulated in float16 (pv_accumulate="fp16"): the kernel's relative difference
    from the float32-accumulating kernel in the interpreter, and the emulated error."""
    rows = []
    for d in head_dims:
        gen = torch.Generator().manual_seed(seed + d)
        q, k, v = (torch.randn(1, 2, 256, d, generator=gen).half() for _ in range(3))
        with torch.no_grad():
            a = int8.int8_attention(q, k, v)
            b = int8.int8_attention(q, k, v, pv_accumulate="fp16")
        rows.append([f"call, fp16, D={d}", f"{testing.rel_error(b, a):.3%}", f"{pv16_rounding(q, k, v):.3%}"])
    return rows


def whole_models(names, seed: int) -> list[list[str]]:
    from tests.zoo._zoo import cast_floats
    from tests.zoo.cases import flux, sd3, wan

    cases = {"Flux": flux.CASES, "Wan": wan.CASES, "SD3": sd3.CASES}
    model_names = {"Flux": "FluxTransformer2DModel", "Wan": "WanTransformer3DModel", "SD3": "SD3Transformer2DModel"}
    rows = []
    real = int8.int8_attention
    for name in names:
        case = next(c for c in cases[name] if c.name == model_names[name] and not c.variant)
        model = case.build(seed).to(torch.bfloat16)
        inputs = cast_floats(case.make_inputs(model, seed), torch.bfloat16)
        exact_model = copy.deepcopy(model)
        attnkit.apply(exact_model, attnkit.auto())
        with torch.no_grad():
            exact = case.run(exact_model, inputs)
        cells = [f"whole tiny {name}, bf16"]
        for k_block in FORMS.values():
            lossy_model = copy.deepcopy(model)
            attnkit.apply(lossy_model, attnkit.auto(lossy="int8", guard=False))
            int8.int8_attention = functools.partial(real, k_block=k_block)
            try:
                with torch.no_grad():
                    lossy = case.run(lossy_model, inputs)
            finally:
                int8.int8_attention = real
            errors = [testing.rel_error(a, b) for a, b in zip(lossy, exact)]
            cells.append(f"{max(errors):.2%}")
        rows.append([*cells, "-"])
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="head dims 64 and 128, the Flux model only")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    head_dims = (64, 128) if args.quick else HEAD_DIMS
    models = ("Flux",) if args.quick else ("Flux", "Wan", "SD3")
    tables = (
        (
            ["what", *(f"K scales {f}" for f in FORMS), "plain fp16 torch"],
            per_call(head_dims, args.seed) + whole_models(models, args.seed),
        ),
        (
            ["P.V accumulated in fp16", "kernel, against fp32 accumulation", "emulated per 16-key MMA, against exact"],
            pv16((64, 128), args.seed),
        ),
    )
    for header, rows in tables:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
