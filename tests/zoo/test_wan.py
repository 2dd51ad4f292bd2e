"""The zoo's tests of Wan (2.1 / 2.2, VACE, Animate, Animate-2), SkyReels-V2, ChronoEdit
(Wan layout).

The cases: tests/zoo/cases/wan.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import wan

globals().update(family_tests(wan.CASES))
