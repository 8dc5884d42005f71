"""Autoscaling and capacity: the KEDA-like scaler of each pool and the region's GPU supply.

Every 15 s each pool with an enabled autoscaler compares its offered load with its ready
replicas' saturation throughput and scales out (at once, to what the load needs) or in (at most
10% per cooldown). A scale-out takes free GPUs of the cell first, then nodes from the region's
spare pool, which join after the region's provisioning time; a region whose capacity is denied
grants none, and every node it could not grant counts as an insufficient-capacity error.
"""

from __future__ import annotations

import math

import numpy as np

from firedrill.model.spec import Versions
from firedrill.twin.replica import Node, ReplicaState
from firedrill.twin.state import TwinState

PENDING = ReplicaState.PENDING
AUTOSCALE_EVERY_S = 15.0


class Capacity(TwinState):
    """The autoscaler and the nodes it brings in."""

    def _autoscale(self) -> None:
        for p in range(self.n_pools):
            mi = int(self.pool_model[p])
            a = self.models[mi].autoscaler
            if not a.enabled or self.scaler_paused[p] >= 0 or self.desired[p] == 0:
                continue
            ready = int(self.ready[p])
            if ready == 0:
                continue
            cap = ready * self.max_rps_per_replica[p]
            util = self.lam[p] / cap if cap > 0 else 0.0
            waiting = int(self.queue[p].sum())
            cur = int(self.desired[p])
            new = cur
            if (util > a.target_utilization or waiting > 0) and self.t - self._last_scale[
                p
            ] >= a.scale_out_cooldown_s:
                new = math.ceil(cur * max(util / a.target_utilization, 1.1))
            elif (
                util < a.target_utilization * 0.5
                and self.t - self._last_scale[p] >= a.scale_in_cooldown_s
            ):
                # scale in gently: at most 10% per cooldown, never below what the load needs
                new = max(math.ceil(cur * util / a.target_utilization), int(cur * 0.9))
            new = max(a.min_replicas, min(a.max_replicas, new))
            if new != cur:
                grow = new - cur
                if grow > 0:
                    grow = self._capacity_for(p, grow)
                    new = cur + grow
                if new != cur:
                    self.desired[p] = new
                    self._last_scale[p] = self.t
                    self.pool_dirty[p] = True

    def _capacity_for(self, p: int, extra_replicas: int) -> int:
        """Nodes for a scale-out: free GPUs in the cell first, then the region's spare pool."""
        mi, ci = int(self.pool_model[p]), int(self.pool_cell[p])
        tp = self.models[mi].tp
        free_slots = sum(
            len([g for g in self.nodes[n].free if g not in self.nodes[n].failed_gpus]) // tp
            for n in self.cell_nodes[ci]
            if self.nodes[n].schedulable
        )
        pending = int(self.state_counts[p, PENDING])
        short = extra_replicas + pending - free_slots
        if short <= 0:
            return extra_replicas
        ri = self.cell_region[ci]
        per_node = 8 // tp
        need_nodes = math.ceil(short / per_node)
        if ri in self.capacity_denied:
            self.capacity_errors += need_nodes
            return max(0, free_slots - pending)
        grant = min(need_nodes, self.spare_nodes[ri])
        if grant < need_nodes:
            self.capacity_errors += need_nodes - grant
        for _ in range(grant):
            self.spare_nodes[ri] -= 1
            self._push(
                self.t + self.spec.regions[ri].capacity.node_provision_s, "node_join", (ci, mi)
            )
        return max(0, free_slots - pending) + grant * per_node

    def _node_joins(self, ci: int, mi: int) -> None:
        self.pool_dirty[self.pool_cell == ci] = True
        ri = self.cell_region[ci]
        proto = self.nodes[self.cell_nodes[ci][0]] if self.cell_nodes[ci] else None
        k = len(self.cell_nodes[ci])
        versions = dict(proto.versions) if proto else Versions().model_dump()
        node = Node(
            name=f"gpu-{self.cell_names[ci]}-scaleout-{k:04d}",
            region=ri,
            cell=ci,
            pool=(self.models[mi].node_pools or ["scaleout"])[0],
            role="serving",
            gpus=8,
            nic_gbps=proto.nic_gbps if proto else 50.0,
            versions=versions,
            free=list(range(8)),
        )
        self.nodes.append(node)
        self.node_index[node.name] = len(self.nodes) - 1
        self.cell_nodes[ci].append(len(self.nodes) - 1)
        self.nic = np.append(self.nic, node.nic_gbps)
        self.node_region = np.append(self.node_region, ri)
        self.node_cell = np.append(self.node_cell, ci)
        self.faults.nodes = len(self.nodes)
        self.note_change("node_layer", ci, node.name, "", versions["node_image"], "node joined")
