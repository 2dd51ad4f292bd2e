"""attnkit: pluggable, correct-first attention processors for diffusers.

    pipe.unet.set_attn_processor(attnkit.auto())
"""

import importlib as _importlib
import sys as _sys

from .backends import AttentionCall, BackendUnavailable, DeviceInfo, get_backend
from .errors import UnsupportedModule
from .diffusers.processor import (
    AttnkitProcessor,
    AutoProcessor,
    FlashAttnProcessor,
    SDPAProcessor,
    SlicedProcessor,
    TritonProcessor,
    VanillaProcessor,
    XFormersProcessor,
    auto,
)
from .diffusers.apply import PROCESSOR_NAMES, Applied, apply, plan, processor
from . import testing  # noqa: E402  (attnkit.testing.reference_attention)
from .diffusers import backend as _diffusers_backend
from .diffusers import binding as _binding
from .diffusers.apply import install_backend_warning as _install_backend_warning

_diffusers_backend.register_defaults()  # "attnkit", "attnkit_sdpa", ... in diffusers' dispatcher
_binding.install()  # set_attn_processor notes what attnkit's processor replaces, per module
_install_backend_warning()  # set_attention_backend("attnkit") says what it does not reach

__version__ = "0.1.0"

# Module paths of attnkit before the choose/ and diffusers/ wings, kept as names of the
# modules that hold their code now (``import attnkit.chooser``, ``attnkit.diffusers_backend``
# and pickles naming them keep working). attnkit.processor and attnkit.apply stay the
# functions; their old modules are reached by import only.
_MOVED = {
    "attnkit._compile": "attnkit.choose._compile",
    "attnkit.apply": "attnkit.diffusers.apply",
    "attnkit.binding": "attnkit.diffusers.binding",
    "attnkit.chooser": "attnkit.choose.auto",
    "attnkit.diffusers_backend": "attnkit.diffusers.backend",
    "attnkit.parallel.diffusers_cp": "attnkit.diffusers.context_parallel",
    "attnkit.policy": "attnkit.choose.policy",
    "attnkit.processor": "attnkit.diffusers.processor",
    "attnkit.protocol": "attnkit.diffusers.protocol",
    "attnkit.routes": "attnkit.diffusers.routes",
    "attnkit.tuning": "attnkit.choose.tuning",
}
for _old, _new in _MOVED.items():
    _module = _sys.modules.setdefault(_old, _importlib.import_module(_new))
    _parent, _dot, _name = _old.rpartition(".")
    if not hasattr(_sys.modules[_parent], _name):
        setattr(_sys.modules[_parent], _name, _module)
del _old, _new, _module, _parent, _dot, _name

__all__ = [
    "AttentionCall",
    "AttnkitProcessor",
    "AutoProcessor",
    "BackendUnavailable",
    "DeviceInfo",
    "FlashAttnProcessor",
    "PROCESSOR_NAMES",
    "SDPAProcessor",
    "SlicedProcessor",
    "TritonProcessor",
    "UnsupportedModule",
    "VanillaProcessor",
    "XFormersProcessor",
    "Applied",
    "apply",
    "plan",
    "auto",
    "get_backend",
    "processor",
    "testing",
]
