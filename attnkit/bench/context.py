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
from .measure import MARGIN, Config, Deadline, OverBudget, describe, is_oom
from .models import Conditioning, SDModel, denoise, unet_step_inputs
from .share import COMPILED_TOLERANCE, attention_modules, max_difference, safe_profile_step

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
    compile_backend: str = "inductor"  # torch.compile's backend (tests: "eager", to trace without inductor)
    ladder_rows: tuple[str, ...] = ("base", "eager", "compile", "cudagraphs")  # table 2's kinds of row, in order
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
            raise OverBudget(
                f"time budget: {what} was predicted to take {seconds:.0f} s, "
                f"{max(self.budget, 0):.0f} s were left for this table"
            )


class Lazy:
    """A value made on first use: a UNet copy that only the rows admitted to run need."""

    def __init__(self, make: Callable[[], Any]):
        self.make, self.value, self.made = make, None, False

    def __call__(self) -> Any:
        if not self.made:
            self.value, self.made = self.make(), True
        return self.value


def raise_cache_limits() -> None:
    """Every configuration compiles its own copy of the model, so the cache limit is raised:
    a configuration over the limit would silently run eager."""
    import torch._dynamo

    cfg = torch._dynamo.config
    for limit in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, limit):
            setattr(cfg, limit, max(getattr(cfg, limit), 256))


class Compiled:
    """``torch.compile(module, mode=mode)`` as a user would call it (dynamic=None: static
    first), fullgraph=True first: where that fails at the first call (a graph break, or an
    error while tracing), the module is compiled again without fullgraph and the call
    retried. :meth:`info` says which was used and why. The first call, compilation included,
    is timed apart (``first_call_seconds``): it is a warm-up, never a sample."""

    def __init__(self, module: torch.nn.Module, mode: str | None = None, backend: str = "inductor"):
        raise_cache_limits()
        self.module, self.mode, self.backend = module, mode, backend
        self.fullgraph, self.fullgraph_error, self.called = True, None, False
        self.fn = torch.compile(module, mode=mode, fullgraph=True, backend=backend)

    def __call__(self, *args, **kwargs):
        if self.called:
            return self.fn(*args, **kwargs)
        try:
            out = self.fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - retried without fullgraph, the first error kept
            if is_oom(exc):
                raise
            self.fullgraph, self.fullgraph_error = False, describe(exc, 200)
            self.fn = torch.compile(self.module, mode=self.mode, fullgraph=False, backend=self.backend)
            out = self.fn(*args, **kwargs)
        self.called = True
        return out

    def info(self) -> dict:
        tried = self.called or self.fullgraph_error is not None
        return {
            "mode": self.mode or "default",
            "backend": self.backend,
            "fullgraph": self.fullgraph if tried else None,
            "fullgraph_error": self.fullgraph_error,
        }


def compile_unet(unet: torch.nn.Module, mode: str | None, backend: str = "inductor") -> Compiled:
    """The table's compiled copy of a UNet (:class:`Compiled`)."""
    return Compiled(unet, mode, backend)


# The ladder's kinds of row for each processor: eager, torch.compile (default mode),
# CUDA graphs (torch.compile mode="reduce-overhead", which captures CUDA graphs).
CUDA_GRAPHS_MODE = "reduce-overhead"


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
    mode: str | None = None,
    holder: dict | None = None,
    decode: bool = False,
    vae: torch.nn.Module | Lazy | None = None,
    extra: dict | None = None,
) -> Config:
    """A configuration that runs the denoising loop with `proc` on `unet` (or on a compiled
    copy of it, in torch.compile's `mode`: the context's --compile-mode by default).
    ``holder`` keeps the compiled copy; pass the same dict to reuse it (the batch sweep
    does, from one batch size to the next). `unet` and `vae` may be :class:`Lazy`: made when
    the configuration first runs. ``keep["probe"]`` profiles one step after the timing
    (:mod:`.share`) and, for a compiled copy, checks its output against the same UNet eager."""
    holder = {} if holder is None else holder
    mode = mode if mode is not None else ctx.compile_mode

    def made(x):
        return x() if isinstance(x, Lazy) else x

    def setup() -> None:
        if not compiled:
            set_processor(made(unet), proc)
        elif "unet" not in holder:  # compile lazily: the warm-up pays for it
            copy_ = copy.deepcopy(made(unet))
            set_processor(copy_, proc)
            holder["eager"] = copy_
            holder["unet"] = compile_unet(copy_, mode, ctx.compile_backend)

    def run(warmup: bool):
        n = (max(warmup_steps, COMPILED_WARMUP_STEPS) if compiled else warmup_steps) if warmup else steps
        return denoise(
            ctx.model,
            cond,
            n,
            ctx.preset.resolution,
            unet=holder["unet"] if "unet" in holder else made(unet),
            decode=decode and not warmup,
            vae=made(vae),
            seed=ctx.seed,
        )

    def probe(profile: bool) -> dict:
        """One step profiled (attention's share); a compiled copy's output against eager.
        Without `profile`, only how the copy compiled."""
        out: dict = {}
        if compiled:
            if "unet" not in holder:
                return out
            out["compile"] = holder["unet"].info()
            if not holder["unet"].called:
                return out
        if not profile:
            return out
        else:
            set_processor(made(unet), proc)
        target = holder["unet"] if compiled else made(unet)
        eager = holder["eager"] if compiled else made(unet)
        out["attention"] = safe_profile_step(
            lambda: denoise(ctx.model, cond, 1, ctx.preset.resolution, unet=target, seed=ctx.seed),
            attention_modules(eager),
            ctx.device,
            ranges=not compiled,
        )
        if compiled:
            out["check"] = compare_compiled(target, eager, ctx, cond)
        return out

    keep = {"holder": holder, "probe": probe}
    return Config(label, run, setup=setup, extra=dict(extra or {}), keep=keep)


@torch.no_grad()
def compare_compiled(compiled: Any, eager: torch.nn.Module, ctx: Context, cond: Conditioning) -> dict:
    """One UNet call through the compiled copy and through the same module eager, on the
    same inputs: their largest difference, and whether it is within COMPILED_TOLERANCE."""
    try:
        args, kwargs = unet_step_inputs(ctx.model, cond, ctx.preset.resolution, seed=ctx.seed)
        got = compiled(*args, **kwargs)[0].clone()  # CUDA graphs reuse their output buffer
        ref = eager(*args, **kwargs)[0]
        check = max_difference(got, ref)
        tol = COMPILED_TOLERANCE.get(ref.dtype, 1e-1)
        check.update(tolerance=tol, matches=check["finite"] and check["relative"] <= tol)
        return check
    except Exception as exc:  # noqa: BLE001 - reported in the row
        return {"error": describe(exc, 160)}


def forget_compiled(ctx: Context) -> None:
    """Drop compiled graphs (and the UNet copies they hold) once a table is done."""
    if ctx.compile or ctx.compile_table1:
        try:
            import torch._dynamo

            torch._dynamo.reset()
        except Exception:  # noqa: BLE001
            pass
    free_memory(ctx.device)
