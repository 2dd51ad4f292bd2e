"""attnkit's import graph: no circle among its modules, attnkit.parallel free of diffusers,
and no import inside a function between attnkit modules (which would hide a circle)
beyond the few lazy ones listed here, each with its reason.

Read from the source (every ``import`` and ``from ... import`` in attnkit/**, those inside
functions included), not from what an import happens to load.
"""

from __future__ import annotations

import ast
from pathlib import Path

import attnkit

PACKAGE = Path(attnkit.__file__).parent

# (importing module or package prefix, imported module or package prefix): why the import
# waits for its first use. A prefix matches the module and everything under it.
LAZY_ALLOWED = {
    ("attnkit.__main__", "attnkit.info"): "the `attnkit info` command: loaded only when that command runs",
    ("attnkit.__main__", "attnkit.bench"): "the `attnkit bench` command: heavy (matplotlib, tqdm, model "
    "builders), loaded only when that command runs",
    ("attnkit.backends.triton", "attnkit.kernels"): "the Triton kernels import triton (an optional extra), "
    "only when the triton backend runs",
    ("attnkit.backends.int8", "attnkit.kernels"): "the INT8 kernel imports triton (an optional extra), only "
    "when the int8 backend runs",
    ("attnkit.block_masks", "attnkit.kernels"): "the block-sparse kernel imports triton (an optional extra), "
    "only when a BlockMask call runs on a GPU",
    ("attnkit.choose.lossy", "attnkit.backends.int8"): "auto(lossy='int8') only: the int8 backend's module "
    "imports attnkit.kernels' limits, which importing attnkit "
    "must not (a later `import attnkit.kernels` without triton "
    "would then succeed instead of naming the extra)",
    ("attnkit.bench.cli", "attnkit.parallel.bench"): "`attnkit bench --parallel`: the multi-GPU benchmark "
    "(torch.distributed) loaded only when that command runs",
}


def _module_names() -> dict[str, Path]:
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ["attnkit", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


MODULES = _module_names()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(name: str) -> str | None:
    """The attnkit module ``name`` is, or the one it lies in (``pkg.mod.attr`` -> ``pkg.mod``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(name: str):
    """(imported attnkit module, line, whether inside a function) for every import of ``name``'s source."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    package = name if _is_package(name) else name.rpartition(".")[0]
    found = []

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name == "attnkit" or alias.name.startswith("attnkit."):
                        found.append((_resolve(alias.name), child.lineno, in_function))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    source = ".".join(base + ([child.module] if child.module else []))
                else:
                    source = child.module or ""
                if source == "attnkit" or source.startswith("attnkit."):
                    for alias in child.names:
                        target = f"{source}.{alias.name}"
                        found.append((target if target in MODULES else _resolve(source), child.lineno, in_function))
            visit(child, inner)

    visit(tree, False)
    return [(target, line, lazy) for target, line, lazy in found if target and target != name]


GRAPH = {name: _imports(name) for name in MODULES}


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in {t for t, _, _ in GRAPH[v]}:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            strong(v)
    return out


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_no_import_circle_among_attnkit_modules():
    assert _cycles() == [], "attnkit modules that import each other in a circle"


def test_parallel_imports_nothing_of_diffusers():
    bad = []
    for name, path in MODULES.items():
        if not _under(name, "attnkit.parallel"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                sources = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                sources = [node.module or ""] if not node.level else []
            else:
                continue
            bad += [f"{name}:{node.lineno} imports {s}" for s in sources if _under(s, "diffusers")]
        bad += [f"{name}:{line} imports {t}" for t, line, _ in GRAPH[name] if _under(t, "attnkit.diffusers")]
    assert not bad, "attnkit.parallel must not import diffusers nor attnkit.diffusers:\n" + "\n".join(bad)


def test_no_hidden_import_between_attnkit_modules():
    lazy = {(name, line, target) for name, imports in GRAPH.items() for target, line, inside in imports if inside}
    unexplained = [
        f"{name}:{line} imports {target} inside a function"
        for name, line, target in sorted(lazy)
        if not any(_under(name, who) and _under(target, what) for who, what in LAZY_ALLOWED)
    ]
    assert not unexplained, (
        "an import inside a function between attnkit modules hides the import graph; import at the top, "
        "or add it to LAZY_ALLOWED with the reason:\n" + "\n".join(unexplained)
    )


def test_the_core_and_the_choosers_import_nothing_of_diffusers():
    """The choosers, the backends and the masks sit below the diffusers wing."""
    low = ("attnkit.choose", "attnkit.backends", "attnkit.masks", "attnkit.errors", "attnkit.text")
    bad = [
        f"{name}:{line} imports {target}"
        for name, imports in GRAPH.items()
        if any(_under(name, p) for p in low)
        for target, line, _ in imports
        if _under(target, "attnkit.diffusers")
    ]
    assert not bad, "\n".join(bad)


def test_the_hooks_import_nothing_of_attnkit_but_each_other():
    """attnkit/diffusers/hooks.py and the hooks_* modules it gathers (every change attnkit
    makes to diffusers) sit below what they call: attnkit's side is connected at import."""
    hooks = {name for name in MODULES if name.startswith("attnkit.diffusers.hooks")}
    bad = [
        f"{name}:{line} imports {target}"
        for name in sorted(hooks)
        for target, line, _ in GRAPH[name]
        if target not in hooks
    ]
    assert "attnkit.diffusers.hooks" in hooks and len(hooks) > 1, sorted(hooks)
    assert not bad, "the hooks modules import nothing of attnkit but each other:\n" + "\n".join(bad)
