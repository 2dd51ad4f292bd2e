"""The zoo's tests for one model family, for tests/zoo/test_<family>.py:

    globals().update(family_tests(flux.CASES))

gives the module, parametrized over the family's cases (test ids: the case ids):
- _served.py: attnkit on the model (``attnkit.apply`` with auto and vanilla,
  ``set_attention_backend("attnkit")``, ``set_attn_processor``), equal to stock under the
  tolerance rule against float64, or kept for a listed reason;
- _stock_a.py or _stock_b.py, by the half of diffusers' classes the case's class is in
  (the two were written for one half each): with stock attention, the forward is
  deterministic and finite, every attention module runs, and attention reaches the output.
The whole-zoo checks (every class has a case or a reason) are in test_zoo_coverage.py.
"""

from __future__ import annotations

from tests.zoo import _served, _stock_a, _stock_b
from tests.zoo._zoo import in_second_half


def family_tests(cases) -> dict:
    first = [c for c in cases if not in_second_half(c.name)]
    second = [c for c in cases if in_second_half(c.name)]
    return {**_served.tests_for(cases), **_stock_a.tests_for(first), **_stock_b.tests_for(second)}
