"""The zoo's tests of other video transformers: Allegro, AnyFlow, EasyAnimate, Helios,
MiniMax-H3, Mochi, Motif-Video.

The cases: tests/zoo/cases/video.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import video

globals().update(family_tests(video.CASES))
