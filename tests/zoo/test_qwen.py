"""The zoo's tests of Qwen-Image (its ControlNets) and Qwen-Image 2.1.

The cases: tests/zoo/cases/qwen.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import qwen

globals().update(family_tests(qwen.CASES))
