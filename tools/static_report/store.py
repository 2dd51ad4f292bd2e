"""The report's files: writing, reading (both layouts), rendering again, and resuming.

Layout of a report folder (bench/results/static/ for the full run; why it is split is in
the package docstring, "Storage"):

    report.md                 the tables (what a reader opens)
    report.json               the run's metadata (triton, commit, source key, date, command,
                              definitions), the targets' verdicts, the warp-specialization
                              check, the tutorial kernel's rows (reference), and row_files:
                              {name: number of rows} of the files below
    rows/<name>.jsonl         the rows, one JSON object a line, by target and kernel family:
                              sm80-fwd (fwd and fwd_lo), sm80-dkdv (dkdv and dkdv_dbias),
                              sm80-dq (dq and dq_dbias), the same for sm90; a file that would
                              exceed ROW_FILE_LIMIT is split by dtype (sm90-fwd-fp16, ...)
    rows.partial.jsonl        the checkpoint: each row appended as it compiles, with its
                              source key (git-ignored; when a run finishes, the rows its
                              report holds are taken out, and an empty file removed)
    report.previous.*         the report a run replaced (git-ignored): .json, .md, .rows/

The rows are written in jobs.row_order and read back in it. Reading accepts the earlier
single-file layout too (report.json with every row inline, under "rows"); --render DIR
rewrites such a report in this layout.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, fields

from .compile import Job, Result
from .jobs import row_order
from .key import _ROOT, compile_spec, source_key
from .sparse import SPARSE_KERNELS, SparseResult

REPORT_DIR = os.path.join("bench", "results", "static")
CHECKPOINT = "rows.partial.jsonl"  # rows appended as they compile; a killed run resumes from it
ROW_FILE_LIMIT = 1_000_000  # bytes: no tracked file over 1 MB


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=_ROOT).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def to_record(r: Result) -> dict:
    out = asdict(r.job)
    out.update({k: v for k, v in asdict(r).items() if k != "job"})
    out["config"] = r.job.config_name
    out["block_m"], out["block_n"], out["num_warps"], out["num_stages"], out["reload"] = r.job.config
    out["gated"] = r.gated
    out["exp_limit"] = r.exp_limit
    out["clocks_per_score"] = r.clocks_per_score
    for k in ("loop_mix", "sass_digest", "warp_specialize"):
        out.pop(k, None)  # kept out of the record: its size (rerun with ATTNKIT_INSPECT_SASS to read loops)
    out["problems"] = r.problems
    for k, v in list(out.items()):
        if isinstance(v, float) and v != v:
            out[k] = None
    return out


def from_record(rec: dict) -> Result:
    """A row of the report back as a Result (the loop's mix and digest are not kept)."""
    job_fields = {f.name for f in fields(Job)}
    job = Job(
        **{k: (tuple(v) if k == "config" else v) for k, v in rec.items() if k in job_fields and k != "config"},
        config=(rec["block_m"], rec["block_n"], rec["num_warps"], rec["num_stages"], rec["reload"]),
    )
    cls = SparseResult if job.kernel in SPARSE_KERNELS else Result
    res_fields = {f.name for f in fields(cls)} - {"job", "loop_mix", "sass_digest"}
    return cls(
        job,
        **{k: (float("nan") if v is None and k != "partial_mma_mix" else v) for k, v in rec.items() if k in res_fields},
    )


def source_state() -> tuple[str, bool]:
    """(commit, whether the working tree has changes) when a run starts: a label of the
    report; what keys its rows is source_key()."""
    return _git("rev-parse", "--short", "HEAD"), bool(
        _git("status", "--porcelain", "--", "attnkit/kernels", "tools/static_report")
    )


def definitions() -> str:
    """The Definitions section of the package docstring (tools/static_report/__init__.py),
    written into the report."""
    doc = sys.modules[__package__].__doc__
    return doc.split("Definitions (written into the report too):")[1].split("It exits")[0].strip()


# -- the layout --------------------------------------------------------------------------


def _rows_dir(out_dir: str, stem: str) -> str:
    """Where the row files of <stem>.json are: rows/ for report.json, report.previous.rows/
    for the report a run replaced."""
    return os.path.join(out_dir, "rows" if stem == "report" else stem + ".rows")


def _row_file(rec: dict, by_dtype: bool = False) -> str:
    """The row file of a row: its target and kernel family (fwd_lo with fwd, the bias
    gradient's kernels with dkdv and dq), and its dtype where that family's file is split."""
    name = f"sm{rec['arch']}-{rec['kernel'].split('_')[0]}"
    return f"{name}-{rec['dtype']}" if by_dtype else name


def _lines(records) -> str:
    return "".join(
        json.dumps({k: v for k, v in r.items() if k != "key"}, separators=(",", ":")) + "\n" for r in records
    )


def write_layout(out_dir: str, record: dict, stem: str = "report") -> str:
    """Write record (metadata, targets, warp_specialization, reference, and rows: the row
    records in row order) as <stem>.json and its row files; the folder's other row files
    are removed. Returns the path of <stem>.json."""
    rows = record.get("rows", [])
    groups: dict[str, list[dict]] = {}
    for rec in rows:
        groups.setdefault(_row_file(rec), []).append(rec)
    files: dict[str, str] = {}
    for name, recs in groups.items():
        text = _lines(recs)
        if len(text.encode()) > ROW_FILE_LIMIT:  # split by dtype (the order within each is kept)
            by_dtype: dict[str, list[dict]] = {}
            for rec in recs:
                by_dtype.setdefault(_row_file(rec, by_dtype=True), []).append(rec)
            files.update({n: _lines(rs) for n, rs in by_dtype.items()})
        else:
            files[name] = text
    rows_dir = _rows_dir(out_dir, stem)
    os.makedirs(rows_dir, exist_ok=True)
    for name in os.listdir(rows_dir):
        if name.endswith(".jsonl") and name[: -len(".jsonl")] not in files:
            os.remove(os.path.join(rows_dir, name))
    for name, text in files.items():
        with open(os.path.join(rows_dir, name + ".jsonl"), "w") as f:
            f.write(text)
    keys = {r.get("key") for r in rows} - {None}
    meta = {k: v for k, v in record.items() if k != "rows"}
    if meta.get("source_key") is None and len(keys) == 1:
        meta["source_key"] = keys.pop()
    meta["row_files"] = {name: text.count("\n") for name, text in sorted(files.items())}
    path = os.path.join(out_dir, stem + ".json")
    with open(path, "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    return path


def read_record(out_dir: str, stem: str = "report", rows: bool = True) -> dict:
    """<stem>.json of out_dir with its rows under "rows" (row records, in row order),
    whichever layout it was written in; rows=False leaves the row files unread."""
    with open(os.path.join(out_dir, stem + ".json")) as f:
        record = json.load(f)
    if "row_files" not in record or not rows:
        return record
    found = []
    for name, count in record["row_files"].items():
        path = os.path.join(_rows_dir(out_dir, stem), name + ".jsonl")
        with open(path) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        if len(recs) != count:
            raise ValueError(f"{path}: {len(recs)} rows, {stem}.json says {count}")
        found += recs
    results = [from_record(r) for r in found]
    position = {id(r): i for i, r in enumerate(results)}
    record["rows"] = [found[position[id(r)]] for r in row_order(results)]
    return record


def _keep_previous(out_dir: str) -> None:
    """The last report is kept as report.previous.*, never lost to a shorter run."""
    for name in ("report.json", "report.md"):
        if os.path.exists(os.path.join(out_dir, name)):
            os.replace(os.path.join(out_dir, name), os.path.join(out_dir, name.replace("report.", "report.previous.")))
    previous = _rows_dir(out_dir, "report.previous")
    shutil.rmtree(previous, ignore_errors=True)
    if os.path.isdir(_rows_dir(out_dir, "report")):
        os.replace(_rows_dir(out_dir, "report"), previous)


def write_report(
    results: list[Result],
    reference: list[Result],
    out_dir: str,
    argv: list[str],
    warp_spec: list[dict] | None = None,
    partial: str | None = None,
    source: tuple[str, bool] | None = None,
    key: str | None = None,
) -> tuple[str, str]:
    """report.json with its row files, and report.md (the tables, the targets), under
    out_dir. partial: what an interrupted run compiled, said at the top of both. source:
    the run's source_state() (default: now). key: the source key of every row."""
    import triton

    from . import targets

    os.makedirs(out_dir, exist_ok=True)
    _keep_previous(out_dir)
    commit, dirty = source or source_state()
    meta = {
        "what": "static figures read from SASS; no kernel was run",
        "triton": triton.__version__,
        "commit": commit,
        "dirty": dirty,
        "source_key": key or source_key(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m tools.static_report " + " ".join(argv),
        "partial": partial,
        "definitions": definitions(),
    }
    results = row_order(results)
    verdicts = targets.evaluate(results)
    path = write_layout(
        out_dir,
        {
            **meta,
            "targets": verdicts,
            "warp_specialization": warp_spec or [],
            "reference": [to_record(r) for r in reference],
            "rows": [to_record(r) for r in results],
        },
    )
    md = targets.markdown(meta, results, reference, verdicts, warp_spec or [])
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(md)
    return path, os.path.join(out_dir, "report.md")


def render(out_dir: str) -> tuple[str, str]:
    """Write report.md (and the targets of report.json) again from the rows of out_dir's
    report, with the targets and notes of this checkout: for a change of wording or of a
    target, without compiling anything again. The run's own commit, date, command and
    source key are kept. A report in the single-file layout is rewritten in this one."""
    import triton

    from . import targets

    record = read_record(out_dir)
    if record.get("triton") != triton.__version__:
        raise SystemExit(
            f"{out_dir}/report.json was compiled with triton {record.get('triton')}, this is "
            f"{triton.__version__}: rerun python -m tools.static_report instead"
        )
    results = [from_record(r) for r in record["rows"]]
    reference = [from_record(r) for r in record.get("reference", [])]
    record["targets"] = targets.evaluate(results)
    path = write_layout(out_dir, {k: v for k, v in record.items() if k != "row_files"})
    md = targets.markdown(record, results, reference, record["targets"], record.get("warp_specialization", []))
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(md)
    return path, os.path.join(out_dir, "report.md")


# -- resuming ----------------------------------------------------------------------------


def _read_rows(path: str, key: str | None) -> dict:
    """compile_spec -> record of the rows of a report (report.json, either layout) or a
    checkpoint (jsonl) compiled from this source key (None: from any)."""
    if not os.path.exists(path):
        return {}
    rows = []
    if path.endswith(".jsonl"):
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # the line a killed run was writing
    else:
        record = read_record(os.path.dirname(path), os.path.basename(path)[: -len(".json")])
        rows = [dict(r, key=r.get("key", record.get("source_key"))) for r in record.get("rows", [])]
    return {compile_spec(from_record(r).job): r for r in rows if key is None or r.get("key") == key}


def resumable_rows(out_dir: str, jobs: list[Job], key: str) -> tuple[dict, str]:
    """{job: Result} of the jobs an earlier run in out_dir compiled from the same source key
    (its report, and the checkpoint of a run that was stopped), each with this run's
    budget and default; and what was found."""
    found = _read_rows(os.path.join(out_dir, "report.json"), key)
    found.update(_read_rows(os.path.join(out_dir, CHECKPOINT), key))
    kept = {}
    for j in jobs:
        rec = found.get(compile_spec(j))
        if rec is not None:
            r = from_record(rec)
            r.job = j
            kept[j] = r
    return kept, f"{len(found)} rows compiled from source key {key} in {out_dir}"


def rows_by_code(out_dir: str, jobs: list[Job]) -> dict:
    """{job: Result} of the rows an earlier run in out_dir compiled, from any source key,
    that carry a code key (build.code_key): each is kept where this checkout builds its
    job to the same code key (cli checks), with this run's budget and default. The
    checkpoint's row wins over the report's: it is the later."""
    found = _read_rows(os.path.join(out_dir, "report.json"), None)
    found.update(_read_rows(os.path.join(out_dir, CHECKPOINT), None))
    out = {}
    for j in jobs:
        rec = found.get(compile_spec(j))
        if rec is not None and rec.get("code") and not rec.get("error"):
            r = from_record(rec)
            r.job = j
            out[j] = r
    return out


def retire_checkpoint(out_dir: str, results: list[Result], key: str) -> None:
    """After a report is written: the checkpoint without the rows the report holds (all
    of them, for a run that finished: the file goes); rows of other jobs (a killed full
    run's, when a subset ran into the same folder) stay for the next --resume."""
    path = os.path.join(out_dir, CHECKPOINT)
    written = {compile_spec(r.job) for r in results}
    left = [rec for spec, rec in _read_rows(path, key).items() if spec not in written]
    if left:
        with open(path, "w") as f:
            f.write("".join(json.dumps(rec, separators=(",", ":")) + "\n" for rec in left))
    elif os.path.exists(path):
        os.remove(path)


def resumable_reference(out_dir: str) -> list[Result]:
    """The tutorial kernel's rows (--reference) of out_dir/report.json, where the same
    triton compiled them."""
    import triton

    if not os.path.exists(os.path.join(out_dir, "report.json")):
        return []
    record = read_record(out_dir, rows=False)
    if record.get("triton") != triton.__version__:
        return []
    return [from_record(r) for r in record.get("reference", [])]
