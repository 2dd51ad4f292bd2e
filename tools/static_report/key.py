"""What keys a row of the static report. Two keys, a fast one and an exact one:

* source_key(): a hash of the code every row is compiled and analysed from. A row is kept
  by --resume while it is the same: a comment, a docstring, a line moved, an edit of the
  launcher's other host code (launcher.py, flash/ops.py, launch.py, select.py, bias_form.py
  outside BIAS_16BIT_ALIGN; int8/ops.py, int8/quant.py outside qk_pieces and K_BLOCK) or of the tile
  table (tiles.py) keeps every row, with nothing run. An edit of the kernels' code
  (flash/kernels.py, int8/kernels.py and flash/sparse_kernels.py), of their calling
  convention (flash/abi.py, hashed whole), of the sparse rows' build and analysis
  (tools/static_report/sparse.py, hashed whole), of the head-dim split
  (limits.py), of the SASS analysis (sass.py, key.ANALYSIS) or of the functions that
  build, compile and read a row (ROW_FUNCTIONS, found by name in any module of
  tools/static_report, so they may move between its modules) changes it.
* build.code_key(): a hash of what one row's figures are a function of: the Triton IR of
  its kernel (Triton's front end, a few hundredths of a second a row), its target,
  options and analysis. Where the source key changed, --resume keeps each row whose job
  this checkout builds to the row's code key, and compiles only the rest: a refactor of
  the kernels' source that compiles to the same code (a helper moved to another module,
  a variable renamed outside the kernels) costs minutes, not a recompilation.

compile_spec() is what a row is compiled from besides the code (its tile and variant).
Not in either key: triton's own files beyond its version.
"""

from __future__ import annotations

import ast
import hashlib
import os

from .compile import Job

# What a row's figures depend on besides triton and the row's own tile: the kernels'
# code, the limits that split the head dim, the SASS analysis, and the functions of this
# tool that compile and read a row. A row is kept (--resume) while this key is the same.
_ROW_MODULES = (
    "attnkit/kernels/flash/kernels.py",
    "attnkit/kernels/flash/abi.py",
    "attnkit/kernels/int8/kernels.py",
    "attnkit/kernels/limits.py",
    "tools/static_report/sass.py",
    # The block-sparse kernels and what builds and reads their rows (hashed whole; also in
    # the sparse rows' code keys, not in the others').
    "attnkit/kernels/flash/sparse_kernels.py",
    "tools/static_report/sparse.py",
)
ROW_FUNCTIONS = (
    "compile_job",
    "source_of",
    "_flash_source",
    "_int8_source",
    "_int8",
    "Build",
    "_front",
    "code_key",
    "code_hash",
    "analysis_key",
    "analyse",
    "_read_cubin",
    "_compile",
    "_signature",
    "_tool",
    "Result",
    "Job",
)
# The host helpers a row's build reads outside the modules above (the alignment a 16-bit
# bias is read at), each with the module it lives in, in the order they are hashed. A
# helper not found there is an error: a moved helper is moved here too, never silently
# left out of the key. (The flash kernels' calling convention, flash/abi.py, is hashed
# whole: _ROW_MODULES.)
_ROW_HELPERS = (
    ("BIAS_16BIT_ALIGN", "attnkit/kernels/bias_form.py"),
    # The consumer targets' tensor rate (their rows' code keys hold it too: build.code_key).
    ("CONSUMER_TENSOR_FLOPS", "tools/static_report/compile.py"),
)
# The host helpers of attnkit/kernels/int8/quant.py that compile_job reads (the int8 head-dim
# split, the keys per K scale); the rest of that module is host code.
_INT8_HELPERS = ("qk_pieces", "K_BLOCK")
# What reads a compiled kernel into a row's figures, besides sass.py (hashed whole): these
# definitions, found by name in any module of the tool (analysis_definitions).
ANALYSIS = ("analyse", "_read_cubin", "_tool", "Result", "TENSOR_FLOPS_PER_CLOCK", "INT8_RATE", "ISSUE_PER_CLOCK")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _NoDocstrings(ast.NodeTransformer):
    """Docstrings left out: like comments, they cannot change a compiled kernel."""

    def _strip(self, node):
        self.generic_visit(node)
        body = getattr(node, "body", None)
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
        return node

    visit_Module = visit_FunctionDef = visit_ClassDef = visit_AsyncFunctionDef = _strip


def _code(source: str) -> ast.Module:
    return _NoDocstrings().visit(ast.parse(source))


def _named(tree: ast.Module, names) -> list[str]:
    out = []
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names:
            out.append(ast.dump(n))
        elif isinstance(n, (ast.Assign, ast.AnnAssign)) and assigned_names(n) & set(names):
            out.append(ast.dump(n))
    return out


def assigned_names(node: ast.AST) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {x.id for t in targets for x in ast.walk(t) if isinstance(x, ast.Name)}  # a, b = ... too


def source_key(root: str = _ROOT) -> str:
    """A hash of what every row is compiled and analysed from (see _ROW_MODULES): the code
    only, so a comment, a docstring, a line moved or an edit of the host code elsewhere
    keeps it; the tile lists are not in it (each row carries its own tile)."""
    import triton

    h = hashlib.sha256(f"triton {triton.__version__}\n".encode())
    for rel in _ROW_MODULES:
        with open(os.path.join(root, rel)) as f:
            h.update(ast.dump(_code(f.read())).encode())
    trees: dict[str, ast.Module] = {}
    helpers = []
    for name, rel in _ROW_HELPERS:
        if rel not in trees:
            with open(os.path.join(root, rel)) as f:
                trees[rel] = _code(f.read())
        found = _named(trees[rel], (name,))
        if len(found) != 1:
            raise RuntimeError(f"source_key: {name} not found (once) in {rel}: update _ROW_HELPERS")
        helpers.append(found[0])
    h.update("".join(helpers).encode())
    with open(os.path.join(root, "attnkit/kernels/int8/quant.py")) as f:
        h.update("".join(_named(_code(f.read()), _INT8_HELPERS)).encode())
    here = os.path.join(root, "tools", "static_report")
    found = {}
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name)) as f:
                tree = _code(f.read())
            for n in tree.body:
                if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in ROW_FUNCTIONS:
                    found[n.name] = ast.dump(n)
    missing = set(ROW_FUNCTIONS) - set(found)
    if missing:
        raise RuntimeError(f"source_key: {sorted(missing)} not found in tools/static_report")
    for name in ROW_FUNCTIONS:
        h.update(found[name].encode())
    # The constants the analysis reads (ANALYSIS): what the code key holds, this key holds.
    h.update(analysis_definitions(here).encode())
    return h.hexdigest()[:16]


def analysis_definitions(here: str) -> str:
    """The definitions named in ANALYSIS, each found once in the tool's modules (in
    ``here``), in ANALYSIS's order: moving one to another module keeps the text."""
    found: dict[str, list[str]] = {}
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name)) as f:
                tree = _code(f.read())
            for wanted in ANALYSIS:
                found.setdefault(wanted, []).extend(_named(tree, (wanted,)))
    wrong = [n for n in ANALYSIS if len(found.get(n, ())) != 1]
    if wrong:
        raise RuntimeError(
            f"static report: {wrong} not defined exactly once in tools/static_report: update key.ANALYSIS"
        )
    return "".join(found[n][0] for n in ANALYSIS)


def compile_spec(job: Job) -> tuple:
    """What a row is compiled from besides the source: its tile and its variant (not its
    budget or whether it is a list's default, which only gate or label it)."""
    return (
        job.kernel,
        job.head_dim,
        job.dtype,
        tuple(job.config),
        job.arch,
        job.bias,
        job.causal,
        job.tma,
        job.warp_specialize,
        job.piece,
        job.grads,
        job.maxnreg,
    )
