"""The README's Layout section describes the tree as it is: every path it names exists,
and it names every module and subpackage of attnkit/ and every top-level folder; every
package folder under attnkit/ has its own line, and that line names each of its modules
(by its stem, as a word of the description). And no module outside the kernels is over
MODULE_LINES lines: one that grows past it is split by job, with its own line here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _layout_lines() -> dict[str, str]:
    """path -> description, for each line of the fenced block in the README's "## Layout" section."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("\n## Layout\n") :]
    section = section[: section.find("\n## ", 1) if "\n## " in section[1:] else len(section)]
    block = re.search(r"```\n(.*?)\n```", section, re.S)
    assert block, "the README's Layout section has no fenced block of `path  description` lines"
    lines = {}
    for line in block.group(1).splitlines():
        if line.strip():
            path, _, description = line.strip().partition(" ")
            lines[path] = description
    return lines


def _layout_paths() -> list[str]:
    """The first word of each line of the fenced block in the README's "## Layout" section."""
    return list(_layout_lines())


def _tracked() -> set[str]:
    """Tracked files that exist on disk; the filesystem where there is no git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        return {p for p in out.decode().split("\0") if p and (ROOT / p).is_file()}
    except (OSError, subprocess.CalledProcessError):
        skip = {"__pycache__", ".git", ".venv", ".pytest_cache", ".mypy_cache", ".ruff_cache", "build"}
        return {
            str(p.relative_to(ROOT))
            for p in ROOT.rglob("*")
            if p.is_file()
            and not skip.intersection(p.relative_to(ROOT).parts)
            and not any(part.endswith(".egg-info") for part in p.parts)
        }


def _names(path: str, tracked: set[str]) -> bool:
    if path.endswith("/"):
        return any(f.startswith(path) for f in tracked)
    return path in tracked


def test_every_path_in_the_layout_exists():
    tracked = _tracked()
    missing = [p for p in _layout_paths() if not _names(p, tracked)]
    assert not missing, f"the README's Layout names paths that are not in the tree: {missing}"


def test_the_layout_names_every_package_module_and_top_level_folder():
    tracked = _tracked()
    named = set(_layout_paths())
    package, folders = set(), set()
    for f in tracked:
        parts = f.split("/")
        if parts[0] == "attnkit" and len(parts) == 2 and parts[1].endswith(".py"):
            package.add(f)
        elif parts[0] == "attnkit" and len(parts) > 2 and parts[1] != "__pycache__":
            package.add(f"attnkit/{parts[1]}/")
        if len(parts) > 1:
            folders.add(parts[0] + "/")
    # a module or subpackage of attnkit/ by its own line; a top-level folder by any line in it
    unnamed = sorted(package - named) + sorted(d for d in folders if not any(n.startswith(d) for n in named))
    assert not unnamed, f"the README's Layout does not name: {unnamed}"


def test_every_attnkit_package_has_a_line_naming_each_of_its_modules():
    lines = _layout_lines()
    packages: dict[str, set[str]] = {}
    for f in _tracked():
        parts = f.split("/")
        if parts[0] == "attnkit" and len(parts) > 2 and f.endswith(".py") and "__pycache__" not in parts:
            folder = "/".join(parts[:-1]) + "/"
            packages.setdefault(folder, set()).add(parts[-1][:-3])
    assert packages, "no package under attnkit/: the test reads nothing"
    unnamed_packages = sorted(p for p in packages if p not in lines)
    assert not unnamed_packages, f"the README's Layout has no line for: {unnamed_packages}"
    unnamed = []
    for folder, stems in sorted(packages.items()):
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", lines[folder]))
        unnamed += [f"{folder}{stem}.py" for stem in sorted(stems) if stem != "__init__" and stem not in words]
    assert not unnamed, f"the README's Layout line of each package does not name: {unnamed}"


# The most lines a module outside attnkit/kernels/ has (after ruff format). The kernels
# are read top to bottom as one file per operation (../shared/STYLE.md) and are exempt.
MODULE_LINES = 450


def test_no_module_outside_the_kernels_is_over_the_line_limit():
    over = {}
    for path in sorted((ROOT / "attnkit").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[:2] == ("attnkit", "kernels"):
            continue
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MODULE_LINES:
            over[str(rel)] = lines
    assert not over, f"over {MODULE_LINES} lines, split each by job (and name the new modules in the Layout): {over}"
