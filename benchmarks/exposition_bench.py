"""How long one scrape of ``twin serve`` takes to render: the classic text format of every series.

Runs the twin on a fleet for two simulated minutes, takes each series' latest sample (what a
scrape sees), adds the labels the real exporters write (``exporter_labels``) and renders them with
``to_prometheus_text`` (prometheus_client, with each family's ``# HELP``) several times; prints
the series count, the bytes and the best wall time. A number, never an assertion.

    .venv/bin/python benchmarks/exposition_bench.py [--fleet examples/fleet-10k.yaml] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from firedrill.model.series import Series
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin
from firedrill.twin.exposition import exporter_labels, to_prometheus_text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", default="examples/fleet.yaml")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    spec = load_fleet(args.fleet)
    twin = Twin(spec, 0, hours_hint=1.0)
    for _ in range(round(120 / spec.dt_s)):
        twin.step()
    t = twin.store.times[-1]
    series = exporter_labels(
        [
            Series(s.name.split("|", 1)[0], s.labels, s.t_s, s.values)
            for name in twin.series_names()
            for s in twin.query(name, start_s=t, end_s=t)
        ]
    )
    best_s = float("inf")
    size = 0
    for _ in range(args.repeat):
        start = time.perf_counter()
        size = len(to_prometheus_text(series))
        best_s = min(best_s, time.perf_counter() - start)
    print(
        f"{args.fleet}: {len(series)} series, {size} bytes, one scrape rendered in "
        f"{best_s * 1000:.0f} ms (best of {args.repeat}); {platform.machine()}, "
        f"{os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
