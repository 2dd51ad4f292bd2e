"""The zoo's tests of autoencoders (VAEs) of every family: image, video, audio, the DC-AE,
MMAudio's, VQModel; and the ones without attention.

The cases: tests/zoo/cases/autoencoders.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import autoencoders

globals().update(family_tests(autoencoders.CASES))
