"""What every Stable Diffusion table needs, and the one way a UNet configuration is run.

:func:`unet_config` is the configuration every table measures: a processor on a UNet
(set before each run, since configurations share the UNet), or a compiled copy of the
UNet with the processor on it, made lazily so that the warm-up pays for compiling.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .availability import set_processor
from .env import free_memory
from .measure import MARGIN, Config, Deadline, OverBudget
from .models import Conditioning, SDModel, denoise

# A compiled UNet's warm-up runs at least this many steps: the first compiled call can
# leave guards that fail on the second (state the traced code fills in on first use, such
# as a backend's per-device cache), and that recompilation belongs in the warm-up.
COMPILED_WARMUP_STEPS = 3


@dataclass
class Context:
    """What every table needs: the model, the preset, the processors, the options."""

    model: SDModel
    preset: Any
    processors: list[str]
    device: torch.device
    device_name: str
    compile: bool = False  # tables 2 and 3: compiled rows / runs
    compile_table1: bool = False  # table 1 compiled (the published table is eager)
    progress: bool = True
    seed: int = 0
    budget: float | None = None  # seconds for the table being run
    compile_mode: str | None = None
    model_path: str | None = None  # --model: real weights from a local directory
    mem_cap_bytes: int | None = None  # the CPU sweep's address-space cap beyond its start
    # What this run has measured so far, to predict what fits in a table's budget: the
    # model's build time, and seconds per denoising step (table 1's median).
    build_seconds: float | None = None
    step_seconds: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return (self.preset.resolution // self.model.vae_scale_factor) ** 2

    def deadline(self) -> Deadline:
        return Deadline(self.budget)

    def check_fits(self, what: str, seconds: float | None) -> None:
        """Raise :class:`OverBudget` when `seconds` (a prediction, taken MARGIN times) exceeds
        this table's budget."""
        if seconds is not None and self.budget is not None and MARGIN * seconds > self.budget:
            raise OverBudget(f"time budget: {what} was predicted to take {seconds:.0f} s, "
                             f"{max(self.budget, 0):.0f} s were left for this table")


class Lazy:
    """A value made on first use: a UNet copy that only the rows admitted to run need."""

    def __init__(self, make: Callable[[], Any]):
        self.make, self.value, self.made = make, None, False

    def __call__(self) -> Any:
        if not self.made:
            self.value, self.made = self.make(), True
        return self.value


def compile_unet(unet: torch.nn.Module, mode: str | None) -> Any:
    """torch.compile as a user would call it (dynamic=None: static first, dynamic batch on a
    new batch size). Every configuration compiles its own copy of the UNet, so the cache
    limit is raised: a configuration over the limit would silently run eager."""
    import torch._dynamo

    cfg = torch._dynamo.config
    for limit in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, limit):
            setattr(cfg, limit, max(getattr(cfg, limit), 256))
    return torch.compile(unet, mode=mode, fullgraph=False)


def unet_config(
    ctx: Context,
    label: str,
    unet: torch.nn.Module | Lazy,
    proc: Any,
    cond: Conditioning,
    steps: int,
    warmup_steps: int,
    *,
    compiled: bool = False,
    holder: dict | None = None,
    decode: bool = False,
    vae: torch.nn.Module | Lazy | None = None,
    extra: dict | None = None,
) -> Config:
    """A configuration that runs the denoising loop with `proc` on `unet` (or on a compiled
    copy of it). ``holder`` keeps the compiled copy; pass the same dict to reuse it (the
    batch sweep does, from one batch size to the next). `unet` and `vae` may be
    :class:`Lazy`: made when the configuration first runs."""
    holder = {} if holder is None else holder

    def made(x):
        return x() if isinstance(x, Lazy) else x

    def setup() -> None:
        if not compiled:
            set_processor(made(unet), proc)
        elif "unet" not in holder:  # compile lazily: the warm-up pays for it
            copy_ = copy.deepcopy(made(unet))
            set_processor(copy_, proc)
            holder["unet"] = compile_unet(copy_, ctx.compile_mode)

    def run(warmup: bool):
        n = (max(warmup_steps, COMPILED_WARMUP_STEPS) if compiled else warmup_steps) if warmup else steps
        return denoise(ctx.model, cond, n, ctx.preset.resolution, unet=holder["unet"] if "unet" in holder else made(unet),
                       decode=decode and not warmup, vae=made(vae), seed=ctx.seed)

    return Config(label, run, setup=setup, extra=dict(extra or {}), keep=holder)


def forget_compiled(ctx: Context) -> None:
    """Drop compiled graphs (and the UNet copies they hold) once a table is done."""
    if ctx.compile or ctx.compile_table1:
        try:
            import torch._dynamo

            torch._dynamo.reset()
        except Exception:  # noqa: BLE001
            pass
    free_memory(ctx.device)
