"""A traffic and time model of context-parallel attention: what each rank sends and
computes, and how long that takes on a machine described by a few constants.

The byte counts are what attnkit.parallel sends for even shards (tests hold the
counted transfers to them); the times are a MODEL, not a measurement: compute at a
fraction of the accelerator's peak, transfers at a fraction of the link's bandwidth, ring
transfers hidden under compute when they take less time, all-to-alls not hidden.
Packing aligns each tensor in a message to 16 bytes; the formulas leave that out.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """One attention call: (batch, heads, q_len, kv_len, head_dim), elem_bytes per value
    (2 for fp16/bf16). v has head_dim too."""

    batch: int
    heads: int
    q_len: int
    kv_len: int
    head_dim: int
    elem_bytes: int = 2

    def flops(self, causal: bool = False) -> float:
        """Forward FLOPs of the whole call: two matmuls of 2*M*N*D each per (batch, head);
        a causal mask halves the work (blocks above the diagonal are skipped)."""
        f = 4.0 * self.batch * self.heads * self.q_len * self.kv_len * self.head_dim
        return f / 2 if causal else f


@dataclass(frozen=True)
class Machine:
    """What a rank can compute and send per second. Every constant has its source."""

    name: str
    peak_flops: float  # dense 16-bit tensor FLOP/s
    attn_efficiency: float  # fraction of peak an attention kernel reaches
    link_bytes_per_s: float  # per direction, per rank
    link_efficiency: float  # fraction of link bandwidth a transfer reaches
    latency_s: float  # per transfer (per ring step / per all-to-all)

    @property
    def flops(self) -> float:
        return self.peak_flops * self.attn_efficiency

    @property
    def bandwidth(self) -> float:
        return self.link_bytes_per_s * self.link_efficiency

    @property
    def balance(self) -> float:
        """Bytes the link moves per FLOP computed: a strategy whose bytes per FLOP stays
        below this hides its transfers under compute (when they overlap)."""
        return self.bandwidth / self.flops


H100_NVLINK = Machine(
    name="8x H100 SXM on NVLink (model)",
    # NVIDIA H100 SXM5 datasheet: 989 TFLOP/s dense BF16 (1,979 with sparsity)
    peak_flops=989e12,
    # FlashAttention-3 (Shah et al., 2024): up to 740 TFLOP/s forward, 75% of peak, at
    # head dim 128; taken as 0.6 to cover smaller head dims and the merge between blocks
    attn_efficiency=0.6,
    # NVIDIA H100 datasheet: NVLink 900 GB/s per GPU, both directions together
    link_bytes_per_s=450e9,
    # assumption: NCCL point-to-point and all-to-all reach about 80% of the link
    link_efficiency=0.8,
    # assumption: ~10 us per NCCL transfer launch and synchronisation
    latency_s=10e-6,
)


def ring_bytes(shape: Shape, ring: int, causal: bool = False, heads: int | None = None) -> float:
    """Mean bytes a rank sends in the forward of ring attention over ``ring`` ranks: each
    key/value block (N / R keys, k and v) hops to the R - 1 other ranks; causal (q_len ==
    kv_len, even shards): a block travels only to the ranks after it, half as far on
    average."""
    if ring <= 1:
        return 0.0
    h = shape.heads if heads is None else heads
    block = shape.batch * h * (shape.kv_len / ring) * 2 * shape.head_dim * shape.elem_bytes
    hops = (ring - 1) / 2 if causal else ring - 1
    return block * hops


def ulysses_bytes(shape: Shape, ulysses: int, seq_fraction: float = 1.0) -> float:
    """Bytes a rank sends in the forward of Ulysses over ``ulysses`` ranks: its shard of
    q, k, v to the others (all but its own heads slice) and its heads' outputs back:
    (U - 1) / U^2 of B * H * (M + N) * 2D values (q and out: M * 2D; k and v: N * 2D).
    seq_fraction: the part of the sequence the group holds (1 / ring degree on a mesh)."""
    if ulysses <= 1:
        return 0.0
    U = ulysses
    values = shape.batch * shape.heads * (shape.q_len + shape.kv_len) * 2 * shape.head_dim * seq_fraction
    return (U - 1) / U**2 * values * shape.elem_bytes


def mesh_bytes(shape: Shape, ring: int, ulysses: int, causal: bool = False) -> float:
    """Forward bytes per rank on a ring x ulysses mesh: the all-to-all inside each ulysses
    group (it holds 1 / ring of the sequence), then the ring over H / U heads."""
    return ulysses_bytes(shape, ulysses, 1.0 / ring) + ring_bytes(shape, ring, causal, heads=shape.heads // ulysses)


@dataclass(frozen=True)
class Estimate:
    strategy: str
    ranks: int
    flops_per_rank: float
    bytes_per_rank: float
    compute_s: float
    comm_s: float
    total_s: float

    @property
    def bytes_per_flop(self) -> float:
        return self.bytes_per_rank / self.flops_per_rank if self.flops_per_rank else float("inf")


def estimate(shape: Shape, machine: Machine, ring: int = 1, ulysses: int = 1, causal: bool = False) -> Estimate:
    """Forward time per call on ring x ulysses ranks of ``machine`` (a MODEL).

    compute = FLOPs / ranks / (peak * efficiency). Ring transfers overlap compute:
    max(compute, transfers + R * latency). The all-to-alls (two per call) do not:
    they add their time and 2 latencies.
    """
    P = ring * ulysses
    flops = shape.flops(causal) / P
    compute = flops / machine.flops
    a2a = ulysses_bytes(shape, ulysses, 1.0 / ring)
    rb = ring_bytes(shape, ring, causal, heads=shape.heads // ulysses)
    a2a_s = a2a / machine.bandwidth + (2 * machine.latency_s if ulysses > 1 else 0.0)
    ring_s = rb / machine.bandwidth + (ring - 1) * machine.latency_s
    total = a2a_s + max(compute, ring_s)
    name = "ring" if ulysses == 1 else ("ulysses" if ring == 1 else f"mesh {ring}x{ulysses}")
    if P == 1:
        name = "one device"
    return Estimate(name, P, flops, a2a + rb, compute, a2a_s + ring_s, total)
