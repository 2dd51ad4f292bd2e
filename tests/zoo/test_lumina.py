"""The zoo's tests of Lumina 2 and Lumina-Next.

The cases: tests/zoo/cases/lumina.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import lumina

globals().update(family_tests(lumina.CASES))
