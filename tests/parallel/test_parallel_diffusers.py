"""diffusers' enable_parallelism on attnkit.parallel: tiny Wan-like and Flux-like models on
2 gloo ranks, ring and Ulysses, even lengths (diffusers' default split) and odd ones (its
"anything" split, which diffusers' own attention serves without backward), forward and
parameter gradients, equal to the same model on one rank with diffusers' stock attention.

What stands in for what on a CPU-only machine is said where it is done, in
_parallel_diffusers.diffusers_cp: torch.accelerator.device_count (diffusers divides by
it), the gather of unequal shards (gloo refuses it, NCCL serves it), and
logging.Logger.warning_once (added by transformers, which every pipeline imports).
"""

from __future__ import annotations

import pytest
import torch

from attnkit.testing import EPSILON
from tests.parallel._parallel_harness import run_ranks, values

diffusers = pytest.importorskip("diffusers")

CASES = [f"{m}-{mode}-{n}" for m in ("wan", "flux") for mode in ("ring", "ulysses") for n in ("even", "odd")]


# Gradients diffusers' Wan itself sums over tokens in float32, even in a float64 model:
# FP32LayerNorm casts to float32, and its affine cross-attention norm (norm2) and the
# timestep embedding (whose shift and scale enter those norms) get their gradients
# through it. Another split of the tokens sums them in another order: float32 rounding,
# held to float32's epsilon. Every other parameter is float64 end to end: 1e-12.
def summed_in_float32(name: str) -> bool:
    return ".norm2." in name or name.startswith("condition_embedder.time_")


@pytest.fixture(scope="module")
def diffusers_runs(module_seed):
    return values(
        run_ranks("tests.parallel._parallel_diffusers:diffusers_cp", 2, {"seed": module_seed % 10_000}, timeout=170)
    )


@pytest.mark.parametrize("case", CASES)
def test_enable_parallelism_equals_one_rank(case, diffusers_runs):
    for rank, results in enumerate(diffusers_runs):
        r = results[case]
        assert r["out"] <= EPSILON[torch.float64], f"rank {rank}: output relative error {r['out']:.3e}"
        assert not r["missing_grads"], f"rank {rank}: no gradient for {r['missing_grads']}"
        assert r["grads"], "no parameter gradients compared"
        for name, err in r["grads"].items():
            tol = EPSILON[torch.float32] if summed_in_float32(name) else 1e-12
            assert err <= tol, f"rank {rank}: d{name}: relative error {err:.3e} > {tol:.0e}"
