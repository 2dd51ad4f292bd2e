"""The zoo's tests of LTX-Video and LTX-2 (and LTX-2's diffusion decoder).

The cases: tests/zoo/cases/ltx.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import ltx

globals().update(family_tests(ltx.CASES))
