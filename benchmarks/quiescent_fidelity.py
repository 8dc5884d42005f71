"""Quiescent steps against the 1-second path on the fidelity oracles, seed by seed.

The quiescent option (``FleetSpec.quiescent``) draws other random numbers than the 1-second
path, so its results are compared with the oracles the twin is held to, not bit for bit:

* Erlang C mean queue wait at 2 s and 20 s services, 50%, 70% and 90% utilisation
  (the cells of ``tests/twin/test_fidelity.py``: c = 16 and c = 8);
* TTFT p50 / p99 of a cell of 70B replicas at 1 QPS against vLLM's CI numbers (57 / 111 ms);
* the 14.4x fast-burn page on a total outage 5 minutes in (workbook time 51.8 s).

Each row prints, per seed, the 1-second path's error and the quiescent path's, with each
side's CPU seconds:

    .venv/bin/python benchmarks/quiescent_fidelity.py --seeds 11,12,13
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.twin.fleets import erlang_spec, fleet, model, quiet  # noqa: E402

from firedrill.model import operations as ops  # noqa: E402
from firedrill.twin.engine import Twin  # noqa: E402
from firedrill.twin.serving import erlang_c_wait_s, quantile_from_hist  # noqa: E402


def erlang_errors(
    service_s: float, seats: int, replicas: int, cells: int, hours: float, seed: int, on: bool
) -> tuple[dict[float, float], float]:
    """Relative error of the mean wait against Erlang C per utilisation, and CPU seconds."""
    spec = quiet(erlang_spec(service_s, seats, replicas, cells), enabled=on)
    t0 = time.process_time()
    twin = Twin(spec, seed=seed, record=False)
    twin.run_for(hours * 3600)
    twin.flush_ttft()
    cpu = time.process_time() - t0
    c = seats * replicas
    out = {}
    for rho in (0.5, 0.7, 0.9):
        pools = np.nonzero(twin.pool_region == twin.region_index[f"r{int(rho * 100)}"])[0]
        measured = twin.queue_wait_sum[pools].sum() / twin.admitted_total[pools].sum()
        expected = erlang_c_wait_s(c, rho * c / service_s, service_s)
        out[rho] = float(measured / expected - 1.0)
    return out, cpu


def ttft_errors(seed: int, on: bool, hours: float = 4.0) -> tuple[float, float, float]:
    spec = quiet(fleet(regions={"r": (1, 8, 8, 1.0)}, m=model()), enabled=on)
    t0 = time.process_time()
    twin = Twin(spec, seed=seed, record=False)
    twin.run_for(hours * 3600)
    twin.flush_ttft()
    cpu = time.process_time() - t0
    p50 = quantile_from_hist(twin.ttft_hist[0], twin.edges, 0.5)
    p99 = quantile_from_hist(twin.ttft_hist[0], twin.edges, 0.99)
    return p50 / 0.057 - 1.0, p99 / 0.111 - 1.0, cpu


def page_time(seed: int, on: bool) -> tuple[float, float, float]:
    """Seconds after a total outage 5 min in to the first and second tier, and CPU seconds."""
    from firedrill.detect.evaluator import BurnRateEvaluator
    from firedrill.detect.slo import Objective, SloSpec

    slo = SloSpec(
        objectives=[
            Objective(name="a", product="p", model="llm-70b", sli="availability", target=0.999)
        ]
    )
    spec = quiet(fleet(regions={"r": (1, 8, 8, 20.0)}, m=model()), enabled=on)
    t0 = time.process_time()
    twin = Twin(spec, seed=seed, record=True)
    burn = BurnRateEvaluator(slo, twin)
    burn.evaluate()
    while twin.t < 300.0 - 1e-9:
        twin.run_for(15.0)
        burn.evaluate()
    burn.backfill()
    twin.apply(ops.InjectServingErrors("llm-70b", "c0-0", 1.0))
    fired: dict[str, float] = {}
    while twin.t < 900.0 - 1e-9:
        twin.run_for(15.0)
        for ev in burn.evaluate():
            if ev.state == "firing":
                fired.setdefault(ev.label("burn_tier"), twin.t - 300.0)
    times = sorted(fired.values())
    return times[0], times[1], time.process_time() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="11,12,13")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    for label, (svc, seats, reps, cells, hours) in {
        "Erlang C, 20 s services, c = 8, 40 cells, 8 h": (20.0, 2, 4, 40, 8.0),
        "Erlang C, 2 s services, c = 16, 20 cells, 2 h": (2.0, 2, 8, 20, 2.0),
    }.items():
        print(label + ": mean wait / Erlang C - 1 at 50 / 70 / 90 %")
        for seed in seeds:
            row = []
            for on in (False, True):
                err, cpu = erlang_errors(svc, seats, reps, cells, hours, seed, on)
                row.append(
                    " ".join(f"{100 * err[r]:+6.2f}%" for r in (0.5, 0.7, 0.9)) + f" ({cpu:.1f} s)"
                )
            print(f"  seed {seed:>3}  1 s: {row[0]}   quiescent: {row[1]}")
    print("TTFT at 1 QPS, 4 h: p50 / 57 ms - 1, p99 / 111 ms - 1")
    for seed in seeds:
        outs = []
        for on in (False, True):
            e50, e99, cpu = ttft_errors(seed, on)
            outs.append(f"{100 * e50:+6.2f}% {100 * e99:+6.2f}% ({cpu:.1f} s)")
        print(f"  seed {seed:>3}  1 s: {outs[0]}   quiescent: {outs[1]}")
    print("Outage 5 min in: 14.4x page (workbook 51.8 s) and 6x page (129.6 s), s after")
    for seed in seeds:
        outs = []
        for on in (False, True):
            a, b, cpu = page_time(seed, on)
            outs.append(f"{a:6.1f} {b:6.1f} ({cpu:.1f} s)")
        print(f"  seed {seed:>3}  1 s: {outs[0]}   quiescent: {outs[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
