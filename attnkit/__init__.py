"""attnkit: pluggable, correct-first attention processors for diffusers.

    pipe.unet.set_attn_processor(attnkit.auto())
"""

from .backends import AttentionCall, BackendUnavailable, DeviceInfo, get_backend
from .processor import (
    AttnkitProcessor,
    FlashAttnProcessor,
    SDPAProcessor,
    SlicedProcessor,
    TritonProcessor,
    UnsupportedModule,
    VanillaProcessor,
    XFormersProcessor,
)
from .chooser import AutoProcessor, auto
from .apply import PROCESSOR_NAMES, Applied, apply, plan, processor
from . import testing  # noqa: E402  (attnkit.testing.reference_attention)
from . import diffusers_backend  # noqa: E402
from . import binding as _binding  # noqa: E402
from .apply import install_backend_warning as _install_backend_warning  # noqa: E402

diffusers_backend.register_defaults()  # "attnkit", "attnkit_sdpa", ... in diffusers' dispatcher
_binding.install()  # set_attn_processor notes what attnkit's processor replaces, per module
_install_backend_warning()  # set_attention_backend("attnkit") says what it does not reach

__version__ = "0.1.0"

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
