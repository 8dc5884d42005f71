"""Write a synthetic fleet spec of about N GPU nodes, shaped like the demo fleet.

Benchmarks need fleets far bigger than the demo's 596 nodes, and a hand-written 10,000-node spec
would be unreadable and drift. This script writes one from a single number: 3 regions, cells of
~80 H100 nodes (~60 for llm-70b, 20 for llm-8b), one 64-node training pool and JobSet in the
first region, and demand sized so the daily peak uses ~55% of serving capacity. The output is a
function of --nodes alone. `examples/fleet-10k.yaml` is its output for --nodes 10000, and a test
checks the two still agree.

    python benchmarks/make_fleet.py --nodes 10000 --out examples/fleet-10k.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from firedrill.model.spec import (
    CapacitySpec,
    CatalogBundleSpec,
    CellSpec,
    DemandEventSpec,
    FaultsSpec,
    FleetSpec,
    JobSetSpec,
    LatencySpec,
    ModelSpec,
    NodePoolSpec,
    ProductSpec,
    RegionSpec,
    ServingConfig,
    TenantSpec,
    WeightsSpec,
)

# (region, cell-name prefix, local peak hour UTC), as in the demo fleet.
REGIONS: tuple[tuple[str, str, float], ...] = (
    ("us-east-1", "use1", 18.0),
    ("us-west-2", "usw2", 21.0),
    ("eu-west-1", "euw1", 13.0),
)
NODES_70B_PER_CELL = 60  # TP=8: one llm-70b replica per node
NODES_8B_PER_CELL = 20  # TP=1: eight llm-8b replicas per node
FREE_70B_NODES_PER_CELL = 4  # left free in each llm-70b pool for drains and bad nodes
REPLICAS_8B_PER_NODE = 8
CELL_NODES = NODES_70B_PER_CELL + NODES_8B_PER_CELL
TRAIN_NODES = 64
MIN_NODES = CELL_NODES + TRAIN_NODES

PEAK_UTILISATION = 0.55  # share of serving capacity used at the daily peak
RPS_PER_70B_REPLICA = 11.0  # requests/s at saturation
RPS_PER_8B_REPLICA = 30.0  # requests/s at saturation
SPARE_NODE_SHARE = 0.01  # spare nodes per region, as a share of its serving nodes
MIN_SPARE_NODES = 8


def _models() -> list[ModelSpec]:
    serving = ServingConfig(max_num_seqs=256, gpu_memory_utilization=0.9)
    return [
        ModelSpec(
            name="llm-70b",
            node_pools=["h100-serve"],
            weights_gb=140.0,
            tp=8,
            kv_bytes_per_token=327_680,
            weights=WeightsSpec(
                digest="sha256:c0aeef6e40544cc331ffc43f741e0ff0266afaa635732d0f8db54d1f084152ba"
            ),
            bundle=CatalogBundleSpec(
                digest="sha256:7691ffd7deaf32c37adfa4d02aea282c2ab75d2c491f3fd3b5b4c2ebf5cfd560",
                prompt_digest=(
                    "sha256:a6a86dd782a853d77965a92e84e6c7993ae0153a7a4c30c6ee2ba26463ffa9ba"
                ),
                toolset_digest=(
                    "sha256:b8ab67ff48453cea6ef74a9d471126b44048c36303eafb6b03a88aab7a9a4e41"
                ),
                serving_config=serving,
            ),
        ),
        ModelSpec(
            name="llm-8b",
            node_pools=["h100-serve-8b"],
            weights_gb=16.0,
            tp=1,
            kv_bytes_per_token=131_072,
            weights=WeightsSpec(
                digest="sha256:ae00178901f7648b618d3dde7e6c1147478e51eefa4d1b763e96998be335fbe4"
            ),
            bundle=CatalogBundleSpec(
                digest="sha256:b74facb3d43df19f8278c172de3608c1163d827cb7f2f6668c9483cc42c34e54",
                prompt_digest=(
                    "sha256:f7035c66dba250c177c6bc9b3499be9a4926daa5185634eb880e8e176a7b0cee"
                ),
                toolset_digest=(
                    "sha256:f58deb58ce2e9a5b7979344c5f80b707432d4f534da63b160f42a28253c1b86c"
                ),
                serving_config=serving,
            ),
            latency=LatencySpec(
                prefill_a_s=0.005,
                prefill_b_s_per_token=8.0e-6,
                prefill_c_s_per_token2=0.0,
                decode_a_s=0.008,
                decode_b_s_per_token=3.0e-8,
                decode_c_s_per_seq=3.0e-5,
            ),
        ),
    ]


def _split(total: int, parts: int) -> list[int]:
    """`total` split into `parts` near-equal integers, larger ones first."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def make_fleet(nodes: int) -> FleetSpec:
    """A fleet of exactly `nodes` GPU nodes (at least MIN_NODES)."""
    if nodes < MIN_NODES:
        raise ValueError(f"a fleet needs at least {MIN_NODES} nodes, not {nodes}")
    serving_nodes = nodes - TRAIN_NODES
    n_cells = max(1, round(serving_nodes / CELL_NODES))
    # The rounding remainder (|r| <= CELL_NODES/2) is spread one node at a time over the
    # llm-70b pools of the first cells, so the total is exact.
    remainder = serving_nodes - n_cells * CELL_NODES
    step = 1 if remainder > 0 else -1
    cells_per_region = _split(n_cells, len(REGIONS))

    regions: list[RegionSpec] = []
    chat_rps: dict[str, float] = {}
    code_rps: dict[str, float] = {}
    cell_index = 0
    for r, ((region, prefix, _), n_region_cells) in enumerate(
        zip(REGIONS, cells_per_region, strict=True)
    ):
        cells: list[CellSpec] = []
        replicas_70b = replicas_8b = region_serving_nodes = 0
        for c in range(n_region_cells):
            nodes_70b = NODES_70B_PER_CELL + (step if cell_index < abs(remainder) else 0)
            cell_index += 1
            pools = [
                NodePoolSpec(name="h100-serve", nodes=nodes_70b),
                NodePoolSpec(name="h100-serve-8b", nodes=NODES_8B_PER_CELL),
            ]
            if r == 0 and c == n_region_cells - 1:
                pools.append(NodePoolSpec(name="h100-train", nodes=TRAIN_NODES, role="training"))
            replicas = {
                "llm-70b": nodes_70b - FREE_70B_NODES_PER_CELL,
                "llm-8b": NODES_8B_PER_CELL * REPLICAS_8B_PER_NODE,
            }
            cells.append(
                CellSpec(name=f"{prefix}-{c + 1:03d}", node_pools=pools, replicas=replicas)
            )
            replicas_70b += replicas["llm-70b"]
            replicas_8b += replicas["llm-8b"]
            region_serving_nodes += nodes_70b + NODES_8B_PER_CELL
        spare = max(MIN_SPARE_NODES, round(SPARE_NODE_SHARE * region_serving_nodes))
        regions.append(
            RegionSpec(
                name=region,
                capacity=CapacitySpec(spare_nodes=spare),
                replicate_from=None if r == 0 else REGIONS[0][0],
                cells=cells,
            )
        )
        chat_rps[region] = float(round(PEAK_UTILISATION * RPS_PER_70B_REPLICA * replicas_70b))
        code_rps[region] = float(round(PEAK_UTILISATION * RPS_PER_8B_REPLICA * replicas_8b))

    peak_hours = {region: hour for region, _, hour in REGIONS}
    launch = DemandEventSpec(
        name="globex-launch",
        region=REGIONS[1][0],
        tenant="globex",
        at_s=7200.0,
        duration_s=3600.0,
        multiplier=1.3,
    )
    return FleetSpec(
        name=f"synthetic-{nodes}",
        models=_models(),
        regions=regions,
        products=[
            ProductSpec(
                name="chat",
                model="llm-70b",
                peak_rps=chat_rps,
                peak_hour_utc=peak_hours,
                diurnal_amplitude=0.4,
                events=[launch],
            ),
            ProductSpec(
                name="code",
                model="llm-8b",
                peak_rps=code_rps,
                peak_hour_utc=peak_hours,
                diurnal_amplitude=0.4,
            ),
        ],
        tenants=[
            TenantSpec(name="acme", tier="paid", share=0.6, sandboxes=40),
            TenantSpec(name="globex", tier="free", share=0.4, sandboxes=20),
        ],
        training=[
            JobSetSpec(
                name="pretrain-405b",
                region=REGIONS[0][0],
                cell=f"{REGIONS[0][1]}-{cells_per_region[0]:03d}",
                nodes=TRAIN_NODES,
            )
        ],
        faults=FaultsSpec(phantom_xid_exporter_versions=["3.3.9-3.6.1"]),
    )


FLOW_MAX_CHARS = 72  # a mapping of scalars this short is written on one line


class _Flow(dict[str, object]):
    """A mapping to write on one line, `{name: h100-serve, nodes: 60}`."""


class _Dumper(yaml.SafeDumper):
    pass


def _represent_flow(dumper: yaml.SafeDumper, data: _Flow) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=True)


_Dumper.add_representer(_Flow, _represent_flow)


def _compact(data: object) -> object:
    """Mark short mappings of scalars for one-line output; everything else stays in blocks."""
    if isinstance(data, dict):
        items = {str(k): _compact(v) for k, v in data.items()}
        scalars = all(not isinstance(v, dict | list) for v in items.values())
        width = sum(len(k) + len(str(v)) + 4 for k, v in items.items())
        return _Flow(items) if scalars and width <= FLOW_MAX_CHARS else items
    if isinstance(data, list):
        return [_compact(v) for v in data]
    return data


def render_fleet(nodes: int) -> str:
    """The YAML text of `make_fleet(nodes)`: defaults left out, short mappings on one line."""
    data = make_fleet(nodes).model_dump(mode="json", exclude_defaults=True)
    header = (
        f"# A synthetic fleet of {nodes} GPU nodes, written by benchmarks/make_fleet.py "
        f"--nodes {nodes}.\n"
        "# Regenerate it rather than editing it: a test checks that the two agree.\n"
    )
    body = yaml.dump(_compact(data), Dumper=_Dumper, sort_keys=False, default_flow_style=False)
    return header + body


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, required=True, help="GPU nodes in the fleet")
    parser.add_argument("--out", type=Path, required=True, help="where to write the YAML")
    args = parser.parse_args(argv)
    if args.nodes < MIN_NODES:
        parser.error(f"--nodes must be at least {MIN_NODES}")
    args.out.write_text(render_fleet(args.nodes), encoding="utf-8")
    print(f"wrote {args.out}: {args.nodes} nodes")


if __name__ == "__main__":
    main()
