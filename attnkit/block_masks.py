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
  with Triton, 16-bit or float32 inputs, one head dim of 8-256 for q, k and v;
- ``chunked``: torch operations, one query block at a time against only the key blocks
  it visits: its scores hold (B, H, query block, visited keys), never (M, N), and its
  backward recomputes them block by block (eager FlexAttention has no CPU backward).
  Everywhere else (the CPU, other dtypes, a value head dim of its own, head dims above
  256).

A query row that sees no key gives zeros on both, as FlexAttention gives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import math
import os
import weakref
from collections.abc import Iterator

import numpy as np
import torch
from torch.func import vmap

from .masks import EMPTY, FULL, PARTIAL, block_size, block_states, check_block_mask, noop_mask_mod

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
    keys: torch.Tensor | None = None,
    causal: bool = False,
    via: str | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale, over the keys ``block_mask`` shows each row) v.

    q: (B, H, M, D); k, v: (B, H, N, D) and (B, H, N, Dv). block_mask: a FlexAttention
    BlockMask for M queries and N keys (its seq_lengths), batch and heads B and H or 1.
    scale defaults to D ** -0.5. Returns (B, H, M, Dv) in q's dtype. keys: a (B, N) boolean
    key mask combined with the BlockMask (True = attend: a text padding mask); causal: also
    hide the keys after each query (key j from query i iff j <= i, torch's is_causal). Both
    make a restricted BlockMask (:func:`restricted`, once per mask and key mask). via: "kernel" or
    "chunked" to force a route (the kernel where it cannot run raises, saying why);
    None takes :func:`route`'s."""
    b, h, m, d = q.shape
    n = k.shape[2]
    check(block_mask, b, h, m, n)
    if keys is not None or causal:
        block_mask = restricted(block_mask, keys, causal, b, m, n)
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


def restricted(block_mask, keys: torch.Tensor | None, causal: bool, b: int, m: int, n: int):
    """The BlockMask that also hides what ``keys`` (B, N) bool hides and, with causal, the
    keys after each query: blocks both show whole stay full, blocks either hides go,
    the rest are partial under a mask_mod that ANDs the three (the original's full blocks
    count as seen whole, as compiled FlexAttention counts them). Kept per (mask, key mask
    bits, causal) while the mask lives, so the layers that share them share its
    block table too. The key mask is read once per call (one copy to the host, B x N bits)."""
    from torch.nn.attention.flex_attention import BlockMask

    if keys is not None and (keys.dtype != torch.bool or tuple(keys.shape) != (b, n)):
        raise ValueError(
            f"keys must be a ({b}, {n}) boolean key mask (True = attend); got {keys.dtype} {tuple(keys.shape)}"
        )
    digest = None
    if keys is not None:  # by content: a model may build its key mask afresh for every call
        packed = np.packbits(keys.detach().cpu().numpy(), axis=-1)
        digest = hashlib.blake2b(packed.tobytes(), digest_size=16).hexdigest()
    key = (id(block_mask), digest, tuple(keys.shape) if keys is not None else None, bool(causal))
    hit = _RESTRICTED.get(key)
    if hit is not None and hit[0]() is block_mask:
        return hit[1]
    qb, kb = block_size(block_mask.BLOCK_SIZE)
    n_qb, n_kb = -(-m // qb), -(-n // kb)
    original = block_states(block_mask, n_qb, n_kb)
    states = original
    device = original.device
    if keys is not None:
        every = torch.ones(b, n_kb * kb, dtype=torch.bool, device=device)  # past N: no key to hide
        some = torch.zeros(b, n_kb * kb, dtype=torch.bool, device=device)
        every[:, :n] = some[:, :n] = keys.to(device)
        whole, seen = every.view(b, n_kb, kb).all(-1), some.view(b, n_kb, kb).any(-1)
        states = _meet(states, torch.where(whole, FULL, torch.where(seen, PARTIAL, EMPTY))[:, None, None])
    if causal:
        q_lo = torch.arange(n_qb, device=device) * qb
        q_hi = (q_lo + qb).clamp(max=m) - 1
        k_lo = torch.arange(n_kb, device=device) * kb
        k_hi = (k_lo + kb).clamp(max=n) - 1
        seen_all = k_hi[None, :] <= q_lo[:, None]
        seen_any = k_lo[None, :] <= q_hi[:, None]
        states = _meet(states, torch.where(seen_all, FULL, torch.where(seen_any, PARTIAL, EMPTY))[None, None])
    states = states.to(torch.uint8)

    def lists(state):
        chosen = states == state
        order = torch.sort((~chosen).to(torch.uint8), dim=-1, stable=True).indices.to(torch.int32)
        return chosen.sum(-1).to(torch.int32), order

    num, idx = lists(PARTIAL)
    full_num, full_idx = lists(FULL)
    mask_mod = _Restricted(block_mask.mask_mod, original, (qb, kb), keys, causal)
    out = BlockMask.from_kv_blocks(
        num, idx, full_num, full_idx, BLOCK_SIZE=(qb, kb), mask_mod=mask_mod, seq_lengths=(m, n)
    )
    try:
        ref = weakref.ref(block_mask)
    except TypeError:
        return out
    if len(_RESTRICTED) >= RESTRICTED_LIMIT:
        _RESTRICTED.pop(next(iter(_RESTRICTED)))
    _RESTRICTED[key] = (ref, out)
    return out


# (id(mask), a digest of the key mask's bits or None, its shape, causal) -> (a weak ref to
# the mask, the restricted mask). Stale when the mask is gone (its id may be reused: the
# reference tells); bounded (oldest out first) since an entry holds the restricted mask.
_RESTRICTED: dict[tuple, tuple] = {}
RESTRICTED_LIMIT = 64


def _meet(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Two block states together: hidden where either hides, whole where both show whole."""
    return torch.where((a == EMPTY) | (c == EMPTY), EMPTY, torch.where((a == FULL) & (c == FULL), FULL, PARTIAL))


class _Restricted:
    """The restricted mask's mask_mod: the original's element mask (its full blocks whole,
    a list-only mask's listed blocks whole), AND the key mask, AND causality."""

    def __init__(self, mask_mod, states, block, keys, causal):
        self.mask_mod = None if noop_mask_mod(mask_mod) else mask_mod
        self.whole = states == FULL
        self.block, self.keys, self.causal = block, keys, causal

    def __call__(self, b, h, q_idx, kv_idx):
        bm, hm = self.whole.shape[:2]
        bi = b if bm > 1 else 0
        hi = h if hm > 1 else 0
        seen = self.whole[bi, hi, q_idx // self.block[0], kv_idx // self.block[1]]
        if self.mask_mod is not None:
            seen = seen | self.mask_mod(b, h, q_idx, kv_idx)
        if self.keys is not None:
            seen = seen & self.keys[b, kv_idx]
        if self.causal:
            seen = seen & (kv_idx <= q_idx)
        return seen


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


# The block-sparse kernel's checked reach (bench/results/static, rows sparse_*): head dims
# to 256, every tile under the 101,376 B of shared memory per block of sm_86/89/120.
KERNEL_MAX_HEAD_DIM = 256


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
    if not 8 <= d <= KERNEL_MAX_HEAD_DIM:
        return CHUNKED, (
            f"head dim {d}: the block-sparse kernel takes 8 to {KERNEL_MAX_HEAD_DIM} (its tiles are compiled "
            "and checked to 256, tools/static_report)"
        )
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
