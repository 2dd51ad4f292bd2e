"""tqdm progress bars (the ``attnkit[bench]`` extra), or a silent stand-in where tqdm is
missing (the command line says so once, from :func:`missing_extras`)."""

from __future__ import annotations

import importlib.util

EXTRA_HINT = "pip install 'attnkit[bench]'"


def missing_extras() -> list[str]:
    """What of the ``attnkit[bench]`` extra is not installed: "matplotlib" (plots), "tqdm"
    (progress bars)."""
    out = []
    for name in ("matplotlib", "tqdm"):
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a module set to None in sys.modules, as in the tests
            found = False
        if not found:
            out.append(name)
    return out


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def progress_bar(total: int, desc: str, enabled: bool = True):
    """A tqdm bar on stderr (not left behind when done), or a silent one."""
    if not enabled:
        return _Silent()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Silent()
    return tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True)
