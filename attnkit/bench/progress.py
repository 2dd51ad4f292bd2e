"""tqdm progress bars (the bench extra), or a silent stand-in where tqdm is missing."""

from __future__ import annotations


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
    """A tqdm bar on stderr (left behind when done: no), or a silent one."""
    if not enabled:
        return _Silent()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Silent()
    return tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True)
