"""The zoo's tests of CogVideoX, CogView3Plus, CogView4, ConsisID.

The cases: tests/zoo/cases/cogvideo.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import cogvideo

globals().update(family_tests(cogvideo.CASES))
