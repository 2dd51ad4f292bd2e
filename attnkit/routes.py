"""How attnkit reaches a module's attention without changing anything else it computes.

A diffusers attention module runs a processor. What that processor computes around the
attention (projections, rotary embeddings, joint text+image concatenation, norms, gates)
is the model's; the attention itself is attnkit's to serve. Three routes, decided by what
the processor's code does, never by its class name:

* ``dispatch``: the processor calls ``dispatch_attention_fn(..., backend=self._attention_backend)``
  (diffusers' transformer processors). Its ``_attention_backend`` is pointed at attnkit's
  registered backend; the processor itself is kept.
* ``protocol``: the processor computes exactly what diffusers' Attention protocol says
  (``AttnProcessor2_0`` on a module whose scale is the default, ``AttnProcessor`` without
  qk-norm, ...): attnkit's own processor takes over (every Attention option, masks never
  expanded in memory).
* ``sdpa``: the processor calls ``F.scaled_dot_product_attention`` in its ``__call__``
  (SD3's joint processor, HunyuanDiT's and CogVideoX's rotary ones, Lumina's, ...): the
  stock processor runs as it is, with that one name bound to attnkit. Its code, its
  arguments and its state are the stock processor's own. (The binding is a copy of the
  function whose code reads ``F`` under a name of attnkit's, ``_attnkit_F_<n>``, added
  to the same module's globals: the module's own ``F`` and everything else stay as they
  are, and torch.compile traces the copy like the original.)

Anything else (linear attention, attention computed in helpers, a hard-coded backend,
processors with weights such as IP-Adapter's) keeps its processor, and the reason says
why.
"""

from __future__ import annotations

import ast
import dis
import inspect
import itertools
import textwrap
import threading
import types
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from . import diffusers_backend
from .protocol import Caller

METHODS = "_attnkit_methods"  # instance methods attnkit set on a module (undone by attnkit.binding.undo)
SDPA = "scaled_dot_product_attention"
DISPATCH = "dispatch_attention_fn"

_LOCK = threading.RLock()


@dataclass(frozen=True)
class Route:
    """Where a module's attention goes: "dispatch", "protocol", "sdpa", "forward" (a
    module without a processor, served through its own code) or "kept", and why."""

    kind: str
    reason: str

    @property
    def served(self) -> bool:
        return self.kind != "kept"


def _methods(cls: type) -> list[types.FunctionType]:
    """The plain functions of a processor class and its bases (not object's)."""
    out = []
    for klass in cls.__mro__:
        if klass is object:
            continue
        for value in vars(klass).values():
            if isinstance(value, types.FunctionType):
                out.append(value)
    return out


def _dispatch_backends(fn: types.FunctionType) -> tuple[list[str], bool]:
    """For every dispatch_attention_fn call in fn's source, what it passes as backend
    ("self._attention_backend", another expression's source, or "" when absent); and
    whether fn compares self._attention_backend with something (it then computes
    differently per backend name, or refuses names it does not know)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return (["<no source>"] if DISPATCH in fn.__code__.co_names else []), False
    found, compares = [], False
    # locals that are a plain copy of self._attention_backend (x = self._attention_backend)
    copies = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
              and ast.unparse(node.value) == "self._attention_backend"
              for t in node.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == DISPATCH:
            value = next((kw.value for kw in node.keywords if kw.arg == "backend"), None)
            text = "" if value is None else ast.unparse(value)
            found.append("self._attention_backend" if text in copies else text)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(x, ast.Attribute) and x.attr == "_attention_backend" for x in sides):
                compares = True
    return found, compares


# The globals through which a function may reach F.scaled_dot_product_attention that
# attnkit can rebind for that one function: the functional module itself (``F.``) or
# torch.nn (``nn.functional.``); never ``torch`` itself.
_ROOTS = {(): F, ("functional",): torch.nn}


def _sdpa_global(fn: types.FunctionType) -> tuple[tuple[str, tuple[str, ...]] | None, str | None]:
    """((global name, attribute path to the functional module) through which fn calls
    scaled_dot_product_attention, or None; a reason it cannot be rebound, or None)."""
    found = set()
    ins = list(dis.get_instructions(fn))
    for i, x in enumerate(ins):
        if x.argval != SDPA or x.opname not in ("LOAD_ATTR", "LOAD_METHOD"):
            continue
        j, path = i - 1, []
        while j >= 0 and ins[j].opname in ("LOAD_ATTR", "LOAD_METHOD"):
            path.insert(0, ins[j].argval)
            j -= 1
        root = ins[j] if j >= 0 else None
        path = tuple(path)
        if root is None or root.opname != "LOAD_GLOBAL" or _ROOTS.get(path) is not fn.__globals__.get(root.argval):
            return None, ("calls scaled_dot_product_attention other than through a global alias of "
                          "torch.nn.functional (F.) or torch.nn (nn.functional.)")
        found.add((root.argval, path))
    if len(found) > 1:
        return None, "calls scaled_dot_product_attention through several names"
    return (found.pop() if found else None), None


def classify(proc: Any, module: nn.Module | None = None) -> Route:
    """What ``proc`` computes for ``module``, as a :class:`Route`."""
    if getattr(type(proc), "_attnkit_processor", False):
        return Route("protocol", "an attnkit processor already: the new one takes over")
    if getattr(type(proc), "_attnkit_chooser", None) is not None:  # a stock processor attnkit bound
        return Route("sdpa", f"{type(proc).__mro__[1].__name__} runs as it is; its scaled_dot_product_attention "
                             "call is attnkit's")
    if proc is None:
        return Route("kept", "no processor")
    name = type(proc).__name__
    if isinstance(proc, nn.Module):
        return Route("kept", f"{name} carries weights of its own (IP-Adapter, custom diffusion): kept as it is")
    call = getattr(type(proc), "__call__", None)
    if not isinstance(call, types.FunctionType):
        return Route("kept", f"{name} has no Python __call__ attnkit can read")
    if module is not None and _is_protocol(proc, module):
        return Route("protocol", f"{name} computes diffusers' Attention protocol: attnkit's processor takes over")
    backends, compares = [], False
    for fn in _methods(type(proc)):
        found, cmp = _dispatch_backends(fn)
        backends += found
        compares = compares or cmp
    if backends:
        other = sorted({b for b in backends if b != "self._attention_backend"})
        if other and other[0] in ("", "None"):
            return Route("kept", f"{name} calls dispatch_attention_fn without its own backend, so it runs diffusers' "
                                 "process-wide one, which attnkit.apply does not change: serve it with "
                                 "model.set_attention_backend(\"attnkit\") or `with attention_backend(\"attnkit\"):`")
        if other:
            return Route("kept", f"{name} calls dispatch_attention_fn with backend={other[0]}: "
                                 "its attention is not this module's to route")
        if compares:
            return Route("kept", f"{name} checks which backend it is given (it computes differently per backend, "
                                 "or accepts only some): kept with diffusers' backend")
        if not hasattr(proc, "_attention_backend"):
            return Route("kept", f"{name} has no _attention_backend to point at attnkit")
        if diffusers_backend.PROBLEM is not None:
            return Route("kept", diffusers_backend.PROBLEM)
        return Route("dispatch", f"{name} calls dispatch_attention_fn: attnkit serves that call")
    found, problem = _sdpa_global(call)
    if problem:
        return Route("kept", f"{name} {problem}")
    if found is None:
        others = [fn for fn in _methods(type(proc)) if fn is not call and SDPA in fn.__code__.co_names]
        if others:
            return Route("kept", f"{name} computes its attention in {others[0].__name__}(), not in __call__")
        return Route("kept", f"{name} computes its attention without scaled_dot_product_attention or "
                             "dispatch_attention_fn (linear attention, or its own matmul and softmax)")
    return Route("sdpa", f"{name} runs as it is; its scaled_dot_product_attention call is attnkit's")


def _is_protocol(proc: Any, module: nn.Module) -> bool:
    """Whether attnkit's own processor computes exactly what ``proc`` does on ``module``."""
    from diffusers.models import attention_processor as ap

    from .processor import check_module_problem

    if not isinstance(module, ap.Attention) or check_module_problem(module, None) is not None:
        return False
    if type(proc) is getattr(ap, "AttnProcessor", None):
        # baddbmm + softmax with attn.scale, as attnkit's; but no qk-norm
        return getattr(module, "norm_q", None) is None and getattr(module, "norm_k", None) is None
    if type(proc) is not getattr(ap, "AttnProcessor2_0", None):
        return False
    # AttnProcessor2_0 ignores attn.scale (SDPA's default 1/sqrt(head_dim) instead): the
    # same only where the module's scale is that default.
    heads = getattr(module, "heads", None)
    inner = getattr(getattr(module, "to_q", None), "out_features", None)
    if not isinstance(heads, int) or not inner:
        return False
    return abs(float(module.scale) - (inner // heads) ** -0.5) <= 1e-12 * abs(float(module.scale))


# -- the sdpa route: the stock processor with its attention bound to attnkit ------------------
def functional_for(chooser, who: str = "") -> types.ModuleType:
    """torch.nn.functional, but with scaled_dot_product_attention served by ``chooser``
    (``who`` names the calling code in attnkit's logs). One per chooser and caller."""
    cache = chooser.__dict__.setdefault("_attnkit_functional", {})
    mod = cache.get(who)
    if mod is None:
        with _LOCK:
            mod = cache.get(who)
            if mod is None:
                mod = types.ModuleType("attnkit.functional", "torch.nn.functional with attnkit's attention")
                mod.__dict__.update({k: v for k, v in vars(F).items() if not k.startswith("__")})
                mod.scaled_dot_product_attention = _sdpa_for(chooser, who)
                cache[who] = mod
    return mod


def nn_for(chooser, who: str = "") -> types.ModuleType:
    """torch.nn with its ``functional`` replaced by :func:`functional_for`'s."""
    cache = chooser.__dict__.setdefault("_attnkit_nn", {})
    mod = cache.get(who)
    if mod is None:
        with _LOCK:
            mod = cache.get(who)
            if mod is None:
                mod = types.ModuleType("attnkit.nn", "torch.nn with attnkit's attention")
                mod.__dict__.update({k: v for k, v in vars(torch.nn).items() if not k.startswith("__")})
                mod.functional = functional_for(chooser, who)
                cache[who] = mod
    return mod


def _sdpa_for(chooser, who: str):
    label = Caller(f"{who}'s scaled_dot_product_attention call" if who else SDPA_WHO)

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                     scale=None, enable_gqa=False):
        """torch.nn.functional.scaled_dot_product_attention's arguments and meaning
        (masks broadcast from the right, True = attend), computed by attnkit."""
        return sdpa_call(chooser, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, label)

    return scaled_dot_product_attention


SDPA_WHO = "a scaled_dot_product_attention call"


def sdpa_call(chooser, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, who=None):
    """F.scaled_dot_product_attention on (..., L, D) tensors, served by ``chooser``."""
    from .diffusers_backend import expand_kv_heads

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
        bias = _as_4d(bias) if bias.dim() != 4 else bias
    out = chooser.attention(who or SDPA_WHO, q, k, v, bias, scale, False,
                            causal_offset=0 if is_causal else None, dropout_p=float(dropout_p))
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


def sdpa_mask(attn_mask: torch.Tensor, full: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An SDPA attn_mask (bool True = attend, or additive) as an additive bias, checked to
    broadcast to ``full`` = (..., L, S) from the right; broadcast dims keep size 1."""
    if not isinstance(attn_mask, torch.Tensor):
        raise ValueError(f"attn_mask is a {type(attn_mask).__name__}; scaled_dot_product_attention takes a tensor")
    mask = attn_mask
    if mask.dim() > len(full) or any(got not in (1, want) for got, want in zip(mask.shape[::-1], full[::-1])):
        raise ValueError(f"attn_mask of shape {tuple(mask.shape)} does not broadcast to {full}")
    while mask.dim() < len(full):
        mask = mask.unsqueeze(0)
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    if not mask.is_floating_point():
        raise ValueError(f"attn_mask has dtype {mask.dtype}; scaled_dot_product_attention takes bool or float")
    if len(full) > 4:
        mask = mask.expand(*full[:-2], *mask.shape[-2:]).reshape(-1, *mask.shape[-3:])
    return mask


def _own_methods(cls: type) -> dict[str, types.FunctionType]:
    """The plain functions a module class defines (and its bases short of nn.Module)."""
    out: dict[str, types.FunctionType] = {}
    for klass in reversed(cls.__mro__):
        if klass in (object, nn.Module) or klass.__module__.startswith("torch."):
            continue
        out.update({k: v for k, v in vars(klass).items() if isinstance(v, types.FunctionType)})
    return out


def _adapter(module: nn.Module):
    cls = type(module)
    return FORWARD_ADAPTERS.get(f"{cls.__module__}.{cls.__qualname__}")


def classify_forward(module: nn.Module) -> Route | None:
    """For a module without a processor: whether its own code computes attention attnkit
    can serve (None if attnkit sees it compute none)."""
    name = type(module).__name__
    if isinstance(module, nn.MultiheadAttention):
        return Route("kept", f"{name}: torch's own multi-head attention (it may return its weights): kept")
    if _adapter(module) is not None:
        return Route("forward", f"{name} computes softmax attention by hand in its forward: attnkit runs that "
                                "forward with its attention")
    methods = {k: fn for k, fn in _own_methods(type(module)).items() if SDPA in fn.__code__.co_names}
    if not methods:
        if any("multi_head_attention_forward" in fn.__code__.co_names for fn in _own_methods(type(module)).values()):
            return Route("kept", f"{name} calls torch's multi_head_attention_forward: kept")
        return None
    for fn in methods.values():
        found, problem = _sdpa_global(fn)
        if found is None:
            return Route("kept", f"{name} {problem}")
    return Route("forward", f"{name} calls scaled_dot_product_attention in {', '.join(sorted(methods))}(): "
                            "attnkit serves that call")


def bind_module(module: nn.Module, chooser) -> None:
    """Serve the attention of a module without a processor (see classify_forward): its
    methods that call scaled_dot_product_attention, or attnkit's forward for a module
    that computes attention by hand, set on the instance."""
    adapter = _adapter(module)
    if adapter is not None:
        module.forward = types.MethodType(_with_chooser(adapter, chooser), module)
        module.__dict__[METHODS] = ("forward",)
        return
    names = []
    for key, fn in _own_methods(type(module)).items():
        if SDPA in fn.__code__.co_names:
            setattr(module, key, types.MethodType(_rebind(fn, chooser), module))
            names.append(key)
    module.__dict__[METHODS] = tuple(names)


_UNIQUE = itertools.count()


def _with_chooser(adapter: Callable, chooser) -> Callable:
    """A module's forward: ``adapter`` with its chooser bound. A plain function, not a
    functools.partial: torch.compile before torch 2.13 cannot trace a method made of a
    partial ("can't handle functions not implemented in python")."""

    def forward(self, *args, **kwargs):
        return adapter(self, *args, chooser=chooser, **kwargs)

    # Named "forward": a pickled module stores its bound methods by name, and loads this
    # one as the class's own forward (diffusers' attention, no longer attnkit's; apply()
    # again), rather than failing on a name the module does not have.
    forward.__qualname__ = adapter.__qualname__
    forward.__doc__ = adapter.__doc__
    return forward


def _rebind(fn: types.FunctionType, chooser) -> types.FunctionType:
    """fn with its torch.nn.functional (or torch.nn) alias bound to attnkit's."""
    found, problem = _sdpa_global(fn)
    if found is None:
        raise ValueError(f"{fn.__qualname__}: {problem or 'no scaled_dot_product_attention call'}")
    alias, path = found
    who = fn.__qualname__.rsplit(".", 1)[0]  # the class whose code it is
    proxy = functional_for(chooser, who) if not path else nn_for(chooser, who)
    code, globals_ = fn.__code__, fn.__globals__
    if all(ins.opname == "LOAD_GLOBAL" for ins in dis.get_instructions(fn) if ins.argval == alias):
        # The code reads the alias only as a global: rename it, in this code object only,
        # to a name of its own added to the same module globals. The function keeps its
        # module's globals, which torch.compile's guards rely on.
        names = chooser.__dict__.setdefault("_attnkit_global_names", {})
        unique = names.get((who, alias))
        if unique is None:
            unique = names[(who, alias)] = f"_attnkit_{alias}_{next(_UNIQUE)}"
        globals_[unique] = proxy
        code = code.replace(co_names=tuple(unique if n == alias else n for n in code.co_names))
    else:  # the name is also an attribute somewhere in the code: a copy of the globals
        globals_ = {**globals_, alias: proxy}
    new = types.FunctionType(code, globals_, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__doc__ = fn.__doc__
    return new


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
    out = chooser.attention(self, q, k, v, None, c ** -0.5, False)
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
    out = chooser.attention(self, q, k, v, None, self.dim_head ** -0.5, True)
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


def bound_processor(proc: Any, chooser) -> Any:
    """A copy of the stock processor ``proc`` whose ``__call__`` is its own code with
    ``F.scaled_dot_product_attention`` served by ``chooser``: same signature (the module
    filters its keyword arguments by it), same state, same everything else."""
    cls = type(proc)
    if getattr(cls, "_attnkit_chooser", None) is not None:  # bound before: start from the stock class
        cls = cls.__mro__[1]
    cache = chooser.__dict__.setdefault("_attnkit_bound_classes", {})
    with _LOCK:
        bound = cache.get(cls)
        if bound is None:
            fn = _rebind(cls.__call__, chooser)
            bound = type(f"Attnkit{cls.__name__}", (cls,), {
                "__call__": fn,
                "__module__": __name__,
                "__doc__": f"{cls.__name__}, with its scaled_dot_product_attention served by attnkit.",
                "_attnkit_chooser": chooser,
            })
            cache[cls] = bound
    new = object.__new__(bound)
    new.__dict__.update(getattr(proc, "__dict__", {}))
    return new


__all__ = ["Route", "bind_module", "bound_processor", "classify", "classify_forward", "functional_for",
           "sdpa_call", "sdpa_mask"]
