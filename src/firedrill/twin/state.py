"""The twin's state: topology, pools, digests, replicas and their lifecycle, the event heap and
the change log.

``TwinState`` holds every array and table the engine's concepts share and the few operations on
them that all of those concepts use: creating a replica and moving it from state to state (which
keeps the per-pool ready counts, the golden-set digest mix and the replica log in step), pushing
a timed event, and noting a change in the change log. Each concept of the engine is a class on
top of it (``scheduling``, ``capacity``, ``traffic``, ``hydrate``, ``remediation``,
``operations``, ``scrape``), and ``engine.Twin`` puts them together and owns the sub-simulations.

Layout: per-pool arrays (a pool is one model in one cell) carry the serving state and are updated
every step; replicas, nodes and pulls change rarely and are driven by an event heap, so the cost
of a step does not grow with the number of nodes.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from firedrill.errors import UnknownTargetError
from firedrill.model import operations as ops
from firedrill.model.changes import ChangeEvent, ChangeStream
from firedrill.model.series import Labels
from firedrill.model.spec import VLLM_TPOT_BUCKETS_S, VLLM_TTFT_BUCKETS_S, FleetSpec, ModelSpec
from firedrill.twin.demand import Demand
from firedrill.twin.faults import FaultEvent, FaultProcess
from firedrill.twin.recorder import SeriesStore
from firedrill.twin.replica import STATE_NAMES, DigestInfo, Node, Replica, ReplicaState
from firedrill.twin.serving import (
    PoolShape,
    TtftBinner,
    decode_step_s,
    fine_edges,
    kv_capacity_tokens,
    mean_prefill_s,
)
from firedrill.twin.supply import Supply

if TYPE_CHECKING:
    from firedrill.twin.disagg import Disaggregation
    from firedrill.twin.quality import GoldenSet
    from firedrill.twin.recovery import RecoveryFeatures
    from firedrill.twin.sandbox import SandboxSim
    from firedrill.twin.training import TrainingSim

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

PENDING = ReplicaState.PENDING
WARMING = ReplicaState.WARMING
READY = ReplicaState.READY
GONE = ReplicaState.GONE
TTFT_EXPORT = np.array(VLLM_TTFT_BUCKETS_S)
TPOT_EXPORT = np.array(VLLM_TPOT_BUCKETS_S)


class TwinState:
    """Everything the twin knows, built from a validated ``FleetSpec`` and a seed."""

    # The sub-simulations the state calls back (a replica that becomes ready changes the
    # golden-set digest mix and the ready curve); ``engine.Twin`` builds them on this state.
    golden: GoldenSet
    recovery: RecoveryFeatures
    training: TrainingSim
    sandbox: SandboxSim

    def __init__(self, spec: FleetSpec, seed: int, *, record: bool, hours_hint: float) -> None:
        self.spec = spec
        self.seed = seed
        # Independent streams: demand and background faults do not depend on what the serving
        # model draws, so two runs with the same seed see the same offered load and the same
        # faults whatever levers one of them pulls (control vs treatment comparisons).
        serving_ss, demand_ss, fault_ss = np.random.SeedSequence(seed).spawn(3)
        self.rng = np.random.default_rng(serving_ss)
        self._demand_rng = np.random.default_rng(demand_ss)
        self._fault_rng = np.random.default_rng(fault_ss)
        self.dt = spec.dt_s
        self.t = 0.0
        self.step_no = 0
        self._heap: list[tuple[float, int, str, tuple[int, ...]]] = []
        self._seq = 0
        self.changes_log: list[ChangeEvent] = []
        self.journal: list[ops.Applied] = []
        self._build_topology()
        self.pd: Disaggregation | None = None  # set by the engine once the pools exist
        self._build_pools()
        self.demand = Demand(spec, self._demand_rng)
        self.faults = FaultProcess(spec.faults, len(self.nodes), 8, self._fault_rng)
        self.supply = Supply([r.registry for r in spec.regions])
        self.fault_log: list[FaultEvent] = []
        self.dcgm: dict[tuple[int, int, int], float] = {}  # (node, gpu, field) -> value
        self.flags: dict[str, str] = {}
        self.quarantined_pods: set[str] = set()
        self.partitions: set[tuple[str, str, str]] = set()
        self.replication_paused: set[tuple[int, int]] = set()
        self.pending_replication: list[tuple[int, int, int]] = []  # (source, target, digest)
        self.capacity_denied: set[int] = set()
        self.capacity_errors = 0
        self.admission = {"admitted": 0, "denied": 0}
        self.scrapes = 0
        n_scrapes = int(hours_hint * 3600.0 / spec.scrape_interval_s) + 2
        self.store = SeriesStore(spec.scrape_interval_s, n_scrapes if record else 1)
        self.record = record
        self.burn_in: dict[str, tuple[float, bool, str]] = {}  # node -> (at, passed, detail)
        self.quarantine_actions: dict[int, int] = {}  # node -> quarantine taints applied
        # node series last written per node (remediation._record_node), to zero what went away
        self._taint_series: dict[str, set[Labels]] = {}
        self._label_series: dict[str, Labels] = {}

    # -- construction -------------------------------------------------------------------------
    def _build_topology(self) -> None:
        spec = self.spec
        self.region_names = [r.name for r in spec.regions]
        self.cell_names: list[str] = []
        self.cell_region: list[int] = []
        self.cell_gpu: list[str] = []
        self.nodes: list[Node] = []
        self.cell_nodes: list[list[int]] = []
        for ri, r in enumerate(spec.regions):
            for c in r.cells:
                ci = len(self.cell_names)
                self.cell_names.append(c.name)
                self.cell_region.append(ri)
                serving = [p for p in c.node_pools if p.role == "serving"]
                self.cell_gpu.append(serving[0].gpu if serving else "H100")
                members: list[int] = []
                for pool in c.node_pools:
                    for k in range(pool.nodes):
                        members.append(len(self.nodes))
                        self.nodes.append(
                            Node(
                                name=f"gpu-{c.name}-{pool.name}-{k:04d}",
                                region=ri,
                                cell=ci,
                                pool=pool.name,
                                role=pool.role,
                                gpus=pool.gpus_per_node,
                                nic_gbps=pool.nic_gbps / 8.0,
                                versions=dict(pool.versions.model_dump()),
                                free=list(range(pool.gpus_per_node)),
                            )
                        )
                self.cell_nodes.append(members)
        self.node_index = {n.name: i for i, n in enumerate(self.nodes)}
        self.cell_index = {c: i for i, c in enumerate(self.cell_names)}
        self.region_index = {r: i for i, r in enumerate(self.region_names)}
        self.nic = np.array([n.nic_gbps for n in self.nodes])
        self.spare_nodes = [r.capacity.spare_nodes for r in spec.regions]
        self.node_region = np.array([n.region for n in self.nodes], dtype=np.int64)
        self.node_cell = np.array([n.cell for n in self.nodes], dtype=np.int64)

    def _build_pools(self) -> None:
        spec = self.spec
        self.models: list[ModelSpec] = list(spec.models)
        self.model_index = {m.name: i for i, m in enumerate(self.models)}
        nm, nc = len(self.models), len(self.cell_names)
        self.n_pools = nm * nc
        # digests
        self.digests: list[DigestInfo] = []
        self.digest_index: dict[str, int] = {}
        self.region_digest = np.zeros((nm, len(self.region_names)), dtype=np.int64)
        self.available: set[tuple[int, int]] = set()
        for mi, m in enumerate(self.models):
            d = self.register_digest(mi, m.weights.digest, m.weights.signed, m.weights.attested)
            self.region_digest[mi, :] = d
            for ri in range(len(self.region_names)):
                self.available.add((ri, d))
        self.bundle = [m.bundle for m in self.models]
        self.serving_image = [m.serving_image for m in self.models]
        # desired replicas and route weights
        self.desired = np.zeros(self.n_pools, dtype=np.int64)
        self.weights = np.zeros((nm, nc))
        ci = 0
        for r in spec.regions:
            for c in r.cells:
                for mname, n in c.replicas.items():
                    mi = self.model_index[mname]
                    self.desired[mi * nc + ci] = n
                    self.weights[mi, ci] = n
                ci += 1
        for mname, wmap in spec.routes.items():
            mi = self.model_index[mname]
            for cname, w in wmap.items():
                self.weights[mi, self.cell_index[cname]] = w
        self.cell_quarantined = np.zeros(nc, dtype=bool)
        self.scaler_paused = np.full(self.n_pools, -1, dtype=np.int64)
        self.rollout: list[tuple[int, int] | None] = [None] * nm  # (canary digest, percent)
        self.pool_model = np.repeat(np.arange(nm), nc)
        self.pool_cell = np.tile(np.arange(nc), nm)
        self.pool_region = np.array([self.cell_region[c] for c in self.pool_cell], dtype=np.int64)

        # shape arrays
        def per_pool(f: object) -> F64:
            vals = [f(self.models[m]) for m in self.pool_model]  # type: ignore[operator]
            return np.array(vals, dtype=np.float64)

        prod_tokens = {p.model: p.tokens for p in spec.products}

        def tok(m: ModelSpec) -> tuple[float, float, float]:
            t = prod_tokens.get(m.name)
            return (
                (700.0, 0.31, 250.0)
                if t is None
                else (t.prompt_median, t.prompt_sigma, t.output_mean)
            )

        med = per_pool(lambda m: tok(m)[0])
        sig = per_pool(lambda m: tok(m)[1])
        self.shape = PoolShape(
            prefill_a=per_pool(lambda m: m.latency.prefill_a_s),
            prefill_b=per_pool(lambda m: m.latency.prefill_b_s_per_token),
            prefill_c=per_pool(lambda m: m.latency.prefill_c_s_per_token2),
            decode_a=per_pool(lambda m: m.latency.decode_a_s),
            decode_b=per_pool(lambda m: m.latency.decode_b_s_per_token),
            decode_c=per_pool(lambda m: m.latency.decode_c_s_per_seq),
            interference=per_pool(lambda m: m.latency.prefill_interference),
            cold_penalty=per_pool(lambda m: m.latency.cold_cache_penalty),
            prompt_mu=np.log(med),
            prompt_sigma=sig,
            prompt_mean=med * np.exp(sig**2 / 2.0),
            prompt_sq_mean=med**2 * np.exp(2.0 * sig**2),
            output_mean=per_pool(lambda m: tok(m)[2]),
        )
        self.cold_decay = per_pool(lambda m: m.latency.cold_cache_decay_s)
        self.queue_k = int(max(math.ceil(m.queue_timeout_s / self.dt) for m in self.models)) + 1
        timeout_steps = np.array(
            [math.ceil(self.models[m].queue_timeout_s / self.dt) for m in self.pool_model]
        )
        self.timeout_mask = (np.arange(self.queue_k)[None, :] >= timeout_steps[:, None]).astype(
            np.int64
        )
        self.update_seats()
        # serving state
        p = self.n_pools
        self.ready = np.zeros(p, dtype=np.int64)
        self.busy = np.zeros(p, dtype=np.int64)
        self.busy_fast = np.zeros(p, dtype=np.int64)  # busy seats in the fast service phase
        self._busy_seen = np.zeros(p, dtype=np.int64)  # busy as the queue left it
        self.queue = np.zeros((p, self.queue_k), dtype=np.int64)
        self.lam = np.zeros(p)
        self.lam_warm = np.zeros(p)
        self.slow_sum = np.zeros(p)  # Σ (slowdown - 1) over ready replicas
        self.binner = TtftBinner(self.shape, self.dt)
        self._pending_admit = np.zeros((p, self.queue_k), dtype=np.int64)
        self._factor_acc = np.zeros(p)
        self._extra_acc = np.zeros(p)
        self._wait_corr_acc = np.zeros(p)  # in-step wait of the sub-stepped queue (seconds)
        # a cohort admitted k steps after arriving waited k·dt
        self.age_wait_s = np.arange(self.queue_k, dtype=np.float64) * self.dt
        self.pool_range = np.arange(p)
        self._zeros_i = np.zeros(p, dtype=np.int64)
        self._zeros_f = np.zeros(p)
        self.pool_dirty = np.ones(p, dtype=bool)
        self.error_fraction = np.zeros(p)
        self.error_fail_fast = np.ones(p, dtype=bool)  # a 5xx answers at once, seat free
        self.prefill_mean = mean_prefill_s(self.shape)
        self.shape_changes = 0  # request-shape changes, written into ``shape`` in place (disagg)
        self.kv_tokens_per_seq = self.shape.prompt_mean + self.shape.output_mean / 2.0
        self.warm_gain = np.minimum(self.dt / self.cold_decay, 1.0)
        nr = len(self.region_names)
        self.region_mask = np.zeros((nr, nc))
        for ci, ri in enumerate(self.cell_region):
            self.region_mask[ri, ci] = 1.0
        self.cross_mask = 1.0 - self.region_mask
        self._routing_key: tuple[bytes, bytes, bytes] | None = None  # traffic.routing_matrix
        self._routing_share: F64 = np.zeros((0, 0, 0))
        self._cuts_key: frozenset[tuple[str, str, str]] | None = None  # traffic._partition_losses
        self._cuts: tuple[list[tuple[int, int, int, int]], list[int]] = ([], [])
        self.product_to_model = np.zeros((nm, len(spec.products)))
        for pi, prod in enumerate(spec.products):
            self.product_to_model[self.model_index[prod.model], pi] = 1.0
        self.edges = fine_edges()
        self.ttft_hist = np.zeros((p, self.edges.size + 1), dtype=np.int64)
        self.ttft_sum = np.zeros(p)
        self.tpot_hist = np.zeros((p, TPOT_EXPORT.size + 1), dtype=np.int64)
        self.tpot_sum = np.zeros(p)
        self.requests = np.zeros(p, dtype=np.int64)
        self.ok = np.zeros(p, dtype=np.int64)
        self.errors = np.zeros(p, dtype=np.int64)
        self.success_stop = np.zeros(p, dtype=np.int64)
        self.success_length = np.zeros(p, dtype=np.int64)
        self.preemptions = np.zeros(p, dtype=np.int64)
        self.queue_wait_sum = np.zeros(p)
        self.admitted_total = np.zeros(p, dtype=np.int64)
        self.kv_usage = np.zeros(p)
        self.kv_usage_sum = np.zeros(p)
        self.util_sum = np.zeros(p)
        self.ready_sum = np.zeros(p)
        self.samples = 0
        self.generation_tokens = np.zeros(p)
        self.replicas: list[Replica] = []
        # (t, replica, from state, to state, node at the time): what chain tracing reads. States
        # are logged as their int values (-1: none yet): a tuple of ints is one the garbage
        # collector stops tracking, and the log grows with every transition of a run.
        self.replica_log: list[tuple[float, int, int, int, int]] = []
        self.pool_replicas: list[set[int]] = [set() for _ in range(p)]
        self.state_counts = np.zeros((p, len(STATE_NAMES)), dtype=np.int64)
        self._last_scale = np.full(p, -1e18)
        self._oom_models: set[int] = set()

    def register_digest(self, model: int, digest: str, signed: bool, attested: bool) -> int:
        if digest in self.digest_index:
            return self.digest_index[digest]
        self.digests.append(DigestInfo(model, digest, signed, attested))
        self.digest_index[digest] = len(self.digests) - 1
        return len(self.digests) - 1

    def update_seats(self) -> None:
        seats = np.zeros(self.n_pools)
        kv_tokens = np.zeros(self.n_pools)
        self._oom_models = set()
        for p in range(self.n_pools):
            mi = int(self.pool_model[p])
            m = self.models[mi]
            sc = self.bundle[mi].serving_config
            gpu = self.cell_gpu[int(self.pool_cell[p])]
            seats[p] = sc.max_num_seqs
            kv_tokens[p] = kv_capacity_tokens(m, gpu, sc.gpu_memory_utilization)
            if sc.gpu_memory_utilization > m.oom_gpu_memory_utilization:
                self._oom_models.add(mi)
        self.seats_per_replica = seats
        self.seats_int = seats.astype(np.int64)
        self.kv_tokens_per_replica = kv_tokens
        per_seq = self.shape.prompt_mean + self.shape.output_mean / 2.0
        self.kv_seats_per_replica = np.floor(kv_tokens / per_seq)
        # saturation throughput of one replica: every usable seat busy
        full = np.minimum(seats, np.maximum(self.kv_seats_per_replica, 1.0))
        service_full = mean_prefill_s(self.shape) + self.shape.output_mean * decode_step_s(
            self.shape, full
        )
        self.max_rps_per_replica = full / service_full
        if self.pd is not None:
            self.pd.update_capacity()

    # -- replicas -----------------------------------------------------------------------------
    def _new_replica(self, model: int, cell: int, digest: int) -> Replica:
        r = Replica(id=len(self.replicas), model=model, cell=cell, digest=digest, state=PENDING)
        self.replicas.append(r)
        self.replica_log.append((self.t, r.id, -1, int(PENDING), -1))
        p = model * len(self.cell_names) + cell
        self.pool_replicas[p].add(r.id)
        self.state_counts[p, int(PENDING)] += 1
        return r

    def pool_of(self, replica: int) -> int:
        """Pool index (model x cell) of a replica."""
        return self._pool(self.replicas[replica])

    def _pool(self, r: Replica) -> int:
        return r.model * len(self.cell_names) + r.cell

    def _set_state(self, r: Replica, state: ReplicaState) -> None:
        p = self._pool(r)
        self.pool_dirty[p] = True
        before, after = int(r.state), int(state)  # plain ints: numpy's fast index path
        self.replica_log.append((self.t, r.id, before, after, r.node))
        self.state_counts[p, before] -= 1
        self.state_counts[p, after] += 1
        if r.state is READY and state is not READY:
            self.ready[p] -= 1
            self.golden.on_ready(p, r.digest, -1)
            if r.slowdown != 1.0:
                self.slow_sum[p] -= r.slowdown - 1.0
        if state is READY and r.state is WARMING:
            self.recovery.became_ready[p] += 1
        if state is READY and r.state is not READY:
            self.ready[p] += 1
            self.golden.on_ready(p, r.digest, 1)
            if r.slowdown != 1.0:
                self.slow_sum[p] += r.slowdown - 1.0
        r.state = state
        r.token += 1
        if state is GONE:
            self.pool_replicas[p].discard(r.id)

    def _recount_slow(self) -> None:
        self.slow_sum[:] = 0.0
        for r in self.replicas:
            if r.state is READY and r.slowdown != 1.0:
                self.slow_sum[self._pool(r)] += r.slowdown - 1.0

    # -- events and lookups -------------------------------------------------------------------
    def _push(self, at: float, kind: str, payload: tuple[int, ...]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, payload))

    def lookup_node(self, name: str) -> int:
        if name not in self.node_index:
            raise UnknownTargetError("node", name)
        return self.node_index[name]

    def lookup_cell(self, name: str) -> int:
        if name not in self.cell_index:
            raise UnknownTargetError("cell", name)
        return self.cell_index[name]

    def lookup_model(self, name: str) -> int:
        if name not in self.model_index:
            raise UnknownTargetError("model", name)
        return self.model_index[name]

    def lookup_region(self, name: str) -> int:
        if name not in self.region_index:
            raise UnknownTargetError("region", name)
        return self.region_index[name]

    def regions_cut(self, a: int, b: int) -> bool:
        if a == b:
            return False
        ra, rb = self.region_names[a], self.region_names[b]
        return ("region-region", ra, rb) in self.partitions or (
            "region-region",
            rb,
            ra,
        ) in self.partitions

    # -- the change log -----------------------------------------------------------------------
    def note_change(
        self,
        stream: ChangeStream,
        cell: int,
        subject: str,
        before: str,
        after: str,
        detail: str = "",
    ) -> None:
        region = self.region_names[self.cell_region[cell]] if cell >= 0 else "*"
        cname = self.cell_names[cell] if cell >= 0 else "*"
        self.changes_log.append(
            ChangeEvent(self.t, stream, region, cname, subject, before, after, detail)
        )

    def note_model_change(self, stream: ChangeStream, mi: int, before: str, after: str) -> None:
        for ci in range(len(self.cell_names)):
            p = mi * len(self.cell_names) + ci
            if self.desired[p] > 0:
                self.note_change(stream, ci, self.models[mi].name, before, after)

    def note_region_change(
        self, stream: ChangeStream, region: int, subject: str, before: int, after: int
    ) -> None:
        for ci, cr in enumerate(self.cell_region):
            if cr == region:
                self.note_change(
                    stream, ci, subject, self.digests[before].digest, self.digests[after].digest
                )

    def record_change(self, event: ChangeEvent) -> None:
        """Ingest a change from outside the twin (a scenario's timeline, a demand event)."""
        self.changes_log.append(event)
