"""File operations for the tuning cache that never harm what attnkit did not write: a
path that is not a regular file (a FIFO, a device, a directory, a socket; or a symlink
to one) is never opened, moved or replaced; a file rewritten keeps its owner and group.
See :mod:`attnkit.choose.tuning`."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


class CacheNotWritten(OSError):
    """The cache was left as it is, on purpose; the message says why."""


class NotRegularFile(CacheNotWritten):
    """The cache path is a FIFO, a device, a directory...: not read, moved or replaced."""


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_regular(path: str | os.PathLike, mode: int) -> NotRegularFile | None:
    """The refusal for a path whose (followed) mode is not a regular file's, else None."""
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), f"of file type {stat.S_IFMT(mode):#o}")
    path = Path(path)
    link = f" (a symlink to {os.path.realpath(path)})" if path.is_symlink() else ""
    # what to do: /dev/null is sometimes passed on purpose; "remove it" would be bad advice
    meant = f" such as {path / 'autotune.json'}" if stat.S_ISDIR(mode) else ""
    return NotRegularFile(
        f"{path}{link} is {kind}, not a regular file: attnkit does not read, move or replace "
        f"it; to keep tuned choices, pass auto(tune=True, cache_path=...) the path of a "
        f"file{meant}"
    )


def refuse_special(path: str | os.PathLike) -> None:
    """Raise NotRegularFile if ``path`` exists and is not a regular file, judged by
    ``os.stat`` (a symlink by what it points to), without opening it: opening a FIFO waits
    for a writer and opening a device may act on it. FileNotFoundError if there is none."""
    refusal = _not_regular(path, os.stat(path).st_mode)
    if refusal is not None:
        raise refusal


# O_NONBLOCK: a FIFO that appeared after refuse_special does not wait for a writer
# (fstat then refuses it); O_NOCTTY: a terminal never becomes ours. Both absent on
# Windows, which needs O_BINARY instead to read the bytes as they are.
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)


def _read_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of ``path`` if it is a regular file; NotRegularFile otherwise."""
    refuse_special(path)
    fd = os.open(path, _READ_FLAGS)
    with os.fdopen(fd, "rb") as fh:
        refusal = _not_regular(path, os.fstat(fd).st_mode)
        if refusal is not None:
            raise refusal
        return fh.read()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _keep_owner(tmp: str, st: os.stat_result) -> None:
    """Give ``tmp`` the owner and group of the file it replaces (before the mode: chown
    may clear set-id bits). Root rewriting a user's cache must leave it theirs, or that
    user can no longer save. Only root may give a file away; anyone else keeps at least
    the group (a member may), so those who wrote through the group still can."""
    if not hasattr(os, "chown"):  # Windows
        return
    # never through a symlink: the name is ours, and one swapped in must not give its target away
    own = os.stat(tmp, follow_symlinks=False)
    if (own.st_uid, own.st_gid) == (st.st_uid, st.st_gid):
        return
    try:
        os.chown(tmp, st.st_uid, st.st_gid, follow_symlinks=False)
    except PermissionError:
        with contextlib.suppress(OSError):
            os.chown(tmp, -1, st.st_gid, follow_symlinks=False)


def _free_name(path: Path) -> Path:
    """``path``, or ``path.1``, ``path.2``... : a name no file has (an earlier .bad stays)."""
    candidate, n = path, 0
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
