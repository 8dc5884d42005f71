"""Writing a security incident's evidence to disk once, read-only, and checking it later.

Preserved means: the files are written once into a directory that did not hold evidence before
(an existing non-empty directory is refused, and each file is created exclusively, so nothing is
ever overwritten), every file is made read-only and so is the directory, and the manifest's
hashes verify (``verify_dir``). Operating-system errors are mapped to ``EvidenceError``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from firedrill.respond.evidence import EvidenceBundle, EvidenceError, verify

READ_ONLY_FILE = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH  # 0o444
READ_ONLY_DIR = READ_ONLY_FILE | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH  # 0o555


def write_bundle(bundle: EvidenceBundle, directory: Path) -> list[Path]:
    """Write the bundle's files into ``directory`` (created), then make it all read-only."""
    try:
        if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
            raise EvidenceError(
                f"{directory} already holds files: evidence is written once, never over other files"
            )
        directory.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        for f in bundle.files:
            path = directory / f.name
            with path.open("xb") as out:  # exclusive: never replaces a file
                out.write(f.data)
                out.flush()
                os.fsync(out.fileno())
            path.chmod(READ_ONLY_FILE)
            written.append(path)
        directory.chmod(READ_ONLY_DIR)
    except FileExistsError as exc:
        raise EvidenceError(f"{exc.filename} exists: evidence is never overwritten") from exc
    except OSError as exc:
        raise EvidenceError(f"cannot write evidence to {directory}: {exc}") from exc
    problems = verify_dir(directory)
    if problems:
        raise EvidenceError(f"evidence in {directory} does not verify: {'; '.join(problems)}")
    return written


def verify_dir(directory: Path) -> list[str]:
    """Problems with the evidence in ``directory``: hashes, and files left writable."""
    try:
        paths = sorted(p for p in directory.iterdir() if p.is_file())
        files = {p.name: p.read_bytes() for p in paths}
    except OSError as exc:
        raise EvidenceError(f"cannot read evidence in {directory}: {exc}") from exc
    problems = verify(files)
    for p in paths:
        if p.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
            problems.append(f"{p.name} is writable: preserved evidence is read-only")
    return problems
