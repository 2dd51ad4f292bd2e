"""flash_attn: FlashAttention's own ``flash_attn_func`` (optional extra ``attnkit[flash_attn]``).

FlashAttention-2 (package ``flash_attn``) by default; ``version=3`` uses FlashAttention-3
(``flash_attn_interface``, built from flash-attention's hopper/ folder, Hopper only).

flash_attn works on (B, N, H, D) tensors: ``q.transpose(1, 2)`` of the processor's
(B, H, N, D) views, free. Its limits, declared below and so refused with a reason
before any call (attnkit.auto() routes such calls elsewhere):

* CUDA, compute capability 8.0 or newer (9.0 for FlashAttention-3);
* float16 and bfloat16 only (cast your model with ``.half()`` or ``.to(torch.bfloat16)``);
* head dim at most 256; a head dim that is not a multiple of 8 is zero-padded to one
  (q, k and v; the output is sliced back) with the softmax scale of the real head dim
  (``D ** -0.5`` or ``attn.scale``) passed explicitly;
* no attention mask of any kind (no key padding, no bias).

flash-attn has no wheel on PyPI for most setups: ``pip install flash-attn
--no-build-isolation`` compiles it against your torch and CUDA (long), or install a
prebuilt wheel from the flash-attention GitHub releases that matches torch, CUDA and
Python exactly.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .base import Backend, Capabilities
from .tensors import bnhd_padded, round_up

_HALF = frozenset({torch.float16, torch.bfloat16})

_INSTALL_HINT = {
    2: "pip install flash-attn --no-build-isolation builds it against your torch and CUDA; "
    "or install a prebuilt wheel from the flash-attention releases that matches torch, "
    "CUDA and Python",
    3: "build it from flash-attention's hopper/ folder with python setup.py install",
}

_FA2_CAPS = Capabilities(
    devices=frozenset({"cuda"}),
    dtypes=_HALF,
    max_head_dim=256,
    min_capability=(8, 0),
    masks=frozenset({"none"}),
    backward=True,
    deterministic=False,
    package="flash_attn",
    min_version="2.0",
    install_hint=_INSTALL_HINT[2],
)

# FlashAttention-3's distribution has been published as "flash_attn_3" and, earlier,
# "flashattn-hopper"; either provides the module flash_attn_interface. The package
# check for it is in extra_reasons.
_FA3_CAPS = Capabilities(
    devices=frozenset({"cuda"}),
    dtypes=_HALF,
    max_head_dim=256,
    min_capability=(9, 0),
    masks=frozenset({"none"}),
    backward=True,
    deterministic=False,
    package=None,
)
FA3_DISTRIBUTIONS = ("flash_attn_3", "flashattn-hopper")


def _import_func(version: int):
    try:
        if version == 3:
            from flash_attn_interface import flash_attn_func
        else:
            from flash_attn import flash_attn_func
    except Exception as e:  # ImportError, or a build for another torch raising at import
        module = "flash_attn_interface" if version == 3 else "flash_attn"
        raise ImportError(
            f"the flash_attn backend (FlashAttention-{version}) could not import {module} "
            f"({e}); {_INSTALL_HINT[version]}; or choose another processor "
            "(`attnkit info` lists them)"
        ) from e
    return flash_attn_func


class FlashAttnBackend(Backend):
    name = "flash_attn"
    capabilities = _FA2_CAPS

    def __init__(self, version: int = 2, deterministic: bool = False):
        if version not in (2, 3):
            raise ValueError(f"version={version!r}: 2 (package flash_attn) or 3 (flash_attn_interface, Hopper)")
        self.version = version
        self.deterministic = bool(deterministic)
        caps = _FA3_CAPS if version == 3 else _FA2_CAPS
        # deterministic=True: FlashAttention's deterministic backward (slower).
        self.capabilities = replace(caps, deterministic=True) if self.deterministic else caps
        self._func = None

    def __repr__(self) -> str:
        args = []
        if self.version != 2:
            args.append(f"version={self.version}")
        if self.deterministic:
            args.append("deterministic=True")
        return f"FlashAttnBackend({', '.join(args)})"

    def _fa3_missing(self, call) -> bool:
        return self.version == 3 and all(call.package(name) is None for name in FA3_DISTRIBUTIONS)

    def install_hint(self, call):
        if self._fa3_missing(call):
            return _INSTALL_HINT[3]
        return super().install_hint(call)

    def extra_reasons(self, call):
        if self.version != 3:
            return []
        reasons = []
        if self._fa3_missing(call):
            reasons.append("flash_attn_3 (FlashAttention-3) is not installed")
        cap = call.device.capability
        if call.device.type == "cuda" and cap is not None and tuple(cap) >= (10, 0):
            have = ".".join(map(str, cap))
            reasons.append(
                f"compute capability {have}: FlashAttention-3 runs on Hopper (9.0) only; "
                "use version=2 or another backend"
            )
        return reasons

    def forward(self, q, k, v, attn_bias=None, scale=None, upcast=False):
        # upcast: FlashAttention keeps scores and softmax in float32 on chip already.
        if attn_bias is not None:
            raise ValueError(
                "the flash_attn backend takes no attention mask (flash_attn_func has no "
                "bias input); use attnkit.auto(), which routes masked calls to a backend "
                "that takes them, or the sdpa / xformers processor"
            )
        if self._func is None:
            self._func = _import_func(self.version)
        d, dv = q.shape[-1], v.shape[-1]
        scale = d**-0.5 if scale is None else float(scale)
        width = round_up(max(d, dv), 8)
        qt, kt, vt = bnhd_padded(q, width), bnhd_padded(k, width), bnhd_padded(v, width)
        kwargs = {"softmax_scale": scale, "causal": False}
        if self.deterministic:
            kwargs["deterministic"] = True
        if self.version == 2:
            kwargs["dropout_p"] = 0.0
        out = self._func(qt, kt, vt, **kwargs)
        if isinstance(out, tuple):  # some FlashAttention-3 builds return (out, lse)
            out = out[0]
        return out[..., :dv].transpose(1, 2)
