"""The model zoo: one tiny configuration of every diffusers model class that has attention.

Each :class:`ZooCase` builds a diffusers model from a tiny config (random weights, no hub)
and draws random inputs for its forward, so that a test can run the same model with its
stock attention and with attnkit's and compare. The cases themselves live in
``cases/<family>.py``; :mod:`_zoo` collects them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn


@dataclass(frozen=True)
class ZooCase:
    """One model class (or one variant of it) at test size.

    name:    the class name as exported by ``diffusers`` (``FluxTransformer2DModel``).
    config:  keyword arguments of the class's constructor: tiny, but keeping the
             attention layout of the real model (joint text+image, rotary, masks, qk-norm,
             GQA, cross-attention...).
    inputs:  ``inputs(model, generator) -> dict`` of forward keyword arguments, random
             (never zeros), on the model's device and dtype. Rotary embeddings passed as
             inputs are real (random angles), never the identity. Masks are real masks
             (variable lengths per batch item) where the model takes them.
    outputs: the tensors to compare from what forward returns (default: ``.sample``,
             or the first element of a tuple, or the tensor itself).
    variant: "" for the main case, or a short name ("masked", "i2v", ...) for another
             configuration of the same class; the case id is ``name`` or ``name-variant``.
    note:    how the model's attention is computed (which modules, which processors, which
             extra inputs they take); shown in reports.
    backward: whether a backward through the model is meaningful (False for models whose
             forward is not differentiable as configured).
    """

    name: str
    config: dict
    inputs: Callable[[nn.Module, torch.Generator], dict[str, Any]]
    outputs: Callable[[Any], tuple[torch.Tensor, ...]] | None = None
    variant: str = ""
    note: str = ""
    backward: bool = True
    extra: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.name}-{self.variant}" if self.variant else self.name

    def model_class(self) -> type:
        import diffusers

        return getattr(diffusers, self.name)

    def build(self, seed: int = 0, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> nn.Module:
        """The model with random weights (seeded), in eval mode."""
        torch.manual_seed(seed)
        model = self.model_class()(**self.config)
        random_init_(model, seed)
        return model.to(device=device, dtype=dtype).eval()

    def make_inputs(self, model: nn.Module, seed: int = 0) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(seed)
        return self.inputs(model, gen)

    def run(self, model: nn.Module, inputs: dict[str, Any]) -> tuple[torch.Tensor, ...]:
        out = model(**inputs)
        return (self.outputs or default_outputs)(out)


def default_outputs(out: Any) -> tuple[torch.Tensor, ...]:
    if isinstance(out, torch.Tensor):
        return (out,)
    sample = getattr(out, "sample", None)
    if isinstance(sample, torch.Tensor):
        return (sample,)
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return (out[0],)
    raise TypeError(f"cannot find the output tensor in {type(out).__name__}; give the case an `outputs`")


@torch.no_grad()
def random_init_(module: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter random at torch's default-initialisation scale: matrices and
    convolutions ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), vectors (norm scales, biases,
    learned embeddings) random and nonzero. diffusers zero-initialises many output and
    gating layers (adaLN-zero, proj_out): left as they are, attention would not reach
    the output and a comparison could not fail."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        if p.dim() >= 2:
            bound = 1.0 / math.sqrt(p[0].numel())
            p.copy_(torch.empty(p.shape).uniform_(-bound, bound, generator=gen))
        elif name.endswith("weight") or name.endswith("scale") or name.endswith("gamma"):
            p.copy_(1.0 + 0.1 * torch.empty(p.shape).uniform_(-1, 1, generator=gen))
        else:
            p.copy_(0.1 * torch.empty(p.shape).uniform_(-1, 1, generator=gen))
    return module


def randn(gen: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32, device="cpu") -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


def random_angles_rotary(gen: torch.Generator, tokens: int, dim: int, dtype=torch.float32, device="cpu"):
    """(cos, sin) of random angles, each (tokens, dim): a real rotary embedding, not the identity."""
    angles = torch.rand(tokens, dim // 2, generator=gen) * (2 * math.pi)
    angles = angles.repeat_interleave(2, dim=-1)
    return angles.cos().to(device=device, dtype=dtype), angles.sin().to(device=device, dtype=dtype)


def model_param(model: nn.Module) -> torch.Tensor:
    """Any parameter of the model: its device and dtype are the model's."""
    return next(model.parameters())
