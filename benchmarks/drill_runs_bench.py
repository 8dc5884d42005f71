"""Many runs of a game day (`gameday run --runs N`): sweeps on local processes and on Ray.

Targets (BENCHMARKS.md, "Game days"): 1,000 runs of the 1-hour L5 drill in ≤ 10 min on 2 cores
with processes, and how Ray scales with workers. ``drill_bench.py`` times one run; this script
(also reached as ``drill_bench.py --runs N``) times sweeps and says where a run's time goes:

    .venv/bin/python benchmarks/drill_runs_bench.py --runs 1000 --executor process --workers 2
    .venv/bin/python benchmarks/drill_runs_bench.py --runs 100 --executor ray --workers 1,2
    .venv/bin/python benchmarks/drill_runs_bench.py --runs 200 --workers 2 --batch 1,32
    .venv/bin/python benchmarks/drill_runs_bench.py --profile      # one run's time by package

A sweep runs the drill with ``firedrill.drill.many`` for each executor, worker count and batch
size (``--batch``: runs per ensemble, as ``gameday run --batch``; default 1) given, and prints
the total wall time, runs/s, wall seconds per run per worker (what one run costs a worker, pool
start-up included), CPU seconds per run and the cores used on average (processes only: Ray's
workers are not this process's children), the pass rate and the p50/p95/p99 of the measured
RTO; when several sweeps of the same size ran, it says whether their summaries are identical
(they must be, whatever the executor and the batch size). ``--profile`` runs the drill once
under cProfile (after a warm-up run) and prints the time by package (twin, detection, drill
runner, …) and the top functions.
The machine is printed first; ``--json PATH`` also writes the results.

``--baseline REV`` sweeps ``REV``'s code and this tree's side by side (``side_by_side.py``), each
in a child process on one core (serial executor), ``--rounds`` times alternately, with the same
seeds: it prints each side's CPU seconds per run (minimum over rounds), the ratio, the projected
time of 1,000 runs on 2 cores, and whether both sides' summaries are identical (a change made
for speed must leave them so). ``--batch R`` (one size) applies to this tree's side only: the
old side runs one run at a time, as code without ensembles does:

    .venv/bin/python benchmarks/drill_runs_bench.py --baseline cec5384 --runs 40
    .venv/bin/python benchmarks/drill_runs_bench.py --baseline cec5384 --runs 40 --batch 20
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pstats
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from twin_bench import machine_info

from firedrill.adapters import worlds
from firedrill.adapters.process_executor import ProcessExecutor
from firedrill.adapters.worlds import EMBEDDED
from firedrill.drill.many import DrillJob, Executor, SerialExecutor, run_many
from firedrill.drill.run import run_drill
from firedrill.specfile import load_drill

ROOT = Path(__file__).resolve().parents[1]
DRILL = ROOT / "examples" / "drills" / "l5-region-blackhole.yaml"


def _job(path: Path, batch: int = 1) -> DrillJob:
    """The drill's job; with ``batch`` > 1, in ensembles of that many runs (the embedded twin's
    ensemble where the adapters have one). A revision without ensembles takes batch 1 only."""
    d = load_drill(path)
    more: dict[str, Any] = {}
    if batch != 1:
        more["batch"] = batch
        ensemble = getattr(worlds, "EMBEDDED_ENSEMBLE", None)
        if ensemble is not None:
            more["make_ensemble"] = ensemble
    return DrillJob(d.spec, d.fleet, d.slo, d.policy, d.spec_sha256, make_world=EMBEDDED, **more)


def _executor(kind: str, workers: int) -> Executor:
    if kind == "ray":
        from firedrill.adapters.ray_executor import RayExecutor

        return RayExecutor(workers=workers, init_options={"include_dashboard": False})
    if kind == "serial":
        return SerialExecutor()
    return ProcessExecutor(workers)


def sweeps(
    path: Path, runs: int, seed: int, kinds: list[str], workers: list[int], sizes: list[int]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    for kind, k, size in ((kind, k, size) for kind in kinds for k in workers for size in sizes):
        job = _job(path, size)
        done = [0]

        def tick(_o: Any, done: list[int] = done) -> None:
            done[0] += 1
            if done[0] % max(1, runs // 20) == 0:
                print(f"  {done[0]}/{runs}", file=sys.stderr, flush=True)

        c0 = _cpu_s()
        w0 = time.perf_counter()
        summary = run_many(job, runs=runs, seed=seed, executor=_executor(kind, k), done=tick)
        wall = time.perf_counter() - w0
        # CPU of this process and its joined children (the pool's workers); Ray's workers
        # are the raylet's children, not ours: not counted
        cpu = _cpu_s() - c0 if kind != "ray" else None
        summaries.append(summary)
        row = {
            "executor": kind,
            "workers": k,
            "batch": size,
            "runs": runs,
            "wall_s": round(wall, 2),
            "runs_per_s": round(runs / wall, 3),
            "s_per_run_per_worker": round(wall * k / runs, 3),
            "cpu_s_per_run": None if cpu is None else round(cpu / runs, 3),
            "cores_used": None if cpu is None else round(cpu / wall, 2),
            "pass_rate": summary["pass_rate"],
            "verdicts": summary["verdicts"],
            "measured_rto": {p: summary["measured"][p] for p in ("p50", "p95", "p99")},
            "summary_sha256": hashlib.sha256(
                json.dumps(summary, sort_keys=True, default=str).encode()
            ).hexdigest(),
        }
        out.append(row)
        used = "" if cpu is None else f" ({cpu / runs:.2f} cpu s/run, {cpu / wall:.2f} cores)"
        print(
            f"{kind:<8} {k:>2} workers, batch {size:>3}: {runs} runs in {wall:8.1f} s wall, "
            f"{runs / wall:6.2f} runs/s, {wall * k / runs:5.2f} s/run/worker{used}; pass rate "
            f"{summary['pass_rate']:.1%}; measured RTO p50/p95/p99 "
            f"{row['measured_rto']['p50']}/{row['measured_rto']['p95']}/"
            f"{row['measured_rto']['p99']} s",
            flush=True,
        )
    if len(summaries) > 1:
        same = all(s == summaries[0] for s in summaries[1:])
        print(
            "summaries identical across executors, worker counts and batch sizes: "
            + ("yes" if same else "NO")
        )
        for row in out:
            row["identical"] = same
    return out


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


AREAS = (
    ("firedrill/twin/", "twin (simulation step, scrape, series)"),
    ("firedrill/detect/", "detection (burn-rate and cause alerts)"),
    ("firedrill/drill/", "drill runner (observe, stop conditions, expr, report)"),
    ("firedrill/remediate/", "remediation controller"),
    ("firedrill/respond/", "response (levers, guards, incidents)"),
    ("firedrill/", "other firedrill"),
    ("numpy", "numpy (called from the above)"),
)


def profile(path: Path, top: int) -> dict[str, Any]:
    job = _job(path)
    run_drill(job.spec, job.fleet, job.slo, job.policy, make_world=EMBEDDED)  # warm-up
    prof = cProfile.Profile()
    prof.enable()
    run_drill(job.spec, job.fleet, job.slo, job.policy, make_world=EMBEDDED)
    prof.disable()
    stats = pstats.Stats(prof)
    by_area: dict[str, float] = defaultdict(float)
    total = 0.0
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (file, _line, _name), (_cc, _nc, tottime, _ct, _callers) in raw.items():
        total += tottime
        area = next((title for key, title in AREAS if key in file), "python and other libraries")
        by_area[area] += tottime
    print(f"one run under cProfile: {total:.2f} s (profiling roughly doubles the time)")
    for area, t in sorted(by_area.items(), key=lambda x: -x[1]):
        print(f"  {t / total:6.1%}  {t:6.2f} s  {area}")
    stats.sort_stats("tottime").print_stats(top)
    return {"total_s": round(total, 3), "by_area_s": {k: round(v, 3) for k, v in by_area.items()}}


def side_by_side(args: argparse.Namespace) -> int:
    from side_by_side import run_child, sides

    child = ["--drill", str(args.drill), "--runs", str(args.runs), "--seed", str(args.seed)]
    child += ["--executor", "serial", "--workers", "1"]
    both = sides(args.baseline)
    (old, _), (new, _) = both
    # the old revision may have no batches: it runs one run at a time, this tree in --batch
    extra = {old: [], new: [] if args.batch == "1" else ["--batch", args.batch]}
    per_run: dict[str, list[float]] = {label: [] for label, _ in both}
    digests: set[str] = set()
    for r in range(args.rounds):
        for label, src in both:
            (row,) = run_child(Path(__file__).resolve(), child + extra[label], src)["results"]
            per_run[label].append(row["cpu_s_per_run"])
            digests.add(row["summary_sha256"])
            print(
                f"round {r + 1} {label:<16} {args.runs} runs (batch {row.get('batch', 1)}): "
                f"{row['cpu_s_per_run']:.3f} cpu s/run,"
                f" pass rate {row['pass_rate']:.1%}, RTO p50/p95/p99 "
                f"{row['measured_rto']['p50']}/{row['measured_rto']['p95']}/"
                f"{row['measured_rto']['p99']} s",
                flush=True,
            )
    ratio = min(per_run[old]) / min(per_run[new])
    for label, _ in both:
        best = min(per_run[label])
        print(
            f"  {label:<16} {best:.3f} cpu s/run; 1,000 runs on 2 free cores ~ "
            f"{1000 * best / 2 / 60:.1f} min"
        )
    print(f"  old / new (cpu s per run): {ratio:.2f}x")
    print(f"  summaries identical old vs new: {'yes' if len(digests) == 1 else 'NO'}")
    if args.json is not None:
        payload = {
            "baseline": args.baseline,
            "runs": args.runs,
            "batch": {old: 1, new: int(args.batch)},
            "cpu_s_per_run": {k: min(v) for k, v in per_run.items()},
            "ratio_old_over_new": round(ratio, 3),
            "identical": len(digests) == 1,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0 if len(digests) == 1 else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drill", type=Path, default=DRILL)
    ap.add_argument("--runs", type=int, default=1000, help="runs per sweep")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--executor", default="process", help="process, ray or serial; comma list")
    ap.add_argument("--workers", default="2", help="comma-separated worker counts")
    ap.add_argument("--batch", default="1", help="runs per ensemble; comma list (one: --baseline)")
    ap.add_argument("--profile", action="store_true", help="profile one run instead")
    ap.add_argument("--top", type=int, default=25, help="--profile: functions to list")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--baseline", default=None, help="git revision to sweep side by side")
    ap.add_argument("--rounds", type=int, default=1, help="--baseline: sweeps per side")
    args = ap.parse_args(argv)
    sizes = [int(b) for b in args.batch.split(",") if b.strip()]
    if not sizes or min(sizes) < 1:
        ap.error(f"--batch takes sizes of at least 1 (got {args.batch!r})")
    if args.baseline is not None:
        if len(sizes) != 1:
            ap.error("--baseline compares one batch size (this tree's side) with the old code")
        args.batch = str(sizes[0])
        return side_by_side(args)
    machine = machine_info()
    print(" ".join(f"{k}={v}" for k, v in machine.items()))
    results: Any
    if args.profile:
        results = profile(args.drill, args.top)
    else:
        kinds = [k.strip() for k in args.executor.split(",") if k.strip()]
        workers = [int(w) for w in args.workers.split(",") if w.strip()]
        results = sweeps(args.drill, args.runs, args.seed, kinds, workers, sizes)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"machine": machine, "results": results}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
