"""``respond`` as a use case: a scenario on the twin with detection and remediation, its
expectations checked, and its incidents kept in the store when one is named.

The store is opened (and migrated) before the run, so a bad store is refused with nothing run;
a store that fails while keeping the incidents does not lose the run: the outcome carries the
error next to the report, and the caller writes the report before saying so.

With a ``target`` the scenario runs against a twin served by ``firedrill twin serve`` (its control
API, ``RemoteTwin``) instead of a fresh embedded one. Its times count from the fleet's start, and
its expectations name the fleet's cells, models and tenants, so a served twin is refused (nothing
applied) when it serves another fleet or is already past the scenario's first event. With a
``prometheus`` URL too the fleet is live (``adapters/live_world.py``): the timeline and the levers
go to the target's control API, every signal the detectors and the responder read comes from that
Prometheus, and the scenario's time is the wall clock's scaled by the fleet's ``speed``, counted
from the moment the run starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from firedrill.errors import FiredrillError, StoreError
from firedrill.scenario.result import RespondReport

if TYPE_CHECKING:
    from firedrill.adapters.live_world import LiveTiming
    from firedrill.detect.slo import SloSpec
    from firedrill.model.spec import FleetSpec
    from firedrill.ports import ScenarioWorld, ScenarioWorldFactory
    from firedrill.remediate.policy import PolicySpec
    from firedrill.respond.responder import Mode
    from firedrill.scenario.spec import ScenarioSpec
    from firedrill.store import Store
    from firedrill.store.ingest import Persisted

__all__ = [
    "DEFAULT_TOKEN_FILE",
    "LoadedScenario",
    "RespondOutcome",
    "db_url",
    "keep_incidents",
    "load_scenario",
    "open_for_writing",
    "respond",
]


DEFAULT_TOKEN_FILE = Path(".firedrill/twin-token")


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
    live: LiveTiming | None = None  # how a live run's time was mapped (None: not live)

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


def _differing(a: object, b: object, where: str = "") -> list[str]:
    """The fields (dotted paths) where two JSON-like values differ, at most a few."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(a.keys() | b.keys()):
            out += _differing(a.get(key), b.get(key), f"{where}.{key}" if where else str(key))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _differing(x, y, f"{where}[{i}]")
        ]
    return [] if a == b else [where or "(the whole spec)"]


def check_served(
    world: ScenarioWorld, loaded: LoadedScenario, target: str, *, live: bool = False
) -> None:
    """Refuse a served twin the scenario cannot run on: another fleet, or a twin already past
    the scenario's first event (its times count from the fleet's start; a live run's count
    from its own start). ``FiredrillError``."""
    served = world.fleet_spec().model_dump(mode="json")
    wanted = loaded.fleet.model_dump(mode="json")
    if served != wanted:
        fields = _differing(served, wanted)
        shown = ", ".join(fields[:5]) + (f" and {len(fields) - 5} more" if len(fields) > 5 else "")
        raise FiredrillError(
            f"the twin at {target} serves fleet {served.get('name')!r}, not the scenario's "
            f"{wanted.get('name')!r} as specified (differs in {shown}): serve the scenario's "
            f"fleet (with its fleet_overrides) at its seed {loaded.spec.seed}"
        )
    if live:
        return
    first = min((e.at_s for e in loaded.spec.timeline if e.at_s > 0), default=None)
    now = world.now_s()
    if first is not None and now >= first:
        raise FiredrillError(
            f"the twin at {target} is already at {now:.0f} s, past the scenario's first event "
            f"at {first:.0f} s: a scenario counts its time from the fleet's start (serve a fresh "
            f"twin)"
        )


def served_world(
    loaded: LoadedScenario,
    target: str,
    token_file: Path,
    *,
    prometheus: str | None = None,
    speed: float | None = None,
) -> ScenarioWorldFactory:
    """The factory a scenario gets for the twin served at ``target`` (live with ``prometheus``):
    the one world there, checked (``check_served``) before the run; ``FiredrillError`` for a bad
    target, token or Prometheus."""
    from firedrill.adapters.worlds import live, load_token, remote_scenario

    token = load_token(token_file)
    world: ScenarioWorld
    if prometheus is None:
        world = remote_scenario(target, token)
    else:
        world = live(target, token, prometheus, speed=1.0 if speed is None else speed)
    check_served(world, loaded, target, live=prometheus is not None)

    def make_world(fleet: FleetSpec, seed: int, hours: float) -> ScenarioWorld:
        return world

    return make_world


def respond(
    *,
    loaded: LoadedScenario,
    actor: str,
    mode: Mode | None = None,
    db: str | None = None,
    progress: Callable[[float], None] | None = None,
    target: str | None = None,
    token_file: Path = DEFAULT_TOKEN_FILE,
    prometheus: str | None = None,
    speed: float | None = None,
) -> RespondOutcome:
    """Run the scenario, check its expectations, keep its incidents in ``db`` (if given).

    With ``target`` it runs against the twin served there (``twin serve``), driven with the
    control token from ``$FIREDRILL_TWIN_TOKEN`` or ``token_file``; with ``prometheus`` too, on
    that live fleet running at ``speed`` (its signals from Prometheus, its time the wall's).

    Raises ``StoreError`` before running anything when ``db`` cannot be opened for writing, and
    ``FiredrillError`` (nothing applied) for a target that cannot run the scenario.
    """
    from firedrill.adapters.worlds import EMBEDDED_SCENARIO
    from firedrill.scenario.expect import evaluate
    from firedrill.scenario.report import respond_report
    from firedrill.scenario.run import run_scenario

    if target is None and prometheus is not None:
        raise FiredrillError(
            "--prometheus needs --target: the signals come from Prometheus, the operations go "
            "to the fleet's control endpoint"
        )
    if speed is not None and prometheus is None:
        raise FiredrillError("--speed is the live fleet's speed: it goes with --prometheus")
    make_world = (
        EMBEDDED_SCENARIO
        if target is None
        else served_world(loaded, target, token_file, prometheus=prometheus, speed=speed)
    )
    store = None if db is None else open_for_writing(db)
    try:
        run = run_scenario(
            loaded.spec,
            loaded.fleet,
            loaded.slo,
            loaded.policy,
            make_world=make_world,
            progress=progress,
            mode=mode,
        )
        live_timing = None
        if prometheus is not None:
            from firedrill.adapters.live_world import LiveWorld

            if isinstance(run.world, LiveWorld):  # with the drift measured when it settled
                live_timing = run.world.timing()
        checks = evaluate(run, list(loaded.spec.expect))
        report = respond_report(run, checks, spec_sha256=loaded.spec_sha256)
        if store is None:
            return RespondOutcome(report, live=live_timing)
        # on the run's UTC clock: its fleet's day starts at start_hour_utc
        run_at_s = loaded.fleet.start_hour_utc * 3600.0
        try:
            with store:
                kept = keep_incidents(store, report, actor=actor, run_at_s=run_at_s)
        except StoreError as exc:
            return RespondOutcome(report, store_name=store.name, store_error=exc, live=live_timing)
        return RespondOutcome(report, kept=kept, store_name=store.name, live=live_timing)
    finally:
        if store is not None:
            store.close()
