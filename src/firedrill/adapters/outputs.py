"""Output files of the commands: checked before anything runs, written (or sent to stdout) after.

A game day takes minutes; finding out at its end that ``--json`` names a directory that cannot be
created threw the run away with a traceback. So every command checks its output paths first
(`check_file`, `check_directory`): the nearest existing ancestor is a writable directory, and
the path itself is not a directory (for a file) or not a file (for a directory). A refusal is an
`OutputError` (exit 4, nothing run). The path ``-`` means standard output (`is_stdout`); `write`
sends the text there.

The checks cannot promise the write will succeed (the disk may fill, permissions may change in
between); a write that still fails is an `OutputError` too, naming the path.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from firedrill.errors import OutputError

__all__ = ["STDOUT", "check_directory", "check_file", "is_stdout", "write", "write_chunks"]

STDOUT = "-"


def is_stdout(path: Path | None) -> bool:
    """Whether an output option asks for standard output (``-``)."""
    return path is not None and str(path) == STDOUT


def _nearest_existing(path: Path) -> Path:
    here = path.absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    return here


def _writable_ancestor(path: Path, option: str, start: Path) -> None:
    """The nearest existing ancestor of ``start`` is a directory this process can write."""
    base = _nearest_existing(start)
    if not base.is_dir():
        raise OutputError(f"{option} {path}: {base} is not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise OutputError(f"{option} {path}: cannot create files in {base} (not writable)")


def check_file(path: Path | None, option: str) -> None:
    """Refuse now an output file that could not be written later (``-``: stdout, always fine)."""
    if path is None or is_stdout(path):
        return
    if path.is_dir():
        raise OutputError(f"{option} {path}: is a directory, not a file")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise OutputError(f"{option} {path}: the file is not writable")
        return
    _writable_ancestor(path, option, path.parent)


def check_directory(path: Path | None, option: str) -> None:
    """Refuse now an output directory that could not be created or written later."""
    if path is None:
        return
    if is_stdout(path):
        raise OutputError(f"{option} names a directory; '-' (stdout) is for single files")
    if path.exists():
        if not path.is_dir():
            raise OutputError(f"{option} {path}: is a file, not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise OutputError(f"{option} {path}: the directory is not writable")
        return
    _writable_ancestor(path, option, path)


def write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (creating its directory) or to stdout for ``-``."""
    if is_stdout(path):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from exc


def write_chunks(path: Path, chunks: Iterable[str]) -> int:
    """Write ``chunks`` to ``path`` as they come (an export too big to hold in memory); return
    the bytes written.

    They go to ``path``'s ``.partial`` sibling, renamed onto ``path`` once the last one is
    written: an error half-way (a refused sample, a full disk) leaves no truncated file that
    looks finished, and an existing ``path`` untouched.
    """
    partial = path.with_name(path.name + ".partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with partial.open("w", encoding="utf-8", newline="\n") as f:
            for chunk in chunks:
                f.write(chunk)
        os.replace(partial, path)
        return path.stat().st_size
    except OSError as exc:
        _discard(partial)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except BaseException:
        _discard(partial)
        raise


def _discard(partial: Path) -> None:
    """Remove a half-written file, if there is one to remove."""
    with contextlib.suppress(OSError):  # never created (its directory is not one)
        partial.unlink(missing_ok=True)
