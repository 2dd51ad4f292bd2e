"""diffusers' Attention protocol as attnkit computes it: what a module must be for
attnkit's processor to compute exactly what diffusers' does, the masks it takes, the
argument names it advertises, and how it refuses what it does not implement."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from ..errors import UnsupportedModule
from ..masks import hides_nothing, to_additive_bias
from ..text import describe_module

APPLY_HINT = (
    "attnkit.apply(model, processor) keeps this module's own processor and serves only its "
    "attention call, or keeps the module as it is where attnkit cannot compute it"
)


def check_module_problem(attn: nn.Module, encoder_hidden_states: Any) -> str | None:
    """Why diffusers' Attention protocol, as attnkit's processor computes it, is not what
    this module computes; None if it is."""
    mods, attrs = getattr(attn, "_modules", None), getattr(attn, "__dict__", None)
    if mods is not None and attrs is not None and not isinstance(encoder_hidden_states, (tuple, list)):
        # the common case, without nn.Module.__getattr__ (it runs on every call)
        if (
            attrs.get("added_kv_proj_dim") is None
            and mods.get("add_k_proj") is None
            and mods.get("to_k", True) is not None
            and mods.get("to_out", True) is not None
            and not attrs.get("is_causal", False)
        ):
            return None
    if isinstance(encoder_hidden_states, (tuple, list)):
        return (
            "encoder_hidden_states is a tuple: this is an IP-Adapter layer (text and image "
            "embeddings), whose extra image attention is IP-Adapter's processor's"
        )
    if getattr(attn, "added_kv_proj_dim", None) is not None or getattr(attn, "add_k_proj", None) is not None:
        return (
            "it has added key/value projections (joint text+image attention, as SD3's, AuraFlow's or "
            "an AttnAddedKVProcessor's), which its own processor concatenates in its own order"
        )
    if getattr(attn, "to_k", True) is None or getattr(attn, "to_out", True) is None:
        return (
            "it has no to_k/to_v or no to_out projection (only_cross_attention or pre_only, as in joint/dual attention)"
        )
    if getattr(attn, "is_causal", False):
        return "it is causal (is_causal=True), which its own processor decides how to apply"
    return None


def check_module(attn: nn.Module, encoder_hidden_states: Any) -> None:
    """Refuse, with the reason and the way out, a module or call whose computation
    attnkit's processor would get wrong."""
    problem = check_module_problem(attn, encoder_hidden_states)
    if problem is not None:
        raise UnsupportedModule(f"attnkit's processor cannot serve {describe_module(attn)}: {problem}. {APPLY_HINT}.")


# Tuples, tested one name at a time (_holds): torch.compile (dynamo of torch 2.11) fails on a
# set compared with a dict's keys.
_PROTOCOL_FIELDS = (
    "heads",
    "scale",
    "upcast_attention",
    "upcast_softmax",
    "residual_connection",
    "rescale_output_factor",
)
_PROTOCOL_MODULES = ("to_q", "to_out")
_PROTOCOL_OPTIONAL = ("spatial_norm", "group_norm", "norm_cross", "to_k", "to_v", "to_qkv", "to_kv", "norm_q", "norm_k")


def _holds(registry: dict, names: tuple[str, ...]) -> bool:
    """Whether every one of these names is a key of the registry."""
    for name in names:
        if name not in registry:
            return False
    return True


def _fields_of(attn: nn.Module) -> tuple[dict, dict]:
    """The protocol's fields of a module read through getattr (properties included)."""
    mods = {n: getattr(attn, n) for n in (*_PROTOCOL_MODULES, *_PROTOCOL_OPTIONAL) if hasattr(attn, n)}
    attrs = {n: getattr(attn, n) for n in _PROTOCOL_FIELDS}
    attrs["fused_projections"] = getattr(attn, "fused_projections", False)
    return mods, attrs


def _norm_width(norm: nn.Module) -> int | None:
    """The feature width a q/k norm normalises over, or None if it is width-agnostic."""
    shape = getattr(norm, "normalized_shape", None)
    if shape is None:
        shape = getattr(norm, "dim", None)  # diffusers' RMSNorm keeps it as .dim
    if isinstance(shape, int):
        return shape
    if isinstance(shape, (tuple, list, torch.Size)) and len(shape) == 1:
        return int(shape[0])
    return None


def prepare_bias(
    mask: torch.Tensor | None, batch: int, heads: int, q_len: int, kv_len: int, dtype: torch.dtype, attn: nn.Module
) -> torch.Tensor | None:
    """A diffusers attention mask as an additive bias broadcastable to (B, H, M, N).

    Accepts what diffusers produces and users pass: (B, N) key padding, (B|1, 1|M, N)
    as from the UNet's encoder_attention_mask, (B*H, 1|M, N) as after
    prepare_attention_mask, and (B|1, H|1, 1|M, N). Never expanded in memory: broadcast
    dims keep size 1. Boolean masks (True = attend) become 0 / -inf once, here. None for
    a mask that hides nothing (masks.hides_nothing: the call is the same without it).
    """
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dim() < 2:
        what = (
            f"a {mask.dim()}-d tensor of shape {tuple(mask.shape)}"
            if isinstance(mask, torch.Tensor)
            else f"a {type(mask).__module__}.{type(mask).__name__}"
        )
        raise ValueError(
            f"{describe_module(attn)}: attention_mask is {what}; pass a torch.Tensor of shape (batch, {kv_len}), "
            f"(batch, 1 or {q_len}, {kv_len}) or (batch, heads, 1 or {q_len}, {kv_len}), boolean (True = attend) "
            "or additive float (torch.as_tensor turns a list or a numpy array into one)"
        )
    if mask.shape[-1] != kv_len:
        raise ValueError(
            f"{describe_module(attn)}: attention_mask has {mask.shape[-1]} keys in its last "
            f"dimension but the keys have {kv_len} tokens; pass a mask of shape "
            f"(batch, {kv_len}), (batch, 1 or {q_len}, {kv_len}) or (batch, heads, 1 or {q_len}, {kv_len})"
        )
    nd = mask.dim()
    if nd == 2:
        b0, h0, m0 = mask.shape[0], 1, 1
    elif nd == 3:
        b0, m0 = mask.shape[0], mask.shape[1]
        h0 = 1
        if b0 == batch * heads and heads > 1:
            b0, h0 = batch, heads
    elif nd == 4:
        b0, h0, m0 = mask.shape[0], mask.shape[1], mask.shape[2]
    else:
        b0 = h0 = m0 = -1
    if b0 not in (1, batch) or h0 not in (1, heads) or m0 not in (1, q_len):
        raise ValueError(
            f"{describe_module(attn)}: attention_mask of shape {tuple(mask.shape)} does not "
            f"broadcast to (batch={batch}, heads={heads}, queries={q_len}, keys={kv_len}); pass "
            f"(batch, keys), (batch, 1 or queries, keys), (batch*heads, 1 or queries, keys) "
            f"or (batch, heads, 1 or queries, keys)"
        )
    if hides_nothing(mask):  # checked on the mask given: the same object every layer and step
        return None
    return to_additive_bias(mask.reshape(b0, h0, m0, kv_len), dtype, dtype_error=_DTYPE_ERROR, who=attn)


_DTYPE_ERROR = (
    "{who}: attention_mask has dtype {dtype}; pass an additive float mask (0 = attend, large "
    "negative = ignore) or a boolean one (True = attend)"
)


# Every argument name a diffusers processor takes (a test keeps this equal to the
# installed diffusers' processors): advertised so that no module filters one out.
PROCESSOR_ARGUMENTS = (
    "all_perturbed",
    "attn_mask",
    "audio_rotary_emb",
    "base_sequence_length",
    "batch_flag",
    "block_mask",
    "cache_write_slice",
    "cached_txt_key",
    "cached_txt_value",
    "context",
    "context_mask",
    "encoder_hidden_states_image",
    "encoder_hidden_states_mask",
    "encoder_position_embeddings",
    "freqs_cis",
    "gen_seq",
    "grid_sizes",
    "hidden_states_masks",
    "image_embed_seq_len",
    "image_rotary_emb",
    "ip_adapter_masks",
    "ip_hidden_states",
    "key_rotary_emb",
    "key_valid",
    "kv_cache",
    "kv_cache_flag",
    "kv_cache_mode",
    "latent_attn_mask",
    "layer_cache",
    "mask",
    "num_ref_tokens",
    "num_txt_tokens",
    "origin_latent_frames",
    "origin_latent_hw",
    "original_context_length",
    "pairs",
    "perturbation_mask",
    "position_embeddings",
    "post_attention_mask",
    "prompt_rotary_emb",
    "query_rotary_emb",
    "reference_grid_sizes",
    "reference_rope_stride",
    "reference_rotary_emb",
    "rope",
    "rope_stride",
    "rotary_emb",
    "rotary_emb_kv",
    "scale",
    "segments",
    "sink_rotary_emb",
    "sparse_params",
    "text_attn_mask",
    "und_seq",
    "x",
)


def advertised_signature() -> inspect.Signature:
    P = inspect.Parameter
    params = [P("self", P.POSITIONAL_OR_KEYWORD), P("attn", P.POSITIONAL_OR_KEYWORD)]
    params += [P("hidden_states", P.POSITIONAL_OR_KEYWORD)]
    params += [P(n, P.POSITIONAL_OR_KEYWORD, default=None) for n in ("encoder_hidden_states", "attention_mask", "temb")]
    params.append(P("args", P.VAR_POSITIONAL))
    params += [P(n, P.KEYWORD_ONLY, default=None) for n in PROCESSOR_ARGUMENTS]
    params.append(P("kwargs", P.VAR_KEYWORD))
    return inspect.Signature(params)
