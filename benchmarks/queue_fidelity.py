"""Measure the twin's mean queue wait against Erlang C over service times and utilisations.

The fidelity tests pin two points (20 s and 2 s services); this sweeps the range the fleet spec
allows, with the tests' shape of fleet (identical cells of c seats at a constant Poisson load,
flat decode curve, seed 11), and prints the relative error per (service, utilisation):

    PYTHONPATH=src python benchmarks/queue_fidelity.py --services 1,2,5,30 --hours 2
"""

from __future__ import annotations

import argparse

import numpy as np

from firedrill.model.spec import (
    AutoscalerSpec,
    CatalogBundleSpec,
    CellSpec,
    FaultsSpec,
    FleetSpec,
    LatencySpec,
    ModelSpec,
    NodePoolSpec,
    ProductSpec,
    RegionSpec,
    ServingConfig,
    TokensSpec,
    WeightsSpec,
)
from firedrill.twin.engine import Twin
from firedrill.twin.serving import erlang_c_wait_s

DIGEST = "sha256:" + "ab" * 32
BUNDLE = "sha256:" + "cd" * 32


def _spec(service_s: float, seats: int, replicas: int, cells: int, rhos: list[float]) -> FleetSpec:
    lat = LatencySpec(
        prefill_a_s=0.0,
        prefill_b_s_per_token=1e-9,
        prefill_c_s_per_token2=0.0,
        decode_a_s=service_s / 250.0,
        decode_b_s_per_token=0.0,
        decode_c_s_per_seq=0.0,
        prefill_interference=0.0,
        cold_cache_penalty=0.0,
    )
    m = ModelSpec(
        name="llm-70b",
        weights_gb=140.0,
        tp=8,
        weights=WeightsSpec(digest=DIGEST),
        bundle=CatalogBundleSpec(
            digest=BUNDLE,
            prompt_digest=BUNDLE,
            toolset_digest=BUNDLE,
            serving_config=ServingConfig(max_num_seqs=seats),
        ),
        latency=lat,
        queue_timeout_s=300.0,
        autoscaler=AutoscalerSpec(enabled=False),
    )
    c = seats * replicas
    regions = [
        RegionSpec(
            name=f"r{int(rho * 100)}",
            cells=[
                CellSpec(
                    name=f"c{ri}-{k}",
                    node_pools=[NodePoolSpec(name="serve", nodes=replicas)],
                    replicas={m.name: replicas},
                )
                for k in range(cells)
            ],
        )
        for ri, rho in enumerate(rhos)
    ]
    demand = {f"r{int(rho * 100)}": rho * c / service_s * cells for rho in rhos}
    return FleetSpec(
        name="queue-fidelity",
        models=[m],
        regions=regions,
        products=[
            ProductSpec(
                name="chat",
                model=m.name,
                peak_rps=demand,
                diurnal_amplitude=0.0,
                noise=0.0,
                tokens=TokensSpec(output_mean=250.0),
            )
        ],
        faults=FaultsSpec(background=[]),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--services", default="1,2,5,10,30", help="mean service times, seconds")
    ap.add_argument("--rhos", default="0.5,0.7,0.9,0.95", help="utilisations")
    ap.add_argument("--seats", type=int, default=2, help="max_num_seqs per replica")
    ap.add_argument(
        "--replicas", type=int, default=8, help="replicas per cell (c = seats x replicas)"
    )
    ap.add_argument("--cells", type=int, default=40)
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    rhos = [float(x) for x in args.rhos.split(",")]
    c = args.seats * args.replicas
    print(f"{'service s':>9} {'rho':>5} {'twin s':>9} {'Erlang C s':>10} {'error':>7}")
    for service_s in (float(x) for x in args.services.split(",")):
        spec = _spec(service_s, args.seats, args.replicas, args.cells, rhos)
        twin = Twin(spec, seed=args.seed, record=False)
        twin.run_for(args.hours * 3600)
        twin.flush_ttft()
        for rho in rhos:
            pools = np.nonzero(twin.pool_region == twin.region_index[f"r{int(rho * 100)}"])[0]
            waited = float(twin.queue_wait_sum[pools].sum()) / int(twin.admitted_total[pools].sum())
            expected = erlang_c_wait_s(c, rho * c / service_s, service_s)
            err = (waited / expected - 1.0) * 100.0
            print(f"{service_s:9.1f} {rho:5.2f} {waited:9.4f} {expected:10.4f} {err:+6.1f}%")


if __name__ == "__main__":
    main()
