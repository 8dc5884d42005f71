"""Writing files that must not be redirected: control tokens and preserved evidence.

A file written by path follows whatever the path holds at that moment. If someone who can
write the directory planted a symbolic link there, ``open(path, "w")`` writes the token into the
link's target (a file of theirs, or one of the victim's to clobber). Here a file is only ever
created new, exclusively and without following a link (``O_CREAT | O_EXCL | O_NOFOLLOW``), with
its final mode set on the open descriptor; replacing a file means writing a new one beside it
and renaming it over the old (a rename replaces a link, it never writes through one). A link or
anything other than a regular file at the path is refused with ``UnsafePathError``.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from firedrill.errors import UnsafePathError

__all__ = ["create_new", "fsync_dir", "refuse_link", "replace_private"]

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def refuse_link(path: Path, what: str) -> os.stat_result | None:
    """``path``'s own status (``None`` if absent); refused when it is a link or not a file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"{path} is a symbolic link: refusing to write the {what} through it")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(f"{path} is not a regular file: refusing to write the {what} there")
    return st


def create_new(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` exclusively (never through a link, never over a file) with ``mode``.

    Raises ``FileExistsError`` when anything is at ``path`` (a link included).
    """
    fd = os.open(path, _NEW, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have narrowed it; set exactly what was asked
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    """Make a directory's new entries durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_private(path: Path, data: bytes, *, what: str, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` readable by its owner only, replacing a regular file there.

    A link (or a directory, FIFO, device) at ``path`` is refused; the new content is written to
    a fresh file beside it and renamed over it, so nothing is ever written through a link.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    refuse_link(path, what)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        create_new(tmp, data, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
