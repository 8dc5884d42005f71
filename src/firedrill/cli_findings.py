"""``firedrill gameday findings | land | next``: a drill's findings, closed, landed, fed forward.

- ``gameday findings`` lists the action items the stored runs raised (``close`` and ``show``);
- ``gameday land RUN --out DIR`` writes the artefacts that close a run's findings (policy change
  and the NodeHealthCheck it gives, exporter counters, alert rules checked by promtool, SLO and
  fleet changes, drill clauses, a warm-pool recommendation, a Kyverno policy, runbook entries)
  and ``SUMMARY.md``;
- ``gameday next DRILL --from RUN[,RUN…]`` prints the next version of the drill as a diff with a
  reason on every line (``--write FILE`` writes it; nothing is applied silently).

A RUN is a result JSON written by ``gameday run --json`` (or a sweep's), or the id of a result in
the store (``--db``). ``register(gameday_app)`` adds the commands.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from firedrill.errors import FiredrillError, SpecError

__all__ = ["register"]

EXIT_FAILED = 1
EXIT_INPUT = 4
DEFAULT_DB = "sqlite:///firedrill.db"

console = Console()
err = Console(stderr=True)

findings_app = typer.Typer(
    help="Action items raised by drills: list (default), show one with its history, close one.",
    invoke_without_command=True,
)

DbOption = Annotated[
    str, typer.Option("--db", help="Store URL: sqlite:///FILE or postgresql://USER@HOST/DB.")
]


def _fail(message: str, code: int = EXIT_INPUT) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


@findings_app.callback()
def findings(
    ctx: typer.Context,
    db: DbOption = DEFAULT_DB,
    model: Annotated[str | None, typer.Option(help="One model.")] = None,
    status: Annotated[
        str, typer.Option(help="open, closed or all.", case_sensitive=False)
    ] = "open",
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout.")] = False,
) -> None:
    """List action items (open ones by default), per model, rung and due date."""
    if ctx.invoked_subcommand is not None:
        return
    from firedrill.store import findings as items
    from firedrill.store import open_store

    if status not in ("open", "closed", "all"):
        raise _fail(f"--status is open, closed or all, got {status!r}")
    try:
        with open_store(db, read_only=True) as store, store.session() as session:
            rows = items.list_items(
                session=session, model=model, status=None if status == "all" else status
            )
    except FiredrillError as exc:
        raise _fail(str(exc)) from exc
    if as_json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
        return
    if not rows:
        console.print(f"no {'' if status == 'all' else status + ' '}action items", highlight=False)
        return
    # one line of facts per item and its finding under it: readable at any terminal width
    for r in rows:
        colour = "yellow" if r.status == "open" else "green"
        console.print(
            f"[bold]{r.id}[/] [{colour}]{r.status}[/] {escape(r.model)} L{r.rung} {r.kind} "
            f"owner {escape(r.owner)} due {r.due} raised {r.times_raised}×",
            highlight=False,
        )
        console.print(f"    {escape(r.text)}", highlight=False, soft_wrap=True)


@findings_app.command("show")
def show(
    item: Annotated[str, typer.Argument(help="Action item id (FND-…).")],
    db: DbOption = DEFAULT_DB,
) -> None:
    """One action item with its history (every run that raised it, every close)."""
    from firedrill.store import findings as items
    from firedrill.store import open_store

    try:
        with open_store(db, read_only=True) as store, store.session() as session:
            view = items.get(session=session, item_id=item)
            history = items.history(session=session, item_id=item) if view else []
    except FiredrillError as exc:
        raise _fail(str(exc)) from exc
    if view is None:
        raise _fail(f"no action item {item!r}")
    console.print(
        f"{view.id} [{view.status}] {escape(view.model)} L{view.rung} {view.kind}, owner "
        f"{escape(view.owner)}, due {view.due}\n  {escape(view.text)}",
        highlight=False,
    )
    for event, at, by, result_id, note in history:
        run = f" (drill result {result_id})" if result_id is not None else ""
        console.print(f"  {at} {event} by {escape(by)}{run}: {escape(note)}", highlight=False)


@findings_app.command("close")
def close(
    item: Annotated[str, typer.Argument(help="Action item id (FND-…).")],
    by: Annotated[str, typer.Option("--by", help="Who closes it.")],
    note: Annotated[str, typer.Option("--note", help="What closed it (a commit, a PR, a change).")],
    db: DbOption = DEFAULT_DB,
) -> None:
    """Close an action item (recorded in its history and in the audit log)."""
    from firedrill.store import findings as items
    from firedrill.store import open_store

    try:
        with open_store(db) as store:
            store.migrate()
            with store.session() as session:
                view = items.close(
                    session=session, item_id=item, by=by, note=note, at=datetime.now(UTC)
                )
    except FiredrillError as exc:
        raise _fail(str(exc)) from exc
    console.print(f"closed {view.id}: {escape(view.text)}", highlight=False)


# -- runs ------------------------------------------------------------------------------------------


def _read_run(run: str, db: str | None) -> dict[str, Any]:
    """A run's JSON: a result file, or the id of a stored result (with ``--db``)."""
    path = Path(run)
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _fail(f"{run}: not a drill result JSON ({exc})") from exc
        if not isinstance(data, dict) or "drill" not in data:
            raise _fail(f"{run}: not a drill result JSON (no 'drill' field)")
        return data
    if db is None or not run.lstrip("#").isdigit():
        raise _fail(f"{run}: no such result file (a stored result needs --db and its id)")
    from firedrill.store import drills, open_store

    try:
        with open_store(db, read_only=True) as store, store.session() as session:
            row = drills.get(session=session, result_id=int(run.lstrip("#")))
            report = None if row is None else dict(row.report)
    except FiredrillError as exc:
        raise _fail(str(exc)) from exc
    if report is None:
        raise _fail(f"no drill result {run} in {db}")
    return report


def _drill_for(report: dict[str, Any], drill: Path | None) -> Any:
    from firedrill.specfile import load_drill

    path = drill or (Path(str(report["spec_path"])) if report.get("spec_path") else None)
    if path is None:
        raise _fail("the result does not name its drill spec: pass --drill PATH")
    try:
        return load_drill(path)
    except SpecError as exc:
        raise _fail(str(exc)) from exc


def land(
    run: Annotated[str, typer.Argument(help="Result JSON, or a stored result id with --db.")],
    out: Annotated[Path, typer.Option("--out", help="Directory for the artefacts.")],
    drill: Annotated[
        Path | None, typer.Option(help="The drill spec (default: the one the result names).")
    ] = None,
    db: Annotated[str | None, typer.Option("--db", help="Store URL for a stored result.")] = None,
) -> None:
    """Write the artefacts that close a run's findings, and SUMMARY.md of what each fixes."""
    import yaml

    from firedrill.drill.landing import land as land_findings
    from firedrill.export.nhc import NOT_EXPRESSIBLE, node_health_check

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise _fail(f"{out} exists and is not an empty directory")
    report = _read_run(run, db)
    loaded = _drill_for(report, drill)
    landing = land_findings(
        report, drill=loaded.spec, policy=loaded.policy, fleet=loaded.fleet, slo=loaded.slo
    )
    files = {a.path: a.content for a in landing.artefacts}
    if landing.policy is not None:
        header = "# Enforced by firedrill, not expressible in NodeHealthCheck:\n" + "".join(
            f"#   - {x}\n" for x in NOT_EXPRESSIBLE
        )
        nhc = node_health_check(landing.policy, name=f"gpu-nodes-{loaded.spec.target.model}")
        files["nhc/nodehealthcheck.yaml"] = header + yaml.safe_dump(nhc, sort_keys=False)
    files["SUMMARY.md"] = landing.summary_markdown() + (
        "- `nhc/nodehealthcheck.yaml` (nhc): the NodeHealthCheck the fixed policy gives\n"
        if landing.policy is not None
        else ""
    )
    try:
        out.mkdir(parents=True, exist_ok=True)
        for rel, content in sorted(files.items()):
            target = out / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("x") as fh:  # never overwrite
                fh.write(content)
    except OSError as exc:
        raise _fail(f"cannot write {out}: {exc}") from exc
    for rel in sorted(files):
        console.print(f"wrote {escape(str(out / rel))}", highlight=False)
    for ident, why in landing.not_landed:
        err.print(f"[yellow]not landed[/] {ident}: {escape(why)}", highlight=False)


def next_drill(
    drill: Annotated[Path, typer.Argument(help="The drill spec (YAML) to propose a successor of.")],
    runs: Annotated[
        str, typer.Option("--from", help="Result JSONs (single runs or sweeps), comma-separated.")
    ],
    margin: Annotated[
        float, typer.Option(help="Margin over the measured p95 (0.2 = 20 %).", min=0.0)
    ] = 0.2,
    db: Annotated[str | None, typer.Option("--db", help="Store URL for stored result ids.")] = None,
    write: Annotated[
        Path | None, typer.Option("--write", help="Write the proposed spec here (never in place).")
    ] = None,
) -> None:
    """Propose the next drill: a tighter RTO, new clauses, the next rung; a diff with reasons."""
    from firedrill.drill.next import propose
    from firedrill.drill.spec import DrillSpec
    from firedrill.specfile import load_drill, load_spec

    try:
        loaded = load_drill(drill)
        text = drill.read_text()
    except (SpecError, OSError) as exc:
        raise _fail(str(exc)) from exc
    reports = [_read_run(r.strip(), db) for r in runs.split(",") if r.strip()]
    if not reports:
        raise _fail("--from names no run")
    other = [r for r in reports if r.get("drill") != loaded.spec.name]
    if other:
        raise _fail(
            f"--from has results of another drill ({other[0].get('drill')!r}, not "
            f"{loaded.spec.name!r})"
        )
    try:
        proposal = propose(text, loaded.spec, reports, loaded.slo, margin=margin)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    diff = proposal.diff(str(drill))
    print(diff if diff else f"# no change proposed for {drill}", end="" if diff else "\n")
    for c in proposal.changes:
        err.print(f"[bold]{c.where}[/]: {escape(c.reason)}", highlight=False)
    if write is not None:
        if write.resolve() == drill.resolve():
            raise _fail("--write must not be the drill itself: review the diff, then apply it")
        try:
            write.write_text(proposal.new_text)
        except OSError as exc:
            raise _fail(f"cannot write {write}: {exc}") from exc
        try:  # the fleet/SLO paths are relative to the drill: check the spec itself here
            load_spec(write, DrillSpec)
        except SpecError as exc:
            raise _fail(f"the proposed spec does not load: {exc}", EXIT_FAILED) from exc
        err.print(f"wrote {escape(str(write))}", highlight=False)


def register(gameday_app: typer.Typer) -> None:
    """Add ``findings``, ``land`` and ``next`` to the ``gameday`` sub-app."""
    gameday_app.add_typer(findings_app, name="findings")
    gameday_app.command("land")(land)
    gameday_app.command("next")(next_drill)
