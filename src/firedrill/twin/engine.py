"""The twin: a time-stepped, vectorised model of a multi-region GPU fleet.

It implements the three ports in-process: ``Fleet`` (state and typed operations, each returning
its inverse), ``Signals`` (series under the real exporters' names) and ``Clock`` (simulated time).
Same spec + seed gives the same run bit for bit: every random draw comes from one generator seeded
from the run's seed, and nothing reads the wall clock.

``Twin`` puts the engine's concepts together, one module each, every one a class on top of the
shared state (``state.TwinState``) that may use only the concepts it names as its bases:

    state        topology, pools, digests, replicas and their lifecycle, events, change log
    scheduling   placement and the per-pool reconcile (rolling digest changes, removal order)
    capacity     the autoscaler and the region's spare nodes
    traffic      routing and serving: queues, seats, KV, TTFT/TPOT
    hydrate      pulls to nodes and cross-region replication
    remediation  GPU and node faults, reset/reboot/burn-in, node and DCGM series
    operations   the Fleet port's writes, each with its inverse
    scrape       the exported series
    quiescent    a quiet interval's serving in closed form (opt-in: ``FleetSpec.quiescent``)

This module owns the step (in what order each concept runs), the event dispatch, the
sub-simulations (each behind its own narrow Protocol: ``training.TrainingTwin``,
``sandbox.SandboxTwin``, ``quality.QualityTwin``, ``disagg.DisaggTwin``,
``recovery.RecoveryTwin``), and the Fleet and Signals ports' reads.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from firedrill.model.changes import ChangeEvent
from firedrill.model.release import RolloutView
from firedrill.model.sandbox import EgressRecord, ToolCallRecord
from firedrill.model.series import Labels, Series
from firedrill.model.spec import FleetSpec
from firedrill.model.state import CellView, NodeView, ReplicaCounts
from firedrill.twin.capacity import AUTOSCALE_EVERY_S, Capacity
from firedrill.twin.deps import LOAD_RETRY_S
from firedrill.twin.disagg import Disaggregation
from firedrill.twin.operations import QUARANTINE_TAINT, Operations
from firedrill.twin.quality import GoldenSet
from firedrill.twin.quiescent import Quiescent
from firedrill.twin.recovery import RecoveryFeatures
from firedrill.twin.remediation import (
    APP_XIDS,
    BURN_IN_S,
    DCGM_ECC_DBE,
    DCGM_PCIE_REPLAY,
    DCGM_XID,
    FATAL_XIDS,
    GPU_RESET_S,
    LINK_FLAP_S,
    NODE_REBOOT_S,
    THERMAL_S,
)
from firedrill.twin.replica import LIVE, STATE_NAMES, DigestInfo, Node, Replica, ReplicaState
from firedrill.twin.sandbox import SandboxSim
from firedrill.twin.scheduling import DRAIN_GRACE_S, RESTART_BACKOFF_S
from firedrill.twin.scrape import Scrape
from firedrill.twin.state import F64, I64, TPOT_EXPORT, TTFT_EXPORT
from firedrill.twin.traffic import CROSS_REGION_RTT_S, OOM_CRASH_PER_S
from firedrill.twin.training import TrainingSim

# Replica lifecycle states by name, for importers of the engine (tests, benchmarks).
PENDING = ReplicaState.PENDING
PULLING = ReplicaState.PULLING
LOADING = ReplicaState.LOADING
WARMING = ReplicaState.WARMING
READY = ReplicaState.READY
DRAINING = ReplicaState.DRAINING
EJECTED = ReplicaState.EJECTED
GONE = ReplicaState.GONE

RECONCILE_EVERY_S = 5.0

# what importers of the engine used before it was split keeps working
__all__ = [
    "APP_XIDS",
    "AUTOSCALE_EVERY_S",
    "BURN_IN_S",
    "CROSS_REGION_RTT_S",
    "DCGM_ECC_DBE",
    "DCGM_PCIE_REPLAY",
    "DCGM_XID",
    "DRAINING",
    "DRAIN_GRACE_S",
    "EJECTED",
    "F64",
    "FATAL_XIDS",
    "GONE",
    "GPU_RESET_S",
    "I64",
    "LINK_FLAP_S",
    "LIVE",
    "LOADING",
    "NODE_REBOOT_S",
    "OOM_CRASH_PER_S",
    "PENDING",
    "PULLING",
    "QUARANTINE_TAINT",
    "READY",
    "RECONCILE_EVERY_S",
    "RESTART_BACKOFF_S",
    "STATE_NAMES",
    "THERMAL_S",
    "TPOT_EXPORT",
    "TTFT_EXPORT",
    "WARMING",
    "DigestInfo",
    "Node",
    "Replica",
    "ReplicaState",
    "Twin",
]


class Twin(Operations, Scrape, Capacity, Quiescent):
    """The digital twin of a fleet. Construct from a validated ``FleetSpec`` and a seed."""

    def __init__(self, spec: FleetSpec, seed: int, *, record: bool = True, hours_hint: float = 1.0):
        super().__init__(spec, seed, record=record, hours_hint=hours_hint)
        self.golden = GoldenSet(self, seed)  # golden-set probes: their own random stream
        self.pd = Disaggregation.of(self)  # None unless a model is served disaggregated
        self._refresh_bad_exporters()
        self._next_scrape = 0.0
        self._next_reconcile = 0.0
        self._next_autoscale = AUTOSCALE_EVERY_S
        self.recovery = RecoveryFeatures(self)  # pullers, recycling, deps, admission, homing
        self.training = TrainingSim(self)
        self.sandbox = SandboxSim(self)  # agent sandboxes: its own generators, never ours
        self._place_initial()
        self._register_series()
        if record:
            self._scrape()  # t = 0: what Prometheus sees before anything happens
        self._next_scrape = spec.scrape_interval_s
        self._scaling = any(m.autoscaler.enabled for m in spec.models)
        self.macro_steps = 0  # quiescent steps taken (each stands for several dt)

    # -- the step -----------------------------------------------------------------------------
    def step(self) -> None:
        self.step_begin()
        self._serve()
        self.step_end()

    def step_begin(self) -> None:
        """The step up to serving: the clock, due events, reconcile, pulls (an ensemble runs
        each member's, then serves them together, then runs each member's ``step_end``)."""
        self.t = round(self.t + self.dt, 9)
        self.step_no += 1
        if self._heap:
            self._process_events()
        if self.t >= self._next_reconcile:
            self._reconcile()
            self._next_reconcile = self.t + RECONCILE_EVERY_S
        if self.supply.pulls:
            self._hydrate()

    def step_end(self) -> None:
        """The step after serving: the autoscaler, faults, the sub-simulations, the scrape."""
        if self.t >= self._next_autoscale:
            self._autoscale()
            self._next_autoscale = self.t + AUTOSCALE_EVERY_S
        for ev in self.faults.sample(self.t, self.dt):
            self._fault(ev)
        if self.spec.training:
            self.training.step()
        if self.recovery.busy:
            self.recovery.step()
        if self.sandbox.enabled:
            self.sandbox.step()
        if self.t >= self._next_scrape - 1e-9:
            if self.record:
                self._scrape()
            else:
                self.flush_ttft()  # same binning cadence with or without recorded series
            self._next_scrape += self.spec.scrape_interval_s

    def run_for(self, seconds: float) -> None:
        end = self.t + seconds - 1e-9
        if self.spec.quiescent.enabled:
            while self.t < end:
                if not self._macro_step(end + 1e-9):
                    self.step()
            return
        while self.t < end:
            self.step()

    def _macro_step(self, end_s: float) -> bool:
        """One quiescent step up to ``end_s`` and the next scrape, if the fleet is quiet.

        The step's order is kept: reconcile (nothing to do on a quiet fleet) and the
        autoscaler run once at the interval's end if due, background faults are drawn over the
        interval and land at its end, then the scrape. Returns whether a step was taken.
        """
        if self.spec.training or self.recovery.busy or self.sandbox.enabled:
            return False
        # recorded series are scraped at their times; without, only the TTFT binning runs
        # at scrapes, and one binning at the interval's end draws the same histogram
        limit = min(end_s, self._next_scrape) if self.record else end_s
        if self._scaling:  # the autoscaler reads the queue: an interval ends where it runs
            limit = min(limit, self._next_autoscale)
        k = self.quiet_steps(limit - self.t)
        if k == 0:
            return False
        k = self.serve_interval(k)
        if k == 0:
            return False
        self.macro_steps += 1
        if self.t >= self._next_reconcile:
            self._reconcile()
            self._next_reconcile = self.t + RECONCILE_EVERY_S
        if self.t >= self._next_autoscale:
            self._autoscale()
            self._next_autoscale = self.t + AUTOSCALE_EVERY_S
        for ev in self.faults.sample(self.t, k * self.dt):
            self._fault(ev)
        if self.t >= self._next_scrape - 1e-9:
            if self.record:
                self._scrape()
            else:
                self.flush_ttft()
            self._next_scrape += self.spec.scrape_interval_s
            while self._next_scrape <= self.t + 1e-9:
                self._next_scrape += self.spec.scrape_interval_s
        return True

    # Clock port
    def now_s(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.run_for(seconds)

    def _process_events(self) -> None:
        while self._heap and self._heap[0][0] <= self.t + 1e-9:
            _, _, kind, payload = heapq.heappop(self._heap)
            if kind in ("loaded", "warmed", "restart", "drained"):
                r = self.replicas[payload[0]]
                if r.token != payload[1]:
                    continue
                if kind == "loaded":
                    if self.recovery.deps.declared and self.recovery.deps.load_blocked(
                        self.cell_region[r.cell]
                    ):  # no tokenizer: the replica cannot start, it retries
                        self._push(self.t + LOAD_RETRY_S, "loaded", (r.id, r.token))
                        continue
                    self._set_state(r, WARMING)
                    self._push(self.t + self.models[r.model].warmup_s, "warmed", (r.id, r.token))
                elif kind == "warmed":
                    self._set_state(r, READY)
                elif kind == "restart":
                    n = self.nodes[r.node] if r.node >= 0 else None
                    if n is not None and n.ready and not (set(r.gpus) & n.failed_gpus):
                        if self.models[r.model].tp > 1 and n.link_down:
                            self._push(self.t + RESTART_BACKOFF_S, "restart", (r.id, r.token))
                        else:
                            self._begin_load(r)
                    else:
                        self._push(self.t + 3 * RESTART_BACKOFF_S, "restart", (r.id, r.token))
                elif kind == "drained":
                    self._finish_remove(r)
            elif kind == "link_up":
                self.nodes[payload[0]].link_down = False
            elif kind == "thermal_end":
                self._clear_thermal(payload[0], payload[1])
            elif kind == "node_join":
                self._node_joins(payload[0], payload[1])
            elif kind == "replicated":
                self._replication_lands(payload[0], payload[1], payload[2])
            elif kind == "gpu_reset":
                self._gpu_reset_done(payload[0], payload[1])
            elif kind == "rebooted":
                self._reboot_done(payload[0])
            elif kind == "burned_in":
                self._burn_in_done(payload[0])

    # -- Fleet port: reads --------------------------------------------------------------------
    def node(self, name: str) -> NodeView:
        return self._node_view(self.lookup_node(name))

    def _node_view(self, ni: int) -> NodeView:
        n = self.nodes[ni]
        return NodeView(
            name=n.name,
            region=self.region_names[n.region],
            cell=self.cell_names[n.cell],
            pool=n.pool,
            role=n.role,
            gpus=n.gpus,
            ready=n.ready,
            cordoned=n.cordoned,
            taints=tuple(sorted((k, v, e) for k, (v, e) in n.taints.items())),
            labels=tuple(sorted(n.labels.items())),
            versions=tuple(sorted(n.versions.items())),
        )

    def pods_on(self, node: str, gpu: int | None = None) -> Sequence[str]:
        n = self.nodes[self.lookup_node(node)]
        return [
            self.replicas[r].pod
            for r in sorted(n.replicas)
            if gpu is None or gpu in self.replicas[r].gpus
        ]

    def burn_in_result(self, node: str) -> tuple[float, bool, str] | None:
        self.lookup_node(node)
        return self.burn_in.get(node)

    # the audit log of the agent sandboxes (respond.security.AuditLog): proxy and gateway records
    def egress_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[EgressRecord]:
        return self.sandbox.egress_records(start_s=start_s, end_s=end_s, tenant=tenant)

    def tool_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[ToolCallRecord]:
        return self.sandbox.tool_records(start_s=start_s, end_s=end_s, tenant=tenant)

    def node_views(self, *, cell: str | None = None) -> Sequence[NodeView]:
        if cell is None:
            return [self._node_view(i) for i in range(len(self.nodes))]
        return [self._node_view(i) for i in self.cell_nodes[self.lookup_cell(cell)]]

    def rollout_view(self, model: str) -> RolloutView:
        """A model's weights rollout: stable digest per region, canary digest and step."""
        return self.golden.rollout_view(self.lookup_model(model))

    def cells(self) -> Sequence[CellView]:
        out = []
        nc = len(self.cell_names)
        for ci, name in enumerate(self.cell_names):
            reps = []
            for mi, m in enumerate(self.models):
                p = mi * nc + ci
                s = self.state_counts[p]
                reps.append(
                    ReplicaCounts(
                        model=m.name,
                        cell=name,
                        desired=int(self.desired[p]),
                        cold=int(s[PENDING]),
                        pulling=int(s[PULLING]),
                        loading=int(s[LOADING]),
                        warming=int(s[WARMING]),
                        ready=int(s[READY]),
                        draining=int(s[DRAINING]),
                    )
                )
            out.append(
                CellView(
                    name=name,
                    region=self.region_names[self.cell_region[ci]],
                    nodes=len(self.cell_nodes[ci]),
                    quarantined=bool(self.cell_quarantined[ci]),
                    replicas=tuple(reps),
                    route_weights=tuple(
                        (m.name, int(self.weights[mi, ci])) for mi, m in enumerate(self.models)
                    ),
                )
            )
        return out

    def changes(self, *, since_s: float, cell: str | None = None) -> Sequence[ChangeEvent]:
        if cell is not None:
            self.lookup_cell(cell)
        return [
            c
            for c in self.changes_log
            if c.at_s >= since_s and (cell is None or c.cell in (cell, "*"))
        ]

    # Signals port
    def series_names(self) -> Sequence[str]:
        return self.store.series_names()

    def query(
        self, name: str, matchers: Mapping[str, str] | None = None, *, start_s: float, end_s: float
    ) -> Sequence[Series]:
        return self.store.query(name, matchers, start_s=start_s, end_s=end_s)

    def instant(
        self, name: str, matchers: Mapping[str, str] | None = None
    ) -> tuple[float, Sequence[Labels], F64]:
        return self.store.instant(name, matchers)
