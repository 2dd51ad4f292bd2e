"""attnkit: pluggable, correct-first attention processors for diffusers.

pipe.unet.set_attn_processor(attnkit.auto())
"""

from . import (
    moved_paths,
    testing,  # noqa: E402  (attnkit.testing.reference_attention)
)
from .backends import AttentionCall, BackendUnavailable, DeviceInfo, get_backend
from .diffusers import hooks as _hooks
from .diffusers import wrappers as _wrappers  # noqa: F401  (connects what the hooks call)
from .diffusers.apply import PROCESSOR_NAMES, Applied, apply, plan, processor
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
from .errors import UnsupportedModule

# every change attnkit makes to diffusers (its backend names, set_processor, set_attn_processor,
# set_default_attn_processor, set_attention_backend, the attention_backend context), each
# checked against the installed diffusers: attnkit/diffusers/hooks.py
_hooks.install()

__version__ = "0.1.0"

moved_paths.install()  # attnkit.chooser, attnkit.routes, ...: the module paths before choose/ and diffusers/

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
