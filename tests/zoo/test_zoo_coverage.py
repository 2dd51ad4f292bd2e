"""The whole zoo against the installed diffusers: every model class has a case (tests/zoo/cases/)
or a reason in NO_ATTENTION, and a class said to have no attention has none. The per-case
tests are in tests/zoo/test_<family>.py.

Three checks of the class list, from the zoo's first layout: the whole zoo (any exported
ModelMixin class), and each half of the alphabet on its own (A... to Ideogram4PromptEnhancerHead, then
Ideogram4Transformer2DModel on), each half with its own test of the attention-free classes.
"""

from __future__ import annotations

import inspect

import diffusers
import pytest
import torch

from tests.zoo._stock_a import CASES as FIRST_HALF_CASES
from tests.zoo._stock_a import FIRST, attention_modules
from tests.zoo._stock_a import NO_ATTENTION as FIRST_HALF_NO_ATTENTION
from tests.zoo._stock_b import FIRST_CLASS, HALF_CASES, HALF_NO_ATTENTION
from tests.zoo._zoo import CASES, NO_ATTENTION, in_second_half

# Attention-free classes whose constructor has required arguments: small values that build them.
NO_ATTENTION_ARGS = {
    "AudioLDM2ProjectionModel": dict(text_encoder_dim=8, text_encoder_1_dim=8, langauge_model_dim=8),
    "StableAudioProjectionModel": dict(text_encoder_dim=8, conditioning_dim=8, min_value=0, max_value=10),
    "UniDiffuserTextDecoder": dict(prefix_length=4, prefix_inner_dim=768),
}


def _transformers_modules(model) -> list[str]:
    """Modules of ``model`` that are transformers' own (a text decoder's GPT-2): their attention
    is transformers', which attnkit does not serve; a class whose only attention runs there is
    attention-free for the zoo, and its reason must say so."""
    return [n for n, m in model.named_modules() if type(m).__module__.startswith("transformers.")]


# -- the whole zoo --------------------------------------------------------------------------


def test_every_model_class_with_attention_has_a_case():
    """Discovered from the installed diffusers: a new model class without a case fails."""
    import diffusers
    from diffusers import ModelMixin

    exported = sorted(
        n
        for n in dir(diffusers)
        if inspect.isclass(getattr(diffusers, n, None))
        and issubclass(getattr(diffusers, n), ModelMixin)
        and getattr(diffusers, n) is not ModelMixin
    )
    covered = {c.name for c in CASES}
    missing = [n for n in exported if n not in covered and n not in NO_ATTENTION]
    assert not missing, f"diffusers model classes with neither a zoo case nor a reason in NO_ATTENTION: {missing}"
    assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique across the families"


# -- the first half -------------------------------------------------------------------------


def test_every_class_of_this_half_has_a_case_or_a_reason():
    """The first half (A... up to Ideogram4Transformer2DModel, exclusive)."""
    exported = []
    for name in dir(diffusers):
        if name < FIRST or in_second_half(name) or name == "ModelMixin":
            continue
        obj = getattr(diffusers, name)
        if isinstance(obj, type) and issubclass(obj, diffusers.ModelMixin):
            exported.append(name)
    covered = {c.name for c in FIRST_HALF_CASES}
    missing = [n for n in exported if n not in covered and n not in FIRST_HALF_NO_ATTENTION]
    assert not missing, f"no zoo case and no reason in NO_ATTENTION for: {missing}"
    both = sorted(covered & set(FIRST_HALF_NO_ATTENTION))
    assert not both, f"in CASES and in NO_ATTENTION at once: {both}"
    foreign = sorted((covered | set(FIRST_HALF_NO_ATTENTION)) - set(exported))
    assert not foreign, f"not a ModelMixin class of this half exported by diffusers: {foreign}"
    assert len({c.id for c in FIRST_HALF_CASES}) == len(FIRST_HALF_CASES), "case ids must be unique"


@pytest.mark.parametrize("name", sorted(FIRST_HALF_NO_ATTENTION))
def test_no_attention_classes_really_have_none(name):
    """A class said to have no attention has no module computing it in its default
    configuration (built on the meta device: no memory, no weights), nor a processor."""
    cls = getattr(diffusers, name)
    with torch.device("meta"):
        model = cls(**NO_ATTENTION_ARGS.get(name, {}))
    found = attention_modules(model)
    foreign = set(_transformers_modules(model))
    if foreign:
        assert "transformers" in FIRST_HALF_NO_ATTENTION[name], f"{name} holds transformers modules: say so"
        found = {n: m for n, m in found.items() if n not in foreign}
    assert not found, f"{name} has attention modules: {sorted({type(m).__name__ for m in found.values()})}"
    assert not getattr(model, "attn_processors", {}), f"{name} has attention processors"


# -- the second half ------------------------------------------------------------------------


def _half_classes():
    import diffusers
    from diffusers import ModelMixin

    return sorted(
        name
        for name in dir(diffusers)
        if name >= FIRST_CLASS
        and name != "ModelMixin"
        and isinstance(getattr(diffusers, name, None), type)
        and issubclass(getattr(diffusers, name), ModelMixin)
    )


def test_every_class_of_the_half_is_covered():
    cased = {c.name for c in HALF_CASES}
    overlap = cased & set(HALF_NO_ATTENTION)
    assert not overlap, f"both a case and declared attention-free: {sorted(overlap)}"
    missing = [n for n in _half_classes() if n not in cased and n not in HALF_NO_ATTENTION]
    assert not missing, f"model classes with neither a zoo case nor a NO_ATTENTION reason: {missing}"
    unknown = sorted((cased | set(HALF_NO_ATTENTION)) - set(_half_classes()))
    assert not unknown, f"names that are not diffusers model classes of this half: {unknown}"


@pytest.mark.parametrize("name", sorted(HALF_NO_ATTENTION))
def test_attention_free_classes_hold_no_attention(name):
    """Built with their default configs (on the meta device: no memory, no compute)."""
    import diffusers
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention

    with torch.device("meta"):
        if name == "MultiAdapter":
            model = diffusers.MultiAdapter([diffusers.T2IAdapter(), diffusers.T2IAdapter()])
        else:
            model = getattr(diffusers, name)(**NO_ATTENTION_ARGS.get(name, {}))
    foreign = set(_transformers_modules(model))
    if foreign:
        assert "transformers" in HALF_NO_ATTENTION[name], f"{name} holds transformers modules: say so"
    suspects = [
        f"{n} ({type(m).__name__})"
        for n, m in model.named_modules()
        if n not in foreign
        and (isinstance(m, (Attention, AttentionModuleMixin)) or "attention" in type(m).__name__.lower())
    ]
    assert not suspects, f"{name} is declared attention-free but holds {suspects}"
