"""The zoo's tests of other image transformers: Anima, AuraFlow, DreamLite, ERNIE-Image,
GLM-Image, HiDream, Ideogram4, JoyImage, Krea 2, NucleusMoE-Image, OmniGen, PRX, Z-Image,
UVit2D.

The cases: tests/zoo/cases/image.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import image

globals().update(family_tests(image.CASES))
