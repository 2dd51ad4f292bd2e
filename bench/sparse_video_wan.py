"""Relative error of attnkit.sparse_video's masks on a tiny Wan, against full attention.

    .venv/bin/python bench/sparse_video_wan.py [--seeds 3]

A WanTransformer3DModel from a tiny config (random weights, float32, CPU) runs one forward
on random latents with attnkit.auto() (full attention), then with
attnkit.auto(lossy=mask, guard=False) for each mask (every self-attention call sparse:
the raw error, no fallback), then with the default guard on (the relative L2 error of
the attention output it measured on its checked rows: past 0.05 it computes exactly).
Prints a Markdown table for docs/sparse_video.md: the mask, the fraction of (query, key)
pairs and of blocks it keeps, the relative L2 error of the model's output (median and
worst over the seeds), and the worst attention error the guard measured.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys

import torch
from diffusers import WanTransformer3DModel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import attnkit  # noqa: E402
from attnkit import sparse_video as sv  # noqa: E402
from tests.zoo.cases import wan as wan_cases  # noqa: E402

# the model zoo's tiny Wan (tests/zoo/cases/wan.py), built from diffusers' own config keys
CONFIG = next(c for c in wan_cases.CASES if c.name == "WanTransformer3DModel" and not c.variant).config
FRAMES, HEIGHT, WIDTH = 8, 16, 16  # latents: 8 x 8 x 8 = 512 tokens after the (1, 2, 2) patch
TOKENS = (FRAMES, HEIGHT // 2, WIDTH // 2)
BLOCK = 64

MASKS = {
    "sliding_tile(tile=(2, 2, 2), window=(3, 3, 3))": lambda: sv.sliding_tile(
        *TOKENS, tile=(2, 2, 2), window=(3, 3, 3), block_size=BLOCK
    ),
    "sliding_tile(tile=(1, 4, 4), window=(3, 1, 1))": lambda: sv.sliding_tile(
        *TOKENS, tile=(1, 4, 4), window=(3, 1, 1), block_size=BLOCK
    ),
    "sliding_tile(tile=(2, 2, 2), window=(1, 1, 1))": lambda: sv.sliding_tile(
        *TOKENS, tile=(2, 2, 2), window=(1, 1, 1), block_size=BLOCK
    ),
    "radial(window=64)": lambda: sv.radial(*TOKENS, window=64, block_size=BLOCK),
    "radial(window=16)": lambda: sv.radial(*TOKENS, window=16, block_size=BLOCK),
}


def forward(model, proc, inputs):
    attnkit.apply(model, proc)
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0].double()


def kept(mask) -> float:
    n = mask.seq_lengths[0]
    idx = torch.arange(n)
    return float(mask.mask_mod(None, None, idx[:, None], idx[None, :]).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    logging.getLogger("attnkit").setLevel(logging.ERROR)  # the guard's warnings: counted below instead
    rows = {name: [] for name in MASKS}
    fell = {name: [] for name in MASKS}
    masks = {name: build() for name, build in MASKS.items()}
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        model = WanTransformer3DModel(**CONFIG).eval()
        inputs = dict(
            hidden_states=torch.randn(1, 4, FRAMES, HEIGHT, WIDTH),
            timestep=torch.tensor([500.0]),
            encoder_hidden_states=torch.randn(1, 6, 24),
        )
        full = forward(model, attnkit.auto(), inputs)
        for name, mask in masks.items():
            out = forward(model, attnkit.auto(lossy=mask, guard=False), inputs)
            rows[name].append(float((out - full).norm() / full.norm()))
            guarded = attnkit.auto(lossy=mask)
            forward(model, guarded, inputs)
            states = guarded.chooser.guard_states()
            fell[name].append(max(s.worst_error for s in states))
    print(
        f"tiny Wan: {CONFIG}, latents 1x4x{FRAMES}x{HEIGHT}x{WIDTH} ({'x'.join(map(str, TOKENS))} tokens), "
        f"block {BLOCK}, float32 CPU, {args.seeds} seeds\n"
    )
    print(
        "| mask | pairs kept | blocks visited | relative L2 error of the output (median, worst) | "
        "guard: attention error it measured (worst) |"
    )
    print("|---|---|---|---|---|")
    for name, mask in masks.items():
        errs = rows[name]
        print(
            f"| `{name}` | {kept(mask):.0%} | {sv.density(mask):.0%} | {statistics.median(errs):.3g}, "
            f"{max(errs):.3g} | {max(fell[name]):.3g} |"
        )


if __name__ == "__main__":
    main()
