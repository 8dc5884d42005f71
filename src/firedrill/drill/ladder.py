"""The drill ladder: which rung a model may run next, how high it has climbed, who ran what.

Rungs (reference 001, "The drill ladder"): L0 tabletop, L1 replica kill, L2 GPU faults, L3 cell
drain, L4 hydrate storm, L5 region blackhole with replication paused, L6 capacity denial in the
survivor, L7 controlled failback. "Climb a rung only after the one below passes twice in a row":
a rung may run only when the two latest runs of the rung below, for the same model, both passed.
L0 is always allowed. The gate can be overridden, but only with a reason, which the caller
records with the result and in the audit log.

"Culture and cadence": track drill results like SLOs ("last successful L5 for llm-70b: 41 days
ago"), and rotate who runs the drill: warn when the same person runs a rung twice in a row, and
when someone runs a drill of a runbook they wrote ("the person who wrote the runbook is the worst
tester of it").

Pure functions over ``LadderRun`` values; the store adapter turns stored results into these, and
the current time is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from firedrill.model.identity import same_person

__all__ = [
    "RUNG_NAMES",
    "Gate",
    "LadderRun",
    "ModelStanding",
    "gate",
    "highest_passed",
    "last_success",
    "rotation_warnings",
    "rung_label",
    "rung_number",
    "since_text",
    "standings",
]

RUNG_NAMES: tuple[str, ...] = (
    "tabletop",
    "replica kill",
    "GPU faults",
    "cell drain",
    "hydrate storm",
    "region blackhole with replication paused",
    "capacity denial in the survivor",
    "controlled failback",
)
TOP_RUNG = len(RUNG_NAMES) - 1
PASSES_TO_CLIMB = 2


def rung_number(rung: str | int) -> int:
    """0..7 from ``"L5"`` or ``5``; ``ValueError`` naming the allowed values otherwise."""
    if isinstance(rung, int) and not isinstance(rung, bool):
        number = rung
    elif isinstance(rung, str) and len(rung) == 2 and rung[0] in "Ll" and rung[1].isdigit():
        number = int(rung[1])
    else:
        raise ValueError(f"a rung is L0..L{TOP_RUNG}, got {rung!r}")
    if not 0 <= number <= TOP_RUNG:
        raise ValueError(f"a rung is L0..L{TOP_RUNG}, got {rung!r}")
    return number


def rung_label(rung: int) -> str:
    return f"L{rung}"


@dataclass(frozen=True)
class LadderRun:
    """One drill run as the ladder sees it."""

    drill: str
    model: str
    rung: int
    verdict: str  # passed | failed | aborted
    run_by: str
    started_at: datetime  # wall clock, timezone-aware
    runbook_author: str | None = None
    override_reason: str | None = None

    @property
    def passed(self) -> bool:
        return self.verdict == "passed"


def _ordered(runs: Iterable[LadderRun], model: str, rung: int) -> list[LadderRun]:
    """Runs of one rung for one model, oldest first (stable for equal times)."""
    return sorted(
        (r for r in runs if r.model == model and r.rung == rung), key=lambda r: r.started_at
    )


@dataclass(frozen=True)
class Gate:
    """Whether a rung may run now, and why."""

    allowed: bool
    reason: str
    overridden: bool = False  # allowed only because an override reason was given


def gate(
    runs: Iterable[LadderRun],
    *,
    model: str,
    rung: int,
    override_reason: str | None = None,
    open_below: Sequence[str] = (),
    require_closed: bool = False,
) -> Gate:
    """May ``rung`` run for ``model``? The rung below must have passed twice in a row, and, when
    ``require_closed``, the action items its runs raised (``open_below``: the open ones' ids)
    must be closed."""
    rung = rung_number(rung)
    if rung == 0:
        return Gate(True, "L0 (tabletop) is always allowed")
    below = _ordered(runs, model, rung - 1)
    latest = below[-PASSES_TO_CLIMB:]
    climbed = len(latest) == PASSES_TO_CLIMB and all(r.passed for r in latest)
    items_ok = not require_closed or not open_below
    if climbed and items_ok:
        closed = " and its action items are closed" if require_closed else ""
        return Gate(True, f"L{rung - 1} passed twice in a row for {model}{closed}")
    problems = []
    if not climbed:
        shown = ", ".join(r.verdict for r in reversed(latest)) or "no runs"
        problems.append(
            f"L{rung} for {model} needs L{rung - 1} passed twice in a row "
            f"(latest L{rung - 1} runs, newest first: {shown})"
        )
    if not items_ok:
        listed = ", ".join(sorted(open_below)[:5]) + (" …" if len(open_below) > 5 else "")
        problems.append(
            f"L{rung} for {model} needs the action items raised at L{rung - 1} closed "
            f"({len(open_below)} open: {listed})"
        )
    refusal = "; ".join(problems)
    reason = (override_reason or "").strip()
    if reason:
        return Gate(True, f"{refusal}; overridden: {reason}", overridden=True)
    return Gate(False, refusal)


def highest_passed(runs: Iterable[LadderRun], model: str) -> int | None:
    """The highest rung with a passed run for ``model`` (``None``: none passed)."""
    passed = [r.rung for r in runs if r.model == model and r.passed]
    return max(passed) if passed else None


def last_success(runs: Iterable[LadderRun], model: str, rung: int) -> LadderRun | None:
    ok = [r for r in _ordered(runs, model, rung) if r.passed]
    return ok[-1] if ok else None


def since_text(model: str, rung: int, last: LadderRun | None, now: datetime) -> str:
    """``last successful L5 for llm-70b: 41 days ago`` (or ``never``)."""
    head = f"last successful L{rung} for {model}"
    if last is None:
        return f"{head}: never"
    days = max(0, math.floor((now - last.started_at).total_seconds() / 86400.0))
    unit = "day" if days == 1 else "days"
    return f"{head}: {days} {unit} ago"


def rotation_warnings(
    runs: Iterable[LadderRun],
    *,
    model: str,
    rung: int,
    run_by: str,
    runbook_author: str | None = None,
) -> list[str]:
    """Warnings for a run about to happen (or just recorded, when it is the last of ``runs``)."""
    warnings = []
    previous = _ordered(runs, model, rung)
    if previous and same_person(previous[-1].run_by, run_by):
        warnings.append(
            f"{run_by} ran L{rung} for {model} last time too: rotate who runs the drill"
        )
    if runbook_author is not None and same_person(runbook_author, run_by):
        warnings.append(
            f"{run_by} wrote the runbook of this drill and is running it: the person who wrote "
            "the runbook is the worst tester of it; rotate who runs the drill"
        )
    return warnings


@dataclass(frozen=True)
class ModelStanding:
    """One row of ``firedrill gameday ladder``."""

    model: str
    highest_passed: int | None
    highest_allowed: int  # the highest rung the gate lets run now (L0 at least)
    last_l5: str  # "last successful L5 for <model>: N days ago"
    runs: int
    warnings: tuple[str, ...]


def _history_warnings(runs: Sequence[LadderRun], model: str) -> list[str]:
    """Rotation problems in the recorded history of ``model`` (latest runs per rung)."""
    out = []
    for rung in range(TOP_RUNG + 1):
        ordered = _ordered(runs, model, rung)
        if len(ordered) >= 2 and same_person(ordered[-1].run_by, ordered[-2].run_by):
            out.append(
                f"L{rung}: {ordered[-1].run_by} ran the last two runs; rotate who runs the drill"
            )
        if (
            ordered
            and ordered[-1].runbook_author is not None
            and same_person(ordered[-1].runbook_author, ordered[-1].run_by)
        ):
            out.append(
                f"L{rung}: {ordered[-1].run_by} ran a drill of a runbook they wrote "
                f"({ordered[-1].drill})"
            )
    return out


def standings(runs: Iterable[LadderRun], now: datetime) -> list[ModelStanding]:
    """Per model (sorted by name): highest rung passed and allowed, L5 recency, warnings."""
    history = list(runs)
    out = []
    for model in sorted({r.model for r in history}):
        top = highest_passed(history, model)
        allowed = max(r for r in range(TOP_RUNG + 1) if gate(history, model=model, rung=r).allowed)
        out.append(
            ModelStanding(
                model=model,
                highest_passed=top,
                highest_allowed=allowed,
                last_l5=since_text(model, 5, last_success(history, model, 5), now),
                runs=sum(1 for r in history if r.model == model),
                warnings=tuple(_history_warnings(history, model)),
            )
        )
    return out
