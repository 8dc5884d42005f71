"""Operations: the Fleet port's typed changes, each validated and inverted before it applies.

``inverse_of`` validates an operation's targets and returns the operation that would undo it
now; ``apply`` records that inverse in the journal and changes the twin. Both dispatch with one
``match`` over the ``Operation`` union that ends in ``assert_never``: an Operation that no case
handles is a type error (mypy), not a silent no-op. The families of the sub-simulations
(training, recovery, sandboxes, golden-set quality, prefill/decode) are forwarded to them.
"""

from __future__ import annotations

import re
from typing import assert_never

from firedrill.errors import OperationError, UnknownTargetError
from firedrill.model import operations as ops
from firedrill.model import sandbox as sandbox_ops
from firedrill.model.series import labels_of
from firedrill.twin import disagg
from firedrill.twin.faults import FaultEvent
from firedrill.twin.hydrate import Hydrate
from firedrill.twin.remediation import (
    BURN_IN_S,
    DCGM_NAMES,
    DCGM_XID,
    GPU_RESET_S,
    NODE_REBOOT_S,
    Remediation,
)
from firedrill.twin.replica import ReplicaState

READY = ReplicaState.READY
LOADING = ReplicaState.LOADING
WARMING = ReplicaState.WARMING
EJECTED = ReplicaState.EJECTED
QUARANTINE_TAINT = "gpu.corp/quarantine"


class Operations(Remediation, Hydrate):
    """The Fleet port's writes: ``apply`` and ``inverse_of``."""

    def apply(self, op: ops.Operation) -> ops.Operation:
        self.recovery.check(op)  # a cut dependency refuses it before anything changes
        inverse = self._apply(op)
        self.pool_dirty[:] = True
        self.journal.append(ops.Applied(op=op, inverse=inverse, at_s=self.t))
        return inverse

    def inverse_of(self, op: ops.Operation) -> ops.Operation:
        """The inverse ``op`` would have if applied now (validates targets; changes nothing)."""
        return self._inverse(op)

    def _inverse(self, op: ops.Operation) -> ops.Operation:
        if not isinstance(op, ops.Operation):  # statically impossible; a caller may still try
            raise OperationError(f"unsupported operation {op!r}")
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
                return ops.InjectServingErrors(
                    model, cell, float(self.error_fraction[p]), bool(self.error_fail_fast[p])
                )
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
                return ops.UnejectReplica(pod) if r.state is READY else ops.Noop("not ready")
            case ops.UnejectReplica(pod=pod):
                self._pod_check(pod)
                return ops.Noop("not ejected")
            case (
                ops.SuspendJobSet()
                | ops.ResumeJobSet()
                | ops.SetQueueStopPolicy()
                | ops.InjectHang()
                | ops.InjectStraggler()
                | ops.ClearTrainingFault()
            ):
                return self.training.inverse(op)
            case (
                ops.StartPullers()
                | ops.StopPullers()
                | ops.FreezePullers()
                | ops.RecyclePool()
                | ops.StopRecycle()
                | ops.SetAdmission()
                | ops.SetRegionWeight()
                | ops.MirrorTraffic()
            ):
                return self.recovery.inverse(op)
            case (
                sandbox_ops.InjectExfiltration()
                | sandbox_ops.ClearExfiltration()
                | sandbox_ops.InjectPromptInjection()
                | sandbox_ops.ClearPromptInjection()
                | sandbox_ops.SetWarmPool()
                | sandbox_ops.FreezePromotions()
                | sandbox_ops.UnfreezePromotions()
                | sandbox_ops.PromoteToolset()
                | sandbox_ops.BlockContentHash()
                | sandbox_ops.UnblockContentHash()
                | sandbox_ops.RunCompensations()
            ):
                return self.sandbox.inverse(op)
            case ops.SetWeightsQuality():
                return self.golden.inverse(op)
            case ops.SetPrefillDecodeSplit() | ops.SetRequestShape():
                return disagg.inverse(self, self.pd, op)
            case ops.Noop():
                return ops.Noop()
            case _:
                assert_never(op)

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
            case ops.InjectServingErrors(model=model, cell=cell, fraction=frac, fail_fast=ff):
                if not 0.0 <= frac <= 1.0:
                    raise OperationError("error fraction must be within 0..1")
                p = self.model_index[model] * len(self.cell_names) + self.cell_index[cell]
                self.error_fraction[p] = frac
                self.error_fail_fast[p] = ff
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
                if r.state is READY:
                    self._set_state(r, EJECTED)  # out of routing, kept on its node
            case ops.UnejectReplica(pod=pod):
                pass
            case (
                ops.SuspendJobSet()
                | ops.ResumeJobSet()
                | ops.SetQueueStopPolicy()
                | ops.InjectHang()
                | ops.InjectStraggler()
                | ops.ClearTrainingFault()
            ):
                self.training.apply(op)
            case (
                ops.StartPullers()
                | ops.StopPullers()
                | ops.FreezePullers()
                | ops.RecyclePool()
                | ops.StopRecycle()
                | ops.SetAdmission()
                | ops.SetRegionWeight()
                | ops.MirrorTraffic()
            ):
                self.recovery.apply(op)
            case (
                sandbox_ops.InjectExfiltration()
                | sandbox_ops.ClearExfiltration()
                | sandbox_ops.InjectPromptInjection()
                | sandbox_ops.ClearPromptInjection()
                | sandbox_ops.SetWarmPool()
                | sandbox_ops.FreezePromotions()
                | sandbox_ops.UnfreezePromotions()
                | sandbox_ops.PromoteToolset()
                | sandbox_ops.BlockContentHash()
                | sandbox_ops.UnblockContentHash()
                | sandbox_ops.RunCompensations()
            ):
                self.sandbox.apply(op)
            case ops.SetWeightsQuality():
                self.golden.apply(op)
            case ops.SetPrefillDecodeSplit() | ops.SetRequestShape():
                disagg.apply(self, self.pd, op)
            case ops.Noop():
                pass
            case _:
                assert_never(op)
        return inverse

    def _gpu_check(self, ni: int, gpu: int) -> None:
        if not 0 <= gpu < self.nodes[ni].gpus:
            raise UnknownTargetError("gpu", f"{self.nodes[ni].name}/{gpu}")

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
