"""Reads the GPU records and writes attnkit/choose/gpu_rules.py (the package docstring says
what is read and how a rule is made)."""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
OUTPUT = ROOT / "attnkit" / "choose" / "gpu_rules.py"
COMMAND = "python -m tools.records"

# A rule needs the kernel at least 5% ahead in every current measurement of its class:
# repeated runs of one case on one GPU differ by a few percent (the H100's key-padding
# forward: 0.798-0.803 ms over four processes, host-ab-2bb37ee/host_ab.jsonl).
THRESHOLD = 1.05

# gpu_tiles.py's bias kinds -> AttentionCall.mask
MASKS = {"none": "none", "key_padding": "key_padding", "full": "bias"}
DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}

# Measurements that no longer describe the code: (path under bench/results, case) -> why.
WITHDRAWN = {
    (
        "nvidia-h200/tiles-43e61c8/timing.json",
        "d128 full bias",
    ): "run at 43e61c8, before 2ac832a made every bias reach the kernels as float32 (a 16-bit one is "
    "converted on each call); the H100 timed that path at 0.34 of SDPA (nvidia-h100-80gb-hbm3/timing/)"
}


class RecordError(ValueError):
    """A record the generator cannot read: the message names the file and what is missing."""


@dataclass(frozen=True)
class GPU:
    folder: str  # bench/results/<folder>
    name: str  # torch.cuda.get_device_name()
    capability: tuple[int, int]


@dataclass(frozen=True)
class Measurement:
    gpu: str
    path: str  # relative to bench/results/<gpu>/
    row: int  # index in the JSON list
    case: str
    date: str  # of the run, from summary.md: "2026-11-26 10:35"
    autotune: bool
    mask: str
    dtype: str
    head_dim: int
    causal: bool
    grad: bool
    q_len: int
    kv_len: int
    ratio: float  # SDPA's time / the kernel's

    @property
    def cls(self) -> tuple:
        return (self.gpu, self.mask, self.dtype, self.head_dim, self.causal, self.grad)

    @property
    def ref(self) -> str:
        return f"{self.path}#{self.row}"


@dataclass(frozen=True)
class Rule:
    gpu: str
    mask: str
    dtype: str
    head_dim: int
    causal: bool
    grad: bool
    min_q: int
    min_kv: int
    prefer: str
    over: tuple[str, ...]
    ratio: float
    record: str  # the row with the smallest ratio: "<path>#<row>", path under bench/results/<gpu>/
    rows: tuple[tuple[str, float], ...]  # every current measurement of the class


def device_folder(name: str) -> str:
    """A device name as bench/results names its folder: lower case, dashes."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def read_gpus(results: Path = RESULTS) -> dict[str, GPU]:
    """Every GPU folder of ``results`` (a folder with a results.json naming a CUDA device)."""
    gpus = {}
    for path in sorted(results.glob("*/results.json")):
        try:
            env = json.loads(path.read_text())["environment"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise RecordError(f"{path}: no readable environment ({type(e).__name__}: {e})") from None
        if env.get("device") != "cuda":
            continue
        name, cap = env.get("device_name"), env.get("capability")
        if not isinstance(name, str) or not (isinstance(cap, list) and len(cap) == 2):
            raise RecordError(f"{path}: environment lacks device_name or capability ([major, minor])")
        folder = path.parent.name
        if device_folder(name) != folder:
            raise RecordError(f"{path}: device {name!r} would be recorded in {device_folder(name)}/, not {folder}/")
        gpus[folder] = GPU(folder, name, (int(cap[0]), int(cap[1])))
    return gpus


def _summary(timing: Path) -> tuple[str, str]:
    """(dtype, date) of a timing.json, from the summary.md beside it."""
    summary = timing.parent / "summary.md"
    if not summary.is_file():
        raise RecordError(f"{timing}: no summary.md beside it to give the timings' dtype and date")
    text = summary.read_text()
    dtype = re.search(r"^## Speed beside torch's SDPA \((\w+)\)", text, re.M)
    date = re.search(r"(\d{4}-\d\d-\d\d \d\d:\d\d) UTC", text)
    if not dtype or dtype.group(1) not in DTYPES:
        raise RecordError(f'{summary}: no heading "## Speed beside torch\'s SDPA (<{"|".join(DTYPES)}>)"')
    if not date:
        raise RecordError(f"{summary}: no run date (YYYY-MM-DD HH:MM UTC)")
    return DTYPES[dtype.group(1)], date.group(1)


def read_measurements(gpus: dict[str, GPU], results: Path = RESULTS) -> list[Measurement]:
    """Every timed case of every GPU folder's timing.json files (skipped or failed cases,
    which hold no time, are not measurements)."""
    out = []
    for folder in gpus:
        for timing in sorted((results / folder).rglob("timing.json")):
            rows = json.loads(timing.read_text())
            if not isinstance(rows, list):
                raise RecordError(f"{timing}: not a list of cases")
            dtype, date = _summary(timing)
            rel = timing.relative_to(results / folder).as_posix()
            for i, row in enumerate(rows):
                if "speedup_vs_sdpa" not in row:
                    continue
                try:
                    _, _, m, n, d = row["shape"]
                    mask = MASKS[row["bias"]]
                    out.append(
                        Measurement(
                            folder,
                            rel,
                            i,
                            row["case"],
                            date,
                            bool(row["autotune"]),
                            mask,
                            dtype,
                            int(d),
                            bool(row["causal"]),
                            bool(row["backward"]),
                            int(m),
                            int(n),
                            float(row["speedup_vs_sdpa"]),
                        )
                    )
                except (KeyError, TypeError, ValueError) as e:
                    raise RecordError(f"{timing}#{i}: not a timing case ({type(e).__name__}: {e})") from None
    return out


def withdrawn(measurements: list[Measurement], table: dict | None = None) -> list[tuple[Measurement, str]]:
    """The measurements ``table`` (:data:`WITHDRAWN` by default) names, with why; each
    entry must name one."""
    out = []
    for (path, case), why in (WITHDRAWN if table is None else table).items():
        hits = [m for m in measurements if f"{m.gpu}/{m.path}" == path and m.case == case]
        if not hits:
            raise RecordError(f"WITHDRAWN names {path} case {case!r}, which no record holds: remove the entry")
        out += [(m, why) for m in hits]
    return out


def current(measurements: list[Measurement], table: dict | None = None) -> list[Measurement]:
    """Per GPU, case and autotuning setting, the newest run's measurement (those
    ``table`` withdraws left out)."""
    gone = {m for m, _ in withdrawn(measurements, table)}
    newest: dict[tuple, Measurement] = {}
    for m in measurements:
        if m in gone:
            continue
        key = (m.gpu, m.case, m.autotune, m.cls)
        if key not in newest or m.date > newest[key].date:
            newest[key] = m
    return sorted(newest.values(), key=lambda m: (m.gpu, m.path, m.row))


def make_rules(measurements: list[Measurement], table: dict | None = None) -> list[Rule]:
    classes: dict[tuple, list[Measurement]] = {}
    for m in current(measurements, table):
        classes.setdefault(m.cls, []).append(m)
    rules = []
    for (gpu, mask, dtype, d, causal, grad), ms in classes.items():
        if min(m.ratio for m in ms) < THRESHOLD:
            continue
        worst = min(ms, key=lambda m: m.ratio)
        rules.append(
            Rule(
                gpu,
                mask,
                dtype,
                d,
                causal,
                grad,
                min(m.q_len for m in ms),
                min(m.kv_len for m in ms),
                "triton",
                ("sdpa",),
                round(worst.ratio, 3),
                worst.ref,
                tuple((m.ref, round(m.ratio, 3)) for m in ms),
            )
        )
    return sorted(rules, key=lambda r: (r.gpu, r.mask, r.dtype, r.head_dim, r.causal, r.grad))


HEADER = f"""\
# Per-GPU backend preferences of auto(), from the committed GPU records: one rule a line.
#
# Generated by tools/records (`{COMMAND}`) from bench/results/<gpu>/results.json
# (the device) and every timing.json under bench/results/<gpu>/ (bench/gpu_tiles.py: the
# Triton kernel beside SDPA; dtype and date from the summary.md beside it). Do not edit by hand:
# rerun the command after a record changes; tests/choose/test_gpu_rules.py checks this file.
#
# A rule: on GPU `gpu` (GPUS: its name and compute capability), a call of the class (mask,
# dtype, head_dim, causal, grad; q_len >= min_q, kv_len >= min_kv; no dropout, LSE or
# deterministic mode) walks `prefer` ahead of `over`, because every current measurement of
# the class (the newest run of each case and autotune setting) had it at least THRESHOLD
# times as fast. `ratio` is the smallest of them, `record` its row ("<path>#<index in the
# JSON list>", path under bench/results/<gpu>/), `rows` all of them. A GPU or a class
# without a rule keeps the order of its hardware class (attnkit/choose/policy.py).
"""


def render(gpus: dict[str, GPU], measurements: list[Measurement], table: dict | None = None) -> str:
    rules = make_rules(measurements, table)
    lines = [HEADER.rstrip("\n")]
    gone = withdrawn(measurements, table)
    if gone:
        lines += ["#", "# Not used (tools/records/generate.py: WITHDRAWN):"]
        for m, why in gone:
            lines += textwrap.wrap(
                f"{m.gpu}/{m.ref} ({m.case}, {m.ratio:.3f}): {why}",
                92,
                initial_indent="#   ",
                subsequent_indent="#     ",
            )
    lines += [
        "",
        "from collections import namedtuple",
        "",
        'GPU = namedtuple("GPU", "name capability")',
        'Rule = namedtuple("Rule", "gpu mask dtype head_dim causal grad min_q min_kv prefer over ratio record rows")',
        "",
        f"THRESHOLD = {THRESHOLD!r}",
        "",
        "# bench/results/<folder> -> the device it recorded",
        "GPUS = {",
    ]
    lines += [f"    {g.folder!r}: GPU({g.name!r}, {g.capability!r})," for g in gpus.values()]
    lines += ["}", "", "RULES = ("]
    lines += [f"    Rule{tuple(r.__dict__.values())!r}," for r in rules]
    lines += [")", ""]
    return "\n".join(lines)


def generate(results: Path = RESULTS, withdrawn_table: dict | None = None) -> str:
    """The text of attnkit/choose/gpu_rules.py for the records under ``results``, without
    the measurements ``withdrawn_table`` names (:data:`WITHDRAWN` by default)."""
    gpus = read_gpus(results)
    return render(gpus, read_measurements(gpus, results), withdrawn_table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the file differs from what the records give"
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="the records' folder (default: %(default)s)")
    parser.add_argument("--file", type=Path, default=OUTPUT, help="the generated module (default: %(default)s)")
    parser.add_argument(
        "--tiles-file",
        type=Path,
        default=TILE_OUTPUT,
        help="the generated module of default tiles per GPU (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        outputs = (
            (args.file, generate(args.results), "Rule"),
            (args.tiles_file, generate_tiles(args.results), "TileRule"),
        )
    except RecordError as e:
        print(f"{COMMAND}: {e}", file=sys.stderr)
        return 2
    if args.check:
        stale = [path for path, text, _ in outputs if (path.read_text() if path.is_file() else "") != text]
        for path in stale:
            print(f"{path} is not what the records under {args.results} give: run `{COMMAND}` (never edit it by hand)")
        if stale:
            return 1
        print(", ".join(str(path) for path, _, _ in outputs) + ": up to date")
        return 0
    for path, text, rule in outputs:
        path.write_text(text)
        print(f"wrote {path}: {text.count(chr(10) + '    ' + rule + '(')} rules")
    return 0


# -- default tiles per GPU ---------------------------------------------------------------

TILE_OUTPUT = ROOT / "attnkit" / "kernels" / "tile_rules.py"
# gpu_tiles.py's bias kinds -> the kernels' bias variants
VARIANTS = {"none": "none", "key_padding": "keypad", "full": "full"}


@dataclass(frozen=True)
class TileRule:
    gpu: str
    target: str  # the tile lists' target ("sm90", "sm80")
    kernel: str
    width: str
    band: int
    variant: str
    causal: bool
    loads: str  # "tma" or "ptr"
    dtype: str  # the timings' dtype ("float16"): another dtype of the width gets no rule
    tile: str  # str(TileConfig): M128-N64-w8-s3
    replaces: str  # the list's shipped default for the call
    min_q: int
    min_kv: int
    gain: float  # the case's time with autotuning off / on, in the same run
    record: str  # the autotune-on row: "<path>#<row>", path under bench/results/<gpu>/


def _tile_name(config: str) -> str:
    """str(TileConfig) of a Triton config as str(triton.Config) writes it."""
    kv = dict(part.split(": ", 1) for part in config.split(", "))
    try:
        name = f"M{kv['BLOCK_M']}-N{kv['BLOCK_N']}-w{kv['num_warps']}-s{kv['num_stages']}"
    except KeyError as e:
        raise RecordError(f"autotuner choice {config!r} lacks {e}") from None
    return (
        name
        + ("-r" if kv.get("RELOAD") == "True" else "")
        + (f"-reg{kv['maxnreg']}" if kv.get("maxnreg", "None") != "None" else "")
    )


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _shipped(target, kernel, width, band, variant, causal, loads, head_dim) -> list[str]:
    """The shipped candidates (str(TileConfig)) serving a call, the default first (as
    attnkit.kernels.flash.launch.configs_for filters them)."""
    from attnkit.kernels import limits
    from attnkit.kernels.flash.tiles import CONFIGS

    padded = limits.padded_head_dim(head_dim)
    cands = CONFIGS.get(target, {}).get(kernel, {}).get(width, {}).get(band, ())
    return [
        str(c)
        for c in cands
        if variant in c.variants
        and causal in c.causal
        and loads in c.loads
        and (c.dims is None or c.dims[0] <= padded <= c.dims[1])
    ]


def make_tile_rules(gpus: dict[str, GPU], results: Path = RESULTS) -> list[TileRule]:
    """A list's default tile on a GPU, from a record that timed a case with the shipped
    default (autotuning off) and with the autotuner's choice (on) in the same run and
    logged what the autotuner chose for each list it tuned (gpu_tiles.py's "autotuner
    choices" row). Each case that ran a list (the forward; with a backward, the forward
    with its residual and both backward kernels) is evidence for the region of calls
    at least as long as it (q_len >= its M, kv_len >= its N). A case whose choice was at
    least THRESHOLD times as fast makes its choice the default of its region, unless
    another case inside that region lost (ran slower than THRESHOLD with the autotuner's
    choices, whatever they were) or chose another tile: nothing is carried into calls a
    record measured otherwise, and one region per case (two cases' lengths are never
    combined into a corner neither timed). ``gain`` is the whole case's (with a
    backward: the three kernels' choices together)."""
    cases: dict[tuple, list[tuple]] = {}  # list key -> [(m, n, tile, gain, record)] of every paired case
    for folder in gpus:
        for timing in sorted((results / folder).rglob("timing.json")):
            rows = json.loads(timing.read_text())
            rel = timing.relative_to(results / folder).as_posix()
            choices = [r for r in rows if r.get("case") == "autotuner choices"]
            if not choices:
                continue
            dtype, _ = _summary(timing)
            by_case: dict[str, dict] = {}
            for i, row in enumerate(rows):
                if "attnkit_ms" in row and "autotune" in row:
                    by_case.setdefault(row["case"], {})[bool(row["autotune"])] = (i, row)
            for case, runs in by_case.items():
                if set(runs) != {False, True}:
                    continue
                (_, off), (i_on, on) = runs[False], runs[True]
                if on.get("bias") not in VARIANTS:
                    continue
                gain = off["attnkit_ms"] / on["attnkit_ms"]
                _, _, m, n, d = on["shape"]
                kernels = ("fwd_lo", "dkdv", "dq") if on["backward"] else ("fwd",)
                for list_key, picks in choices[-1]["choices"].items():
                    target, kernel, width, band, variant, causal, tma = list_key.split("/")
                    if kernel not in kernels or variant != VARIANTS[on["bias"]] or (causal == "True") != on["causal"]:
                        continue
                    for key, config in picks.items():
                        tune = ast.literal_eval(key)
                        if tuple(tune[:4]) != (d, _pow2(m), _pow2(n), on["causal"]):
                            continue
                        loads = "tma" if tma == "True" else "ptr"
                        shipped = _shipped(target, kernel, width, int(band), variant, causal == "True", loads, d)
                        tile = _tile_name(config)
                        if tile not in shipped:
                            raise RecordError(
                                f"{folder}/{rel}: the autotuner chose {tile} for {list_key}, which "
                                f"the shipped list no longer holds ({', '.join(shipped)})"
                            )
                        lkey = (folder, target, kernel, width, int(band), variant, causal == "True", loads, dtype)
                        cases.setdefault(lkey, []).append((m, n, tile, gain, f"{rel}#{i_on}", shipped[0]))
    found: dict[tuple, TileRule] = {}
    for lkey, evidence in cases.items():
        for m, n, tile, gain, record, default in evidence:
            if gain < THRESHOLD or tile == default:
                continue
            inside = [e for e in evidence if e[0] >= m and e[1] >= n]
            if any(e[3] < THRESHOLD or e[2] != tile for e in inside):
                continue  # a case in the region lost, or chose another tile
            rule = TileRule(
                *lkey, tile, default, m, n, round(min(e[3] for e in inside), 3), min(inside, key=lambda e: e[3])[4]
            )
            found.setdefault((lkey, m, n), rule)
    return sorted(
        found.values(),
        key=lambda r: (r.gpu, r.target, r.kernel, r.width, r.band, r.variant, r.causal, r.loads, r.min_q, r.min_kv),
    )


TILE_HEADER = f"""\
# Per-GPU default tiles of the Triton kernels, from the committed GPU records: one rule a line.
#
# Generated by tools/records (`{COMMAND}`) from the timing.json files under
# bench/results/<gpu>/ that log the autotuner's choices (bench/gpu_tiles.py). Do not edit by
# hand: rerun the command after a record or a tile list changes; tests/choose/test_gpu_rules.py
# checks this file.
#
# A rule: on GPU `gpu` (a folder of bench/results, attnkit/choose/gpu_rules.py's GPUS), the
# list (target, kernel, width, band, variant, causal, loads) of attnkit/kernels/flash/tiles.py
# starts with `tile` instead of `replaces` for calls in `dtype` with q_len >= min_q and
# kv_len >= min_kv, because a record timed calls of that region (every one it timed there)
# with the autotuner's choice `tile` at least THRESHOLD times as fast as with the default
# (`gain`: the least of those cases' times with autotuning off / on, same run, whole calls:
# with a backward, its three kernels' choices together; `record`: its autotune-on row,
# "<path>#<index in the JSON list>"). `replaces` is today's default: the record does not
# say which tile its run's default was (the lists may have changed since). It is the tile used
# with ATTNKIT_TRITON_AUTOTUNE=0; with autotuning on, the autotuner still times every
# candidate. Every tile is a shipped candidate of its list, so the static report compiles it.
# A GPU, list or length without a rule keeps the shipped order.
"""


def render_tiles(rules: list[TileRule]) -> str:
    lines = [
        TILE_HEADER.rstrip("\n"),
        "",
        "from collections import namedtuple",
        "",
        'TileRule = namedtuple("TileRule", "gpu target kernel width band variant causal loads dtype tile '
        'replaces min_q min_kv gain record")',
        "",
        f"THRESHOLD = {THRESHOLD!r}",
        "",
        "TILE_RULES = (",
    ]
    lines += [f"    TileRule{tuple(r.__dict__.values())!r}," for r in rules]
    lines += [")", ""]
    return "\n".join(lines)


def generate_tiles(results: Path = RESULTS) -> str:
    """The text of attnkit/kernels/tile_rules.py for the records under ``results``."""
    return render_tiles(make_tile_rules(read_gpus(results), results))
