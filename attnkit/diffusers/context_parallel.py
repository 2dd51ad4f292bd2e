"""diffusers' context parallelism (``enable_parallelism``) served by attnkit.

diffusers splits the sequence across ranks with its ``_cp_plan`` hooks and hands the
attention backend this rank's shard plus a ``ParallelConfig`` naming the ring and
Ulysses meshes. attnkit's diffusers backend passes that call here: the local attention
on every block is chosen by the same decision as every other attnkit call (auto()'s
walk, among backends that return the log-sum-exp), and the shards are combined by
:func:`attnkit.parallel.context_parallel_attention`, which takes masks, causal
attention, any sequence length and a backward.

How diffusers' split reaches us: a tensor its plan splits arrives as this rank's rows; a
tensor it leaves whole (Wan's text tokens) arrives whole on every rank, so whether k and
v are sharded is found by comparing them across ranks (``kv_sharded="auto"``); a mask
its plan splits holds this rank's key columns (``bias_sharding="key"``), one it leaves
whole holds every key (``"query"``).

:func:`enable_parallelism` is diffusers' ``model.enable_parallelism`` with what a
machine without an accelerator, on gloo, lacks filled in (diffusers 0.42.1 assumes an
accelerator and NCCL).
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import torch

from ..masks import expand_kv_heads, to_additive_bias
from ..parallel.api import context_parallel_attention
from . import hooks, hooks_base

WHO = "a context-parallel shard"


def local_attention_for(chooser):
    """The local attention contract of attnkit.parallel, served by ``chooser`` (it takes
    only backends that return the log-sum-exp)."""

    def local(q, k, v, attn_bias, scale, causal_offset=None):
        return chooser.attention(WHO, q, k, v, attn_bias, scale, False, causal_offset=causal_offset, return_lse=True)

    local.__qualname__ = f"attnkit chooser {type(chooser).__name__}"
    return local


def context_parallel(
    chooser, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, parallel_config: Any
):
    """dispatch_attention_fn's call under diffusers' context parallelism: (B, S, H, D)
    shards in, (B, S, H, Dv) out [and lse (B, S, H)]."""
    if dropout_p:
        raise ValueError(
            f"dropout_p={dropout_p} under context parallelism: attnkit's context parallelism has no dropout "
            "(call the model in eval mode, or without enable_parallelism)"
        )
    cp = getattr(parallel_config, "context_parallel_config", None)
    if cp is None:
        raise ValueError("diffusers passed a ParallelConfig without a context_parallel_config")
    ring = cp._ring_mesh.get_group() if cp.ring_degree > 1 else None
    ulysses = cp._ulysses_mesh.get_group() if cp.ulysses_degree > 1 else None
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    k, v = expand_kv_heads(q, k, v, enable_gqa)
    bias = _bias(attn_mask, q, k)
    by_key = bias is not None and bias.shape[-1] == k.shape[-2] and bias.shape[-2] == 1
    # return_lse only when asked: with k and v the same on every rank, 'auto' takes them as
    # whole, and refuses the log-sum-exp (which the other reading, copies, would change)
    got = context_parallel_attention(
        q,
        k,
        v,
        bias,
        scale,
        ring_group=ring,
        ulysses_group=ulysses,
        causal=bool(is_causal),
        local=local_attention_for(chooser),
        return_lse=bool(return_lse),
        kv_sharded="auto",
        bias_sharding="key" if by_key else "query",
    )
    if return_lse:
        out, lse = got
        return out.transpose(1, 2), lse.transpose(1, 2)
    return got.transpose(1, 2)


def _bias(attn_mask, q: torch.Tensor, k: torch.Tensor):
    """The mask as an additive bias; a key-padding mask's key count is the shard's or
    the whole sequence's, whichever this rank was given."""
    if attn_mask is None:
        return None
    if attn_mask.dim() == 2 and attn_mask.shape[0] == q.shape[0]:
        attn_mask = attn_mask[:, None, None, :]  # (B, N) key padding, N local or whole
    if attn_mask.shape[-1] != k.shape[-2]:
        # a mask over the whole sequence's keys (bias_sharding="query"): checked and made
        # additive by context_parallel_attention
        return attn_mask
    return to_additive_bias(attn_mask, q.dtype, (*q.shape[:3], k.shape[-2]))


# -- enable_parallelism on any machine -------------------------------------------------------


def enable_parallelism(model, config, *, cp_plan: Optional[dict] = None) -> None:
    """``model.enable_parallelism(config=config, cp_plan=cp_plan)``, also on a machine
    without an accelerator, over gloo (``torch.distributed.init_process_group("gloo")``).

    diffusers (0.42.1) assumes an accelerator and NCCL in three places; this fills them
    in where they are missing, and changes nothing on a GPU machine with NCCL:

    - ``ModelMixin._resolve_parallel_config`` computes ``rank % torch.accelerator.device_count()``,
      0 without an accelerator: ZeroDivisionError. During this call only,
      ``torch.accelerator.device_count()`` reads 1 there (the one device, the CPU); it is
      restored before this returns.
    - Its "anything" split gathers unequal shards with ``dist.all_gather``, which gloo
      refuses, and its split hook logs through ``logger.warning_once``, which only
      transformers adds: both filled in by the hook ``hooks.GLOO``
      (attnkit/diffusers/hooks_parallel.py), installed here the first time and taken out
      by ``hooks.uninstall()``.

    Raises RuntimeError naming the diffusers version if the hook cannot be installed
    (what diffusers lacks).
    """
    if not hooks.install_on_demand(hooks.GLOO):
        raise RuntimeError(
            f"attnkit's enable_parallelism cannot run on diffusers {hooks_base.diffusers_version()}: "
            f"{hooks.GLOO.problem} (written against diffusers 0.42.1); on GPUs with NCCL call "
            "model.enable_parallelism(config=...) directly"
        )
    with _one_device_without_accelerator():
        model.enable_parallelism(config=config, cp_plan=cp_plan)


@contextlib.contextmanager
def _one_device_without_accelerator():
    if torch.accelerator.device_count() > 0:
        yield
        return
    original = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = original


__all__ = ["context_parallel", "enable_parallelism", "local_attention_for"]
