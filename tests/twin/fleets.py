"""Small fleets built in code for fidelity tests: one knob at a time, everything else off."""

from __future__ import annotations

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
    QuiescentSpec,
    RegionSpec,
    RegistrySpec,
    ServingConfig,
    TokensSpec,
    WeightsSpec,
)

D = "sha256:" + "ab" * 32
B = "sha256:" + "cd" * 32


def model(
    *,
    name: str = "llm-70b",
    weights_gb: float = 140.0,
    tp: int = 8,
    latency: LatencySpec | None = None,
    max_num_seqs: int = 256,
    queue_timeout_s: float = 60.0,
) -> ModelSpec:
    return ModelSpec(
        name=name,
        weights_gb=weights_gb,
        tp=tp,
        weights=WeightsSpec(digest=D),
        bundle=CatalogBundleSpec(
            digest=B,
            prompt_digest=B,
            toolset_digest=B,
            serving_config=ServingConfig(max_num_seqs=max_num_seqs),
        ),
        latency=latency or LatencySpec(),
        queue_timeout_s=queue_timeout_s,
        autoscaler=AutoscalerSpec(enabled=False),
    )


def fleet(
    *,
    regions: dict[str, tuple[int, int, int, float]],
    m: ModelSpec,
    tokens: TokensSpec | None = None,
    registry: RegistrySpec | None = None,
) -> FleetSpec:
    """regions: name -> (cells, nodes per cell, replicas per cell, constant demand rps)."""
    region_specs = []
    demand = {}
    for ri, (rname, (cells, nodes, replicas, rps)) in enumerate(regions.items()):
        region_specs.append(
            RegionSpec(
                name=rname,
                registry=registry or RegistrySpec(),
                cells=[
                    CellSpec(
                        name=f"c{ri}-{k}",
                        node_pools=[NodePoolSpec(name="serve", nodes=nodes)],
                        replicas={m.name: replicas},
                    )
                    for k in range(cells)
                ],
            )
        )
        demand[rname] = rps
    return FleetSpec(
        name="fidelity",
        models=[m],
        regions=region_specs,
        products=[
            ProductSpec(
                name="chat",
                model=m.name,
                peak_rps=demand,
                diurnal_amplitude=0.0,
                noise=0.0,
                tokens=tokens or TokensSpec(),
            )
        ],
        faults=FaultsSpec(background=[]),
    )


def flat_latency(service_s: float) -> LatencySpec:
    """A decode curve flat in the batch and no prefill to speak of: with 250 output tokens
    (``TokensSpec(output_mean=250.0)``) every service lasts ``service_s``."""
    return LatencySpec(
        prefill_a_s=0.0,
        prefill_b_s_per_token=1e-9,
        prefill_c_s_per_token2=0.0,
        decode_a_s=service_s / 250.0,
        decode_b_s_per_token=0.0,
        decode_c_s_per_seq=0.0,
        prefill_interference=0.0,
        cold_cache_penalty=0.0,
    )


def erlang_spec(service_s: float, seats: int, replicas: int, cells: int) -> FleetSpec:
    """Cells of identical replicas with a flat decode curve (so services are ``service_s``), at
    50%, 70% and 90% utilisation in regions ``r50``, ``r70`` and ``r90``: the Erlang C oracle's
    fleet."""
    lat = flat_latency(service_s)
    c = seats * replicas
    regions = {
        f"r{int(rho * 100)}": (cells, replicas, replicas, rho * c / service_s * cells)
        for rho in (0.5, 0.7, 0.9)
    }
    m = model(latency=lat, max_num_seqs=seats, queue_timeout_s=300.0)
    return fleet(regions=regions, m=m, tokens=TokensSpec(output_mean=250.0))


def quiet(spec: FleetSpec, *, enabled: bool = True, max_step_s: float = 60.0) -> FleetSpec:
    """``spec`` with quiescent steps on (or off) at ``max_step_s``."""
    return spec.model_copy(
        update={"quiescent": QuiescentSpec(enabled=enabled, max_step_s=max_step_s)}
    )
