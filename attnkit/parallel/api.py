"""The public functions: ring attention, Ulysses, and both on a 2-D mesh.

Every rank passes its own shard of the sequence; shards may have any lengths (0 included).
Before any attention is computed, the ranks exchange one small row of numbers describing
their call (lengths, shapes, dtype, options, and whether they refuse it): every rank then
checks every other's, so a refusal, a mismatch between ranks, or a bad argument on one
rank makes every rank raise the same error at the same point instead of leaving the
others waiting. A local attention that raises after that point, on every rank or on some,
does not stop the transfers: every transfer of the call completes, then the ranks
exchange whether they finished and all raise together (the rank at fault its own error,
the others :class:`ContextParallelError`), and the groups stay usable for the next call.
A rank that stops calling, or dies, ends the others with :class:`ContextParallelError`
within the group's timeout.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

from .agree import _exchange
from .arguments import BIAS_SHARDINGS, _prepare  # noqa: F401  (BIAS_SHARDINGS is part of the API)
from .comm import ContextParallelError, all_reduce_max, finish_together
from .local import accum_dtype, math_attention, recenter_masked_rows
from .ring import RingAttention, RingJob, RingSchedule
from .rows import _KV_MODES
from .ulysses import HeadsToSeq, SeqToHeads, gather_bias

logger = logging.getLogger("attnkit.parallel")


def context_parallel_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    *,
    ring_group=None,
    ulysses_group=None,
    causal: bool = False,
    local: Callable = math_attention,
    return_lse: bool = False,
    kv_sharded: bool | str = True,
    bias_sharding: str = "query",
):
    """Attention over a sequence split across ranks: Ulysses inside ``ulysses_group``,
    ring attention across ``ring_group``, or both on a 2-D mesh.

    q: (B, H, M_r, D), k: (B, H, N_r, D), v: (B, H, N_r, Dv): this rank's shard of the
    sequence, any strides. The sequence is the shards in mesh order: ring rank major,
    ulysses rank minor (shard index = ring_rank * U + ulysses_rank), which is the order
    of a device mesh with dims ("ring", "ulysses") flattened. Lengths may differ between
    ranks, 0 included; nothing is padded.

    attn_bias: additive float (may hold -inf) or bool (True = attend), never requiring
    grad. With ``bias_sharding="query"`` (default) each rank passes the rows of its own
    queries against every key of the sequence, broadcastable to (B, H, M_r, N): for a
    key-padding mask (B, 1, 1, N) every rank passes the same whole mask; a full bias is
    sliced by query rows, bias[:, :, rows of this rank, :]. It costs no communication in
    ring attention (each block takes its columns) and, in Ulysses, only when it has a row
    per query (then each rank receives the rows of its heads). With
    ``bias_sharding="key"`` each rank passes the columns of its own keys, broadcast over
    queries: (B|1, H|1, 1, N_r), the key-sharded mask diffusers' sequence split produces;
    it travels with its keys. A query row whose keys are all masked gets zeros.

    kv_sharded=False: k and v are the whole key/value sequence on every rank (e.g. the 77
    text tokens of cross-attention): each rank attends its queries to them, with no
    communication but a check that all ranks hold the same k and v. Each rank's dk, dv
    is then its own queries' share (they sum to the whole gradient).
    kv_sharded="auto": for callers that cannot tell, such as diffusers' sequence split,
    which leaves some models' text tokens whole. k or v that differ between ranks (length
    or fingerprint) are shards. k and v the same on every rank (N keys) are either the
    whole key sequence or equal shards of a sequence of W * N keys (W ranks), and "auto"
    decides only by what tells the two apart, never by a guess:

    - a mask by query rows (``bias_sharding="query"``) has a column per key of the
      sequence: N columns, whole; W * N, shards; any other count is refused;
    - a key-sharded mask (``bias_sharding="key"``) that differs between ranks masks
      different keys: shards;
    - otherwise (no mask, or the same key mask on every rank) the two readings give the
      same output, and k and v are taken as whole (no transfer; each rank's dk, dv is
      its queries' share, and the shares sum to the gradient under either reading).
      What the two readings do not share is refused with a ValueError that says to pass
      kv_sharded=True or False: ``causal=True`` (a query sees the keys up to its position
      among N or among W * N) and ``return_lse=True`` (larger by log(W) over copies).

    causal: top-left on global positions (query i sees key j iff j <= i); in ring
    attention, blocks wholly above the diagonal are neither computed nor sent.

    local: the attention run on each piece, ``local(q, k, v, attn_bias, scale,
    causal_offset) -> (out, lse)`` (see :mod:`attnkit.parallel.local`); default
    :func:`math_attention`. scale defaults to D ** -0.5.

    Returns out (B, H, M_r, Dv) in q's dtype, and with return_lse=True also lse
    (B, H, M_r), float32 (float64 for float64 inputs), both differentiable in q, k, v.
    Raises ValueError on every rank for a refused call (naming the problem and, on the
    other ranks, the rank that refused). If the local attention raises on some ranks,
    forward or backward, every rank raises once the call's transfers are done: those
    ranks their own error, the others ContextParallelError; the groups stay usable.
    ContextParallelError also when a transfer fails (a rank died, or the group's timeout
    passed).
    """
    if kv_sharded not in _KV_MODES:
        raise ValueError(f"kv_sharded={kv_sharded!r}: True, False or 'auto'")
    if kv_sharded is False:
        bias_sharding = "query"  # the whole key sequence is here: rows and key columns coincide
    if ring_group is None and ulysses_group is None:
        raise ValueError("pass ring_group, ulysses_group or both (torch.distributed process groups)")
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("torch.distributed is not initialized: call torch.distributed.init_process_group first")
    call, problem = None, None
    try:
        call = _prepare(q, k, v, attn_bias, scale, bias_sharding, kv_sharded, local)
    except ValueError as exc:
        problem = str(exc)
    layout = _exchange(call, problem, q, k, causal, kv_sharded, return_lse, bias_sharding, ring_group, ulysses_group)
    q, k, v, bias, scale = call.q, call.k, call.v, call.bias, call.scale
    logger.debug(
        "context parallel call: ring %d x ulysses %d, ring rank %d, ulysses rank %d, queries %s, keys %s%s",
        layout.r_size,
        layout.u_size,
        layout.r_rank,
        layout.u_rank,
        layout.q_lens_r,
        layout.k_lens_r,
        ", k and v whole on every rank" if layout.kv_replicated else "",
    )
    if layout.kv_replicated:
        bias_sharding = "query"  # the whole key sequence is here: rows and key columns coincide
    if bias is not None:
        bias = _recenter(bias, bias_sharding, ring_group, ulysses_group, layout)

    if layout.kv_replicated:
        # no transfer, but a rank whose local attention raises must not leave the others
        # going on to their next call alone
        out, lse = _LocalTogether.apply(
            q,
            k,
            v,
            bias,
            functools.partial(_run_local, local, scale=scale, causal_offset=layout.q_offset if causal else None),
            (ring_group, ulysses_group),
            "the local attention on whole k and v",
        )
        return (out, lse) if return_lse else out

    U, R = layout.u_size, layout.r_size
    if U > 1:
        H = q.shape[1]
        q, k, v = SeqToHeads.apply(
            [layout.q_lens_u, layout.k_lens_u, layout.k_lens_u], ulysses_group, layout.u_rank, q, k, v
        )
        if bias is not None:
            per_head = bias.shape[1] > 1
            if bias_sharding == "key":
                bias = gather_bias(bias, "keys", per_head, layout.k_lens_u, ulysses_group, layout.u_rank, U, H)
            elif layout.bias_rows_mode:
                rows = bias.expand(bias.shape[0], bias.shape[1], layout.q_lens_u[layout.u_rank], bias.shape[3])
                bias = gather_bias(rows, "rows", per_head, layout.q_lens_u, ulysses_group, layout.u_rank, U, H)
            else:
                bias = gather_bias(bias, "broadcast", per_head, layout.q_lens_u, ulysses_group, layout.u_rank, U, H)
    if R > 1:
        sched = RingSchedule(
            R,
            layout.r_rank,
            tuple(layout.q_lens_r),
            tuple(layout.k_lens_r),
            _prefix(layout.q_lens_r),
            _prefix(layout.k_lens_r),
            bool(causal),
        )
        job = RingJob(ring_group, sched, local, scale, finish_groups=(ring_group, ulysses_group) if U > 1 else ())
        if bias is not None and bias_sharding == "key":
            job.bias_keys, job.bias_keys_shape, job.bias_keys_dtype = bias, (bias.shape[0], bias.shape[1]), bias.dtype
        else:
            job.bias_rows = bias
        out, lse = RingAttention.apply(q, k, v, job)
    else:
        # between Ulysses' two all-to-alls: a rank whose local attention raises must not
        # leave the others waiting in the second one
        out, lse = _LocalTogether.apply(
            q,
            k,
            v,
            bias,
            functools.partial(_run_local, local, scale=scale, causal_offset=0 if causal else None),
            (ulysses_group,),
            "the local attention between Ulysses' all-to-alls",
        )
    if U > 1:
        if return_lse:
            out, lse = HeadsToSeq.apply([layout.q_lens_u] * 2, ulysses_group, layout.u_rank, out, lse.unsqueeze(-1))
            lse = lse.squeeze(-1)
        else:
            (out,) = HeadsToSeq.apply([layout.q_lens_u], ulysses_group, layout.u_rank, out)
    return (out, lse) if return_lse else out


def _recenter(bias, bias_sharding, ring_group, ulysses_group, layout):
    """Rows masked everywhere with a finite value, shifted to a max of 0 (see
    :func:`attnkit.parallel.local.recenter_masked_rows`). A row of a query-sharded bias
    is whole on its rank; a key-sharded one needs the max over every rank's keys."""
    if bias.shape[-1] == 0:
        row_max = torch.full(bias.shape[:-1] + (1,), float("-inf"), dtype=bias.dtype, device=bias.device)
    else:
        row_max = bias.amax(dim=-1, keepdim=True)
    if bias_sharding == "key":
        row_max = row_max.to(torch.promote_types(bias.dtype, torch.float32)).contiguous()
        if layout.u_size > 1:
            all_reduce_max(row_max, ulysses_group, "max of attn_bias's rows (ulysses group)")
        if layout.r_size > 1:
            all_reduce_max(row_max, ring_group, "max of attn_bias's rows (ring group)")
    return recenter_masked_rows(bias, row_max)


def _prefix(lens: Sequence[int]) -> tuple[int, ...]:
    out, at = [], 0
    for n in lens:
        out.append(at)
        at += n
    return tuple(out)


class _Empty(torch.autograd.Function):
    """out = 0 (B, H, M, Dv), lse = -inf: attention with no query or no key; zero gradients."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.like = [(t.shape, t.dtype, t.device) for t in (q, k, v)]
        B, H, M, _ = q.shape
        out = torch.zeros(B, H, M, v.shape[-1], dtype=q.dtype, device=q.device)
        lse = torch.full((B, H, M), float("-inf"), dtype=accum_dtype(q.dtype), device=q.device)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        return tuple(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.like)


def _run_local(local, q, k, v, bias, scale, causal_offset):
    """One local call, or the empty answer when there is nothing to attend."""
    if q.shape[2] == 0 or k.shape[2] == 0:
        return _Empty.apply(q, k, v)
    got = local(q, k, v, bias, scale, causal_offset)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise ValueError(f"local attention returned {type(got).__name__}, not (out, lse)")
    return got[0], got[1]


class _LocalTogether(torch.autograd.Function):
    """run(q, k, v, bias) -> (out, lse), forward and backward, after which the ranks of
    ``groups`` finish together (:func:`finish_together`): all raise, or none (``what``
    names the step in the error). The local attention's own graph is kept and
    differentiated in backward, so the gradients are autograd's: the bias's too, a second
    backward (retain_graph=True) and a double backward (create_graph=True, a gradient
    penalty) as without the wrapper."""

    @staticmethod
    def forward(ctx, q, k, v, bias, run, groups, what):
        ctx.groups, ctx.what, ctx.run = groups, what, run
        ctx.save_for_backward(q, k, v, bias)
        ctx.graph = None
        failure, out, lse = None, None, None
        grad = any(ctx.needs_input_grad[:4])
        try:
            with torch.enable_grad() if grad else contextlib.nullcontext():
                leaves = [
                    None if t is None else t.detach().requires_grad_(t.requires_grad and grad) for t in (q, k, v, bias)
                ]
                out, lse = run(*leaves)
            ctx.graph = (leaves, out, lse)
        except Exception as exc:  # every rank raises it, or ContextParallelError
            failure = exc
        finish_together(groups, failure, "forward", what, q.device)
        return out.detach(), lse.detach()

    @staticmethod
    def backward(ctx, dout, dlse):
        leaves, out, lse = ctx.graph
        failure, grads = None, [None, None, None, None]
        try:
            if not lse.requires_grad and dlse is not None and bool((dlse != 0).any()):
                raise ValueError(
                    "the local attention returned a log-sum-exp without a gradient, and the call's lse has one: "
                    "choose a local attention whose lse is differentiable (math_attention's is)"
                )
            inputs = leaves
            if torch.is_grad_enabled():
                # create_graph=True: the gradients must be functions of the call's own inputs,
                # so the local attention runs again on them (the kept graph starts at copies)
                inputs = list(ctx.saved_tensors)
                with torch.enable_grad():
                    out, lse = ctx.run(*inputs)
            pairs = [(t, g) for t, g in ((out, dout), (lse, dlse)) if t.requires_grad and g is not None]
            wanted = [i for i, t in enumerate(leaves) if t is not None and t.requires_grad]
            if pairs and wanted:
                got = torch.autograd.grad(
                    [t for t, _ in pairs],
                    [inputs[i] for i in wanted],
                    [g.to(t.dtype) for t, g in pairs],
                    allow_unused=True,
                    retain_graph=True,
                    create_graph=torch.is_grad_enabled(),
                )
                for i, g in zip(wanted, got):
                    grads[i] = torch.zeros_like(leaves[i]) if g is None else g
        except Exception as exc:  # every rank raises it, or ContextParallelError
            failure = exc
        finish_together(ctx.groups, failure, "backward", ctx.what, leaves[0].device)
        return grads[0], grads[1], grads[2], grads[3], None, None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    *,
    group,
    causal: bool = False,
    local: Callable = math_attention,
    return_lse: bool = False,
    kv_sharded: bool | str = True,
    bias_sharding: str = "query",
):
    """Ring attention over ``group``: key/value blocks go round the ring, each rank keeps
    its queries. Any number of heads, any shard lengths.

    q: (B, H, M_r, D), k: (B, H, N_r, D), v: (B, H, N_r, Dv), this rank's shard, shards in
    the group's rank order. Returns out (B, H, M_r, Dv) [and lse (B, H, M_r)]. Every
    argument as in :func:`context_parallel_attention`.
    """
    return context_parallel_attention(
        q,
        k,
        v,
        attn_bias,
        scale,
        ring_group=group,
        causal=causal,
        local=local,
        return_lse=return_lse,
        kv_sharded=kv_sharded,
        bias_sharding=bias_sharding,
    )


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_bias: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    *,
    group,
    causal: bool = False,
    local: Callable = math_attention,
    return_lse: bool = False,
    kv_sharded: bool | str = True,
    bias_sharding: str = "query",
):
    """Ulysses attention over ``group``: an all-to-all gives each rank the whole sequence
    for H / U of the heads (U = group size, which must divide H), the local attention
    runs once, and a second all-to-all returns each rank its own rows.

    q: (B, H, M_r, D), k: (B, H, N_r, D), v: (B, H, N_r, Dv), this rank's shard, shards in
    the group's rank order, any lengths. Returns out (B, H, M_r, Dv) [and lse (B, H, M_r)].
    Every argument as in :func:`context_parallel_attention`.
    """
    return context_parallel_attention(
        q,
        k,
        v,
        attn_bias,
        scale,
        ulysses_group=group,
        causal=causal,
        local=local,
        return_lse=return_lse,
        kv_sharded=kv_sharded,
        bias_sharding=bias_sharding,
    )


__all__ = ["ContextParallelError", "context_parallel_attention", "ring_attention", "ulysses_attention"]
