"""Benchmark presets: the model, image size, steps and repeats of each standard setting.

``sd15-512`` is the setting of the published tables (SD1.5, 512x512, 50 DDIM steps, one
prompt, fp16). ``cpu-small`` is the default on a machine without CUDA: the same SD1.5
architecture at full width, at 128x128 (16x16 latents) and a few steps, so that every
table finishes in about three minutes on two cores. ``tiny`` is a toy UNet for tests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

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
    repeats: int = 3
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
    # seconds for the whole run (None: no limit); each table gets an even share of
    # what is left when it starts, and work past its share is skipped and marked
    budget: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def with_overrides(self, **changes) -> "Preset":
        changes = {k: v for k, v in changes.items() if v is not None}
        return replace(self, **changes)

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("unet", "vae", "scheduler"):
            if isinstance(d[key], dict):
                d[key] = "(inline config)"
        return d


PRESETS: dict[str, Preset] = {}


def _add(preset: Preset) -> None:
    PRESETS[preset.name] = preset


_add(Preset(
    name="sd15-512",
    label="SD1.5 UNet, 512x512, 50 DDIM steps, 1 prompt (the published tables' setting)",
    family="sd",
    unet="sd15_unet.json",
    vae="sd15_vae.json",
    scheduler="sd15_scheduler.json",
    resolution=512,
    compile=True,
))
_add(Preset(
    name="sd21-768",
    label="SD2.1 UNet (v-prediction, upcast attention), 768x768, 50 DDIM steps, 1 prompt",
    family="sd",
    unet="sd21_unet.json",
    vae="sd21_vae.json",
    scheduler="sd21_scheduler.json",
    resolution=768,
    sweep_max_batch=32,
    compile=True,
))
_add(Preset(
    name="sdxl-1024",
    label="SDXL base UNet, 1024x1024, 50 DDIM steps, 1 prompt",
    family="sdxl",
    unet="sdxl_unet.json",
    vae="sdxl_vae.json",
    scheduler="sdxl_scheduler.json",
    resolution=1024,
    sweep_max_batch=16,
    compile=True,
))
_add(Preset(
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
    repeats=2,
    warmup_steps=1,
    skip_steps=1,
    sweep_max_batch=2,
    sweep_steps=1,
    sweep_repeats=1,
    sweep_dtypes=("float32",),
    ladder_steps=1,
    ladder_decode=False,
    memory_steps=1,
    budget=170.0,
    notes=(
        "fp16 convolutions are not fast on CPUs: the ladder's reduced precision is bfloat16",
        "torch.compile is off by default on the CPU (compiling the UNet takes minutes); --compile turns it on",
        "the ladder times the denoising loop only: on a CPU at this size the VAE decode (the same in every row) "
        "would take most of the time",
        "a time budget of 170 s keeps the run under 3 minutes; work past it is marked 'skipped (time budget)'",
    ),
))
_add(Preset(
    name="tiny",
    label="tiny test UNet (2 blocks, 32/64 channels), 32x32, 3 steps - for testing the harness only",
    family="sd",
    unet=TINY_UNET,
    vae=TINY_VAE,
    scheduler="sd15_scheduler.json",
    resolution=32,
    steps=3,
    dtype="float32",
    half_dtype="bfloat16",
    repeats=2,
    warmup_steps=1,
    skip_steps=1,
    sweep_max_batch=4,
    sweep_steps=1,
    sweep_repeats=1,
    sweep_dtypes=("float32",),
    ladder_steps=2,
    memory_steps=1,
))

DEFAULT_CUDA_PRESET = "sd15-512"
DEFAULT_CPU_PRESET = "cpu-small"


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
