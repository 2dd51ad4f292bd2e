"""`python -m attnkit.kernels.inspect`: the shipped kernel configurations compiled for
sm_80 and sm_90 without a GPU, their SASS read, and the gate (spills, shared memory,
duplicated work, instr/score budgets).

The full report (every autotuning config x head dims 40-512 x fp16 / bf16 / fp32 x
three bias variants x causal or not x TMA or pointer loads x six kernels x two targets,
thousands of compilations) takes an hour on two cores without Triton's cache: run it
with `make inspect`; it writes bench/results/static/. Here a quick subset: the default
config of each kernel at head dims 40 (two head-dim pieces) and 128, causal (both of
its loops), with a full bias (the most registers), fp16 everywhere and fp32 for the
forward, on both targets; and the gate's refusals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("triton")

KERNELS = ("fwd", "dkdv", "dq", "fwd_lo", "dkdv_dbias", "dq_dbias")


def _run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    # A process of its own, without TRITON_INTERPRET: the kernels must be defined for the
    # compiler, not the interpreter.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-m", "attnkit.kernels.inspect", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


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
        kernel, d, dtype, bias, causal, loads, cfg, arch, regs, stack, smem, matrix, isc, budget, limit, exp, dup = row[:17]
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
    res = _run("--kernel", "fwd", "--head-dim", "40", "--dtype", "fp16", "--arch", "90", "--bias", "full",
               "--causal", "0", "--loads", "ptr", "--config=128,64,4,2")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAIL: spills" in res.stdout


def test_duplicated_work_and_a_budget_fail_the_run():
    """8 warps on a 64-row score tile on sm_90: both warp groups compute the whole QK^T
    tile and every exponential (two 64-row warp-group MMAs on 64 rows); and a budget
    below what a tile compiles to."""
    res = _run("--kernel", "dq", "--head-dim", "64", "--dtype", "fp16", "--arch", "90", "--bias", "none",
               "--causal", "0", "--loads", "tma", "--config=64,32,8,2")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "duplicated matrix work" in res.stdout and "duplicated exponentials" in res.stdout
    res = _run("--kernel", "dq", "--head-dim", "64", "--dtype", "fp16", "--arch", "90", "--bias", "none",
               "--causal", "0", "--loads", "tma", "--config=128,64,8,2", "--budget", "0.1")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "> budget 0.1" in res.stdout


def test_a_register_cap_is_compiled_and_recorded(tmp_path):
    """A sixth --config field caps ptxas's registers per thread (TileConfig.maxnreg): the
    row is named for it, compiles within it (here a cap far below what the tile needs,
    so it spills and fails), and the JSON record keeps it."""
    res = _run("--kernel", "fwd", "--head-dim", "64", "--dtype", "fp16", "--arch", "80", "--bias", "none",
               "--causal", "0", "--config=64,64,4,2,0,64", "--out", str(tmp_path))
    assert res.returncode == 1, res.stdout + res.stderr
    (row,) = _rows(res.stdout)
    assert row[6] == "M64-N64-w4-s2-reg64" and 0 < int(row[8]) <= 64 and int(row[9]) > 0, row
    (rec,) = json.loads((tmp_path / "report.json").read_text())["rows"]
    assert rec["maxnreg"] == 64 and rec["config"] == "M64-N64-w4-s2-reg64" and rec["stack"] > 0

def test_report_files(tmp_path):
    """--out writes the JSON record (triton version, date, commit, definitions, every
    row) and the markdown report, with the targets the run covers."""
    res = _run("--kernel", "fwd", "--head-dim", "64", "--dtype", "fp16", "--arch", "90", "--bias", "none",
               "--causal", "0", "--loads", "tma", "--quick", "--out", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    record = json.loads((tmp_path / "report.json").read_text())
    import triton

    assert record["triton"] == triton.__version__ and record["date"] and record["commit"]
    assert "instr/score" in record["definitions"]
    (row,) = record["rows"]
    assert row["kernel"] == "fwd" and row["arch"] == 90 and row["tma"] and row["loop_length"] > 0
    scores = row["block_m"] * row["block_n"]
    assert row["instr_per_score"] == pytest.approx(row["loop_length"] * row["num_warps"] / scores)
    (verdict,) = [v for v in record["targets"] if v["id"] == "fwd-d64-fp16-none"]
    assert verdict["limit"] == pytest.approx(0.25)
    md = (tmp_path / "report.md").read_text()
    assert "Static figures read from SASS" in md and triton.__version__ in md and "## Targets" in md
    # --render writes the same report again from report.json, compiling nothing; a
    # changed row changes the verdict it reads.
    (tmp_path / "report.md").unlink()
    res = _run("--render", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "report.md").read_text() == md
    record["rows"][0]["instr_per_score"] = 9.0
    (tmp_path / "report.json").write_text(json.dumps(record))
    assert _run("--render", str(tmp_path)).returncode == 0
    again = json.loads((tmp_path / "report.json").read_text())
    (verdict,) = [v for v in again["targets"] if v["id"] == "fwd-d64-fp16-none"]
    assert verdict["value"] == 9.0 and not verdict["met"]


def test_an_interrupted_run_writes_a_partial_report(tmp_path):
    """SIGTERM (a scheduler's time limit) or Ctrl-C: the rows compiled so far are kept in
    a report that says it is partial, and the exit status says the run did not finish."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.Popen([sys.executable, "-m", "attnkit.kernels.inspect", "--kernel", "fwd", "--head-dim", "64",
                             "--dtype", "fp16", "--arch", "90", "--jobs", "1", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    for line in proc.stdout:  # wait for the first compiled row, then stop the run
        lines.append(line)
        if _rows(line):
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, "".join(lines) + out + err
    record = json.loads((tmp_path / "report.json").read_text())
    assert record["partial"].endswith("compilations (interrupted)")
    done, total = (int(x) for x in record["partial"].split(" compilations")[0].split(" of "))
    assert 1 <= done < total and len(record["rows"]) == done
    assert "**Partial report:" in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "report.previous.json").exists()
    # A row standing for the tutorial kernel's (--reference): resuming without the
    # tutorial's file keeps it.
    record["reference"] = [dict(record["rows"][0], kernel="ref_fwd")]
    (tmp_path / "report.json").write_text(json.dumps(record))
    # --resume keeps those rows (same commit, kernels and analysis) and compiles the rest.
    res = _run("--kernel", "fwd", "--head-dim", "64", "--dtype", "fp16", "--arch", "90", "--jobs", "1",
               "--out", str(tmp_path), "--resume")
    if "not resuming" in res.stdout and record["dirty"] or record["commit"] == "unknown":
        pytest.skip("--resume needs a git checkout without uncommitted changes in kernels/: " + res.stdout[:200])
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"resuming: {done} of {total} rows kept" in res.stdout
    assert len(_rows(res.stdout)) == total - done
    final = json.loads((tmp_path / "report.json").read_text())
    assert final["partial"] is None and len(final["rows"]) == total
    assert final["rows"][:done] == record["rows"]
    assert final["reference"] == record["reference"] and "the tutorial's rows kept" in final["command"]
    # The report it replaced is kept beside it.
    assert json.loads((tmp_path / "report.previous.json").read_text()) == record


def test_resume_refuses_a_report_of_other_kernels(tmp_path):
    """Rows compiled from other kernels, another triton or a dirty tree are not reused."""
    import triton

    from attnkit.kernels import inspect as insp

    (tmp_path / "report.json").write_text(json.dumps(
        {"triton": triton.__version__, "commit": "0000000", "dirty": False, "rows": []}))
    rows, why = insp.resumable_rows(str(tmp_path))
    assert rows == [] and "differs from commit 0000000" in why
    (tmp_path / "report.json").write_text(json.dumps({"triton": "0.0", "commit": "abc", "rows": []}))
    assert "compiled with triton 0.0" in insp.resumable_rows(str(tmp_path))[1]
    (tmp_path / "report.json").write_text(json.dumps(
        {"triton": triton.__version__, "commit": "abc", "dirty": True, "rows": []}))
    assert "uncommitted changes" in insp.resumable_rows(str(tmp_path))[1]


def test_the_targets_rows_compile_first():
    """An interrupted full run still evaluates the targets: their rows lead the job list."""
    from attnkit.kernels import inspect as insp
    from attnkit.kernels import targets

    jobs = insp.jobs_for(["fwd", "dq"], [64, 320], ["fp32", "fp16"], [80, 90], ["full", "none"], [True, False],
                         quick=False)
    pri = [insp._priority(j) for j in jobs]
    assert pri == sorted(pri) and pri[0] == 0 and pri[-1] == 4
    first = jobs[0]
    assert (first.arch, first.tma, first.causal, first.default, first.dtype) == (90, True, False, True, "fp16")
    assert first.head_dim in targets.FWD_EXACT


def test_resume_ignores_tile_list_edits_but_not_kernel_code():
    """A row is keyed by its own tile and budget: editing CONFIGS keeps the other rows
    resumable; a change to the kernels' code does not."""
    from attnkit.kernels import inspect as insp

    path = os.path.join(os.path.dirname(insp.__file__), "flash_attention.py")
    with open(path) as f:
        src = f.read()
    first_tile = src.index("_C(", src.index("CONFIGS:"))
    edited = src[:first_tile] + "_C(16, 16, 4, 1), " + src[first_tile:]
    assert insp._without_tile_lists(edited) == insp._without_tile_lists(src)
    assert insp._without_tile_lists(src.replace("    return ", "    return 1 + ", 1)) != insp._without_tile_lists(src)


def test_resume_compares_everything_a_row_is_compiled_from():
    """Of flash_attention.py, resume compares what a row is compiled from (the jit
    functions, module-level assignments and classes, the host helpers compile_job calls,
    their imports) and not the launcher's other host code: an argument check edited after
    an hours-long report does not make its rows stale; a kernel, a constant or _align
    edited does. And everything compile_job reads of the module is in what is compared."""
    import ast

    from attnkit.kernels import inspect as insp

    path = os.path.join(os.path.dirname(insp.__file__), "flash_attention.py")
    with open(path) as f:
        src = f.read()

    def same(edited):
        return insp._without_tile_lists(edited, True) == insp._without_tile_lists(src, True)

    def edit(old, new):
        assert src.count(old) >= 1, old
        return src.replace(old, new, 1)

    assert same(edit('            raise ValueError(f"scale={scale} must be finite")',
                     '            raise ValueError(f"scale={scale} is not finite")'))  # _prepare
    assert same(edit('"""FlashAttention-2 in Triton', '"""FlashAttention 2 in Triton'))  # the docstring
    assert not same(edit("        out = tl.dot(a, b, acc, ", "        out = 1 + tl.dot(a, b, acc, "))  # a jit function
    assert not same(edit("    a = 16\n", "    a = 8\n"))  # _align
    assert not same(edit("_TUNE_KEY = (", "_TUNE_KEY = (\"X\", "))  # a module-level assignment

    tree = ast.parse(src)
    compared = set(insp._ROW_HELPERS)
    for n in tree.body:
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            compared |= insp._assigned(n)
        elif isinstance(n, ast.ClassDef) or (isinstance(n, ast.FunctionDef) and any(
                "jit" in ast.dump(d) for d in n.decorator_list)):
            compared.add(n.name)
        elif isinstance(n, ast.ImportFrom) and n.module == "limits":  # limits.py is compared whole
            compared |= {a.asname or a.name for a in n.names}
    with open(insp.__file__) as f:
        inspect_tree = ast.parse(f.read())
    read = {x.attr for n in inspect_tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
            and n.name in insp._ROW_FUNCTIONS for x in ast.walk(n)
            if isinstance(x, ast.Attribute) and isinstance(x.value, ast.Name) and x.value.id == "fa"}
    assert read and read <= compared, read - compared


def test_the_shared_memory_table_is_what_the_committed_report_measured():
    """devices.NEEDS (the calls refused on GPUs with 99 KiB of shared memory per block)
    lists exactly the sm80 default tiles above 101,376 B in the committed report, with
    their bytes: a stale entry would refuse a call that fits, a missing one let a
    backward fail to launch on an RTX 4090."""
    from attnkit.kernels import devices
    from attnkit.kernels import inspect as ni

    path = os.path.join(os.path.dirname(__file__), "..", "..", ni.REPORT_DIR, "report.json")
    with open(path) as f:
        rows = [ni._from_record(r) for r in json.load(f)["rows"]]
    assert devices.NEEDS == ni.shared_memory_needs(rows)


def test_the_report_is_stamped_with_what_the_run_compiled(tmp_path):
    """The commit (and whether kernels/ had changes) is taken when a run starts and
    passed to the report: a commit made during an hours-long run is not what it compiled."""
    from attnkit.kernels import inspect as ni

    ni.write_report([], [], str(tmp_path), ["--jobs", "2"], source=("abc1234", True))
    record = json.loads((tmp_path / "report.json").read_text())
    assert (record["commit"], record["dirty"]) == ("abc1234", True)
    assert "commit abc1234 (with uncommitted changes in kernels/)" in (tmp_path / "report.md").read_text()


