"""auto(tune=True)'s output check and margin: a candidate whose output differs from the
priority choice's is never chosen (and a warning names it); a correct one replaces the
priority choice only when its median gain over interleaved rounds reaches tune_margin; the
cache file keeps both figures and an entry without them is tuned again.

Timing is made deterministic: the backends below are SDPA at a cost of their own on a
clock of the test's (tune_check.clock), so no assertion rests on real wall-clock time.
"""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from diffusers.models.attention_processor import Attention

import attnkit
from attnkit.backends.sdpa import SDPABackend
from attnkit.choose import tune_cache, tune_check
from attnkit.choose.auto import AUTO_OPTIONS
from attnkit.choose.fixed import run_backend
from attnkit.choose.policy import CANDIDATES
from attnkit.testing import assert_close_to_reference, make_bias, make_qkv, rel_error


@pytest.fixture(autouse=True)
def _no_forced_backend(monkeypatch):
    monkeypatch.delenv("ATTNKIT_BACKEND", raising=False)


class Clock:
    """The tuning's timer: it moves only when a Fake runs, by the Fake's cost. ``log``
    records who ran, in order."""

    def __init__(self):
        self.now = 0.0
        self.log: list[str] = []

    def __call__(self) -> float:
        return self.now


class Fake(SDPABackend):
    """SDPA that costs ``ms`` (a number, or a function of its call count) on ``clock``,
    its output passed through ``wrong`` (and its LSE through ``wrong_lse``)."""

    def __init__(self, clock, tag, ms, wrong=None, wrong_lse=None, raises=False):
        super().__init__()
        self.clock, self.tag, self.ms, self.wrong, self.wrong_lse, self.raises = (
            clock,
            tag,
            ms,
            wrong,
            wrong_lse,
            raises,
        )
        self.calls = 0

    def _spend(self):
        ms = self.ms(self.calls) if callable(self.ms) else self.ms
        self.calls += 1
        self.clock.now += ms / 1e3
        self.clock.log.append(self.tag)
        if self.raises:
            raise RuntimeError("broken for the test")

    def forward(self, *args, **kwargs):
        self._spend()
        out = super().forward(*args, **kwargs)
        return self.wrong(out) if self.wrong is not None else out

    def forward_with_lse(self, *args, **kwargs):
        self._spend()
        out, lse = super().forward_with_lse(*args, **kwargs)
        return (self.wrong(out) if self.wrong else out), (self.wrong_lse(lse) if self.wrong_lse else lse)


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(tune_check, "clock", clock)
    return clock


def tuned(path, clock, rounds=7, **costs):
    """auto(tune=True) over sdpa (the priority choice, 1 ms) and the given Fakes, in the
    order given: ``costs`` maps a label to a Fake's (ms, wrong...) or to a Fake."""
    backends = {"sdpa": Fake(clock, "sdpa", 1.0)}
    margin = costs.pop("tune_margin", tune_check.DEFAULT_MARGIN)
    for label, spec in costs.items():
        backends[label] = spec if isinstance(spec, Fake) else Fake(clock, label, spec)
    return attnkit.auto(
        tune=True, cache_path=path, order=list(backends), backends=backends, tune_iters=rounds, tune_margin=margin
    )


def qkv(dtype=torch.float32, m=24, n=20, mask="key_padding", heads=2):
    q, k, v = make_qkv(2, heads, m, n, 16, dtype, layout="bnhd")
    return q, k, v, make_bias(mask, 2, heads, m, n, dtype)


def module():
    return Attention(query_dim=32, heads=2, dim_head=16)


def call(proc, inputs, **flags):
    q, k, v, bias = inputs
    return proc.chooser.attention(module(), q, k, v, bias, None, False, **flags)


def entry_of(path):
    ((key, entry),) = tune_cache.read_raw(path).items()
    return key, entry


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def scaled(out):
    return out * 1.1


# -- the output check ---------------------------------------------------------------------------
def test_a_fast_wrong_backend_is_never_chosen_and_is_named(seed, tmp_path, clock, caplog):
    """Twice as fast and 10% off: never chosen, even with no margin at all; the warning
    names it, the call and the figures; a correct candidate beyond the margin still wins."""
    path = tmp_path / "tune.json"
    proc = tuned(path, clock, vanilla=Fake(clock, "vanilla", 0.5, wrong=scaled), sliced=0.8, tune_margin=0.0)
    inputs = qkv()
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        out = call(proc, inputs)
        call(proc, inputs)  # the same signature: no second warning
    assert_close_to_reference(out, *inputs)
    record = proc.decisions[0]
    assert record.backend == "sliced" and record.how == "tuned" and record.priority == "sdpa"
    assert record.diff["vanilla"] == "differs" and "vanilla" not in record.ms and "vanilla" not in record.gain
    warnings = warnings_of(caplog)
    assert len(warnings) == 1, warnings
    assert "vanilla" in warnings[0] and "differs" in warnings[0] and "sdpa (the priority choice)" in warnings[0]
    assert "D=16 M=24 N=20" in warnings[0] and "float32" in warnings[0] and "never chosen" in warnings[0]
    assert "output differs from sdpa's: never chosen" in proc.explain()
    _, entry = entry_of(path)
    assert entry["backend"] == "sliced" and entry["diff"]["vanilla"] == "differs"


def _few_rows_wrong(out):
    """2 of the 256 query rows of the first head moved by 30% of their norm, in random
    directions: the whole tensor is off by about 2%, two rows by 30%."""
    out = out.clone()
    rows = out[0, 0, [17, 200]]
    noise = torch.randn(rows.shape, dtype=torch.float32)
    noise = noise / noise.norm(dim=-1, keepdim=True) * rows.float().norm(dim=-1, keepdim=True) * 0.3
    out[0, 0, [17, 200]] = (rows.float() + noise).to(out.dtype)
    return out


def test_a_few_wrong_rows_are_caught_where_an_average_would_pass(seed, tmp_path, clock, caplog):
    """bfloat16, a bound of several percent: an average over the tensor (the relative L2
    error the tests hold backends to, or a 5% rule) passes this output; its worst rows do
    not."""
    inputs = qkv(torch.bfloat16, m=256, n=64, mask="none")
    path = tmp_path / "tune.json"
    proc = tuned(path, clock, vanilla=Fake(clock, "vanilla", 0.3, wrong=_few_rows_wrong))
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        call(proc, inputs)
    assert proc.decisions[0].backend == "sdpa" and proc.decisions[0].diff == {"vanilla": "differs"}
    warnings = warnings_of(caplog)
    assert len(warnings) == 1 and "vanilla" in warnings[0] and "bfloat16" in warnings[0], warnings

    # what the test is about: the average is within the bound, the worst rows are not
    q, k, v, bias = inputs
    right = SDPABackend().forward(q, k, v, bias)
    wrong = _few_rows_wrong(right)
    out_bound, _ = tune_check.output_bound((q, k, v, bias, None, False, None, 0.0, False))
    assert rel_error(wrong, right) < min(out_bound, 0.05)  # an average-only check would keep it
    assert tune_check.worst_row_error(wrong, right) > out_bound


def _one_nan(out):
    out = out.clone()
    out[1, 1, 3, 2] = float("nan")
    return out


def test_nan_never_passes(seed, tmp_path, clock, caplog):
    proc = tuned(tmp_path / "tune.json", clock, vanilla=Fake(clock, "vanilla", 0.1, wrong=_one_nan), tune_margin=0.0)
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        call(proc, qkv())
    assert proc.decisions[0].backend == "sdpa" and proc.decisions[0].diff == {"vanilla": "differs"}
    warnings = warnings_of(caplog)
    assert len(warnings) == 1 and "NaN or inf" in warnings[0], warnings


def test_a_wrong_log_sum_exp_differs(seed, tmp_path, clock, caplog):
    """A call that asks for the LSE (context parallelism merges with it): the LSE is
    checked too, against a bound of its own."""
    inputs = qkv(mask="none")
    proc = tuned(
        tmp_path / "tune.json", clock, vanilla=Fake(clock, "vanilla", 0.5, wrong_lse=lambda x: x + 0.05), sliced=0.7
    )
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        out, lse = call(proc, inputs, return_lse=True)
    assert_close_to_reference(out, *inputs)
    assert proc.decisions[0].backend == "sliced" and proc.decisions[0].diff["vanilla"] == "differs"
    assert isinstance(proc.decisions[0].diff["sliced"], float)
    assert len(warnings_of(caplog)) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_correct_backends_pass_the_check(seed, dtype):
    """vanilla (another algorithm, plain torch math in the inputs' dtype: the least
    accurate correct backend) against SDPA, with the masks, causal calls and LSE the
    tuning meets: within the bound, with room to spare."""
    from attnkit.choose.policy import default_backend

    sdpa, vanilla = default_backend("sdpa"), default_backend("vanilla")
    for mask in ("none", "key_padding", "fewkeys", "full", "2d"):
        q, k, v = make_qkv(2, 2, 160, 96, 32, dtype)
        bias = make_bias(mask, 2, 2, 160, 96, dtype)
        for upcast, causal, lse in ((False, None, False), (True, None, False), (False, 0, False), (False, None, True)):
            args = (q, k, v, bias, None, upcast, causal, 0.0, lse)
            bounds = tune_check.output_bound(args)
            fraction = tune_check.output_difference(run_backend(vanilla, *args), run_backend(sdpa, *args), bounds)
            assert fraction <= 0.8, (mask, upcast, causal, lse, fraction, bounds)


def test_worst_row_error():
    ref = torch.randn(2, 3, 50, 8)
    assert tune_check.worst_row_error(ref, ref) == 0.0
    off = ref.clone()
    off[1, 2, 7] += 1.0
    rms = ref.reshape(-1, 8).norm(dim=-1).square().mean().sqrt().item()
    assert tune_check.worst_row_error(off, ref) == pytest.approx(math.sqrt(8) / rms, rel=1e-5)
    off[0, 0, 0, 0] = float("inf")
    assert tune_check.worst_row_error(off, ref) == math.inf
    assert tune_check.worst_row_error(ref[..., :4], ref) == math.inf  # another shape
    lse = torch.randn(2, 3, 50)
    lse[0, 0, 4] = float("-inf")  # a row that sees no key: the same in both
    assert tune_check.worst_row_error(lse.unsqueeze(-1), lse.unsqueeze(-1)) == 0.0
    other = lse.clone()
    other[0, 0, 4] = 0.0
    assert tune_check.worst_row_error(other.unsqueeze(-1), lse.unsqueeze(-1)) == math.inf


def test_a_failing_candidate_is_skipped(seed, tmp_path, clock, caplog):
    proc = tuned(tmp_path / "tune.json", clock, vanilla=Fake(clock, "vanilla", 0.1, raises=True), sliced=0.5)
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        call(proc, qkv())
    assert proc.decisions[0].backend == "sliced" and proc.decisions[0].diff["vanilla"] == "failed"
    warnings = warnings_of(caplog)
    assert len(warnings) == 1 and "vanilla failed" in warnings[0] and "broken for the test" in warnings[0]


# -- the margin -----------------------------------------------------------------------------------
def test_one_percent_faster_keeps_the_priority_choice(seed, tmp_path, clock):
    path = tmp_path / "tune.json"
    proc = tuned(path, clock, vanilla=1 / 1.01)
    call(proc, qkv())
    record = proc.decisions[0]
    assert record.backend == record.priority == "sdpa" and record.how == "tuned"
    assert record.gain["vanilla"] == pytest.approx(0.01, abs=1e-6)
    assert "kept" in record.note and "+1.0%" in record.note and "+5.0% margin" in record.note
    assert entry_of(path)[1]["backend"] == "sdpa"


def test_thirty_percent_faster_replaces_it(seed, tmp_path, clock):
    path = tmp_path / "tune.json"
    proc = tuned(path, clock, vanilla=1 / 1.3)
    inputs = qkv()
    out = call(proc, inputs)
    assert_close_to_reference(out, *inputs)
    record = proc.decisions[0]
    assert record.backend == "vanilla" and record.priority == "sdpa"
    assert record.gain["vanilla"] == pytest.approx(0.3, abs=1e-6)
    assert "vanilla replaces the priority choice sdpa" in record.note and "+30.0%" in record.note
    assert "vanilla replaces the priority choice sdpa" in proc.explain()


@pytest.mark.parametrize("margin, expected", [(0.0, "vanilla"), (0.009, "vanilla"), (0.011, "sdpa")])
def test_the_margin_is_the_option(seed, tmp_path, clock, margin, expected):
    proc = tuned(tmp_path / "tune.json", clock, vanilla=1 / 1.01, tune_margin=margin)
    call(proc, qkv())
    assert proc.decisions[0].backend == expected


def test_the_largest_median_gain_wins(seed, tmp_path, clock):
    proc = tuned(tmp_path / "tune.json", clock, vanilla=1 / 1.2, sliced=1 / 1.4)
    call(proc, qkv())
    assert proc.decisions[0].backend == "sliced"
    assert proc.decisions[0].gain == pytest.approx({"vanilla": 0.2, "sliced": 0.4}, abs=1e-6)


def test_one_lucky_round_does_not_win(seed, tmp_path, clock):
    """2% slower in six rounds out of seven, twice as fast in one: its best run, or its
    mean gain (+12%), would choose it; its median gain (-2%) does not."""
    proc = tuned(tmp_path / "tune.json", clock, vanilla=lambda i: 0.5 if i % 7 == 0 else 1.02)
    call(proc, qkv())
    record = proc.decisions[0]
    assert record.backend == "sdpa"
    assert record.gain["vanilla"] == pytest.approx(1 / 1.02 - 1, abs=1e-6)


def test_rounds_interleave_with_a_rotating_order(seed, tmp_path, clock):
    proc = tuned(tmp_path / "tune.json", clock, rounds=3, vanilla=0.9, sliced=0.8)
    call(proc, qkv())
    timed = clock.log[-10:-1]  # the last entry: the call itself, by the chosen backend
    assert timed == ["sdpa", "vanilla", "sliced", "vanilla", "sliced", "sdpa", "sliced", "sdpa", "vanilla"]
    assert proc.decisions[0].backend == "sliced" and clock.log[-1] == "sliced"
    assert entry_of(tmp_path / "tune.json")[1]["rounds"] == 3


@pytest.mark.parametrize(
    "value, error, says",
    [
        ("5%", TypeError, "'5%'"),
        (True, TypeError, "True"),
        (None, TypeError, "None"),
        (1.0, ValueError, "1.0"),
        (-0.01, ValueError, "-0.01"),
        (float("nan"), ValueError, "nan"),
        (float("inf"), ValueError, "inf"),
    ],
)
def test_tune_margin_is_checked(value, error, says):
    with pytest.raises(error, match=r"tune_margin=") as info:
        attnkit.auto(tune=True, tune_margin=value)
    assert says in str(info.value) and "[0, 1)" in str(info.value)


def test_tune_margin_is_an_option():
    assert "tune_margin" in AUTO_OPTIONS
    assert attnkit.auto(tune=True, tune_margin=0).chooser.tune_margin == 0.0
    assert attnkit.auto().chooser.tune_margin == tune_check.DEFAULT_MARGIN == 0.05
    assert "tune_margin=0.1" in attnkit.auto(tune=True, tune_margin=0.1).chooser.describe()


# -- the cache file -------------------------------------------------------------------------------
def test_the_cache_keeps_both_figures(seed, tmp_path, clock, monkeypatch):
    path = tmp_path / "tune.json"
    proc = tuned(path, clock, vanilla=1 / 1.3, sliced=Fake(clock, "sliced", 0.5, wrong=scaled))
    call(proc, qkv())
    key, entry = entry_of(path)
    assert entry["backend"] == "vanilla" and entry["priority"] == "sdpa" and entry["checked"] == tune_check.CHECKED
    assert entry["margin"] == tune_check.DEFAULT_MARGIN and entry["rounds"] == 7
    assert entry["ms"] == pytest.approx({"sdpa": 1.0, "vanilla": 1 / 1.3})
    assert entry["gain"] == pytest.approx({"vanilla": 0.3}, abs=1e-6)
    assert entry["diff"]["sliced"] == "differs" and 0.0 <= entry["diff"]["vanilla"] <= 1.0
    assert tune_cache.read_cache(path, CANDIDATES)[0] == {key: entry}  # a usable entry

    # read back by a new processor: nothing run, nothing timed, the same decision and figures
    monkeypatch.setattr(tune_check, "time_rounds", _no_timing)
    monkeypatch.setattr(tune_check, "output_bound", _no_timing)
    again = tuned(path, clock, vanilla=1 / 1.3, sliced=Fake(clock, "sliced", 0.5, wrong=scaled))
    call(again, qkv())
    record = again.decisions[0]
    assert record.how == "tune cache" and record.backend == "vanilla" and record.diff["sliced"] == "differs"
    assert "vanilla replaces the priority choice sdpa" in record.note


def _no_timing(*args, **kwargs):
    raise AssertionError("tuned again although the cache has a trusted entry")


def _rewrite(path, change):
    data = json.loads(path.read_text())
    ((key, entry),) = data["entries"].items()
    change(entry)
    path.write_text(json.dumps(data))


def _strip_check(entry):
    """What an attnkit before the check wrote: the choice and its timings only."""
    for name in ("priority", "margin", "rounds", "gain", "diff", "checked"):
        del entry[name]


@pytest.mark.parametrize(
    "change",
    [
        _strip_check,
        lambda e: e.update(checked=0),
        lambda e: e.update(priority="vanilla"),  # checked against another priority choice
        lambda e: e.update(gain={"vanilla": 0.01}),  # its choice is not beyond the margin
        lambda e: e.update(diff={"vanilla": "differs"}),
        lambda e: e.update(gain="fast"),
    ],
    ids=["no-check-fields", "unchecked", "other-priority", "within-margin", "differs", "malformed"],
)
def test_an_entry_without_trustworthy_figures_is_tuned_again(seed, tmp_path, clock, change):
    path = tmp_path / "tune.json"
    call(tuned(path, clock, vanilla=1 / 1.3), qkv())
    _rewrite(path, lambda e: (change(e), e.update(note_of_a_newer_attnkit="kept?")))
    data = json.loads(path.read_text())
    data["entries"]["another"] = {"backend": "flash_attn4", "ms": {}}  # not this attnkit's: kept
    path.write_text(json.dumps(data))

    # the fast one now is wrong: the untrusted entry's choice must not stand
    proc = tuned(path, clock, vanilla=Fake(clock, "vanilla", 1 / 1.3, wrong=scaled))
    call(proc, qkv())
    assert proc.decisions[0].how == "tuned" and proc.decisions[0].backend == "sdpa"
    raw = tune_cache.read_raw(path)
    assert raw["another"] == {"backend": "flash_attn4", "ms": {}}
    entry = next(v for k, v in raw.items() if k != "another")
    assert (
        entry["backend"] == "sdpa"
        and entry["checked"] == tune_check.CHECKED
        and entry["diff"] == {"vanilla": "differs"}
    )


def test_an_entry_is_judged_under_this_choosers_margin(seed, tmp_path, clock, monkeypatch):
    """Kept within a margin of 50%, the entry's own figures (+30%) choose the candidate
    under 5%: tuned again. The same figures under 50% again: trusted."""
    path = tmp_path / "tune.json"
    first = tuned(path, clock, vanilla=1 / 1.3, tune_margin=0.5)
    call(first, qkv())
    assert first.decisions[0].backend == "sdpa"
    second = tuned(path, clock, vanilla=1 / 1.3)
    call(second, qkv())
    assert second.decisions[0].how == "tuned" and second.decisions[0].backend == "vanilla"
    assert entry_of(path)[1]["backend"] == "vanilla"
    monkeypatch.setattr(tune_check, "time_rounds", _no_timing)
    third = tuned(path, clock, vanilla=1 / 1.3, tune_margin=0.2)
    call(third, qkv())
    assert third.decisions[0].how == "tune cache" and third.decisions[0].backend == "vanilla"
