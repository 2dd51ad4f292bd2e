"""The communication under context parallelism: torch.distributed's own collectives and
point-to-point operations, with three things added.

- Everything travels as bytes (a uint8 view of contiguous storage): bit-exact for every
  dtype, including bool masks and bfloat16 on backends that lack it, and several tensors
  of different dtypes go as one message.
- Every byte this process sends is counted (:func:`count_bytes`), so the benchmark reports
  measured traffic, and tests hold the traffic model to it.
- A wait that fails (a peer raised and exited, or the group's timeout passed) raises
  :class:`ContextParallelError` saying which step waited on which rank, instead of a bare
  transport error. The group's own timeout (``init_process_group(timeout=...)`` or
  ``new_group(timeout=...)``) bounds every wait: no rank hangs for ever.
- No transfer is left in flight: every posted transfer is waited for, even when the
  computation between posting and waiting raised (:func:`wait_all`), and a failure on
  some ranks is made a failure on all (:func:`finish_together`), so a failed call leaves
  its group usable.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

import torch
import torch.distributed as dist

logger = logging.getLogger("attnkit.parallel")

# Segments of a packed message start at multiples of this many bytes, so that every
# dtype's view of its segment is aligned.
_ALIGN = 16


class ContextParallelError(RuntimeError):
    """A context-parallel call could not complete on this rank: another rank refused the
    call, raised, stopped calling, or the group timed out."""


@dataclass
class CommCounter:
    """Bytes and messages this process sent while the counter was active.

    ``by_kind`` splits the bytes by what was sent ("ring-kv", "ring-grad", "a2a", "meta",
    "bias").
    """

    bytes_sent: int = 0
    messages: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, nbytes: int) -> None:
        self.bytes_sent += nbytes
        self.messages += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + nbytes


_COUNTERS: list[CommCounter] = []


@contextlib.contextmanager
def count_bytes() -> Iterator[CommCounter]:
    """Count what this process sends inside the block (nested counters all count).

    >>> with count_bytes() as sent:
    ...     ring_attention(q, k, v, group=g)
    >>> sent.bytes_sent
    """
    counter = CommCounter()
    _COUNTERS.append(counter)
    try:
        yield counter
    finally:
        _COUNTERS.remove(counter)


def _record(kind: str, nbytes: int) -> None:
    for c in _COUNTERS:
        c.add(kind, nbytes)


# -- bytes ---------------------------------------------------------------------------------


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of t's storage (a copy first if t is not contiguous)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class Spec:
    """Shape and dtype of one tensor inside a packed message."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * torch.empty((), dtype=self.dtype).element_size()


def packed_size(specs: Sequence[Spec]) -> int:
    return sum(_aligned(s.nbytes) for s in specs)


def pack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Several tensors as one uint8 buffer (each segment 16-byte aligned)."""
    specs = [Spec(tuple(t.shape), t.dtype) for t in tensors]
    device = tensors[0].device
    buf = torch.empty(packed_size(specs), dtype=torch.uint8, device=device)
    at = 0
    for t, s in zip(tensors, specs):
        buf[at : at + s.nbytes].copy_(as_bytes(t))
        at += _aligned(s.nbytes)
    return buf


def unpack(buf: torch.Tensor, specs: Sequence[Spec]) -> list[torch.Tensor]:
    """Views of the tensors that :func:`pack` put in buf, described by specs."""
    out, at = [], 0
    for s in specs:
        out.append(buf[at : at + s.nbytes].view(s.dtype).view(s.shape))
        at += _aligned(s.nbytes)
    return out


# -- waiting ---------------------------------------------------------------------------------


def wait(work, what: str) -> None:
    """work.wait(), with a failure turned into a ContextParallelError that says what waited."""
    if work is None:
        return
    try:
        work.wait()
    except Exception as exc:
        raise ContextParallelError(
            f"{what} failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}. "
            "Another rank of the group most likely raised or stopped calling (its own error says why), "
            "or the group's timeout passed; this rank stops too."
        ) from exc


def wait_all(works: Sequence, what: str) -> None:
    """Wait for every work, even after one fails, then raise the first failure: a transfer
    left in flight would pair with the next call's transfers on the same group (gloo
    matches by peer and tag) and wedge it until the group's timeout."""
    first = None
    for w in works:
        try:
            wait(w, what)
        except ContextParallelError as exc:
            first = first or exc
    if first is not None:
        raise first


def finish_together(groups: Sequence, failure: Optional[BaseException], where: str, what: str, device) -> None:
    """After a step that can fail on some ranks only (the local attention raised), the
    ranks of ``groups`` (one after the other: on a 2-D mesh, the ring group then the
    ulysses group, so that every rank of the mesh learns) exchange whether they failed.
    Every rank then raises, or none does: the rank that failed re-raises its own error,
    the others :class:`ContextParallelError` naming it. Called only once every transfer
    of the step has completed, so the groups stay usable for the next call.

    ``where`` says where this rank failed (e.g. "step 2"); ``what`` names the call.
    """
    row = torch.tensor([float(failure is not None), float(dist.get_rank())], dtype=torch.float64, device=device)
    for group in groups:
        if group is None or dist.get_world_size(group) == 1:
            continue
        rows = all_gather_rows(row, group, f"{what}: checking that every rank finished")
        failed = rows[rows[:, 0] > 0]
        if len(failed):
            row = failed[0].clone()
    if failure is not None:
        if hasattr(failure, "add_note"):
            failure.add_note(
                f"attnkit.parallel: raised on global rank {dist.get_rank()} in {what} ({where}); every rank of the "
                "group raised with it, and the group stays usable"
            )
        raise failure
    if row[0] > 0:
        raise ContextParallelError(
            f"{what}: another rank of the group raised (global rank {int(row[1])}; its own error says why), so "
            "every rank stops here. Every transfer of the call completed: the group stays usable for the next call"
        )


def group_rank(group) -> int:
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(
            f"this process (global rank {dist.get_rank()}) is not a member of the process group it was given; "
            "pass the group this rank belongs to"
        )
    return rank


# -- collectives -------------------------------------------------------------------------------


def all_gather_rows(row: torch.Tensor, group, what: str) -> torch.Tensor:
    """(G, L) float64: every rank's row of L numbers (the call's metadata), in group order."""
    size = dist.get_world_size(group)
    out = torch.empty(size * row.numel(), dtype=row.dtype, device=row.device)
    _record("meta", row.numel() * row.element_size() * (size - 1))
    # all_gather_single is the newer name (torch 2.10+) of all_gather_into_tensor
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    wait(gather(out, row.contiguous(), group=group, async_op=True), what)
    return out.view(size, row.numel())


def all_reduce_max(t: torch.Tensor, group, what: str) -> torch.Tensor:
    """Elementwise max over the group, in place."""
    _record("bias", t.numel() * t.element_size())
    wait(dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group, async_op=True), what)
    return t


def all_to_all_bytes(
    send: Sequence[torch.Tensor], recv_sizes: Sequence[int], group, what: str, kind: str = "a2a", async_op: bool = False
):
    """Send send[j] (uint8, 1-D) to group rank j and receive recv_sizes[j] bytes from it.

    Returns the list of received uint8 chunks, or with async_op=True a function that
    waits and returns them. torch's all_to_all_single with uneven splits underneath.
    """
    me = dist.get_rank(group)
    device = send[0].device if send else torch.device("cpu")
    inp = torch.cat([s.reshape(-1) for s in send]) if send else torch.empty(0, dtype=torch.uint8)
    out = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=device)
    _record(kind, sum(s.numel() for j, s in enumerate(send) if j != me))
    work = dist.all_to_all_single(
        out,
        inp,
        output_split_sizes=list(recv_sizes),
        input_split_sizes=[s.numel() for s in send],
        group=group,
        async_op=True,
    )

    def finish() -> list[torch.Tensor]:
        wait(work, what)
        return list(out.split(list(recv_sizes)))

    return finish if async_op else finish()


def p2p(ops: Sequence[tuple[str, torch.Tensor, int, int, str]], group, what: str) -> list:
    """Start point-to-point transfers; ops are (\"send\"|\"recv\", uint8 buffer, group peer, tag,
    kind). Returns the works (wait them with :func:`wait`). Zero-byte transfers are not
    started: both sides know the sizes, so both skip them."""
    p2p_ops = []
    for op, buf, peer, tag, kind in ops:
        if buf.numel() == 0:
            continue
        if op == "send":
            _record(kind, buf.numel())
            p2p_ops.append(dist.P2POp(dist.isend, buf, group=group, group_peer=peer, tag=tag))
        else:
            p2p_ops.append(dist.P2POp(dist.irecv, buf, group=group, group_peer=peer, tag=tag))
    if not p2p_ops:
        return []
    try:
        return list(dist.batch_isend_irecv(p2p_ops))
    except Exception as exc:
        raise ContextParallelError(f"{what}: starting the transfers failed: {type(exc).__name__}: {exc}") from exc
