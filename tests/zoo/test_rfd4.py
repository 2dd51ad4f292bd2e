"""The zoo's tests of RFD4 Proteina (protein structure): the denoiser and the autoencoder.

The cases: tests/zoo/cases/rfd4.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import rfd4

globals().update(family_tests(rfd4.CASES))
