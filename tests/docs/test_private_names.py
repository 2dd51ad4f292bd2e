"""A private name (one leading underscore) of an attnkit module is used only inside the
package that holds the module, and its subpackages: not by another package of attnkit,
not by the tools, the benchmarks or the tests. What a test needs of a module is public
(a setting through attnkit.kernels.launcher.override, a recorded launch through
launcher.recording, a plan's describe()), so a refactor inside a package breaks no
caller outside it. And no test flips a module's switch: an attnkit module's
UPPER_CASE attribute is never set by a test (the launcher's settings are changed with
override(), and a table a test needs replaced is a setting; the one exception, _TABLES
below, is data a GPU fills, not a switch).

The same holds for the tools package (tools/: the static report, the record generators),
whose tests are outside it.

Read from the source (no import): every `from X import _y`, every `from X._m import y`
and `import X._y`, every `alias._y` and `alias.m._y` where alias names an attnkit or tools
module (imported, `import attnkit` included, or through importlib.import_module), and
every setattr(alias or alias.m, "_y" or "SWITCH", ...)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("attnkit", "tests", "tools", "bench")
FIRST_PARTY = ("attnkit", "tools")  # the packages whose private names are checked


def _first_party(name: str) -> bool:
    return name.split(".")[0] in FIRST_PARTY


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
    return _findings_in(ast.parse(path.read_text(encoding="utf-8")), path, module, package)


def _scripts(tree: ast.AST) -> list[ast.Module]:
    """The Python programs a file holds as strings (a test's subprocess script): each
    string constant of several lines that names attnkit or tools and parses as Python."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "\n" in node.value:
            if not any(f"{top}." in node.value or f"import {top}" in node.value for top in FIRST_PARTY):
                continue
            try:
                script = ast.parse(textwrap.dedent(node.value))
            except SyntaxError:
                continue
            for child in ast.walk(script):  # report the string's line
                if hasattr(child, "lineno"):
                    child.lineno = node.lineno
            out.append(script)
    return out


def _findings_in(tree: ast.Module, path: Path, module: str, package: str) -> list[str]:
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            setattr(child, "parent", parent)
    out: list[str] = []
    aliases: dict[str, str] = {}  # local name -> attnkit module it names

    def use(line: int, target_module: str, name: str, how: str) -> None:
        if _private(name) and not _inside(package, _package_of(target_module)):
            out.append(f"{path.relative_to(ROOT)}:{line}: {how} {target_module}.{name}")

    def use_path(line: int, dotted: str, how: str) -> None:
        """A private module on the path (``from attnkit.choose._x import y``)."""
        parts = dotted.split(".")
        for i in range(1, len(parts)):
            if _private(parts[i]) and not _inside(package, ".".join(parts[:i])):
                out.append(f"{path.relative_to(ROOT)}:{line}: {how} the private module {'.'.join(parts[: i + 1])}")
                return

    def resolve_chain(node: ast.AST) -> tuple[str, list[str]] | None:
        """(the attnkit module a chain of attributes reaches, the attributes after it)."""
        attrs: list[str] = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in aliases:
            return None
        target, attrs = aliases[node.id], attrs[::-1]
        while attrs and _is_module(f"{target}.{attrs[0]}"):
            use(node.lineno, target, attrs[0], "reads")
            target = f"{target}.{attrs.pop(0)}"
        return target, attrs

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _resolve(node, package)
            if not _first_party(base):
                continue
            use_path(node.lineno, base, "imports from")
            for a in node.names:
                full = f"{base}.{a.name}"
                if _is_module(full):
                    use(node.lineno, base, a.name, "imports the private module")
                    aliases[a.asname or a.name] = full
                else:
                    use(node.lineno, base, a.name, "imports")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if _first_party(a.name):
                    parts = a.name.split(".")
                    for i, part in enumerate(parts[1:], 1):
                        use(node.lineno, ".".join(parts[:i]), part, "imports the private module")
                    if a.asname:
                        aliases[a.asname] = a.name
                    else:
                        aliases[parts[0]] = parts[0]
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func, args = node.value.func, node.value.args
            if (
                getattr(func, "attr", getattr(func, "id", "")) == "import_module"
                and args
                and isinstance(args[0], ast.Constant)
                and _first_party(str(args[0].value))
            ):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        aliases[t.id] = str(args[0].value)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
            found = resolve_chain(node)
            if found and found[1]:
                use(node.lineno, found[0], found[1][0], "reads")
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func
            name = getattr(func, "attr", getattr(func, "id", ""))
            target, attr = node.args[0], node.args[1]
            found = resolve_chain(target) if name == "setattr" else None
            if found and not found[1] and isinstance(attr, ast.Constant) and isinstance(attr.value, str):
                use(node.lineno, found[0], attr.value, "sets")
                if module.startswith("tests") and attr.value.isupper() and attr.value not in _TABLES:
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno}: flips the switch {found[0]}.{attr.value}")
    for script in _scripts(tree) if module.startswith("tests") and path != Path(__file__) else ():
        out += _findings_in(script, path, module, "tests")  # a script runs outside every package
    return sorted(set(out), key=out.index)


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
        "import attnkit.diffusers.binding\n"
        "from attnkit.choose._gone import helper\n"
        "from tools.records import generate as gen\n"
        "def test_more(monkeypatch):\n"
        "    monkeypatch.setattr(attnkit.diffusers.binding, '_SAID', set())\n"
        "    attnkit.diffusers.binding._ORIGIN.clear()\n"
        "    monkeypatch.setattr(gen, 'WITHDRAWN', {})\n"
        "    gen._summary\n"
        'SCRIPT = """\nfrom attnkit.choose import tune_cache\ntune_cache._tmp_prefix(\'x\')\n"""\n'
    )
    path.write_text(sample, encoding="utf-8")
    try:
        found = _findings(path)
    finally:
        path.unlink()
    assert sorted(f.split(": ", 1)[1] for f in found) == sorted(
        [
            "imports attnkit.kernels.flash.launch._Streams",
            "reads attnkit.kernels.flash.select._TUNERS",
            "reads attnkit.choose.tune_cache._keep_owner",
            "flips the switch attnkit.kernels.flash.select.INTERPRET_TILE",
            "imports from the private module attnkit.choose._gone",
            "sets attnkit.diffusers.binding._SAID",
            "flips the switch attnkit.diffusers.binding._SAID",
            "reads attnkit.diffusers.binding._ORIGIN",
            "flips the switch tools.records.generate.WITHDRAWN",
            "reads tools.records.generate._summary",
            "reads attnkit.choose.tune_cache._tmp_prefix",
        ]
    ), found
