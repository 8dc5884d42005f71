"""The remediation controller: policy mapping, the lifecycle, and budgets that always hold."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from firedrill.model import operations as ops
from firedrill.model.changes import ChangeEvent
from firedrill.model.state import CellView, NodeView
from firedrill.remediate.controller import HealthEvent, RemediationController
from firedrill.remediate.policy import Budgets, PolicySpec, Timings


@dataclass
class FakeFleet:
    """The Fleet port over nodes in cells (node count per cell), journaling applied operations."""

    sizes: dict[str, int]
    applied: list[ops.Operation] = field(default_factory=list)
    ready: dict[str, bool] = field(default_factory=dict)

    def names(self, cell: str) -> list[str]:
        return [f"{cell}-n{i:03d}" for i in range(self.sizes[cell])]

    def apply(self, op: ops.Operation) -> ops.Operation:
        self.applied.append(op)
        return ops.Noop()

    def inverse_of(self, op: ops.Operation) -> ops.Operation:
        return ops.Noop()

    def node(self, name: str) -> NodeView:
        cell = name.rsplit("-n", 1)[0]
        return NodeView(
            name, "r", cell, "p", "serving", 8, self.ready.get(name, True), False, (), (), ()
        )

    def node_views(self, *, cell: str | None = None) -> Sequence[NodeView]:
        cells = [cell] if cell is not None else list(self.sizes)
        return [self.node(n) for c in cells for n in self.names(c)]

    def cells(self) -> Sequence[CellView]:
        return []

    def changes(self, *, since_s: float, cell: str | None = None) -> Sequence[ChangeEvent]:
        return []

    def pods_on(self, node: str, gpu: int | None = None) -> Sequence[str]:
        return ["r000001"]

    def burn_in_result(self, node: str) -> tuple[float, bool, str] | None:
        return (1e12, True, "passed")


def _quarantined(fleet: FakeFleet) -> list[str]:
    return [
        op.node
        for op in fleet.applied
        if isinstance(op, ops.Taint) and op.key == "gpu.corp/quarantine"
    ]


def test_xid13_never_drains_and_xid79_reboots() -> None:
    fleet = FakeFleet({"a": 50})
    c = RemediationController(PolicySpec(), fleet)
    c.handle(HealthEvent(0.0, "a-n001", 0, "xid", 13))
    c.handle(HealthEvent(0.0, "a-n002", 1, "xid", 79))
    for t in range(15, 1800, 15):
        c.tick(float(t))
    assert _quarantined(fleet) == ["a-n002"]
    assert not any(isinstance(op, ops.Drain) and op.node == "a-n001" for op in fleet.applied)
    kinds = [type(op).__name__ for op in fleet.applied if getattr(op, "node", "") == "a-n002"]
    assert kinds.index("Taint") < kinds.index("Drain") < kinds.index("RebootNode")
    assert kinds.index("RebootNode") < kinds.index("RunBurnIn") < kinds.index("Untaint")
    assert "Uncordon" in kinds


def test_conditions_hold_before_acting() -> None:
    fleet = FakeFleet({"a": 50})
    policy = PolicySpec(timings=Timings(hold_observations=4))
    c = RemediationController(policy, fleet)
    c.handle(HealthEvent(0.0, "a-n001", 0, "xid", 48))
    for t in (15.0, 30.0):
        c.tick(t)
    assert not _quarantined(fleet)
    c.tick(45.0)
    assert _quarantined(fleet) == ["a-n001"]


def test_rate_budget_stops_the_cell_and_pages_once() -> None:
    fleet = FakeFleet({"a": 1000, "b": 1000})
    policy = PolicySpec(timings=Timings(hold_observations=1))
    c = RemediationController(policy, fleet)
    for i in range(40):
        c.handle(HealthEvent(0.0, f"a-n{i:03d}", 0, "xid", 79))
    c.handle(HealthEvent(0.0, "b-n001", 0, "xid", 79))
    c.tick(0.0)
    quarantined = _quarantined(fleet)
    assert len([n for n in quarantined if n.startswith("a-")]) == 20  # exact, not 19 or 21
    assert "b-n001" in quarantined  # other cells are untouched by a's budget
    assert [p.cell for p in c.state.pages] == ["a"]
    assert {b.budget for b in c.state.blocked} == {"rate", "cell_paused"}
    assert len(c.state.blocked) == 20  # everything it did not do is recorded


def test_min_healthy_floor_binds_on_small_cells() -> None:
    fleet = FakeFleet({"small": 30})
    c = RemediationController(PolicySpec(timings=Timings(hold_observations=1)), fleet)
    for i in range(10):
        c.handle(HealthEvent(0.0, f"small-n{i:03d}", 0, "xid", 79))
    c.tick(0.0)
    assert len(_quarantined(fleet)) == 3  # 27/30 = 90% healthy is the floor
    assert c.state.blocked[0].budget in ("min_healthy", "quarantined_fraction")


def test_flapping_node_is_held_and_ticketed() -> None:
    fleet = FakeFleet({"a": 100})
    c = RemediationController(PolicySpec(timings=Timings(hold_observations=1)), fleet)
    c.handle(HealthEvent(0.0, "a-n001", 0, "xid", 48))
    for t in range(0, 2400, 15):
        c.tick(float(t))  # reset, burn-in, returned
    assert "a-n001" not in c.quarantined()
    c.handle(HealthEvent(2400.0, "a-n001", 0, "xid", 48))
    c.tick(2400.0)
    assert _quarantined(fleet).count("a-n001") == 1
    assert c.state.blocked[-1].budget == "flapping"
    assert any(a.action == "ticket" and "flapping" in a.detail for a in c.state.actions)


def test_dry_run_records_and_changes_nothing() -> None:
    fleet = FakeFleet({"a": 100})
    c = RemediationController(PolicySpec(dry_run=True, timings=Timings(hold_observations=1)), fleet)
    c.handle(HealthEvent(0.0, "a-n001", 0, "xid", 79))
    for t in range(0, 3000, 15):
        c.tick(float(t))
    assert fleet.applied == []
    assert [a.action for a in c.state.actions][:3] == ["quarantine", "drain", "reboot"]
    assert all(a.dry_run for a in c.state.actions)


events = st.lists(
    st.tuples(
        st.integers(0, 7200),  # seconds
        st.sampled_from(["a", "b"]),
        st.integers(0, 39),  # node
        st.sampled_from([79, 48, 13, 74, 63]),
    ),
    max_size=120,
)


@settings(max_examples=60, deadline=None)
@given(events, st.integers(1, 30), st.sampled_from([0.8, 0.9, 0.95]))
def test_budgets_are_never_exceeded(
    evs: list[tuple[int, str, int, int]], per_hour: int, floor: float
) -> None:
    fleet = FakeFleet({"a": 40, "b": 40})
    policy = PolicySpec(
        budgets=Budgets(
            min_healthy=floor, max_quarantines_per_cell_hour=per_hour, quarantined_fraction=1.0
        ),
        timings=Timings(hold_observations=1),
    )
    c = RemediationController(policy, fleet)
    by_time: dict[int, list[tuple[str, int, int]]] = {}
    for t, cell, n, xid in evs:
        by_time.setdefault(t - t % 15, []).append((cell, n, xid))
    for t in range(0, 7215, 15):
        for cell, n, xid in by_time.get(t, []):
            c.handle(HealthEvent(float(t), f"{cell}-n{n:03d}", 0, "xid", xid))
        c.tick(float(t))
        for cell in ("a", "b"):
            down = [x for x in c.quarantined() if x.startswith(cell + "-")]
            assert (40 - len(down)) / 40 >= floor - 1e-9  # the floor holds at every tick
    times: dict[str, list[float]] = {"a": [], "b": []}
    for rec in c.state.actions:
        if rec.action == "quarantine":
            times[rec.cell].append(rec.at_s)
    for ts in times.values():
        for t0 in ts:  # no sliding hour holds more than the budget
            assert sum(1 for t in ts if t0 <= t < t0 + 3600) <= per_hour
    nodes: dict[str, list[float]] = {}
    for rec in c.state.actions:
        if rec.action == "quarantine":
            nodes.setdefault(rec.node, []).append(rec.at_s)
    for ts in nodes.values():  # never remediated twice within the flapping window
        assert all(b - a >= 5400 for a, b in itertools.pairwise(ts))
    assert not any(
        isinstance(op, ops.Drain) and op.node in {f"{x}" for x in _app_only(evs)}
        for op in fleet.applied
    )


def _app_only(evs: list[tuple[int, str, int, int]]) -> set[str]:
    """Nodes that only ever reported application-level XIDs."""
    seen: dict[str, set[int]] = {}
    for _, cell, n, xid in evs:
        seen.setdefault(f"{cell}-n{n:03d}", set()).add(xid)
    return {node for node, xids in seen.items() if xids <= {13, 63}}
