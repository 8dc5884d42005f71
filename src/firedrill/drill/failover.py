"""The drill's response: the same control plane as a real incident, pulled by the drill's on-call.

A drill proves the failover a team would run, so its response is not scripted by the drill: it
starts from the pages the generated rules send (detect), waits the modelled human decision and
approval time (decide), then pulls typed levers with their guards (shift), and leaves the rest to
the fleet — the survivors' autoscalers scale out into the capacity they have and hydrate.

* **Region failover** (``Failover``, when the drill names survivors): on the first page for the
  target model in the target region, after ``decide_latency``, the region's scalers are pinned
  first (``scaler_pause``: warm capacity that scales in cannot be hydrated back, and the guard
  insists on it during a hydrate), then the region's share of the global route steps down to 0
  (``route_weight`` with a region weight, fleet-wide: two distinct approvers), each step held
  while the survivors take the users. A controlled failback steps the same weight back up.
* **Cell drain** (``SteppedDrain``, the ``cell_drain`` injection): the headroom guard first, then
  100 → 50 → 0 one step per hold, watching the receiving cells' burn rate after each step and
  stepping back when one burns fast — ``pull_drain`` without blocking the drill's clock, so stop
  conditions keep being evaluated during the holds.

Every pull goes through ``levers.pull`` (approvals, guards, narrows-access check, inverses) via the
runner's ``Puller``, which journals each operation's inverse before the lever applies it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from firedrill.detect.notify import Notification
from firedrill.model.state import CellView
from firedrill.ports import Fleet
from firedrill.respond.guards import Approver, DrainPlan, GuardResult
from firedrill.respond.levers import (
    Lever,
    LeverJournalEntry,
    ModelsParams,
    RegionWeightParams,
    RouteWeightParams,
    scale_in_check,
)

# Pull a lever with the guards the caller ran; journalled by the runner.
Puller = Callable[[Lever, Sequence[GuardResult], Sequence[Approver], str], LeverJournalEntry]
BurnRates = Callable[[Sequence[str]], Mapping[str, float]]

FAILOVER_TAGS = frozenset({"hydrate"})  # the survivors hydrate: scalers are pinned first


def _pages_for(n: Notification, model: str, region: str | None, cells: Sequence[str]) -> bool:
    if n.receiver != "page":
        return False
    for alert in n.alerts:
        d = dict(alert)
        if d.get("model_name", model) != model:
            continue
        if d.get("region") == region or (cells and d.get("cell") in cells):
            return True
    return False


@dataclass
class Failover:
    """Pages → decision → scalers pinned → the region's share of the global route stepped to 0."""

    fleet: Fleet
    model: str
    region: str
    decide_latency_s: float
    approvers: tuple[Approver, ...]
    pull: Puller
    steps: tuple[int, ...] = (50, 0)
    step_hold_s: float = 30.0
    first_page_s: float | None = None
    decided_s: float | None = None
    first_lever_s: float | None = None
    last_shift_s: float | None = None
    entries: list[LeverJournalEntry] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    shift_times: list[tuple[float, int]] = field(default_factory=list)
    _next: int = 0
    _due_s: float | None = None
    _stopped: bool = False

    @property
    def reason(self) -> str:
        return f"drill failover: {self.region} unreachable for {self.model}"

    def notify(self, n: Notification) -> None:
        """Feed every notification; the first page for the model in the region starts the clock."""
        if self.first_page_s is None and _pages_for(n, self.model, self.region, ()):
            self.first_page_s = n.at_s
            self._due_s = n.at_s + self.decide_latency_s

    def next_due_s(self) -> float | None:
        return None if self._stopped else self._due_s

    @property
    def shifted(self) -> bool:
        """Every shift step was applied: the region's users are all on the survivors."""
        return self._next >= len(self.steps)

    def tick(self, now_s: float) -> list[LeverJournalEntry]:
        if self._stopped or self._due_s is None or now_s + 1e-9 < self._due_s:
            return []
        out: list[LeverJournalEntry] = []
        if self.decided_s is None:
            self.decided_s = now_s
            out += self._pin(now_s)
        pct = self.steps[self._next]
        lever = Lever("route_weight", self.model, RegionWeightParams(self.region, pct))
        applied = [e for e in self.entries + out if e.status == "applied"]
        check = scale_in_check(lever, self.fleet, incident_tags=FAILOVER_TAGS, journal=applied)
        e = self.pull(lever, (check,), self.approvers, f"{self.reason}: region weight {pct}%")
        out.append(e)
        self.entries.extend(out)
        if e.status != "applied":
            self.refusals.append(f"{e.kind} on {e.target} refused: {e.reason}")
            self._stopped = True
            return out
        if self.first_lever_s is None:
            self.first_lever_s = now_s
        self.last_shift_s = now_s
        self.shift_times.append((now_s, pct))
        self._next += 1
        if self._next >= len(self.steps):
            self._stopped = True
        else:
            self._due_s = now_s + self.step_hold_s
        return out

    def _pin(self, now_s: float) -> list[LeverJournalEntry]:
        """Scale-in paused first in the failed region: its warm capacity is the failback's."""
        out: list[LeverJournalEntry] = []
        for view in self.fleet.cells():
            if view.region != self.region or not _has_model(view, self.model):
                continue
            e = self.pull(
                Lever("scaler_pause", view.name, ModelsParams((self.model,))),
                (),
                self.approvers,
                f"{self.reason}: pin scalers before traffic moves",
            )
            out.append(e)
            if e.status == "applied" and self.first_lever_s is None:
                self.first_lever_s = now_s
            elif e.status != "applied":
                self.refusals.append(f"{e.kind} on {e.target} refused: {e.reason}")
        return out


def _has_model(view: CellView, model: str) -> bool:
    return any(rc.model == model and (rc.desired > 0 or rc.ready > 0) for rc in view.replicas)


@dataclass
class SteppedDrain:
    """A cell drain in steps (100 → 50 → 0), each held and watched, backing off on a fast burn."""

    fleet: Fleet
    cell: str
    model: str
    weight: int  # the cell's route weight before the drain
    plan: DrainPlan
    hold_s: float
    approvers: tuple[Approver, ...]
    pull: Puller
    burn_rates: BurnRates
    started_s: float
    steps_percent: tuple[int, ...] = (50, 0)
    entries: list[LeverJournalEntry] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    backed_off_s: float | None = None
    refusal: str | None = None
    done: bool = False
    _next: int = 0
    _due_s: float = 0.0

    def __post_init__(self) -> None:
        self._due_s = self.started_s
        if not self.plan.result.ok:
            self.refusal = self.plan.result.reason
            self.done = True

    def next_due_s(self) -> float | None:
        return None if self.done else self._due_s

    def _step(self, weight: int, reason: str) -> LeverJournalEntry:
        lever = Lever("route_weight", self.model, RouteWeightParams(((self.cell, weight),)))
        mine = [e for e in self.entries if e.status == "applied"]
        scale_in = scale_in_check(lever, self.fleet, incident_tags=(), journal=mine)
        return self.pull(lever, (self.plan.result, scale_in), self.approvers, reason)

    def tick(self, now_s: float) -> list[LeverJournalEntry]:
        if self.done or now_s + 1e-9 < self._due_s:
            return []
        out: list[LeverJournalEntry] = []
        if self._next > 0:  # a step was held: read the receivers before the next one
            rates = self.burn_rates(self.plan.receivers)
            hot = self.plan.burning(rates)
            if hot:
                back = (
                    self.weight * self.steps_percent[self._next - 2] // 100
                    if (self._next >= 2)
                    else self.weight
                )
                burning = ", ".join(f"{c} {rates[c]:.1f}x" for c in hot)
                out.append(
                    self._step(
                        back,
                        f"back off: receivers burning fast ({burning} >= {self.plan.fast_burn}x)",
                    )
                )
                self.backed_off_s = now_s
                self.done = True
                self.entries.extend(out)
                return out
        if self._next >= len(self.steps_percent):
            self.done = True
            return out
        pct = self.steps_percent[self._next]
        e = self._step(self.weight * pct // 100, f"cell_drain {self.cell}: weight {pct}%")
        out.append(e)
        self.entries.append(e)
        if e.status != "applied":
            self.refusal = e.reason
            self.done = True
            return out
        self.step_times.append(now_s)
        self._next += 1
        self._due_s = now_s + self.hold_s
        return out
