"""Triton kernels of attnkit.

    from attnkit.kernels import flash_attention        # needs triton (attnkit.kernels.flash)
    from attnkit.kernels.limits import input_problems  # does not

Without triton, ``import attnkit.kernels`` raises an ImportError that names the extra to
install, while ``import attnkit.kernels.limits`` (what the kernels can serve) still works.
"""

import sys as _sys

from . import limits
from .limits import (
    MAX_HEAD_DIM,
    MIN_HEAD_DIM,
    attention_flops,
    input_problems,
    padded_head_dim,
    padding_waste,
    split_head_dim,
)

_NEEDS_TRITON = ("INTERPRET", "flash_attention", "flash_attention_with_lse")
INSTALL_HINT = "pip install 'attnkit[triton]'"


def _only_a_submodule_is_imported() -> bool:
    """Whether this package is being imported as the parent of one of its submodules
    (`import attnkit.kernels.limits`) rather than for itself.

    Python imports a package before its submodule, in a call whose `name` is the
    submodule's; the frames above this one say which import is in progress. Only the
    explicit submodule form is recognised: `from attnkit.kernels import limits` imports
    the package itself first, and raises without triton.
    """
    frame = _sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_find_and_load_unlocked":
            name = frame.f_locals.get("name")
            if isinstance(name, str) and name.startswith(__name__ + "."):
                return True
        frame = frame.f_back
    return False


try:
    from .flash import INTERPRET, flash_attention, flash_attention_with_lse
except ImportError as _exc:
    if _exc.name is None or _exc.name.split(".")[0] != "triton":
        raise
    _missing = ImportError(
        f"attnkit.kernels needs triton ({_exc}): install it with {INSTALL_HINT}. "
        f"attnkit.kernels.limits works without it.",
        name=__name__,
    )
    if not _only_a_submodule_is_imported():
        raise _missing from _exc

    def __getattr__(name: str):
        # The package was imported for a submodule; its kernels still need triton.
        if name in _NEEDS_TRITON:
            raise _missing
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "INTERPRET",
    "MAX_HEAD_DIM",
    "MIN_HEAD_DIM",
    "attention_flops",
    "flash_attention",
    "flash_attention_with_lse",
    "input_problems",
    "limits",
    "padded_head_dim",
    "padding_waste",
    "split_head_dim",
]
