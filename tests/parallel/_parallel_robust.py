"""What each spawned rank runs in tests/parallel/test_parallel_robust.py (see _parallel_harness).

One function per batch of cases; each case's result (or the error it raised) goes back
to the parent, which compares with one process in float64.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from attnkit.parallel import ContextParallelError, context_parallel_attention, count_bytes, math_attention


def _shard(t: torch.Tensor, dim: int, lens: list[int], i: int) -> torch.Tensor:
    return t.narrow(dim, sum(lens[:i]), lens[i])


def _groups(mesh: str, world: int):
    """(ring_group, ulysses_group): "ring", "ulysses", or on 4 ranks "2x2" (ring rank
    major: ulysses groups {0, 1}, {2, 3}; ring groups {0, 2}, {1, 3})."""
    if mesh == "ring":
        return dist.group.WORLD, None
    if mesh == "ulysses":
        return None, dist.group.WORLD
    rank = dist.get_rank()
    groups = {tuple(r): dist.new_group(r) for r in ([0, 1], [2, 3], [0, 2], [1, 3])}
    return groups[(0, 2) if rank % 2 == 0 else (1, 3)], groups[(0, 1) if rank < 2 else (2, 3)]


def _error(exc: BaseException) -> dict:
    return {"type": type(exc).__name__, "message": str(exc)}


def _call(case: dict, rank: int, world: int, groups, local=math_attention) -> dict:
    """One call of context_parallel_attention on this rank's part of case, forward and
    backward; its results, or the error it raised."""
    ring, uly = groups
    q_lens = case["q_split"]
    q = _shard(case["q"], 2, q_lens, rank).clone().requires_grad_(True)
    if case.get("k_split") is None:  # k and v as given, the same on every rank
        k, v = case["k"].clone(), case["v"].clone()
    else:
        k, v = (_shard(t, 2, case["k_split"], rank).clone() for t in (case["k"], case["v"]))
    k.requires_grad_(True)
    v.requires_grad_(True)
    bias = case.get("bias")
    if bias is not None:
        if case.get("bias_sharding") == "key":  # this rank's key columns (or, keys whole, all of them)
            if case.get("bias_split") is not None:
                bias = _shard(bias, 3, case["bias_split"], rank)
        elif bias.shape[2] > 1:
            bias = _shard(bias, 2, q_lens, rank)
    try:
        with count_bytes() as sent:
            got = context_parallel_attention(
                q,
                k,
                v,
                bias,
                ring_group=ring,
                ulysses_group=uly,
                causal=case.get("causal", False),
                local=local,
                return_lse=case.get("return_lse", False),
                kv_sharded=case.get("kv_sharded", True),
                bias_sharding=case.get("bias_sharding", "query"),
            )
            out = got[0] if case.get("return_lse") else got
            dq, dk, dv = torch.autograd.grad(out, (q, k, v), _shard(case["dout"], 2, q_lens, rank))
    except ContextParallelError:
        raise  # the group is broken: the batch ends here
    except Exception as exc:
        return {"ok": False, **_error(exc)}
    return {"ok": True, "out": out.detach(), "dq": dq, "dk": dk, "dv": dv, "kinds": sorted(sent.by_kind)}


def auto_batch(rank: int, world: int, payload: dict) -> dict:
    """kv_sharded='auto' cases: name -> this rank's result."""
    results = {}
    for name, case in payload["cases"].items():
        results[name] = _call(case, rank, world, _groups(case["mesh"], world))
    return results


# -- failures ---------------------------------------------------------------------------------


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError(f"injected failure in the backward of rank {dist.get_rank()}")


def failing_local(ranks: list[int], phase: str):
    """math_attention, raising on ``ranks`` in the forward or the backward."""

    def local(q, k, v, attn_bias=None, scale=None, causal_offset=None):
        failing = dist.get_rank() in ranks and q.shape[2] > 2  # the (1, 1, 2, D) probe passes
        if failing and phase == "forward":
            raise RuntimeError(f"injected failure in the forward of rank {dist.get_rank()}")
        out, lse = math_attention(q, k, v, attn_bias, scale, causal_offset)
        if failing and phase == "backward":
            out = _RaiseInBackward.apply(out)
        return out, lse

    return local


def failure_batch(rank: int, world: int, payload: dict) -> dict:
    """Each case: a call whose local attention raises on some ranks, then an ordinary
    call of the same kind on the same groups. name -> {"failed": error, "then": result}."""
    results = {}
    for name, case in payload["cases"].items():
        groups = _groups(case["mesh"], world)
        local = failing_local(case["ranks"], case["phase"])
        try:
            failed = _call(case, rank, world, groups, local=local)
        except ContextParallelError as exc:  # what the ranks that did not raise get
            failed = {"ok": False, **_error(exc)}
        results[name] = {"failed": failed, "then": _call(case, rank, world, groups)}
    return results


# -- diffusers ----------------------------------------------------------------------------------


def diffusers_recipe(rank: int, world: int, payload: dict) -> dict:
    """The README's CPU recipe on a tiny Wan transformer (uneven shards: ring_anything),
    after a training forward that attnkit_sdpa refuses inside the ring on every rank."""
    from diffusers import ContextParallelConfig

    import attnkit  # noqa: F401  (registers the "attnkit" backends)
    from attnkit.diffusers.context_parallel import enable_parallelism
    from tests.parallel._parallel_diffusers import _forward_backward, wan

    seed = payload["seed"]
    model, inputs = wan(seed, odd=True)
    ref_out, ref_grads = _forward_backward(model, inputs, seed + 7)  # one rank, diffusers' own attention
    model.zero_grad(set_to_none=True)
    model.set_attention_backend("attnkit_sdpa")  # torch's SDPA: its lse has no gradient
    enable_parallelism(model, ContextParallelConfig(ring_degree=world, ring_anything=True))
    res = {"device_count": torch.accelerator.device_count()}
    try:
        _forward_backward(model, inputs, seed + 7)
        res["refused"] = None
    except ContextParallelError:
        raise
    except Exception as exc:
        res["refused"] = _error(exc)
    model.zero_grad(set_to_none=True)
    model.set_attention_backend("attnkit")
    out, grads = _forward_backward(model, inputs, seed + 7)
    for g in grads.values():  # each rank holds its tokens' share
        dist.all_reduce(g)
    res["out"] = (out, ref_out)
    res["grads"] = {n: (grads.get(n), g) for n, g in ref_grads.items()}
    return res
