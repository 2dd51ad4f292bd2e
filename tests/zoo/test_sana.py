"""The zoo's tests of Sana (Sprint, ControlNet, Video), SANA-WM and its LTX-2-based refiner.

The cases: tests/zoo/cases/sana.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import sana

globals().update(family_tests(sana.CASES))
