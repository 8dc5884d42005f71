"""Prove that a speed change left every result as it was, byte for byte.

A change to the twin's step that is meant to be faster and nothing else must give the same
output for every example: the same drill results, the same scenario runs, the same recorded
series. This script writes those outputs from whatever code is first on ``PYTHONPATH`` into a
directory, and compares two such directories file by file:

    git archive REV src | tar -x -C /tmp/base                        # the code before
    PYTHONPATH=/tmp/base/src python benchmarks/same_outputs.py write /tmp/out-old
    PYTHONPATH=$PWD/src      python benchmarks/same_outputs.py write /tmp/out-new
    python benchmarks/same_outputs.py compare /tmp/out-old /tmp/out-new

or all of it at once against a git revision (``--baseline``, default ``main``):

    python benchmarks/same_outputs.py check --baseline main

What is written: every drill of ``examples/drills`` through ``gameday run --seed 7 --json``
(and the L5 drill again with ``--jitter``), every scenario of ``examples/scenarios`` through
``respond --json``, and for the demo, P/D and training fleets and a one-cell fleet (the small
cell of ``cell_vs_simpy.py``, at 95% utilisation) the twin's recorded series (every value of
every family, dense and sparse) after one simulated hour, for seeds 1, 2 and 3, with the run's
summary (the series read through the Signals port, as a query sees them). The quiescent steps
(``FleetSpec.quiescent``) are covered the same way: the small cell at 70% and a fleet of four
pools (two regions of two cells, 50% and 90%), three recorded hours each; and the small cell
for 24 unrecorded hours at macro steps of up to 60 and 300 s (as ``cell_vs_simpy.py
--quiescent`` runs it), whose counters, histograms and run means are hashed, since nothing is
recorded. Wall-clock durations, which no result carries, are not compared.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from side_by_side import baseline_src

if TYPE_CHECKING:
    from firedrill.model.spec import FleetSpec

ROOT = Path(__file__).resolve().parents[1]
SERIES_FLEETS = ("fleet.yaml", "fleet-pd.yaml", "fleet-train.yaml")
SERIES_SEEDS = (1, 2, 3)


def write(out: Path) -> None:
    """Run every example with the code on the path and write its outputs under ``out``."""
    from typer.testing import CliRunner

    from firedrill.cli.main import app

    out.mkdir(parents=True, exist_ok=True)
    runner = CliRunner()
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)  # journals and default outputs land here, not in the tree
        try:
            runs: list[tuple[str, list[str]]] = []
            for drill in sorted((ROOT / "examples" / "drills").glob("*.yaml")):
                runs.append((f"drill-{drill.stem}", ["gameday", "run", str(drill), "--seed", "7"]))
            l5 = ROOT / "examples" / "drills" / "l5-region-blackhole.yaml"
            runs.append(("drill-l5-jitter", ["gameday", "run", str(l5), "--seed", "7", "--jitter"]))
            for sc in sorted((ROOT / "examples" / "scenarios").glob("*.yaml")):
                runs.append((f"scenario-{sc.stem}", ["respond", str(sc)]))
            for name, args in runs:
                target = out / f"{name}.json"
                res = runner.invoke(app, [*args, "--json", str(target), "--quiet"])
                (out / f"{name}.exit").write_text(f"{res.exit_code}\n")
                if not target.exists():
                    (out / f"{name}.output").write_text(res.output)
                print(f"{name}: exit {res.exit_code}", flush=True)
        finally:
            os.chdir(cwd)
    _write_series(out)


def _write_series(out: Path) -> None:
    import json

    import numpy as np
    from queue_fidelity import _spec

    from firedrill.specfile import load_fleet, spec_sha256
    from firedrill.twin.engine import Twin
    from firedrill.twin.run import summarize

    fleets: list[tuple[str, FleetSpec, Path | None]] = [
        (Path(f).stem, load_fleet(ROOT / "examples" / f), ROOT / "examples" / f)
        for f in SERIES_FLEETS
    ]
    # a fleet of one pool (the small cell of cell_vs_simpy.py, at 95%): the few-pools paths
    fleets.append(("one-cell", _spec(2.0, 2, 8, 1, [0.95]), None))
    hours = {stem: 1.0 for stem, _, _ in fleets}
    # the quiescent steps, on one pool and on four (at 95% the cell is never quiet)
    fleets.append(("one-cell-quiescent", _quiescent(_spec(2.0, 2, 8, 1, [0.7]), 60.0), None))
    fleets.append(("four-pools-quiescent", _quiescent(_spec(2.0, 2, 8, 2, [0.5, 0.9]), 60.0), None))
    hours["one-cell-quiescent"] = hours["four-pools-quiescent"] = 3.0
    for stem_name, fleet, path in fleets:
        for seed in SERIES_SEEDS:
            twin = Twin(fleet, seed)
            twin.run_for(hours[stem_name] * 3600.0)
            h = hashlib.sha256()
            h.update(np.asarray(twin.store.times, dtype=np.float64).tobytes())
            # through the Signals port: the store's raw rows past the last committed block are
            # allocated, not written, so hashing them read whatever the memory held
            for name in sorted(twin.series_names()):
                for s in twin.query(name, start_s=0.0, end_s=twin.t):
                    h.update(f"{name}{s.labels!r}".encode())
                    h.update(np.asarray(s.t_s, dtype=np.float64).tobytes())
                    h.update(np.asarray(s.values, dtype=np.float64).tobytes())
            summary = summarize(twin, spec_sha256=spec_sha256(path) if path else "")
            stem = f"series-{stem_name}-seed{seed}"
            (out / f"{stem}.sha256").write_text(h.hexdigest() + "\n")
            (out / f"{stem}.summary.json").write_text(json.dumps(summary, sort_keys=True) + "\n")
            print(f"{stem}: {h.hexdigest()[:16]}", flush=True)
    # unrecorded, macro steps are not held to the scrapes: what cell_vs_simpy.py --quiescent runs
    for max_step in (60.0, 300.0):
        fleet = _quiescent(_spec(2.0, 2, 8, 1, [0.7]), max_step)
        for seed in SERIES_SEEDS:
            twin = Twin(fleet, seed, record=False, hours_hint=24.0)
            twin.run_for(24 * 3600.0)
            summary = summarize(twin, spec_sha256="")
            h = hashlib.sha256()
            for name in COUNTERS:
                h.update(name.encode())
                h.update(np.ascontiguousarray(getattr(twin, name)).tobytes())
            h.update(repr((twin.t, twin.step_no, twin.samples)).encode())
            stem = f"unrecorded-one-cell-quiescent-{max_step:g}s-seed{seed}"
            (out / f"{stem}.sha256").write_text(h.hexdigest() + "\n")
            (out / f"{stem}.summary.json").write_text(json.dumps(summary, sort_keys=True) + "\n")
            print(f"{stem}: {h.hexdigest()[:16]}", flush=True)


# what an unrecorded run leaves: its counters, histograms, run means and serving state
COUNTERS = (
    "requests",
    "ok",
    "errors",
    "admitted_total",
    "ttft_hist",
    "ttft_sum",
    "tpot_hist",
    "tpot_sum",
    "queue_wait_sum",
    "success_stop",
    "success_length",
    "generation_tokens",
    "kv_usage_sum",
    "util_sum",
    "ready_sum",
    "busy",
    "busy_fast",
    "queue",
    "lam_warm",
)


def _quiescent(spec: FleetSpec, max_step_s: float) -> FleetSpec:
    """``spec`` with the quiescent steps on, macro steps of up to ``max_step_s``."""
    return spec.model_copy(
        update={
            "quiescent": spec.quiescent.model_copy(
                update={"enabled": True, "max_step_s": max_step_s}
            )
        }
    )


def compare(old: Path, new: Path) -> int:
    """0 when both directories hold the same files with the same bytes."""
    a = {p.name for p in old.iterdir()}
    b = {p.name for p in new.iterdir()}
    bad = sorted(a ^ b)
    for name in sorted(a & b):
        if (old / name).read_bytes() != (new / name).read_bytes():
            bad.append(name)
    for name in bad:
        print(f"DIFFERS: {name}")
    print(f"{len(a & b) - len(set(bad) & a & b)} of {len(a | b)} outputs identical")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write the outputs of the code on PYTHONPATH")
    w.add_argument("out", type=Path)
    c = sub.add_parser("compare", help="compare two output directories")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    k = sub.add_parser("check", help="write old (git revision) and new (this tree), compare")
    k.add_argument("--baseline", default="main", help="git revision of the code before")
    k.add_argument("--keep", type=Path, default=None, help="keep the outputs here")
    args = ap.parse_args(argv)
    if args.cmd == "write":
        write(args.out)
        return 0
    if args.cmd == "compare":
        return compare(args.old, args.new)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.keep) if args.keep else Path(tmp)
        for label, src in (("old", baseline_src(args.baseline)), ("new", ROOT / "src")):
            env = {**os.environ, "PYTHONPATH": str(src)}
            subprocess.run(
                [sys.executable, __file__, "write", str(base / label)], env=env, check=True
            )
        return compare(base / "old", base / "new")


if __name__ == "__main__":
    sys.exit(main())
