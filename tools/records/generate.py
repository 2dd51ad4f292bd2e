"""Reads the GPU records and writes attnkit/choose/records.py (the package docstring says
what is read and how a rule is made)."""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
OUTPUT = ROOT / "attnkit" / "choose" / "records.py"
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
    ("nvidia-h200/tiles-43e61c8/timing.json", "d128 full bias"):
        "run at 43e61c8, before 2ac832a made every bias reach the kernels as float32 (a 16-bit one is "
        "converted on each call); the H100 timed that path at 0.34 of SDPA (nvidia-h100-80gb-hbm3/timing/)",
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
        raise RecordError(f"{summary}: no heading \"## Speed beside torch's SDPA (<{'|'.join(DTYPES)}>)\"")
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
                    out.append(Measurement(folder, rel, i, row["case"], date, bool(row["autotune"]), mask, dtype,
                                           int(d), bool(row["causal"]), bool(row["backward"]), int(m), int(n),
                                           float(row["speedup_vs_sdpa"])))
                except (KeyError, TypeError, ValueError) as e:
                    raise RecordError(f"{timing}#{i}: not a timing case ({type(e).__name__}: {e})") from None
    return out


def withdrawn(measurements: list[Measurement]) -> list[tuple[Measurement, str]]:
    """The measurements :data:`WITHDRAWN` names, with why; each entry must name one."""
    out = []
    for (path, case), why in WITHDRAWN.items():
        hits = [m for m in measurements if f"{m.gpu}/{m.path}" == path and m.case == case]
        if not hits:
            raise RecordError(f"WITHDRAWN names {path} case {case!r}, which no record holds: remove the entry")
        out += [(m, why) for m in hits]
    return out


def current(measurements: list[Measurement]) -> list[Measurement]:
    """Per GPU, case and autotuning setting, the newest run's measurement."""
    gone = {m for m, _ in withdrawn(measurements)}
    newest: dict[tuple, Measurement] = {}
    for m in measurements:
        if m in gone:
            continue
        key = (m.gpu, m.case, m.autotune, m.cls)
        if key not in newest or m.date > newest[key].date:
            newest[key] = m
    return sorted(newest.values(), key=lambda m: (m.gpu, m.path, m.row))


def make_rules(measurements: list[Measurement]) -> list[Rule]:
    classes: dict[tuple, list[Measurement]] = {}
    for m in current(measurements):
        classes.setdefault(m.cls, []).append(m)
    rules = []
    for (gpu, mask, dtype, d, causal, grad), ms in classes.items():
        if min(m.ratio for m in ms) < THRESHOLD:
            continue
        worst = min(ms, key=lambda m: m.ratio)
        rules.append(Rule(gpu, mask, dtype, d, causal, grad, min(m.q_len for m in ms), min(m.kv_len for m in ms),
                          "triton", ("sdpa",), round(worst.ratio, 3), worst.ref,
                          tuple((m.ref, round(m.ratio, 3)) for m in ms)))
    return sorted(rules, key=lambda r: (r.gpu, r.mask, r.dtype, r.head_dim, r.causal, r.grad))


HEADER = f'''\
# Per-GPU backend preferences of auto(), from the committed GPU records: one rule a line.
#
# Generated by tools/records (`{COMMAND}`) from bench/results/<gpu>/results.json
# (the device) and every timing.json under bench/results/<gpu>/ (bench/gpu_tiles.py: the
# Triton kernel beside SDPA; dtype and date from the summary.md beside it). Do not edit by hand:
# rerun the command after a record changes; tests/choose/test_records.py checks this file.
#
# A rule: on GPU `gpu` (GPUS: its name and compute capability), a call of the class (mask,
# dtype, head_dim, causal, grad; q_len >= min_q, kv_len >= min_kv; no dropout, LSE or
# deterministic mode) walks `prefer` ahead of `over`, because every current measurement of
# the class (the newest run of each case and autotune setting) had it at least THRESHOLD
# times as fast. `ratio` is the smallest of them, `record` its row ("<path>#<index in the
# JSON list>", path under bench/results/<gpu>/), `rows` all of them. A GPU or a class
# without a rule keeps the order of its hardware class (attnkit/choose/policy.py).
'''


def render(gpus: dict[str, GPU], measurements: list[Measurement]) -> str:
    rules = make_rules(measurements)
    lines = [HEADER.rstrip("\n")]
    gone = withdrawn(measurements)
    if gone:
        lines += ["#", "# Not used (tools/records/generate.py: WITHDRAWN):"]
        for m, why in gone:
            lines += textwrap.wrap(f"{m.gpu}/{m.ref} ({m.case}, {m.ratio:.3f}): {why}", 92,
                                   initial_indent="#   ", subsequent_indent="#     ")
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


def generate(results: Path = RESULTS) -> str:
    """The text of attnkit/choose/records.py for the records under ``results``."""
    gpus = read_gpus(results)
    return render(gpus, read_measurements(gpus, results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the file differs from what the records give")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the records' folder (default: %(default)s)")
    parser.add_argument("--file", type=Path, default=OUTPUT, help="the generated module (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        text = generate(args.results)
    except RecordError as e:
        print(f"{COMMAND}: {e}", file=sys.stderr)
        return 2
    if args.check:
        old = args.file.read_text() if args.file.is_file() else ""
        if old != text:
            print(f"{args.file} is not what the records under {args.results} give: run `{COMMAND}` "
                  "(never edit it by hand)")
            return 1
        print(f"{args.file}: up to date")
        return 0
    args.file.write_text(text)
    print(f"wrote {args.file}: {text.count(chr(10) + '    Rule(')} rules")
    return 0
