"""Run a benchmark on the code before a change and on this tree, side by side, in one run.

A speed-up is only believable next to the old code measured at the same moment on the same
machine with the same seeds: this machine is shared, and the same code varies by 10–30% from
one hour to the next. ``--baseline REV`` on a benchmark exports ``REV``'s ``src/`` with
``git archive`` into a cache directory (``$TMPDIR/firedrill-baseline-<commit>``, made once),
then runs the benchmark's own measuring code in child processes, alternately on the old
``src/`` and on this tree's, each with its ``src/`` first on ``PYTHONPATH``. Each child writes
its numbers as JSON; the caller takes the minimum CPU time (``time.process_time``) per side,
the figure least disturbed by other work on the cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def baseline_src(rev: str) -> Path:
    """``rev``'s ``src/`` exported once into the temporary directory; its path."""
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    dest = Path(tempfile.gettempdir()) / f"firedrill-baseline-{sha[:12]}"
    if not (dest / "src" / "firedrill").is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", sha, "src"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "src"


def run_child(script: Path, args: list[str], src: Path) -> Any:
    """Run ``script args --json FILE`` with ``src`` first on the path; the JSON it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(script.parent)])}
        subprocess.run(
            [sys.executable, str(script), *args, "--json", str(out)],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        return json.loads(out.read_text())


def sides(rev: str) -> list[tuple[str, Path]]:
    """The two sides: ("old", rev's src) and ("new", this tree's src)."""
    return [(f"old ({rev})", baseline_src(rev)), ("new (this tree)", ROOT / "src")]
