"""Faults and node remediation: what happens to GPUs and nodes, and how it shows.

A fault (background or injected) lands on a GPU: a fatal XID or a double-bit ECC error takes the
GPU out and crashes its replicas, an application XID crashes them only, an NVLink flap takes every
tensor-parallel replica of the node down for a while, a thermal event slows the GPU's replicas.
Remediation operations finish through the event heap: a GPU reset, a reboot, a burn-in (diag and
all-reduce). Node conditions are exported as kube-state-metrics series and GPU fields as
dcgm-exporter series, under their real names.
"""

from __future__ import annotations

import numpy as np

from firedrill.model.series import Labels, labels_of
from firedrill.twin.faults import FaultEvent
from firedrill.twin.replica import ReplicaState
from firedrill.twin.scheduling import Scheduling

READY = ReplicaState.READY
LOADING = ReplicaState.LOADING
WARMING = ReplicaState.WARMING
EJECTED = ReplicaState.EJECTED

LINK_FLAP_S = (30.0, 180.0)  # a link flap lasts this long (uniform)
THERMAL_S = (600.0, 3600.0)
DCGM_XID, DCGM_ECC_DBE, DCGM_PCIE_REPLAY = 230, 319, 202
GPU_RESET_S = 120.0  # nvidia-smi -r on a drained node
NODE_REBOOT_S = 600.0
BURN_IN_S = 1200.0  # dcgmi diag -r 3 plus an NCCL all-reduce
# Fatal XIDs: the GPU is unusable until reset/reboot (replicas on it cannot restart).
FATAL_XIDS = frozenset({48, 62, 64, 79, 95, 119, 120, 140})
APP_XIDS = frozenset({13, 31, 43, 45, 94, 109})
DCGM_NAMES = {
    DCGM_XID: "DCGM_FI_DEV_XID_ERRORS",
    DCGM_ECC_DBE: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    DCGM_PCIE_REPLAY: "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    -1: "DCGM_FI_DEV_ROW_REMAP_PENDING",
    150: "DCGM_FI_DEV_GPU_TEMP",
    240: "DCGM_FI_DEV_POWER_VIOLATION",
}


class Remediation(Scheduling):
    """GPU and node faults, the remediation steps that complete later, and their series."""

    def _fault(self, ev: FaultEvent) -> None:
        self.fault_log.append(ev)
        n = self.nodes[ev.node]
        if ev.xid:
            self._dcgm_set(ev.node, ev.gpu, DCGM_XID, float(ev.xid))
        if ev.phantom:
            return
        on_gpu = [self.replicas[r] for r in n.replicas if ev.gpu in self.replicas[r].gpus]
        if self.spec.training and n.role == "training":
            fatal = (ev.kind == "xid" and ev.xid in FATAL_XIDS) or ev.kind in (
                "ecc_dbe",
                "link_flap",
            )
            if fatal or (ev.kind == "xid" and ev.xid in APP_XIDS):
                self.training.on_gpu_fault(ev.node, ev.gpu, fatal=fatal)
        if ev.kind == "xid":
            if ev.xid in FATAL_XIDS:
                n.failed_gpus.add(ev.gpu)
                for r in on_gpu:
                    self._crash(r, fatal=True)
            elif ev.xid == 74:
                self._link_flap(ev.node, self.rng.uniform(*LINK_FLAP_S))
            elif ev.xid in APP_XIDS:
                for r in on_gpu:
                    self._crash(r, fatal=False)
        elif ev.kind == "ecc_dbe":
            key = (ev.node, ev.gpu, DCGM_ECC_DBE)
            self._dcgm_set(ev.node, ev.gpu, DCGM_ECC_DBE, self.dcgm.get(key, 0.0) + 1.0)
            n.failed_gpus.add(ev.gpu)
            for r in on_gpu:
                self._crash(r, fatal=True)
        elif ev.kind == "row_remap_pending":
            self._dcgm_set(ev.node, ev.gpu, -1, 1.0)
        elif ev.kind == "link_flap":
            self._link_flap(ev.node, self.rng.uniform(*LINK_FLAP_S))
        elif ev.kind == "thermal":
            self._thermal(ev.node, ev.gpu, float(self.rng.uniform(1.5, 2.5)))
            self._push(self.t + self.rng.uniform(*THERMAL_S), "thermal_end", (ev.node, ev.gpu))
        elif ev.kind == "pcie_replay":
            key = (ev.node, ev.gpu, DCGM_PCIE_REPLAY)
            self._dcgm_set(ev.node, ev.gpu, DCGM_PCIE_REPLAY, self.dcgm.get(key, 0.0) + 5000.0)

    def _link_flap(self, ni: int, duration_s: float) -> None:
        n = self.nodes[ni]
        n.link_down = True
        for rid in sorted(n.replicas):
            r = self.replicas[rid]
            if self.models[r.model].tp > 1 and r.state in (READY, LOADING, WARMING):
                self._crash(r, fatal=False)  # the whole TP replica is lost, then restarts
        self._push(self.t + duration_s, "link_up", (ni,))

    def _thermal(self, ni: int, gpu: int, slowdown: float) -> None:
        n = self.nodes[ni]
        self._dcgm_set(ni, gpu, -2, 1.0)
        for rid in sorted(n.replicas):
            r = self.replicas[rid]
            if gpu in r.gpus:
                was_ready = r.state is READY
                if was_ready:
                    self._set_state(r, EJECTED)
                r.slowdown = slowdown
                if was_ready:
                    self._set_state(r, READY)

    def _clear_thermal(self, ni: int, gpu: int) -> None:
        n = self.nodes[ni]
        self._dcgm_set(ni, gpu, -2, 0.0)
        for rid in sorted(n.replicas):
            r = self.replicas[rid]
            if gpu in r.gpus and r.slowdown != 1.0:
                was_ready = r.state is READY
                if was_ready:
                    self._set_state(r, EJECTED)
                r.slowdown = 1.0
                if was_ready:
                    self._set_state(r, READY)

    def _gpu_reset_done(self, ni: int, gpu: int) -> None:
        n = self.nodes[ni]
        n.failed_gpus.discard(gpu)
        self.pool_dirty[self.pool_cell == n.cell] = True

    def _reboot_done(self, ni: int) -> None:
        n = self.nodes[ni]
        n.failed_gpus.clear()
        n.link_down = False
        n.ready = True
        self._record_node(n.name)
        self.pool_dirty[self.pool_cell == n.cell] = True

    def _burn_in_done(self, ni: int) -> None:
        """Diag and all-reduce pass unless a GPU is still failed or the link is down."""
        n = self.nodes[ni]
        problems = [f"gpu {g} failed diag" for g in sorted(n.failed_gpus)]
        if n.link_down:
            problems.append("NCCL all-reduce below bus-bandwidth floor (link down)")
        if not n.ready:
            problems.append("node not ready")
        self.burn_in[n.name] = (
            self.t,
            not problems,
            "; ".join(problems) or "diag -r 3 and all-reduce passed",
        )

    def _refresh_bad_exporters(self) -> None:
        bad = set(self.spec.faults.phantom_xid_exporter_versions)
        idx = [i for i, n in enumerate(self.nodes) if n.versions.get("dcgm_exporter") in bad]
        self.faults.set_bad_nodes(np.array(idx, dtype=np.int64))

    def _dcgm_set(self, ni: int, gpu: int, fid: int, value: float) -> None:
        self.dcgm[(ni, gpu, fid)] = value
        if self.record:
            name = DCGM_NAMES.get(fid)
            if name is not None:
                self.store.set_sparse(name, self._gpu_labels(ni, gpu), self.t, value)
            if fid == -2:
                self.store.set_sparse(
                    "DCGM_FI_DEV_GPU_TEMP",
                    self._gpu_labels(ni, gpu),
                    self.t,
                    92.0 if value else 65.0,
                )
                self.store.set_sparse(
                    "DCGM_FI_DEV_POWER_VIOLATION", self._gpu_labels(ni, gpu), self.t, 1.0e6 * value
                )

    def _gpu_labels(self, ni: int, gpu: int) -> Labels:
        n = self.nodes[ni]
        return labels_of(
            Hostname=n.name,
            gpu=str(gpu),
            cell=self.cell_names[n.cell],
            region=self.region_names[n.region],
        )

    def _record_node(self, node: str) -> None:
        if not self.record:
            return
        n = self.nodes[self.node_index[node]]
        base = {
            "node": n.name,
            "cell": self.cell_names[n.cell],
            "region": self.region_names[n.region],
        }
        seen = self._taint_series.setdefault(node, set())
        now = {labels_of(**base, key=k, value=v, effect=e) for k, (v, e) in n.taints.items()}
        for lab in seen - now:
            self.store.set_sparse("kube_node_spec_taint", lab, self.t, 0.0)
        for lab in now:
            self.store.set_sparse("kube_node_spec_taint", lab, self.t, 1.0)
        self._taint_series[node] = now
        extra = {
            "label_" + k.replace(".", "_").replace("/", "_").replace("-", "_"): v
            for k, v in n.labels.items()
        }
        self.store.set_sparse("kube_node_labels", labels_of(**base, **extra), self.t, 1.0)
        old = self._label_series.get(node)
        new_lab = labels_of(**base, **extra)
        if old is not None and old != new_lab:
            self.store.set_sparse("kube_node_labels", old, self.t, 0.0)
        self._label_series[node] = new_lab
        for status in ("true", "false"):  # kube-state-metrics: one series per status, 1 or 0
            on = (status == "true") == n.ready
            self.store.set_sparse(
                "kube_node_status_condition",
                labels_of(**base, condition="Ready", status=status),
                self.t,
                1.0 if on else 0.0,
            )
        self.store.set_sparse(
            "kube_node_spec_unschedulable", labels_of(**base), self.t, 1.0 if n.cordoned else 0.0
        )
