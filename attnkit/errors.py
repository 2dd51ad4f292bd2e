"""The exceptions attnkit raises for what it will not compute, in one place.

* :class:`UnsupportedModule`: an attention module or call whose computation attnkit
  cannot reproduce exactly (a ``ValueError``);
* :class:`BackendUnavailable`: a named backend cannot serve a call (its reasons as data);
* :class:`DiffusersBackendUnavailable`: attnkit cannot register itself as one of
  diffusers' attention backends here.
"""

from __future__ import annotations

from .backends.base import BackendUnavailable


class UnsupportedModule(ValueError):
    """An Attention module whose computation attnkit's processors cannot reproduce."""


class DiffusersBackendUnavailable(RuntimeError):
    """attnkit cannot register itself as a diffusers attention backend here."""


__all__ = ["BackendUnavailable", "DiffusersBackendUnavailable", "UnsupportedModule"]
