"""Masks as additive biases, written once for every route and backend.

Every caller that takes a mask (diffusers' ``attention_mask``, dispatch_attention_fn's and
torch SDPA's ``attn_mask``, context parallelism's ``attn_bias``, the float64 reference)
turns it into what the backends compute with, an additive float bias, here:
:func:`to_additive_bias`. A boolean mask means True = attend (torch SDPA's convention)
and becomes 0 / -inf once; a float mask is already additive and is returned as it is.
Broadcast dimensions keep size 1: a mask is never expanded in memory here.

The callers keep their own words: each passes the messages its users read (naming the
argument they gave), formatted only when a mask is refused.
"""

from __future__ import annotations

import functools
import weakref

import torch

from .text import describe_module

# dispatch_attention_fn's attn_mask (diffusers' native backend reads it as torch SDPA does)
SHAPE_ERROR = (
    "attn_mask of shape {shape} does not broadcast to (batch={full[0]}, heads={full[1]}, "
    "queries={full[2]}, keys={full[3]}); pass (batch, keys) or a mask broadcastable to (batch, heads, queries, keys)"
)
DTYPE_ERROR = "attn_mask has dtype {dtype}; pass a boolean mask (True = attend) or an additive float one"


def to_additive_bias(
    mask: torch.Tensor,
    dtype: torch.dtype,
    full: tuple[int, ...] | None = None,
    *,
    key_padding: bool = False,
    shape_error: str = SHAPE_ERROR,
    dtype_error: str = DTYPE_ERROR,
    who=None,
) -> torch.Tensor:
    """``mask`` as an additive bias: boolean (True = attend) as 0 / -inf in ``dtype``,
    additive float as it is; any other dtype is refused with ``dtype_error``.

    full: the shape the bias must broadcast to, from the right as torch SDPA broadcasts a
    mask; the bias then has ``len(full)`` dims, broadcast ones of size 1 (a mask that does
    not broadcast is refused with ``shape_error``). None: the mask's shape is the caller's
    business, kept as it is.
    key_padding: a 2-D mask of shape (full's batch, full's keys) is key padding,
    (B, N) -> (B, 1, 1, N), as diffusers' native backend reads it.
    The messages are format strings: ``{shape}`` (the mask's), ``{full}``, ``{dtype}``
    and ``{who}`` (:func:`~attnkit.text.describe_module` of ``who``).
    """
    shaped = _broadcast(mask, full, key_padding, shape_error, who)
    return _converted(mask, shaped, dtype, full, dtype_error, who)


def route_bias(
    mask: torch.Tensor,
    dtype: torch.dtype,
    full: tuple[int, ...] | None = None,
    *,
    key_padding: bool = False,
    shape_error: str = SHAPE_ERROR,
    dtype_error: str = DTYPE_ERROR,
    who=None,
) -> torch.Tensor | None:
    """:func:`to_additive_bias` for a route's call, or None, once the shape is checked,
    for a mask that attends to every key (:func:`hides_nothing`): the call is the same
    without it, and auto() may choose a mask-free kernel."""
    shaped = _broadcast(mask, full, key_padding, shape_error, who)
    if hides_nothing(mask):
        return None
    return _converted(mask, shaped, dtype, full, dtype_error, who)


def _broadcast(mask, full, key_padding, shape_error, who) -> torch.Tensor:
    if full is None:
        return mask
    given = mask
    if key_padding and mask.dim() == 2 and mask.shape[0] == full[0] and mask.shape[1] == full[-1]:
        mask = mask[:, None, None, :]
    if mask.dim() > len(full) or any(got not in (1, want) for got, want in zip(mask.shape[::-1], full[::-1])):
        raise ValueError(_say(shape_error, given, full, who))
    while mask.dim() < len(full):
        mask = mask.unsqueeze(0)
    return mask


def _converted(given, mask, dtype, full, dtype_error, who) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return keep_to_bias(mask, dtype)
    if not mask.is_floating_point():
        raise ValueError(_say(dtype_error, given, full, who))
    return mask


def hidden_to_bias(hidden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask of what is hidden (True = ignore, as a causal mask says it) as an
    additive bias in ``dtype`` on its device: 0 where seen, -inf where hidden."""
    return torch.zeros(hidden.shape, dtype=dtype, device=hidden.device).masked_fill_(hidden, float("-inf"))


def keep_to_bias(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask of what is attended (True = attend, torch SDPA's convention) as an
    additive bias in ``dtype`` on its device: 0 where kept, -inf elsewhere. One
    ``torch.where`` between two cached scalars, where :func:`hidden_to_bias` takes three
    operations (a key-padding mask is converted on every attention call of a model)."""
    if torch.compiler.is_compiling():  # no module-level tensors inside a graph
        return hidden_to_bias(~keep, dtype)
    key = (dtype, keep.device)
    ends = _ENDS.get(key)
    if ends is None:
        with torch.inference_mode(False):  # usable outside inference mode too
            ends = (
                torch.zeros((), dtype=dtype, device=keep.device),
                torch.full((), float("-inf"), dtype=dtype, device=keep.device),
            )
        _ENDS[key] = ends
    return torch.where(keep, *ends)


# (dtype, device) -> (0, -inf) as 0-dim tensors, for keep_to_bias: bounded by the dtypes and
# devices a process uses; never stale (constants).
_ENDS: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def hides_nothing(mask) -> bool:
    """Whether a mask attends to every key: a boolean mask all True, or an additive float
    mask all zero. Such a mask is dropped by the routes (the call is the same without
    it), so auto() may choose a mask-free kernel. Checked once per mask object (one host
    sync) and kept while the tensor is not changed in place (its version counter).

    False, with nothing read, for what cannot be checked once: under torch.compile, a
    tensor subclass or a fake or meta tensor, a mask that needs a gradient (its gradient
    is owed), an inference-mode tensor (it has no version counter, so an in-place change
    could not be seen), and an empty mask."""
    if torch.compiler.is_compiling():  # first: nothing below is read while traced
        return False
    if (
        type(mask) is not torch.Tensor
        or mask.requires_grad
        or mask.is_inference()
        or mask.device.type == "meta"
        or mask.numel() == 0
    ):
        return False
    version = mask._version
    seen = _SEEN.get(id(mask))
    if seen is not None and seen[0]() is mask and seen[1] == version:
        return seen[2]
    if mask.dtype == torch.bool:
        answer = bool(mask.all())
    elif mask.is_floating_point():
        answer = not bool(mask.any())  # -0.0 is zero too
    else:
        return False  # refused by the conversion, with its message
    key = id(mask)
    _SEEN[key] = (weakref.ref(mask, functools.partial(_forget, key)), version, answer)
    return answer


def _forget(key: int, _ref) -> None:
    _SEEN.pop(key, None)


# id(mask) -> (a weak reference to the mask, its version counter when checked, the
# answer): holds no mask, and an entry leaves with its mask, so the table is bounded by
# the masks alive; stale once the mask changes in place (a new version), and keyed by
# identity (a tensor's == is elementwise).
_SEEN: dict[int, tuple] = {}


def _say(template: str, mask: torch.Tensor, full, who) -> str:
    return template.format(
        shape=tuple(mask.shape), full=full, dtype=mask.dtype, who=describe_module(who) if "{who}" in template else ""
    )


def expand_kv_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enable_gqa: bool):
    """k and v with q's head count: grouped-query attention (each of H_kv key/value heads
    serves H / H_kv query heads) as torch SDPA's enable_gqa computes it."""
    h, hk = q.shape[1], k.shape[1]
    if h == hk:
        return k, v
    if not enable_gqa or h % hk:
        raise ValueError(
            f"query has {h} heads and key/value {hk}: grouped-query attention needs enable_gqa=True "
            f"and a head count {h} divisible by {hk}"
        )
    return k.repeat_interleave(h // hk, dim=1), v.repeat_interleave(h // hk, dim=1)


__all__ = ["DTYPE_ERROR", "SHAPE_ERROR", "expand_kv_heads", "hidden_to_bias", "keep_to_bias", "to_additive_bias"]


def check_block_mask(block_mask, b: int, h: int, m: int, n: int) -> None:
    """ValueError, naming both, where a BlockMask is not for a call of batch b, h heads, m
    queries and n keys (its batch and heads may be 1: broadcast)."""
    if tuple(block_mask.seq_lengths) != (m, n):
        raise ValueError(
            f"the BlockMask is for {block_mask.seq_lengths[0]} queries and {block_mask.seq_lengths[1]} keys, "
            f"the call has {m} queries and {n} keys: build the mask for the call's lengths"
        )
    mb, mh = block_mask.kv_num_blocks.shape[:2]
    if mb not in (1, b) or mh not in (1, h):
        raise ValueError(
            f"the BlockMask is for batch {mb} and {mh} heads, the call has batch {b} and {h} heads: "
            "build it for the call's (or for 1, to broadcast)"
        )


def block_size(size) -> tuple[int, int]:
    """A BlockMask's BLOCK_SIZE as (query rows, keys): an int is both."""
    if isinstance(size, int):
        return size, size
    return int(size[0]), int(size[1])


# A BlockMask block's state: hidden, seen through the mask_mod, seen whole.
EMPTY, PARTIAL, FULL = 0, 1, 2


def noop_mask_mod(mask_mod) -> bool:
    """Whether a BlockMask's mask_mod hides nothing (none, or from_kv_blocks' noop_mask)."""
    return mask_mod is None or getattr(mask_mod, "__name__", "") == "noop_mask"


def block_states(block_mask, n_qb: int, n_kb: int) -> torch.Tensor:
    """(Bm, Hm, n_qb, n_kb) uint8: EMPTY, PARTIAL or FULL per mask block (a listed block
    of a mask without a mask_mod is FULL)."""
    num = block_mask.kv_num_blocks
    bm, hm = num.shape[:2]
    states = torch.zeros(bm, hm, num.shape[2], n_kb + 1, dtype=torch.uint8, device=num.device)
    lists = [(num, block_mask.kv_indices, FULL if noop_mask_mod(block_mask.mask_mod) else PARTIAL)]
    if block_mask.full_kv_num_blocks is not None:
        lists.append((block_mask.full_kv_num_blocks, block_mask.full_kv_indices, FULL))
    for count, idx, state in lists:
        listed = torch.arange(idx.shape[-1], device=idx.device) < count[..., None].long()
        target = torch.where(listed, idx.long().clamp(0, n_kb), n_kb)  # unlisted slots: a spare column
        states.scatter_(-1, target, torch.full_like(target, state, dtype=torch.uint8))
    return states[:, :, :n_qb, :n_kb]
