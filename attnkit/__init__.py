"""attnkit: pluggable, correct-first attention processors for diffusers.

    pipe.unet.set_attn_processor(attnkit.auto())
"""

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
from . import _moved
from . import testing  # noqa: E402  (attnkit.testing.reference_attention)
from .diffusers import backend as _diffusers_backend
from .diffusers import binding as _binding
from .diffusers import wrappers as _wrappers

_diffusers_backend.register_defaults()  # "attnkit", "attnkit_sdpa", ... in diffusers' dispatcher
_binding.install()  # set_attn_processor notes what attnkit's processor replaces, per module
_wrappers.install()  # set_attn_processor, set_attention_backend and attention_backend say what they do not reach

__version__ = "0.1.0"

_moved.install()  # attnkit.chooser, attnkit.routes, ...: the module paths before choose/ and diffusers/

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
