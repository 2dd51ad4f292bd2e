"""The zoo's tests of Flux and the Flux-like: Flux, Flux ControlNets, Flux2, Flux3, Chroma,
Bria (and Fibo), LongCat-Image, Ovis-Image.

The cases: tests/zoo/cases/flux.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import flux

globals().update(family_tests(flux.CASES))
