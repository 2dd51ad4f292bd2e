"""The zoo's tests of Kandinsky 3, 5 and 6, and the Kandinsky 2 / unCLIP prior.

The cases: tests/zoo/cases/kandinsky.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import kandinsky

globals().update(family_tests(kandinsky.CASES))
