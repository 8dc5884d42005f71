"""The fleet spec: what a multi-region GPU fleet looks like, as reviewed in Git.

Pydantic models, because this data crosses a boundary (a YAML file written by a person). Every
number carries its unit in its name. Defaults are the numbers of DESIGN.md and the reference
documents, so a short spec describes a realistic fleet.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from firedrill.model import exporters as _exporters

MAX_REPLICAS = 100_000  # of one model in one cell
MAX_NODES = 100_000  # in a pool, a region's spare capacity, a JobSet

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{12,64}$")
NAME_RE = r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$"

Name = Annotated[str, Field(pattern=NAME_RE, max_length=63)]
Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{12,64}$")]
PositiveFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]

# vLLM's TTFT and TPOT/ITL histogram buckets, exactly as real vLLM exposes them (no 2.0 s TTFT
# boundary: see model.exporters and its reference).
VLLM_TTFT_BUCKETS_S: tuple[float, ...] = _exporters.VLLM_TTFT_BUCKETS_S
VLLM_TPOT_BUCKETS_S: tuple[float, ...] = _exporters.VLLM_ITL_BUCKETS_S

GPU_MEMORY_GB: dict[str, float] = {"H100": 80.0, "H200": 141.0, "A100": 80.0, "B200": 192.0}
GPU_HBM_TBPS: dict[str, float] = {"H100": 3.35, "H200": 4.8, "A100": 2.0, "B200": 8.0}


class StrictModel(BaseModel):
    """Base: unknown keys are errors (a typo must not silently become a default), and every
    number is finite (NaN passes every comparison a check makes, an infinity breaks the twin)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Versions(StrictModel):
    """The node layer: what the fifth change stream tracks."""

    driver: str = "550.90.07"
    firmware: str = "96.00.89.00.01"
    kernel: str = "6.8.0-1015"
    node_image: str = "gpu-ubuntu-22.04-v20261001"
    gpu_operator: str = "v24.6.2"
    dcgm_exporter: str = "3.3.8-3.6.0"


class NodePoolSpec(StrictModel):
    """A homogeneous pool of GPU nodes in one cell."""

    name: Name
    nodes: Annotated[int, Field(ge=0, le=MAX_NODES)]
    gpu: Literal["H100", "H200", "A100", "B200"] = "H100"
    gpus_per_node: Annotated[int, Field(ge=1, le=16)] = 8
    role: Literal["serving", "training"] = "serving"
    nic_gbps: PositiveFloat = 400.0  # north-south, Gb/s (2 x 200 GbE)
    versions: Versions = Versions()


class CellSpec(StrictModel):
    """A cell: the blast-radius unit. Replicas are the initial desired count per model."""

    name: Name
    node_pools: list[NodePoolSpec]
    replicas: dict[str, Annotated[int, Field(ge=0, le=MAX_REPLICAS)]] = {}


class RegistrySpec(StrictModel):
    """The regional weights registry/bucket and the peer-to-peer layer in front of it."""

    origin_gbytes_per_s: PositiveFloat = 100.0  # GB/s the origin can serve in total
    max_requests_per_s: PositiveFloat = 5500.0  # GET/s per prefix before 503 SlowDown
    range_mb: PositiveFloat = 16.0  # ranged GET size
    prefixes: Annotated[int, Field(ge=1)] = 8  # weights are sharded over this many key prefixes
    p2p: bool = True
    p2p_max_hit_rate: Fraction = 0.9  # asymptotic share of bytes served by peers
    p2p_half_saturation_nodes: PositiveFloat = 8.0  # holders at which the hit rate is half max
    # GB/s one holder seeds to its peers (a share of its NIC: it also serves or pulls)
    p2p_upload_gbytes_per_s: PositiveFloat = 5.0
    retry_backoff_s: PositiveFloat = 2.0  # back-off after a 503/429
    parallel_gets: Annotated[int, Field(ge=1, le=1024)] = 16  # ranged GETs a client keeps open


class CapacitySpec(StrictModel):
    """Spare GPU nodes the region can scale into (the autoscaler's headroom)."""

    spare_nodes: Annotated[int, Field(ge=0, le=MAX_NODES)] = 0
    node_provision_s: PositiveFloat = 300.0  # from request to node Ready


class RegionSpec(StrictModel):
    name: Name
    registry: RegistrySpec = RegistrySpec()
    capacity: CapacitySpec = CapacitySpec()
    replication_lag_s: Annotated[float, Field(ge=0)] = 120.0  # cross-region weights replication
    replicate_from: Name | None = None  # the region new digests are replicated from
    cells: list[CellSpec]


class WeightsSpec(StrictModel):
    digest: Digest
    signed: bool = True
    attested: bool = True
    quality: Fraction = 0.97  # true golden-set pass rate of these weights


class ServingConfig(StrictModel):
    max_num_seqs: Annotated[int, Field(ge=1, le=4096)] = 256
    gpu_memory_utilization: Annotated[float, Field(gt=0.1, le=1.0)] = 0.9


class CatalogBundleSpec(StrictModel):
    digest: Digest
    prompt_digest: Digest
    toolset_digest: Digest
    serving_config: ServingConfig = ServingConfig()


class LatencySpec(StrictModel):
    """Per-replica latency curve in the DistServe form.

    prefill(s) = a + b·Σlen + c·Σlen²; decode step(s) = a + b·Σtokens + c·batch.
    Defaults are calibrated to vLLM's CI numbers for a 70B model on 8×H100 (TTFT p50 57 ms and
    p99 111 ms at 1 QPS; prefill of 1k tokens ≈ 78 ms; inter-token latency ≈ 19 ms at batch 1).
    """

    prefill_a_s: Annotated[float, Field(ge=0)] = 0.012
    prefill_b_s_per_token: Annotated[float, Field(ge=0)] = 6.0e-5
    prefill_c_s_per_token2: Annotated[float, Field(ge=0)] = 6.0e-9
    decode_a_s: Annotated[float, Field(ge=0)] = 0.018
    decode_b_s_per_token: Annotated[float, Field(ge=0)] = 1.5e-7
    decode_c_s_per_seq: Annotated[float, Field(ge=0)] = 1.0e-4
    prefill_interference: Annotated[float, Field(ge=0)] = 0.5  # prefill slowdown at full batch
    cold_cache_penalty: Annotated[float, Field(ge=0)] = 0.6  # extra prefill share when cold
    cold_cache_decay_s: PositiveFloat = 600.0  # time constant of prefix-cache re-warming


class DisaggregationSpec(StrictModel):
    """Prefill/decode disaggregation: a share of a pool's replicas only prefill, the rest decode.

    TTFT comes from the prefill replicas' queue and prefill time, TPOT from the decode replicas'
    batch; the KV cache moves from prefill to decode in ``kv_transfer_s`` per request.
    """

    prefill_share: Annotated[float, Field(gt=0, lt=1)] = 0.3
    kv_transfer_s: Annotated[float, Field(ge=0)] = 0.01  # seconds per request (NIXL over RDMA)


class AutoscalerSpec(StrictModel):
    """KEDA-like: scale on utilisation of saturation throughput and on queueing, with cooldowns."""

    enabled: bool = True
    min_replicas: Annotated[int, Field(ge=0)] = 1
    max_replicas: Annotated[int, Field(ge=0)] = 10_000
    target_utilization: Annotated[float, Field(gt=0, le=1)] = 0.7
    scale_out_cooldown_s: PositiveFloat = 60.0
    scale_in_cooldown_s: PositiveFloat = 600.0


class ModelSpec(StrictModel):
    name: Name
    weights_gb: PositiveFloat
    tp: Literal[1, 2, 4, 8] = 1
    kv_bytes_per_token: Annotated[int, Field(gt=0)] = 327_680  # 80 layers x 8 KV heads x d=128
    weights: WeightsSpec
    bundle: CatalogBundleSpec
    serving_image: str = "vllm/vllm-openai:v0.6.3"
    latency: LatencySpec = LatencySpec()
    load_gbytes_per_s: PositiveFloat = 5.0  # local disk -> HBM
    warmup_s: Annotated[float, Field(ge=0)] = 20.0
    queue_timeout_s: PositiveFloat = 60.0
    oom_gpu_memory_utilization: Annotated[float, Field(gt=0, le=1.0)] = 0.95
    autoscaler: AutoscalerSpec = AutoscalerSpec()
    node_pools: list[Name] = []  # node affinity: pools that may host it (empty: any serving pool)
    golden_probes_per_s: Annotated[float, Field(ge=0)] = 0.5  # golden-set probes per cell
    disaggregated: DisaggregationSpec | None = None  # prefill and decode on separate replicas


class TokensSpec(StrictModel):
    """Request shape: prompt length lognormal (median, sigma), output length mean."""

    prompt_median: PositiveFloat = 700.0
    prompt_sigma: Annotated[float, Field(ge=0, le=3)] = 0.31
    output_mean: PositiveFloat = 250.0


class DemandEventSpec(StrictModel):
    """A tenant launch or a spike: demand multiplied for a while."""

    name: Name
    region: Name
    at_s: Annotated[float, Field(ge=0)]
    duration_s: PositiveFloat
    multiplier: Annotated[float, Field(gt=0, le=1_000)]
    tenant: Name | None = None


class ProductSpec(StrictModel):
    name: Name
    model: Name
    # region -> requests/s at the daily peak
    peak_rps: dict[str, Annotated[float, Field(ge=0, le=10_000_000)]]
    diurnal_amplitude: Fraction = 0.4  # trough = peak x (1 - amplitude)
    peak_hour_utc: dict[str, Annotated[float, Field(ge=0, lt=24)]] = {}
    noise: Annotated[float, Field(ge=0, le=1)] = 0.03  # multiplicative, per minute
    tokens: TokensSpec = TokensSpec()
    events: list[DemandEventSpec] = []


class TenantSpec(StrictModel):
    name: Name
    tier: Literal["paid", "free"]
    share: Fraction  # share of each product's demand
    sandboxes: Annotated[int, Field(ge=0, le=100_000)] = 0


class JobSetSpec(StrictModel):
    """A training JobSet: topology and state only for now."""

    name: Name
    region: Name
    cell: Name
    nodes: Annotated[int, Field(ge=1, le=MAX_NODES)]
    queue: Name = "research-h100"
    checkpoint_interval_s: PositiveFloat = 1800.0
    restart_cost_s: PositiveFloat = 600.0


class XidRateSpec(StrictModel):
    """Background fault process: events per 1,000 nodes per day for one fault class."""

    kind: Literal["xid", "ecc_dbe", "row_remap_pending", "link_flap", "thermal", "pcie_replay"]
    xid: int | None = None
    per_1000_node_days: Annotated[float, Field(ge=0, le=100_000)]  # 100 a node a day at most

    @model_validator(mode="after")
    def _xid_needs_code(self) -> XidRateSpec:
        if self.kind == "xid" and self.xid is None:
            raise ValueError("kind 'xid' needs an 'xid' code")
        return self


def _default_fault_rates() -> list[XidRateSpec]:
    # ≈19 remediable events per 1,000 nodes per day overall (reference 000), split by class in
    # proportions that follow public interruption taxonomies; app-level XIDs come on top.
    return [
        XidRateSpec(kind="xid", xid=79, per_1000_node_days=4.0),
        XidRateSpec(kind="xid", xid=48, per_1000_node_days=2.0),
        XidRateSpec(kind="xid", xid=64, per_1000_node_days=1.5),
        XidRateSpec(kind="xid", xid=95, per_1000_node_days=1.5),
        XidRateSpec(kind="xid", xid=119, per_1000_node_days=2.0),
        XidRateSpec(kind="xid", xid=74, per_1000_node_days=2.0),
        XidRateSpec(kind="ecc_dbe", per_1000_node_days=1.0),
        XidRateSpec(kind="link_flap", per_1000_node_days=2.0),
        XidRateSpec(kind="thermal", per_1000_node_days=1.5),
        XidRateSpec(kind="row_remap_pending", per_1000_node_days=1.5),
        XidRateSpec(kind="xid", xid=13, per_1000_node_days=3.0),
        XidRateSpec(kind="xid", xid=31, per_1000_node_days=2.0),
        XidRateSpec(kind="xid", xid=63, per_1000_node_days=1.0),
        XidRateSpec(kind="pcie_replay", per_1000_node_days=1.0),
    ]


# Classes that a remediation controller acts on (the "≈19 per 1,000 nodes per day").
REMEDIABLE_XIDS: frozenset[int] = frozenset({48, 62, 64, 74, 79, 95, 119, 120, 140})
REMEDIABLE_KINDS: frozenset[str] = frozenset(
    {"ecc_dbe", "link_flap", "thermal", "row_remap_pending"}
)


class FaultsSpec(StrictModel):
    background: list[XidRateSpec] = Field(default_factory=_default_fault_rates)
    phantom_xid_exporter_versions: list[str] = []  # DCGM exporter versions that emit phantom XIDs
    phantom_xid_per_node_hour: Annotated[float, Field(ge=0, le=60)] = 0.6
    phantom_xid: int = 79


ServiceKind = Literal["tokenizer", "bundle_api", "signature_mirror", "idp", "registry"]


class ServiceSpec(StrictModel):
    """A service the serving path depends on, where it lives and which regions use it.

    A region cut from the service's region loses it: a tokenizer bucket (new replicas cannot
    finish loading), the CatalogBundle API (bundle changes fail), a signature/TUF mirror
    (admission fails closed for digests it has not verified yet), the IdP that signs probe
    tokens (synthetic probes fail), a registry (pulls from its origin fail).
    """

    name: Name
    kind: ServiceKind
    region: Name
    used_by: list[Name] | Literal["all"] = "all"


class QuiescentSpec(StrictModel):
    """Quiescent steps: advance a quiet fleet in one interval, its queueing in closed form.

    Off by default, and off means the 1-second path bit for bit. On, the twin advances in one
    macro step of up to ``max_step_s`` (a multiple of ``dt_s``; never past the caller's
    ``advance``, an event, a minute's demand noise, the autoscaler's next run, or, while series
    are recorded, the next scrape) whenever the fleet is quiet: no pull, no replica in a
    transitional state, no pool to reconcile, no partition, injected error, training job,
    sandbox, recycling or mirroring, no demand event starting or ending, offered load changing
    by at most ``demand_tolerance`` (relative) over the interval, every pool with load below
    ``max_utilization`` of its seats with a negligible chance of a queue timeout, and every
    pool without load empty. Arrivals are Poisson over the interval; completions, the
    end-of-interval queue and busy seats, and queue waits (TTFT) follow the stationary M/M/c
    (Erlang C) at the interval's mean rate; background faults are drawn over the interval and
    land at its end. Other random numbers than the 1-second path are drawn: results are
    statistically, not bit for bit, the same (errors in BENCHMARKS.md, bounds in the tests).
    """

    enabled: bool = False
    max_step_s: Annotated[float, Field(gt=0, le=300)] = 60.0
    demand_tolerance: Annotated[float, Field(ge=0, le=1)] = 0.02
    max_utilization: Annotated[float, Field(gt=0, lt=1)] = 0.95


class FleetSpec(StrictModel):
    """A whole fleet: regions, cells, models, products, tenants, training and fault rates."""

    name: Name
    dt_s: Annotated[float, Field(gt=0, le=60)] = 1.0
    scrape_interval_s: Annotated[float, Field(gt=0, le=300)] = 15.0
    start_hour_utc: Annotated[float, Field(ge=0, lt=24)] = 0.0
    gpu_hour_usd: PositiveFloat = 2.0
    models: list[ModelSpec]
    regions: list[RegionSpec]
    products: list[ProductSpec]
    tenants: list[TenantSpec] = []
    training: list[JobSetSpec] = []
    faults: FaultsSpec = FaultsSpec()
    # model -> cell -> weight
    routes: dict[str, dict[str, Annotated[int, Field(ge=0, le=1_000_000)]]] = {}
    services: list[ServiceSpec] = []  # dependencies and where they live (optional)
    quiescent: QuiescentSpec = QuiescentSpec()  # opt-in macro steps for a quiet fleet

    @field_validator("models", "regions", "products")
    @classmethod
    def _not_empty(cls, v: list[object]) -> list[object]:
        if not v:
            raise ValueError("must not be empty")
        return v

    @model_validator(mode="after")
    def _references_resolve(self) -> FleetSpec:
        models = {m.name for m in self.models}
        regions = {r.name for r in self.regions}
        cells: dict[str, str] = {}
        for r in self.regions:
            for c in r.cells:
                if c.name in cells:
                    raise ValueError(f"cell '{c.name}' is declared twice")
                cells[c.name] = r.name
                for m in c.replicas:
                    if m not in models:
                        raise ValueError(f"cell '{c.name}' has replicas of unknown model '{m}'")
                _replicas_fit(c, {m.name: m.tp for m in self.models})
            if r.replicate_from is not None and r.replicate_from not in regions:
                raise ValueError(f"region '{r.name}' replicates from unknown '{r.replicate_from}'")
        for p in self.products:
            if p.model not in models:
                raise ValueError(f"product '{p.name}' serves unknown model '{p.model}'")
            for reg in list(p.peak_rps) + list(p.peak_hour_utc):
                if reg not in regions:
                    raise ValueError(f"product '{p.name}' names unknown region '{reg}'")
            for ev in p.events:
                if ev.region not in regions:
                    raise ValueError(f"event '{ev.name}' names unknown region '{ev.region}'")
        for j in self.training:
            if cells.get(j.cell) != j.region:
                raise ValueError(f"jobset '{j.name}': cell '{j.cell}' is not in '{j.region}'")
        for model, weights in self.routes.items():
            if model not in models:
                raise ValueError(f"route for unknown model '{model}'")
            for cell in weights:
                if cell not in cells:
                    raise ValueError(f"route for model '{model}' names unknown cell '{cell}'")
        names = [svc.name for svc in self.services]
        for svc in self.services:
            if names.count(svc.name) > 1:
                raise ValueError(f"service '{svc.name}' is declared twice")
            users = [] if svc.used_by == "all" else svc.used_by
            for reg in [svc.region, *users]:
                if reg not in regions:
                    raise ValueError(f"service '{svc.name}' names unknown region '{reg}'")
        share = sum(t.share for t in self.tenants)
        if self.tenants and abs(share - 1.0) > 1e-6:
            raise ValueError(f"tenant shares must add up to 1 (they add up to {share:g})")
        return self


def _replicas_fit(cell: CellSpec, tp: dict[str, int]) -> None:
    """A cell's initial replicas fit on its serving GPUs (each replica takes ``tp`` of them)."""
    gpus = sum(p.nodes * p.gpus_per_node for p in cell.node_pools if p.role == "serving")
    wanted = sum(n * tp[m] for m, n in cell.replicas.items() if m in tp)
    if wanted > gpus:
        raise ValueError(
            f"cell '{cell.name}' cannot hold its replicas: they need {wanted:,} GPUs, its serving "
            f"pools have {gpus:,}"
        )
