"""Writing a security incident's evidence to disk once, read-only, and checking it later.

Preserved means: the files are written once into a directory that did not hold evidence before
(an existing non-empty directory is refused, and each file is created exclusively, so nothing is
ever overwritten), every file is made read-only and so is the directory, and the manifest's
hashes verify (``verify_dir``). Operating-system errors are mapped to ``EvidenceError``.

Nothing here follows a symbolic link. The directory is opened with ``O_NOFOLLOW`` and every
file is created and read relative to that descriptor, also with ``O_NOFOLLOW``, so a link
planted at ``DIR/INC-…`` or in place of a file can neither redirect the export nor stand in for
a file when it is checked: ``verify_dir`` names a link, a hard-linked file (it can be changed
through its other name), anything that is not a regular file, and a file or directory that can
be written, as problems.

Signing key (``load_key``): a file of at least 32 bytes (surrounding whitespace stripped), e.g.
``head -c 32 /dev/urandom | base64 > evidence.key``. It is refused when others can write it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from firedrill.respond.evidence import MIN_KEY_BYTES, EvidenceBundle, EvidenceError, verify

READ_ONLY_FILE = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH  # 0o444
READ_ONLY_DIR = READ_ONLY_FILE | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH  # 0o555
WRITABLE = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW | _CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
_READ_FILE = os.O_RDONLY | os.O_NOFOLLOW | _CLOEXEC


def refuse_unusable_out(directory: Path) -> None:
    """``directory`` may receive evidence: absent, or an empty real directory (not a link)."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise EvidenceError(f"cannot use {directory} for evidence: {exc}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise EvidenceError(
            f"{directory} is a symbolic link: evidence is never written through one"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise EvidenceError(f"{directory} is not a directory")
    try:
        empty = not os.listdir(directory)
    except OSError as exc:
        raise EvidenceError(f"cannot read {directory}: {exc}") from exc
    if not empty:
        raise EvidenceError(
            f"{directory} already holds files: evidence is written once, never over other files"
        )


def write_bundle(bundle: EvidenceBundle, directory: Path) -> list[Path]:
    """Write the bundle's files into ``directory`` (created), then make it all read-only."""
    refuse_unusable_out(directory)
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        # an empty real directory may already be there: checked above, and again through its
        # descriptor below
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
        dfd = os.open(directory, _DIR_FLAGS)
    except OSError as exc:
        raise EvidenceError(f"cannot write evidence to {directory}: {exc}") from exc
    try:
        if os.listdir(dfd):
            raise EvidenceError(f"{directory} already holds files: evidence is written once")
        written: list[Path] = []
        for f in bundle.files:
            _write_new(dfd, f.name, f.data)
            written.append(directory / f.name)
        os.fchmod(dfd, READ_ONLY_DIR)
        os.fsync(dfd)
    except FileExistsError as exc:
        raise EvidenceError(f"{exc.filename} exists: evidence is never overwritten") from exc
    except OSError as exc:
        raise EvidenceError(f"cannot write evidence to {directory}: {exc}") from exc
    finally:
        os.close(dfd)
    problems = verify_dir(directory)
    if problems:
        raise EvidenceError(f"evidence in {directory} does not verify: {'; '.join(problems)}")
    return written


def _write_new(dfd: int, name: str, data: bytes) -> None:
    if "/" in name or name in (".", ".."):
        raise EvidenceError(f"{name!r} is not a file name")
    fd = os.open(name, _NEW_FILE, READ_ONLY_FILE, dir_fd=dfd)
    try:
        os.fchmod(fd, READ_ONLY_FILE)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def verify_dir(directory: Path, *, key: bytes | None = None) -> list[str]:
    """Problems with the evidence in ``directory``: links, modes, hashes, and the signature
    when ``key`` is given."""
    try:
        st = os.lstat(directory)
    except OSError as exc:
        raise EvidenceError(f"cannot read evidence in {directory}: {exc}") from exc
    if stat.S_ISLNK(st.st_mode):
        return [f"{directory} is a symbolic link: preserved evidence is a real directory"]
    if not stat.S_ISDIR(st.st_mode):
        raise EvidenceError(f"{directory} is not a directory")
    try:
        dfd = os.open(directory, _DIR_FLAGS)
    except OSError as exc:
        raise EvidenceError(f"cannot read evidence in {directory}: {exc}") from exc
    problems: list[str] = []
    files: dict[str, bytes] = {}
    try:
        mode = os.fstat(dfd).st_mode
        if mode & WRITABLE:
            problems.append(
                f"{directory} is writable ({stat.S_IMODE(mode):04o}): preserved evidence is "
                f"read-only ({READ_ONLY_DIR:04o})"
            )
        for name in sorted(os.listdir(dfd)):
            data = _read_entry(dfd, name, problems)
            if data is not None:
                files[name] = data
    except OSError as exc:
        raise EvidenceError(f"cannot read evidence in {directory}: {exc}") from exc
    finally:
        os.close(dfd)
    return problems + verify(files, key=key)


def _read_entry(dfd: int, name: str, problems: list[str]) -> bytes | None:
    """A regular, read-only, singly linked file's bytes; anything else is a problem."""
    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        problems.append(f"{name} is a symbolic link: preserved evidence holds the files themselves")
        return None
    if not stat.S_ISREG(st.st_mode):
        problems.append(f"{name} is not a regular file")
        return None
    try:
        fd = os.open(name, _READ_FILE, dir_fd=dfd)
    except OSError as exc:
        problems.append(f"{name} cannot be read: {exc.strerror}")
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"{name} is not a regular file")
            return None
        if st.st_nlink > 1:
            problems.append(f"{name} has {st.st_nlink} hard links: it can be changed elsewhere")
        if st.st_mode & WRITABLE:
            problems.append(f"{name} is writable: preserved evidence is read-only")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_key(path: Path) -> bytes:
    """The evidence signing key in ``path``: at least 32 bytes, not writable by others."""
    try:
        st = os.stat(path)
        data = path.read_bytes().strip()
    except OSError as exc:
        raise EvidenceError(f"cannot read the evidence key {path}: {exc}") from exc
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise EvidenceError(f"{path} can be written by others: refusing it as the evidence key")
    if len(data) < MIN_KEY_BYTES:
        raise EvidenceError(f"{path}: an evidence key has at least {MIN_KEY_BYTES} bytes")
    return data
