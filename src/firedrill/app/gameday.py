"""``gameday run`` as a use case: recover leftovers, check the ladder, choose the world, journal,
run, and keep the result.

The order is the safety argument: a drill never starts on top of what an interrupted one left
injected (``recover_leftovers``), never injects past a closed ladder gate (``check_ladder``), and
journals every operation's inverse before applying it (the ``Journal`` it opens), so whatever
happens next, ``gameday recover`` can put the fleet back.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from firedrill.drill.result import DrillReport
from firedrill.errors import FiredrillError

if TYPE_CHECKING:
    from firedrill.adapters.live_world import LiveTiming
    from firedrill.drill.recover import RecoveryReport
    from firedrill.drill.spec import DrillSpec, LoadedDrill
    from firedrill.model.journal import JournalHeader
    from firedrill.ports import DrillWorld
    from firedrill.store.ladder import LadderCheck

__all__ = [
    "DEFAULT_TOKEN_FILE",
    "GamedayListener",
    "GamedayOutcome",
    "Refused",
    "check_ladder",
    "persist_drill",
    "recover_leftovers",
    "run_gameday",
]

DEFAULT_TOKEN_FILE = Path(".firedrill/twin-token")
EMBEDDED = "embedded"  # the journal's target for a drill on an embedded twin
KUBERNETES = "kubernetes:"  # the journal's target prefix for a drill conducted on a cluster


class Refused(FiredrillError):
    """The drill did not start and nothing was injected (leftovers, ladder gate, steady state)."""


class GamedayListener(Protocol):
    """What a person should hear while a game day runs (the CLI prints it)."""

    def recovered(self, report: RecoveryReport, directory: Path) -> None:
        """Leftovers of interrupted drills were looked for in ``directory`` (and reverted)."""

    def gated(self, answer: LadderCheck) -> None:
        """The ladder gate answered (rotation warnings, an override)."""

    def progress(self, sim_s: float) -> None:
        """The drill reached ``sim_s`` simulated seconds."""

    def stored(self, result_id: int, answer: LadderCheck) -> None:
        """The result was kept in the store."""

    def store_failed(self, error: FiredrillError) -> None:
        """The result could not be kept (the run itself stands)."""


@dataclass(frozen=True)
class GamedayOutcome:
    """One drill run: its report, spec and timing."""

    report: DrillReport
    spec: DrillSpec
    wall_s: float  # seconds of wall clock the run itself took
    live: LiveTiming | None = None  # how a live run's time was mapped (None: not live)

    @property
    def verdict(self) -> str:
        return self.report.verdict

    @property
    def sim_s(self) -> float:
        """The simulated seconds the drill was capped at."""
        return self.spec.duration_cap_s or 0.0


def recover_leftovers(
    *,
    journal_dir: Path | None = None,
    target: str | None = None,
    token_file: Path = DEFAULT_TOKEN_FILE,
    must_match: bool = False,
) -> tuple[RecoveryReport, Path]:
    """Revert what every unfinished journal in ``journal_dir`` left injected; the report and the
    directory looked in.

    The control token goes only to ``target`` (the user's), never to a URL a journal names: a
    journal of a remote twin without a named target stays unfinished, with a note saying which
    ``--target`` recovers it. With ``must_match`` (before a run) only journals naming that same
    twin are recovered (``firedrill.drill.recover.target_for``).
    """
    from firedrill.adapters.journal_file import JournalFiles, default_directory
    from firedrill.adapters.remote_twin import RemoteTwin, load_token
    from firedrill.drill.recover import RevertWorld, recover, target_for

    directory = journal_dir or default_directory()
    tokens: dict[str, str] = {}

    def world_for(header: JournalHeader) -> RevertWorld:
        if header.target.startswith(KUBERNETES) and not (must_match and target != header.target):
            # a drill conducted on a cluster: reverted through the kubeconfig's own cluster, so
            # no credential goes to an address the journal names
            from firedrill.adapters.kubernetes.conductor import world_for_target

            return world_for_target(header.target)
        url = target_for(header, target, must_match=must_match)
        if "token" not in tokens:
            tokens["token"] = load_token(token_file)
        return RemoteTwin(url, tokens["token"])

    return recover(JournalFiles(directory), world_for), directory


def check_ladder(
    *,
    db: str,
    model: str,
    rung: str | int,
    run_by: str,
    runbook_author: str | None = None,
    override_reason: str | None = None,
    require_closed_findings: bool = False,
) -> LadderCheck:
    """May this rung run for this model now? A store that does not exist yet is created (and
    holds no results: only L0 may run then, or an override)."""
    from firedrill.store import ladder as stored
    from firedrill.store import open_store

    with open_store(db) as store:
        store.migrate()
        with store.session() as session:
            return stored.check(
                session=session,
                model=model,
                rung=rung,
                run_by=run_by,
                runbook_author=runbook_author,
                override_reason=override_reason,
                require_closed_findings=require_closed_findings,
            )


def persist_drill(
    *,
    db: str,
    report: DrillReport,
    model: str,
    rung: str | int,
    run_by: str,
    started_at: datetime,
    at_s: float,
    runbook_author: str | None = None,
    override_reason: str | None = None,
    require_closed_findings: bool = False,
) -> tuple[int, LadderCheck]:
    """Keep a run's result (who ran it, any override, in the audit log too) and track its
    findings as action items; its id and the gate's answer."""
    from firedrill.store import ladder as stored
    from firedrill.store import open_store

    with open_store(db) as store:
        store.migrate()
        with store.session() as session:
            row, answer = stored.record(
                session=session,
                name=report.drill,
                model=model,
                rung=rung,
                verdict=report.verdict,
                run_by=run_by,
                at_s=at_s,
                report=report.to_json(),
                started_at=started_at,
                runbook_author=runbook_author,
                override_reason=override_reason,
                require_closed_findings=require_closed_findings,
            )
            return row.id, answer


def _world(
    target: str | None, token_file: Path, prometheus: str | None, speed: float | None
) -> tuple[DrillWorld | None, str]:
    """The world the drill runs on (``None``: a fresh embedded twin) and its name."""
    if target is None:
        if prometheus is not None:
            raise FiredrillError(
                "--prometheus needs --target: the signals come from Prometheus, the operations "
                "go to the fleet's control endpoint"
            )
        return None, EMBEDDED
    if speed is not None and prometheus is None:
        raise FiredrillError("--speed is the live fleet's speed: it goes with --prometheus")
    from firedrill.adapters.worlds import live, load_token, remote

    token = load_token(token_file)
    if prometheus is None:
        return remote(target, token), target
    return live(target, token, prometheus, speed=1.0 if speed is None else speed), target


def _check_start(world: DrillWorld, spec: DrillSpec, target: str) -> None:
    """A drill's times count from its world's start: refuse a live fleet already past the first
    injection (its steady state could not be checked before it)."""
    first = min((inj.at_s for inj in spec.injections), default=None)
    now = world.now_s()
    if first is not None and now >= first:
        raise Refused(
            f"the fleet at {target} is already at {now:.0f} s, past the drill's first injection "
            f"at {first:.0f} s: a drill counts its time from the fleet's start (serve a fresh "
            f"twin and start the drill within {first:.0f} s of it)"
        )


def run_gameday(
    *,
    loaded: LoadedDrill,
    listener: GamedayListener,
    seed: int | None = None,
    run_by: str | None = None,
    db: str | None = None,
    override_reason: str | None = None,
    target: str | None = None,
    token_file: Path = DEFAULT_TOKEN_FILE,
    journal_dir: Path | None = None,
    jitter: bool = False,
    spec_path: str | None = None,
    prometheus: str | None = None,
    speed: float | None = None,
    on_live: Callable[[LiveTiming], None] | None = None,
) -> GamedayOutcome:
    """Run one drill (L1 and up) from start to kept result.

    Raises ``Refused`` when it did not start (leftovers not reverted, ladder gate closed, steady
    state not holding: nothing injected) and ``FiredrillError`` for a bad target or a run that
    could not proceed. A result the store cannot keep is reported to the listener, not raised.

    With ``prometheus`` (and ``target``) the fleet is live: operations go to ``target``, every
    signal comes from that Prometheus, and time is the wall clock's scaled by ``speed``
    (``firedrill.adapters.live_world``); ``on_live`` hears how its time was mapped before the run.
    """
    from firedrill.adapters.journal_file import Journal, default_directory
    from firedrill.adapters.worlds import EMBEDDED as EMBEDDED_WORLD
    from firedrill.drill.run import Jitter, SteadyStateError, run_drill

    spec = loaded.spec
    if run_by is not None:
        spec = spec.model_copy(update={"run_by": run_by})
    if spec.rung == "L0":
        raise FiredrillError("an L0 drill is a tabletop: print its plan, inject nothing")
    who = spec.run_by or "unknown"
    try:
        report, directory = recover_leftovers(
            journal_dir=journal_dir, target=target, token_file=token_file, must_match=True
        )
    except FiredrillError as exc:
        raise Refused(f"cannot recover leftovers: {exc}") from exc
    listener.recovered(report, directory)
    if not report.ok:
        raise Refused("an interrupted drill's leftovers are not reverted")
    if db is not None:
        try:
            answer = check_ladder(
                db=db, model=spec.target.model, rung=spec.rung, run_by=who,
                runbook_author=spec.runbook_author, override_reason=override_reason,
                require_closed_findings=spec.require_closed_findings,
            )  # fmt: skip
        except FiredrillError as exc:
            raise Refused(f"cannot check the ladder: {exc}") from exc
        listener.gated(answer)
        if not answer.gate.allowed:
            raise Refused(f"ladder: {answer.gate.reason} (override with a recorded reason)")
    world, target_name = _world(target, token_file, prometheus, speed)
    live_world = None
    if prometheus is not None and world is not None:
        from firedrill.adapters.live_world import LiveWorld

        _check_start(world, spec, target_name)
        if isinstance(world, LiveWorld):
            live_world = world
            if on_live is not None:
                on_live(world.timing())
    started = datetime.now(UTC)
    run_seed = spec.seed if seed is None else seed
    journal = Journal.create(
        journal_dir or default_directory(), drill=spec.name, spec_sha256=loaded.spec_sha256,
        seed=run_seed, run_by=who, target=target_name,
    )  # fmt: skip
    wall0 = time.perf_counter()
    try:
        result = run_drill(
            spec, loaded.fleet, loaded.slo, loaded.policy, seed=run_seed, journal=journal,
            world=world, make_world=EMBEDDED_WORLD, progress=listener.progress,
            spec_sha256=loaded.spec_sha256,
            jitter=Jitter(seed=run_seed) if jitter else None,
        )  # fmt: skip
    except SteadyStateError as exc:
        raise Refused(f"{exc} (nothing was injected)") from exc
    finally:
        journal.close()
    wall_s = time.perf_counter() - wall0
    # with the drift measured when the run settled
    live_timing = None if live_world is None else live_world.timing()
    typed = DrillReport.from_json(result.report)
    if spec_path is not None:
        typed = dataclasses.replace(typed, spec_path=spec_path)
    if db is not None:
        try:
            result_id, kept = persist_drill(
                db=db, report=typed, model=spec.target.model, rung=spec.rung, run_by=who,
                started_at=started, at_s=float(typed.end_s or 0.0),
                runbook_author=spec.runbook_author, override_reason=override_reason,
                require_closed_findings=spec.require_closed_findings,
            )  # fmt: skip
        except FiredrillError as exc:
            listener.store_failed(exc)
        else:
            listener.stored(result_id, kept)
    return GamedayOutcome(report=typed, spec=spec, wall_s=wall_s, live=live_timing)
