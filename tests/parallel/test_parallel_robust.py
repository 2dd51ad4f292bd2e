"""Context parallelism where it used to go wrong quietly, or wedge: on spawned gloo ranks,
compared with one process in float64.

- kv_sharded="auto" on k and v that are the same on every rank: either the whole key
  sequence on every rank or equal shards of a longer one. It decides only where the
  call says which (a mask's columns, a key mask that differs between ranks), takes them
  as whole where both readings give the same output, and refuses (saying what to pass)
  where they do not: causal attention, the log-sum-exp.
- A local attention that raises, on every rank or on some, forward or backward, in the
  ring, in Ulysses and on a 2-D mesh: every rank raises (none waits for the group's
  timeout), and the next ordinary call on the same groups gives the right answer. The
  groups' timeout is short here, so a transfer left in flight fails the batch quickly.
- diffusers' enable_parallelism on a CPU-only machine through the README's recipe
  (attnkit.diffusers.context_parallel.enable_parallelism), with uneven shards, after a
  training forward that a backend refused inside the ring.
"""

from __future__ import annotations

import pytest
import torch

from attnkit.testing import EPSILON, rel_error
from tests._masks import causal_bias
from tests.parallel._parallel_harness import run_ranks, values

F64 = torch.float64
TOL = 1e-12  # float64 end to end: the rule's 2x float64 rounding + 1e-12, at these sizes

B, H, D = 2, 2, 8
Q_SPLIT = [5, 6]  # 11 queries on 2 ranks
N_SHARD = 6  # keys on each rank, the same on both


def _attend(q, k, v, bias=None, causal=False):
    """(out, dq, dk, dv) of one process, float64, for upstream gradient dout."""
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if bias is not None:
        s = s + bias
    if causal:
        s = s + causal_bias(*s.shape[-2:], dtype=s.dtype)
    return torch.softmax(s, -1) @ v


def _reference(case: dict, sharded_reading: bool):
    """One process: out, dq, and each rank's dk, dv (its shard's gradient, or with the
    keys whole the gradient of the one key set)."""
    q = case["q"].clone().requires_grad_(True)
    if sharded_reading:  # the sequence is each rank's k in turn
        parts = [case["k"].clone().requires_grad_(True) for _ in Q_SPLIT]
        vparts = [case["v"].clone().requires_grad_(True) for _ in Q_SPLIT]
        k, v = torch.cat(parts, 2), torch.cat(vparts, 2)
    else:
        parts, vparts = [case["k"].clone().requires_grad_(True)], [case["v"].clone().requires_grad_(True)]
        k, v = parts[0], vparts[0]
    out = _attend(q, k, v, case.get("bias"), case.get("causal", False))
    grads = torch.autograd.grad(out, [q] + parts + vparts, case["dout"])
    n = len(parts)
    return out.detach(), grads[0], list(grads[1 : 1 + n]), list(grads[1 + n :])


def _draw(seed: int, n_keys: int = N_SHARD) -> dict:
    g = torch.Generator().manual_seed(seed)
    M = sum(Q_SPLIT)
    return dict(
        q=torch.randn(B, H, M, D, generator=g, dtype=F64),
        k=torch.randn(B, H, n_keys, D, generator=g, dtype=F64),
        v=torch.randn(B, H, n_keys, D, generator=g, dtype=F64),
        dout=torch.randn(B, H, M, D, generator=g, dtype=F64),
        q_split=Q_SPLIT,
        kv_sharded="auto",
        _g=g,
    )


def _key_mask(g, n: int) -> torch.Tensor:
    """(B, 1, 1, n) additive: random values, a few keys masked with -inf, never all."""
    bias = torch.randn(B, 1, 1, n, generator=g, dtype=F64)
    bias[0, ..., 1] = float("-inf")
    bias[1, ..., n - 2 :] = float("-inf")
    return bias


def auto_cases(seed: int) -> dict:
    cases = {}
    for mesh in ("ring", "ulysses"):
        # a key mask by key columns that differs between the ranks: two different key
        # sets that hold the same k and v (equal shards), not one whole set
        c = _draw(seed)
        c.update(mesh=mesh, bias=_key_mask(c["_g"], 2 * N_SHARD), bias_sharding="key", bias_split=[N_SHARD] * 2)
        cases[f"{mesh}-key-mask-differs"] = c
        # causal: the two readings differ, and nothing tells them apart
        c = _draw(seed + 1)
        c.update(mesh=mesh, causal=True)
        cases[f"{mesh}-causal-same-kv"] = c
        # a mask by query rows with a column per key of 2 shards: sharded
        c = _draw(seed + 2)
        c.update(mesh=mesh, bias=torch.randn(B, H, sum(Q_SPLIT), 2 * N_SHARD, generator=c["_g"], dtype=F64))
        cases[f"{mesh}-query-mask-every-key"] = c
        # the text-encoder case: 7 text keys whole on every rank, no mask
        c = _draw(seed + 3, n_keys=7)
        c.update(mesh=mesh)
        cases[f"{mesh}-text-whole"] = c
        # the same, with the same key-padding mask on every rank, by key columns (what
        # diffusers' backend passes)
        c = _draw(seed + 4, n_keys=7)
        c.update(mesh=mesh, bias=_key_mask(c["_g"], 7), bias_sharding="key")
        cases[f"{mesh}-text-whole-key-mask"] = c
    # a mask by query rows with a column per key of one set: whole
    c = _draw(seed + 5)
    c.update(mesh="ring", bias=torch.randn(B, 1, 1, N_SHARD, generator=c["_g"], dtype=F64))
    cases["ring-query-mask-whole"] = c
    # a mask whose columns fit neither reading
    c = _draw(seed + 6)
    c.update(mesh="ring", bias=torch.randn(B, 1, 1, N_SHARD + 1, generator=c["_g"], dtype=F64))
    cases["ring-query-mask-fits-neither"] = c
    # the log-sum-exp: larger by log(2) over two copies
    c = _draw(seed + 7)
    c.update(mesh="ring", return_lse=True)
    cases["ring-lse-same-kv"] = c
    for c in cases.values():
        del c["_g"]
    return cases


@pytest.fixture(scope="module")
def auto_runs(module_seed):
    cases = auto_cases(module_seed % 100_000)
    return cases, values(
        run_ranks("tests.parallel._parallel_robust:auto_batch", 2, {"cases": cases}, timeout=90, group_timeout=10)
    )


def _check_equal(case, per_rank, sharded_reading: bool):
    for r, res in enumerate(per_rank):
        assert res["ok"], f"rank {r} raised {res['type']}: {res['message']}"
    out, dq, dks, dvs = _reference(case, sharded_reading)
    got = torch.cat([res["out"] for res in per_rank], 2)
    assert rel_error(got, out) <= TOL, f"out: relative error {rel_error(got, out):.3e}"
    got_dq = torch.cat([res["dq"] for res in per_rank], 2)
    assert rel_error(got_dq, dq) <= TOL, f"dq: relative error {rel_error(got_dq, dq):.3e}"
    for name, refs in (("dk", dks), ("dv", dvs)):
        if sharded_reading:  # each rank: the gradient of its own shard
            for r, res in enumerate(per_rank):
                assert rel_error(res[name], refs[r]) <= TOL, f"rank {r} {name}: {rel_error(res[name], refs[r]):.3e}"
        else:  # whole on every rank: each rank's share, summing to the gradient
            total = sum(res[name] for res in per_rank)
            assert rel_error(total, refs[0]) <= TOL, f"sum of {name}: {rel_error(total, refs[0]):.3e}"


def _check_refused(per_rank, *words):
    for r, res in enumerate(per_rank):
        assert not res["ok"], f"rank {r} did not refuse"
        assert res["type"] == "ValueError", res
        for w in words:
            assert w in res["message"], f"rank {r}: {res['message']!r} does not say {w!r}"


@pytest.mark.parametrize("mesh", ["ring", "ulysses"])
def test_auto_key_mask_differing_per_rank_is_sharded(mesh, auto_runs):
    cases, runs = auto_runs
    name = f"{mesh}-key-mask-differs"
    _check_equal(cases[name], [r[name] for r in runs], sharded_reading=True)


@pytest.mark.parametrize("mesh", ["ring", "ulysses"])
def test_auto_refuses_causal_on_the_same_kv(mesh, auto_runs):
    _, runs = auto_runs
    _check_refused([r[f"{mesh}-causal-same-kv"] for r in runs], "causal=True", "kv_sharded=False", "kv_sharded=True")


@pytest.mark.parametrize("mesh", ["ring", "ulysses"])
def test_auto_query_mask_over_every_key_is_sharded(mesh, auto_runs):
    cases, runs = auto_runs
    name = f"{mesh}-query-mask-every-key"
    _check_equal(cases[name], [r[name] for r in runs], sharded_reading=True)


@pytest.mark.parametrize(
    "name",
    [
        "ring-text-whole",
        "ulysses-text-whole",
        "ring-text-whole-key-mask",
        "ulysses-text-whole-key-mask",
        "ring-query-mask-whole",
    ],
)
def test_auto_whole_keys_stay_whole(name, auto_runs):
    """The replicated text-encoder case: the right answer, and no key moves."""
    cases, runs = auto_runs
    per_rank = [r[name] for r in runs]
    _check_equal(cases[name], per_rank, sharded_reading=False)
    for res in per_rank:
        assert set(res["kinds"]) <= {"meta"}, res["kinds"]


def test_auto_refuses_a_mask_that_fits_neither_reading(auto_runs):
    _, runs = auto_runs
    _check_refused([r["ring-query-mask-fits-neither"] for r in runs], "7 key columns", "6 whole", "12 sharded")


def test_auto_refuses_the_lse_of_the_same_kv(auto_runs):
    _, runs = auto_runs
    _check_refused([r["ring-lse-same-kv"] for r in runs], "return_lse=True", "log(2)", "kv_sharded=False")


# -- a local attention that raises ------------------------------------------------------------

FAILURES = {
    # name: (mesh, world, ranks whose local attention raises, phase, causal)
    "ring-every-rank-forward": ("ring", 2, [0, 1], "forward", False),
    "ring-rank1-forward": ("ring", 2, [1], "forward", False),
    "ring-rank0-backward": ("ring", 2, [0], "backward", False),
    "ring-causal-rank1-forward": ("ring", 2, [1], "forward", True),
    "ring-every-rank-backward": ("ring", 2, [0, 1], "backward", False),
    "ulysses-rank1-forward": ("ulysses", 2, [1], "forward", False),
    "ulysses-rank0-backward": ("ulysses", 2, [0], "backward", False),
    # k and v whole on every rank: no transfer, but the ranks still finish together
    "whole-kv-rank1-forward": ("whole", 2, [1], "forward", False),
    "whole-kv-rank0-backward": ("whole", 2, [0], "backward", True),
    "mesh2x2-rank3-forward": ("2x2", 4, [3], "forward", False),
    "mesh2x2-rank0-backward": ("2x2", 4, [0], "backward", True),
}


def failure_cases(seed: int, world: int) -> dict:
    cases = {}
    for i, (name, (mesh, w, ranks, phase, causal)) in enumerate(FAILURES.items()):
        if w != world:
            continue
        g = torch.Generator().manual_seed(seed + i)
        heads = 4 if mesh == "2x2" else H
        split = [3, 5, 2, 4] if world == 4 else [6, 7]
        n = sum(split)
        q, k, v, dout = (torch.randn(1, heads, n, D, generator=g, dtype=F64) for _ in range(4))
        whole = mesh == "whole"
        cases[name] = dict(
            mesh="ring" if whole else mesh,
            ranks=ranks,
            phase=phase,
            causal=causal,
            q=q,
            k=k,
            v=v,
            dout=dout,
            q_split=split,
            k_split=None if whole else split,
            kv_sharded=not whole,
        )
    return cases


@pytest.fixture(scope="module")
def failure_runs(module_seed):
    out = {}
    for world in (2, 4):
        cases = failure_cases(module_seed % 100_000, world)
        runs = values(
            run_ranks(
                "tests.parallel._parallel_robust:failure_batch", world, {"cases": cases}, timeout=120, group_timeout=10
            )
        )
        out.update({name: (case, [r[name] for r in runs]) for name, case in cases.items()})
    return out


@pytest.mark.parametrize("name", list(FAILURES))
def test_a_raising_local_attention_ends_every_rank_and_leaves_the_group_usable(name, failure_runs):
    case, per_rank = failure_runs[name]
    for r, res in enumerate(per_rank):
        failed = res["failed"]
        assert not failed["ok"], f"rank {r} finished a call that failed on rank(s) {case['ranks']}"
        if r in case["ranks"]:  # its own error
            assert failed["type"] == "RuntimeError" and f"injected failure in the {case['phase']}" in failed["message"]
        else:  # the others are told who
            assert failed["type"] == "ContextParallelError", failed
            assert "another rank" in failed["message"] and "stays usable" in failed["message"], failed["message"]
    # the next call on the same groups: the right answer, forward and backward
    q, k, v = (case[n].clone().requires_grad_(True) for n in "qkv")
    ref = _attend(q, k, v, causal=case["causal"])
    ref_grads = torch.autograd.grad(ref, (q, k, v), case["dout"])
    for r, res in enumerate(per_rank):
        assert res["then"]["ok"], f"rank {r}: {res['then']}"
    for i, key in enumerate(("out", "dq", "dk", "dv")):
        if key in ("dk", "dv") and case["k_split"] is None:  # whole on every rank: the shares sum
            got = sum(res["then"][key] for res in per_rank)
        else:
            got = torch.cat([res["then"][key] for res in per_rank], 2)
        want = ref.detach() if i == 0 else ref_grads[i - 1]
        assert rel_error(got, want) <= TOL, f"{key}: relative error {rel_error(got, want):.3e}"


# -- diffusers on a CPU-only machine -----------------------------------------------------------


def test_diffusers_cpu_recipe_after_a_refused_forward(module_seed):
    """The README's recipe (enable_parallelism from attnkit.diffusers.context_parallel) on a tiny
    Wan transformer, 2 gloo ranks, uneven shards (diffusers' "anything" split, whose
    gather gloo refuses unaided). First a training forward with attnkit_sdpa, refused
    inside the ring on every rank (torch's SDPA gives its lse no gradient); then the same
    model with set_attention_backend("attnkit") equals one rank, forward and gradients."""
    pytest.importorskip("diffusers")
    per_rank = values(
        run_ranks(
            "tests.parallel._parallel_robust:diffusers_recipe",
            2,
            {"seed": module_seed % 10_000},
            timeout=150,
            group_timeout=15,
        )
    )
    for r, res in enumerate(per_rank):
        assert res["device_count"] == torch.accelerator.device_count(), "device_count left changed"
        assert res["refused"] is not None and "log-sum-exp" in res["refused"]["message"], res["refused"]
        out, ref = res["out"]
        assert rel_error(out, ref) <= EPSILON[F64], f"rank {r}: output relative error {rel_error(out, ref):.3e}"
        for name, (got, want) in res["grads"].items():
            assert got is not None, f"rank {r}: no gradient for {name}"
            # Wan's FP32LayerNorm sums some gradients in float32 (see test_parallel_diffusers)
            tol = EPSILON[torch.float32] if ".norm2." in name or name.startswith("condition_embedder.time_") else 1e-12
            assert rel_error(got, want) <= tol, f"rank {r}: d{name}: relative error {rel_error(got, want):.3e}"


_AUTOGRAD_SCRIPT = r"""
import os, sys, torch, torch.distributed as dist
os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = sys.argv[2]
dist.init_process_group("gloo", rank=0, world_size=1)
from attnkit.parallel import context_parallel_attention, math_attention
torch.manual_seed(int(sys.argv[1]))
def leaf(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)
q, k, v = leaf(1, 2, 5, 8), leaf(1, 2, 7, 8), leaf(1, 2, 7, 8)
bias = torch.randn(1, 2, 5, 7, dtype=torch.float64)  # a mask's gradient is refused under context parallelism
worst = 0.0
for kv_sharded in (False, True):  # whole k and v / the local call of a one-rank ring
    cp = lambda q, k, v, b: context_parallel_attention(q, k, v, b, ring_group=dist.group.WORLD, kv_sharded=kv_sharded)
    ref = lambda q, k, v, b: math_attention(q, k, v, b, None, None)[0]
    def penalty(attend):  # a gradient penalty: create_graph=True, then a second backward
        out = attend(q, k, v, bias)
        g = torch.autograd.grad((out * out).sum(), (q, k), create_graph=True)
        return out.sum() + sum(x.pow(2).sum() for x in g)
    a = torch.autograd.grad(penalty(ref), (q, k, v))
    b = torch.autograd.grad(penalty(cp), (q, k, v))
    worst = max([worst] + [float((y - x).norm() / x.norm()) for x, y in zip(a, b)])
    out = cp(q, k, v, bias)
    out.sum().backward(retain_graph=True)
    out.sum().backward()  # a second backward over a retained graph
print("worst", worst)
dist.destroy_process_group()
"""


def test_whole_kv_gradients_are_autograds_double_and_retained_backward_included(module_seed, tmp_path):
    """The local attention run between ranks that finish together, with a mask: a
    gradient penalty (create_graph=True) and a second backward over a retained graph, as
    math_attention alone gives them (the penalty came back 53% off, silently; the second
    backward raised)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "autograd.py"
    script.write_text(_AUTOGRAD_SCRIPT)
    port = str(20000 + os.getpid() % 20000)
    done = subprocess.run(
        [sys.executable, str(script), str(module_seed), port], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    worst = float(done.stdout.split("worst")[-1])
    assert worst < 1e-10, worst
