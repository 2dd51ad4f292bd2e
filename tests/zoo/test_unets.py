"""The zoo's tests of UNets: UNet1D/2D/3D, SD / SDXL / unCLIP UNet2DCondition, SVD,
I2VGen-XL, AnimateDiff, Stable Cascade, ControlNets (SD, Union, XS, SparseCtrl, Multi).

The cases: tests/zoo/cases/unets.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import unets

globals().update(family_tests(unets.CASES))
