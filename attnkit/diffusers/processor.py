"""diffusers' attention-processor protocol, written once for every backend.

diffusers calls ``processor(attn, hidden_states, encoder_hidden_states, attention_mask,
temb, **cross_attention_kwargs)`` for each ``Attention`` module. Everything around the
attention itself (spatial/group/cross norms, projections, qk-norm, head split, masks,
output projection, residual, rescale) is here, once; the backends only compute
``softmax(q k^T * scale + bias) v`` on (B, H, N, D) tensors, as a chooser
(:mod:`attnkit.choose`) picks them.

One processor instance is shared by every module of a model, so it holds no per-layer
state: only its chooser.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..backends import AttentionCall, Backend, get_backend
from ..choose.auto import AUTO_OPTIONS, AutoChooser
from ..choose.compiling import is_compiling
from ..choose.decision import Decision
from ..choose.fixed import Chooser, FixedChooser
from ..errors import UnsupportedModule
from ..text import describe_module
from .binding import keep_accepted, protocol_fits, served_by, strict_default
from .protocol import (  # noqa: F401  (check_module_problem, PROCESSOR_ARGUMENTS: read here by code older than attnkit.diffusers)
    _PROTOCOL_FIELDS,
    _PROTOCOL_MODULES,
    APPLY_HINT,
    PROCESSOR_ARGUMENTS,
    _fields_of,
    _holds,
    _norm_width,
    advertised_signature,
    check_module,
    check_module_problem,
    prepare_bias,
)
from .stock import SERVE

logger = logging.getLogger("attnkit")


class AttnkitProcessor:
    """The diffusers attention processor, for any attnkit backend.

    ``AttnkitProcessor("sdpa")``, ``AttnkitProcessor(SDPABackend(kernel="flash"))``, or
    ``AttnkitProcessor(chooser)`` with a :class:`Chooser` (auto() is one). The processor
    does diffusers' protocol (projections, norms, masks, residual); the chooser decides
    which backend computes the attention.
    """

    backend_name: str | None = None
    _attnkit_processor = True  # what attnkit.diffusers.binding and .routes recognise it by
    # What a module attnkit cannot compute exactly does: False, it keeps its own processor
    # (stock's output, said once per model); True, it raises UnsupportedModule at its first
    # call. (A processor pickled before the option existed unpickles as not strict.)
    strict: bool = False

    def __init__(self, backend: Backend | str | Chooser | None = None, *, strict: bool | None = None, **options: Any):
        self.strict = strict_default() if strict is None else _flag(strict, "strict")
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
        # a chooser of one's own need only have attention() (the Chooser protocol)
        describe = getattr(self.chooser, "describe", None)
        return f"{type(self).__name__}({describe() if callable(describe) else repr(self.chooser)})"

    # -- diffusers' protocol --------------------------------------------------------------
    def __call__(self, attn: nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
        """What a module's forward calls. Each module is served by what its own processor
        computed before (see :mod:`attnkit.diffusers.binding`): diffusers' Attention protocol here,
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
        config = getattr(self, "_parallel_config", None)
        if config is not None or getattr(inner, "_parallel_config", None) is not None:
            # diffusers' enable_parallelism sets it on the module's processor (this one)
            inner._parallel_config = config
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
        # (typed Any: diffusers' Attention declares neither)
        mods: dict[str, Any] = attn._modules
        attrs: dict[str, Any] = attn.__dict__
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
            encoder_hidden_states = getattr(attn, "norm_encoder_hidden_states")(encoder_hidden_states)

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

        bias = (
            None if attention_mask is None else prepare_bias(attention_mask, batch, heads, q_len, kv_len, q.dtype, attn)
        )
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


setattr(AttnkitProcessor.__call__, "__signature__", advertised_signature())


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(
            f"{name}={value!r}: pass True or False (or None: the environment variable ATTNKIT_{name.upper()} decides)"
        )
    return value


class VanillaProcessor(AttnkitProcessor):
    """baddbmm + softmax + bmm (diffusers' AttnProcessor), honouring every option."""

    backend_name = "vanilla"

    def __init__(self, *, strict: bool | None = None) -> None:
        super().__init__("vanilla", strict=strict)


class SlicedProcessor(AttnkitProcessor):
    """Vanilla attention, slice_size (batch*head) rows at a time: low peak memory.

    slice_size: a positive int, "auto" (half the heads) or "max" (one at a time).
    """

    backend_name = "sliced"

    def __init__(self, slice_size: int | str = "auto", *, strict: bool | None = None) -> None:
        super().__init__("sliced", slice_size=slice_size, strict=strict)


class SDPAProcessor(AttnkitProcessor):
    """torch's scaled_dot_product_attention, with attn.scale and masks passed through.

    kernel: None (torch chooses), or "flash", "efficient", "math", "cudnn" to pin one.
    """

    backend_name = "sdpa"

    def __init__(self, kernel: str | None = None, *, strict: bool | None = None) -> None:
        super().__init__("sdpa", kernel=kernel, strict=strict)


class XFormersProcessor(AttnkitProcessor):
    """xformers.ops.memory_efficient_attention (CUDA; optional extra ``attnkit[xformers]``)."""

    backend_name = "xformers"

    def __init__(self, *, strict: bool | None = None, **options: Any) -> None:
        super().__init__("xformers", strict=strict, **options)


class FlashAttnProcessor(AttnkitProcessor):
    """flash_attn.flash_attn_func (CUDA, fp16/bf16, no mask; optional extra)."""

    backend_name = "flash_attn"

    def __init__(self, *, strict: bool | None = None, **options: Any) -> None:
        super().__init__("flash_attn", strict=strict, **options)


class TritonProcessor(AttnkitProcessor):
    """attnkit's own Triton FlashAttention kernel (CUDA)."""

    backend_name = "triton"

    def __init__(self, *, strict: bool | None = None, **options: Any) -> None:
        super().__init__("triton", strict=strict, **options)


PROCESSORS = {
    "vanilla": VanillaProcessor,
    "sliced": SlicedProcessor,
    "sdpa": SDPAProcessor,
    "xformers": XFormersProcessor,
    "flash_attn": FlashAttnProcessor,
    "triton": TritonProcessor,
}


class AutoProcessor(AttnkitProcessor):
    """The diffusers attention processor that picks a backend per call (see
    :mod:`attnkit.choose.auto`). Options as :func:`auto`."""

    chooser: AutoChooser

    def __init__(self, *, strict: bool | None = None, **options: Any) -> None:
        unknown = sorted(set(options) - set(AUTO_OPTIONS))
        if unknown:
            raise TypeError(
                f"attnkit.auto() has no option {', '.join(map(repr, unknown))}; its options are "
                f"{', '.join(('strict',) + AUTO_OPTIONS)} (help(attnkit.auto) says what each does)"
            )
        super().__init__(AutoChooser(**options), strict=strict)

    def __repr__(self) -> str:
        return self.chooser.describe()

    @property
    def decisions(self) -> list[Decision]:
        return self.chooser.decisions

    def explain(self, call: AttentionCall | None = None) -> str:
        """The routes into each model attnkit.apply gave this processor, then every
        decision per call signature (see AutoChooser.explain); with ``call``, the table
        for that one call."""
        if call is not None:
            return self.chooser.explain(call)
        routes = self.routes()
        return (routes + "\n" if routes else "") + self.chooser.explain()


def auto(**options: Any) -> AutoProcessor:
    """A processor for ``set_attn_processor`` / ``attnkit.apply`` that picks, per call,
    the first backend of the device's priority list that can serve it.

    Options: ``tune=True`` (on first sight of a signature, check every candidate's
    output against the priority choice's, time those that pass in ``tune_iters``
    interleaved rounds, and take one only for a median gain of ``tune_margin`` (0.05);
    persisted to ``cache_path``), ``order=[...]``, ``exclude=[...]``,
    ``backend_options={...}``, ``backends={label: Backend}``. ``ATTNKIT_BACKEND=name`` forces one
    backend. ``processor.explain()`` shows every decision and why.

    ``strict=True`` (or ``ATTNKIT_STRICT=1``): a module attnkit cannot compute exactly
    (linear attention, a flex mask, weights of its own) raises UnsupportedModule at its
    first call, naming it and why, instead of keeping its own processor (the default:
    stock's output, said once per model).

    ``lossy="int8"`` (opt-in; never chosen otherwise) runs attnkit's INT8 attention first
    wherever it can serve a call (inference, 16-bit, head dims 8-512, any mask), under a
    quality guard that checks sampled rows against an exact backend and falls back per
    module by itself; ``guard={...}`` sets it (``every``, ``rows``, ``max_error``,
    ``min_cosine``; ``False``: no checks). docs/int8.md says what it costs.
    """
    return AutoProcessor(**options)
