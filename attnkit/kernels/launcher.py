"""Triton launches for attnkit's kernels, whichever kernel: the settings a launch is built
under (Settings, settings(), override()), the table of launch plans and its key
(plan_key, plan), one kernel launch of a plan (Launch) and how it runs (run):
through Triton the first time, then the compiled kernel directly, checked once against
Triton's own launch.

Nothing here knows a kernel's arguments: flash/abi.py is the flash kernels' calling
convention, flash/select.py their tile, flash/launch.py and int8/ops.py their plans.

Settings. What a launch is built from besides its call is one frozen object, read once a
call (settings()): the interpreter's switches (which target and GPU the CPU takes the
path of, its tiles, whether outputs are poisoned with NaN first) and the two environment
variables a plan reads (ATTNKIT_TRITON_AUTOTUNE, ATTNKIT_TILE_RECORDS). It is in every
plan_key: a change of one is a new plan, never one built under the old value. Tests
change it with `with override(...)`, never by assigning a module's attribute.

The direct launch. After a launch's first call (through Triton: its autotuner where
there is one, or the kernel's own binding and cache) the compiled kernel Triton returned
is kept, and later calls run it directly: no autotuner wrapper, no argument binding, no
specialisation per call (3-6 us on the host instead of 20-40). That calls Triton's
internal launcher, whose signature has changed between Triton versions, so the first
direct launch of each compiled kernel is checked against Triton's own launch of the same
call, bit for bit (the kernels are deterministic: every output element is written by
one program); on a mismatch or an error, that kernel launches through Triton for good,
with one warning naming the Triton version.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import threading
import warnings
import weakref
from typing import Callable, Iterator, Optional

import torch
import triton

# Triton's interpreter runs the kernels on CPU tensors (tests, debugging). TRITON_INTERPRET
# must be set before triton defines the kernels, so before attnkit.kernels is imported.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a launch is built from besides its call (see the module docstring).

    interpret: take the interpreter's path (small tiles, no compile options); False under
        the interpreter makes a plan as a GPU would (tests of the tuner's path: its launches
        go to ``launch_through``, never run).
    arch: the target ("sm80", "sm90") every launch takes the path of (its tile lists, its
        TMA loads); None: the device's, and "sm90" on the CPU.
    gpu: the GPU record (a folder of bench/results) the interpreter takes the device for,
        for its recorded default tiles; None: none.
    shipped_tiles: the interpreter runs each kernel with the default tile its target ships
        for the call, instead of ``interpret_tile``.
    interpret_tile: the interpreter's tile (flash/select.py's INTERPRET_TILE when None).
    candidates: (kernel, candidates, tma) -> the candidates of a tile list a launch may
        use (bench/gpu_tiles.py runs each in turn); None: all of them.
    poison_outputs: fill every buffer the kernels write with NaN before they run, so an
        element a kernel forgets to write cannot pass for a result.
    allocate: the allocator of the outputs a plan returns, (like, **empty_like's keywords)
        -> tensor (tests/kernels/_large_offsets.py lays them out beyond 2**31 elements);
        None: torch.empty_like.
    autotune: ATTNKIT_TRITON_AUTOTUNE (default on): the autotuner times a list's candidates.
    tile_records: ATTNKIT_TILE_RECORDS (default on): a GPU's recorded default tile serves.
    tile_rules: the GPU records' tile rules (None: attnkit/kernels/tile_rules.py's
        TILE_RULES; tests give made-up ones).
    launch_through: a stand-in for Triton's own launch, (fn, grid, kwargs) -> compiled
        kernel or None (tests); None: Triton's.
    direct_launch: a stand-in for the direct launch of a compiled kernel, (compiled, grid,
        stream, values) -> None (tests); None: Triton's launcher.
    """

    interpret: bool = INTERPRETED
    arch: Optional[str] = None
    gpu: Optional[str] = None
    shipped_tiles: bool = False
    interpret_tile: object = None
    candidates: Optional[Callable] = None
    poison_outputs: bool = False
    allocate: Optional[Callable] = None
    autotune: bool = True
    tile_records: bool = True
    tile_rules: Optional[tuple] = None
    launch_through: Optional[Callable] = None
    direct_launch: Optional[Callable] = None


_ENV = ("ATTNKIT_TRITON_AUTOTUNE", "ATTNKIT_TILE_RECORDS")
# the settings override() holds now (one entry per Settings field at most)
_overrides: dict = {}
_snapshot: tuple = (None, None, None)  # (overrides' version, environment values, Settings)
_version = 0


def settings() -> Settings:
    """The settings now: override()'s, and the two environment variables read here, once
    a call (a new Settings only when one of them changed)."""
    global _snapshot
    env = os.environ
    values = (env.get(_ENV[0], "1"), env.get(_ENV[1], "1"))
    version, seen, current = _snapshot
    if version == _version and seen == values:
        return current
    on = tuple(x not in ("0", "") for x in values)
    current = Settings(**{"autotune": on[0], "tile_records": on[1], **_overrides})
    _snapshot = (_version, values, current)
    return current


@contextlib.contextmanager
def override(**changes) -> Iterator[Settings]:
    """Settings changed inside a with block (tests): ``with override(arch="sm80"):``. A
    field named here wins over its environment variable. Plans are keyed by the
    settings, so none built outside is served inside, or the other way."""
    global _overrides, _version
    unknown = set(changes) - {f.name for f in dataclasses.fields(Settings)}
    if unknown:
        raise TypeError(f"override(): no such setting {sorted(unknown)}; the settings: {Settings.__doc__}")
    before = _overrides
    _overrides = {**before, **changes}
    _version += 1
    try:
        yield settings()
    finally:
        _overrides = before
        _version += 1


# -- launch plans --------------------------------------------------------------------------

# Launch plans and call plans (flash/ops.py), one per call signature (plan_key: every
# tensor's shape, strides, dtype, device and 16-byte alignment, the call's other
# arguments, and settings()): everything of a call but its tensors, built on its first
# call. Stale only if something a plan is built from is left out of plan_key. A model
# calls a few signatures over and over; a stream of new ones (lengths that change every
# call) starts the table afresh past PLAN_LIMIT, the bound of every table keyed by
# plan_key.
_PLANS: dict[tuple, object] = {}
PLAN_LIMIT = 4096


def _tensor_key(t: Optional[torch.Tensor]):
    if t is None:
        return None
    return t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15


def plan_key(kind: str, tensors: tuple, *arguments) -> tuple:
    """The one way attnkit's kernels key what they keep per call (launch plans, call
    plans): ``kind``, each tensor's shape, strides, dtype, device and 16-byte alignment
    (None for an absent one), the call's other ``arguments`` (hashable) and settings().
    A new input a launch depends on is a tensor or an argument here, or a setting;
    nothing else is read."""
    return (kind, tuple(map(_tensor_key, tensors)), arguments, settings())


def plan(key: tuple, build: Callable[[], object]):
    """The plan kept under key, built (build()) on the key's first call."""
    found = _PLANS.get(key)
    if found is None:
        if len(_PLANS) >= PLAN_LIMIT:
            _PLANS.clear()
        found = _PLANS[key] = build()
    return found


def cached_plan(key: tuple):
    """The plan kept under key, or None (nothing is built)."""
    return _PLANS.get(key)


def plan_count() -> int:
    return len(_PLANS)


def clear_plans() -> None:
    """Forget every launch plan (a plan holds no tensor: this frees little)."""
    _PLANS.clear()


# -- buffers -------------------------------------------------------------------------------


def new_like(t: torch.Tensor, s: Optional[Settings] = None, **kw) -> torch.Tensor:
    """torch.empty_like (or Settings.allocate), NaN-filled under Settings.poison_outputs;
    s: the settings of the plan that allocates (None: settings(), read again)."""
    s = s or settings()
    out = torch.empty_like(t, **kw) if s.allocate is None else s.allocate(t, **kw)
    return out.fill_(float("nan")) if s.poison_outputs else out


def proto(shape, device, dtype=torch.float32) -> torch.Tensor:
    """A 4-byte stand-in of a contiguous buffer a plan allocates on every call (new_from):
    empty_like of it costs about two thirds of torch.empty with a shape, a dtype and a
    device."""
    return torch.empty(1, dtype=dtype, device=device).expand(shape)


def new_from(stand_in: torch.Tensor, s: Optional[Settings] = None) -> torch.Tensor:
    """A contiguous buffer shaped like a proto(), NaN-filled under poison_outputs (if
    floating); s as in new_like."""
    out = torch.empty_like(stand_in, memory_format=torch.contiguous_format)
    return out.fill_(float("nan")) if (s or settings()).poison_outputs and out.is_floating_point() else out


# -- the tuner -----------------------------------------------------------------------------


def make_tuner(jit, configs: list, key: list, **autotune_options):
    """A triton.autotune wrapper of kernel jit over configs (triton.Config), keyed by the
    arguments named in key that the kernel has (Triton refuses any other). Its choice per
    length bucket is kept in attnkit_chosen (Launch.bucket), under attnkit_lock."""
    tuner = triton.autotune(configs=configs, key=[k for k in key if k in jit.arg_names], **autotune_options)(jit)
    tuner.attnkit_chosen = {}
    tuner.attnkit_lock = threading.Lock()
    return tuner


# -- one launch ----------------------------------------------------------------------------


class Launch:
    """One kernel launch of a launch plan, settled once per call signature: the kernel
    (an autotuner or the plain kernel), its tile once known, its grid, and every argument
    that is not one of the call's tensors (strides, lengths, scales, constexprs). After its
    first launch it holds the compiled kernel that Triton chose and built, and launches it
    directly (run).

    kernel: its name; jit: the @triton.jit function; fn: what the first launch goes
    through (an autotuner, or jit); meta: the tile's constexprs (None until an autotuner
    chose); static: every other non-tensor argument; grid_rows and axis: the grid's first
    dimension is cdiv(grid_rows, the tile's axis); b, h: its other two; options: compile
    options (num_warps, num_stages, ...); bucket: what an autotuner's choice is kept under;
    boxes: the descriptor arguments and the tile constexpr that sizes their boxes;
    set_boxes: the pre-launch hook that sizes them; variant: the bias variant the plan
    built it for ("none", "keypad", "full", "full16"), and tile_name the name of its tile
    ("M128-N64-w8-s3", as TileConfig names it), for describe()."""

    __slots__ = (
        "kernel",
        "settings",
        "jit",
        "fn",
        "meta",
        "options",
        "static",
        "grid_rows",
        "axis",
        "b",
        "h",
        "grid",
        "compiled",
        "template",
        "slots",
        "boxes",
        "set_boxes",
        "device",
        "cuda",
        "bucket",
        "through_triton",
        "variant",
        "tile_name",
    )

    def __init__(
        self,
        kernel: str,
        jit,
        fn,
        static: dict,
        grid_rows: int,
        axis: str,
        b: int,
        h: int,
        *,
        meta: Optional[dict],
        options: dict,
        cuda: bool = False,
        bucket: Optional[tuple] = None,
        boxes: tuple = (),
        set_boxes: Optional[Callable] = None,
        variant: Optional[str] = None,
        tile_name: Optional[str] = None,
    ):
        self.kernel, self.jit, self.fn, self.static, self.cuda, self.bucket = kernel, jit, fn, static, cuda, bucket
        self.grid_rows, self.axis, self.b, self.h = grid_rows, axis, b, h
        self.compiled = self.template = self.slots = self.device = None
        self.boxes, self.set_boxes, self.through_triton, self.variant = boxes, set_boxes, False, variant
        self.tile_name = tile_name
        self.settings = settings()  # those of its plan (plan_key holds them): read once, here
        self.options = dict(options)
        if meta is None:  # an autotuner: the tile is known after its first launch
            self.meta = self.grid = None
        else:
            self._settle(dict(meta), self.options)

    def _settle(self, meta: dict, options: dict) -> None:
        # meta last: another thread reads a launch as settled once meta is set
        rows = meta[self.axis] if self.axis in meta else self.static[self.axis]
        self.grid = (triton.cdiv(self.grid_rows, rows), self.h, self.b)
        self.options = options
        self.meta = meta

    def settle_config(self, config) -> None:
        """Settle on a triton.Config (an autotuner's choice, or its default)."""
        kw = config.kwargs
        if "BLOCK_M" in kw and "BLOCK_N" in kw:
            self.tile_name = (
                f"M{kw['BLOCK_M']}-N{kw['BLOCK_N']}-w{config.num_warps}-s{config.num_stages}"
                + ("-r" if kw.get("RELOAD") else "")
                + (f"-reg{config.maxnreg}" if config.maxnreg else "")
            )
        self._settle(
            config.kwargs,
            dict(
                self.options,
                num_warps=config.num_warps,
                num_stages=config.num_stages,
                **({} if config.maxnreg is None else {"maxnreg": config.maxnreg}),
            ),
        )

    def rows(self, name: str) -> int:
        """The box rows of a descriptor argument, once the tile is known (else 16: the
        autotuner's pre-launch hook sets them for each candidate)."""
        for names, rows_key in self.boxes:
            if name in names and self.meta is not None:
                return self.meta[rows_key]
        return 16

    def arguments(self, tensors: dict) -> dict:
        """Every named argument of a launch with these tensors (the tile's constexprs
        included once known). An argument the plan passes as None stays None whatever
        tensors say."""
        return {**tensors, **self.static, **(self.meta or {})}

    def describe(self) -> dict:
        """What this launch is: its kernel, its bias variant, its tile (BLOCK_M, BLOCK_N,
        num_warps, num_stages, RELOAD; None until an autotuner chose) and the tile's name
        (tile_name, with its register cap), its grid, whether an
        autotuner serves it, whether it launches directly, and the constexprs that pick
        its code (bias kind, causality, TMA loads, head-dim piece, gradients), for logs and
        tests."""
        meta, opts = self.meta, self.options
        tile = None
        if meta is not None and "BLOCK_M" in meta:
            tile = (meta["BLOCK_M"], meta["BLOCK_N"], opts.get("num_warps"), opts.get("num_stages"), meta.get("RELOAD"))
        elif "BLOCK_M" in self.static and "BLOCK_N" in self.static:
            tile = (self.static["BLOCK_M"], self.static["BLOCK_N"], opts.get("num_warps"), opts.get("num_stages"), None)
        out = dict(
            kernel=self.kernel,
            variant=self.variant,
            tile=tile,
            tile_name=self.tile_name,
            grid=self.grid,
            tuned=self.fn is not self.jit,
        )
        for name in ("BIAS", "CAUSAL", "OFF", "TMA", "PIECE", "GRADS", "BIAS_GRAD", "ALIGN", "PRECISION", "HEAD_DIM"):
            if name in self.static:
                out[name.lower()] = self.static[name]
        out["direct"] = self.compiled is not None
        return out

    def keep(self, compiled, device: Optional[int], tensors: dict) -> None:
        """Keep Triton's compiled kernel for direct launches where its launcher takes the
        kernel's arguments in their declared order (Triton 3.3 onwards: the compiled
        kernel's source names them); otherwise every launch goes through Triton. The
        call's tensors (by name) fill the slots left in the template."""
        if self.through_triton:
            return
        names = getattr(getattr(getattr(compiled, "src", None), "fn", None), "arg_names", None)
        if (
            not hasattr(triton, "knobs")
            or names is None
            or list(names) != list(self.jit.arg_names)
            or not hasattr(compiled, "run")
        ):
            return
        params = inspect.signature(self.jit.fn).parameters
        merged = {**self.static, **self.meta}
        template, slots = [], []
        for pos, name in enumerate(names):
            if name in merged:
                template.append(merged[name])
            elif name in tensors:
                template.append(None)
                slots.append((pos, name))
            elif params[name].default is not params[name].empty:
                template.append(params[name].default)
            else:
                return  # an argument this launch does not know: leave it to Triton
        self.template, self.slots, self.device = template, tuple(slots), device
        self.compiled = compiled


def _launch_compiled(compiled, grid: tuple, stream: int, values: list) -> None:
    """A compiled kernel's own launch: what Triton's launch does once it has found the
    kernel for its arguments (CompiledKernel.__getitem__'s runner)."""
    compiled.run(
        grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, None, None, None, *values
    )


def _launch_triton(fn, grid, kwargs: dict):
    """A launch through Triton (its autotuner, or the kernel's own binding and cache):
    returns the compiled kernel that ran (None under the interpreter)."""
    return fn[grid](**kwargs)


def _no_launch_hooks() -> bool:
    """Whether no launch hook is set in Triton's knobs (a profiler sets them; Triton 3.9
    keeps empty hook chains where older versions keep None)."""
    runtime = triton.knobs.runtime
    return all(
        h is None or getattr(h, "calls", None) == [] for h in (runtime.launch_enter_hook, runtime.launch_exit_hook)
    )


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


# Whether the direct launch of a compiled kernel reproduced Triton's own (checked once per
# compiled kernel; weak: a kernel Triton drops is forgotten). Never stale: a compiled
# kernel is what it is. A kernel object that takes no weak reference (a stand-in) is kept
# by id with the object itself, PLAN_LIMIT at most.
_CHECKED: "weakref.WeakKeyDictionary[object, bool]" = weakref.WeakKeyDictionary()
_CHECKED_BY_ID: dict = {}
# the launchers whose direct launch was found wrong, said once each (Triton's version and the
# test stand-ins in effect): bounded by them
_WARNED: set = set()


def direct_checked(compiled) -> Optional[bool]:
    """Whether the direct launch of a compiled kernel was checked and agreed (True), was
    checked and refused (False), or is not checked yet (None)."""
    try:
        return _CHECKED.get(compiled)
    except TypeError:
        kept = _CHECKED_BY_ID.get(id(compiled))
        return None if kept is None or kept[0] is not compiled else kept[1]


def _set_checked(compiled, ok: bool) -> None:
    try:
        _CHECKED[compiled] = ok
    except TypeError:
        if len(_CHECKED_BY_ID) >= PLAN_LIMIT:
            _CHECKED_BY_ID.clear()
        _CHECKED_BY_ID[id(compiled)] = (compiled, ok)


@dataclasses.dataclass(frozen=True)
class Launched:
    """One launch run() made while recording(): its kernel's description
    (Launch.describe, before the launch: the tile is None where an autotuner had yet to
    choose) and every named argument it was passed."""

    kernel: str
    description: dict
    arguments: dict


_RECORDERS: list = []


@contextlib.contextmanager
def recording() -> Iterator[list]:
    """Every launch run() makes inside the with block, in order, as Launched (tests and
    debugging: which kernels ran, with which tile, variant and arguments)."""
    seen: list = []
    _RECORDERS.append(seen)
    try:
        yield seen
    finally:
        _RECORDERS.remove(seen)


def run(launch: Launch, tensors: dict) -> None:
    """Launch one kernel of a plan with the call's tensors (by argument name).

    A settled launch runs its compiled kernel directly (its first direct launch checked
    against Triton's, see the module docstring). The first launch goes through Triton
    (the autotuner where there is one: it benchmarks its candidates once per length
    bucket, whose later signatures run its choice, and never during a CUDA-graph capture,
    where the list's first tile runs instead), which compiles and returns the kernel kept
    for the next. A launch hook set in Triton's knobs (a profiler) sends every launch
    through Triton, which calls it."""
    s = launch.settings
    if _RECORDERS:
        record = Launched(launch.kernel, launch.describe(), launch.arguments(tensors))
        for seen in _RECORDERS:
            seen.append(record)
    current = triton.runtime.driver.active.get_current_device() if launch.cuda else None
    # A compiled kernel is loaded on the device that was current when it was compiled:
    # under another one, the launch goes through Triton, as it would have.
    if launch.compiled is not None and current == launch.device and _no_launch_hooks():
        # (Descriptors come with the tile's box rows: the plan sets them.)
        values = launch.template.copy()
        for pos, name in launch.slots:
            values[pos] = tensors[name]
        stream = 0 if current is None else triton.runtime.driver.active.get_current_stream(current)
        direct = s.direct_launch or _launch_compiled
        checked = direct_checked(launch.compiled)
        if checked:
            direct(launch.compiled, launch.grid, stream, values)
            return
        if checked is None and not _capturing() and _check_direct(launch, tensors, values, stream, direct, s):
            return  # checked, and the call's outputs are Triton's own launch's
        if checked is False:
            _through_triton(launch)
    through = s.launch_through or _launch_triton
    kwargs = {**tensors, **launch.static}  # an argument passed as None stays None
    if launch.meta is None:
        fn = launch.fn
        chosen = None if launch.bucket is None else fn.attnkit_chosen.get(launch.bucket)
        if chosen is None and _capturing():
            chosen = fn.configs[0]  # no benchmarking inside a capture: the default tile
        if chosen is None:

            def grid(meta):
                return (triton.cdiv(launch.grid_rows, meta[launch.axis]), launch.h, launch.b)

            with fn.attnkit_lock:  # best_config is the tuner's one field for every caller
                # Another thread may have tuned this bucket meanwhile: its choice holds.
                chosen = None if launch.bucket is None else fn.attnkit_chosen.get(launch.bucket)
                if chosen is None:
                    compiled = through(fn, grid, {**kwargs, **launch.options})
                    best = fn.best_config
                    if launch.bucket is not None:
                        fn.attnkit_chosen[launch.bucket] = best
            if chosen is None:
                launch.settle_config(best)
                launch.keep(compiled, current, tensors)
                return
        launch.settle_config(chosen)  # a bucket's choice (or the default tile in a capture)
    if launch.set_boxes is not None:
        launch.set_boxes({**kwargs, **launch.meta})
    compiled = through(launch.jit, launch.grid, {**kwargs, **launch.meta, **launch.options})
    if launch.compiled is None:
        launch.keep(compiled, current, tensors)


def _through_triton(launch: Launch) -> None:
    launch.compiled = launch.template = launch.slots = None
    launch.through_triton = True


def _tensors_of(tensors: dict) -> list:
    """Every tensor a launch may read or write: the call's tensors and the bases of its
    tensor descriptors, each once."""
    seen = {}
    for value in tensors.values():
        for t in (value, getattr(value, "base", None)):
            if isinstance(t, torch.Tensor):
                seen.setdefault(id(t), t)
    return list(seen.values())


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _check_direct(launch: Launch, tensors: dict, values: list, stream: int, direct, s: Settings) -> bool:
    """The first direct launch of a compiled kernel, checked: every tensor of the call is
    kept, the direct launch runs, its results are kept and the tensors restored, Triton's
    own launch runs (its results stay), and the two must agree bit for bit. True: they
    did, or the check could not be made (no memory for the copies: the call ran through
    Triton, the next is checked). False: they did not, or the direct launch failed; the
    kernel launches through Triton for good, with one warning."""
    compiled = launch.compiled
    arrays = _tensors_of(tensors)
    try:
        before = [t.clone() for t in arrays]
    except torch.OutOfMemoryError:
        before = None
    failure = None
    direct_out = None
    if before is not None:
        try:
            direct(compiled, launch.grid, stream, values)
            direct_out = [t.clone() for t in arrays]
        except torch.OutOfMemoryError:
            for t, b in zip(arrays, before):
                t.copy_(b)
            before = None
        except Exception as e:  # noqa: BLE001 - any failure of the direct launch is a refusal of it
            failure = f"{type(e).__name__}: {e}"
        if before is not None:
            for t, b in zip(arrays, before):
                t.copy_(b)
    through = s.launch_through or _launch_triton
    through(launch.jit, launch.grid, {**tensors, **launch.static, **launch.meta, **launch.options})
    if before is None:
        return True  # unchecked this time; Triton's launch ran
    if failure is None and not all(_same_bits(a, b) for a, b in zip(direct_out, arrays)):
        failure = "its outputs differ from Triton's launch of the same call"
    _set_checked(compiled, failure is None)
    if failure is not None:
        _through_triton(launch)
        said = (triton.__version__, s.launch_through, s.direct_launch)  # one warning per launcher
        if said not in _WARNED:
            _WARNED.add(said)
            message = (
                f"attnkit: the direct launch of the {launch.kernel} kernel does not reproduce Triton "
                f"{triton.__version__}'s own launch ({failure}); it launches through Triton from now on, "
                "as does any other kernel found so, without a further warning (a few microseconds more a "
                "call; results are Triton's)"
            )
            warnings.warn(message, RuntimeWarning, stacklevel=3)
    return True
