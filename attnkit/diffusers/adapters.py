"""What serves an attention call attnkit reaches inside a model's own code.

* torch's ``F.scaled_dot_product_attention``, served by a chooser: the ``sdpa`` route
  (a stock processor whose ``F`` is :func:`functional_for`'s) and the ``forward`` route
  of a module that calls it in its own methods (see :mod:`attnkit.diffusers.routes`);
* :data:`FORWARD_ADAPTERS`: attnkit's forward for the diffusers modules that compute
  softmax attention by hand, with no call to serve.
"""

from __future__ import annotations

import threading
import types
import weakref
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..masks import expand_kv_heads, route_bias
from ..text import Caller

SDPA = "scaled_dot_product_attention"

_LOCK = threading.RLock()


class PerChooser:
    """A cache per chooser that lives as long as the chooser and never keeps it alive: a
    weak table keyed by the chooser (any object of the chooser protocol that can be
    weakly referenced; nothing is written on the chooser itself). With ``weak_values``,
    each chooser's entries are held weakly too, for values that hold the chooser (a
    bound processor class): the entry goes with the last object that uses it."""

    def __init__(self, weak_values: bool = False) -> None:
        self._tables: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
        self._weak_values = weak_values

    def of(self, chooser) -> Any:
        """``chooser``'s entries (a dict, or a WeakValueDictionary)."""
        with _LOCK:
            table = self._tables.get(chooser)
            if table is None:
                table = self._tables[chooser] = weakref.WeakValueDictionary() if self._weak_values else {}
            return table


_FUNCTIONAL = PerChooser()  # chooser -> {who: torch.nn.functional with attnkit's attention}
_NN = PerChooser()  # chooser -> {who: torch.nn with that functional}


def functional_for(chooser, who: str = "") -> types.ModuleType:
    """torch.nn.functional, but with scaled_dot_product_attention served by ``chooser``
    (``who`` names the calling code in attnkit's logs). One per chooser and caller."""
    cache = _FUNCTIONAL.of(chooser)
    mod = cache.get(who)
    if mod is None:
        with _LOCK:
            mod = cache.get(who)
            if mod is None:
                mod = types.ModuleType("attnkit.functional", "torch.nn.functional with attnkit's attention")
                mod.__dict__.update({k: v for k, v in vars(F).items() if not k.startswith("__")})
                setattr(mod, "scaled_dot_product_attention", _sdpa_for(chooser, who))
                cache[who] = mod
    return mod


def nn_for(chooser, who: str = "") -> types.ModuleType:
    """torch.nn with its ``functional`` replaced by :func:`functional_for`'s."""
    cache = _NN.of(chooser)
    mod = cache.get(who)
    if mod is None:
        with _LOCK:
            mod = cache.get(who)
            if mod is None:
                mod = types.ModuleType("attnkit.nn", "torch.nn with attnkit's attention")
                mod.__dict__.update({k: v for k, v in vars(torch.nn).items() if not k.startswith("__")})
                setattr(mod, "functional", functional_for(chooser, who))
                cache[who] = mod
    return mod


def _sdpa_for(chooser, who: str):
    label = Caller(f"{who}'s scaled_dot_product_attention call" if who else SDPA_WHO)
    # Weakly: this function may sit in a module's globals (see routes._rebind); what routes
    # calls to it (a bound processor's class, a module's method) holds the chooser.
    chooser_ref = weakref.ref(chooser)

    def scaled_dot_product_attention(
        query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
    ):
        """torch.nn.functional.scaled_dot_product_attention's arguments and meaning
        (masks broadcast from the right, True = attend), computed by attnkit."""
        return sdpa_call(chooser_ref(), query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, label)

    return scaled_dot_product_attention


SDPA_WHO = "a scaled_dot_product_attention call"


def sdpa_call(chooser, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, who=None):
    """F.scaled_dot_product_attention on (..., L, D) tensors, served by ``chooser``."""
    lead = query.shape[:-2]
    q, k, v = (_as_4d(x) for x in (query, key, value))
    if k.shape[:2] != q.shape[:2] and not enable_gqa:
        # SDPA broadcasts k and v over the batch dims (a key head shared by every query head)
        k = k.expand(q.shape[0], q.shape[1], *k.shape[-2:])
        v = v.expand(q.shape[0], q.shape[1], *v.shape[-2:])
    k, v = expand_kv_heads(q, k, v, enable_gqa)
    bias = None
    if attn_mask is not None:
        bias = sdpa_mask(attn_mask, tuple(query.shape[:-1]) + (key.shape[-2],), q.dtype)
        bias = _as_4d(bias) if bias is not None and bias.dim() != 4 else bias
    out = chooser.attention(
        who or SDPA_WHO, q, k, v, bias, scale, False, causal_offset=0 if is_causal else None, dropout_p=float(dropout_p)
    )
    return out.reshape(*lead, *out.shape[-2:])


def _as_4d(x: torch.Tensor) -> torch.Tensor:
    """(..., L, D) as (B, H, L, D): leading dims folded into B (a view where possible)."""
    if x.dim() == 4:
        return x
    if x.dim() == 3:
        return x.unsqueeze(0)
    if x.dim() == 2:
        return x[None, None]
    return x.reshape(-1, x.shape[-3], *x.shape[-2:])


def sdpa_mask(attn_mask: torch.Tensor, full: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
    """An SDPA attn_mask (bool True = attend, or additive) as an additive bias, checked to
    broadcast to ``full`` = (..., L, S) from the right; broadcast dims keep size 1. None
    for a mask that hides nothing (masks.route_bias)."""
    if not isinstance(attn_mask, torch.Tensor):
        raise ValueError(f"attn_mask is a {type(attn_mask).__name__}; scaled_dot_product_attention takes a tensor")
    mask = route_bias(attn_mask, dtype, full, shape_error=_SDPA_SHAPE_ERROR, dtype_error=_SDPA_DTYPE_ERROR)
    if mask is None:
        return None  # it hides nothing
    # Leading dims beyond (B, H) are folded into B for a float mask; a boolean one keeps them
    # (as before attnkit.masks: _as_4d folds it without expanding it first).
    if len(full) > 4 and attn_mask.dtype != torch.bool:
        mask = mask.expand(*full[:-2], *mask.shape[-2:]).reshape(-1, *mask.shape[-3:])
    return mask


_SDPA_SHAPE_ERROR = "attn_mask of shape {shape} does not broadcast to {full}"
_SDPA_DTYPE_ERROR = "attn_mask has dtype {dtype}; scaled_dot_product_attention takes bool or float"


def _self_attention_1d(self, hidden_states: torch.Tensor, *, chooser) -> torch.Tensor:
    """diffusers' SelfAttention1d (UNet1DModel), its matmul and softmax served by attnkit:
    q and k each scaled by head_dim ** -1/4, i.e. scores scaled by head_dim ** -1/2."""
    residual = hidden_states
    batch, channels, seq = hidden_states.shape
    hidden_states = self.group_norm(hidden_states).transpose(1, 2)
    q, k, v = (self.transpose_for_scores(proj(hidden_states)) for proj in (self.query, self.key, self.value))
    out = chooser.attention(self, q, k, v, None, q.shape[-1] ** -0.5, False)
    out = out.permute(0, 2, 1, 3).reshape(batch, seq, self.channels)
    out = self.dropout(self.proj_attn(out)).transpose(1, 2)
    return out + residual


def _perceiver_attention(self, image_embeds: torch.Tensor, latents: torch.Tensor, *, chooser) -> torch.Tensor:
    """diffusers' ConsisID PerceiverAttention: see _perceiver."""
    return _perceiver(self, image_embeds, latents, chooser=chooser, cross=False)


def _perceiver_cross_attention(self, image_embeds: torch.Tensor, latents: torch.Tensor, *, chooser) -> torch.Tensor:
    """diffusers' ConsisID PerceiverCrossAttention: see _perceiver."""
    return _perceiver(self, image_embeds, latents, chooser=chooser, cross=True)


def _ltx2_audio_attention(self, x: torch.Tensor, *, chooser) -> torch.Tensor:
    """diffusers' LTX2AudioAttnBlock: one head over H*W positions, scale channels ** -1/2."""
    h_ = self.norm(x)
    b, c, hh, ww = x.shape
    q, k, v = (proj(h_).reshape(b, 1, c, hh * ww).transpose(-1, -2) for proj in (self.q, self.k, self.v))
    out = chooser.attention(self, q, k, v, None, c**-0.5, False)
    return x + self.proj_out(out.transpose(-1, -2).reshape(b, c, hh, ww))


def _perceiver(self, image_embeds: torch.Tensor, latents: torch.Tensor, *, chooser, cross: bool) -> torch.Tensor:
    """diffusers' ConsisID PerceiverAttention (keys: image embeddings then latents) and
    PerceiverCrossAttention (keys: image embeddings): softmax in float32, scale
    dim_head ** -1/2."""
    image_embeds = self.norm1(image_embeds)
    latents = self.norm2(latents)
    b, n, _ = latents.shape
    query = self.to_q(latents)
    kv_input = image_embeds if cross else torch.cat((image_embeds, latents), dim=-2)
    key, value = self.to_kv(kv_input).chunk(2, dim=-1)
    q, k, v = (x.reshape(x.size(0), -1, self.heads, self.dim_head).transpose(1, 2) for x in (query, key, value))
    out = chooser.attention(self, q, k, v, None, self.dim_head**-0.5, True)
    return self.to_out(out.permute(0, 2, 1, 3).reshape(b, n, -1))


# Modules of diffusers that compute softmax attention by hand in their forward, with no
# call to serve: attnkit's forward for each, checked against the module by the model-zoo
# test (stock and attnkit's, equal under the tolerance rule).
FORWARD_ADAPTERS: dict[str, Callable] = {
    "diffusers.models.unets.unet_1d_blocks.SelfAttention1d": _self_attention_1d,
    "diffusers.models.autoencoders.autoencoder_kl_ltx2_audio.LTX2AudioAttnBlock": _ltx2_audio_attention,
    "diffusers.models.transformers.consisid_transformer_3d.PerceiverAttention": _perceiver_attention,
    "diffusers.models.transformers.consisid_transformer_3d.PerceiverCrossAttention": _perceiver_cross_attention,
}


__all__ = ["FORWARD_ADAPTERS", "SDPA", "functional_for", "nn_for", "sdpa_call", "sdpa_mask"]
