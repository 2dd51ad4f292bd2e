"""Triton kernels of attnkit, installed as ``attnkit.kernels`` (the repository folder is
``kernels/``; a top-level ``kernels`` package would shadow Hugging Face's ``kernels``).

    from attnkit.kernels import flash_attention
"""

from .flash_attention import (
    INTERPRET,
    MAX_HEAD_DIM,
    MIN_HEAD_DIM,
    attention_flops,
    flash_attention,
    flash_attention_with_lse,
    padded_head_dim,
    padding_waste,
    split_head_dim,
)

__all__ = [
    "INTERPRET",
    "MAX_HEAD_DIM",
    "MIN_HEAD_DIM",
    "attention_flops",
    "flash_attention",
    "flash_attention_with_lse",
    "padded_head_dim",
    "padding_waste",
    "split_head_dim",
]
