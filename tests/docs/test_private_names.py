"""A private name (one leading underscore) of an attnkit module is used only inside the
package that holds the module, and its subpackages: not by another package of attnkit,
not by the tools, the benchmarks or the tests. What a test needs of a module is public
(a setting through attnkit.kernels.launcher.override, a recorded launch through
launcher.recording, a plan's describe()), so a refactor inside a package breaks no
caller outside it. And no test flips a module's switch: an attnkit module's
UPPER_CASE attribute is never set by a test (the launcher's settings are changed with
override(), and a table a test needs replaced is a setting).

Read from the source (no import): every `from X import _y`, every `import X._y`, every
`alias._y` where alias names an attnkit module (imported, or through
importlib.import_module), and every setattr(alias, "_y" or "SWITCH", ...)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("attnkit", "tests", "tools", "bench")


def _module_name(path: Path) -> tuple[str, str]:
    """(module, its package) of a file under ROOT."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _is_module(name: str) -> bool:
    """Whether an attnkit dotted name is a module or a package of the tree."""
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _package_of(module: str) -> str:
    base = ROOT.joinpath(*module.split("."))
    return module if (base / "__init__.py").is_file() else module.rpartition(".")[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _inside(importer_package: str, target_package: str) -> bool:
    return importer_package == target_package or importer_package.startswith(target_package + ".")


def _resolve(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


def _findings(path: Path) -> list[str]:
    module, package = _module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[str] = []
    aliases: dict[str, str] = {}  # local name -> attnkit module it names

    def use(line: int, target_module: str, name: str, how: str) -> None:
        if _private(name) and not _inside(package, _package_of(target_module)):
            out.append(f"{path.relative_to(ROOT)}:{line}: {how} {target_module}.{name}")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _resolve(node, package)
            if not base.startswith("attnkit"):
                continue
            for a in node.names:
                full = f"{base}.{a.name}"
                if _is_module(full):
                    use(node.lineno, base, a.name, "imports the private module")
                    aliases[a.asname or a.name] = full
                else:
                    use(node.lineno, base, a.name, "imports")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("attnkit"):
                    parts = a.name.split(".")
                    for i, part in enumerate(parts[1:], 1):
                        use(node.lineno, ".".join(parts[:i]), part, "imports the private module")
                    if a.asname:
                        aliases[a.asname] = a.name
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func, args = node.value.func, node.value.args
            if (
                getattr(func, "attr", getattr(func, "id", "")) == "import_module"
                and args
                and isinstance(args[0], ast.Constant)
                and str(args[0].value).startswith("attnkit")
            ):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        aliases[t.id] = str(args[0].value)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            use(node.lineno, aliases[node.value.id], node.attr, "reads")
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func
            name = getattr(func, "attr", getattr(func, "id", ""))
            target, attr = node.args[0], node.args[1]
            if (
                name == "setattr"
                and isinstance(target, ast.Name)
                and target.id in aliases
                and isinstance(attr, ast.Constant)
                and isinstance(attr.value, str)
            ):
                use(node.lineno, aliases[target.id], attr.value, "sets")
                if module.startswith("tests") and attr.value.isupper() and attr.value not in _TABLES:
                    out.append(
                        f"{path.relative_to(ROOT)}:{node.lineno}: flips the switch {aliases[target.id]}.{attr.value}"
                    )
    return out


# Data a test may stand in for (not a switch of how code runs): the shared-memory table a
# GPU would fill.
_TABLES = frozenset({"NEEDS"})


def test_no_private_name_of_another_package_and_no_switch_flipped():
    found = []
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" in path.parts or ".venv" in path.parts:
                continue
            found += _findings(path)
    assert not found, "private names used outside their package, or switches flipped:\n" + "\n".join(found)


def test_the_check_sees_what_it_forbids():
    """The reader finds each form it forbids (a check that cannot fail checks nothing)."""
    path = ROOT / "tests" / "docs" / "_private_names_sample.py"
    sample = (
        "import importlib\n"
        "from attnkit.kernels.flash.launch import _Streams\n"
        "from attnkit.choose import tune_cache\n"
        "fl = importlib.import_module('attnkit.kernels.flash.select')\n"
        "x = fl._TUNERS\n"
        "tune_cache._keep_owner\n"
        "def test(monkeypatch):\n"
        "    monkeypatch.setattr(fl, 'INTERPRET_TILE', None)\n"
    )
    path.write_text(sample, encoding="utf-8")
    try:
        found = _findings(path)
    finally:
        path.unlink()
    assert [f.split(": ", 1)[1] for f in found] == [
        "imports attnkit.kernels.flash.launch._Streams",
        "reads attnkit.kernels.flash.select._TUNERS",
        "reads attnkit.choose.tune_cache._keep_owner",
        "flips the switch attnkit.kernels.flash.select.INTERPRET_TILE",
    ], found
