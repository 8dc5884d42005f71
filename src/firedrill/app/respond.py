"""``respond`` as a use case: a scenario on the twin with detection and remediation, its
expectations checked, and its incidents kept in the store when one is named.

The store is opened (and migrated) before the run, so a bad store is refused with nothing run;
a store that fails while keeping the incidents does not lose the run: the outcome carries the
error next to the report, and the caller writes the report before saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from firedrill.errors import StoreError
from firedrill.scenario.result import RespondReport

if TYPE_CHECKING:
    from firedrill.detect.slo import SloSpec
    from firedrill.model.spec import FleetSpec
    from firedrill.remediate.policy import PolicySpec
    from firedrill.respond.responder import Mode
    from firedrill.scenario.spec import ScenarioSpec
    from firedrill.store import Store
    from firedrill.store.ingest import Persisted

__all__ = [
    "LoadedScenario",
    "RespondOutcome",
    "db_url",
    "keep_incidents",
    "load_scenario",
    "open_for_writing",
    "respond",
]


@dataclass(frozen=True)
class LoadedScenario:
    """A validated scenario with the specs it names and its file's digest."""

    spec: ScenarioSpec
    fleet: FleetSpec
    slo: SloSpec
    policy: PolicySpec
    spec_sha256: str


@dataclass(frozen=True)
class RespondOutcome:
    """One scenario run: its report (the JSON contract) and what the store kept of it."""

    report: RespondReport
    kept: Persisted | None = None  # the incidents kept, when a store was named
    store_name: str | None = None
    store_error: StoreError | None = None  # the store refused to keep them (the run stands)

    @property
    def passed(self) -> bool:
        return self.report.passed


def load_scenario(path: Path) -> LoadedScenario:
    """Load and validate a scenario file (``SpecError`` names file, line and field)."""
    from firedrill.specfile import load_scenario as load
    from firedrill.specfile import spec_sha256

    spec, fleet, slo, policy = load(path)
    return LoadedScenario(spec, fleet, slo, policy, spec_sha256(path))


def db_url(value: str) -> str:
    """A ``--db`` value as a store URL: a value with no scheme is a SQLite file path."""
    return value if "://" in value else f"sqlite:///{value}"


def open_for_writing(db: str) -> Store:
    """Open and migrate the store a run's incidents go to (before the run: a bad store is
    refused with nothing run)."""
    from firedrill.store import open_store

    store = open_store(db_url(db))
    try:
        store.migrate()
    except StoreError:
        store.close()
        raise
    return store


def keep_incidents(
    store: Store, report: RespondReport, *, actor: str, run_at_s: float = 0.0
) -> Persisted:
    """Keep a respond report's incidents in the store (a run already there is not written again);
    ``run_at_s`` is when the run's clock starts, in seconds since its day's midnight UTC."""
    from firedrill.store.ingest import persist_report

    with store.session() as session:
        return persist_report(session, report.to_json(), actor=actor, run_at_s=run_at_s)


def respond(
    *,
    loaded: LoadedScenario,
    actor: str,
    mode: Mode | None = None,
    db: str | None = None,
    progress: Callable[[float], None] | None = None,
) -> RespondOutcome:
    """Run the scenario, check its expectations, keep its incidents in ``db`` (if given).

    Raises ``StoreError`` before running anything when ``db`` cannot be opened for writing.
    """
    from firedrill.adapters.worlds import EMBEDDED_SCENARIO
    from firedrill.scenario.expect import evaluate
    from firedrill.scenario.report import respond_report
    from firedrill.scenario.run import run_scenario

    store = None if db is None else open_for_writing(db)
    try:
        run = run_scenario(
            loaded.spec,
            loaded.fleet,
            loaded.slo,
            loaded.policy,
            make_world=EMBEDDED_SCENARIO,
            progress=progress,
            mode=mode,
        )
        checks = evaluate(run, list(loaded.spec.expect))
        report = respond_report(run, checks, spec_sha256=loaded.spec_sha256)
        if store is None:
            return RespondOutcome(report)
        # on the run's UTC clock: its fleet's day starts at start_hour_utc
        run_at_s = loaded.fleet.start_hour_utc * 3600.0
        try:
            with store:
                kept = keep_incidents(store, report, actor=actor, run_at_s=run_at_s)
        except StoreError as exc:
            return RespondOutcome(report, store_name=store.name, store_error=exc)
        return RespondOutcome(report, kept=kept, store_name=store.name)
    finally:
        if store is not None:
            store.close()
