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
from typing import Any, Callable, cast

import torch
import torch.nn.functional as F
from torch import nn

from . import backend as diffusers_backend
from . import flex, hooks
from .adapters import FORWARD_ADAPTERS, SDPA, PerChooser, functional_for, nn_for
from .protocol import check_module_problem

METHODS = "_attnkit_methods"  # instance methods attnkit set on a module (undone by attnkit.diffusers.binding.undo)
DISPATCH = "dispatch_attention_fn"

_LOCK = threading.RLock()


@dataclass(frozen=True)
class Route:
    """Where a module's attention goes: "dispatch", "flex" (a processor naming diffusers'
    flex backend, see :mod:`attnkit.diffusers.flex`), "protocol", "sdpa", "forward" (a
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
    copies = {
        t.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and ast.unparse(node.value) == "self._attention_backend"
        for t in node.targets
        if isinstance(t, ast.Name)
    }
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
        j = i - 1
        attrs: list[str] = []
        while j >= 0 and ins[j].opname in ("LOAD_ATTR", "LOAD_METHOD"):
            attrs.insert(0, ins[j].argval)
            j -= 1
        root = ins[j] if j >= 0 else None
        path = tuple(attrs)
        if root is None or root.opname != "LOAD_GLOBAL" or _ROOTS.get(path) is not fn.__globals__.get(root.argval):
            return None, (
                "calls scaled_dot_product_attention other than through a global alias of "
                "torch.nn.functional (F.) or torch.nn (nn.functional.)"
            )
        found.add((root.argval, path))
    if len(found) > 1:
        return None, "calls scaled_dot_product_attention through several names"
    return (found.pop() if found else None), None


def classify(proc: Any, module: nn.Module | None = None) -> Route:
    """What ``proc`` computes for ``module``, as a :class:`Route`."""
    if getattr(type(proc), "_attnkit_processor", False):
        return Route("protocol", "an attnkit processor already: the new one takes over")
    if getattr(type(proc), "_attnkit_chooser", None) is not None:  # a stock processor attnkit bound
        return Route(
            "sdpa",
            f"{type(proc).__mro__[1].__name__} runs as it is; its scaled_dot_product_attention call is attnkit's",
        )
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
    backends: list[str] = []
    compares = False
    for fn in _methods(type(proc)):
        named, cmp = _dispatch_backends(fn)
        backends += named
        compares = compares or cmp
    if backends:
        named_flex, why = flex.problem(proc, backends, compares)
        if named_flex:
            return Route("kept", why) if why is not None else Route("flex", flex.reason(proc, compares))
        other = sorted({b for b in backends if b != "self._attention_backend"})
        if other and other[0] in ("", "None"):
            return Route(
                "kept",
                f"{name} calls dispatch_attention_fn without its own backend, so it runs diffusers' "
                "process-wide one, which attnkit.apply does not change: serve it with "
                'model.set_attention_backend("attnkit") or `with attention_backend("attnkit"):`',
            )
        if other:
            return Route(
                "kept",
                f"{name} calls dispatch_attention_fn with backend={other[0]}: "
                "its attention is not this module's to route",
            )
        if compares and flex.accepts_attnkit(proc):
            return Route(
                "dispatch",
                f"{name} accepts attnkit's backend names (set_attention_backend): attnkit serves its "
                "dispatch_attention_fn call, its BlockMask too",
            )
        if compares:
            return Route(
                "kept",
                f"{name} checks which backend it is given (it computes differently per backend, "
                "or accepts only some): kept with diffusers' backend",
            )
        if not hasattr(proc, "_attention_backend"):
            return Route("kept", f"{name} has no _attention_backend to point at attnkit")
        why = diffusers_backend.problem()
        if why is not None:
            return Route("kept", why)
        return Route("dispatch", f"{name} calls dispatch_attention_fn: attnkit serves that call")
    found, problem = _sdpa_global(call)
    if problem:
        return Route("kept", f"{name} {problem}")
    if found is None:
        others = [fn for fn in _methods(type(proc)) if fn is not call and SDPA in fn.__code__.co_names]
        if others:
            return Route("kept", f"{name} computes its attention in {others[0].__name__}(), not in __call__")
        return Route(
            "kept",
            f"{name} computes its attention without scaled_dot_product_attention or "
            "dispatch_attention_fn (linear attention, or its own matmul and softmax)",
        )
    return Route("sdpa", f"{name} runs as it is; its scaled_dot_product_attention call is attnkit's")


def _is_protocol(proc: Any, module: nn.Module) -> bool:
    """Whether attnkit's own processor computes exactly what ``proc`` does on ``module``."""
    from diffusers.models import attention_processor as ap

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
        return Route(
            "forward",
            f"{name} computes softmax attention by hand in its forward: attnkit runs that forward with its attention",
        )
    methods = {k: fn for k, fn in _own_methods(type(module)).items() if SDPA in fn.__code__.co_names}
    if not methods:
        if any("multi_head_attention_forward" in fn.__code__.co_names for fn in _own_methods(type(module)).values()):
            return Route("kept", f"{name} calls torch's multi_head_attention_forward: kept")
        return None
    for fn in methods.values():
        found, problem = _sdpa_global(fn)
        if found is None:
            return Route("kept", f"{name} {problem}")
    return Route(
        "forward",
        f"{name} calls scaled_dot_product_attention in {', '.join(sorted(methods))}(): attnkit serves that call",
    )


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
# chooser -> {(class, alias): the module global its rebound code reads}
_GLOBAL_NAMES = PerChooser()
# chooser -> {stock processor class: its class bound to the chooser}, held weakly: a bound
# class holds its chooser (through its __call__'s Lease), and goes with its last processor
_BOUND_CLASSES = PerChooser(weak_values=True)


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
        names = _GLOBAL_NAMES.of(chooser)
        unique = names.get((who, alias))
        if unique is None:
            unique = names[(who, alias)] = f"_attnkit_{alias}_{next(_UNIQUE)}"
            # the proxy holds the chooser weakly; its name leaves the module with the chooser
            hooks.set_global(globals_, unique, proxy, owner=chooser)
        else:
            hooks.set_global(globals_, unique, proxy)
        code = code.replace(co_names=tuple(unique if n == alias else n for n in code.co_names))
    else:  # the name is also an attribute somewhere in the code: a copy of the globals
        globals_ = {**globals_, alias: proxy}
    new = types.FunctionType(code, globals_, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__doc__ = fn.__doc__
    setattr(new, "_attnkit_lease", diffusers_backend.Lease(chooser))  # the proxy holds it weakly: the code holds it
    return new


# -- the sdpa route: the stock processor with its attention bound to attnkit ------------------
def bound_processor(proc: Any, chooser) -> Any:
    """A copy of the stock processor ``proc`` whose ``__call__`` is its own code with
    ``F.scaled_dot_product_attention`` served by ``chooser``: same signature (the module
    filters its keyword arguments by it), same state, same everything else."""
    cls = type(proc)
    if getattr(cls, "_attnkit_chooser", None) is not None:  # bound before: start from the stock class
        cls = cls.__mro__[1]
    cache = _BOUND_CLASSES.of(chooser)
    with _LOCK:
        bound = cache.get(cls)
        if bound is None:
            fn = _rebind(cast(types.FunctionType, cls.__call__), chooser)  # route() read it: a Python function
            bound = type(
                f"Attnkit{cls.__name__}",
                (cls,),
                {
                    "__call__": fn,
                    "__module__": __name__,
                    "__doc__": f"{cls.__name__}, with its scaled_dot_product_attention served by attnkit.",
                    "_attnkit_chooser": chooser,
                },
            )
            cache[cls] = bound
    new = object.__new__(bound)
    new.__dict__.update(getattr(proc, "__dict__", {}))
    return new


__all__ = ["Route", "bind_module", "bound_processor", "classify", "classify_forward"]
