"""The twin's ensemble side by side with lone twins: CPU per member-step, same seeds, same bits.

For each ensemble size R, R lone twins of the fleet step ``--steps`` seconds one after the other,
and an ensemble of the same R (fleet, seed) pairs steps them in lockstep (``firedrill.twin.
ensemble``). Both sides are timed with ``time.process_time`` per phase of the step — up to serving
(events, reconcile, pulls), serving, after serving (autoscaler, faults, sub-simulations, scrape)
— alternately, ``--rounds`` times, and the minimum is kept. At the end every member's serving
state and generator are compared with its lone twin's: a figure is printed only for equal runs.

    .venv/bin/python benchmarks/ensemble_bench.py --members 1,4,16,32 --steps 600
    .venv/bin/python benchmarks/ensemble_bench.py --fleet examples/fleet-10k.yaml --members 4

The drill sweep with and without ensembles is ``drill_runs_bench.py --batch 1,16``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from firedrill.specfile import load_fleet  # noqa: E402
from firedrill.twin.engine import Twin  # noqa: E402
from firedrill.twin.ensemble import TwinEnsemble  # noqa: E402

STATE = ("queue", "busy", "ok", "errors", "requests", "tpot_hist", "kv_usage_sum", "lam_warm")


def _timed(steps: int, begin: Any, serve: Any, end: Any) -> dict[str, float]:
    """CPU seconds of each phase over ``steps`` calls of begin, serve, end."""
    cpu = {"begin": 0.0, "serve": 0.0, "end": 0.0}
    for _ in range(steps):
        c0 = time.process_time()
        begin()
        c1 = time.process_time()
        serve()
        c2 = time.process_time()
        end()
        c3 = time.process_time()
        cpu["begin"] += c1 - c0
        cpu["serve"] += c2 - c1
        cpu["end"] += c3 - c2
    return cpu


def _lone(fleet: Any, seeds: list[int], steps: int) -> tuple[dict[str, float], list[Twin]]:
    twins = [Twin(fleet, s, hours_hint=steps / 3600.0 + 0.05) for s in seeds]
    cpu = {"begin": 0.0, "serve": 0.0, "end": 0.0}
    for t in twins:  # one lone twin after the other
        for phase, v in _timed(steps, t.step_begin, t._serve, t.step_end).items():
            cpu[phase] += v
    return cpu, twins


def _together(fleet: Any, seeds: list[int], steps: int) -> tuple[dict[str, float], list[Twin]]:
    ens = TwinEnsemble([(fleet, s) for s in seeds], steps / 3600.0 + 0.05)
    twins = ens.twins

    def begin() -> None:
        for t in twins:
            t.step_begin()

    def end() -> None:
        for t in twins:
            t.step_end()

    return _timed(steps, begin, lambda: ens.serve.serve(twins), end), twins


def _same(a: list[Twin], b: list[Twin]) -> bool:
    for x, y in zip(a, b, strict=True):
        if x.rng.bit_generator.state != y.rng.bit_generator.state:
            return False
        if any(not np.array_equal(getattr(x, n), getattr(y, n)) for n in STATE):
            return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleet", type=Path, default=ROOT / "examples" / "fleet.yaml")
    ap.add_argument("--members", default="1,4,16,32", help="ensemble sizes, comma list")
    ap.add_argument("--steps", type=int, default=600, help="seconds each member steps")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    fleet = load_fleet(args.fleet)
    rows = []
    print(f"fleet {fleet.name}, {args.steps} steps per member, min of {args.rounds} rounds")
    print(f"load average {os.getloadavg()[0]:.1f}; µs of CPU per member-step")
    head = f"{'R':>3} | {'lone: begin serve end total':>30} | "
    print(head + f"{'ensemble: begin serve end total':>34} | step ×  serve ×")
    for r in (int(x) for x in args.members.split(",")):
        seeds = [args.seed + k for k in range(r)]
        best: dict[str, dict[str, float]] = {}
        equal = True
        for _ in range(args.rounds):
            lone, lt = _lone(fleet, seeds, args.steps)
            tog, et = _together(fleet, seeds, args.steps)
            equal = equal and _same(lt, et)
            for side, cpu in (("lone", lone), ("ensemble", tog)):
                total = sum(cpu.values())
                if side not in best or total < sum(best[side].values()):
                    best[side] = cpu
        if not equal:
            print(f"{r:>3} | members differ from their lone twins: no figure", file=sys.stderr)
            return 1
        per = {
            side: {k: v / (r * args.steps) * 1e6 for k, v in cpu.items()}
            for side, cpu in best.items()
        }
        lo, en = per["lone"], per["ensemble"]
        lo_t, en_t = sum(lo.values()), sum(en.values())
        print(
            f"{r:>3} | {lo['begin']:6.1f} {lo['serve']:6.1f} {lo['end']:6.1f} {lo_t:7.1f} "
            f"| {en['begin']:6.1f} {en['serve']:6.1f} {en['end']:6.1f} {en_t:7.1f}    "
            f"| {lo_t / en_t:5.2f}× {lo['serve'] / en['serve']:5.2f}×"
        )
        rows.append({"members": r, "lone_us": lo, "ensemble_us": en, "identical": equal})
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "fleet": fleet.name,
                    "steps": args.steps,
                    "rows": rows,
                    "machine": {
                        "cpu": platform.processor() or platform.machine(),
                        "cores": os.cpu_count(),
                        "python": platform.python_version(),
                    },
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
