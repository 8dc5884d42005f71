"""Time a game day: the L5 region blackhole on the demo fleet (1 simulated hour), end to end.

The target is a 1-hour L5 drill on the demo fleet in at most 2 s of wall time. The drill is the
twin plus everything a game day adds every 15 s evaluation step (burn-rate and cause alerts,
Alertmanager routing, incidents, the remediation controller, the failover levers, stop
conditions, the drill's own observer) and the measurements at the end (RTO terms, hydrate curve,
hidden dependencies, security floor). Each repeat runs in this process after one warm-up run
(imports and first-call costs are not the drill's); the spec load is timed apart. CPU time is
reported next to wall time: where wall exceeds CPU, the run waited for a core.

    python benchmarks/drill_bench.py                       # 5 repeats of the L5 example
    python benchmarks/drill_bench.py --drill examples/drills/l7-failback.yaml --repeats 3
    python benchmarks/drill_bench.py --profile 25           # cProfile, top 25 by cumulative time
    python benchmarks/drill_bench.py --runs 1000 --executor process --workers 2   # many runs
    python benchmarks/drill_bench.py --baseline main --rounds 3   # old code and this tree

``--baseline REV`` measures ``REV``'s code and this tree's side by side (``side_by_side.py``):
``--rounds`` child processes per side, alternating old and new, each doing the warm-up and
``--repeats`` runs with the same seed; it prints each side's minimum CPU time and the ratio.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DRILL = ROOT / "examples" / "drills" / "l5-region-blackhole.yaml"
TARGET_S = 2.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drill", type=Path, default=DEFAULT_DRILL)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--profile", type=int, default=0, help="profile one run; print the top N")
    ap.add_argument("--json", type=Path, default=None, help="write the numbers as JSON")
    ap.add_argument("--runs", type=int, default=0, help="sweep N runs: drill_runs_bench.py")
    ap.add_argument("--baseline", default=None, help="git revision to measure side by side")
    ap.add_argument("--rounds", type=int, default=3, help="--baseline: children per side")
    args, rest = ap.parse_known_args()
    if args.baseline is not None and not args.runs:
        return _side_by_side(args)
    if args.runs:  # many runs (--executor, --workers …): drill_runs_bench.py's options
        from drill_runs_bench import main as sweep

        more = ["--json", str(args.json)] if args.json is not None else []
        if args.baseline is not None:
            more += ["--baseline", args.baseline]
        return sweep(["--drill", str(args.drill), "--runs", str(args.runs), *rest, *more])
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")

    from firedrill.adapters.worlds import EMBEDDED
    from firedrill.drill.run import run_drill
    from firedrill.specfile import load_drill

    t = time.perf_counter()
    loaded = load_drill(args.drill)
    load_s = time.perf_counter() - t
    spec = loaded.spec
    sim_h = (spec.duration_cap_s or 0.0) / 3600.0

    def once() -> tuple[float, float, str]:
        w, c = time.perf_counter(), time.process_time()
        result = run_drill(
            loaded.spec,
            loaded.fleet,
            loaded.slo,
            loaded.policy,
            seed=args.seed,
            make_world=EMBEDDED,
        )
        return time.perf_counter() - w, time.process_time() - c, result.verdict

    once()  # warm-up
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        once()
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(args.profile)
        return 0
    runs = [once() for _ in range(args.repeats)]
    walls = [w for w, _, _ in runs]
    cpus = [c for _, c, _ in runs]
    out = {
        "drill": spec.name,
        "rung": spec.rung,
        "sim_hours": sim_h,
        "verdict": runs[0][2],
        "repeats": args.repeats,
        "load_s": round(load_s, 3),
        "wall_s": {"min": round(min(walls), 3), "median": round(statistics.median(walls), 3)},
        "cpu_s": {"min": round(min(cpus), 3), "median": round(statistics.median(cpus), 3)},
        "target_wall_s": TARGET_S,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "system": f"{platform.system()} {platform.release()}",
        },
    }
    print(f"{spec.name} ({spec.rung}), {sim_h:g} simulated h, verdict {out['verdict']}")
    print(f"spec load      {load_s:.3f} s")
    print(f"wall  min {min(walls):.3f} s  median {statistics.median(walls):.3f} s")
    print(f"cpu   min {min(cpus):.3f} s  median {statistics.median(cpus):.3f} s")
    met = "met" if min(walls) <= TARGET_S else "NOT met"
    print(f"target: {TARGET_S:g} s wall for a 1 h L5 drill on the demo fleet: {met}")
    if statistics.median(walls) > 1.1 * statistics.median(cpus):
        print("note: wall exceeds CPU by more than 10%: the run waited for a core")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


def _side_by_side(args: argparse.Namespace) -> int:
    from side_by_side import run_child, sides

    child = ["--drill", str(args.drill), "--repeats", str(args.repeats)]
    if args.seed is not None:
        child += ["--seed", str(args.seed)]
    both = sides(args.baseline)
    cpu: dict[str, list[float]] = {label: [] for label, _ in both}
    wall: dict[str, list[float]] = {label: [] for label, _ in both}
    verdicts: dict[str, set[str]] = {label: set() for label, _ in both}
    for r in range(args.rounds):
        for label, src in both:
            got = run_child(Path(__file__).resolve(), child, src)
            cpu[label].append(got["cpu_s"]["min"])
            wall[label].append(got["wall_s"]["min"])
            verdicts[label].add(got["verdict"])
            print(f"round {r + 1} {label:<16} cpu min {got['cpu_s']['min']:.3f} s", flush=True)
    (old, _), (new, _) = both
    ratio = min(cpu[old]) / min(cpu[new])
    print(f"{args.drill.name}: {args.rounds} rounds x {args.repeats} repeats per side")
    for label, _ in both:
        print(
            f"  {label:<16} cpu min {min(cpu[label]):.3f} s  wall min {min(wall[label]):.3f} s"
            f"  verdict {', '.join(sorted(verdicts[label]))}"
        )
    print(f"  old / new (cpu min): {ratio:.2f}x")
    if args.json is not None:
        payload = {
            "drill": str(args.drill.name),
            "baseline": args.baseline,
            "cpu_min_s": {k: min(v) for k, v in cpu.items()},
            "wall_min_s": {k: min(v) for k, v in wall.items()},
            "ratio_old_over_new": round(ratio, 3),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
