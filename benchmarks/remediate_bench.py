"""A storm of 10,000 XID events through the remediation controller (target: < 1 s wall).

The controller runs against the 10,000-node fleet's topology (124 cells) through a recording
Fleet, so the number measures the controller's own decisions: dedup, holding, budgets, the
quarantine/drain operations. Events are spread over every cell and land within one minute;
the script prints the wall time and checks that the budgets stayed exact.

    python benchmarks/remediate_bench.py [--events 10000] [--fleet examples/fleet-10k.yaml]
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from collections.abc import Sequence

from firedrill.model import operations as ops
from firedrill.model.changes import ChangeEvent
from firedrill.model.state import CellView, NodeView
from firedrill.remediate.controller import HealthEvent, RemediationController
from firedrill.remediate.policy import PolicySpec
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin


class RecordingFleet:
    """The twin's topology, with operations recorded instead of simulated."""

    def __init__(self, views: Sequence[NodeView]) -> None:
        self.views = list(views)
        self.by_name = {v.name: v for v in views}
        self.applied: list[ops.Operation] = []

    def apply(self, op: ops.Operation) -> ops.Operation:
        self.applied.append(op)
        return ops.Noop()

    def node(self, name: str) -> NodeView:
        return self.by_name[name]

    def node_views(self, *, cell: str | None = None) -> Sequence[NodeView]:
        return [v for v in self.views if cell is None or v.cell == cell]

    def cells(self) -> Sequence[CellView]:
        return []

    def changes(self, *, since_s: float, cell: str | None = None) -> Sequence[ChangeEvent]:
        return []

    def pods_on(self, node: str, gpu: int | None = None) -> Sequence[str]:
        return []

    def burn_in_result(self, node: str) -> tuple[float, bool, str] | None:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--fleet", default="examples/fleet-10k.yaml")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    twin = Twin(load_fleet(args.fleet), 0, record=False)
    fleet = RecordingFleet(twin.node_views())
    policy = PolicySpec()
    rng = random.Random(args.seed)
    xids = [79, 48, 64, 95, 119, 74, 13, 31, 63, 92]
    events = sorted(
        (
            HealthEvent(float(rng.randrange(0, 60)), rng.choice(fleet.views).name, rng.randrange(8),
                        "xid", rng.choice(xids))
            for _ in range(args.events)
        ),
        key=lambda e: (e.at_s, e.node, e.gpu),
    )  # fmt: skip
    controller = RemediationController(policy, fleet)
    t0 = time.perf_counter()
    i = 0
    for now in range(0, 90, 15):
        while i < len(events) and events[i].at_s <= now:
            controller.handle(events[i])
            i += 1
        controller.tick(float(now))
    wall = time.perf_counter() - t0
    per_cell = Counter(a.cell for a in controller.state.actions if a.action == "quarantine")
    budget = policy.budgets.max_quarantines_per_cell_hour
    blocked = Counter(b.budget for b in controller.state.blocked)
    print(
        f"{args.events:,} XID events over {len(per_cell)} cells in {wall:.3f} s wall (target < 1 s)"
    )
    print(f"  operations applied: {len(fleet.applied):,}")
    print(
        f"  quarantines: {sum(per_cell.values()):,}; max per cell {max(per_cell.values())} "
        f"(budget {budget}/cell/h); cells paused: {len(controller.paused_cells)}"
    )
    print(f"  blocked by budget: {dict(sorted(blocked.items()))}")
    assert max(per_cell.values()) <= budget, "budget exceeded"


if __name__ == "__main__":
    main()
