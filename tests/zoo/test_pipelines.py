"""Whole tiny diffusers pipelines through attnkit: the zoo's pipeline cases (tests/zoo/pipelines.py).

Each pipeline (components from tiny configs with random weights, prompt embeddings passed in,
2 steps, seeded) runs with stock attention in float32 and in float64 (the reference), then
on each of attnkit's routes, each on a fresh pipeline built from the same seed:

- ``set_attn_processor``: ``component.set_attn_processor(attnkit.auto())`` on every component
  that has it and has attention (the UNet or transformer, the VAE);
- ``apply``: ``attnkit.apply(pipe, attnkit.auto())``, then ``undo()``;
- ``set_attention_backend``: ``pipe.transformer`` (or ``pipe.unet``)
  ``.set_attention_backend("attnkit")``;
- ``attention_backend``: the call inside diffusers' ``attention_backend("attnkit")``;
- ``apply_vanilla``: ``attnkit.apply(pipe, attnkit.processor("vanilla"))``: on the CPU auto()
  picks SDPA, the kernel stock attention runs, and its outputs are stock's bits; attnkit's
  own math is held to the rule too, so that nothing passes because two paths run one kernel.

Every route's output is held to the tolerance rule against the float64 stock output (its
error at most twice stock float32's, plus 1e-6; see _served.py). On the routes of attnkit's
processors (set_attn_processor, apply, apply_vanilla), every attention module attnkit serves
that ran must have had its attention computed by attnkit (counted per module), and each
component attnkit serves must have run some, so a route that silently did nothing fails; on
diffusers' routes (set_attention_backend, attention_backend), where diffusers' dispatcher
reaches a processor of the denoiser, attnkit's backend must have been called. Where it reaches none (SD, SDXL, SD3, CogVideoX: processors that do not
dispatch), the pipeline computes stock's output, which the rule still checks.

And a check that the comparison can fail: attnkit's attention made wrong by 1e-3 (relative)
must break the rule on every pipeline.

diffusers exports its pipelines only when ``transformers`` is installed (see pipelines.py):
without it the pipeline tests are skipped with that reason.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

import attnkit
from attnkit.backends.vanilla import VanillaBackend
from attnkit.testing import rel_error
from tests.zoo import _served
from tests.zoo.pipelines import CASES, NO_PIPELINE

SEED = 0
EPS = _served.EPS
FALLBACK_TOL = _served.FALLBACK_TOL
ROUTES = ("set_attn_processor", "apply", "set_attention_backend", "attention_backend", "apply_vanilla")
# The pipelines the zoo must cover: a case or a reason in NO_PIPELINE each.
REQUIRED = (
    "StableDiffusionPipeline",
    "StableDiffusionXLPipeline",
    "FluxPipeline",
    "StableDiffusion3Pipeline",
    "QwenImagePipeline",
    "WanPipeline",
    "SanaPipeline",
    "CogVideoXPipeline",
    "HunyuanVideoPipeline",
    "LTXPipeline",
)

_quiet_single_thread = _served._quiet_single_thread
_no_forced_backend = _served._no_forced_backend

needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="diffusers exports its pipelines only with transformers installed (none of its models is built here)",
)


def test_every_pipeline_asked_for_has_a_case_or_a_reason():
    covered = {case.pipeline for case in CASES}
    missing = [name for name in REQUIRED if name not in covered and name not in NO_PIPELINE]
    assert not missing, f"pipelines with neither a case nor a reason in NO_PIPELINE: {missing}"
    both = sorted(covered & set(NO_PIPELINE))
    assert not both, f"in CASES and in NO_PIPELINE at once: {both}"
    assert len({case.id for case in CASES}) == len(CASES), "pipeline case ids must be unique"


class _References:
    """Stock float32 (run twice: the same bits) and stock float64 outputs of one case."""

    def __init__(self, case):
        self.case = case
        self.stock = case.run(case.build(SEED), case.call_kwargs(SEED))
        again = case.run(case.build(SEED), case.call_kwargs(SEED))
        assert torch.equal(self.stock, again), f"{case.id}: two stock runs differ: nothing could be compared"
        assert torch.isfinite(self.stock).all(), f"{case.id}: stock output not finite"
        try:
            self.ref = case.run(case.build(SEED, torch.float64), case.call_kwargs(SEED, torch.float64))
        except RuntimeError:  # a module pinned to float32 inside (dtype mismatch)
            self.ref = None

    def error(self, out: torch.Tensor) -> tuple[float, float]:
        """(out's error, the rule's tolerance for it)."""
        if self.ref is None:
            return rel_error(out, self.stock), FALLBACK_TOL
        return rel_error(out, self.ref), 2 * rel_error(self.stock, self.ref) + EPS

    def check(self, out: torch.Tensor, what: str) -> None:
        assert out.shape == self.stock.shape and out.dtype == self.stock.dtype, what
        assert torch.isfinite(out).all(), f"{what}: non-finite output"
        err, tol = self.error(out)
        against = "stock float32" if self.ref is None else "float64"
        assert err <= tol, f"{what}: error {err:.2e} against {against} > the rule's {tol:.2e}"


_refs: dict[str, _References] = {}


def _refs_of(case) -> _References:
    if case.id not in _refs:
        _refs[case.id] = _References(case)
    return _refs[case.id]


def _denoiser(pipe):
    return pipe.transformer if getattr(pipe, "transformer", None) is not None else pipe.unet


def _modules(pipe) -> dict[str, tuple[torch.nn.Module, dict]]:
    """{component name: (component, {module name: module})} of the components that are models."""
    return {name: (c, dict(c.named_modules())) for name, c in pipe.components.items() if isinstance(c, torch.nn.Module)}


def _served_modules(routes_by_component, modules) -> dict[str, torch.nn.Module]:
    """{"component.module": module} of the attention modules a route serves."""
    return {
        f"{component}.{name}": modules[component][1][name]
        for component, routes in routes_by_component.items()
        for name, route in routes.items()
        if route.served
    }


def _assert_attnkit_computed(served: dict[str, torch.nn.Module], ran: set[int], counts: dict[int, int], what: str):
    assert served, f"{what}: attnkit serves no attention module of the pipeline"
    ran_served = {name for name, m in served.items() if id(m) in ran}
    silent = sorted(name for name in ran_served if not counts.get(id(served[name])))
    assert not silent, f"{what}: modules that ran without attnkit computing their attention: {silent}"
    components = {name.split(".", 1)[0] for name in served}
    unseen = sorted(c for c in components if not any(n.startswith(c + ".") for n in ran_served))
    assert not unseen, f"{what}: no attention module attnkit serves in {unseen} ran (the case no longer covers them)"


def _run_set_attn_processor(case, pipe, what):
    proc = attnkit.auto()
    modules = _modules(pipe)
    targets = {
        name: c
        for name, (c, _) in modules.items()
        if hasattr(c, "set_attn_processor") and getattr(c, "attn_processors", None)
    }
    assert targets, f"{what}: no component has set_attn_processor and attention"
    # as set_attn_processor reaches them: modules with a processor of their own
    routes = {
        name: {n: r for n, r in attnkit.plan(c).routes.items() if hasattr(modules[name][1][n], "set_processor")}
        for name, c in targets.items()
    }
    served = _served_modules(routes, modules)
    counts = _served._count_calls_per_module(proc, served.values())
    ran = _served._modules_that_run(pipe, served.values())
    for c in targets.values():
        c.set_attn_processor(proc)
    out = case.run(pipe, case.call_kwargs(SEED))
    _assert_attnkit_computed(served, ran, counts, what)
    return out


def _run_apply(case, pipe, what, proc=None):
    proc = attnkit.auto() if proc is None else proc
    modules = _modules(pipe)
    routes = {name: applied.routes for name, applied in attnkit.plan(pipe).items()}
    served = _served_modules(routes, modules)
    counts = _served._count_calls_per_module(proc, served.values())
    ran = _served._modules_that_run(pipe, served.values())
    applied = attnkit.apply(pipe, proc)
    assert set(applied) == set(routes), f"{what}: apply served other components than plan named"
    out = case.run(pipe, case.call_kwargs(SEED))
    _assert_attnkit_computed(served, ran, counts, what)
    applied.undo()
    undone = case.run(pipe, case.call_kwargs(SEED))
    assert torch.equal(undone, _refs_of(case).stock), f"{what}: after undo() the pipeline is not stock (bits)"
    return out


def _dispatch_counter(monkeypatch) -> list[int]:
    """Counts the calls diffusers' dispatcher makes to attnkit's backend ("attnkit")."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    member = AttentionBackendName("attnkit")
    real = _AttentionBackendRegistry._backends[member]
    calls = [0]

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setitem(_AttentionBackendRegistry._backends, member, counting)
    return calls


def _run_set_attention_backend(case, pipe, what, monkeypatch):
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    calls = _dispatch_counter(monkeypatch)
    denoiser = _denoiser(pipe)
    reached = _served._reached_by_set_attention_backend(denoiser)
    active = _AttentionBackendRegistry._active_backend
    try:
        denoiser.set_attention_backend("attnkit")
        out = case.run(pipe, case.call_kwargs(SEED))
    finally:  # set_attention_backend also sets diffusers' process-wide backend
        _AttentionBackendRegistry.set_active_backend(active)
    if reached:
        assert calls[0] >= 1, (
            f"{what}: diffusers' dispatcher reaches processors of the {type(denoiser).__name__} "
            "but attnkit's backend was never called"
        )
    return out


def _run_attention_backend(case, pipe, what, monkeypatch):
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry, attention_backend

    calls = _dispatch_counter(monkeypatch)
    denoiser = _denoiser(pipe)
    active = _AttentionBackendRegistry._active_backend
    with attention_backend("attnkit"):
        out = case.run(pipe, case.call_kwargs(SEED))
    assert _AttentionBackendRegistry._active_backend == active, f"{what}: the active backend was not restored"
    if _served._reached_by_set_attention_backend(denoiser):
        assert calls[0] >= 1, (
            f"{what}: the {type(denoiser).__name__}'s processors dispatch but attnkit's backend was never called"
        )
    return out


_RUNNERS = {
    "set_attn_processor": lambda case, pipe, what, mp: _run_set_attn_processor(case, pipe, what),
    "apply": lambda case, pipe, what, mp: _run_apply(case, pipe, what),
    "set_attention_backend": _run_set_attention_backend,
    "attention_backend": _run_attention_backend,
    "apply_vanilla": lambda case, pipe, what, mp: _run_apply(case, pipe, what, attnkit.processor("vanilla")),
}


@needs_transformers
@pytest.mark.parametrize(
    "case,route", [pytest.param(case, route, id=f"{case.id}-{route}") for case in CASES for route in ROUTES]
)
def test_route_matches_stock(case, route, monkeypatch):
    refs = _refs_of(case)
    what = f"{case.id} ({case.pipeline}) through {route}"
    out = _RUNNERS[route](case, case.build(SEED), what, monkeypatch)
    refs.check(out, what)


class _OffBackend(VanillaBackend):
    """attnkit's vanilla attention, wrong by 1e-3 relative (varying along the queries)."""

    def forward(self, q, k, v, *args, **kwargs):
        out = super().forward(q, k, v, *args, **kwargs)
        wobble = torch.cos(torch.arange(out.shape[-2], device=out.device, dtype=out.dtype) * (math.pi / 3))
        return out * (1 + 1e-3 * wobble[:, None])


@needs_transformers
@pytest.mark.parametrize("case", [pytest.param(case, id=case.id) for case in CASES])
def test_wrong_attention_breaks_the_rule(case):
    """The comparison can fail: attnkit.apply with an attention wrong by 1e-3 gives an
    output outside the rule (so a wrong backend, or a route that computes something else,
    would be seen)."""
    refs = _refs_of(case)
    pipe = case.build(SEED)
    attnkit.apply(pipe, attnkit.auto(order=["vanilla"], backends={"vanilla": _OffBackend()}))
    out = case.run(pipe, case.call_kwargs(SEED))
    err, tol = refs.error(out)
    assert err > tol, f"{case.id}: an attention wrong by 1e-3 moved the output by only {err:.2e} (rule: {tol:.2e})"
