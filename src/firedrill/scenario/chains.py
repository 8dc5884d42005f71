"""Chain tracing: for every injected or natural GPU fault, how far the detection-to-ready chain got.

DCGM field → exporter series → alert → health condition → taint → drain → router ejection →
replacement → re-hydrate → ready. Each stage carries the time it was reached; the first stage
that was not reached is ``broken_at``, with the reason read from the records of the stage before
it (an unmapped condition, a budget, dry-run, a policy that never drains). This answers the
game-day question "we saw an alert but no drain: where did it break?".

It reads the world only through the ports: the fault and replica events (``FleetHistory``), the
exporter series (``Signals``) and node views (``Fleet``), so a drill against a served twin or a
real fleet traces the same chains as one on the embedded twin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from firedrill.detect.evaluator import AlertEvent
from firedrill.model import operations as ops
from firedrill.model.state import ReplicaTransition
from firedrill.ports import Fleet, FleetHistory, Signals
from firedrill.remediate.controller import RemediationController


class ChainWorld(Fleet, FleetHistory, Signals, Protocol):
    """What chain tracing reads of a world."""


@dataclass(frozen=True)
class ChainSources:
    """What a run hands chain tracing: what it applied and saw, and the world to read."""

    world: ChainWorld
    applied: Sequence[tuple[float, ops.Operation]]
    alerts: Sequence[AlertEvent]
    controller: RemediationController
    end_s: float
    background: bool = True  # trace the faults nobody injected too


STAGES = (
    "dcgm_field",
    "exporter_series",
    "alert",
    "health_condition",
    "taint",
    "drain",
    "router_ejection",
    "replacement",
    "rehydrate",
    "ready",
)
READY = "ready"
HYDRATING = ("pulling", "loading")
_FIELD_SERIES = {
    230: "DCGM_FI_DEV_XID_ERRORS",
    319: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    202: "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
}


@dataclass(frozen=True)
class Stage:
    name: str
    at_s: float | None
    status: str  # ok | missing | n/a
    detail: str = ""


@dataclass(frozen=True)
class Chain:
    origin: str  # injection | fault
    kind: str  # xid79, ecc_dbe, pcie_replay, link_flap, thermal, ...
    node: str
    gpu: int
    at_s: float
    stages: tuple[Stage, ...]
    broken_at: str | None
    why: str

    def to_json(self) -> dict[str, Any]:
        return {
            "origin": self.origin,
            "kind": self.kind,
            "node": self.node,
            "gpu": self.gpu,
            "at_s": self.at_s,
            "stages": [
                {"name": s.name, "at_s": s.at_s, "status": s.status, "detail": s.detail}
                for s in self.stages
            ],
            "broken_at": self.broken_at,
            "why": self.why,
        }


@dataclass(frozen=True)
class _Origin:
    origin: str
    kind: str
    node: str
    gpu: int
    at_s: float
    series: str


def _origins(src: ChainSources) -> list[_Origin]:
    out: list[_Origin] = []
    seen: set[tuple[float, str, int]] = set()
    for at, op in src.applied:
        match op:
            case ops.InjectDcgmField(node=node, gpu=gpu, field_id=fid, value=value):
                kind = (
                    f"xid{int(value)}"
                    if fid == 230
                    else {319: "ecc_dbe", 202: "pcie_replay"}.get(fid, f"field{fid}")
                )
                out.append(_Origin("injection", kind, node, gpu, at, _FIELD_SERIES.get(fid, "")))
                seen.add((at, node, gpu))
            case ops.InjectLinkFlap(node=node):
                out.append(_Origin("injection", "link_flap", node, 0, at, "DCGM_FI_DEV_XID_ERRORS"))
                seen.add((at, node, 0))
            case ops.InjectThermal(node=node, gpu=gpu):
                out.append(_Origin("injection", "thermal", node, gpu, at, "DCGM_FI_DEV_GPU_TEMP"))
                seen.add((at, node, gpu))
    for ev in src.world.fault_events() if src.background else ():
        if (ev.at_s, ev.node, ev.gpu) in seen or (ev.phantom and ev.kind != "xid"):
            continue
        series = {
            "xid": "DCGM_FI_DEV_XID_ERRORS",
            "ecc_dbe": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "pcie_replay": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            "thermal": "DCGM_FI_DEV_GPU_TEMP",
            "link_flap": "DCGM_FI_DEV_XID_ERRORS",
            "row_remap_pending": "DCGM_FI_DEV_ROW_REMAP_PENDING",
        }[ev.kind]
        origin = "phantom" if ev.phantom else "fault"
        out.append(_Origin(origin, ev.label, ev.node, ev.gpu, ev.at_s, series))
    return sorted(out, key=lambda o: (o.at_s, o.node, o.gpu))


def trace_chains(src: ChainSources) -> list[Chain]:
    origins = _origins(src)
    if not origins:
        return []
    log = src.world.replica_transitions()
    return [_trace(src, o, log) for o in origins]


def _trace(src: ChainSources, o: _Origin, log: Sequence[ReplicaTransition]) -> Chain:
    world = src.world
    st = src.controller.state
    times: dict[str, float | None] = {"dcgm_field": o.at_s}
    why: dict[str, str] = {}
    # exporter series: first scrape at or after the fault that shows a non-default value
    times["exporter_series"] = None
    for s in world.query(
        o.series, {"Hostname": o.node, "gpu": str(o.gpu)}, start_s=o.at_s, end_s=src.end_s
    ):
        hot = s.values > (87.0 if o.series == "DCGM_FI_DEV_GPU_TEMP" else 0.0)
        if hot.any():
            times["exporter_series"] = float(s.t_s[hot.argmax()])
    why["exporter_series"] = "the exporter never showed the field (is it in the counter set?)"
    fired = [
        a.at_s
        for a in src.alerts
        if a.state == "firing" and a.label("node") == o.node and a.at_s >= o.at_s
    ]
    times["alert"] = min(fired) if fired else None
    why["alert"] = "no alert rule matched the series"
    conds = [t for (node, gpu, _), t in st.conditions_at.items() if node == o.node and t >= o.at_s]
    times["health_condition"] = min(conds) if conds else None
    policy = src.controller.policy
    why["health_condition"] = f"no health condition is mapped for {o.kind} in the policy"
    acts = [a for a in st.actions if a.node == o.node and a.at_s >= o.at_s]

    def first(action: str) -> float | None:
        ts = [a.at_s for a in acts if a.action == action]
        return min(ts) if ts else None

    ejected = first("eject")
    times["taint"] = first("quarantine")
    blocked = [b for b in st.blocked if b.node == o.node and b.at_s >= o.at_s]
    decided = [a for a in acts if a.action in ("app_restart", "track", "ticket", "eject")]
    if blocked:
        why["taint"] = f"budget '{blocked[0].budget}' held it ({blocked[0].reason})"
    elif decided and times["taint"] is None:
        why["taint"] = f"policy: '{decided[0].action}' for {decided[0].reason} never drains a node"
    else:
        why["taint"] = "the controller did not act"
    times["drain"] = first("drain")
    why["drain"] = why["taint"]
    if policy.dry_run:
        why["taint"] = why["drain"] = "dry-run: recorded what would have been done"
    # router ejection and replacement, from the replica lifecycle events
    ej = [
        (e.at_s, e.replica)
        for e in log
        if e.node == o.node and e.from_state == READY and e.to_state != READY and e.at_s >= o.at_s
    ]
    had_replicas = any(e.node == o.node for e in log) or bool(world.pods_on(o.node))
    serving = world.node(o.node).role == "serving" and had_replicas
    times["router_ejection"] = min(t for t, _ in ej) if ej else ejected
    why["router_ejection"] = "the replica kept serving (still routed)"
    times["replacement"] = times["rehydrate"] = times["ready"] = None
    if ej:
        t_ej, rid = min(ej)
        pool = next((e.model, e.cell) for e in log if e.replica == rid)
        created = [
            (e.at_s, e.replica)
            for e in log
            if e.from_state is None and e.at_s >= t_ej - 1e-9 and (e.model, e.cell) == pool
        ]
        if created:
            t_new, new = min(created)
            times["replacement"] = t_new
            moves = [(e.at_s, e.to_state) for e in log if e.replica == new]
            hyd = [t for t, to in moves if to in HYDRATING]
            rdy = [t for t, to in moves if to == READY]
            times["rehydrate"] = min(hyd) if hyd else None
            times["ready"] = min(rdy) if rdy else None
    why["replacement"] = "no replacement replica was scheduled (capacity?)"
    why["rehydrate"] = "the replacement never started pulling or loading"
    why["ready"] = "the replacement was not ready before the run ended"
    stages: list[Stage] = []
    broken: str | None = None
    reason = ""
    for name in STAGES:
        at = times.get(name)
        if name in ("taint", "drain") and ejected is not None and at is None:
            stages.append(Stage(name, None, "n/a", "straggler: ejected from routing instead"))
            continue
        if name in ("router_ejection", "replacement", "rehydrate", "ready") and not serving:
            stages.append(Stage(name, None, "n/a", "the node served no replicas"))
            continue
        if name in ("replacement", "rehydrate", "ready") and ejected is not None and not ej:
            stages.append(Stage(name, None, "n/a", "ejected replica kept for evidence"))
            continue
        if at is None:
            stages.append(Stage(name, None, "missing", why.get(name, "")))
            if broken is None:
                broken, reason = name, why.get(name, "")
        else:
            stages.append(Stage(name, at, "ok"))
    return Chain(
        origin=o.origin,
        kind=o.kind,
        node=o.node,
        gpu=o.gpu,
        at_s=o.at_s,
        stages=tuple(stages),
        broken_at=broken,
        why=reason,
    )
