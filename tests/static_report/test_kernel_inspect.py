"""`python -m tools.static_report`: the shipped kernel configurations compiled for sm_80
and sm_90 without a GPU, their SASS read, and the gate (spills, shared memory,
duplicated work, instr/score budgets); its report's files, and its resume by source key.

The full report (every autotuning config x head dims 40-512 x fp16 / bf16 / fp32 x
three bias variants x causal or not x TMA or pointer loads x six kernels x two targets,
thousands of compilations) takes hours on two cores without Triton's cache: run it
with `make inspect`; it writes bench/results/static/. Here a quick subset: the default
config of each kernel at head dims 40 (two head-dim pieces) and 128, causal (both of
its loops), with a full bias (the most registers), fp16 everywhere and fp32 for the
forward, on both targets; the gate's refusals; and what the rows are keyed by.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from tests.static_report._compiled import compiled_run

pytest.importorskip("triton")

KERNELS = ("fwd", "dkdv", "dq", "fwd_lo", "dkdv_dbias", "dq_dbias")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return compiled_run("-m", "tools.static_report", *args, timeout=timeout)


def _rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if line.split()[:1] and line.split()[0] in KERNELS]


def test_quick_subset_compiles_without_spills_or_duplicated_work():
    common = ("--quick", "--bias", "full", "--causal", "1")
    fwd = _run(*common, "--dtype", "fp16", "--dtype", "fp32", "--kernel", "fwd")
    rest = _run(*common, "--dtype", "fp16", *(f"--kernel={k}" for k in KERNELS[1:]))
    for r in (fwd, rest):
        assert r.returncode == 0, r.stdout + r.stderr
    rows = _rows(fwd.stdout) + _rows(rest.stdout)
    # Every kernel at both head dims on both targets (fwd in fp32 too), on sm_90 with the
    # loads its lists have (TMA, pointers, or both).
    seen = {(row[0], row[1], row[2], row[7]) for row in rows}
    want = {(k, d, "fp16", a) for k in KERNELS for d in ("40", "128") for a in ("sm_80", "sm_90")}
    want |= {("fwd", d, "fp32", a) for d in ("40", "128") for a in ("sm_80", "sm_90")}
    assert seen == want
    for row in rows:
        kernel, d, dtype, bias, causal, loads, cfg, arch, regs, stack, smem, matrix, isc, budget, limit, exp, dup = row[
            :17
        ]
        assert row[-1] == "ok", row
        assert int(stack) == 0 and int(regs) <= 255
        # Tensor cores: Ampere's mma.sync on sm_80, Hopper's warp-group MMA on sm_90 (or
        # mma.sync for tiles too narrow for it); exact fp32 dots run on FMA units.
        expected = {"fp32": ("fma",), "fp16": {"sm_80": ("mma",), "sm_90": ("wgmma", "mma")}[arch]}[dtype]
        assert matrix in expected, row
        assert loads == "ptr" or (arch == "sm_90" and dtype != "fp32"), row
        assert float(dup) <= 1.05 and float(isc) > 0, row


def test_a_failing_configuration_makes_it_exit_nonzero():
    """A tile that does not fit in registers (forward, head dim 40, 128 x 64 tiles on 4
    warps with a full bias: it spills on sm_90) must be reported and fail the run: the
    check is not a formality."""
    res = _run(
        "--kernel",
        "fwd",
        "--head-dim",
        "40",
        "--dtype",
        "fp16",
        "--arch",
        "90",
        "--bias",
        "full",
        "--causal",
        "0",
        "--loads",
        "ptr",
        "--config=128,64,4,2",
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAIL: spills" in res.stdout


def test_duplicated_work_and_a_budget_fail_the_run():
    """8 warps on a 64-row score tile on sm_90: both warp groups compute the whole QK^T
    tile and every exponential (two 64-row warp-group MMAs on 64 rows); and a budget
    below what a tile compiles to."""
    res = _run(
        "--kernel",
        "dq",
        "--head-dim",
        "64",
        "--dtype",
        "fp16",
        "--arch",
        "90",
        "--bias",
        "none",
        "--causal",
        "0",
        "--loads",
        "tma",
        "--config=64,32,8,2",
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert "duplicated matrix work" in res.stdout and "duplicated exponentials" in res.stdout
    res = _run(
        "--kernel",
        "dq",
        "--head-dim",
        "64",
        "--dtype",
        "fp16",
        "--arch",
        "90",
        "--bias",
        "none",
        "--causal",
        "0",
        "--loads",
        "tma",
        "--config=128,64,8,2",
        "--budget",
        "0.1",
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert "> budget 0.1" in res.stdout


def test_a_register_cap_is_compiled_and_recorded(tmp_path):
    """A sixth --config field caps ptxas's registers per thread (TileConfig.maxnreg): the
    row is named for it, compiles within it (here a cap far below what the tile needs,
    so it spills and fails), and the JSON record keeps it."""
    from tools.static_report import store

    res = _run(
        "--kernel",
        "fwd",
        "--head-dim",
        "64",
        "--dtype",
        "fp16",
        "--arch",
        "80",
        "--bias",
        "none",
        "--causal",
        "0",
        "--config=64,64,4,2,0,64",
        "--out",
        str(tmp_path),
    )
    assert res.returncode == 1, res.stdout + res.stderr
    (row,) = _rows(res.stdout)
    assert row[6] == "M64-N64-w4-s2-reg64" and 0 < int(row[8]) <= 64 and int(row[9]) > 0, row
    (rec,) = store.read_record(str(tmp_path))["rows"]
    assert rec["maxnreg"] == 64 and rec["config"] == "M64-N64-w4-s2-reg64" and rec["stack"] > 0
    # The row is in the file of its target and kernel family, one line.
    assert json.loads((tmp_path / "rows" / "sm80-fwd.jsonl").read_text()) == rec


def test_report_files(tmp_path):
    """--out writes the JSON record (triton version, date, commit, source key,
    definitions, every row in its row file) and the markdown report, with the targets
    the run covers."""
    from tools.static_report import cli, store

    res = _run(
        "--kernel",
        "fwd",
        "--head-dim",
        "64",
        "--dtype",
        "fp16",
        "--arch",
        "90",
        "--bias",
        "none",
        "--causal",
        "0",
        "--loads",
        "tma",
        "--quick",
        "--out",
        str(tmp_path),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    record = store.read_record(str(tmp_path))
    import triton

    assert record["triton"] == triton.__version__ and record["date"] and record["commit"]
    assert record["source_key"] == cli.source_key() and record["row_files"] == {"sm90-fwd": 1}
    assert "instr/score" in record["definitions"]
    assert not (tmp_path / store.CHECKPOINT).exists()  # every row is in the report
    (row,) = record["rows"]
    assert row["kernel"] == "fwd" and row["arch"] == 90 and row["tma"] and row["loop_length"] > 0
    scores = row["block_m"] * row["block_n"]
    assert row["instr_per_score"] == pytest.approx(row["loop_length"] * row["num_warps"] / scores)
    (verdict,) = [v for v in record["targets"] if v["id"] == "fwd-d64-fp16-none"]
    assert verdict["limit"] == pytest.approx(0.25)
    md = (tmp_path / "report.md").read_text()
    assert "Static figures read from SASS" in md and triton.__version__ in md and "## Targets" in md
    # --render writes the same report again from its rows, compiling nothing; a
    # changed row changes the verdict it reads.
    (tmp_path / "report.md").unlink()
    res = _run("--render", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "report.md").read_text() == md
    (tmp_path / "rows" / "sm90-fwd.jsonl").write_text(json.dumps(dict(row, instr_per_score=9.0)) + "\n")
    assert _run("--render", str(tmp_path)).returncode == 0
    again = store.read_record(str(tmp_path))
    (verdict,) = [v for v in again["targets"] if v["id"] == "fwd-d64-fp16-none"]
    assert verdict["value"] == 9.0 and not verdict["met"]


def test_an_interrupted_run_writes_a_partial_report(tmp_path):
    """SIGTERM (a scheduler's time limit) or Ctrl-C: the rows compiled so far are kept in
    a report that says it is partial (and in the checkpoint), and the exit status says
    the run did not finish; --resume compiles only the rest."""
    from tools.static_report import cli, store

    args = (
        "--kernel",
        "fwd",
        "--head-dim",
        "64",
        "--dtype",
        "fp16",
        "--arch",
        "90",
        "--bias",
        "none",
        "--causal",
        "0",
        "--jobs",
        "1",
        "--out",
        str(tmp_path),
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.static_report", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines = []
    for line in proc.stdout:  # wait for the first compiled row, then stop the run
        lines.append(line)
        if _rows(line):
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, "".join(lines) + out + err
    record = store.read_record(str(tmp_path))
    assert record["partial"].endswith("compilations (interrupted)")
    done, total = (int(x) for x in record["partial"].split(" compilations")[0].split(" of "))
    assert 1 <= done < total and len(record["rows"]) == done
    assert "**Partial report:" in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "report.previous.json").exists()
    # The checkpoint holds the same rows, each with its source key.
    checkpoint = [json.loads(line) for line in (tmp_path / store.CHECKPOINT).read_text().splitlines()]
    assert [r["key"] for r in checkpoint] == [cli.source_key()] * done
    # A row standing for the tutorial kernel's (--reference): resuming without the
    # tutorial's file keeps it.
    meta = json.loads((tmp_path / "report.json").read_text())
    meta["reference"] = [dict(record["rows"][0], kernel="ref_fwd")]
    (tmp_path / "report.json").write_text(json.dumps(meta))
    record["reference"] = meta["reference"]
    # --resume keeps those rows (the same source key and tiles) and compiles the rest.
    res = _run(*args, "--resume")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"resuming: {done} of {total} rows kept" in res.stdout
    assert len(_rows(res.stdout)) == total - done
    final = store.read_record(str(tmp_path))
    assert final["partial"] is None and len(final["rows"]) == total
    assert final["rows"][:done] == record["rows"]
    assert final["reference"] == record["reference"] and "the tutorial's rows kept" in final["command"]
    assert not (tmp_path / store.CHECKPOINT).exists()
    # The report it replaced is kept beside it, rows and all.
    assert store.read_record(str(tmp_path), "report.previous") == record


def _copy_tree(root) -> str:
    """The files source_key() reads (and ops.py), copied under root."""
    for rel in (
        "attnkit/kernels/bias_form.py",
        "attnkit/kernels/flash/abi.py",
        "attnkit/kernels/flash/kernels.py",
        "attnkit/kernels/flash/launch.py",
        "attnkit/kernels/flash/ops.py",
        "attnkit/kernels/flash/select.py",
        "attnkit/kernels/flash/sparse_kernels.py",
        "attnkit/kernels/int8/kernels.py",
        "attnkit/kernels/int8/quant.py",
        "attnkit/kernels/limits.py",
    ):
        os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        shutil.copy(os.path.join(ROOT, rel), os.path.join(root, rel))
    shutil.copytree(
        os.path.join(ROOT, "tools", "static_report"),
        os.path.join(root, "tools", "static_report"),
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return str(root)


def _edit(root, rel: str, old: str, new: str) -> None:
    path = os.path.join(root, rel)
    with open(path) as f:
        src = f.read()
    assert src.count(old) >= 1, (rel, old)
    with open(path, "w") as f:
        f.write(src.replace(old, new, 1))


def test_the_source_key_follows_the_code_not_comments_or_host_code(tmp_path):
    """source_key() hashes the code a row is compiled from: a comment or a docstring
    edited in kernels.py or abi.py, or host code edited (ops.py, launch.py, select.py),
    keeps every row; a code edit of the kernels, of their calling convention (abi.py:
    align, the compile options), of limits.py, of sass.py or of a row function changes it
    (build.code_key then decides which rows compile to other code). A row function moved
    to another module of the tool keeps the key."""
    from tools.static_report import key as sk

    def key_after(rel, old, new):
        root = _copy_tree(tmp_path / f"t{len(list(tmp_path.iterdir()))}")
        _edit(root, rel, old, new)
        return sk.source_key(root)

    base = sk.source_key(_copy_tree(tmp_path / "base"))
    assert base == sk.source_key()
    kernels, abi = "attnkit/kernels/flash/kernels.py", "attnkit/kernels/flash/abi.py"
    launch, select = "attnkit/kernels/flash/launch.py", "attnkit/kernels/flash/select.py"
    assert key_after(kernels, '"""FlashAttention-2 in Triton', '"""FlashAttention 2 in Triton') == base  # docstring
    assert (
        key_after(
            kernels,
            "NO_BIAS, KEY_BIAS, FULL_BIAS = 0, 1, 2",
            "# a comment\nNO_BIAS, KEY_BIAS, FULL_BIAS = 0, 1, 2  # and another",
        )
        == base
    )
    assert key_after("attnkit/kernels/flash/ops.py", "import torch", "import torch\n\nX = 1") == base
    assert (
        key_after(select, "INTERPRET_TILE = TileConfig(32, 32, 4, 1)", "INTERPRET_TILE = TileConfig(16, 16, 4, 1)")
        == base
    )
    assert (
        key_after(launch, "block = 16 if settings().interpret else 64", "block = 32 if settings().interpret else 64")
        == base
    )
    assert key_after(abi, '"""The largest power of two', '"""The greatest power of two') == base  # align's doc
    assert (
        key_after(kernels, "NO_BIAS, KEY_BIAS, FULL_BIAS = 0, 1, 2", "NO_BIAS, KEY_BIAS, FULL_BIAS = 0, 1, 3") != base
    )
    assert key_after(abi, "    a = 16\n", "    a = 8\n") != base  # align
    assert key_after(abi, '{"enable_fp_fusion": True}', '{"enable_fp_fusion": False}') != base
    assert key_after("attnkit/kernels/limits.py", "BANDS = (64,", "BANDS = (32, 64,") != base
    # The alignment a 16-bit bias is compiled at is in the key; the rest of bias_form.py is host code.
    bias_form = "attnkit/kernels/bias_form.py"
    assert key_after(bias_form, "BIAS_16BIT_ALIGN = 2", "BIAS_16BIT_ALIGN = 4") != base
    assert key_after(bias_form, "_SPAN_LIMIT = 2**31", "_SPAN_LIMIT = 2**30") == base
    # The int8 forward: its kernel code, the head-dim split and the keys per K scale compile_job reads
    # are in the key; the rest of its quantisation is host code.
    int8, quant = "attnkit/kernels/int8/kernels.py", "attnkit/kernels/int8/quant.py"
    assert key_after(int8, "LOG2E = tl.constexpr(", "# log2(e)\nLOG2E = tl.constexpr(") == base
    assert key_after(int8, "DQ: tl.constexpr = DQ0 + DQ1", "DQ: tl.constexpr = DQ1 + DQ0") != base
    assert key_after(quant, "    padded = -(-head_dim // 32) * 32", "    padded = -(-head_dim // 64) * 64") != base
    assert key_after(quant, "QMAX = 127", "QMAX = 126") == base
    assert key_after(quant, "K_BLOCK = 128", "K_BLOCK = 64") != base  # keys per K scale: a constexpr
    assert key_after("tools/static_report/sass.py", "import re\n", "import os\nimport re\n") != base
    # The block-sparse kernels and what builds and reads their rows (tools/static_report/sparse.py).
    sparse = "attnkit/kernels/flash/sparse_kernels.py"
    assert key_after(sparse, '"""The block-sparse flash kernels', '"""The block sparse flash kernels') == base
    assert key_after(sparse, "return bits != 0", "return bits > 0") != base
    assert key_after("tools/static_report/sparse.py", "SPARSE_HEAD_DIMS = (64,", "SPARSE_HEAD_DIMS = (40, 64,") != base
    assert (
        key_after(
            "tools/static_report/build.py", "res.seconds = time.time() - t0", "res.seconds = time.time() - t0 + 1"
        )
        != base
    )  # compile_job
    # _tool moved from compile.py to store.py: found by name, the same key.
    root = _copy_tree(tmp_path / "moved")
    with open(os.path.join(root, "tools/static_report/compile.py")) as f:
        src = f.read()
    tree = ast.parse(src)
    (node,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_tool"]
    segment = ast.get_source_segment(src, node)
    _edit(root, "tools/static_report/compile.py", segment, "")
    _edit(root, "tools/static_report/store.py", "\n\ndef _git(", "\n\n" + segment + "\n\n\ndef _git(")
    assert sk.source_key(root) == base
    # A row helper moved out of the module the key reads it from is an error, never a key
    # that silently leaves it out.
    root = _copy_tree(tmp_path / "helper")
    _edit(root, bias_form, "BIAS_16BIT_ALIGN = 2", "BIAS_16BIT_ALIGN_MOVED = 2")
    with pytest.raises(RuntimeError, match="BIAS_16BIT_ALIGN not found"):
        sk.source_key(root)


def test_another_triton_makes_every_row_stale(monkeypatch):
    """Rows compiled by another Triton are not kept: its version is in the key."""
    import triton

    from tools.static_report import key as sk

    base = sk.source_key()
    monkeypatch.setattr(triton, "__version__", triton.__version__ + ".post1")
    assert sk.source_key() != base


def test_everything_a_row_reads_of_the_flash_package_is_in_the_key():
    """The row functions read the kernels module (fk) and their calling convention (fl:
    flash/abi.py), both hashed whole, so what they read must be defined there, not
    imported into them."""
    from attnkit.kernels.flash import abi, kernels
    from tools.static_report import key as sk

    read = {"fk": set(), "fl": set()}
    here = os.path.join(ROOT, "tools", "static_report")
    for name in os.listdir(here):
        if name.endswith(".py"):
            with open(os.path.join(here, name)) as f:
                tree = ast.parse(f.read())
            for n in tree.body:
                if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in sk.ROW_FUNCTIONS:
                    for x in ast.walk(n):
                        if isinstance(x, ast.Attribute) and isinstance(x.value, ast.Name) and x.value.id in read:
                            read[x.value.id].add(x.attr)
    for alias, module in (("fk", kernels), ("fl", abi)):
        with open(module.__file__) as f:
            tree = ast.parse(f.read())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        for n in tree.body:
            if isinstance(n, (ast.Assign, ast.AnnAssign)):
                defined |= sk.assigned_names(n)
        assert read[alias] and read[alias] <= defined, (alias, read[alias] - defined)


def test_a_row_is_kept_across_a_budget_change_and_dropped_with_its_tile(tmp_path):
    """Resume keys a row by source key and compile_spec: a new budget or default (a tile
    list edited) keeps it, with the new budget; another tile, another variant or another
    source key does not. The checkpoint is read, and a torn last line (a killed run's) is
    ignored."""
    from tools.static_report import store
    from tools.static_report.compile import Job, Result

    job = Job("fwd", 64, "fp16", (128, 64, 8, 2, 0), 90, "none", tma=True, default=True, budget=0.5)
    rec = dict(
        store.to_record(Result(job, regs=128, stack=0, smem=1000, loop_length=100, instr_per_score=0.4)), key="k1"
    )
    other = dict(rec, key="k0", head_dim=80)
    (tmp_path / store.CHECKPOINT).write_text(json.dumps(rec) + "\n" + json.dumps(other) + "\n" + json.dumps(rec)[:40])
    rebudgeted = Job("fwd", 64, "fp16", (128, 64, 8, 2, 0), 90, "none", tma=True, default=False, budget=0.3)
    retiled = Job("fwd", 64, "fp16", (128, 32, 8, 2, 0), 90, "none", tma=True, default=True, budget=0.5)
    pointer = Job("fwd", 64, "fp16", (128, 64, 8, 2, 0), 90, "none", tma=False, default=True, budget=0.5)
    stale = Job("fwd", 80, "fp16", (128, 64, 8, 2, 0), 90, "none", tma=True, default=True, budget=0.5)
    kept, why = store.resumable_rows(str(tmp_path), [rebudgeted, retiled, pointer, stale], "k1")
    assert list(kept) == [rebudgeted] and "1 rows compiled from source key k1" in why
    r = kept[rebudgeted]
    assert r.job.budget == 0.3 and not r.job.default and r.instr_per_score == 0.4 and r.regs == 128
    assert r.problems == ["instr/score 0.400 > budget 0.3"]  # gated on this run's budget
    # A finished run takes out of the checkpoint the rows its report holds; rows of other
    # jobs (a killed full run's, before a subset ran into the same folder) stay.
    stale_row = dict(rec, head_dim=80)
    (tmp_path / store.CHECKPOINT).write_text(json.dumps(rec) + "\n" + json.dumps(stale_row) + "\n")
    store.retire_checkpoint(str(tmp_path), [r], "k1")
    assert [json.loads(x) for x in (tmp_path / store.CHECKPOINT).read_text().splitlines()] == [stale_row]
    store.retire_checkpoint(str(tmp_path), [r, store.from_record(stale_row)], "k1")
    assert not (tmp_path / store.CHECKPOINT).exists()
    # A report's rows are keyed by its source_key (the single-file layout's too).
    (tmp_path / "report.json").write_text(json.dumps({"source_key": "k1", "rows": [store.to_record(r)]}))
    assert list(store.resumable_rows(str(tmp_path), [job], "k1")[0]) == [job]
    assert store.resumable_rows(str(tmp_path), [job], "k2")[0] == {}
    # The current committed report predates source keys: nothing of it is resumed.
    (tmp_path / "report.json").write_text(json.dumps({"rows": [store.to_record(r)]}))
    assert store.resumable_rows(str(tmp_path), [job], "k1")[0] == {}


def test_the_committed_report_was_compiled_from_this_code():
    """The gate that bench/results/static is the report of the code in the tree: its
    source key is this checkout's (rerun `make inspect`, which recompiles only what
    changed, after editing the kernels, limits.py, sass.py or the row functions)."""
    from tools.static_report import key, store

    record = store.read_record(os.path.join(ROOT, store.REPORT_DIR), rows=False)
    if not record.get("source_key"):
        pytest.skip(
            "the committed report predates source keys (its rows carry none): regenerate it with "
            "`make inspect` to turn this check on"
        )
    assert record["source_key"] == key.source_key(), "the committed report is stale: run `make inspect`"


def test_the_committed_report_is_split_under_1_mb_and_whole():
    """No file of bench/results/static over 1 MB (git stores every version of it): the
    rows are in rows/*.jsonl, by target and kernel family, and every file report.json
    names holds the rows it says, none more."""
    from tools.static_report import store

    folder = os.path.join(ROOT, store.REPORT_DIR)
    ignored = ("report.previous.", store.CHECKPOINT)
    for dirpath, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(dirpath, name)
            if not any(os.path.relpath(path, folder).startswith(p) for p in ignored):
                assert os.path.getsize(path) < store.ROW_FILE_LIMIT, f"{path}: over 1 MB"
    record = store.read_record(folder)
    assert set(record["row_files"]) == {n[: -len(".jsonl")] for n in os.listdir(os.path.join(folder, "rows"))}
    assert len(record["rows"]) == sum(record["row_files"].values()) > 0


def test_the_single_file_layout_is_read_and_rewritten(tmp_path):
    """A report in the earlier layout (every row inline in report.json, ~2.2 MB: what a
    run of the previous tool writes) is read as it is, resumed from, and --render
    rewrites it in the split layout with the same rows, targets and report."""
    from tools.static_report import store

    committed = store.read_record(os.path.join(ROOT, store.REPORT_DIR))
    rows = [r for r in committed["rows"] if r["head_dim"] == 64 and r["dtype"] == "fp16"]
    old = {k: v for k, v in committed.items() if k != "row_files"}
    old.update(rows=rows, source_key="k1")
    (tmp_path / "report.json").write_text(json.dumps(old, separators=(",", ":")))
    assert store.read_record(str(tmp_path))["rows"] == rows
    job = store.from_record(rows[0]).job
    assert list(store.resumable_rows(str(tmp_path), [job], "k1")[0]) == [job]
    res = _run("--render", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    new = store.read_record(str(tmp_path))
    assert new["rows"] == rows and new["source_key"] == "k1"
    assert set(new["row_files"]) == {
        f"sm{a}-{k}" for a in (80, 90) for k in ("fwd", "dkdv", "dq", "int8", "sparse")
    } | {
        f"sm{a}-{k}"
        for a in (75, 86, 89)
        for k in ("fwd", "dkdv", "dq", "int8")  # tools/static_report/consumer.py
    }
    for name in new["row_files"]:
        for line in (tmp_path / "rows" / f"{name}.jsonl").read_text().splitlines():
            r = json.loads(line)
            assert f"sm{r['arch']}-{r['kernel'].split('_')[0]}" == name
    md = (tmp_path / "report.md").read_text()
    assert _run("--render", str(tmp_path)).returncode == 0
    assert (tmp_path / "report.md").read_text() == md and store.read_record(str(tmp_path)) == new


def test_the_targets_rows_compile_first():
    """An interrupted full run still evaluates the targets: their rows lead the job list."""
    from tools.static_report import jobs as jb
    from tools.static_report import targets

    jobs = jb.jobs_for(
        ["fwd", "dq"], [64, 320], ["fp32", "fp16"], [80, 90], ["full", "none"], [True, False], quick=False
    )
    pri = [jb.priority(j) for j in jobs]
    assert pri == sorted(pri) and pri[0] == 0 and pri[-1] == 4
    first = jobs[0]
    assert (first.arch, first.tma, first.causal, first.default, first.dtype) == (90, True, False, True, "fp16")
    assert first.head_dim in targets.FWD_EXACT


def test_the_shared_memory_table_is_what_the_committed_report_measured():
    """devices.NEEDS (the calls refused on GPUs with 99 KiB of shared memory per block)
    lists exactly the sm80 default tiles above 101,376 B in the committed report, with
    their bytes: a stale entry would refuse a call that fits, a missing one let a
    backward fail to launch on an RTX 4090."""
    from attnkit.kernels import devices
    from tools.static_report import compile, store

    rows = [store.from_record(r) for r in store.read_record(os.path.join(ROOT, store.REPORT_DIR))["rows"]]
    assert devices.NEEDS == compile.shared_memory_needs(rows)


def test_the_report_is_stamped_with_what_the_run_compiled(tmp_path):
    """The commit (and whether kernels/ had changes) is taken when a run starts and
    passed to the report: a commit made during an hours-long run is not what it compiled."""
    from tools.static_report import store

    store.write_report([], [], str(tmp_path), ["--jobs", "2"], source=("abc1234", True), key="k1")
    record = json.loads((tmp_path / "report.json").read_text())
    assert (record["commit"], record["dirty"], record["source_key"]) == ("abc1234", True, "k1")
    assert "instr/score" in record["definitions"] and "It exits" not in record["definitions"]
    assert "commit abc1234 (with uncommitted changes in kernels/)" in (tmp_path / "report.md").read_text()


# The head dims up to which the int8 forward's tiles (int8/ops.py's TILES, one per target,
# head dim and bias) compile clean without a bias, by target: all of them. With a bias,
# sm_90 at 384 spills 8-16 B (reported, allowed below).
INT8_CLEAN_UP_TO = {80: 512, 90: 512}


def test_the_committed_report_has_the_int8_forward_on_integer_tensor_cores():
    """Every int8 row of the committed report (both targets, fp16 and bf16, every head
    dim, each bias and causality) issues integer MMAs in its main loop (IMMA on sm_80,
    IGMMA on sm_90; P.V in 16 bits beside them), with no duplicated matrix work and no
    failed compile; without a bias and not causal, it has no problem at all up to the
    head dims of INT8_CLEAN_UP_TO, and the int8-vs-exact targets say so."""
    from tools.static_report import jobs, store

    record = store.read_record(os.path.join(ROOT, store.REPORT_DIR))
    # (sm_80 and sm_90; the consumer targets' int8 rows: test_consumer_rows.py)
    rows = [r for r in record["rows"] if r["kernel"] == "int8" and r["arch"] in (80, 90)]
    seen = {(r["arch"], r["dtype"], r["head_dim"], r["bias"], r["causal"]) for r in rows}
    assert seen == {
        (a, dt, d, b, c)
        for a in (80, 90)
        for dt in ("fp16", "bf16")
        for d in jobs.HEAD_DIMS
        for b in ("none", "keypad", "full")
        for c in (False, True)
    }
    for r in rows:
        # warp-group MMA takes 64 query rows per warp group: sm_90's smaller tiles (head
        # dims above 192) run mma.sync's IMMA, integer tensor cores too
        wgmma = r["arch"] == 90 and r["block_m"] >= 64
        integer = "IGMMA." if wgmma else "IMMA."
        assert r["default"] and not r["tma"] and r["loop_length"] > 0, r
        assert r["matrix"] == ("igmma" if wgmma else "imma"), r
        assert any(k.startswith(integer) for k in r["mma_mix"]), r
        assert r["mma_duplication"] <= 1.05 and not r["error"], r
        assert all(p.startswith(("spills", "default config needs", "shared memory")) for p in r["problems"]), r
        if r["bias"] == "none" and not r["causal"] and r["head_dim"] <= INT8_CLEAN_UP_TO[r["arch"]]:
            assert not r["problems"], r
    verdicts = {v["id"]: v for v in record["targets"] if v["id"].startswith("int8-vs-exact-")}
    assert len(verdicts) == 2 * 2 * len(jobs.HEAD_DIMS)
    for v in verdicts.values():
        assert v["met"] == (v["head_dim"] <= INT8_CLEAN_UP_TO[v["arch"]]), v
        assert v["exact_instr_per_score"] > 0, v


def test_the_int8_loop_is_no_longer_than_the_exact_forwards_or_the_report_says_why():
    """The int8-loop targets (tools/static_report/int8_loop.py) in the committed report:
    one per target, head dim 64 and 128 and 16-bit dtype, each met (int8 instr/score at
    most the exact forward's default) or carrying its reason, with the figures it was
    judged on."""
    from tools.static_report import int8_loop, store

    record = store.read_record(os.path.join(ROOT, store.REPORT_DIR))
    loop = {v["id"]: v for v in record["targets"] if v["id"].startswith(int8_loop.PREFIX)}
    assert set(loop) == {
        f"{int8_loop.PREFIX}sm{a}-d{d}-{dt}"
        for a in (80, 90)
        for d in int8_loop.LOOP_HEAD_DIMS
        for dt in ("fp16", "bf16")
    }
    for v in loop.values():
        assert v["met"] == (v["value"] <= v["limit"] + 1e-12), v
        if not v["met"]:
            assert v["id"] in int8_loop.NOT_MET and "TMA loads in the int8 kernel were tried" in v["note"], v
    assert all(v["met"] for v in loop.values() if v["arch"] == 80)
    assert (
        "INT8 main loop against the exact forward's default"
        in open(os.path.join(ROOT, store.REPORT_DIR, "report.md")).read()
    )


def test_integer_matrix_instructions_are_read_as_matrix_work():
    """IMMA (sm_80's int8 mma.sync, m16n8k32) and IGMMA (sm_90's int8 warp-group MMA,
    64xNx32) count as matrix instructions of a loop, with their shapes and FLOPs, as
    HMMA and HGMMA do: the int8 forward's main loop is found by them."""
    from tools.static_report import sass

    listing = "\n".join(
        [
            "        /*0100*/                   IMMA.16832.S8.S8.SAT R4, R8, R12, R4 ;",
            "        /*0110*/                   HMMA.16816.F32 R20, R24, R28, R20 ;",
            "        /*0120*/                   IGMMA.64x64x32.S8.S8 gdesc[UR4], RZ, !UPT ;",
            "        /*0130*/                   HGMMA.64x128x16.F32 R40, gdesc[UR8], R40 ;",
            "        /*0140*/              @P0 BRA 0x100 ;",
        ]
    )
    (loop,) = sass.loops(sass.parse(listing))
    assert loop.matrix_instrs == 4
    assert loop.mma_shapes() == {"IMMA.16832": 1, "HMMA.16816": 1, "IGMMA.64x64x32": 1, "HGMMA.64x128x16": 1}
    warps = 4
    assert (
        loop.mma_flops(warps)
        == (2 * 16 * 8 * 32 + 2 * 16 * 8 * 16) * warps + (2 * 64 * 64 * 32 + 2 * 64 * 128 * 16) * warps / 4
    )
    assert sass.main_loop(sass.parse(listing)) is not None
