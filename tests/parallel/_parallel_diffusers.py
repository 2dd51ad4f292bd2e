"""diffusers' own context parallelism (enable_parallelism, its _cp_plan hooks) with
``set_attention_backend("attnkit")``, on spawned gloo ranks.

Tiny Wan-like and Flux-like transformers (random weights, float64) run with
enable_parallelism on 2 ranks and are compared with the same model on one rank with
diffusers' stock attention.
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from attnkit.testing import rel_error

# attnkit's diffusers backend (registered by `import attnkit`): auto() on each shard,
# among the backends that return the log-sum-exp, combined by attnkit.parallel.
BACKEND = "attnkit"


# -- tiny models, odd lengths -------------------------------------------------------------


def wan(seed: int, odd: bool):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=4,
        out_channels=4,
        text_dim=16,
        freq_dim=16,
        ffn_dim=32,
        num_layers=2,
        rope_max_seq_len=32,
    ).double()
    g = torch.Generator().manual_seed(seed + 1)
    # 3 (or 2) frames of 6x10 latents, patches of 2x2: 45 tokens (23 + 22), or 30; the 7
    # text tokens stay whole on every rank (Wan's _cp_plan does not split them)
    inputs = dict(
        hidden_states=torch.randn(1, 4, 3 if odd else 2, 6, 10, generator=g, dtype=torch.float64),
        timestep=torch.tensor([517.0], dtype=torch.float64),
        encoder_hidden_states=torch.randn(1, 7, 16, generator=g, dtype=torch.float64),
    )
    return model, inputs


def flux(seed: int, odd: bool):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    model = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=16,
        pooled_projection_dim=8,
        axes_dims_rope=(2, 2, 4),
    ).double()
    g = torch.Generator().manual_seed(seed + 1)
    img, txt = (15, 7) if odd else (16, 8)  # odd: 8 + 7 image and 4 + 3 text tokens per rank
    inputs = dict(
        hidden_states=torch.randn(1, img, 4, generator=g, dtype=torch.float64),
        encoder_hidden_states=torch.randn(1, txt, 16, generator=g, dtype=torch.float64),
        pooled_projections=torch.randn(1, 8, generator=g, dtype=torch.float64),
        timestep=torch.tensor([0.37], dtype=torch.float64),
        img_ids=torch.stack([torch.zeros(img), torch.arange(img) // 5, torch.arange(img) % 5], 1).double(),
        txt_ids=torch.zeros(txt, 3, dtype=torch.float64),
    )
    return model, inputs


MODELS = {"wan": wan, "flux": flux}


def _forward_backward(model, inputs, weight_seed: int):
    out = model(**inputs, return_dict=False)[0]
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(weight_seed), dtype=out.dtype)
    (out * w).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads


def diffusers_cp(rank: int, world: int, payload: dict) -> dict:
    from diffusers import ContextParallelConfig

    import attnkit  # noqa: F401  (registers the "attnkit" backend)

    # diffusers' enable_parallelism, with what a CPU-only machine on gloo lacks filled in
    # (an accelerator to count, a gather of unequal shards, Logger.warning_once): the
    # recipe the README gives, said where it is done
    from attnkit.diffusers.context_parallel import enable_parallelism

    results = {}
    for (name, build), mode, odd in itertools.product(MODELS.items(), ("ring", "ulysses"), (False, True)):
        if True:  # noqa: SIM108 (one block per case)
            model, inputs = build(payload["seed"], odd)
            ref_out, ref_grads = _forward_backward(model, inputs, payload["seed"] + 7)  # one rank, stock SDPA
            model.zero_grad(set_to_none=True)
            model.set_attention_backend(BACKEND)
            # Even lengths: diffusers' default split. Odd: its "anything" split, uneven
            # shards (45 tokens; 15 + 7), lengths the default split refuses on 2 ranks;
            # diffusers' own "anything" attention has no backward, attnkit's has.
            config = (
                ContextParallelConfig(ring_degree=world, ring_anything=odd)
                if mode == "ring"
                else ContextParallelConfig(ulysses_degree=world, ulysses_anything=odd)
            )
            enable_parallelism(model, config)
            out, grads = _forward_backward(model, inputs, payload["seed"] + 7)
            for g in grads.values():  # each rank holds its tokens' share
                dist.all_reduce(g)
            results[f"{name}-{mode}-{'odd' if odd else 'even'}"] = {
                "out": rel_error(out, ref_out),
                "shape": tuple(out.shape),
                "missing_grads": sorted(set(ref_grads) - set(grads)),
                "grads": {n: rel_error(grads[n], ref_grads[n]) for n in ref_grads if n in grads},
            }
    return results
