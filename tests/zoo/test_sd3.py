"""The zoo's tests of Stable Diffusion 3 / 3.5 and the SD3 ControlNets.

The cases: tests/zoo/cases/sd3.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import sd3

globals().update(family_tests(sd3.CASES))
