"""The flex route: processors that name diffusers' flex backend themselves.

Some diffusers processors build a FlexAttention ``BlockMask`` and call
``dispatch_attention_fn`` with the flex backend by name: hard-coded
(``backend=AttentionBackendName.FLEX``: Kandinsky 6 SR's NABLA attention, Wan-Animate-2's
generation pass), or their own ``_attention_backend`` where they refuse any other
(``"flex"``: LTX-2's neighbourhood attention, AnyFlow FAR's frame-causal attention).
Pointing their ``_attention_backend`` at attnkit (the dispatch route) cannot reach them.

The flex route runs the stock processor's own code (a copy of it, as the sdpa route
does) with its ``dispatch_attention_fn`` read under a name of attnkit's: a function
that sends a call naming the flex backend to attnkit's registered backend instead, and
every other call on as it was. attnkit computes the BlockMask exactly
(:func:`attnkit.block_masks.block_mask_attention`: its element mask where it has a
mask_mod, its block lists where it has none, as compiled FlexAttention does) and any
other mask or none through its chooser. Under torch.compile a BlockMask call stays on
diffusers' flex backend, which compiled FlexAttention computes exactly. What attnkit
cannot honour of a flex call (dropout, which diffusers' flex backend drops; the
log-sum-exp, a causal flag or context parallelism with a BlockMask; a 2-D tensor mask,
which flex reads as a query mask; other attention_kwargs) is refused, naming the module
and the argument.

The renamed global is added to the diffusers module's globals through
:func:`attnkit.diffusers.hooks.set_global`, and leaves with the chooser.

``model.set_attention_backend("attnkit")`` reaches the processors that accept the flex
backend alone (LTX-2's decoder, AnyFlow FAR) another way: they pass their own
``_attention_backend`` to dispatch_attention_fn, and refuse, by their own check against
their ``_SUPPORTED_BACKENDS``, any name that is not flex. :func:`accept_attnkit` lets that
instance accept attnkit's names as well (diffusers' registry then sends the call, its
BlockMask with it, to attnkit's backend); a later ``set_attention_backend`` of another
name takes it back, so the processor refuses again as diffusers wrote it.
"""

from __future__ import annotations

import dis
import inspect
import itertools
import threading
import types
from typing import Any

from ..choose.compiling import is_compiling
from ..errors import UnsupportedModule
from ..text import Caller
from . import backend as diffusers_backend
from . import hooks
from .adapters import PerChooser
from .hooks_base import diffusers_dispatch, diffusers_version

DISPATCH = "dispatch_attention_fn"
FLEX = "flex"
# how a processor's source names the flex backend (ast.unparse of the backend argument)
FLEX_SOURCES = frozenset({"AttentionBackendName.FLEX", "'flex'"})
SUPPORTED = "_SUPPORTED_BACKENDS"  # the backends a flex-only processor's own check accepts
MARK = "_attnkit_flex_backend"  # the attnkit backend a flex copy sends its flex calls to
# dispatch_attention_fn's parameters, as the diverting function takes them
PARAMETERS = (
    "query",
    "key",
    "value",
    "attn_mask",
    "dropout_p",
    "is_causal",
    "scale",
    "enable_gqa",
    "attention_kwargs",
    "backend",
    "parallel_config",
)

_LOCK = threading.RLock()
_UNIQUE = itertools.count()
_GLOBAL_NAMES = PerChooser()  # chooser -> {diffusers module name: the global its copies read}
_BOUND_CLASSES = PerChooser(weak_values=True)  # chooser -> {stock class: its flex copy class}
_CALLER = Caller("its flex attention call, served by attnkit")


def is_flex(backend: Any) -> bool:
    """Whether ``backend`` (a name or an AttentionBackendName) is diffusers' flex backend."""
    return backend is not None and getattr(backend, "value", backend) == FLEX


def is_attnkit_name(backend: Any) -> bool:
    """Whether ``backend`` (a name or an AttentionBackendName) is one of attnkit's."""
    value = getattr(backend, "value", backend)
    return isinstance(value, str) and value.lower().startswith(diffusers_backend.PREFIX)


class WithAttnkit(tuple):
    """A flex-only processor's own ``_SUPPORTED_BACKENDS``, accepting attnkit's names
    too (every one: ``attnkit``, ``attnkit_int8``, the per-chooser names attnkit.apply
    gives). Copied as it is; pickled as the plain tuple, so a saved model loads with
    diffusers' own check."""

    def __contains__(self, name: object) -> bool:
        return tuple.__contains__(self, name) or is_attnkit_name(name)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        return tuple, (tuple(self),)


def accepts_flex_alone(proc: Any) -> bool:
    """Whether ``proc`` refuses, by its own check against its class's
    ``_SUPPORTED_BACKENDS`` (a tuple naming flex), every backend but flex."""
    supported = getattr(type(proc), SUPPORTED, None)
    if not isinstance(supported, tuple) or FLEX not in supported:
        return False
    return any(SUPPORTED in fn.__code__.co_names for fn in _methods(type(proc)).values())


def accept_attnkit(proc: Any, on: bool) -> bool:
    """``set_attention_backend`` named an attnkit backend (``on``) or another: a
    processor that accepts flex alone accepts attnkit's names too, or again only its
    own (the instance's entry goes; the class's tuple is never changed). Returns
    whether ``proc`` is such a processor."""
    if proc is None or not accepts_flex_alone(proc):
        return False
    own = vars(proc)
    if on:
        if not isinstance(own.get(SUPPORTED), WithAttnkit):
            own[SUPPORTED] = WithAttnkit(getattr(type(proc), SUPPORTED))
    elif isinstance(own.get(SUPPORTED), WithAttnkit):
        del own[SUPPORTED]
    return True


def accepts_attnkit(proc: Any) -> bool:
    """Whether ``proc``, a flex-only processor, accepts attnkit's names now
    (:func:`accept_attnkit`) and is set to one."""
    own = getattr(proc, "__dict__", {})
    return isinstance(own.get(SUPPORTED), WithAttnkit) and is_attnkit_name(getattr(proc, "_attention_backend", None))


def _methods(cls: type) -> dict[str, types.FunctionType]:
    """The plain functions of ``cls`` and its bases that read dispatch_attention_fn."""
    out: dict[str, types.FunctionType] = {}
    for klass in reversed(cls.__mro__):
        for key, value in vars(klass).items():
            if isinstance(value, types.FunctionType) and DISPATCH in value.__code__.co_names:
                out[key] = value
    return out


def problem(proc: Any, backends: list[str], compares: bool) -> tuple[bool, str | None]:
    """(whether ``proc``'s dispatch_attention_fn calls name diffusers' flex backend, why
    attnkit cannot serve them or None). ``backends``: what each call passes as backend
    (routes._dispatch_backends); ``compares``: whether the processor checks its own
    ``_attention_backend`` (then it is served only while that is flex, and keeps it)."""
    hard = [b for b in backends if b in FLEX_SOURCES]
    own = [b for b in backends if b == "self._attention_backend"]
    if len(hard) + len(own) != len(backends) or not (hard or compares):
        return False, None
    if compares and not is_flex(getattr(proc, "_attention_backend", None)):
        return False, None
    name = type(proc).__name__
    if own and not hasattr(proc, "_attention_backend"):
        return True, f"{name} has no _attention_backend to point at attnkit"
    why = diffusers_backend.problem()
    if why is not None:
        return True, why
    real = getattr(diffusers_dispatch, DISPATCH, None)
    if real is None or tuple(inspect.signature(real).parameters) != PARAMETERS:
        return True, (
            f"{name} calls diffusers' flex backend, and diffusers {diffusers_version()}'s dispatch_attention_fn "
            f"does not take the arguments attnkit's flex route was written for ({', '.join(PARAMETERS)})"
        )
    for fn in _methods(type(proc)).values():
        loads = [x for x in dis.get_instructions(fn) if x.argval == DISPATCH]
        if any(x.opname != "LOAD_GLOBAL" for x in loads) or fn.__globals__.get(DISPATCH) is not real:
            return True, f"{name}.{fn.__name__} reaches dispatch_attention_fn other than as diffusers' module global"
    return True, None


def reason(proc: Any, compares: bool) -> str:
    """The flex route's reason, for a processor :func:`problem` accepts."""
    accepts = " (it accepts no other)" if compares else ""
    return (
        f"{type(proc).__name__} calls diffusers' flex backend by name{accepts}: it runs as it is, and attnkit "
        "computes that call (its BlockMask exactly, in eager mode)"
    )


def flex_copy(stock: Any, proc) -> Any:
    """A copy of ``stock`` whose dispatch_attention_fn calls naming the flex backend are
    served by ``proc``'s chooser; its own ``_attention_backend`` is pointed at attnkit
    too, unless it is flex (a processor that accepts only flex keeps it, and its calls
    are sent on). The stock processor is left as it was: undo() puts it back."""
    chooser = proc.chooser
    member = diffusers_backend.member_for(proc)
    cls = type(stock)
    if getattr(cls, "_attnkit_flex", False):  # copied before: start from the stock class
        cls = cls.__mro__[1]
    cache = _BOUND_CLASSES.of(chooser)
    with _LOCK:
        bound = cache.get(cls)
        if bound is None:
            methods = {key: _rebind(fn, chooser, member) for key, fn in _methods(cls).items()}
            bound = type(
                f"AttnkitFlex{cls.__name__}",
                (cls,),
                {
                    **methods,
                    "__module__": __name__,
                    "__doc__": f"{cls.__name__}, with its flex attention calls served by attnkit.",
                    "_attnkit_flex": True,
                },
            )
            cache[cls] = bound
    new = object.__new__(bound)
    new.__dict__.update(getattr(stock, "__dict__", {}))
    if hasattr(stock, "_attention_backend") and not is_flex(stock._attention_backend):
        new._attention_backend = member
    new.__dict__[MARK] = member  # the name stays in diffusers' registry while this copy lives
    new._attnkit_copy = True
    new._attnkit_lease = diffusers_backend.Lease(chooser)  # the registry holds the chooser weakly
    return new


def _rebind(fn: types.FunctionType, chooser, member: Any) -> types.FunctionType:
    """fn with its dispatch_attention_fn global read under a name of attnkit's, bound to
    :func:`_diverting` for ``member``, in the same module globals (torch.compile's guards
    rely on them); the name leaves the module with the chooser."""
    globals_ = fn.__globals__
    names = _GLOBAL_NAMES.of(chooser)
    where = globals_.get("__name__", "")
    unique = names.get(where)
    if unique is None:
        unique = names[where] = f"_attnkit_{DISPATCH}_{next(_UNIQUE)}"
        hooks.set_global(globals_, unique, _diverting(globals_[DISPATCH], member), owner=chooser)
    code = fn.__code__.replace(co_names=tuple(unique if n == DISPATCH else n for n in fn.__code__.co_names))
    new = types.FunctionType(code, globals_, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__doc__ = fn.__doc__
    return new


def _diverting(real, member):
    """diffusers' dispatch_attention_fn (``real``), with a call naming the flex backend
    sent to attnkit's ``member`` (holding no chooser: it sits in a module's globals)."""

    def dispatch_attention_fn(
        query,
        key,
        value,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
        enable_gqa=False,
        attention_kwargs=None,
        *,
        backend=None,
        parallel_config=None,
    ):
        if is_flex(backend):
            block_mask = attn_mask is not None and type(attn_mask).__name__ == "BlockMask"
            if not (block_mask and is_compiling()):  # compiled, diffusers' flex computes a BlockMask exactly
                refuse(attn_mask, block_mask, dropout_p, is_causal, attention_kwargs, parallel_config)
                backend = member
        return real(
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            attention_kwargs,
            backend=backend,
            parallel_config=parallel_config,
        )

    return dispatch_attention_fn


def refuse(attn_mask, block_mask: bool, dropout_p, is_causal, attention_kwargs, parallel_config) -> None:
    """Raise UnsupportedModule, naming the module and the arguments, for what attnkit
    cannot honour of a flex call (nothing is dropped)."""
    extra = dict(attention_kwargs or {})
    given = [f"dropout_p={dropout_p}"] if dropout_p else []
    if block_mask:
        given += ["is_causal=True"] if is_causal else []
        given += ["return_lse=True"] if extra.pop("return_lse", False) else []
        given += ["a context-parallel config"] if parallel_config is not None else []
    elif getattr(attn_mask, "ndim", None) == 2:
        given.append("a 2-D tensor attn_mask (diffusers' flex backend reads it as a query mask)")
    extra.pop("return_lse", None)
    given += [f"attention_kwargs {', '.join(sorted(extra))}"] if extra else []
    if given:
        raise UnsupportedModule(
            f"attnkit serves {_CALLER.describe()} in place of diffusers' flex backend, and cannot honour "
            f"{', '.join(given)}: undo() of attnkit.apply (or the stock processor) gives it diffusers' flex backend again"
        )


__all__ = [
    "FLEX",
    "WithAttnkit",
    "accept_attnkit",
    "accepts_attnkit",
    "accepts_flex_alone",
    "flex_copy",
    "is_attnkit_name",
    "is_flex",
    "problem",
    "reason",
    "refuse",
]
