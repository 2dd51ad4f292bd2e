"""What each spawned rank runs in the context-parallel tests (see _parallel_harness).

The parent draws the whole problem (global q, k, v, bias, upstream gradients) and sends
it to every rank; each rank takes its shard, runs the distributed attention forward and
backward, and returns its shard of the results. The parent puts the shards together and
compares them with one process.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

from attnkit.parallel import ContextParallelError, context_parallel_attention, count_bytes, math_attention
from attnkit.parallel import ring as ring_module


def mesh_groups(world: int) -> dict:
    """(ring_group, ulysses_group) of this rank for each mesh the tests use. Shard i of the
    sequence is global rank i in every mesh (mesh order: ring rank major)."""
    rank = dist.get_rank()
    whole = dist.group.WORLD
    meshes = {"ring": (whole, None), "ulysses": (None, whole), "same-groups": (whole, whole)}
    if world == 4:
        # Every rank creates every group, in the same order. Ulysses groups are the ring
        # chunks {0, 1} and {2, 3}; ring groups hold one head slice each: {0, 2}, {1, 3}.
        groups = {tuple(r): dist.new_group(r) for r in ([0, 1], [2, 3], [0, 2], [1, 3])}
        ulysses = groups[(0, 1) if rank < 2 else (2, 3)]
        ring = groups[(0, 2) if rank % 2 == 0 else (1, 3)]
        meshes["2x2"] = (ring, ulysses)
    return meshes


def _split(total: int, parts: list[int] | None, world: int) -> list[int]:
    if parts is not None:
        assert sum(parts) == total and len(parts) == world, (parts, total, world)
        return parts
    base, extra = divmod(total, world)
    return [base + (1 if i < extra else 0) for i in range(world)]


def _shard(t: torch.Tensor, dim: int, lens: list[int], i: int) -> torch.Tensor:
    start = sum(lens[:i])
    return t.narrow(dim, start, lens[i])


def _leaf(t: torch.Tensor, grad: bool) -> torch.Tensor:
    """A (B, H, S, D) leaf viewing (B, S, H, D) storage: the strides diffusers hands over."""
    return t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_(grad)


def no_lse_attention(q, k, v, attn_bias=None, scale=None, causal_offset=None):
    return math_attention(q, k, v, attn_bias, scale, causal_offset)[0]


LOCALS = {"math": math_attention, "no_lse": no_lse_attention}


def run_case(case: dict, rank: int, world: int, meshes: dict) -> dict:
    ring_group, ulysses_group = meshes[case["mesh"]]
    q, k, v = case["q"], case["k"], case["v"]
    q_lens = _split(q.shape[2], case.get("q_split"), world)
    kv_sharded = case.get("kv_sharded", True)
    whole = case.get("kv_whole", kv_sharded is False)  # every rank gets all of k and v
    k_lens = None if whole else _split(k.shape[2], case.get("k_split"), world)
    grad = case.get("grad", True)
    override = case.get("override", {}).get(rank, {})
    dtype = override.get("dtype", q.dtype)

    qi = _leaf(_shard(q, 2, q_lens, rank).to(dtype), grad)
    ki = _leaf((k if whole else _shard(k, 2, k_lens, rank)).to(dtype), grad)
    vi = _leaf((v if whole else _shard(v, 2, k_lens, rank)).to(dtype), grad)
    if override.get("dtype_kv_noise"):  # a k that differs on this rank
        ki = _leaf(ki + 1e-3, grad)
    if "head_dim" in override:
        qi = qi[..., : override["head_dim"]]
        ki = ki[..., : override["head_dim"]]
    if "heads" in override:
        qi, ki, vi = (t[:, : override["heads"]] for t in (qi, ki, vi))

    bias = case.get("bias")
    sharding = case.get("bias_sharding", "query")
    if bias is not None:
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
        if sharding == "query" and bias.shape[2] == q.shape[2] and q.shape[2] > 1:
            bias = _shard(bias, 2, q_lens, rank)
        elif sharding == "key" and not whole:
            bias = _shard(bias, 3, k_lens, rank)
        if override.get("bias_requires_grad"):
            bias = bias.clone().requires_grad_(True)
    local = LOCALS[case.get("local", "math")]
    return_lse = case.get("return_lse", False)
    events: list[str] = []
    if case.get("trace"):
        local = _traced(local, events)
    passed_sharding = override.get("pass_sharding", sharding)

    runs = []
    for _ in range(case.get("repeat", 1)):
        with count_bytes() as sent, _tracing_transfers(events if case.get("trace") else None):
            got = context_parallel_attention(
                qi,
                ki,
                vi,
                bias,
                case.get("scale"),
                ring_group=ring_group,
                ulysses_group=ulysses_group,
                causal=case.get("causal", False),
                local=local,
                return_lse=return_lse,
                kv_sharded=kv_sharded,
                bias_sharding=passed_sharding,
            )
            out, lse = got if return_lse else (got, None)
            res = {"out": out.detach(), "lse": None if lse is None else lse.detach()}
            if grad:
                outs, ups = [out], [_shard(case["dout"], 2, q_lens, rank).to(out.dtype)]
                if lse is not None and case.get("dlse") is not None:
                    outs.append(lse)
                    ups.append(_shard(case["dlse"], 2, q_lens, rank).to(lse.dtype))
                res["dq"], res["dk"], res["dv"] = torch.autograd.grad(outs, (qi, ki, vi), ups)
        res["bytes"] = sent.bytes_sent
        res["bytes_by_kind"] = dict(sent.by_kind)
        res["trace"] = list(events)
        events.clear()
        runs.append(res)
    return {"runs": runs}


def _traced(local, events: list):
    def traced(q, k, v, attn_bias=None, scale=None, causal_offset=None):
        if q.shape[2] > 2:  # not the (1, 1, 2, D) probe
            events.append("compute")
        return local(q, k, v, attn_bias, scale, causal_offset)

    return traced


@contextlib.contextmanager
def _tracing_transfers(events):
    """Record "post" each time the ring starts a transfer (events=None: record nothing)."""
    if events is None:
        yield
        return
    original = ring_module.p2p

    def p2p(ops, group, what):
        if any(buf.numel() for _, buf, *_ in ops):
            events.append("post")
        return original(ops, group, what)

    ring_module.p2p = p2p
    try:
        yield
    finally:
        ring_module.p2p = original


def attention_batch(rank: int, world: int, payload: dict) -> list[dict]:
    """Every case of the payload in turn; a case's exception is its result. A transfer
    failure ends the batch (the group is out of step after it)."""
    meshes = mesh_groups(world)
    results = []
    for case in payload["cases"]:
        start = time.perf_counter()
        try:
            res = {"ok": True, "value": run_case(case, rank, world, meshes)}
        except ContextParallelError:
            raise
        except Exception as exc:
            res = {"ok": False, "type": type(exc).__name__, "message": str(exc)}
        res["seconds"] = time.perf_counter() - start
        results.append(res)
    return results


# -- failures -----------------------------------------------------------------------------


def _failing_local(fail_rank: int):
    def local(q, k, v, attn_bias=None, scale=None, causal_offset=None):
        if dist.get_rank() == fail_rank and q.shape[2] > 2:  # the (1, 1, 2, D) probe passes
            raise RuntimeError(f"injected failure in the local attention of rank {fail_rank}")
        return math_attention(q, k, v, attn_bias, scale, causal_offset)

    return local


def raise_in_local(rank: int, world: int, payload: dict):
    """Rank 1's local attention raises inside the ring; the others must end with an error
    too. Two training steps: a rank that got everything it needed from step 1 meets the
    failure at its next transfer."""
    q, k, v = (_leaf(t, True) for t in payload["qkv"])
    local = _failing_local(1)
    for _ in range(2):
        out = context_parallel_attention(q, k, v, ring_group=dist.group.WORLD, local=local)
        out.sum().backward()
    return "finished"


def stall(rank: int, world: int, payload: dict):
    """Rank 1 calls only after the group's timeout: rank 0 times out waiting, then rank 1
    finds rank 0 gone. Both end with an error."""
    q, k, v = (_leaf(t, False) for t in payload["qkv"])
    if rank == 1:
        time.sleep(payload["sleep"])
    context_parallel_attention(q, k, v, ring_group=dist.group.WORLD)
    return "finished"
