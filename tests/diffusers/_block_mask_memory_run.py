"""Run in a fresh process by test_block_mask_memory.py: one 16k-token sliding-window
BlockMask call (forward and backward) through diffusers' dispatcher with the attnkit
backend, in eager mode, on the CPU. Prints JSON: the peak resident memory the call added
(Linux's VmHWM, reset before the call), one dense score matrix's size, and the error of
sampled rows against float64."""

from __future__ import annotations

import json
import sys

import torch
from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn
from torch.nn.attention.flex_attention import BlockMask

import attnkit  # noqa: F401  (registers the attnkit backend)

TOKENS, HEADS, DIM, BLOCK, WINDOW = 16384, 2, 64, 128, 512


def window_mask() -> BlockMask:
    """|q - k| <= WINDOW from block lists (full blocks inside the window, partial ones at its
    edges under the mask_mod), never an (M, N) tensor."""
    n = TOKENS // BLOCK
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    near = (j - i).abs() * BLOCK - (BLOCK - 1) <= WINDOW  # some pair within the window
    inside = (j - i).abs() * BLOCK + (BLOCK - 1) <= WINDOW  # every pair within it
    part, full = near & ~inside, inside

    def lists(sel):
        order = torch.sort((~sel).to(torch.uint8), dim=-1, stable=True).indices.to(torch.int32)
        return sel.sum(-1).to(torch.int32)[None, None], order[None, None]

    def window(b, h, q, k):
        return (q - k).abs() <= WINDOW

    num, idx = lists(part)
    full_num, full_idx = lists(full)
    return BlockMask.from_kv_blocks(
        num, idx, full_num, full_idx, BLOCK_SIZE=BLOCK, mask_mod=window, seq_lengths=(TOKENS, TOKENS)
    )


def status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def main() -> None:
    torch.manual_seed(int(sys.argv[1]))
    q, k, v = (torch.randn(1, TOKENS, HEADS, DIM, requires_grad=True) for _ in range(3))
    bm = window_mask()
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size
    out = dispatch_attention_fn(q, k, v, attn_mask=bm, backend=AttentionBackendName("attnkit"))
    out.backward(torch.randn_like(out))
    peak = status("VmHWM") - before
    rows = torch.cat([torch.arange(0, 64), torch.randint(0, TOKENS, (64,))])
    qs, ks, vs = (t.detach().double().transpose(1, 2) for t in (q, k, v))
    scores = (qs[:, :, rows] @ ks.transpose(-1, -2)) * DIM**-0.5
    seen = (rows[:, None] - torch.arange(TOKENS)[None, :]).abs() <= WINDOW
    ref = torch.softmax(scores.masked_fill(~seen, float("-inf")), -1) @ vs
    got = out.detach().double().transpose(1, 2)[:, :, rows]
    err = float((got - ref).norm() / ref.norm())
    qf, kf, vf = (t.float() for t in (qs, ks, vs))  # plain torch in the call's dtype: the baseline
    plain = torch.softmax(((qf[:, :, rows] @ kf.transpose(-1, -2)) * DIM**-0.5).masked_fill(~seen, float("-inf")), -1)
    base = float(((plain @ vf).double() - ref).norm() / ref.norm())
    finite = bool(torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all())
    print(
        json.dumps(dict(peak=peak, score_matrix=TOKENS * TOKENS * 4, error=err, torch_error=base, finite_grads=finite))
    )


if __name__ == "__main__":
    main()
