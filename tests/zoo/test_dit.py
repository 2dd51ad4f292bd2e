"""The zoo's tests of DiT-style transformers: DiT, PixArt, Latte, diffusers'
Transformer2DModel and TransformerTemporalModel.

The cases: tests/zoo/cases/dit.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import dit

globals().update(family_tests(dit.CASES))
