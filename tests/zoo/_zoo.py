"""The whole model zoo: the cases of every model family (tests/zoo/cases/), and how to run a
case in float64.

``CASES`` holds one or more tiny configurations of every diffusers model class that has
attention; ``NO_ATTENTION`` the classes that have none, each with the reason.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.zoo.cases import (
    audio,
    autoencoders,
    cogvideo,
    cosmos,
    dit,
    flux,
    hunyuan,
    image,
    kandinsky,
    ltx,
    lumina,
    qwen,
    rfd4,
    sana,
    sd3,
    unets,
    video,
    wan,
)

FAMILIES = {
    m.__name__.rsplit(".", 1)[1]: m
    for m in (
        audio,
        autoencoders,
        cogvideo,
        cosmos,
        dit,
        flux,
        hunyuan,
        image,
        kandinsky,
        ltx,
        lumina,
        qwen,
        rfd4,
        sana,
        sd3,
        unets,
        video,
        wan,
    )
}
CASES = [case for family in FAMILIES.values() for case in family.CASES]
NO_ATTENTION = {name: why for family in FAMILIES.values() for name, why in family.NO_ATTENTION.items()}
BY_ID = {case.id: case for case in CASES}

# The zoo was first written in two halves of diffusers' exported model classes (by name, in
# Python's string order), each with its own set of stock checks (tests/zoo/_stock_a.py and
# _stock_b.py): a case keeps the checks of the half its class is in.
SECOND_HALF_FROM = "Ideogram4Transformer2DModel"


def in_second_half(name: str) -> bool:
    return name >= SECOND_HALF_FROM


def cast_floats(x: Any, dtype: torch.dtype) -> Any:
    """Inputs with every floating tensor in ``dtype`` (complex ones widened alike)."""
    if isinstance(x, torch.Tensor):
        if x.is_floating_point():
            return x.to(dtype)
        if x.is_complex() and dtype == torch.float64:
            return x.to(torch.complex128)
        return x
    if isinstance(x, dict):
        return {k: cast_floats(v, dtype) for k, v in x.items()}
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        return type(x)(cast_floats(v, dtype) for v in x)
    return x


def copy_function(f):
    """A new function object with ``f``'s code: parametrized marks go on the copy, so that
    each test module parametrizes the shared test bodies over its own cases."""
    import types

    g = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    g.__kwdefaults__, g.__doc__, g.__qualname__, g.__module__ = (
        f.__kwdefaults__,
        f.__doc__,
        f.__qualname__,
        f.__module__,
    )
    return g


def missing_requirement(case) -> str | None:
    """The package a case needs that is not installed, or None."""
    import importlib.util

    for name in case.extra.get("requires", ()):
        if importlib.util.find_spec(name) is None:
            return name
    return None
