"""FlexAttention BlockMasks computed exactly in eager mode, in memory linear in the tokens.

A ``torch.nn.attention.flex_attention.BlockMask`` says, per query block, which key blocks
are visited: ``full_kv_*`` blocks are seen whole, ``kv_*`` blocks through ``mask_mod``
(evaluated on those blocks only), every other block is hidden. That is what compiled
FlexAttention computes. Its eager path does not: it materialises the whole (M, N) score
matrix, and it ignores the block lists of a mask built without a ``mask_mod`` (as
Kandinsky 5's NABLA builds it), so an eager model would attend to every key.

:func:`block_mask_attention` computes the BlockMask's meaning on one of two routes
(:func:`route` says which, and why):

- ``kernel``: the block-sparse flash kernel (attnkit/kernels/flash/sparse.py), forward and
  backward, visiting only the tiles the mask shows (the mask converted once per mask
  object to the kernel's block table), on a CUDA GPU of compute capability 8.0 or later
  with Triton, 16-bit or float32 inputs, one head dim of 8-512 for q, k and v;
- ``chunked``: torch operations, one query block at a time against only the key blocks
  it visits: its scores hold (B, H, query block, visited keys), never (M, N), and
  autograd differentiates it (eager FlexAttention has no CPU backward). Everywhere else
  (the CPU, other dtypes, a value head dim of its own).

A query row that sees no key gives zeros on both, as FlexAttention gives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import weakref
from collections.abc import Iterator

import torch
from torch.func import vmap

from .masks import block_size, check_block_mask

# check(block_mask, b, h, m, n): ValueError, naming both, for a BlockMask of another call
check = check_block_mask

KERNEL, CHUNKED = "kernel", "chunked"


def block_mask_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_mask,
    scale: float | None = None,
    *,
    via: str | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale, over the keys ``block_mask`` shows each row) v.

    q: (B, H, M, D); k, v: (B, H, N, D) and (B, H, N, Dv). block_mask: a FlexAttention
    BlockMask for M queries and N keys (its seq_lengths), batch and heads B and H or 1.
    scale defaults to D ** -0.5. Returns (B, H, M, Dv) in q's dtype. via: "kernel" or
    "chunked" to force a route (the kernel where it cannot run raises, saying why);
    None takes :func:`route`'s."""
    b, h, m, d = q.shape
    n = k.shape[2]
    check(block_mask, b, h, m, n)
    if via not in (None, KERNEL, CHUNKED):
        raise ValueError(f"via={via!r}: pass 'kernel', 'chunked' or None (the route that can run)")
    chosen, why = route(q, k, v, interpreter=via == KERNEL)
    if via == KERNEL and chosen != KERNEL:
        raise ValueError(f"the block-sparse kernel cannot run this call: {why}")
    if _RECORDERS:
        record = Computed(via or chosen, why if via is None else f"via={via!r}", tuple(q.shape), tuple(k.shape))
        for into in _RECORDERS:
            into.append(record)
    if (via or chosen) == KERNEL:
        from .kernels.flash.sparse import block_sparse_attention

        return block_sparse_attention(q, k, v, block_mask, scale)
    return _chunked(q, k, v, block_mask, scale)


@dataclasses.dataclass(frozen=True)
class Computed:
    """One BlockMask call block_mask_attention computed, as recording() hears of it: its
    route ("kernel" or "chunked"), why, and the shapes of q and k."""

    route: str
    why: str
    q_shape: tuple
    k_shape: tuple


_RECORDERS: list = []


@contextlib.contextmanager
def recording(into=None) -> Iterator:
    """Every BlockMask call computed inside the with block, as Computed, appended to
    ``into`` (any object with append; a new list by default), which is yielded: what ran
    and on which route, for tests and debugging."""
    into = [] if into is None else into
    _RECORDERS.append(into)
    try:
        yield into
    finally:
        _RECORDERS.remove(into)


def route(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, interpreter: bool = False) -> tuple[str, str]:
    """(route, why) of a BlockMask call: "kernel" (the block-sparse flash kernel) where it
    can run, else "chunked" with the reason it cannot. From metadata alone. interpreter:
    CPU tensors may take the kernel under TRITON_INTERPRET=1 (tests and debugging: never
    chosen on its own)."""
    d = q.shape[-1]
    emulated = interpreter and q.device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if q.device.type != "cuda" and not emulated:
        return CHUNKED, f"device={q.device.type}: the block-sparse kernel runs on CUDA"
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return CHUNKED, f"dtype={q.dtype}: the block-sparse kernel takes float16, bfloat16 and float32"
    if k.shape[-1] != d or v.shape[-1] != d:
        return CHUNKED, f"head dims {d}, {k.shape[-1]}, {v.shape[-1]}: the kernel takes one head dim for q, k and v"
    if not 8 <= d <= 512:
        return CHUNKED, f"head dim {d}: the block-sparse kernel takes 8 to 512"
    major, minor = (8, 0) if emulated else torch.cuda.get_device_capability(q.device)
    if (major, minor) < (8, 0):
        return CHUNKED, f"compute capability {major}.{minor}: the block-sparse kernel needs 8.0 or later"
    try:
        import triton  # noqa: F401
    except ImportError:
        return CHUNKED, "triton is not installed: pip install 'attnkit[triton]'"
    return KERNEL, "the block-sparse flash kernel: only the tiles the mask shows are visited"


def _chunked(q, k, v, block_mask, scale):
    """The chunked route (see the module's docstring), differentiable once: its backward
    recomputes each chunk's scores from the row log-sum-exps, as a flash backward does,
    so training holds (B, H, M) statistics and no chunk's scores past its own step."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return _Chunked.apply(q, k, v, block_mask, scale)


class _Chunks:
    """One call's walk: per query block, the key blocks it visits, gathered."""

    def __init__(self, q, k, v, block_mask):
        b, h, m, d = q.shape
        n = k.shape[2]
        self.qb, self.kb = block_size(block_mask.BLOCK_SIZE)
        self.lists = _visits(block_mask, b, h)
        self.n_blocks = -(-n // self.kb)
        pad = self.n_blocks * self.kb - n
        kp = torch.nn.functional.pad(k, (0, 0, 0, pad)) if pad else k
        vp = torch.nn.functional.pad(v, (0, 0, 0, pad)) if pad else v
        self.kp = kp.reshape(b, h, self.n_blocks, self.kb, d)
        self.vp = vp.reshape(b, h, self.n_blocks, self.kb, v.shape[-1])
        self.mask_mod, self.shape = block_mask.mask_mod, (b, h, m, n)
        self.work = torch.float64 if q.dtype == torch.float64 else torch.float32  # 16-bit: float32 scores

    def count(self) -> int:
        return -(-self.shape[2] // self.qb)

    def chunk(self, i: int):
        """(rows, kv_idx (B, H, S*kb) in the padded keys, ks, vs, seen (B, H, rows|1,
        S*kb)), or (rows, None, ...) where the block sees no key."""
        b, h, m, n = self.shape
        kb, device = self.kb, self.kp.device
        rows = slice(i * self.qb, min(m, (i + 1) * self.qb))
        blocks, partial, count = (t[:, :, i] for t in self.lists)  # (B, H, S), (B, H, S), (B, H)
        width = int(count.max()) if count.numel() else 0
        if width == 0:
            return rows, None, None, None, None
        blocks, partial = blocks[..., :width], partial[..., :width]
        take = blocks.clamp(0, self.n_blocks - 1).long()
        gather = take[..., None, None]
        d, dv = self.kp.shape[-1], self.vp.shape[-1]
        ks = torch.gather(self.kp, 2, gather.expand(-1, -1, -1, kb, d)).reshape(b, h, width * kb, d)
        vs = torch.gather(self.vp, 2, gather.expand(-1, -1, -1, kb, dv)).reshape(b, h, width * kb, dv)
        kv_idx = (take[..., None] * kb + torch.arange(kb, device=device)).reshape(b, h, width * kb)
        slot = torch.arange(width, device=device)
        listed = (slot < count[..., None]).repeat_interleave(kb, dim=-1)  # (B, H, S*kb)
        seen = (listed & (kv_idx < n))[:, :, None, :]  # (B, H, 1, S*kb)
        if self.mask_mod is not None and bool(partial.any()):
            q_idx = torch.arange(rows.start, rows.stop, device=device)
            inner = _evaluate(self.mask_mod, b, h, q_idx, kv_idx.clamp(max=n - 1))  # (B, H, rows, S*kb)
            seen = seen & (~partial.repeat_interleave(kb, dim=-1)[:, :, None, :] | inner)
        return rows, kv_idx, ks.to(self.work), vs.to(self.work), seen


class _Chunked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, block_mask, scale):
        walk = _Chunks(q, k, v, block_mask)
        b, h, m, _ = q.shape
        out = q.new_zeros(b, h, m, v.shape[-1])
        lse = torch.full((b, h, m, 1), -math.inf, dtype=walk.work, device=q.device)
        for i in range(walk.count()):
            rows, kv_idx, ks, vs, seen = walk.chunk(i)
            if kv_idx is None:
                continue  # rows that see no key: zeros
            scores = (q[:, :, rows].to(walk.work) @ ks.transpose(-1, -2)) * scale
            scores = scores.masked_fill(~seen, -math.inf)
            best = scores.amax(-1, keepdim=True)
            best = torch.where(torch.isfinite(best), best, torch.zeros_like(best))
            p = torch.exp(scores - best)
            total = p.sum(-1, keepdim=True)
            out[:, :, rows] = (p @ vs / torch.where(total > 0, total, torch.ones_like(total))).to(q.dtype)
            lse[:, :, rows] = torch.where(total > 0, best + torch.log(total), -math.inf)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.block_mask, ctx.scale = block_mask, scale
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        scale = ctx.scale
        walk = _Chunks(q, k, v, ctx.block_mask)
        work = walk.work
        b, h, m, n = walk.shape
        dq = torch.zeros(q.shape, dtype=work, device=q.device)
        dkp = torch.zeros(b, h, walk.n_blocks * walk.kb, k.shape[-1], dtype=work, device=q.device)
        dvp = torch.zeros(b, h, walk.n_blocks * walk.kb, v.shape[-1], dtype=work, device=q.device)
        for i in range(walk.count()):
            rows, kv_idx, ks, vs, seen = walk.chunk(i)
            if kv_idx is None:
                continue
            qi, doi = q[:, :, rows].to(work), do[:, :, rows].to(work)
            lse_i = lse[:, :, rows]
            lse_i = torch.where(torch.isfinite(lse_i), lse_i, math.inf)  # a blind row: p = 0
            p = torch.exp((qi @ ks.transpose(-1, -2)) * scale - lse_i).masked_fill(~seen, 0.0)
            delta = (doi * out[:, :, rows].to(work)).sum(-1, keepdim=True)
            ds = p * (doi @ vs.transpose(-1, -2) - delta)
            dq[:, :, rows] = (ds @ ks) * scale
            at = kv_idx[..., None]
            dkp.scatter_add_(2, at.expand(-1, -1, -1, k.shape[-1]), (ds.transpose(-1, -2) @ qi) * scale)
            dvp.scatter_add_(2, at.expand(-1, -1, -1, v.shape[-1]), p.transpose(-1, -2) @ doi)
        return dq.to(q.dtype), dkp[:, :, :n].to(k.dtype), dvp[:, :, :n].to(v.dtype), None, None


def hides_nothing(block_mask) -> bool:
    """Whether a BlockMask shows every key to every query: every key block visited by every
    query block, whole (a full block, or a partial one under no mask_mod: from_kv_blocks'
    noop_mask). The attnkit backend then drops it, so auto() may choose a mask-free
    kernel. Read once per mask object (one host sync), as masks.hides_nothing reads a
    tensor; a BlockMask is not changed in place."""
    key = id(block_mask)
    seen = _SEEN.get(key)
    if seen is not None and seen[0]() is block_mask:
        return seen[1]
    _, kb = block_size(block_mask.BLOCK_SIZE)
    n_blocks = -(-int(block_mask.seq_lengths[1]) // kb)
    whole = torch.zeros_like(block_mask.kv_num_blocks)
    if block_mask.full_kv_num_blocks is not None:
        whole = whole + block_mask.full_kv_num_blocks
    if block_mask.mask_mod is None or getattr(block_mask.mask_mod, "__name__", "") == "noop_mask":
        whole = whole + block_mask.kv_num_blocks
    answer = bool((whole >= n_blocks).all())
    try:
        ref = weakref.ref(block_mask, functools.partial(_forget, key))
    except TypeError:
        return answer  # an object that takes no weak reference: read every call
    _SEEN[key] = (ref, answer)
    return answer


def _forget(key: int, _ref) -> None:
    _SEEN.pop(key, None)


# id(BlockMask) -> (a weak reference to it, hides_nothing): holds no mask; an entry leaves
# with its mask, so the table is bounded by the masks alive.
_SEEN: dict[int, tuple] = {}


def _visits(block_mask, b: int, h: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per (batch, head, query block): the key blocks visited (partial ones first, then
    full ones, padded), whether each is partial, and how many: (B, H, Q, S) x2, (B, H, Q)."""
    num, idx = block_mask.kv_num_blocks, block_mask.kv_indices
    full_num, full_idx = block_mask.full_kv_num_blocks, block_mask.full_kv_indices
    if full_num is None:
        full_num = torch.zeros_like(num)
        full_idx = idx[..., :0]
    shape = (b, h, num.shape[-1])
    num, full_num = num.expand(shape).long(), full_num.expand(shape).long()
    idx = idx.expand(*shape, idx.shape[-1]).long()
    full_idx = full_idx.expand(*shape, full_idx.shape[-1]).long()
    width = idx.shape[-1] + full_idx.shape[-1]
    slot = torch.arange(width, device=num.device)
    # Partial slots 0..num-1 from idx, then full ones from full_idx.
    from_partial = slot < num[..., None]
    j = (slot - num[..., None]).clamp(min=0, max=max(full_idx.shape[-1] - 1, 0))
    partial_pick = torch.gather(idx, -1, slot.clamp(max=idx.shape[-1] - 1).expand(*shape, width))
    full_pick = torch.gather(full_idx, -1, j) if full_idx.shape[-1] else torch.zeros_like(partial_pick)
    blocks = torch.where(from_partial, partial_pick, full_pick)
    return blocks, from_partial, num + full_num


def _evaluate(mask_mod, b: int, h: int, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    """mask_mod at every (batch, head, query, visited key): (B, H, rows, S), bool. vmapped
    as FlexAttention evaluates it (a mask_mod may index tensors with its arguments)."""
    fn = vmap(mask_mod, in_dims=(None, None, None, 0))  # keys
    fn = vmap(fn, in_dims=(None, None, 0, None))  # queries
    fn = vmap(fn, in_dims=(None, 0, None, 0))  # heads: each its own visited keys
    fn = vmap(fn, in_dims=(0, None, None, 0))  # batch
    device = q_idx.device
    return fn(torch.arange(b, device=device), torch.arange(h, device=device), q_idx, kv_idx).to(torch.bool)
