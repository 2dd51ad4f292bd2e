"""Benchmark presets: the model, image size, steps and repeats of each standard setting.

Stable Diffusion (tables 1-4): ``sd15-512`` is the setting of the published tables
(SD1.5, 512x512, 50 DDIM steps, one prompt, fp16); ``sd21-768`` and ``sdxl-1024`` the
same for SD2.1 and SDXL. ``cpu-small`` is the default on a machine without CUDA: the
same SD1.5 architecture at full width, at 128x128 (16x16 latents) and a few steps, within
a time budget. ``tiny`` is a toy UNet for tests.

Transformers (table 5, :class:`TransformerPreset`): ``flux-dev`` (route 1: diffusers'
``dispatch_attention_fn``), ``sd3-medium`` (route 2: the legacy ``Attention`` module with
``JointAttnProcessor2_0``) and ``wan-1.3b`` (a video DiT, route 1), full size from the
shipped configs for a GPU, and ``flux-cpu``, ``sd3-cpu``, ``wan-cpu``: the same classes
made narrow and shallow for the CPU. ``flux``, ``sd3`` and ``wan`` name the full one on
CUDA and the reduced one on the CPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

# The CPU preset's budget for the whole run (model build included); README states it.
CPU_BUDGET_SECONDS = 200.0

# A few-layer UNet/VAE with the SD1.5 block structure, for the harness's own tests.
TINY_UNET = {
    "_class_name": "UNet2DConditionModel",
    "act_fn": "silu",
    "attention_head_dim": 2,
    "block_out_channels": [32, 64],
    "cross_attention_dim": 32,
    "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
    "in_channels": 4,
    "layers_per_block": 1,
    "norm_num_groups": 8,
    "out_channels": 4,
    "sample_size": 8,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
}
TINY_VAE = {
    "_class_name": "AutoencoderKL",
    "act_fn": "silu",
    "block_out_channels": [16, 32],
    "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D"],
    "in_channels": 3,
    "latent_channels": 4,
    "layers_per_block": 1,
    "norm_num_groups": 8,
    "out_channels": 3,
    "sample_size": 16,
    "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D"],
}


@dataclass(frozen=True)
class Preset:
    """A Stable Diffusion setting: the UNet/VAE/scheduler and how tables 1-4 measure it."""

    name: str
    label: str
    family: str  # "sd" (SD1.x/2.x) or "sdxl": which conditioning the UNet takes
    unet: str | dict  # config file name under attnkit/configs/, or the config itself
    vae: str | dict
    scheduler: str | dict
    resolution: int
    steps: int = 50
    batch: int = 1  # prompts; classifier-free guidance doubles the UNet's batch
    dtype: str = "float16"
    half_dtype: str = "float16"  # the ladder's reduced precision
    repeats: int = 3  # rounds (samples per cell) at most; the budget may end them sooner
    warmup_steps: int = 3  # a warm-up run of this many steps per configuration
    skip_steps: int = 5  # steady-state it/s leaves out the first steps of each run
    compile: bool = False
    # table 3: batch sizes 1, 2, 4, ... up to sweep_max_batch or out of memory
    sweep_max_batch: int = 64
    sweep_steps: int = 5
    sweep_repeats: int = 2
    sweep_warmup_steps: int = 1
    sweep_dtypes: tuple[str, ...] = ("float32", "float16")
    # table 2: steps of each ladder run (the ladder times whole images: loop + VAE decode)
    ladder_steps: int | None = None
    ladder_decode: bool = True  # False: the loop only (the decode is the same in every row)
    # table 4: denoising steps run while memory is measured
    memory_steps: int = 2
    # seconds for the whole run, model build included (None: no limit); each table gets a
    # share of what is left when it starts, and work past it is skipped and marked
    budget: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    kind: str = "sd"
    tables: tuple[str, ...] = ("1", "2", "3", "4")

    def with_overrides(self, **changes) -> "Preset":
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("unet", "vae", "scheduler"):
            if isinstance(d[key], dict):
                d[key] = "(inline config)"
        return d


@dataclass(frozen=True)
class TransformerPreset:
    """A transformer setting for table 5: the model class's config, its inputs, the timing.

    ``config`` is a file under attnkit/configs/ (a public config.json); ``reduce`` replaces
    some of its entries (fewer layers and heads for the CPU). ``height``/``width`` are in
    pixels (latents are /8), ``frames`` counts video frames (latent frames: (frames - 1) / 4
    + 1), ``text_tokens`` the prompt's length, ``batch`` what the transformer sees per step
    (2 where the pipeline runs classifier-free guidance as one batch).
    """

    name: str
    label: str
    family: str  # "flux", "sd3" or "wan": which inputs the model takes
    config: str
    height: int
    width: int
    text_tokens: int
    route: str  # how the model's attention is reached: see the module docstring
    frames: int | None = None
    batch: int = 1
    reduce: dict = field(default_factory=dict)
    dtype: str = "bfloat16"
    steps: int = 6  # forward passes per run
    repeats: int = 5
    warmup_steps: int = 2
    skip_steps: int = 1
    budget: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    kind: str = "transformer"
    tables: tuple[str, ...] = ("5",)

    def with_overrides(self, **changes) -> "TransformerPreset":
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict:
        return asdict(self)


# name -> preset, filled once at import (below); never changed after
PRESETS: dict[str, Preset | TransformerPreset] = {}


def _add(preset: Preset | TransformerPreset) -> None:
    PRESETS[preset.name] = preset


def _gpu_sd(name: str, label: str, files: str, resolution: int, **kw) -> Preset:
    """A published-style GPU setting: 50 DDIM steps, one prompt, fp16, compiled rows."""
    return Preset(
        name=name,
        label=label,
        family=kw.pop("family", "sd"),
        unet=f"{files}_unet.json",
        vae=f"{files}_vae.json",
        scheduler=f"{files}_scheduler.json",
        resolution=resolution,
        compile=True,
        **kw,
    )


_add(_gpu_sd("sd15-512", "SD1.5 UNet, 512x512, 50 DDIM steps, 1 prompt (the published tables' setting)", "sd15", 512))
_add(
    _gpu_sd(
        "sd21-768",
        "SD2.1 UNet (v-prediction, upcast attention), 768x768, 50 DDIM steps, 1 prompt",
        "sd21",
        768,
        sweep_max_batch=32,
    )
)
_add(
    _gpu_sd(
        "sdxl-1024",
        "SDXL base UNet, 1024x1024, 50 DDIM steps, 1 prompt",
        "sdxl",
        1024,
        family="sdxl",
        sweep_max_batch=16,
    )
)
_add(
    Preset(
        name="cpu-small",
        label=(
            "CPU preset: SD1.5 UNet at full width, 128x128 (16x16 latents), 3 DDIM steps, "
            "1 prompt, fp32 - not the published setting, sized to finish in minutes on a CPU"
        ),
        family="sd",
        unet="sd15_unet.json",
        vae="sd15_vae.json",
        scheduler="sd15_scheduler.json",
        resolution=128,
        steps=3,
        dtype="float32",
        half_dtype="bfloat16",
        repeats=5,
        warmup_steps=1,
        skip_steps=1,
        sweep_max_batch=2,
        sweep_steps=1,
        sweep_repeats=1,
        sweep_dtypes=("float32",),
        ladder_steps=1,
        ladder_decode=False,
        memory_steps=1,
        budget=CPU_BUDGET_SECONDS,
        notes=(
            "fp16 convolutions are not fast on CPUs: the ladder's reduced precision is bfloat16",
            "torch.compile is off by default on the CPU (compiling the UNet takes minutes); --compile turns it on",
            "the ladder times the denoising loop only: on a CPU at this size the VAE decode (the same in every row) "
            "would take most of the time",
        ),
    )
)
# The CPU preset's shape on a toy UNet: the harness's own tests, in seconds.
_add(
    replace(
        PRESETS["cpu-small"],
        name="tiny",
        label="tiny test UNet (2 blocks, 32/64 channels), 32x32, 3 steps - for testing the harness only",
        unet=TINY_UNET,
        vae=TINY_VAE,
        resolution=32,
        repeats=2,
        sweep_max_batch=4,
        ladder_steps=2,
        ladder_decode=True,
        budget=None,
        notes=(),
    )
)

ROUTE_1 = "route 1: the model's processors call diffusers' dispatch_attention_fn"
ROUTE_2 = "route 2: legacy Attention modules whose JointAttnProcessor2_0 calls F.scaled_dot_product_attention"
_CPU = dict(dtype="float32", steps=4, repeats=7, warmup_steps=1, skip_steps=1, budget=120.0)
_CPU_NOTE = (
    "reduced for the CPU: the model class and head size of the real one, with fewer layers and heads "
    "and a smaller image; random weights, fp32",
)

_add(
    TransformerPreset(
        name="flux-dev",
        label="FLUX.1-dev transformer (12B), 1024x1024, 512 text tokens, bf16",
        family="flux",
        config="flux_dev_transformer.json",
        height=1024,
        width=1024,
        text_tokens=512,
        route=ROUTE_1,
    )
)
_add(
    TransformerPreset(
        name="sd3-medium",
        label="SD3-medium transformer (2B), 1024x1024, 333 text tokens, batch 2 (guidance), bf16",
        family="sd3",
        config="sd3_medium_transformer.json",
        height=1024,
        width=1024,
        text_tokens=333,
        batch=2,
        route=ROUTE_2,
    )
)
_add(
    TransformerPreset(
        name="wan-1.3b",
        label="Wan2.1-T2V-1.3B transformer, 81 frames at 480x832, 512 text tokens, batch 2 (guidance), bf16",
        family="wan",
        config="wan21_t2v_1.3b_transformer.json",
        height=480,
        width=832,
        frames=81,
        text_tokens=512,
        batch=2,
        route=ROUTE_1,
        steps=4,
        repeats=4,
    )
)
_add(
    TransformerPreset(
        name="flux-cpu",
        label="Flux-like transformer for the CPU: 1 double + 2 single blocks, 4 heads of 128, 512x512, 128 text tokens",
        family="flux",
        config="flux_dev_transformer.json",
        height=512,
        width=512,
        text_tokens=128,
        route=ROUTE_1,
        reduce={
            "num_layers": 1,
            "num_single_layers": 2,
            "num_attention_heads": 4,
            "joint_attention_dim": 512,
            "pooled_projection_dim": 256,
        },
        notes=_CPU_NOTE,
        **_CPU,
    )
)
_add(
    TransformerPreset(
        name="sd3-cpu",
        label="SD3-like transformer for the CPU: 2 joint blocks, 4 heads of 64, 512x512, 154 text tokens",
        family="sd3",
        config="sd3_medium_transformer.json",
        height=512,
        width=512,
        text_tokens=154,
        route=ROUTE_2,
        reduce={
            "num_layers": 2,
            "num_attention_heads": 4,
            "caption_projection_dim": 256,
            "joint_attention_dim": 512,
            "pooled_projection_dim": 256,
            "pos_embed_max_size": 64,
            "sample_size": 64,
        },
        notes=_CPU_NOTE,
        **_CPU,
    )
)
_add(
    TransformerPreset(
        name="wan-cpu",
        label="Wan-like video transformer for the CPU: 2 blocks, 4 heads of 128, 17 frames at 256x256, 128 text tokens",
        family="wan",
        config="wan21_t2v_1.3b_transformer.json",
        height=256,
        width=256,
        frames=17,
        text_tokens=128,
        route=ROUTE_1,
        reduce={"num_layers": 2, "num_attention_heads": 4, "ffn_dim": 1536, "text_dim": 512},
        notes=_CPU_NOTE,
        **_CPU,
    )
)
# One name per model: the full one on CUDA, the reduced one elsewhere.
BY_DEVICE = {"flux": ("flux-dev", "flux-cpu"), "sd3": ("sd3-medium", "sd3-cpu"), "wan": ("wan-1.3b", "wan-cpu")}

DEFAULT_CUDA_PRESET = "sd15-512"
DEFAULT_CPU_PRESET = "cpu-small"


def get_preset(name: str, device_type: str = "cpu") -> Preset | TransformerPreset:
    """A preset by name (``flux``/``sd3``/``wan``: the full or the reduced one by device)."""
    if name in BY_DEVICE:
        name = BY_DEVICE[name][0 if device_type == "cuda" else 1]
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join([*PRESETS, *BY_DEVICE])}") from None


def preset_from_dict(d: dict) -> Preset | TransformerPreset:
    """The preset :meth:`Preset.to_dict` or ``dataclasses.asdict`` wrote (JSON round trip)."""
    d = dict(d)
    cls = TransformerPreset if d.get("kind") == "transformer" else Preset
    for key in ("sweep_dtypes", "notes", "tables"):
        if d.get(key) is not None:
            d[key] = tuple(d[key])
    return cls(**d)
