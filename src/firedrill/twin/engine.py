"""The twin: a time-stepped, vectorised model of a multi-region GPU fleet.

It implements the three ports in-process: ``Fleet`` (state and typed operations, each returning
its inverse), ``Signals`` (series under the real exporters' names) and ``Clock`` (simulated time).
Same spec + seed gives the same run bit for bit: every random draw comes from one generator seeded
from the run's seed, and nothing reads the wall clock.

Layout: per-pool arrays (a pool is one model in one cell) carry the serving state and are updated
every step; replicas, nodes and pulls change rarely and are driven by an event heap, so the cost
of a step does not grow with the number of nodes.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Mapping, Sequence

import numpy as np

from firedrill.errors import OperationError, UnknownTargetError
from firedrill.model import operations as ops
from firedrill.model.changes import ChangeEvent
from firedrill.model.release import RolloutView
from firedrill.model.sandbox import EgressRecord, ToolCallRecord
from firedrill.model.series import Labels, Series, labels_of
from firedrill.model.spec import (
    VLLM_TPOT_BUCKETS_S,
    VLLM_TTFT_BUCKETS_S,
    FleetSpec,
)
from firedrill.model.state import CellView, NodeView, ReplicaCounts
from firedrill.twin import disagg
from firedrill.twin.capacity import AUTOSCALE_EVERY_S, Capacity
from firedrill.twin.deps import LOAD_RETRY_S
from firedrill.twin.disagg import PD_OPS, Disaggregation
from firedrill.twin.faults import FaultEvent
from firedrill.twin.hydrate import Hydrate
from firedrill.twin.quality import QUALITY_OPS, GoldenSet
from firedrill.twin.recovery import RECOVERY_OPS, RecoveryFeatures
from firedrill.twin.remediation import (
    BURN_IN_S,
    DCGM_NAMES,
    DCGM_XID,
    GPU_RESET_S,
    NODE_REBOOT_S,
    Remediation,
)
from firedrill.twin.replica import ReplicaState
from firedrill.twin.sandbox import SANDBOX_OPS, SandboxSim
from firedrill.twin.scheduling import RESTART_BACKOFF_S
from firedrill.twin.state import F64, TTFT_EXPORT
from firedrill.twin.traffic import Traffic
from firedrill.twin.training import TRAINING_OPS, TrainingSim

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
QUARANTINE_TAINT = "gpu.corp/quarantine"


class Twin(Remediation, Hydrate, Traffic, Capacity):
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

    # ------------------------------------------------------------------------------------------
    # events

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

    # ------------------------------------------------------------------------------------------
    # the step
    def step(self) -> None:
        self.t = round(self.t + self.dt, 9)
        self.step_no += 1
        if self._heap:
            self._process_events()
        if self.t >= self._next_reconcile:
            self._reconcile()
            self._next_reconcile = self.t + RECONCILE_EVERY_S
        if self.supply.pulls:
            self._hydrate()
        self._serve()
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
        while self.t < end:
            self.step()

    # Clock port
    def now_s(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.run_for(seconds)

    # ------------------------------------------------------------------------------------------
    # Fleet port: operations
    def apply(self, op: ops.Operation) -> ops.Operation:
        self.recovery.check(op)  # a cut dependency refuses it before anything changes
        inverse = self._apply(op)
        self.pool_dirty[:] = True
        self.journal.append(ops.Applied(op=op, inverse=inverse, at_s=self.t))
        return inverse

    def inverse_of(self, op: ops.Operation) -> ops.Operation:
        """The inverse ``op`` would have if applied now (validates targets; changes nothing)."""
        return self._inverse(op)

    def _gpu_check(self, ni: int, gpu: int) -> None:
        if not 0 <= gpu < self.nodes[ni].gpus:
            raise UnknownTargetError("gpu", f"{self.nodes[ni].name}/{gpu}")

    def _inverse(self, op: ops.Operation) -> ops.Operation:
        self.sandbox.check(op)  # a promotion freeze refuses new catalog digests
        match op:
            case ops.Cordon(node=node) | ops.Drain(node=node):
                n = self.nodes[self.lookup_node(node)]
                return ops.Noop("already cordoned") if n.cordoned else ops.Uncordon(node)
            case ops.Uncordon(node=node):
                n = self.nodes[self.lookup_node(node)]
                return ops.Cordon(node) if n.cordoned else ops.Noop("not cordoned")
            case ops.Taint(node=node, key=key, effect=effect):
                n = self.nodes[self.lookup_node(node)]
                if key in n.taints:
                    old_v, old_e = n.taints[key]
                    return ops.Taint(node, key, old_v, old_e)  # type: ignore[arg-type]
                return ops.Untaint(node, key, effect)
            case ops.Untaint(node=node, key=key):
                n = self.nodes[self.lookup_node(node)]
                if key in n.taints:
                    v, e = n.taints[key]
                    return ops.Taint(node, key, v, e)  # type: ignore[arg-type]
                return ops.Noop("no such taint")
            case ops.Label(node=node, key=key):
                n = self.nodes[self.lookup_node(node)]
                return ops.Label(node, key, n.labels.get(key))
            case ops.SetRouteWeights(model=model, weights=weights):
                mi = self.lookup_model(model)
                old = tuple((c, int(self.weights[mi, self.lookup_cell(c)])) for c, _ in weights)
                return ops.SetRouteWeights(model, old)
            case ops.QuarantineCell(cell=cell):
                ci = self.lookup_cell(cell)
                return (
                    ops.Noop("already") if self.cell_quarantined[ci] else ops.UnquarantineCell(cell)
                )
            case ops.UnquarantineCell(cell=cell):
                ci = self.lookup_cell(cell)
                return (
                    ops.QuarantineCell(cell)
                    if self.cell_quarantined[ci]
                    else ops.Noop("not quarantined")
                )
            case ops.PauseScaler(model=model, cell=cell):
                p = self.lookup_model(model) * len(self.cell_names) + self.lookup_cell(cell)
                prev = int(self.scaler_paused[p])
                return (
                    ops.UnpauseScaler(model, cell)
                    if prev < 0
                    else ops.PauseScaler(model, cell, prev)
                )
            case ops.UnpauseScaler(model=model, cell=cell):
                p = self.lookup_model(model) * len(self.cell_names) + self.lookup_cell(cell)
                prev = int(self.scaler_paused[p])
                return ops.Noop("not paused") if prev < 0 else ops.PauseScaler(model, cell, prev)
            case ops.SetReplicas(model=model, cell=cell):
                p = self.lookup_model(model) * len(self.cell_names) + self.lookup_cell(cell)
                return ops.SetReplicas(model, cell, int(self.desired[p]))
            case ops.StartRollout(model=model) | ops.AbortRollout(model=model):
                # These move only the canary: their inverse must leave each region's stable
                # digest alone (regions differ while a promotion replicates).
                mi = self.lookup_model(model)
                ro = self.rollout[mi]
                if ro is not None:
                    return ops.StartRollout(model, self.digests[ro[0]].digest, ro[1])
                if isinstance(op, ops.StartRollout):
                    return ops.AbortRollout(model)
                return ops.Noop("no rollout")
            case ops.PromoteRollout(model=model):
                mi = self.lookup_model(model)
                ro = self.rollout[mi]
                stable = self.digests[int(self.region_digest[mi, 0])].digest
                if ro is None:
                    return ops.RestoreRollout(model, stable, None, 0)
                return ops.RestoreRollout(model, stable, self.digests[ro[0]].digest, ro[1])
            case ops.RestoreRollout(model=model):
                mi = self.lookup_model(model)
                ro = self.rollout[mi]
                stable = self.digests[int(self.region_digest[mi, 0])].digest
                return ops.RestoreRollout(
                    model,
                    stable,
                    None if ro is None else self.digests[ro[0]].digest,
                    0 if ro is None else ro[1],
                )
            case ops.SetFlag(key=key):
                return ops.SetFlag(key, self.flags.get(key))
            case ops.QuarantinePod(pod=pod):
                if not self.sandbox.has_pod(pod):
                    self._pod_check(pod)
                return (
                    ops.Noop("already")
                    if pod in self.quarantined_pods
                    else ops.UnquarantinePod(pod)
                )
            case ops.UnquarantinePod(pod=pod):
                if not self.sandbox.has_pod(pod):
                    self._pod_check(pod)
                return (
                    ops.QuarantinePod(pod)
                    if pod in self.quarantined_pods
                    else ops.Noop("not quarantined")
                )
            case (
                ops.PromoteDigest(model=model, region=region)
                | ops.RestoreDigest(model=model, region=region)
            ):
                mi, ri = self.lookup_model(model), self.lookup_region(region)
                return ops.RestoreDigest(
                    model, region, self.digests[int(self.region_digest[mi, ri])].digest
                )
            case ops.PauseReplication(source=s, target=t):
                link = (self.lookup_region(s), self.lookup_region(t))
                return (
                    ops.Noop("already paused")
                    if link in self.replication_paused
                    else ops.ResumeReplication(s, t)
                )
            case ops.ResumeReplication(source=s, target=t):
                link = (self.lookup_region(s), self.lookup_region(t))
                return (
                    ops.PauseReplication(s, t)
                    if link in self.replication_paused
                    else ops.Noop("not paused")
                )
            case ops.Partition(kind=kind, a=a, b=b):
                self._partition_check(kind, a, b)
                return (
                    ops.Noop("already cut")
                    if (kind, a, b) in self.partitions
                    else ops.Heal(kind, a, b)
                )
            case ops.Heal(kind=kind, a=a, b=b):
                self._partition_check(kind, a, b)
                return (
                    ops.Partition(kind, a, b)
                    if (kind, a, b) in self.partitions
                    else ops.Noop("not cut")
                )
            case ops.DenyCapacity(region=region):
                ri = self.lookup_region(region)
                return (
                    ops.Noop("already denied")
                    if ri in self.capacity_denied
                    else ops.AllowCapacity(region)
                )
            case ops.AllowCapacity(region=region):
                ri = self.lookup_region(region)
                return (
                    ops.DenyCapacity(region)
                    if ri in self.capacity_denied
                    else ops.Noop("not denied")
                )
            case (
                ops.InjectDcgmField(node=node, gpu=gpu, field_id=fid)
                | ops.ClearDcgmField(node=node, gpu=gpu, field_id=fid)
            ):
                ni = self.lookup_node(node)
                self._gpu_check(ni, gpu)
                if fid not in DCGM_NAMES:
                    raise UnknownTargetError("DCGM field", str(fid))
                return ops.ClearDcgmField(node, gpu, fid, self.dcgm.get((ni, gpu, fid), 0.0))
            case ops.InjectLinkFlap(node=node):
                self.lookup_node(node)
                return ops.ClearLinkFlap(node)
            case ops.ClearLinkFlap(node=node):
                n = self.nodes[self.lookup_node(node)]
                return ops.InjectLinkFlap(node) if n.link_down else ops.Noop("link not down")
            case ops.InjectThermal(node=node, gpu=gpu):
                ni = self.lookup_node(node)
                self._gpu_check(ni, gpu)
                return ops.ClearThermal(node, gpu)
            case ops.ClearThermal(node=node, gpu=gpu):
                ni = self.lookup_node(node)
                self._gpu_check(ni, gpu)
                if not self.dcgm.get((ni, gpu, -2)):
                    return ops.Noop("not hot")
                slowdowns = [
                    self.replicas[r].slowdown
                    for r in self.nodes[ni].replicas
                    if gpu in self.replicas[r].gpus
                ]
                return ops.InjectThermal(node, gpu, max(slowdowns, default=2.0))
            case ops.SetServingConfig(model=model):
                mi = self.lookup_model(model)
                bundle = self.bundle[mi]
                return ops.SetServingConfig(
                    model,
                    bundle.digest,
                    bundle.serving_config.max_num_seqs,
                    bundle.serving_config.gpu_memory_utilization,
                )
            case ops.SetNodeVersion(node=node, component=comp):
                n = self.nodes[self.lookup_node(node)]
                return ops.SetNodeVersion(node, comp, n.versions[comp])
            case ops.InjectServingErrors(model=model, cell=cell):
                p = self.lookup_model(model) * len(self.cell_names) + self.lookup_cell(cell)
                return ops.InjectServingErrors(model, cell, float(self.error_fraction[p]))
            case ops.ResetGpu(node=node, gpu=gpu):
                ni = self.lookup_node(node)
                self._gpu_check(ni, gpu)
                return ops.Noop("a reset cannot be undone")
            case ops.RebootNode(node=node) | ops.RunBurnIn(node=node):
                self.lookup_node(node)
                return ops.Noop("cannot be undone")
            case ops.KillPod(pod=pod):
                self._pod_check(pod)
                return ops.Noop("a killed pod is restarted by its controller")
            case ops.EjectReplica(pod=pod):
                self._pod_check(pod)
                r = self.replicas[int(pod[1:])]
                return ops.UnejectReplica(pod) if r.state == READY else ops.Noop("not ready")
            case ops.UnejectReplica(pod=pod):
                self._pod_check(pod)
                return ops.Noop("not ejected")
            case _ if isinstance(op, TRAINING_OPS):
                return self.training.inverse(op)
            case _ if isinstance(op, RECOVERY_OPS):
                return self.recovery.inverse(op)
            case _ if isinstance(op, SANDBOX_OPS):
                return self.sandbox.inverse(op)
            case _ if isinstance(op, QUALITY_OPS):
                return self.golden.inverse(op)
            case _ if isinstance(op, PD_OPS):
                return disagg.inverse(self, self.pd, op)
            case ops.Noop():
                return ops.Noop()
        raise OperationError(f"unsupported operation {op!r}")

    def _pod_check(self, pod: str) -> None:
        if not (re.fullmatch(r"r[0-9]{6,}", pod) and int(pod[1:]) < len(self.replicas)):
            raise UnknownTargetError("pod", pod)

    def _partition_check(self, kind: str, a: str, b: str) -> None:
        if kind == "cell-registry":
            ci = self.lookup_cell(a)
            self.lookup_region(b)
            if self.region_names[self.cell_region[ci]] != b:
                raise OperationError(f"cell '{a}' pulls from its own region's registry, not '{b}'")
        elif kind == "region-edge":
            self.lookup_region(a)
            if b != "edge":
                raise OperationError("a region-edge partition names the edge as 'edge'")
        elif kind == "region-region":
            self.lookup_region(a)
            self.lookup_region(b)
        else:
            self.lookup_region(a)

    def _apply(self, op: ops.Operation) -> ops.Operation:
        inverse = self._inverse(op)
        match op:
            case ops.Cordon(node=node):
                self.nodes[self.node_index[node]].cordoned = True
                self._record_node(node)
            case ops.Uncordon(node=node):
                self.nodes[self.node_index[node]].cordoned = False
                self._record_node(node)
            case ops.Taint(node=node, key=key, value=value, effect=effect):
                ni = self.node_index[node]
                if key == QUARANTINE_TAINT and key not in self.nodes[ni].taints:
                    self.quarantine_actions[ni] = self.quarantine_actions.get(ni, 0) + 1
                    if self.record:
                        n = self.nodes[ni]
                        self.store.set_sparse(
                            "gpu_quarantine_actions_total",
                            labels_of(
                                node=node,
                                cell=self.cell_names[n.cell],
                                region=self.region_names[n.region],
                            ),
                            self.t,
                            float(self.quarantine_actions[ni]),
                        )
                self.nodes[ni].taints[key] = (value, effect)
                self._record_node(node)
            case ops.Untaint(node=node, key=key):
                self.nodes[self.node_index[node]].taints.pop(key, None)
                self._record_node(node)
            case ops.Label(node=node, key=key, value=value):
                n = self.nodes[self.node_index[node]]
                if value is None:
                    n.labels.pop(key, None)
                else:
                    n.labels[key] = value
                self._record_node(node)
            case ops.Drain(node=node, classes=classes):
                ni = self.node_index[node]
                n = self.nodes[ni]
                n.cordoned = True
                if "inference" in classes:
                    for rid in sorted(n.replicas):
                        self.remove_replica(self.replicas[rid], graceful=True)
                if "training" in classes and self.spec.training:
                    self.training.on_node_unavailable(ni)
                self.supply.cancel_node(ni)
                self._record_node(node)
            case ops.SetRouteWeights(model=model, weights=weights):
                mi = self.model_index[model]
                for c, w in weights:
                    if w < 0:
                        raise OperationError(f"route weight for '{c}' must be >= 0")
                for c, w in weights:
                    ci = self.cell_index[c]
                    old_w = int(self.weights[mi, ci])
                    self.weights[mi, ci] = w
                    if old_w != w:  # demand (stream 6): traffic moves into or out of the cell
                        self.note_change("demand", ci, model, str(old_w), str(w), "route weight")
            case ops.QuarantineCell(cell=cell):
                self.cell_quarantined[self.cell_index[cell]] = True
            case ops.UnquarantineCell(cell=cell):
                self.cell_quarantined[self.cell_index[cell]] = False
            case ops.PauseScaler(model=model, cell=cell, replicas=n_rep):
                if n_rep < 0:
                    raise OperationError("paused replicas must be >= 0")
                p = self.model_index[model] * len(self.cell_names) + self.cell_index[cell]
                self.scaler_paused[p] = n_rep
            case ops.UnpauseScaler(model=model, cell=cell):
                p = self.model_index[model] * len(self.cell_names) + self.cell_index[cell]
                self.scaler_paused[p] = -1
            case ops.SetReplicas(model=model, cell=cell, replicas=n_rep):
                if n_rep < 0:
                    raise OperationError("replicas must be >= 0")
                p = self.model_index[model] * len(self.cell_names) + self.cell_index[cell]
                self.desired[p] = n_rep
            case ops.StartRollout(model=model, digest=digest, canary_percent=pct):
                if not 0 <= pct <= 100:
                    raise OperationError("canary_percent must be within 0..100")
                mi = self.model_index[model]
                if digest not in self.digest_index:
                    raise UnknownTargetError("digest", digest)
                if self.digests[self.digest_index[digest]].model != mi:
                    raise OperationError(f"digest {digest} is not a digest of '{model}'")
                self.rollout[mi] = (self.digest_index[digest], pct)
                self.note_model_change("weights", mi, "stable", f"{digest} canary {pct}%")
            case ops.AbortRollout(model=model):
                mi = self.model_index[model]
                self.rollout[mi] = None
                self.note_model_change("weights", mi, "canary", "aborted: stable at 100%")
            case ops.PromoteRollout(model=model):
                mi = self.model_index[model]
                ro = self.rollout[mi]
                if ro is None:
                    raise OperationError(f"model '{model}' has no rollout to promote")
                self.rollout[mi] = None
                for ri in range(len(self.region_names)):
                    self.region_digest[mi, ri] = ro[0]
                    self.available.add((ri, ro[0]))
                self.note_model_change("weights", mi, "canary", "promoted to 100%")
            case ops.RestoreRollout(
                model=model, stable_digest=stable, canary_digest=canary, canary_percent=pct
            ):
                if not 0 <= pct <= 100:
                    raise OperationError("canary_percent must be within 0..100")
                mi = self.model_index[model]
                for named in (stable, canary):
                    if named is not None and named not in self.digest_index:
                        raise UnknownTargetError("digest", named)
                self.rollout[mi] = None if canary is None else (self.digest_index[canary], pct)
                for ri in range(len(self.region_names)):
                    self.region_digest[mi, ri] = self.digest_index[stable]
                after = f"restored: stable {stable}"
                if canary is not None:
                    after += f", {canary} canary {pct}%"
                self.note_model_change("weights", mi, "rollout", after)
            case ops.SetFlag(key=key, value=value):
                if value is None:
                    self.flags.pop(key, None)
                else:
                    self.flags[key] = value
                self.note_change("network_policy", -1, key, "", value or "", "flag")
            case ops.QuarantinePod(pod=pod):
                self.quarantined_pods.add(pod)
            case ops.UnquarantinePod(pod=pod):
                self.quarantined_pods.discard(pod)
            case ops.PromoteDigest(model=model, region=region, digest=digest, signed=s, attested=a):
                mi, ri = self.model_index[model], self.region_index[region]
                d = self.register_digest(mi, digest, s, a)
                before = int(self.region_digest[mi, ri])
                self.available.add((ri, d))
                self.region_digest[mi, ri] = d
                self.note_region_change("weights", ri, model, before, d)
                self.replicate_onward(ri, d)
            case ops.RestoreDigest(model=model, region=region, digest=digest):
                mi, ri = self.model_index[model], self.region_index[region]
                if digest not in self.digest_index:
                    raise UnknownTargetError("digest", digest)
                before = int(self.region_digest[mi, ri])
                self.region_digest[mi, ri] = self.digest_index[digest]
                self.note_region_change("weights", ri, model, before, self.digest_index[digest])
            case ops.PauseReplication(source=s, target=t):
                self.replication_paused.add((self.region_index[s], self.region_index[t]))
            case ops.ResumeReplication(source=s, target=t):
                self.replication_paused.discard((self.region_index[s], self.region_index[t]))
                self._flush_replication()
            case ops.Partition(kind=kind, a=a, b=b):
                self.partitions.add((kind, a, b))
                self.note_change("network_policy", -1, f"{kind}:{a}/{b}", "open", "cut")
            case ops.Heal(kind=kind, a=a, b=b):
                self.partitions.discard((kind, a, b))
                self.note_change("network_policy", -1, f"{kind}:{a}/{b}", "cut", "open")
                self._flush_replication()
            case ops.DenyCapacity(region=region):
                self.capacity_denied.add(self.region_index[region])
            case ops.AllowCapacity(region=region):
                self.capacity_denied.discard(self.region_index[region])
            case ops.InjectDcgmField(node=node, gpu=gpu, field_id=fid, value=value):
                ni = self.node_index[node]
                self._dcgm_set(ni, gpu, fid, value)
                if fid == DCGM_XID:
                    self.fault_log.append(
                        FaultEvent(self.t, ni, gpu, "xid", int(value), phantom=True)
                    )
            case ops.ClearDcgmField(node=node, gpu=gpu, field_id=fid, value=value):
                self._dcgm_set(self.node_index[node], gpu, fid, value)
            case ops.InjectLinkFlap(node=node):
                ni = self.node_index[node]
                self._link_flap(ni, 1e12)
                self.fault_log.append(FaultEvent(self.t, ni, 0, "link_flap", 74))
                self._dcgm_set(ni, 0, DCGM_XID, 74.0)
            case ops.ClearLinkFlap(node=node):
                self.nodes[self.node_index[node]].link_down = False
            case ops.InjectThermal(node=node, gpu=gpu, slowdown=slow):
                if slow < 1.0:
                    raise OperationError("thermal slowdown must be >= 1")
                self._thermal(self.node_index[node], gpu, slow)
            case ops.ClearThermal(node=node, gpu=gpu):
                self._clear_thermal(self.node_index[node], gpu)
            case ops.SetServingConfig(
                model=model, bundle_digest=bd, max_num_seqs=mns, gpu_memory_utilization=gmu
            ):
                if not (1 <= mns <= 4096 and 0.1 < gmu <= 1.0):
                    raise OperationError(
                        "max_num_seqs must be 1..4096, gpu_memory_utilization 0.1..1"
                    )
                mi = self.model_index[model]
                old = self.bundle[mi]
                sc = old.serving_config.model_copy(
                    update={"max_num_seqs": mns, "gpu_memory_utilization": gmu}
                )
                self.bundle[mi] = old.model_copy(update={"digest": bd, "serving_config": sc})
                self.update_seats()
                self.note_model_change(
                    "bundle",
                    mi,
                    f"{old.digest} seqs={old.serving_config.max_num_seqs}"
                    f" gmu={old.serving_config.gpu_memory_utilization}",
                    f"{bd} seqs={mns} gmu={gmu}",
                )
            case ops.SetNodeVersion(node=node, component=comp, version=version):
                ni = self.node_index[node]
                n = self.nodes[ni]
                old_version = n.versions[comp]
                n.versions[comp] = version
                self._refresh_bad_exporters()
                self.note_change("node_layer", n.cell, node, old_version, version, comp)
            case ops.InjectServingErrors(model=model, cell=cell, fraction=frac):
                if not 0.0 <= frac <= 1.0:
                    raise OperationError("error fraction must be within 0..1")
                p = self.model_index[model] * len(self.cell_names) + self.cell_index[cell]
                self.error_fraction[p] = frac
            case ops.ResetGpu(node=node, gpu=gpu):
                ni = self.node_index[node]
                if any(gpu in self.replicas[r].gpus for r in self.nodes[ni].replicas):
                    raise OperationError(f"{node}: drain GPU {gpu}'s workloads before a reset")
                self._push(self.t + GPU_RESET_S, "gpu_reset", (ni, gpu))
            case ops.RebootNode(node=node):
                ni = self.node_index[node]
                n = self.nodes[ni]
                for rid in sorted(n.replicas):
                    self.remove_replica(self.replicas[rid], graceful=False)
                n.ready = False
                self.training.on_node_unavailable(ni)
                self._record_node(node)
                self._push(self.t + NODE_REBOOT_S, "rebooted", (ni,))
            case ops.RunBurnIn(node=node):
                ni = self.node_index[node]
                if self.nodes[ni].replicas:
                    raise OperationError(f"{node}: burn-in needs a drained node")
                self.burn_in.pop(node, None)
                self._push(self.t + BURN_IN_S, "burned_in", (ni,))
            case ops.KillPod(pod=pod):
                r = self.replicas[int(pod[1:])]
                if r.state in (READY, LOADING, WARMING):
                    self._crash(r, fatal=False)  # restarts after a back-off, no pull
            case ops.EjectReplica(pod=pod):
                r = self.replicas[int(pod[1:])]
                if r.state == READY:
                    self._set_state(r, EJECTED)  # out of routing, kept on its node
            case ops.UnejectReplica(pod=pod):
                pass
            case _ if isinstance(op, TRAINING_OPS):
                self.training.apply(op)
            case _ if isinstance(op, RECOVERY_OPS):
                self.recovery.apply(op)
            case _ if isinstance(op, SANDBOX_OPS):
                self.sandbox.apply(op)
            case _ if isinstance(op, QUALITY_OPS):
                self.golden.apply(op)
            case _ if isinstance(op, PD_OPS):
                disagg.apply(self, self.pd, op)
            case ops.Noop():
                pass
        return inverse

    # ------------------------------------------------------------------------------------------
    # Fleet port: reads
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

    # ------------------------------------------------------------------------------------------
    # series
    def _register_series(self) -> None:
        if not self.record:
            return
        s = self.store
        base = [
            dict(
                model_name=self.models[int(self.pool_model[p])].name,
                cell=self.cell_names[int(self.pool_cell[p])],
                region=self.region_names[int(self.pool_region[p])],
            )
            for p in range(self.n_pools)
        ]
        self._series_pools = np.array([p for p in range(self.n_pools)], dtype=np.int64)
        plain = [labels_of(**b) for b in base]
        for name in (
            "vllm:num_requests_waiting",
            "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc",
            "vllm:num_preemptions_total",
            "vllm:time_to_first_token_seconds_count",
            "vllm:time_to_first_token_seconds_sum",
            "vllm:time_per_output_token_seconds_count",
            "vllm:time_per_output_token_seconds_sum",
            "vllm:generation_tokens_total",
            "firedrill_replicas_ready",
            "firedrill_replicas_desired",
            "firedrill_route_weight",
            "firedrill_offered_requests_per_second",
        ):
            s.family(name, plain)
        for reason in ("stop", "length"):
            s.family(
                f"vllm:request_success_total|{reason}",
                [labels_of(**b, finished_reason=reason) for b in base],
            )
        for status in ("2xx", "5xx"):
            s.family(
                f"http_requests_total|{status}",
                [
                    labels_of(**b, handler="/v1/completions", method="POST", status=status)
                    for b in base
                ],
            )
        ttft_le = [*(_fmt_le(x) for x in VLLM_TTFT_BUCKETS_S), "+Inf"]
        s.family(
            "vllm:time_to_first_token_seconds_bucket",
            [labels_of(**b, le=le) for b in base for le in ttft_le],
        )
        tpot_le = [*(_fmt_le(x) for x in VLLM_TPOT_BUCKETS_S), "+Inf"]
        s.family(
            "vllm:time_per_output_token_seconds_bucket",
            [labels_of(**b, le=le) for b in base for le in tpot_le],
        )
        reg = [labels_of(region=r) for r in self.region_names]
        for name in ("origin", "p2p"):
            s.family(
                f"firedrill_hydrate_bytes_total|{name}",
                [labels_of(region=r, source=name) for r in self.region_names],
            )
        for code in ("503", "429"):
            s.family(
                f"firedrill_registry_errors_total|{code}",
                [labels_of(region=r, code=code) for r in self.region_names],
            )
        s.family("firedrill_hydrate_pulls_active", reg)
        s.family(
            "firedrill_cell_nodes",
            [
                labels_of(cell=c, region=self.region_names[self.cell_region[i]])
                for i, c in enumerate(self.cell_names)
            ],
        )
        s.family("firedrill_admission_decisions_total|admit", [labels_of(decision="admit")])
        s.family("firedrill_admission_decisions_total|deny", [labels_of(decision="deny")])
        self._ttft_export_idx = np.searchsorted(self.edges, TTFT_EXPORT)
        if self.spec.training:
            self.training.register_series(s)
        self.recovery.register_series(s)
        if self.sandbox.enabled:
            self.sandbox.register_series(s)
        self.golden.register_series(s)
        if self.pd is not None:
            self.pd.register_series(s)

    def _scrape(self) -> None:
        self.flush_ttft()
        s = self.store
        k = s.begin_scrape(self.t)
        self.scrapes += 1
        waiting = self.queue.sum(axis=1)
        if self.pd is not None:
            waiting = waiting + self.pd.waiting()  # a disaggregated pool's prefill backlog too
        s.write("vllm:num_requests_waiting", k, waiting.astype(np.float64))
        s.write("vllm:num_requests_running", k, self.busy.astype(np.float64))
        s.write("vllm:kv_cache_usage_perc", k, self.kv_usage)
        s.write("vllm:num_preemptions_total", k, self.preemptions.astype(np.float64))
        s.write(
            "vllm:time_to_first_token_seconds_count",
            k,
            self.ttft_hist.sum(axis=1).astype(np.float64),
        )
        s.write("vllm:time_to_first_token_seconds_sum", k, self.ttft_sum)
        s.write(
            "vllm:time_per_output_token_seconds_count",
            k,
            self.tpot_hist.sum(axis=1).astype(np.float64),
        )
        s.write("vllm:time_per_output_token_seconds_sum", k, self.tpot_sum)
        s.write("vllm:generation_tokens_total", k, self.generation_tokens)
        s.write("firedrill_replicas_ready", k, self.ready.astype(np.float64))
        s.write("firedrill_replicas_desired", k, self.desired.astype(np.float64))
        s.write("firedrill_route_weight", k, self.weights.reshape(-1))
        s.write("firedrill_offered_requests_per_second", k, self.lam)
        s.write("vllm:request_success_total|stop", k, self.success_stop.astype(np.float64))
        s.write("vllm:request_success_total|length", k, self.success_length.astype(np.float64))
        s.write("http_requests_total|2xx", k, self.ok.astype(np.float64))
        s.write("http_requests_total|5xx", k, self.errors.astype(np.float64))
        cum = np.cumsum(self.ttft_hist, axis=1)
        buckets = np.concatenate([cum[:, self._ttft_export_idx], cum[:, -1:]], axis=1)
        s.write(
            "vllm:time_to_first_token_seconds_bucket", k, buckets.reshape(-1).astype(np.float64)
        )
        tcum = np.cumsum(self.tpot_hist, axis=1)
        s.write("vllm:time_per_output_token_seconds_bucket", k, tcum.reshape(-1).astype(np.float64))
        rs = self.supply.regions
        s.write(
            "firedrill_hydrate_bytes_total|origin", k, np.array([r.origin_gb * 1e9 for r in rs])
        )
        s.write("firedrill_hydrate_bytes_total|p2p", k, np.array([r.p2p_gb * 1e9 for r in rs]))
        s.write("firedrill_registry_errors_total|503", k, np.array([r.errors_503 for r in rs]))
        s.write("firedrill_registry_errors_total|429", k, np.array([r.errors_429 for r in rs]))
        active = np.zeros(len(rs))
        for p in self.supply.pulls.values():
            if p.digest >= 0:  # serving pulls (competing pullers have their own series)
                active[p.region] += 1
        s.write("firedrill_hydrate_pulls_active", k, active)
        s.write("firedrill_cell_nodes", k, np.array([float(len(n)) for n in self.cell_nodes]))
        s.write(
            "firedrill_admission_decisions_total|admit",
            k,
            np.array([float(self.admission["admitted"])]),
        )
        s.write(
            "firedrill_admission_decisions_total|deny",
            k,
            np.array([float(self.admission["denied"])]),
        )
        if self.spec.training:
            self.training.scrape(s, k)
        self.recovery.scrape(s, k)
        if self.sandbox.enabled:
            self.sandbox.scrape(s, k)
        self.golden.scrape(s, k, self.t - (s.times[-2] if len(s.times) > 1 else self.t))
        if self.pd is not None:
            self.pd.scrape(s, k)


def _fmt_le(x: float) -> str:
    return repr(float(x))
