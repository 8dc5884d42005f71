"""``firedrill incident list|show|timeline|handoff|postmortem``: incidents in the store.

Each command opens the store named by ``--db`` (a SQLite file path, or a ``sqlite:///`` /
``postgresql://`` URL, ``sqlite:///firedrill.db`` by default; ``FIREDRILL_DB`` sets the
default), calls one use case of ``firedrill.store`` and renders what it returns. The reading
commands open the store read-only. An unknown incident id exits 4 with a message naming it, and
nothing is written. ``postmortem`` exits 1 when there is no complete postmortem to show: the
incident is not resolved yet, or its postmortem has no action item (a postmortem that changes
nothing is not finished).

``respond --db`` keeps a run's incidents through the use case (``firedrill.app.respond``) and
prints them with ``print_persisted`` from here.
"""

from __future__ import annotations

import getpass
import json
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from firedrill.app.respond import db_url
from firedrill.cli.common import DEFAULT_DB_URL, ExitCode, console, err
from firedrill.errors import StoreError

if TYPE_CHECKING:
    from firedrill.store.casefile import CaseFile
    from firedrill.store.ingest import Persisted

DB_ENV = "FIREDRILL_DB"
DB_HELP = (
    f"The store: a SQLite file path, sqlite:///FILE or postgresql://USER@HOST/DB "
    f"(default {DEFAULT_DB_URL})."
)
DAY_S = 86_400

incident_app = typer.Typer(
    help="Incidents in the store: list, show, timeline, handoff, postmortem.",
    no_args_is_help=True,
)
DbOption = Annotated[str, typer.Option("--db", envvar=DB_ENV, help=DB_HELP)]
IdArgument = Annotated[str, typer.Argument(help="Incident id, e.g. INC-0001.")]


def operator() -> str:
    """Who is running the command, for the audit log (the login name)."""
    try:
        return getpass.getuser() or "firedrill"
    except (OSError, KeyError):
        return "firedrill"


def _fail(exc: Exception, code: ExitCode = ExitCode.INPUT) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
    return typer.Exit(code)


@contextmanager
def _reading(db: str) -> Iterator[Any]:
    """A read-only unit of work on the store; store errors exit 4."""
    from firedrill.store import open_store

    try:
        with open_store(db_url(db), read_only=True) as store, store.session() as session:
            yield session
    except StoreError as exc:
        raise _fail(exc) from exc


@contextmanager
def _writing(db: str) -> Iterator[Any]:
    """A unit of work on an existing store (a missing SQLite file is an error, not a new store);
    it commits when the command succeeds and writes nothing when it fails."""
    from firedrill.store import open_store

    url = db_url(db)
    open_store(url, read_only=True).close()
    with open_store(url) as store, store.session() as session:
        yield session


def print_persisted(result: Persisted, store_name: str) -> None:
    """One line per incident: the report's id and the store's."""
    if not result.created:
        console.print(f"run already in {escape(store_name)}: nothing written")
    for report_id, store_id in result.incidents.items():
        console.print(
            f"{escape(report_id)} stored as [bold]{escape(store_id)}[/] in {escape(store_name)}"
        )
    if not result.incidents:
        console.print(f"no incidents to store in {escape(store_name)}")


# --- rendering helpers --------------------------------------------------------------------------


def clock(at_s: float) -> str:
    """``HH:MM:SS`` (UTC; on the twin, since its midnight), with ``+Nd`` past the first day."""
    whole = int(at_s)
    day, rest = divmod(whole, DAY_S)
    hh, rest = divmod(rest, 3600)
    mm, ss = divmod(rest, 60)
    return f"{hh:02d}:{mm:02d}:{ss:02d}" + (f" +{day}d" if day else "")


def duration(seconds: float | None) -> str:
    """A duration for people: ``45 s``, ``4 min 15 s``, ``2 h 05 min``."""
    if seconds is None:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _table(title: str, columns: tuple[str, ...], *, wrap: tuple[str, ...] = ()) -> Table:
    """A borderless table; only the ``wrap`` columns (free text) wrap, the rest stay whole."""
    table = Table(title=escape(title), box=None, header_style="bold")
    for col in columns:
        wraps = col in wrap
        table.add_column(col, no_wrap=not wraps, overflow="fold", min_width=20 if wraps else None)
    return table


def _sev_value(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip().upper().removeprefix("SEV")
    if text not in ("1", "2", "3", "4"):
        raise typer.BadParameter(f"expected 1..4 or SEV1..SEV4, got {value!r}")
    return int(text)


def _text(value: object) -> str:
    """Stored text as table or line content: never read as Rich markup."""
    return "" if value is None else escape(str(value))


def _seconds(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


# --- commands -----------------------------------------------------------------------------------


@incident_app.command("list")
def incident_list(
    db: DbOption = DEFAULT_DB_URL,
    status: Annotated[
        str | None, typer.Option(help="Only incidents open, mitigated or resolved.")
    ] = None,
    cell: Annotated[str | None, typer.Option(help="Only incidents of this cell.")] = None,
    sev: Annotated[str | None, typer.Option(help="Only this severity: 1..4 or SEV1..SEV4.")] = None,
) -> None:
    """List incidents in the order they were opened."""
    from firedrill.store import casefile

    level = _sev_value(sev)
    with _reading(db) as session:
        try:
            rows = casefile.find(session=session, status=status, cell=cell, sev=level)
        except StoreError as exc:
            raise _fail(exc) from exc
    columns = ("id", "sev", "status", "cell", "opened", "resolved", "title")
    table = _table(f"incidents ({len(rows)})", columns, wrap=("title",))
    for r in rows:
        table.add_row(
            _text(r.id),
            f"SEV{r.sev}",
            r.status.value,
            _text(r.cell),
            clock(r.opened_at_s),
            "-" if r.resolved_at_s is None else clock(r.resolved_at_s),
            _text(r.title),
        )
    console.print(table)


def _load(db: str, incident_id: str) -> CaseFile:
    from firedrill.store import casefile

    with _reading(db) as session:
        try:
            return casefile.load(session=session, incident_id=incident_id)
        except StoreError as exc:
            raise _fail(exc) from exc


@incident_app.command("show")
def incident_show(incident_id: IdArgument, db: DbOption = DEFAULT_DB_URL) -> None:
    """An incident: its axes, severity history, suspects, levers, roles and comms."""
    case = _load(db, incident_id)
    inc = case.incident
    console.print(f"[bold]{_text(inc.id)}[/] SEV{inc.sev} {inc.status.value}: {_text(inc.title)}")
    console.print(
        f"cell {inc.cell} ({inc.region}); opened {clock(inc.opened_at_s)}, mitigated "
        f"{'-' if inc.mitigated_at_s is None else clock(inc.mitigated_at_s)}, resolved "
        f"{'-' if inc.resolved_at_s is None else clock(inc.resolved_at_s)}",
        markup=False,
    )
    a = case.assessment
    axes = a.get("axes")
    if isinstance(axes, dict) and axes:
        deciding = a.get("deciding_axis") or "the floor"
        table = _table(
            f"axes (deciding: {deciding})", ("axis", "level", "value", "reason"), wrap=("reason",)
        )
        for axis, r in axes.items():
            r = r if isinstance(r, dict) else {}
            table.add_row(
                _text(axis), _text(r.get("level")), _text(r.get("value")), _text(r.get("reason"))
            )
        console.print(table)
    else:
        console.print("axes: not recorded")
    console.print("[bold]severity history[/]")
    for e in case.severity or ():
        console.print(f"  {clock(e.at_s)}  {e.text}", markup=False)
    if not case.severity:
        console.print("  none recorded")
    _print_suspects(a)
    _print_levers(case)
    _print_roles(case)
    console.print("[bold]comms[/]")
    for c in case.comms:
        late = "" if c.due_s is None or c.at_s <= c.due_s else f" (late by {c.at_s - c.due_s:g} s)"
        console.print(f"  {clock(c.at_s)} {c.channel.value}: {c.text}{late}", markup=False)
    if not case.comms:
        console.print("  none posted")


def _print_suspects(assessment: Mapping[str, Any]) -> None:
    suspects = assessment.get("suspects")
    console.print("[bold]suspects[/] (what changed, most likely first)")
    if not isinstance(suspects, list) or not suspects:
        console.print("  none ranked")
    for x in suspects if isinstance(suspects, list) else ():
        console.print(
            f"  {_text(x.get('stream'))} in {_text(x.get('cell'))} at "
            f"{clock(_seconds(x.get('at_s')))} (score {_text(x.get('score'))}): "
            f"{_text(x.get('change'))}",
            highlight=False,
        )
    if assessment.get("recommendation"):
        console.print(
            f"recommendation: {assessment['recommendation']}", highlight=False, markup=False
        )


def _print_levers(case: CaseFile) -> None:
    """One line per lever: when, decision, lever, scope, who approved, how to undo it, why."""
    console.print("[bold]levers[/]")
    if not case.levers:
        console.print("  none")
    for lv in case.levers:
        ops = (lv.inverse or {}).get("operations")
        undo = (
            "no inverse"
            if lv.inverse is None
            else f"inverse {len(ops) if isinstance(ops, list) else 0} op(s)"
        )
        console.print(
            f"  {clock(lv.at_s)} {lv.status.value} {lv.kind} ({lv.scope}); approved by "
            f"{', '.join(lv.approvers) or 'nobody'}; {undo}: {lv.reason}",
            highlight=False,
            markup=False,
        )


def _print_roles(case: CaseFile) -> None:
    current = case.current_roles
    console.print("[bold]roles[/]")
    for r, a in current.items():
        console.print(f"  {r.value}: {a.person} since {clock(a.since_s)}", markup=False)
    if not current:
        console.print("  none assigned")
    for h in case.handoffs:
        console.print(f"  handoff: {h.text}", markup=False)


@incident_app.command("timeline")
def incident_timeline(
    incident_id: IdArgument,
    db: DbOption = DEFAULT_DB_URL,
    as_json: Annotated[bool, typer.Option("--json", help="Print the events as JSON.")] = False,
) -> None:
    """The incident's timeline, in time order."""
    case = _load(db, incident_id)
    if as_json:
        events = [
            {"at_s": e.at_s, "kind": e.kind, "actor": e.actor, "text": e.text, "data": e.data}
            for e in case.events
        ]
        doc = {"incident": case.incident.id, "events": events}
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return
    table = _table(f"{case.incident.id} timeline", ("at", "kind", "actor", "what"), wrap=("what",))
    for e in case.events:
        table.add_row(clock(e.at_s), _text(e.kind), _text(e.actor), _text(e.text))
    console.print(table)


@incident_app.command("handoff")
def incident_handoff(
    incident_id: IdArgument,
    to: Annotated[str, typer.Option("--to", help="Who takes the role.")],
    next_update: Annotated[
        str, typer.Option("--next-update", help="When the next update is due, HH:MM UTC.")
    ],
    role: Annotated[
        str, typer.Option(help="ic, ops, comms, scribe, model-owner, capacity or security.")
    ] = "ic",
    open_threads: Annotated[
        list[str] | None,
        typer.Option(
            "--open-threads", help="Open threads: --open-threads A B (or repeat the option)."
        ),
    ] = None,
    more_threads: Annotated[list[str] | None, typer.Argument(hidden=True)] = None,
    at: Annotated[
        str | None, typer.Option(help="When the handoff happens, HH:MM UTC (default: now).")
    ] = None,
    by: Annotated[
        str | None, typer.Option(help="Who records it, for the audit log (default: you).")
    ] = None,
    db: DbOption = DEFAULT_DB_URL,
) -> None:
    """Hand a role over; prints the sentence to say on the call."""
    from firedrill.store import casefile

    threads = [*(open_threads or []), *(more_threads or [])]
    now = time.strftime("%H:%M", time.gmtime())  # the command line is where the wall clock is read
    try:
        at_clock_s = casefile.parse_clock(at if at is not None else now)
        next_s = casefile.parse_clock(next_update)
        with _writing(db) as session:
            row = casefile.hand_off(
                session=session,
                incident_id=incident_id,
                role_name=role,
                to_person=to,
                at_clock_s=at_clock_s,
                open_threads=threads,
                next_update_clock_s=next_s,
                actor=by or operator(),
            )
    except StoreError as exc:
        raise _fail(exc) from exc
    sys.stdout.write(row.text + "\n")


@incident_app.command("postmortem")
def incident_postmortem(
    incident_id: IdArgument,
    db: DbOption = DEFAULT_DB_URL,
    markdown: Annotated[
        Path | None, typer.Option("--markdown", help="Also write it as Markdown to this file.")
    ] = None,
) -> None:
    """The postmortem: TTD/TTM/TTR, GPU-hours lost, requests failed, contributing changes and
    action items; exit 1 when there is none yet or it has no action item."""
    case = _load(db, incident_id)
    inc = case.incident
    if case.postmortem is None:
        err.print(
            f"[bold red]no postmortem:[/] {_text(inc.id)} is {inc.status.value}; its postmortem is "
            "written when it is resolved"
        )
        raise typer.Exit(ExitCode.FAILED)
    text = postmortem_markdown(case)
    sys.stdout.write(text)
    if not case.action_items:
        err.print(
            f"[bold red]incomplete:[/] the postmortem of {_text(inc.id)} has no action item; "
            "it is not "
            "finished until it changes the fleet (an alert, a runbook step, an automation "
            "guardrail or a game-day scenario)"
        )
        raise typer.Exit(ExitCode.FAILED)
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(text)
        err.print(f"wrote {_text(markdown)}")


def postmortem_markdown(case: CaseFile) -> str:
    """The postmortem as Markdown (the same bytes for the same store contents)."""
    inc, pm = case.incident, case.postmortem
    assert pm is not None
    lines = [
        f"# Postmortem {inc.id}: {inc.title}",
        "",
        f"SEV{inc.sev}, cell {inc.cell} ({inc.region}); opened {clock(inc.opened_at_s)}, "
        f"mitigated {'-' if inc.mitigated_at_s is None else clock(inc.mitigated_at_s)}, "
        f"resolved {'-' if inc.resolved_at_s is None else clock(inc.resolved_at_s)} (UTC).",
        "",
        "## Numbers",
        "",
        "| TTD | TTM | TTR | GPU-hours lost | requests failed | tokens refunded |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| {duration(pm.ttd_s)} | {duration(pm.ttm_s)} | {duration(pm.ttr_s)} | "
        f"{pm.gpu_hours_lost:,.1f} | {pm.requests_failed:,} | {pm.tokens_refunded:,} |",
        "",
        "Durations are measured from the start of impact.",
        "",
        f"Root-cause class: `{pm.root_cause_class}`",
        "",
        "## Summary",
        "",
        pm.text,
        "",
        "## Contributing changes",
        "",
    ]
    suspects = case.assessment.get("suspects")
    if isinstance(suspects, list) and suspects:
        lines += ["| stream | change | cell | at | score |", "| --- | --- | --- | --- | --- |"]
        for s in suspects:
            if isinstance(s, dict):
                lines.append(
                    f"| {_text(s.get('stream'))} | {_text(s.get('change'))} | "
                    f"{_text(s.get('cell'))} | {clock(_seconds(s.get('at_s')))} | "
                    f"{_text(s.get('score'))} |"
                )
    else:
        lines.append("None ranked.")
    lines += ["", "## Timeline", ""]
    for e in case.events:
        if e.kind != "assessment":
            lines.append(f"- {clock(e.at_s)} **{e.kind}** ({e.actor}): {e.text}")
    lines += ["", "## Action items", ""]
    if case.action_items:
        lines += ["| kind | action | owner |", "| --- | --- | --- |"]
        lines += [f"| {a.kind.value} | {a.text} | {a.owner} |" for a in case.action_items]
    else:
        lines.append("None: this postmortem is not complete.")
    return "\n".join(lines) + "\n"


def register(app: typer.Typer) -> None:
    """Add the ``incident`` sub-app to the root app."""
    app.add_typer(incident_app, name="incident")
