"""Choosing the backend of an attention call, with nothing of diffusers in it.

* :mod:`~attnkit.choose.fixed`: the chooser contract (:class:`Chooser`), one named
  backend (:class:`FixedChooser`) and :func:`run_backend`;
* :mod:`~attnkit.choose.auto`: auto()'s walk, fallback, compile-time choice, explain()
  (its records and their words: :mod:`~attnkit.choose.decision`; lossy="int8":
  :mod:`~attnkit.choose.lossy`);
* :mod:`~attnkit.choose.policy`: the candidates and the priority list per hardware class
  (the GPU records' rules: :mod:`~attnkit.choose.record_rules`);
* :mod:`~attnkit.choose.tuning`: auto(tune=True)'s timings (the cache file:
  :mod:`~attnkit.choose.tune_cache`);
* :mod:`~attnkit.choose.compiling`: torch.compile helpers (trace-time constants).

Every route of attnkit (:mod:`attnkit.diffusers`) hands its calls to a chooser; the
choosers import nothing above them.
"""

from .auto import AutoChooser
from .fixed import Chooser, ChooserBase, FixedChooser, run_backend

__all__ = ["AutoChooser", "Chooser", "ChooserBase", "FixedChooser", "run_backend"]
