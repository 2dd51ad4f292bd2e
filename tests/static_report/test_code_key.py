"""The static report's code key (tools/static_report/build.py): a row outlives a change of
the source that builds to the same code. The key follows Triton's IR of the row's kernel
(front end only), not the text of its source: a comment, a docstring or a line moved
keeps it, a change of the code, of the options or of the analysis does not; and
`--resume` keeps a row of another source key whose code key this checkout builds, and
compiles it where the code changed."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.static_report._compiled import compiled_run

pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNELS = os.path.join(ROOT, "attnkit", "kernels", "flash", "kernels.py")


# Run in a process of its own, without TRITON_INTERPRET (the test session's kernels are
# the interpreter's): the keys of the source as it is and of edited copies of it.
_KEYS = r"""
import importlib.util, json, sys
from attnkit.kernels.flash import abi
from tools.static_report import build
from tools.static_report.compile import Job

text = open(sys.argv[1]).read()
tmp = sys.argv[2]

def kernels_from(name, edited):
    path = f"{tmp}/{name}.py"
    with open(path, "w") as f:
        f.write(edited)
    spec = importlib.util.spec_from_file_location(f"_edited_kernels_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

def job(**kw):
    base = dict(kernel="fwd", head_dim=64, dtype="fp16", config=(128, 64, 8, 2, 0), arch=90, bias="keypad", causal=True)
    return Job(**{**base, **kw})

out = {}
edits = json.loads(sys.argv[3])
for name, edited in [("same", text)] + [(n, text.replace(old, new, 1)) for n, old, new in edits]:
    module = kernels_from(name, edited)
    build.flash_modules = lambda module=module: (module, abi)
    out[name] = build.code_key(job())
out["tile"] = build.code_key(job(config=(64, 64, 4, 2, 0)))
out["maxnreg"] = build.code_key(job(maxnreg=128))
out["bias"] = build.code_key(job(bias="none"))
build.analysis_key = lambda: "another analysis"
out["analysis"] = build.code_key(job())
build.source_of = lambda job: 1 / 0
out["broken"] = build.code_key(job())
print(json.dumps(out))
"""


def test_the_code_key_follows_the_compiled_code_not_the_text(tmp_path):
    with open(KERNELS) as f:
        text = f.read()
    marker = "    if EMULATE_BF16:"
    assert marker in text and '"""FlashAttention' in text and "input_precision=PRECISION)" in text
    edits = [
        # Comments and a docstring edited at the top: every line of the kernels moves down.
        ("moved", '"""FlashAttention', '# one\n# two\n# three\n"""The FlashAttention'),
        # A blank line and a comment inside a kernel.
        ("inside", marker, "\n    # emulated on the interpreter\n" + marker),
        # Other code: every product accumulated at full fp32 precision.
        (
            "code",
            "out = tl.dot(a, b, acc, input_precision=PRECISION)",
            'out = tl.dot(a, b, acc, input_precision="ieee")',
        ),
    ]
    res = compiled_run("-c", _KEYS, KERNELS, str(tmp_path), json.dumps(edits), timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    keys = json.loads(res.stdout.strip().splitlines()[-1])
    base = keys["same"]
    assert base and len(base) == 24
    assert keys["moved"] == base and keys["inside"] == base
    # Other code, tile, register cap, bias variant or analysis: another key.
    for other in ("code", "tile", "maxnreg", "bias", "analysis"):
        assert keys[other] and keys[other] != base, other
    # A source that does not build has no code key: such a row is compiled again.
    assert keys["broken"] == ""


def _run(*args: str) -> subprocess.CompletedProcess:
    return compiled_run("-m", "tools.static_report", *args)


def test_resume_keeps_a_row_of_another_source_key_by_its_code(tmp_path):
    """A row compiled under another source key (a refactor of the launcher, the kernels
    moved between modules) is kept without compiling when its job builds to the same
    code key; a row whose code changed is compiled again. Rows with no code key (a
    report from before code keys) are not kept across source keys."""
    from tools.static_report import store

    args = (
        *("--kernel", "fwd", "--head-dim", "64", "--dtype", "fp16", "--arch", "80"),
        *("--bias", "none", "--causal", "0", "--quick", "--out", str(tmp_path)),
    )
    first = _run(*args)
    assert first.returncode == 0, first.stdout + first.stderr
    (row,) = store.read_record(str(tmp_path))["rows"]
    assert row["code"] and row["loop_length"] > 0

    def restamp(key: str, **fields) -> None:
        meta = json.loads((tmp_path / "report.json").read_text())
        meta["source_key"] = key
        (tmp_path / "report.json").write_text(json.dumps(meta))
        path = tmp_path / "rows" / "sm80-fwd.jsonl"
        path.write_text(json.dumps(dict(json.loads(path.read_text()), **fields)) + "\n")

    # Another source key, the same code: kept, re-keyed to this checkout's source key.
    restamp("an-earlier-key", regs=7)
    again = _run(*args, "--resume")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "by code: 1 of 1 rows kept" in again.stdout and "0 to compile" in again.stdout
    record = store.read_record(str(tmp_path))
    (kept,) = record["rows"]
    assert kept["regs"] == 7 and kept["code"] == row["code"]  # not compiled: the row as it was
    assert record["source_key"] != "an-earlier-key"
    # Another source key and another code: compiled again.
    restamp("an-earlier-key", code="0" * 24)
    third = _run(*args, "--resume")
    assert third.returncode == 0, third.stdout + third.stderr
    assert "by code: 0 of 1 rows kept" in third.stdout and "1 to compile" in third.stdout
    (fresh,) = store.read_record(str(tmp_path))["rows"]
    assert fresh["regs"] == row["regs"] and fresh["code"] == row["code"]
    # A row without a code key under another source key: not a candidate.
    restamp("an-earlier-key", code="")
    fourth = _run(*args, "--resume")
    assert fourth.returncode == 0 and "resuming: 0 of 1 rows kept" in fourth.stdout
    assert "by code" not in fourth.stdout


def test_every_row_of_the_committed_report_has_its_code_key():
    """The committed report's rows each carry the code key they were built to, so the
    next change of the kernels' source that builds to the same code keeps them."""
    from tools.static_report import store

    rows = store.read_record(os.path.join(ROOT, store.REPORT_DIR))["rows"]
    assert rows and all(len(r.get("code") or "") == 24 for r in rows)
