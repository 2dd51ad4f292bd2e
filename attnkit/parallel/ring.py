"""Ring attention: key/value blocks travel round a ring of ranks while each rank keeps its
queries; partial results over each block merge exactly through their log-sum-exp.

Forward, rank r at step s holds the key/value block of rank (r - s) mod P. It starts the
transfer of that block to rank r + 1 (and the receipt of the next one from rank r - 1),
computes its queries against the block while the bytes move, merges, and waits.

Backward runs the same ring again: the blocks travel as before, and with each block
travels the float32 accumulator of its dK/dV. Every rank adds its queries' contribution and
passes the accumulator on; the last rank that needs a block sends the accumulator home,
where the owner adds its own share.
Each block's contribution is computed by differentiating the local attention itself
(its out and its lse) with the exact chain rule of the merge:

    out = sum_j w_j out_j,   lse = logsumexp_j lse_j,   w_j = exp(lse_j - lse)
    d out_j = w_j dO
    d lse_j = w_j (<dO, out_j - out> + dLSE)

so any local attention that is differentiable through (out, lse) gets exact gradients.
Sums run in a fixed order on every rank: the same bits every run.

Causal attention (top-left, on global positions) skips blocks wholly above the diagonal,
and a block is passed on only while a rank further along the ring needs it: every rank
derives the same schedule from the lengths all ranks exchanged, so sends and receipts
always pair up.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .comm import Spec, finish_together, p2p, pack, packed_size, unpack, wait_all
from .local import accum_dtype, merge_partials

logger = logging.getLogger("attnkit.parallel")


@dataclass(frozen=True)
class RingSchedule:
    """Who holds, computes and sends which block at which step; identical on every rank.

    q_lens / k_lens: per ring rank, its query and key counts; q_offs / k_offs: their
    global positions (the sequence is the ranks' shards in ring order).
    """

    size: int
    rank: int
    q_lens: tuple[int, ...]
    k_lens: tuple[int, ...]
    q_offs: tuple[int, ...]
    k_offs: tuple[int, ...]
    causal: bool

    def needs(self, rank: int, src: int) -> bool:
        """Rank ``rank``'s queries see at least one key of block ``src``."""
        if self.q_lens[rank] == 0 or self.k_lens[src] == 0:
            return False
        if not self.causal:
            return True
        # the block's first key is at or before the rank's last query
        return self.k_offs[src] <= self.q_offs[rank] + self.q_lens[rank] - 1

    def causal_offset(self, rank: int, src: int) -> Optional[int]:
        """The local attention's causal_offset for this block: None when every query
        sees every key of it (or not causal)."""
        if not self.causal:
            return None
        if self.k_offs[src] + self.k_lens[src] - 1 <= self.q_offs[rank]:
            return None
        return self.q_offs[rank] - self.k_offs[src]

    @functools.cached_property
    def reach(self) -> tuple[int, ...]:
        """For each block, the last step at which a rank still needs it (0: it never
        leaves its owner)."""
        out = []
        for src in range(self.size):
            last = 0
            for s in range(1, self.size):
                if self.needs((src + s) % self.size, src):
                    last = s
            out.append(last)
        return tuple(out)

    def src_at(self, s: int) -> int:
        return (self.rank - s) % self.size

    def holds(self, s: int) -> bool:
        return self.reach[self.src_at(s)] >= s

    def sends(self, s: int) -> bool:
        return self.holds(s) and self.reach[self.src_at(s)] > s

    def receives(self, s: int) -> bool:
        return s + 1 < self.size and self.reach[self.src_at(s + 1)] >= s + 1

    @property
    def next(self) -> int:
        return (self.rank + 1) % self.size

    @property
    def prev(self) -> int:
        return (self.rank - 1) % self.size


@dataclass
class RingJob:
    """Everything one ring call needs besides q, k, v.

    bias_rows: this rank's query rows against all keys of the ring (B', H', M|1, N_ring),
    sliced per block (no communication), or None. bias_keys: this rank's own key columns
    (B', H', 1, N_r), sent round the ring with its block, or None.
    """

    group: object
    schedule: RingSchedule
    local: Callable
    scale: float
    bias_rows: Optional[torch.Tensor] = None
    bias_keys: Optional[torch.Tensor] = None
    bias_keys_shape: Optional[tuple[int, int]] = None  # (B', H') of every rank's key bias
    bias_keys_dtype: Optional[torch.dtype] = None
    # the groups whose ranks must all raise when one rank's local attention raises: the
    # ring group, and on a 2-D mesh the ulysses group too (its all-to-all comes next)
    finish_groups: tuple = ()

    @property
    def groups(self) -> tuple:
        return self.finish_groups or (self.group,)


def _tag(kind: str, s: int, size: int) -> int:
    # Distinct tags keep the transfers of one call apart on backends that match by tag.
    return {"kv": 0, "grad": 1, "home": 2}[kind] * (size + 1) + s


def _kv_specs(job: RingJob, src: int, q: torch.Tensor, head_dim: int, v_dim: int) -> list[Spec]:
    B, H = q.shape[0], q.shape[1]
    n = job.schedule.k_lens[src]
    specs = [Spec((B, H, n, head_dim), q.dtype), Spec((B, H, n, v_dim), q.dtype)]
    if job.bias_keys_shape is not None:
        bb, bh = job.bias_keys_shape
        specs.append(Spec((bb, bh, 1, n), job.bias_keys_dtype))
    return specs


def _own_block(job: RingJob, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
    return [k, v] + ([job.bias_keys] if job.bias_keys is not None else [])


def _block_bias(job: RingJob, src: int, block: list[torch.Tensor]) -> Optional[torch.Tensor]:
    if job.bias_keys_shape is not None:
        return block[2]
    if job.bias_rows is None:
        return None
    start = job.schedule.k_offs[src]
    return job.bias_rows[..., start : start + job.schedule.k_lens[src]]


def _checked(local_out, q: torch.Tensor, v_dim: int, name: str):
    if not isinstance(local_out, (tuple, list)) or len(local_out) != 2:
        raise ValueError(f"local attention {name} returned {type(local_out).__name__}, not (out, lse)")
    o, lse = local_out
    B, H, M = q.shape[:3]
    if tuple(o.shape) != (B, H, M, v_dim) or tuple(lse.shape) != (B, H, M):
        raise ValueError(
            f"local attention {name} returned out {tuple(o.shape)} and lse {tuple(lse.shape)}; "
            f"expected ({B}, {H}, {M}, {v_dim}) and ({B}, {H}, {M})"
        )
    return o, lse


def _name(local: Callable) -> str:
    return getattr(local, "__qualname__", None) or type(local).__name__


def ring_forward(q, k, v, job: RingJob) -> tuple[torch.Tensor, torch.Tensor]:
    """out (B, H, M, Dv) and lse (B, H, M), both in the accumulation dtype.

    A local attention that raises on some ranks does not stop the ring there: that rank
    computes nothing more but keeps passing blocks on, so that every transfer of the call
    completes on every rank; then all ranks raise together (see :func:`finish_together`).
    """
    sched = job.schedule
    B, H, M, D = q.shape
    Dv = v.shape[-1]
    adt = accum_dtype(q.dtype)
    out = torch.zeros(B, H, M, Dv, dtype=adt, device=q.device)
    lse = torch.full((B, H, M), float("-inf"), dtype=adt, device=q.device)
    first = True
    failure, failed_at = None, ""
    cur = pack(_own_block(job, k, v)) if sched.sends(0) else None
    for s in range(sched.size):
        src = sched.src_at(s)
        ops, nxt = [], None
        if sched.receives(s):
            nxt = torch.empty(
                packed_size(_kv_specs(job, sched.src_at(s + 1), q, D, Dv)), dtype=torch.uint8, device=q.device
            )
            ops.append(("recv", nxt, sched.prev, _tag("kv", s, sched.size), "ring-kv"))
        if sched.sends(s):
            ops.append(("send", cur, sched.next, _tag("kv", s, sched.size), "ring-kv"))
        works = p2p(ops, job.group, f"ring attention forward, step {s}")
        try:
            if failure is None and sched.holds(s) and sched.needs(sched.rank, src):
                block = _own_block(job, k, v) if s == 0 else unpack(cur, _kv_specs(job, src, q, D, Dv))
                o, l = _checked(
                    job.local(
                        q,
                        block[0],
                        block[1],
                        _block_bias(job, src, block),
                        job.scale,
                        sched.causal_offset(sched.rank, src),
                    ),
                    q,
                    Dv,
                    _name(job.local),
                )
                if first:
                    out, lse, first = o.to(adt), l.to(adt), False
                else:
                    out, lse = merge_partials(out, lse, o, l)
        except Exception as exc:  # every rank raises it, or ContextParallelError, after the ring
            failure, failed_at = exc, f"step {s}"
        finally:
            wait_all(
                works, f"ring attention forward, step {s}: transfer with rank {sched.prev} / {sched.next} of the ring"
            )
        cur = nxt
    finish_together(job.groups, failure, failed_at, "ring attention forward", q.device)
    return out.to(adt), lse.to(adt)


def _block_grads(job, q, block, src, out, lse, dout, dlse):
    """(dq, dk, dv) of this rank's queries against one block, in the accumulation dtype."""
    sched = job.schedule
    adt = out.dtype
    with torch.enable_grad():
        qq = q.detach().requires_grad_(True)
        kk = block[0].detach().requires_grad_(True)
        vv = block[1].detach().requires_grad_(True)
        o, l = _checked(
            job.local(qq, kk, vv, _block_bias(job, src, block), job.scale, sched.causal_offset(sched.rank, src)),
            q,
            vv.shape[-1],
            _name(job.local),
        )
        l_d = l.detach().to(adt)
        alive = ~torch.isneginf(l_d)
        w = torch.where(alive, torch.exp(torch.where(alive, l_d - lse, torch.zeros_like(l_d))), torch.zeros_like(l_d))
        g_o = (w.unsqueeze(-1) * dout).to(o.dtype)
        g_l = w * ((dout * (o.detach().to(adt) - out)).sum(-1) + dlse)
        grads = torch.autograd.grad((o, l), (qq, kk, vv), (g_o, g_l.to(l.dtype)), allow_unused=True)
    return [torch.zeros_like(t, dtype=adt) if g is None else g.to(adt) for g, t in zip(grads, (qq, kk, vv))]


def ring_backward(q, k, v, out, lse, dout, dlse, job: RingJob):
    """(dq, dk, dv) for this rank's q, k, v, in their dtypes."""
    sched = job.schedule
    B, H, M, D = q.shape
    Dv = v.shape[-1]
    adt = out.dtype
    P = sched.size
    dout = dout.to(adt)
    dlse = torch.zeros_like(lse) if dlse is None else dlse.to(adt)
    dq = torch.zeros(B, H, M, D, dtype=adt, device=q.device)

    def grad_spec(src: int) -> Spec:
        return Spec((B, H, sched.k_lens[src], D + Dv), adt)

    # Every step's transfers go out as one batch, matched by the neighbours' batch of the
    # same step (on NCCL a batch is one group, and batches run in order on one stream): the
    # blocks moving on, the accumulator of this step's block coming in, and the accumulator
    # of the previous step's block going out. A block's owner keeps its own share and adds
    # it when the accumulator comes home, so an accumulator makes reach - 1 hops plus one
    # home, not reach + 1.
    own = None  # this rank's share of its own block's dK/dV
    failure, failed_at = None, ""
    carry = None  # the previous step's accumulator, for the next rank
    going_home: list[tuple[torch.Tensor, int]] = []
    cur = pack(_own_block(job, k, v)) if sched.sends(0) else None
    for s in range(P):
        src = sched.src_at(s)
        ops, nxt, acc_in = [], None, None
        if sched.receives(s):
            nxt = torch.empty(
                packed_size(_kv_specs(job, sched.src_at(s + 1), q, D, Dv)), dtype=torch.uint8, device=q.device
            )
            ops.append(("recv", nxt, sched.prev, _tag("kv", s, P), "ring-kv"))
        if sched.sends(s):
            ops.append(("send", cur, sched.next, _tag("kv", s, P), "ring-kv"))
        if sched.holds(s) and s > 1:
            acc_in = torch.empty(packed_size([grad_spec(src)]), dtype=torch.uint8, device=q.device)
            ops.append(("recv", acc_in, sched.prev, _tag("grad", s, P), "ring-grad"))
        if carry is not None:
            ops.append(("send", carry, sched.next, _tag("grad", s, P), "ring-grad"))
        works = p2p(ops, job.group, f"ring attention backward, step {s}")
        grads = None
        try:
            if failure is None and sched.holds(s) and sched.needs(sched.rank, src):
                block = _own_block(job, k, v) if s == 0 else unpack(cur, _kv_specs(job, src, q, D, Dv))
                grads = _block_grads(job, q, block, src, out, lse, dout, dlse)
                dq += grads[0]
        except Exception as exc:  # the accumulators still travel on; every rank raises after the ring
            failure, failed_at, grads = exc, f"step {s}", None
        finally:
            wait_all(
                works, f"ring attention backward, step {s}: transfer with rank {sched.prev} / {sched.next} of the ring"
            )
        carry = None
        if s == 0:
            if grads is not None:
                own = torch.cat([grads[1], grads[2]], dim=-1)
        elif sched.holds(s):
            if s > 1:
                acc = unpack(acc_in, [grad_spec(src)])[0]
            else:
                acc = torch.zeros(grad_spec(src).shape, dtype=adt, device=q.device)
            if grads is not None:
                acc[..., :D] += grads[1]
                acc[..., D:] += grads[2]
            if sched.sends(s):
                carry = as_buffer(acc)
            else:
                going_home.append((as_buffer(acc), src))  # the last rank that needs a block
        cur = nxt
    # Accumulators go home in one last batch.
    ops = [("send", buf, dst, _tag("home", 0, P), "ring-grad") for buf, dst in going_home]
    home = None
    if sched.reach[sched.rank] > 0:
        holder = (sched.rank + sched.reach[sched.rank]) % P
        home = torch.empty(packed_size([grad_spec(sched.rank)]), dtype=torch.uint8, device=q.device)
        ops.append(("recv", home, holder, _tag("home", 0, P), "ring-grad"))
    wait_all(p2p(ops, job.group, "ring attention backward, last step"), "ring attention backward: sending dK/dV home")
    finish_together(job.groups, failure, failed_at, "ring attention backward", q.device)
    final = own
    if home is not None:
        arrived = unpack(home, [grad_spec(sched.rank)])[0]
        final = arrived if final is None else final + arrived
    if final is None:
        final = torch.zeros(grad_spec(sched.rank).shape, dtype=adt, device=q.device)
    return dq.to(q.dtype), final[..., :D].to(k.dtype), final[..., D:].to(v.dtype)


def as_buffer(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


class RingAttention(torch.autograd.Function):
    """(out, lse) of ring attention; differentiable in q, k, v through both."""

    @staticmethod
    def forward(ctx, q, k, v, job: RingJob):
        out, lse = ring_forward(q, k, v, job)
        ctx.job = job
        ctx.save_for_backward(q, k, v, out, lse)
        return out.to(q.dtype), lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(q, k, v, out, lse, dout, dlse, ctx.job)
        return dq, dk, dv, None
