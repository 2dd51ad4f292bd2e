"""The zoo's tests of Hunyuan: HunyuanDiT and its ControlNets, HunyuanVideo (1, 1.5,
Framepack), HunyuanImage.

The cases: tests/zoo/cases/hunyuan.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import hunyuan

globals().update(family_tests(hunyuan.CASES))
