"""The GPU remediation controller: quarantine, drain, reset/reboot, burn-in, return — on a budget.

It reads health signals through the ``Signals`` port (the DCGM exporter's series), turns them into
deduplicated health events, holds each unhealthy condition for N observations, and acts through
the ``Fleet`` port. Budgets make sure automation can never become the outage:

* **flapping**: a node remediated twice within 90 minutes is held and ticketed, not remediated;
* **rate**: at most N quarantines per cell per hour;
* **minHealthy**: never take a cell below its floor of healthy nodes (90% by default);
* **quarantined fraction**: the share of a cell under quarantine has a ceiling.

When the rate, floor or fraction budget blocks, the controller stops acting in that cell, pages
once (``QuarantineRateAnomalous``) and records everything it did not do. In dry-run it records
what it would have done and changes nothing.

Events are processed in (time, node, GPU) order, so a storm gives the same decisions every time
and the budgets are exact: the 21st quarantine of the hour is the one that is refused.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from firedrill.errors import FiredrillError
from firedrill.model import operations as ops
from firedrill.ports import Fleet, Signals
from firedrill.remediate.policy import Action, PolicySpec

QUARANTINE_KEY = "gpu.corp/quarantine"
REASON_LABEL = "gpu.corp/quarantine-reason"
TICKET_LABEL = "gpu.corp/quarantine-ticket"


@dataclass(frozen=True)
class HealthEvent:
    """One new unhealthy observation of one GPU (deduplicated)."""

    at_s: float
    node: str
    gpu: int
    kind: str  # xid | ecc_dbe | pcie_replay | row_remap | thermal
    xid: int = 0
    value: float = 0.0

    @property
    def reason(self) -> str:
        return f"xid{self.xid}" if self.kind == "xid" else self.kind


@dataclass(frozen=True)
class ActionRecord:
    node: str
    cell: str
    action: str  # quarantine | drain | reset | reboot | burn_in | return | ticket | eject | ...
    reason: str
    at_s: float
    dry_run: bool
    detail: str = ""


@dataclass(frozen=True)
class BlockedRecord:
    node: str
    cell: str
    budget: str  # flapping | rate | min_healthy | quarantined_fraction | cell_paused
    at_s: float
    reason: str
    would_have: str


@dataclass(frozen=True)
class Page:
    """The controller paging on itself: a budget stopped it in a cell."""

    at_s: float
    cell: str
    region: str
    budget: str
    alertname: str = "QuarantineRateAnomalous"


@dataclass
class _NodeCase:
    """One node's remediation in progress."""

    node: str
    cell: str
    reason: str
    action: Action
    gpus: set[int]
    stage: str  # held | quarantined | draining | resetting | rebooting | burn_in | awaiting_human
    since_s: float
    ticket: str = ""


@dataclass
class _Condition:
    event: HealthEvent
    action: Action
    seen: int = 1
    first_s: float = 0.0


@dataclass
class ControllerState:
    actions: list[ActionRecord] = field(default_factory=list)
    blocked: list[BlockedRecord] = field(default_factory=list)
    pages: list[Page] = field(default_factory=list)
    events: list[HealthEvent] = field(default_factory=list)
    conditions_at: dict[tuple[str, int, str], float] = field(default_factory=dict)


class RemediationController:
    def __init__(self, policy: PolicySpec, fleet: Fleet) -> None:
        self.policy = policy
        self.fleet = fleet
        views = fleet.node_views()
        self.node_cell = {v.name: v.cell for v in views}
        self.node_region = {v.name: v.region for v in views}
        self.cell_nodes: dict[str, int] = {}
        for v in views:
            if all(dict(v.labels).get(k, "true") == val for k, val in policy.selector.items()):
                self.cell_nodes[v.cell] = self.cell_nodes.get(v.cell, 0) + 1
        self.state = ControllerState()
        self._last: dict[tuple[str, str, int], float] = {}  # (series, node, gpu) -> last value
        self._pcie: dict[tuple[str, int], deque[tuple[float, float]]] = {}
        self._pending: dict[tuple[str, int, str], _Condition] = {}
        self._cases: dict[str, _NodeCase] = {}
        self._quarantines: dict[str, deque[float]] = {}  # cell -> times (last hour)
        self._node_history: dict[str, deque[float]] = {}  # node -> remediation start times
        self._paused: dict[str, str] = {}  # cell -> budget that paused it
        self._unavailable: dict[str, set[str]] = {}  # cell -> nodes quarantined or not ready
        self._app: dict[tuple[str, int], deque[float]] = {}
        self._tickets = 0
        self._known: set[str] = set(self.node_cell)

    # -- observing ------------------------------------------------------------------------------
    def observe(self, now_s: float, signals: Signals) -> None:
        """Read the health series, then advance every condition and remediation by one tick."""
        for ev in self._read(now_s, signals):
            self.handle(ev)
        self.tick(now_s)

    def _read(self, now_s: float, signals: Signals) -> list[HealthEvent]:
        p = self.policy
        out: list[HealthEvent] = []
        if p.modules.xid:
            for node, gpu, v in self._gauge(signals, "DCGM_FI_DEV_XID_ERRORS"):
                if self._changed("xid", node, gpu, v) and v > 0:
                    out.append(HealthEvent(now_s, node, gpu, "xid", int(v), v))
        if p.modules.ecc:
            for node, gpu, v in self._gauge(signals, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"):
                before = self._last.get(("ecc", node, gpu), 0.0)
                if self._changed("ecc", node, gpu, v) and v > before:
                    out.append(HealthEvent(now_s, node, gpu, "ecc_dbe", 48, v))
        if p.modules.row_remap:
            for node, gpu, v in self._gauge(signals, "DCGM_FI_DEV_ROW_REMAP_PENDING"):
                if self._changed("remap", node, gpu, v) and v > 0:
                    out.append(HealthEvent(now_s, node, gpu, "row_remap", 63, v))
        if p.modules.pcie:
            for node, gpu, v in self._gauge(signals, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"):
                hist = self._pcie.setdefault((node, gpu), deque())
                hist.append((now_s, v))
                while hist and hist[0][0] < now_s - 300.0:
                    hist.popleft()
                inc = v - hist[0][1]
                level = (
                    2
                    if inc > p.fields.pcie_replay_drain_per_5m
                    else 1
                    if inc > p.fields.pcie_replay_ticket_per_5m
                    else 0
                )
                if self._changed("pcie", node, gpu, float(level)) and level > 0:
                    out.append(HealthEvent(now_s, node, gpu, "pcie_replay", 0, float(level)))
        if p.modules.thermal:
            for node, gpu, v in self._gauge(signals, "DCGM_FI_DEV_GPU_TEMP"):
                hot = float(v > p.fields.gpu_temp_c)
                if self._changed("thermal", node, gpu, hot) and hot:
                    out.append(HealthEvent(now_s, node, gpu, "thermal", 0, v))
        out.sort(key=lambda e: (e.at_s, e.node, e.gpu, e.kind))
        return out

    def _gauge(self, signals: Signals, name: str) -> list[tuple[str, int, float]]:
        _, labels, values = signals.instant(name)
        out = []
        for lab, v in zip(labels, values, strict=True):
            d = dict(lab)
            node = d.get("Hostname", "")
            if node in self._known and v == v:
                out.append((node, int(d.get("gpu", "0")), float(v)))
        return out

    def _changed(self, series: str, node: str, gpu: int, value: float) -> bool:
        key = (series, node, gpu)
        if self._last.get(key) == value:
            return False  # a repeat is not a new event (and DCGM's XID gauge hides repeats)
        self._last[key] = value
        return True

    # -- deciding -------------------------------------------------------------------------------
    def _action_for(self, ev: HealthEvent) -> Action | None:
        p = self.policy
        if ev.kind == "xid":
            return p.action_for_xid(ev.xid)
        if ev.kind == "ecc_dbe":
            return p.fields.ecc_dbe
        if ev.kind == "row_remap":
            return "track"
        if ev.kind == "pcie_replay":
            return "drain_ticket" if ev.value >= 2 else "ticket"
        if ev.kind == "thermal":
            return p.fields.thermal
        return None

    def handle(self, ev: HealthEvent) -> None:
        """Take one health event (deduplicated upstream): start holding its condition."""
        self.state.events.append(ev)
        action = self._action_for(ev)
        if action is None:
            return  # unmapped: no health condition (the chain stops here)
        key = (ev.node, ev.gpu, ev.reason)
        self.state.conditions_at.setdefault(key, ev.at_s)
        if key not in self._pending:
            self._pending[key] = _Condition(ev, action, 1, ev.at_s)

    def tick(self, now_s: float) -> None:
        """Advance conditions (holding) and remediations in progress."""
        due: list[_Condition] = []
        for key, cond in list(self._pending.items()):
            if cond.first_s < now_s:
                cond.seen += 1
            if cond.seen >= self.policy.timings.hold_observations:
                due.append(cond)
                del self._pending[key]
        due.sort(key=lambda c: (c.first_s, c.event.node, c.event.gpu))
        for cond in due:
            self._act(cond.event, cond.action, now_s)
        for case in sorted(self._cases.values(), key=lambda c: c.node):
            self._advance(case, now_s)

    def _act(self, ev: HealthEvent, action: Action, now_s: float) -> None:
        cell = self.node_cell[ev.node]
        if action == "track":
            self._record(ev.node, "track", ev.reason, now_s)
            return
        if action == "ticket":
            self._record(ev.node, "ticket", ev.reason, now_s, self._new_ticket())
            return
        if action == "app":
            seen = self._app.setdefault((ev.node, ev.gpu), deque())
            seen.append(now_s)
            while seen and seen[0] < now_s - self.policy.timings.app_repeat_window_s:
                seen.popleft()
            self._record(ev.node, "app_restart", ev.reason, now_s, "never drains a node")
            if len(seen) >= self.policy.timings.app_repeat_count:
                self._record(ev.node, "ticket", ev.reason, now_s, "repeated on one GPU")
            return
        if action == "eject":
            self._eject(ev, now_s)
            return
        case = self._cases.get(ev.node)
        if case is not None:
            case.gpus.add(ev.gpu)  # the node is already being remediated: one incident
            return
        self._quarantine(ev, action, cell, now_s)

    def _budget_blocks(self, node: str, cell: str, now_s: float) -> str | None:
        b = self.policy.budgets
        if cell in self._paused:
            return "cell_paused"
        hist = self._node_history.setdefault(node, deque())
        while hist and hist[0] < now_s - b.flapping_window_s:
            hist.popleft()
        if len(hist) + 1 >= b.flapping_count:
            return "flapping"
        q = self._quarantines.setdefault(cell, deque())
        while q and q[0] <= now_s - 3600.0:
            q.popleft()
        if len(q) >= b.max_quarantines_per_cell_hour:
            return "rate"
        total = self.cell_nodes.get(cell, 0)
        down = len(self._unavailable.get(cell, set()) | self._not_ready(cell))
        if total and (total - down - 1) / total < b.min_healthy:
            return "min_healthy"
        if total and (len(self._unavailable.get(cell, set())) + 1) / total > b.quarantined_fraction:
            return "quarantined_fraction"
        return None

    def _not_ready(self, cell: str) -> set[str]:
        """Nodes the fleet reports NotReady in a cell (read only when a quarantine is weighed)."""
        return {v.name for v in self.fleet.node_views(cell=cell) if not v.ready}

    def _quarantine(self, ev: HealthEvent, action: Action, cell: str, now_s: float) -> None:
        budget = self._budget_blocks(ev.node, cell, now_s)
        if budget is not None:
            self.state.blocked.append(
                BlockedRecord(ev.node, cell, budget, now_s, ev.reason, "quarantine")
            )
            if budget == "flapping":
                self._record(ev.node, "ticket", ev.reason, now_s, "flapping: held for a human")
            elif budget != "cell_paused":
                self._paused[cell] = budget
                self.state.pages.append(Page(now_s, cell, self.node_region[ev.node], budget))
            return
        ticket = self._new_ticket()
        self._quarantines.setdefault(cell, deque()).append(now_s)
        self._node_history.setdefault(ev.node, deque()).append(now_s)
        self._unavailable.setdefault(cell, set()).add(ev.node)
        self._apply(ops.Taint(ev.node, QUARANTINE_KEY, ev.reason, "NoSchedule"), now_s)
        self._apply(ops.Label(ev.node, REASON_LABEL, ev.reason), now_s)
        self._apply(ops.Label(ev.node, TICKET_LABEL, ticket), now_s)
        self._record(ev.node, "quarantine", ev.reason, now_s, ticket)
        self._apply(ops.Drain(ev.node, ("inference", "training")), now_s)
        self._record(ev.node, "drain", ev.reason, now_s, "inference,training; DaemonSets stay")
        self._cases[ev.node] = _NodeCase(
            ev.node, cell, ev.reason, action, {ev.gpu}, "draining", now_s, ticket
        )

    def _advance(self, case: _NodeCase, now_s: float) -> None:
        t = self.policy.timings
        if case.stage == "draining" and now_s - case.since_s >= t.drain_wait_s:
            if case.action == "drain_ticket":
                case.stage = "awaiting_human"
                self._record(case.node, "ticket", case.reason, now_s, case.ticket)
                return
            if case.action == "reboot":
                if self._apply(ops.RebootNode(case.node), now_s):
                    self._record(case.node, "reboot", case.reason, now_s)
                    case.stage, case.since_s = "rebooting", now_s
                return
            ok = True
            for gpu in sorted(case.gpus):
                ok = self._apply(ops.ResetGpu(case.node, gpu), now_s) and ok
            if ok:
                self._record(case.node, "reset", case.reason, now_s, f"gpus {sorted(case.gpus)}")
                case.stage, case.since_s = "resetting", now_s
        elif case.stage in ("resetting", "rebooting"):
            wait = 600.0 if case.stage == "rebooting" else 120.0
            settled = now_s - case.since_s >= wait and self._node_ready(case.node)
            if settled and self._apply(ops.RunBurnIn(case.node), now_s):
                self._record(case.node, "burn_in", case.reason, now_s, "diag -r 3 + all-reduce")
                case.stage, case.since_s = "burn_in", now_s
        elif case.stage == "burn_in":
            result = self.fleet.burn_in_result(case.node) if not self.policy.dry_run else None
            if self.policy.dry_run and now_s - case.since_s >= 1200.0:
                result = (now_s, True, "dry-run")
            if result is None or result[0] < case.since_s:
                return
            _, passed, detail = result
            if passed:
                self._apply(ops.Untaint(case.node, QUARANTINE_KEY, "NoSchedule"), now_s)
                self._apply(ops.Label(case.node, REASON_LABEL, None), now_s)
                self._apply(ops.Label(case.node, TICKET_LABEL, None), now_s)
                self._apply(ops.Uncordon(case.node), now_s)
                self._record(case.node, "return", case.reason, now_s, detail)
                self._unavailable.get(case.cell, set()).discard(case.node)
                del self._cases[case.node]
            else:
                case.stage = "awaiting_human"
                self._record(case.node, "ticket", case.reason, now_s, f"burn-in failed: {detail}")

    def _eject(self, ev: HealthEvent, now_s: float) -> None:
        pods = self.fleet.pods_on(ev.node, ev.gpu)
        for pod in pods:
            self._apply(ops.EjectReplica(pod), now_s)
            self._record(ev.node, "eject", ev.reason, now_s, f"{pod}: TPOT straggler")
        self._record(ev.node, "ticket", ev.reason, now_s, self._new_ticket())

    def _node_ready(self, node: str) -> bool:
        if self.policy.dry_run:
            return True
        return self.fleet.node(node).ready

    # -- acting ---------------------------------------------------------------------------------
    def _apply(self, op: ops.Operation, now_s: float) -> bool:
        if self.policy.dry_run:
            return True
        try:
            self.fleet.apply(op)
        except FiredrillError as exc:
            node = getattr(op, "node", "")
            self._record(node, "retry", type(op).__name__, now_s, str(exc))
            return False
        return True

    def _record(self, node: str, action: str, reason: str, now_s: float, detail: str = "") -> None:
        self.state.actions.append(
            ActionRecord(
                node=node,
                cell=self.node_cell.get(node, ""),
                action=action,
                reason=reason,
                at_s=now_s,
                dry_run=self.policy.dry_run,
                detail=detail,
            )
        )

    def _new_ticket(self) -> str:
        self._tickets += 1
        return f"TKT-{self._tickets:05d}"

    def adopt(self, quarantined: Sequence[str], now_s: float) -> None:
        """Nodes found already quarantined when this controller starts (a new leader after a
        failover, or a restart): they count against the cell's floor and, conservatively, as
        quarantines of this hour and of the flapping window. Their remediation was another
        controller's and is left to a human: nothing here resumes it."""
        for node in quarantined:
            cell = self.node_cell.get(node)
            if cell is None:
                continue
            self._unavailable.setdefault(cell, set()).add(node)
            self._quarantines.setdefault(cell, deque()).append(now_s)
            self._node_history.setdefault(node, deque()).append(now_s)

    # -- reading back ---------------------------------------------------------------------------
    def resume_cell(self, cell: str) -> None:
        """A human resumes automation in a cell a budget paused."""
        self._paused.pop(cell, None)

    @property
    def paused_cells(self) -> dict[str, str]:
        return dict(self._paused)

    def quarantined(self) -> Sequence[str]:
        return sorted(n for s in self._unavailable.values() for n in s)
