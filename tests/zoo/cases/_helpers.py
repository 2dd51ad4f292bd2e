"""What the zoo's case modules share: the ZooCase subclasses that build a model in more than
one step, and the small input helpers (random tensors in the model's device and dtype,
timesteps, key-padding masks, rotary angles).

Two sets, from the two halves the zoo was first written in: ``_Case``, ``_like``, ``_rn``,
``_timestep``, ``_text_keep``, ``_rope_halves``, ``_time_gain`` (first half), and ``_pd``,
``_r``, ``_t``, ``_steps``, ``_keep`` and the other ``*Case`` classes (second half).
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass

import torch

from tests.zoo._zoo_common import ZooCase, default_outputs, model_param, randn, random_init_


@dataclass(frozen=True)
class _Case(ZooCase):
    """A ZooCase with three optional steps around the random initialisation:

    make:  ``make(config) -> model`` instead of ``cls(**config)``, for wrappers whose
           constructor takes models (Multi-ControlNets hold their ControlNets).
    gains: ((regex on the parameter name, factor), ...) multiplied after the init. At
           torch's default initialisation scale a tiny adaLN-zero DiT gets a timestep
           embedding of ~0.1 and gates of ~0.03, and zero-initialised scalar gates or output
           projections come out near 0, so attention reaches the output at ~1e-5 relative
           and a comparison through the model could barely fail; a gain brings those few
           parameters to the scale of a trained model.
    setup: ``setup(model)`` after that (tiling where the forward has no untiled path,
           module constants that the init draws far from their meaning).
    """

    make: object = None
    gains: tuple = ()
    setup: object = None

    def build(self, seed: int = 0, dtype: torch.dtype = torch.float32, device="cpu"):
        torch.manual_seed(seed)
        model = self.make(self.config) if self.make is not None else self.model_class()(**self.config)
        random_init_(model, seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                for pattern, factor in self.gains:
                    if re.search(pattern, name):
                        p.mul_(factor)
            if self.setup is not None:
                self.setup(model)
        return model.to(device=device, dtype=dtype).eval()


# The timestep embedding's last layer x10: at the default initialisation it comes out at ~0.1
# and every adaLN gate at ~0.03 (see _Case).
def _time_gain(prefix: str) -> tuple:
    return ((prefix + r"timestep_embedder\.linear_2\.", 10.0),)


def _like(model):
    p = model_param(model)
    return {"dtype": p.dtype, "device": p.device}


def _rn(model, gen, *shape):
    return randn(gen, *shape, **_like(model))


def _timestep(model, gen, batch, scale=1000.0):
    """Random timesteps in (0, scale), one per batch item."""
    return (torch.rand(batch, generator=gen) * scale).to(**_like(model))


def _text_keep(lengths, total, device="cpu"):
    """(B, total) bool: True for the first `length` tokens of each batch item."""
    idx = torch.arange(total)
    return torch.stack([idx < n for n in lengths]).to(device)


def _angles(gen, tokens, half):
    return torch.rand(tokens, half, generator=gen) * (2 * math.pi)


def _rope_halves(gen, tokens, dim, dtype=torch.float32, device="cpu"):
    """(cos, sin), each (tokens, dim), random angles in the rotate-half layout
    (cat([a, a], -1)) that Qwen-style rotary embeddings use."""
    a = _angles(gen, tokens, dim // 2)
    a = torch.cat([a, a], dim=-1)
    return a.cos().to(device=device, dtype=dtype), a.sin().to(device=device, dtype=dtype)


@dataclass(frozen=True)
class _SeededNoiseCase(ZooCase):
    """A model whose forward draws noise from the ``generator`` input (a diffusion decoder):
    each run gets a fresh generator with the same seed, so two runs see the same noise."""

    def run(self, model, inputs):
        gen = inputs["generator"]
        fresh = torch.Generator(gen.device).manual_seed(gen.initial_seed())
        return super().run(model, {**inputs, "generator": fresh})


@dataclass(frozen=True)
class _HostedCase(ZooCase):
    """A model whose own forward computes nothing (AnimateDiff's MotionAdapter): ``inputs`` builds a
    host model whose matching submodules *are* the adapter's (shared, not copied), and the run is
    the host's forward. Attention modules of the adapter are the ones that run, so processors set
    on the adapter take effect; the host's own modules stay stock."""

    def run(self, model, inputs):
        kwargs = dict(inputs)
        host = kwargs.pop("host")
        return (self.outputs or default_outputs)(host(**kwargs))


@dataclass(frozen=True)
class _EncodeDecodeCase(ZooCase):
    """An autoencoder whose ``forward`` only decodes (RFD4 Proteina): the run is ``encode`` then
    ``forward`` on the sampled latent, so encoder and decoder attention both run. ``inputs`` holds the
    encode keyword arguments plus ``decode`` (the decoder's other keyword arguments); the encoder's
    generators (one per batch row) are re-seeded each run. Outputs: latent mean, log-scale, decoded
    coordinates."""

    def run(self, model, inputs):
        kwargs = dict(inputs)
        decode_kwargs = kwargs.pop("decode")
        kwargs["generator"] = [torch.Generator(g.device).manual_seed(g.initial_seed()) for g in kwargs["generator"]]
        enc = model.encode(**kwargs)
        dec = model(z_latent=enc.latent, **decode_kwargs)
        return (enc.mean, enc.log_scale, dec.coordinates)


@dataclass(frozen=True)
class _ReferenceThenGenerateCase(ZooCase):
    """Wan-Animate-2's passes, as its pipeline runs them: the reference pass writes every layer's K/V
    into a fresh cache (``kv_cache_mode="extract"``); then, when ``inputs`` has ``"generation"``, the
    generation pass attends to it (``"cached"``). ``inputs`` holds each pass's keyword arguments under
    ``"reference"`` and ``"generation"``; outputs: the reference pass's samples, then the generation
    pass's."""

    def run(self, model, inputs):
        from diffusers.models.transformers import transformer_wan_animate_2 as wa2

        cache = wa2.WanAnimate2KVCache(len(model.blocks))
        out = model(**inputs["reference"], kv_cache=cache, kv_cache_mode="extract", return_dict=False)[0]
        if "generation" in inputs:
            # extra["eager_mask"]: the model's own mask_mod, its BlockMask built without torch.compile
            # (create_block_mask(_compile=True) compiles for ~20 s on a CPU; the mask is the same)
            eager = _eager_create_block_mask(wa2) if self.extra.get("eager_mask") else contextlib.nullcontext()
            with eager:
                out = out + model(**inputs["generation"], kv_cache=cache, kv_cache_mode="cached", return_dict=False)[0]
        return tuple(out)


@contextlib.contextmanager
def _eager_create_block_mask(module):
    """``module.create_block_mask`` building its BlockMask with ``_compile=False``, for the
    duration of the context (the module's global, put back after)."""
    real = module.create_block_mask

    def create_block_mask(*args, _compile=False, **kwargs):
        return real(*args, _compile=False, **kwargs)

    module.create_block_mask = create_block_mask
    try:
        yield
    finally:
        module.create_block_mask = real


@dataclass(frozen=True)
class _SharedWithTransformerCase(ZooCase):
    """A ControlNet that borrows modules of its transformer (Z-Image's ``from_transformer``: the
    embedders, refiners and pad tokens are the transformer's own): the build makes a transformer from
    ``extra["transformer"]`` and shares them, as the pipeline does. The shared modules are then part
    of the ControlNet (submodules), so its attention modules include the borrowed refiners'."""

    def build(self, seed: int = 0, dtype: torch.dtype = torch.float32, device="cpu"):
        import diffusers

        torch.manual_seed(seed)
        transformer = getattr(diffusers, self.extra["transformer"][0])(**self.extra["transformer"][1])
        model = self.model_class().from_transformer(self.model_class()(**self.config), transformer)
        random_init_(model, seed)
        return model.to(device=device, dtype=dtype).eval()


class _Fresh:
    """A constructor argument that is itself a model (a Multi* wrapper's nets): built anew at each
    build, so that two models built from one case never share a submodule."""

    def __init__(self, class_name: str, **config):
        self.class_name = class_name
        self.config = config

    def make(self):
        import diffusers

        return getattr(diffusers, self.class_name)(**self.config)

    def __repr__(self) -> str:
        return f"{self.class_name}(...)"


@dataclass(frozen=True)
class _WrapperCase(ZooCase):
    """A case whose config holds ``_Fresh`` models (in lists): they are constructed at build time."""

    def build(self, seed: int = 0, dtype: torch.dtype = torch.float32, device="cpu"):
        torch.manual_seed(seed)

        def make(v):
            if isinstance(v, _Fresh):
                return v.make()
            if isinstance(v, (list, tuple)):
                return type(v)(make(x) for x in v)
            return v

        model = self.model_class()(**{k: make(v) for k, v in self.config.items()})
        random_init_(model, seed)
        return model.to(device=device, dtype=dtype).eval()


def _inner_config(model):
    """The config of a model, or of the first net of a Multi* wrapper (which has none of its own)."""
    nets = getattr(model, "nets", None)
    return nets[0].config if nets is not None else model.config


def _pd(model):
    """(device, dtype) of the model."""
    p = model_param(model)
    return p.device, p.dtype


def _r(gen, model, *shape):
    device, dtype = _pd(model)
    return randn(gen, *shape, dtype=dtype, device=device)


def _t(gen, model, batch, low=0.05, high=0.95):
    """Random diffusion times in [low, high], one per batch item, in the model's dtype."""
    device, dtype = _pd(model)
    return (low + (high - low) * torch.rand(batch, generator=gen)).to(device=device, dtype=dtype)


def _steps(gen, model, batch, high=1000):
    """Random integer timesteps (as floats in the model's dtype), one per batch item."""
    device, dtype = _pd(model)
    return torch.randint(1, high, (batch,), generator=gen).to(device=device, dtype=dtype)


def _keep(lengths, total, device="cpu", dtype=torch.bool, left=False):
    """(B, total) key-padding mask: item b keeps its first lengths[b] tokens (last, with left=True)."""
    ar = torch.arange(total)
    rows = []
    for n in lengths:
        rows.append(ar >= total - n if left else ar < n)
    return torch.stack(rows).to(device=device, dtype=dtype)


def _first_tuple(out):
    """return_dict=False: a 1-tuple holding the tuple of per-block control samples."""
    return tuple(out[0])
