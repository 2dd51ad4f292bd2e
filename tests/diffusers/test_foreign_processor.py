"""A user's own processor (a debugging or attention-map processor, a tutorial's, another
library's) replaced by attnkit's: the module computes its standard attention, as
diffusers' own processors would after ``set_attn_processor``, with one warning per
processor class; ``undo()`` puts the user's processor back.

Each model runs in float64: first with diffusers' processors (the reference), then with
the user's processor on every module (it wraps the module's own one and counts its
calls, as attention-map processors do), then with attnkit's processor set over it.
"""

from __future__ import annotations

import logging

import pytest
import torch

import attnkit
from attnkit.testing import rel_error
from tests.zoo._zoo import BY_ID, cast_floats

CONFIGS = [
    "UNet2DConditionModel",
    "UNet2DConditionModel-masked",
    "UNet2DConditionModel-sdxl",
    "UNet2DConditionModel-simple",
    "UNet2DModel",
    "UNet3DConditionModel",
    "UNetSpatioTemporalConditionModel",
    "AutoencoderKL",
    "AsymmetricAutoencoderKL",
    "AutoencoderKLTemporalDecoder",
    "VQModel",
    "VQModel-movq",
]
PROCESSORS = {
    "vanilla": lambda: attnkit.processor("vanilla"),
    "sliced": lambda: attnkit.processor("sliced", slice_size=1),
    "sdpa": lambda: attnkit.processor("sdpa"),
    "auto": lambda: attnkit.auto(),
}
# float64 against float64: attnkit's attention and diffusers' differ by rounding only
TOL = 1e-10


def _user_processor_class():
    """A class of its own per test: attnkit says once per class that it replaced one."""

    class AttentionMapProcessor:
        """Runs the module's own processor and counts its calls (a user's debugging aid)."""

        def __init__(self, inner):
            self.inner, self.calls = inner, 0

        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None):
            self.calls += 1
            return self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, temb)

    return AttentionMapProcessor


def _model_and_inputs(case_id):
    case = BY_ID[case_id]
    model = case.build(0).double()
    inputs = cast_floats(case.make_inputs(model, 0), torch.float64)
    return case, model, inputs


def _run(case, model, inputs):
    with torch.no_grad():
        return case.run(model, inputs)


def _with_user_processors(model):
    """The user's processor on every attention module ({module name: processor})."""
    cls = _user_processor_class()
    users = {}
    for name, module in model.named_modules():
        if hasattr(module, "set_processor") and getattr(module, "processor", None) is not None:
            users[name] = cls(module.processor)
            module.set_processor(users[name])
    return cls, users


def _processors(model):
    return {
        name: getattr(module, "processor", None)
        for name, module in model.named_modules()
        if hasattr(module, "set_processor")
    }


def _replaced_warnings(caplog, cls) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "attnkit" and f"attnkit replaced {cls.__name__}" in r.getMessage()
    ]


# (UNet2DModel, AsymmetricAutoencoderKL and VQModel have no set_attn_processor: apply only)
WITH_SET_ATTN_PROCESSOR = [
    c for c in CONFIGS if not c.startswith(("UNet2DModel", "AsymmetricAutoencoderKL", "VQModel"))
]
SET_CASES = [(c, p) for c in WITH_SET_ATTN_PROCESSOR for p in sorted(PROCESSORS)]


@pytest.mark.parametrize("case_id,proc_name", SET_CASES)
def test_set_attn_processor_replaces_a_users_processor(case_id, proc_name, caplog):
    case, model, inputs = _model_and_inputs(case_id)
    expected = _run(case, model, inputs)
    cls, users = _with_user_processors(model)
    assert all(rel_error(a, b) == 0 for a, b in zip(_run(case, model, inputs), expected))
    calls = sum(u.calls for u in users.values())
    assert calls > 0, "the user's processors did not run"
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        model.set_attn_processor(PROCESSORS[proc_name]())
        out = _run(case, model, inputs)
    for a, b in zip(out, expected):
        assert torch.isfinite(a).all()
        assert rel_error(a, b) < TOL, f"{case_id} via {proc_name}: {rel_error(a, b):.2e}"
    assert sum(u.calls for u in users.values()) == calls, "the user's processor still ran"
    said = _replaced_warnings(caplog, cls)
    assert len(said) == 1, said
    assert "undo()" in said[0] and "standard attention" in said[0], said[0]
    kept = [r.getMessage() for r in caplog.records if "keeps" in r.getMessage()]
    assert not kept, kept


@pytest.mark.parametrize("case_id", CONFIGS)
def test_apply_replaces_a_users_processor_and_undo_puts_it_back(case_id, caplog):
    case, model, inputs = _model_and_inputs(case_id)
    expected = _run(case, model, inputs)
    cls, users = _with_user_processors(model)
    explained = attnkit.plan(model).explain()
    assert f"{cls.__name__} (not diffusers' or attnkit's) replaced by the module's" in explained, explained
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        applied = attnkit.apply(model, attnkit.processor("vanilla"))
        out = _run(case, model, inputs)
    for a, b in zip(out, expected):
        assert rel_error(a, b) < TOL
    assert all(route.served for route in applied.routes.values()), applied.explain()
    assert len(_replaced_warnings(caplog, cls)) == 1
    applied.undo()
    assert _processors(model) == users, "undo() did not put the user's processors back"
    calls = sum(u.calls for u in users.values())
    _run(case, model, inputs)
    assert sum(u.calls for u in users.values()) > calls


def test_legacy_attention_module_with_a_users_processor(caplog):
    """A bare Attention module (cross-attention, group norm and residual) behaves alike."""
    from diffusers.models.attention_processor import Attention

    torch.manual_seed(0)
    attn = (
        Attention(
            query_dim=32, cross_attention_dim=16, heads=2, dim_head=16, norm_num_groups=4, residual_connection=True
        )
        .double()
        .eval()
    )
    x, ctx = torch.randn(2, 32, 3, 3, dtype=torch.float64), torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        expected = attn(x, ctx)
    cls = _user_processor_class()
    user = cls(attn.processor)
    attn.set_processor(user)
    for name in sorted(PROCESSORS):
        with caplog.at_level(logging.WARNING, logger="attnkit"):
            attn.set_processor(user)
            attn.set_processor(PROCESSORS[name]())
            with torch.no_grad():
                out = attn(x, ctx)
        assert rel_error(out, expected) < TOL, name
    assert user.calls == 0
    assert len(_replaced_warnings(caplog, cls)) == 1
