"""The quality guard of a lossy backend: for each module and call signature, the first call
and then one call in ``every`` compute some query rows exactly as well, and compare them
with the lossy result: ``rows`` spread evenly, and the ``risky_rows`` that quantisation
disturbs most (a token of one wide channel, large scores: risky_rows()), where a few
corrupted tokens hide that an even sample would average away. Each row is judged: past
``max_row_error`` for the worst checked row, ``max_error`` over all of them, or below
``min_cosine``, that module falls back to the exact backend for that signature: this
call's output is computed again exactly, and one warning names the layer and the
figures. ``explain()`` shows every module's measured errors and state.

    auto(lossy="int8")                                   # the defaults below
    auto(lossy="int8", guard={"every": 16, "max_error": 0.02})
    auto(lossy="int8", guard=False)                      # no checks (not recommended)

The check costs one exact attention over ``rows + risky_rows`` query rows (against all
keys) and one host synchronisation (reading the figures), on checked calls only: with the defaults,
the first call of each module and signature and one in 64 after it. The other calls run
the lossy backend alone, with no synchronisation. The thresholds are a safety net for
failures, not a tuning of accuracy: the int8 kernel's relative error on well-behaved
inputs is about 1% (docs/int8.md), and what users report from quantised attention
(black or noisy images) comes from layers at tens of percent or NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

DEFAULTS = {"every": 64, "rows": 32, "risky_rows": 16, "max_error": 0.05, "max_row_error": 0.2, "min_cosine": 0.998}


def guard_options(guard: Any) -> dict | None:
    """The guard's settings from auto()'s ``guard`` option (None: no guard)."""
    if guard is False:
        return None
    if guard is None or guard is True:
        return dict(DEFAULTS)
    if not isinstance(guard, Mapping):
        raise ValueError(f"guard={guard!r}: pass a dict of {', '.join(DEFAULTS)}, True (the defaults) or False")
    unknown = sorted(set(guard) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"guard has no option {', '.join(map(repr, unknown))}; its options are {', '.join(DEFAULTS)}")
    out = {**DEFAULTS, **guard}
    for name in ("every", "rows"):
        if not isinstance(out[name], int) or isinstance(out[name], bool) or out[name] < 1:
            raise ValueError(f"guard {name}={out[name]!r}: use a positive int")
    if not isinstance(out["risky_rows"], int) or isinstance(out["risky_rows"], bool) or out["risky_rows"] < 0:
        raise ValueError(f"guard risky_rows={out['risky_rows']!r}: use an int >= 0")
    for name in ("max_error", "max_row_error"):
        if not (isinstance(out[name], (int, float)) and out[name] > 0):
            raise ValueError(f"guard {name}={out[name]!r}: use a positive number (relative L2 error)")
    if not (isinstance(out["min_cosine"], (int, float)) and -1 <= out["min_cosine"] <= 1):
        raise ValueError(f"guard min_cosine={out['min_cosine']!r}: use a number in [-1, 1]")
    return out


@dataclass
class GuardState:
    """One module and call signature under the guard."""

    module: str
    call: str
    calls: int = 0
    checks: int = 0
    error: float | None = None  # relative L2 error of the last check, over its rows
    cosine: float | None = None
    row_error: float | None = None  # the last check's worst row: its relative L2 error
    worst_error: float = 0.0
    fallen_back: bool = False
    history: list = field(default_factory=list)  # (call number, error, cosine, worst row error) of each check

    def due(self, every: int) -> bool:
        return self.checks == 0 or self.calls % every == 0

    def describe(self) -> str:
        state = "fell back to exact" if self.fallen_back else "lossy"
        figures = (
            "not checked yet"
            if self.error is None
            else f"worst row's relative L2 error {self.row_error:.3g}, overall {self.error:.3g}, cosine "
            f"{self.cosine:.6f} (worst overall error {self.worst_error:.3g} over {self.checks} check(s))"
        )
        return f"{self.module} [{self.call}]: {state} after {self.calls} call(s); {figures}"


def sample_rows(m: int, rows: int, device) -> torch.Tensor:
    """Up to ``rows`` query rows spread over 0..m-1, the first and last included."""
    if m <= rows:
        return torch.arange(m, device=device)
    return torch.linspace(0, m - 1, rows, device=device).round().long().unique()


def risky_rows(q: torch.Tensor, k: torch.Tensor, count: int) -> torch.Tensor:
    """The ``count`` query rows whose scores int8 quantisation disturbs most, on the
    device (no host synchronisation): quantisation perturbs a score q.k by about
    step(q) * |k| + |q| * step(k), where a query's step is its largest magnitude over 127
    and a key's is its block's (int8/quant.py), at most the widest key's, which is what is
    used here; a row of one wide channel (a large step against its norm) or of large
    scores ranks high. The highest over the batch and heads ranks each row."""
    m = q.shape[2]
    count = min(count, m)
    if count == 0:
        return torch.zeros(0, dtype=torch.long, device=q.device)
    qf, kf = q.detach().float(), k.detach().float()
    k_step = kf.abs().amax(-1).amax(-1, keepdim=True)  # (B, H, 1): the widest key's step (x 127)
    k_norm = torch.linalg.vector_norm(kf, dim=-1).amax(-1, keepdim=True)
    risk = qf.abs().amax(-1) * k_norm + torch.linalg.vector_norm(qf, dim=-1) * k_step  # (B, H, M)
    return risk.reshape(-1, m).amax(0).topk(count).indices


def checked_rows(q: torch.Tensor, k: torch.Tensor, guard: Mapping) -> torch.Tensor:
    """The query rows a check computes exactly: ``rows`` spread evenly, then the
    ``risky_rows`` most at risk (a row in both is checked twice: no host read to
    deduplicate)."""
    return torch.cat([sample_rows(q.shape[2], guard["rows"], q.device), risky_rows(q, k, guard["risky_rows"])])


def sample_inputs(q, k, v, attn_bias, causal_offset, rows: torch.Tensor):
    """(q rows, bias for those rows as one additive float32 tensor or None): the exact
    attention of the sampled query rows against all keys, the causal mask folded into
    the bias (the rows are not contiguous)."""
    B, H, M, _ = q.shape
    N = k.shape[2]
    q_s = q.index_select(2, rows)
    bias = None
    if attn_bias is not None:
        full = attn_bias.reshape((1,) * (4 - attn_bias.dim()) + tuple(attn_bias.shape))
        if full.dtype == torch.bool:
            full = torch.zeros(full.shape, dtype=torch.float32, device=full.device).masked_fill(~full, float("-inf"))
        bias = (full.index_select(2, rows) if full.shape[2] == M and M > 1 else full).to(torch.float32)
    if causal_offset is not None:
        keys = torch.arange(N, device=q.device)
        hidden = keys[None, :] > (rows[:, None] + causal_offset)
        causal = torch.zeros(hidden.shape, dtype=torch.float32, device=q.device).masked_fill(hidden, float("-inf"))
        bias = causal if bias is None else bias + causal
    return q_s, bias


def compare(lossy: torch.Tensor, exact: torch.Tensor) -> tuple[float, float, float]:
    """(relative L2 error, cosine, worst row's relative L2 error) of the lossy rows
    (..., rows, D) against the exact ones, in float32; NaN or inf anywhere gives
    (inf, -1, inf). A row's error is against its own norm, floored at a tenth of the rows'
    RMS norm (a row near zero is not judged on noise). One host synchronisation."""
    a, b = lossy.float(), exact.float()
    diff_rows = torch.linalg.vector_norm(a - b, dim=-1).flatten()
    ref_rows = torch.linalg.vector_norm(b, dim=-1).flatten()
    floor = 0.1 * torch.sqrt((ref_rows**2).mean()) if ref_rows.numel() else ref_rows.new_zeros(())
    rows = (diff_rows / torch.maximum(ref_rows, floor).clamp_min(torch.finfo(torch.float32).tiny)).amax()
    af, bf = a.flatten(), b.flatten()
    figures = torch.stack(
        [
            torch.linalg.vector_norm(af - bf),
            torch.linalg.vector_norm(bf),
            torch.dot(af, bf),
            torch.linalg.vector_norm(af),
            rows if diff_rows.numel() else torch.zeros((), device=a.device),
        ]
    ).tolist()
    diff, ref, dot, na, row = figures
    if not all(math.isfinite(x) for x in figures):
        return math.inf, -1.0, math.inf
    error = diff / ref if ref > 0 else (0.0 if diff == 0 else math.inf)
    cosine = dot / (na * ref) if na > 0 and ref > 0 else (1.0 if na == ref == 0 else 0.0)
    return error, cosine, row
