"""The zoo's tests of Cosmos3 Omni, Cosmos (Predict) and its ControlNet.

The cases: tests/zoo/cases/cosmos.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import cosmos

globals().update(family_tests(cosmos.CASES))
