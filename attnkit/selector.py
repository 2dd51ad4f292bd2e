"""auto(): choose a backend per call. (Minimal version: SDPA where it exists.)"""

from __future__ import annotations

import torch.nn.functional as F

from .processor import AttnkitProcessor


def auto(**options) -> AttnkitProcessor:
    """A processor for set_attn_processor that picks a backend that can run."""
    if hasattr(F, "scaled_dot_product_attention"):
        return AttnkitProcessor("sdpa")
    return AttnkitProcessor("vanilla")
