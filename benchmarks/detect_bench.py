"""What detection adds to a twin run: the demo fleet for 24 simulated hours, with and without
the in-process evaluation of every burn-rate alert of an SLO spec at every scrape.

Prints the wall time of both runs, the overhead in percent (target: at most 20%), the cost per
evaluation step and per evaluated series (objectives x cells x windows). Each run is in its own
process so neither warms the other's caches.

    python benchmarks/detect_bench.py                      # demo fleet, 24 h, examples/slo.yaml
    python benchmarks/detect_bench.py --hours 2 --fleet examples/fleet-10k.yaml
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, time
from firedrill.specfile import load_fleet, load_spec
from firedrill.detect.slo import SloSpec
from firedrill.detect.evaluator import BurnRateEvaluator
from firedrill.detect.monitor import watch
from firedrill.twin.engine import Twin

fleet, slo_path = sys.argv[1], sys.argv[2]
hours, seed, detect = float(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
spec = load_fleet(fleet)
slo = load_spec(slo_path, SloSpec)
twin = Twin(spec, seed, hours_hint=hours)
t0 = time.perf_counter()
evals = 0
if detect:
    ev = BurnRateEvaluator(slo, twin)
    events = watch(twin, ev, seconds=hours * 3600, every_s=spec.scrape_interval_s)
    evals = ev.evaluations
    cells = len(ev.cells)
else:
    twin.run_for(hours * 3600)
    events, cells = [], 0
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "evaluations": evals, "cells": cells,
                  "objectives": len(slo.objectives), "windows": len(slo.windows()),
                  "tiers": len(slo.tiers), "alert_events": len(events)}))
"""


def run(fleet: str, slo: str, hours: float, seed: int, detect: bool) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, fleet, slo, str(hours), str(seed), "1" if detect else "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--fleet", default="examples/fleet.yaml")
    ap.add_argument("--slo", default="examples/slo.yaml")
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    base = run(args.fleet, args.slo, args.hours, args.seed, detect=False)
    det = run(args.fleet, args.slo, args.hours, args.seed, detect=True)
    extra = det["wall_s"] - base["wall_s"]
    evals = max(det["evaluations"], 1)
    series = det["objectives"] * det["cells"] * det["windows"]
    print(f"fleet {args.fleet}, {args.hours:g} simulated hours, SLO {args.slo}")
    print(f"  twin alone          {base['wall_s']:8.2f} s")
    print(f"  twin + detection    {det['wall_s']:8.2f} s")
    share = 100 * extra / base["wall_s"]
    print(f"  overhead            {extra:8.2f} s  ({share:.1f}%, target <= 20%)")
    print(
        f"  per evaluation      {1e3 * extra / evals:8.3f} ms  ({int(evals)} evaluations of "
        f"{int(det['objectives'])} objectives x {int(det['tiers'])} tiers)"
    )
    print(
        f"  per series          {1e6 * extra / evals / max(series, 1):8.2f} us  "
        f"({int(series)} error-ratio series: objectives x cells x windows)"
    )
    print(f"  alert state changes {int(det['alert_events'])}")


if __name__ == "__main__":
    main()
