"""The zoo's tests of audio models: ACE-Step, LongCat audio DiT, MiniMax Music 3, Stable
Audio Open (and 3), T5FilmDecoder.

The cases: tests/zoo/cases/audio.py. The tests (tests/zoo/_checks.py): each case with
attnkit against stock (tests/zoo/_served.py) and with its stock attention
(tests/zoo/_stock_a.py or _stock_b.py).
"""

from tests.zoo._checks import family_tests
from tests.zoo.cases import audio

globals().update(family_tests(audio.CASES))
