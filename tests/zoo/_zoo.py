"""The whole model zoo: the cases of both halves, and how to run a case in float64.

``CASES`` holds one or more tiny configurations of every diffusers model class that has
attention; ``NO_ATTENTION`` the classes that have none, each with the reason.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.zoo import _zoo_cases_a
from tests.zoo import _zoo_cases_b

CASES = _zoo_cases_a.CASES + _zoo_cases_b.CASES
NO_ATTENTION = {**_zoo_cases_a.NO_ATTENTION, **_zoo_cases_b.NO_ATTENTION}
BY_ID = {case.id: case for case in CASES}


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


def missing_requirement(case) -> str | None:
    """The package a case needs that is not installed, or None."""
    import importlib.util

    for name in case.extra.get("requires", ()):
        if importlib.util.find_spec(name) is None:
            return name
    return None
