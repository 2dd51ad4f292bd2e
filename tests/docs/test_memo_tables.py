"""Every table attnkit keeps across calls says what bounds it and what makes it stale.

Read from the source: a module-level name bound to an empty dict, set or weak table
(``{}``, ``dict()``, ``set()``, ``weakref.WeakKeyDictionary()``, ...) and every function
under ``functools.lru_cache`` or ``functools.cache`` has a comment on its line or in the
lines just above it, up to a blank line (for a function: a docstring or a comment above
its decorator), so a reader
learns why it cannot grow without end and when an entry would be wrong. A cache with
no size bound must be one whose keys are bounded (devices, dtypes, classes)."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_EMPTY_CALLS = {"dict", "set", "WeakKeyDictionary", "WeakValueDictionary", "WeakSet", "OrderedDict"}


def _is_table(value: ast.AST | None) -> bool:
    if isinstance(value, ast.Dict) and not value.keys:
        return True
    if isinstance(value, ast.Call) and not value.args and not value.keywords:
        name = getattr(value.func, "attr", getattr(value.func, "id", ""))
        return name in _EMPTY_CALLS
    return False


def _is_memo(fn: ast.AST) -> bool:
    for d in getattr(fn, "decorator_list", ()):
        target = d.func if isinstance(d, ast.Call) else d
        if getattr(target, "attr", getattr(target, "id", "")) in ("lru_cache", "cache"):
            return True
    return False


def _undocumented(path: Path, label: str | None = None) -> list[str]:
    text = path.read_text(encoding="utf-8")
    comments = {t.start[0] for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT}
    lines = text.splitlines()

    def said(line: int) -> bool:
        """A comment on ``line``, or a comment line among the lines above it, up to a blank one."""
        if line in comments:
            return True
        line -= 1
        while line >= 1 and lines[line - 1].strip():
            if lines[line - 1].lstrip().startswith("#"):
                return True
            line -= 1
        return False

    where = label or str(path.relative_to(ROOT))
    out = []
    for node in ast.parse(text).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and _is_table(node.value):
            if not said(node.lineno):
                out.append(f"{where}:{node.lineno}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_memo(node):
            top = min(d.lineno for d in node.decorator_list)
            if ast.get_docstring(node) is None and not said(top):
                out.append(f"{where}:{node.lineno} ({node.name})")
    return out


def test_every_kept_table_is_documented():
    found = []
    for path in sorted((ROOT / "attnkit").rglob("*.py")):
        found += _undocumented(path)
    assert not found, "tables kept across calls with no word on their bound and staleness:\n" + "\n".join(found)


def test_the_check_sees_an_undocumented_table(tmp_path):
    sample = tmp_path / "memo_sample.py"
    sample.write_text(
        "import functools, weakref\n\nA = {}\n\n# bounded by x; never stale\nB = set()\n"
        "C: dict = dict()\nD = weakref.WeakSet()  # by its objects\nE = {}\n\n@functools.lru_cache(None)\n"
        "def f(x):\n    return x\n",
        encoding="utf-8",
    )
    found = _undocumented(sample, "sample")
    assert [f.split(":", 1)[1] for f in found] == ["3", "12 (f)"], found
