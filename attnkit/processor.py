"""diffusers' attention-processor protocol, written once for every backend.

diffusers calls ``processor(attn, hidden_states, encoder_hidden_states, attention_mask,
temb, **cross_attention_kwargs)`` for each ``Attention`` module. Everything around the
attention itself (spatial/group/cross norms, projections, qk-norm, head split, masks,
output projection, residual, rescale) is here, once; the backends only compute
``softmax(q k^T * scale + bias) v`` on (B, H, N, D) tensors.

One processor instance is shared by every module of a model, so it holds no per-layer
state: only its backend and a cache of "can this backend serve this kind of call".
"""

from __future__ import annotations

import logging
import os
from typing import Any, Protocol

import torch
from torch import nn

from ._compile import CompileOwner, compile_owner, is_compiling, mark_compile_constant
from .protocol import (  # noqa: F401  (UnsupportedModule and the checks are part of this module's API)
    APPLY_HINT,
    CHECK_FINITE_VAR,
    PROCESSOR_ARGUMENTS,
    UnsupportedModule,
    _check_finite,
    _fields_of,
    _norm_width,
    _PROTOCOL_FIELDS,
    _PROTOCOL_MODULES,
    _holds,
    advertised_signature,
    check_module,
    check_module_problem,
    describe_module,
    prepare_bias,
)
from .backends import AttentionCall, Backend, BackendUnavailable, Signature, get_backend, signature
from .backends.base import compile_key
from .binding import SERVE, keep_accepted, protocol_fits, served_by

logger = logging.getLogger("attnkit")


class Chooser(Protocol):
    """What a processor asks for the attention itself: it chooses a backend (one fixed
    backend, or auto()'s walk) and runs it on (B, H, N, D) tensors. ``who`` is the
    module, for logs and errors."""

    def attention(self, who: nn.Module | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  attn_bias: torch.Tensor | None, scale: float | None, upcast: bool, *,
                  causal_offset: int | None = None, dropout_p: float = 0.0, return_lse: bool = False): ...


def run_backend(backend: Backend, q, k, v, attn_bias, scale, upcast, causal_offset, dropout_p, return_lse):
    """Call ``backend`` as a call asks: forward_with_lse when the caller needs the LSE,
    and the causal and dropout arguments only when they are set (a backend that does
    not declare them is never handed one)."""
    if return_lse:
        return backend.forward_with_lse(q, k, v, attn_bias, scale, upcast, causal_offset=causal_offset)
    if causal_offset is None and dropout_p == 0.0:
        return backend.forward(q, k, v, attn_bias, scale, upcast)
    return backend.forward(q, k, v, attn_bias, scale, upcast, causal_offset=causal_offset, dropout_p=dropout_p)


def finite_checked(who, run, q, k, v, attn_bias, scale, upcast, causal_offset, dropout_p, return_lse):
    """``run(...)`` with ATTNKIT_CHECK_FINITE's checks of its inputs and output, naming
    ``who``: every route's calls pass here (a debugging aid: it syncs with the device)."""
    _check_finite(who, q=q, k=k, v=v, **({} if attn_bias is None else {"attn_bias": attn_bias}))
    out = run(who, q, k, v, attn_bias, scale, upcast, causal_offset=causal_offset, dropout_p=dropout_p,
              return_lse=return_lse)
    _check_finite(who, output=out[0] if return_lse else out)
    return out


def check_finite_on() -> bool:
    return os.environ.get(CHECK_FINITE_VAR, "") not in ("", "0")


def call_flags(causal_offset, dropout_p: float, return_lse: bool) -> tuple[bool, bool, bool]:
    """(causal, dropout, lse): the flags of a call's signature, as plain bools. Under
    torch.compile(dynamic=True) ``dropout_p > 0.0`` is symbolic, and the trace-time
    choice takes constants only."""
    return causal_offset is not None, True if dropout_p > 0.0 else False, return_lse


class ChooserBase(CompileOwner):
    """What every chooser's ``attention`` does before its own ``_attention``: the
    ATTNKIT_CHECK_FINITE checks, read when the chooser is made, for every route."""

    check_finite = False

    def attention(self, who, q, k, v, attn_bias, scale, upcast, *, causal_offset=None, dropout_p=0.0,
                  return_lse=False):
        if self.check_finite:
            return finite_checked(who, self._attention, q, k, v, attn_bias, scale, upcast, causal_offset,
                                  dropout_p, return_lse)
        return self._attention(who, q, k, v, attn_bias, scale, upcast, causal_offset=causal_offset,
                               dropout_p=dropout_p, return_lse=return_lse)

    def _attention(self, who, q, k, v, attn_bias, scale, upcast, *, causal_offset=None, dropout_p=0.0,
                   return_lse=False):
        raise NotImplementedError


class FixedChooser(ChooserBase):
    """One named backend. A call it cannot serve raises :class:`BackendUnavailable` with
    every reason; it never silently hands the call to another backend."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._reasons: dict[Signature, list[str]] = {}
        self.check_finite = check_finite_on()
        self._take_compile_token()
        mark_compile_constant(_fixed_problem)

    def _attention(self, who, q, k, v, attn_bias, scale, upcast, *, causal_offset=None, dropout_p=0.0,
                   return_lse=False):
        flags = call_flags(causal_offset, dropout_p, return_lse)
        if is_compiling():
            problem = _fixed_problem(self.compile_token, compile_key(q, k, v, attn_bias, *flags))
            if problem:
                raise BackendUnavailable(problem, reasons={self.backend.name: [problem]})
        else:
            sig = signature(q, k, v, attn_bias, *flags)
            reasons = self._reasons.get(sig)
            if reasons is None:
                reasons = self._reasons[sig] = self.backend.not_supported_reasons(AttentionCall.from_signature(sig))
            if reasons:
                raise BackendUnavailable(self.refusal(who, reasons), reasons={self.backend.name: reasons})
        return run_backend(self.backend, q, k, v, attn_bias, scale, upcast, causal_offset, dropout_p, return_lse)

    def refusal(self, who: nn.Module | None, reasons: list[str]) -> str:
        what = describe_module(who) if who is not None else "this call"
        return (
            f"attnkit backend {self.backend.name!r} cannot serve {what}: "
            + "; ".join(reasons)
            + ". Choose another processor (attnkit.auto() picks one that can run; "
            "`attnkit info` lists every backend and its limits)."
        )

    def describe(self) -> str:
        return repr(self.backend)


def _fixed_problem(token: str, key: tuple) -> str:
    """Run by torch.compile while tracing (a trace-time constant): "" when the backend of
    the FixedChooser with this compile_token can serve calls of this signature (a
    compile_key), else the refusal message."""
    chooser = compile_owner(token)
    reasons = chooser.backend.not_supported_reasons(AttentionCall.from_signature(Signature(*key)))
    return chooser.refusal(None, reasons) if reasons else ""


class AttnkitProcessor:
    """The diffusers attention processor, for any attnkit backend.

    ``AttnkitProcessor("sdpa")``, ``AttnkitProcessor(SDPABackend(kernel="flash"))``, or
    ``AttnkitProcessor(chooser)`` with a :class:`Chooser` (auto() is one). The processor
    does diffusers' protocol (projections, norms, masks, residual); the chooser decides
    which backend computes the attention.
    """

    backend_name: str | None = None
    _attnkit_processor = True  # what attnkit.binding and attnkit.routes recognise it by

    def __init__(self, backend: Backend | str | Chooser | None = None, **options: Any):
        if backend is None:
            backend = self.backend_name
        if backend is None:
            raise ValueError("AttnkitProcessor needs a backend (a name, a Backend or a chooser)")
        if isinstance(backend, str):
            backend = get_backend(backend, **options)
        elif options:
            raise ValueError(f"options {sorted(options)} go to the backend's constructor, not with an instance")
        self.chooser: Chooser = FixedChooser(backend) if isinstance(backend, Backend) else backend
        # (model class, attnkit.Applied) for every model attnkit.apply gave this processor
        self._applied: list = []

    def routes(self) -> str:
        """How attnkit.apply reached the attention modules of each model it gave this
        processor, and why (empty if it was set by set_attn_processor only)."""
        return "\n".join(f"{name}: {applied.explain()}" for name, applied in self._applied)

    @property
    def backend(self) -> Backend | None:
        """The backend of a named processor (None for auto())."""
        return getattr(self.chooser, "backend", None) if isinstance(self.chooser, FixedChooser) else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.chooser.describe()})"

    # -- diffusers' protocol --------------------------------------------------------------
    def __call__(self, attn: nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
        """What a module's forward calls. Each module is served by what its own processor
        computed before (see :mod:`attnkit.binding`): diffusers' Attention protocol here,
        or the replaced processor with attnkit's attention (its dispatch_attention_fn or
        scaled_dot_product_attention call), or a refusal where attnkit cannot compute it
        exactly (linear attention, ...).

        The signature diffusers sees (``__signature__``, below) names every argument a
        diffusers processor takes, so that a module never filters one out before it
        reaches attnkit: what is then not implemented is refused, never dropped.
        """
        serve = attn.__dict__.get(SERVE)
        if serve is None or serve[0] is not self:
            serve = self._bind(attn)
        inner = serve[1]
        if inner is None:
            return self._protocol(attn, *args, **kwargs)
        accepted = serve[2]
        if accepted is not None and kwargs:
            for key in kwargs:
                if key not in accepted:
                    kwargs = keep_accepted(attn, inner, accepted, kwargs)
                    break
        inner._parallel_config = getattr(self, "_parallel_config", None)
        return inner(attn, *args, **kwargs)

    def _bind(self, attn: nn.Module):
        if is_compiling():
            if protocol_fits(attn):  # decided from the module alone: nothing stored while tracing
                return (self, None, None)
            raise UnsupportedModule(
                f"attnkit's processor meets {describe_module(attn)} for the first time under torch.compile, "
                f"and binding it reads the source of its processor, which torch.compile cannot trace. Set the "
                f"processor with set_attn_processor / set_processor, run the model once before compiling it, or "
                f"bind everything up front with attnkit.apply(model, processor)"
            )
        return served_by(self, attn)

    def _protocol(
        self,
        attn: nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        temb: torch.Tensor | None = None,
        *args: Any,
        scale: float | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        # `scale` is the deprecated LoRA scale, which diffusers' own processors ignore too.
        if args or kwargs:
            given = [f"argument {i + 5}" for i, a in enumerate(args) if a is not None]
            given += [name for name, value in kwargs.items() if value is not None]
            if given:
                raise UnsupportedModule(
                    f"attnkit's processor cannot serve {describe_module(attn)}: it was given {', '.join(given)}, "
                    f"which diffusers' Attention protocol does not take (a rotary embedding or another input its "
                    f"own processor applies). {APPLY_HINT}."
                )
        check_module(attn, encoder_hidden_states)
        # Submodules straight from the module's registry: nn.Module.__getattr__ is a Python
        # call per lookup, and this runs on every attention call of the model.
        mods, attrs = attn._modules, attn.__dict__
        if not _holds(attrs, _PROTOCOL_FIELDS) or not _holds(mods, _PROTOCOL_MODULES):
            mods, attrs = _fields_of(attn)  # a module that keeps some of them as properties
        residual = hidden_states
        spatial_norm = mods.get("spatial_norm")
        if spatial_norm is not None:
            hidden_states = spatial_norm(hidden_states, temb)

        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            batch, channel, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch, channel, height * width).transpose(1, 2)
        batch, q_len, _ = hidden_states.shape

        group_norm = mods.get("group_norm")
        if group_norm is not None:
            hidden_states = group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)

        self_attention = encoder_hidden_states is None
        if self_attention:
            encoder_hidden_states = hidden_states
        elif mods.get("norm_cross") is not None:
            encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)

        fused = attrs.get("fused_projections", False)
        if fused and self_attention and "to_qkv" in mods:
            query, key, value = mods["to_qkv"](hidden_states).chunk(3, dim=-1)
        elif fused and not self_attention and "to_kv" in mods:
            query = mods["to_q"](hidden_states)
            key, value = mods["to_kv"](encoder_hidden_states).chunk(2, dim=-1)
        else:
            query = mods["to_q"](hidden_states)
            key = mods["to_k"](encoder_hidden_states)
            value = mods["to_v"](encoder_hidden_states)

        heads = attrs["heads"]
        head_dim = query.shape[-1] // heads
        kv_len = key.shape[1]
        kv_heads = key.shape[-1] // head_dim

        norm_q, norm_k = mods.get("norm_q"), mods.get("norm_k")
        # qk-norm over all heads at once (Lumina's, LTX's) comes before the head split.
        if norm_q is not None and _norm_width(norm_q) == query.shape[-1] != head_dim:
            query, norm_q = norm_q(query), None
        if norm_k is not None and _norm_width(norm_k) == key.shape[-1] != head_dim:
            key, norm_k = norm_k(key), None

        # (B, N, H*D) -> (B, H, N, D) as a strided view: no copy.
        q = query.view(batch, q_len, heads, head_dim).transpose(1, 2)
        k = key.view(batch, kv_len, kv_heads, head_dim).transpose(1, 2)
        v = value.view(batch, kv_len, kv_heads, value.shape[-1] // kv_heads).transpose(1, 2)
        if norm_q is not None:
            q = norm_q(q)
        if norm_k is not None:
            k = norm_k(k)
        if kv_heads != heads:
            # grouped-query attention: each key/value head serves heads // kv_heads queries.
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)

        bias = None if attention_mask is None else prepare_bias(attention_mask, batch, heads, q_len, kv_len, q.dtype, attn)
        upcast = bool(attrs["upcast_attention"] or attrs["upcast_softmax"])
        out = self.chooser.attention(attn, q, k, v, bias, attrs["scale"], upcast)

        out = out.transpose(1, 2).reshape(batch, q_len, heads * out.shape[-1])
        if out.dtype != query.dtype:
            out = out.to(query.dtype)
        to_out = mods["to_out"]
        out = to_out[1](to_out[0](out))
        if input_ndim == 4:
            out = out.transpose(-1, -2).reshape(batch, channel, height, width)
        if attrs["residual_connection"]:
            out = out + residual
        if attrs["rescale_output_factor"] != 1.0:
            out = out / attrs["rescale_output_factor"]
        return out


AttnkitProcessor.__call__.__signature__ = advertised_signature()


class VanillaProcessor(AttnkitProcessor):
    """baddbmm + softmax + bmm (diffusers' AttnProcessor), honouring every option."""

    backend_name = "vanilla"

    def __init__(self) -> None:
        super().__init__("vanilla")


class SlicedProcessor(AttnkitProcessor):
    """Vanilla attention, slice_size (batch*head) rows at a time: low peak memory.

    slice_size: a positive int, "auto" (half the heads) or "max" (one at a time).
    """

    backend_name = "sliced"

    def __init__(self, slice_size: int | str = "auto") -> None:
        super().__init__("sliced", slice_size=slice_size)


class SDPAProcessor(AttnkitProcessor):
    """torch's scaled_dot_product_attention, with attn.scale and masks passed through.

    kernel: None (torch chooses), or "flash", "efficient", "math", "cudnn" to pin one.
    """

    backend_name = "sdpa"

    def __init__(self, kernel: str | None = None) -> None:
        super().__init__("sdpa", kernel=kernel)


class XFormersProcessor(AttnkitProcessor):
    """xformers.ops.memory_efficient_attention (CUDA; optional extra ``attnkit[xformers]``)."""

    backend_name = "xformers"

    def __init__(self, **options: Any) -> None:
        super().__init__("xformers", **options)


class FlashAttnProcessor(AttnkitProcessor):
    """flash_attn.flash_attn_func (CUDA, fp16/bf16, no mask; optional extra)."""

    backend_name = "flash_attn"

    def __init__(self, **options: Any) -> None:
        super().__init__("flash_attn", **options)


class TritonProcessor(AttnkitProcessor):
    """attnkit's own Triton FlashAttention kernel (CUDA)."""

    backend_name = "triton"

    def __init__(self, **options: Any) -> None:
        super().__init__("triton", **options)


PROCESSORS = {
    "vanilla": VanillaProcessor,
    "sliced": SlicedProcessor,
    "sdpa": SDPAProcessor,
    "xformers": XFormersProcessor,
    "flash_attn": FlashAttnProcessor,
    "triton": TritonProcessor,
}
