"""Context parallelism on real ranks: 2 and 4 spawned processes over gloo.

Each batch of cases runs in one spawn (spawning costs seconds on two shared cores); every
test below checks one case's result. The parent draws the whole problem from the printed
seed, each rank computes its shard, and the shards put together are compared with one
process: the float64 reference, within the tolerance rule of attnkit.testing (in float64
that is 2x float64 rounding + 1e-12). Gradients are held to the same rule: at most twice
the error of plain torch in the same dtype, plus a few units of rounding.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import pytest
import torch

from attnkit.parallel import model
from attnkit.testing import (
    EPSILON,
    make_bias,
    make_qkv,
    reference_attention,
    rel_error,
    tolerance,
    torch_math_attention,
)
from tests._masks import additive, causal_bias
from tests.parallel._parallel_harness import run_ranks, values

F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16
SHORT = {F64: "f64", F32: "f32", BF16: "bf16"}


@dataclasses.dataclass
class Spec:
    name: str
    mesh: str
    dtype: torch.dtype = F32
    B: int = 2
    H: int = 2
    M: int = 13
    N: int = 13
    D: int = 16
    q_split: Optional[list] = None
    k_split: Optional[list] = None  # None: q_split (self-attention); with kv_sharded=False unused
    bias: str = "none"
    bias_sharding: str = "query"
    causal: bool = False
    kv_sharded: object = True  # True, False or "auto", as passed
    kv_whole: Optional[bool] = None  # every rank gets all of k and v (default: kv_sharded is False)
    return_lse: bool = False  # and an upstream gradient for lse
    repeat: int = 1
    grad: bool = True
    local: str = "math"
    override: dict = dataclasses.field(default_factory=dict)
    expect: Optional[dict] = None  # error cases: rank -> substring of its ValueError
    trace: bool = False


def dead_rows_bias(B, H, M, N, dtype, gen):
    bias = torch.randn(B, H, M, N, generator=gen).to(dtype)
    bias[0, :, 1] = float("-inf")  # a row of rank 0's shard, every head
    bias[1, 1, M - 2] = float("-inf")  # a row near the end, one head
    return bias


def build_bias(spec: Spec, gen):
    B, H, M, N, dt = spec.B, spec.H, spec.M, spec.N, spec.dtype
    if spec.bias == "none":
        return None
    if spec.bias == "keypad":
        return make_bias("key_padding", B, H, M, N, dt, generator=gen)
    if spec.bias == "keypad-bool":
        return make_bias("key_padding_bool", B, H, M, N, dt, generator=gen)
    if spec.bias == "full":
        return make_bias("full", B, H, M, N, dt, generator=gen)
    if spec.bias == "dead":
        return dead_rows_bias(B, H, M, N, dt, gen)
    if spec.bias in ("neg1e9", "finfo-min"):
        # Row 3 masked everywhere with a finite value: not a dead row, a softmax over
        # value + scores, i.e. over the scores (a constant per row cancels). Row 5 only
        # partly. float64 math rounds the scores next to 1e9 (steps of 1.2e-7), and
        # rounds them away next to finfo(float32).min.
        fill = -1e9 if spec.bias == "neg1e9" else torch.finfo(torch.float32).min
        bias = torch.randn(B, 1, M, N, generator=gen).to(dt)
        bias[:, :, 3] = fill
        bias[:, :, 5, : N // 2] = fill
        return bias
    raise ValueError(spec.bias)


def reference_bias(spec: Spec, bias, dtype=torch.float64):
    """The whole problem's bias for one process, causal mask folded in."""
    b = additive(bias, dtype)
    if spec.causal:
        c = causal_bias(spec.M, spec.N, dtype=dtype)
        b = c if b is None else b + c
    return b


MASKED_ROW_ROWS = (3,)


def exact_bias(bias64):
    """The same softmax with each row masked everywhere by a finite value shifted to max 0:
    what exact arithmetic gives, where float64 itself rounds the scores next to -1e9."""
    if bias64 is None:
        return None
    row_max = bias64.amax(-1, keepdim=True)
    shift = torch.where(torch.isfinite(row_max) & (row_max < -1e3), row_max, torch.zeros_like(row_max))
    return bias64 - shift


def lse_of(q, k, bias, dtype):
    s = torch.matmul(q.to(dtype), k.to(dtype).transpose(-1, -2)) * q.shape[-1] ** -0.5
    if bias is not None:
        s = s + bias.to(dtype)
    return torch.logsumexp(s, dim=-1)


def make_case(spec: Spec, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = make_qkv(spec.B, spec.H, spec.M, spec.N, spec.D, spec.dtype, layout="bnhd", generator=gen)
    Dv = spec.D
    case = dict(
        mesh=spec.mesh,
        q=q,
        k=k,
        v=v,
        bias=build_bias(spec, gen),
        bias_sharding=spec.bias_sharding,
        q_split=spec.q_split,
        k_split=spec.k_split if spec.k_split is not None else spec.q_split,
        causal=spec.causal,
        kv_sharded=spec.kv_sharded,
        kv_whole=whole(spec),
        return_lse=spec.return_lse,
        repeat=spec.repeat,
        grad=spec.grad,
        local=spec.local,
        override=spec.override,
        trace=spec.trace,
        dout=torch.randn(spec.B, spec.H, spec.M, Dv, generator=gen).to(spec.dtype),
        dlse=torch.randn(spec.B, spec.H, spec.M, generator=gen) if spec.return_lse else None,
    )
    if whole(spec):
        case["k_split"] = None
    return case


def whole(spec: Spec) -> bool:
    return spec.kv_whole if spec.kv_whole is not None else spec.kv_sharded is False


# -- the cases ----------------------------------------------------------------------------

TWO = [
    # float64, tight: out, lse and gradients through both
    Spec("ring-f64-uneven-lse", "ring", F64, H=3, q_split=[5, 8], return_lse=True, repeat=2),
    Spec("ulysses-f64-uneven-lse", "ulysses", F64, H=4, q_split=[9, 4], return_lse=True, repeat=2),
    # key padding, a different length per batch item: by query rows (the whole (B,1,1,N)
    # mask on every rank) and with its keys
    Spec("ring-f32-keypad", "ring", F32, M=21, N=21, D=40, q_split=[10, 11], bias="keypad"),
    Spec(
        "ulysses-f32-keypad-bykey",
        "ulysses",
        F32,
        M=21,
        N=21,
        D=40,
        q_split=[10, 11],
        bias="keypad",
        bias_sharding="key",
    ),
    Spec("ring-f32-keypad-bykey", "ring", F32, M=21, N=21, q_split=[14, 7], bias="keypad", bias_sharding="key"),
    # full biases, sliced by query rows
    Spec("ring-bf16-full", "ring", BF16, M=19, N=19, D=40, q_split=[7, 12], bias="full"),
    Spec("ulysses-bf16-full", "ulysses", BF16, M=19, N=19, D=40, q_split=[7, 12], bias="full"),
    # query rows whose keys are all masked: zeros, as on one device
    Spec("ring-f32-deadrows", "ring", F32, q_split=[6, 7], bias="dead"),
    Spec("ulysses-f32-deadrows", "ulysses", F32, q_split=[6, 7], bias="dead"),
    Spec("ring-f64-neg1e9", "ring", F64, q_split=[6, 7], bias="neg1e9"),
    Spec("ring-f32-neg1e9", "ring", F32, q_split=[2, 11], k_split=[4, 9], bias="neg1e9"),
    Spec("ulysses-f32-finfo-min", "ulysses", F32, q_split=[5, 8], k_split=[3, 10], bias="finfo-min"),
    # cross-attention with 77 text keys: sharded unevenly, and whole on every rank
    Spec("ring-f32-cross77", "ring", F32, M=50, N=77, q_split=[20, 30], k_split=[39, 38], bias="keypad"),
    Spec("ulysses-f32-cross77", "ulysses", F32, M=50, N=77, q_split=[20, 30], k_split=[39, 38], bias="keypad"),
    Spec("ring-f32-cross77-whole", "ring", F32, M=50, N=77, q_split=[20, 30], kv_sharded=False, bias="keypad"),
    Spec("ulysses-bf16-cross77-whole", "ulysses", BF16, M=50, N=77, q_split=[20, 30], kv_sharded=False),
    # kv_sharded="auto" (what a diffusers backend passes): whole text keys found whole, shards found sharded
    Spec(
        "ring-f32-cross77-auto-whole",
        "ring",
        F32,
        M=50,
        N=77,
        q_split=[20, 30],
        kv_sharded="auto",
        kv_whole=True,
        bias="keypad",
        bias_sharding="key",
    ),
    Spec("ulysses-f64-auto-sharded", "ulysses", F64, H=4, q_split=[6, 7], kv_sharded="auto", causal=True),
    # causal, top-left on global positions
    Spec("ring-f64-causal", "ring", F64, M=17, N=17, q_split=[11, 6], causal=True),
    Spec("ulysses-f64-causal", "ulysses", F64, M=17, N=17, q_split=[11, 6], causal=True),
    # a rank with no query (and the other with no key); a rank with one token
    Spec("ring-f32-empty-shards", "ring", F32, q_split=[0, 13], k_split=[13, 0]),
    Spec("ulysses-f32-one-token", "ulysses", F32, q_split=[1, 12], k_split=[12, 1]),
    Spec("ring-bf16-keypad-bool", "ring", BF16, M=23, N=23, q_split=[12, 11], bias="keypad-bool", repeat=2),
    # refusals: every rank raises, the detail on the rank at fault
    Spec("err-ulysses-heads", "ulysses", H=3, expect={0: "3 heads do not divide among 2 ranks", 1: "ring_attention"}),
    Spec(
        "err-dtype-mismatch",
        "ring",
        override={1: {"dtype": F64}},
        expect={0: "disagree on dtype", 1: "disagree on dtype"},
    ),
    Spec(
        "err-bias-requires-grad",
        "ring",
        bias="full",
        override={0: {"bias_requires_grad": True}},
        expect={0: "attn_bias requires grad", 1: "refused"},
    ),
    Spec("err-local-without-lse", "ring", local="no_lse", expect={0: "not (out, lse)", 1: "not (out, lse)"}),
    Spec("err-head-dim-mismatch", "ring", override={1: {"head_dim": 8}}, expect={0: "head dim", 1: "head dim"}),
    Spec(
        "err-heads-mismatch",
        "ulysses",
        H=4,
        override={1: {"heads": 2}},
        expect={0: "number of heads", 1: "number of heads"},
    ),
    Spec("err-not-a-mesh", "same-groups", expect={0: "do not form a 2-D mesh", 1: "do not form a 2-D mesh"}),
    Spec(
        "err-whole-kv-differs",
        "ring",
        M=8,
        N=8,
        kv_sharded=False,
        override={1: {"dtype_kv_noise": True}},
        expect={0: "every rank must pass the same, whole k", 1: "every rank must pass the same, whole k"},
    ),
    Spec(
        "err-bias-key-columns",
        "ring",
        bias="keypad",
        override={0: {"pass_sharding": "query"}, 1: {"pass_sharding": "query"}},
        bias_sharding="key",
        expect={0: "bias_sharding='key'", 1: "bias_sharding='key'"},
    ),
]

FOUR = [
    Spec("ring4-f64-uneven-lse", "ring", F64, q_split=[4, 0, 1, 8], return_lse=True, repeat=2),
    Spec("ulysses4-f64-uneven", "ulysses", F64, H=4, q_split=[3, 1, 0, 9]),
    Spec("mesh2x2-f64-uneven-lse", "2x2", F64, H=4, q_split=[5, 2, 0, 6], return_lse=True, repeat=2),
    Spec("mesh2x2-bf16-full", "2x2", BF16, H=4, M=22, N=22, D=40, q_split=[6, 5, 6, 5], bias="full"),
    Spec(
        "mesh2x2-f32-keypad-bykey",
        "2x2",
        F32,
        H=4,
        M=17,
        N=17,
        q_split=[3, 7, 2, 5],
        bias="keypad",
        bias_sharding="key",
    ),
    Spec("mesh2x2-f32-deadrows", "2x2", F32, H=4, q_split=[3, 4, 3, 3], bias="dead"),
    Spec("mesh2x2-f32-causal", "2x2", F32, H=4, M=17, N=17, q_split=[3, 7, 2, 5], causal=True),
    Spec("ring4-f64-causal", "ring", F64, M=16, N=16, q_split=[4, 4, 4, 4], causal=True),
    Spec(
        "mesh2x2-f32-cross77",
        "2x2",
        F32,
        H=4,
        M=40,
        N=77,
        q_split=[10, 10, 10, 10],
        k_split=[20, 19, 19, 19],
        bias="keypad",
    ),
    # 4097 tokens on 4 ranks: 1025 + 1024 * 3, nothing padded (forward: gradients of
    # uneven shards are above, and a float64 reference backward at 4097^2 costs seconds)
    Spec("ring4-f32-4097", "ring", F32, B=1, H=1, M=4097, N=4097, D=16, grad=False),
    # traffic, forward only: measured bytes against the model's formulas
    Spec("bytes-ring4", "ring", F32, M=16, N=16, q_split=[4] * 4, grad=False),
    Spec("bytes-ring4-causal", "ring", F32, M=16, N=16, q_split=[4] * 4, grad=False, causal=True),
    Spec("bytes-ulysses4", "ulysses", F32, H=4, M=16, N=16, q_split=[4] * 4, grad=False),
    Spec("bytes-mesh2x2", "2x2", F32, H=4, M=16, N=16, q_split=[4] * 4, grad=False),
    # the order of transfers and computation, forward and backward
    Spec("overlap-ring4", "ring", F32, M=16, N=16, q_split=[4] * 4, trace=True),
    Spec("err-ulysses4-heads", "ulysses", H=6, expect={r: "ulysses degree 2 and ring degree 2" for r in range(4)}),
]


def case_id(spec: Spec) -> str:
    return spec.name


def run_batch(specs: list[Spec], world: int, seed: int, timeout: float) -> dict:
    cases = [make_case(s, seed + i) for i, s in enumerate(specs)]
    results = values(
        run_ranks("tests.parallel._parallel_cases:attention_batch", world, {"cases": cases}, timeout=timeout)
    )
    return {s.name: ([r[i] for r in results], cases[i]) for i, s in enumerate(specs)}


@pytest.fixture(scope="module")
def two_ranks(module_seed):
    return run_batch(TWO, 2, module_seed, timeout=150)


@pytest.fixture(scope="module")
def four_ranks(module_seed):
    return run_batch(FOUR, 4, module_seed, timeout=150)


# -- checks -------------------------------------------------------------------------------


def assembled(per_rank, key, run=0, dim=2):
    return torch.cat([p["value"]["runs"][run][key] for p in per_rank], dim=dim)


def check_against_one_process(spec: Spec, per_rank: list, case: dict):
    for r, p in enumerate(per_rank):
        assert p["ok"], f"rank {r} raised {p['type']}: {p['message']}"
    q, k, v, dout = case["q"], case["k"], case["v"], case["dout"]
    bias64 = reference_bias(spec, case["bias"])
    out = assembled(per_rank, "out")
    assert out.dtype == spec.dtype and out.shape == (spec.B, spec.H, spec.M, spec.D)
    truth_bias = exact_bias(bias64)
    ref = reference_attention(q, k, v, truth_bias)
    # the rule: twice plain torch's error in this dtype (on the problem as given) + epsilon
    err, tol = rel_error(out, ref), tolerance(q, k, v, bias64, ref=ref)
    assert err <= tol, f"out: relative error {err:.3e} > tolerance {tol:.3e}"
    if spec.bias in ("neg1e9", "finfo-min"):
        # the rows masked everywhere, held to the dtype's own precision, not the rule's
        rows = list(MASKED_ROW_ROWS)
        row_err = rel_error(out[:, :, rows], ref[:, :, rows])
        assert row_err <= (1e-12 if spec.dtype == F64 else 1e-5), f"masked rows: relative error {row_err:.3e}"

    ins = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_out = reference_attention(*ins, truth_bias)
    ref_terms = [(ref_out, dout.double())]
    base_in = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    base_terms = [(torch_math_attention(*base_in, bias64), dout)]
    if spec.return_lse:
        lse = assembled(per_rank, "lse")
        ref_lse = lse_of(ins[0], ins[1], bias64, torch.float64)
        assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
        finite = ~torch.isneginf(ref_lse)
        lse_tol = 1e-12 if spec.dtype == F64 else 1e-5
        assert rel_error(lse[finite], ref_lse[finite]) <= lse_tol
        ref_terms.append((ref_lse, case["dlse"].double()))
        base_terms.append((lse_of(base_in[0], base_in[1], bias64, spec.dtype), case["dlse"].to(spec.dtype)))
    if not spec.grad:
        return
    ref_g = torch.autograd.grad(sum((a * b).sum() for a, b in ref_terms), ins)
    base_g = torch.autograd.grad(sum((a.float() * b.float()).sum() for a, b in base_terms), base_in)
    if not whole(spec):
        got = [assembled(per_rank, "d" + n) for n in "qkv"]
    else:  # k and v are whole on every rank: each rank holds its queries' share
        got = [assembled(per_rank, "dq")] + [sum(p["value"]["runs"][0]["d" + n] for p in per_rank) for n in "kv"]
    for name, g, r, b in zip("qkv", got, ref_g, base_g):
        tol = 2.0 * rel_error(b, r) + EPSILON[spec.dtype]
        assert g.dtype == spec.dtype and g.shape == r.shape
        err = rel_error(g, r)
        assert err <= tol, f"d{name}: relative error {err:.3e} > tolerance {tol:.3e}"
    for rep in range(1, spec.repeat):
        for p in per_rank:
            first, again = p["value"]["runs"][0], p["value"]["runs"][rep]
            for key in ("out", "lse", "dq", "dk", "dv"):
                if first.get(key) is not None:
                    assert torch.equal(first[key], again[key]), f"{key} differs between two runs"


def check_refusal(spec: Spec, per_rank: list):
    for r, want in spec.expect.items():
        p = per_rank[r]
        assert not p["ok"], f"rank {r} did not refuse"
        assert p["type"] == "ValueError", f"rank {r}: {p['type']}: {p['message']}"
        assert want in p["message"], f"rank {r}: {p['message']!r} does not say {want!r}"


def check(spec: Spec, batch: dict):
    per_rank, case = batch[spec.name]
    if spec.expect:
        check_refusal(spec, per_rank)
    else:
        check_against_one_process(spec, per_rank, case)


@pytest.mark.parametrize("spec", TWO, ids=case_id)
def test_two_ranks(spec, two_ranks):
    check(spec, two_ranks)


@pytest.mark.parametrize("spec", [s for s in FOUR if not s.name.startswith(("bytes", "overlap"))], ids=case_id)
def test_four_ranks(spec, four_ranks):
    check(spec, four_ranks)


# -- traffic and overlap ------------------------------------------------------------------


def measured(batch, name, kind):
    per_rank, _ = batch[name]
    for r, p in enumerate(per_rank):
        assert p["ok"], f"rank {r} raised {p['type']}: {p['message']}"
    return [p["value"]["runs"][0]["bytes_by_kind"].get(kind, 0) for p in per_rank]


@pytest.mark.parametrize("name", ["bytes-ring4", "bytes-ring4-causal", "bytes-ulysses4", "bytes-mesh2x2"])
def test_traffic_matches_the_model(name, four_ranks):
    """Bytes each rank sends in the forward, as counted by the transfers, against the
    closed-form model the benchmark extrapolates with (even shards)."""
    spec = next(s for s in FOUR if s.name == name)
    shape = model.Shape(batch=spec.B, heads=spec.H, q_len=spec.M, kv_len=spec.N, head_dim=spec.D, elem_bytes=4)
    if spec.mesh == "ring":
        got = measured(four_ranks, name, "ring-kv")
        want = model.ring_bytes(shape, ring=4, causal=spec.causal)
    elif spec.mesh == "ulysses":
        got = measured(four_ranks, name, "a2a")
        want = model.ulysses_bytes(shape, ulysses=4)
    else:
        got = [a + b for a, b in zip(measured(four_ranks, name, "a2a"), measured(four_ranks, name, "ring-kv"))]
        want = model.mesh_bytes(shape, ring=2, ulysses=2)
    # the model gives the mean over ranks; the ring's causal schedule is uneven by nature
    assert sum(got) / len(got) == pytest.approx(want, rel=1e-12), (got, want)
    if spec.causal:
        full = model.ring_bytes(shape, ring=4, causal=False)
        assert sum(got) / len(got) == pytest.approx(full / 2)  # blocks above the diagonal stay home


def test_transfers_start_before_the_block_they_overlap(four_ranks):
    """At every ring step that has a next block, its transfer is started before the
    current block is computed (forward and backward): communication overlaps compute."""
    per_rank, _ = four_ranks["overlap-ring4"]
    for r, p in enumerate(per_rank):
        assert p["ok"], f"rank {r} raised {p['type']}: {p['message']}"
        events = p["value"]["runs"][0]["trace"]
        computes = [i for i, e in enumerate(events) if e == "compute"]
        # 4 blocks forward + 4 backward on every rank (non-causal: every block is needed)
        assert len(computes) == 8, events
        for phase in (computes[:4], computes[4:]):
            for i in phase[:-1]:
                before = events[:i]
                last_compute = max([j for j in computes if j < i], default=-1)
                assert "post" in before[last_compute + 1 :], (
                    f"rank {r}: no transfer started before compute {i}: {events}"
                )


# -- failures end every rank, within a bound ------------------------------------------------


def test_a_rank_that_raises_ends_every_rank(seed):
    """Rank 1's local attention raises inside the ring: rank 1 ends with its error, rank 0
    with ContextParallelError naming the transfer it waited on; neither hangs."""
    q, k, v = make_qkv(1, 2, 16, 16, 8, F32, layout="bnhd")
    res = run_ranks(
        "tests.parallel._parallel_cases:raise_in_local", 2, {"qkv": (q, k, v)}, timeout=60, group_timeout=30
    )
    assert res[1]["type"] == "RuntimeError" and "injected failure" in res[1]["message"]
    assert res[0]["type"] == "ContextParallelError", res[0]
    assert "ring attention" in res[0]["message"] and "another rank" in res[0]["message"].lower()
    # a peer that exits is seen at once, not after the group's 30 s timeout
    assert all(r["exitcode"] != 0 for r in res)
    assert res[0]["seconds"] < 25, res[0]["seconds"]


def test_a_group_that_times_out_ends_every_rank(seed):
    """Rank 1 calls only after the group's timeout: rank 0 times out exchanging the call's
    description and raises; rank 1 then finds rank 0 gone and raises too."""
    q, k, v = make_qkv(1, 2, 8, 8, 8, F32)
    res = run_ranks(
        "tests.parallel._parallel_cases:stall", 2, {"qkv": (q, k, v), "sleep": 6.0}, timeout=60, group_timeout=3
    )
    assert res[0]["type"] == "ContextParallelError", res[0]
    assert "exchanging the call's description" in res[0]["message"]
    assert not res[1]["ok"], res[1]
    assert all(r["exitcode"] != 0 for r in res)


def test_auto_tells_whole_keys_from_shards(two_ranks):
    """kv_sharded='auto': the text keys every rank holds whole move nowhere; shards of a
    self-attention go through the all-to-all as usual."""
    per_rank, _ = two_ranks["ring-f32-cross77-auto-whole"]
    for p in per_rank:
        assert p["ok"], p
        kinds = p["value"]["runs"][0]["bytes_by_kind"]
        assert set(kinds) <= {"meta"}, kinds
    per_rank, _ = two_ranks["ulysses-f64-auto-sharded"]
    assert all(p["value"]["runs"][0]["bytes_by_kind"].get("a2a", 0) > 0 for p in per_rank)
