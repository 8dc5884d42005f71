"""``firedrill gameday recover`` and ``firedrill gameday ladder``: thin entry points.

``register(gameday_app)`` adds both commands to the ``gameday`` sub-app. Hooks for
``gameday run``: ``recover_leftovers`` before it starts (a drill never begins on top of what an
interrupted one left behind), ``ladder_gate`` before it injects anything, ``persist_run`` with
its result.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from firedrill.errors import FiredrillError
from firedrill.model.operations import Operation

__all__ = ["ladder", "ladder_gate", "persist_run", "recover", "recover_leftovers", "register"]

EXIT_ERROR = 4
DEFAULT_DB = "sqlite:///firedrill.db"
DEFAULT_TOKEN_FILE = Path(".firedrill/twin-token")

console = Console()
err = Console(stderr=True)

JournalDirOption = Annotated[
    Path | None,
    typer.Option(
        "--journal-dir",
        help="Drill journals (default: $FIREDRILL_JOURNAL_DIR, else .firedrill/journal).",
    ),
]
TargetOption = Annotated[
    str | None,
    typer.Option(
        "--target",
        help="Revert through this twin URL (the control token is sent nowhere else; a journal's "
        "own URL is never used).",
    ),
]
TokenFileOption = Annotated[
    Path,
    typer.Option(
        "--token-file",
        help="The twin's control token ($FIREDRILL_TWIN_TOKEN wins when set).",
    ),
]


def recover_leftovers(
    journal_dir: Path | None = None,
    *,
    target: str | None = None,
    token_file: Path = DEFAULT_TOKEN_FILE,
    out: Console | None = None,
    must_match: bool = False,
) -> bool:
    """Recover every unfinished journal; print what was done; ``False`` if anything failed.

    The token goes only to ``target`` (the user's), never to a URL a journal names; with
    ``must_match`` only journals naming that same twin are recovered (``target_for``).
    """
    from firedrill.adapters.journal_file import JournalFiles, default_directory
    from firedrill.adapters.remote_twin import RemoteTwin, load_token
    from firedrill.drill.recover import recover, target_for
    from firedrill.model.journal import JournalHeader

    out = out or console
    directory = journal_dir or default_directory()
    tokens: dict[str, str] = {}

    def world_for(header: JournalHeader) -> RemoteTwin:
        url = target_for(header, target, must_match=must_match)
        if "token" not in tokens:
            tokens["token"] = load_token(token_file)
        return RemoteTwin(url, tokens["token"])

    report = recover(JournalFiles(directory), world_for)
    for state in report.live:
        out.print(
            f"[yellow]left alone[/] {state.path.name}: drill {state.header.drill} is still "
            f"running (pid {state.header.pid})"
        )
    if not report.journals:
        out.print(f"nothing to recover in {directory}")
        return True
    for j in report.journals:
        h = j.header
        mark = "[green]recovered[/]" if j.finished else "[bold red]NOT recovered[/]"
        out.print(
            f"{mark} {j.path.name}: drill {h.drill} run by {h.run_by}, started {h.started}, "
            f"target {h.target}"
        )
        for i in j.intents:
            colour = "red" if i.outcome == "failed" else "green"
            detail = f" ({i.detail})" if i.detail else ""
            out.print(
                f"  [{colour}]{i.outcome}[/] {_op(i.op)} <- {_op(i.inverse)}{detail}",
                highlight=False,
            )
        if j.note:
            out.print(f"  {j.note}", highlight=False, markup=False, soft_wrap=True)
    out.print(
        f"{report.reverted} injection(s) reverted in {len(report.journals)} journal(s)"
        + ("" if report.ok else "; some could not be reverted (see above), run recover again")
    )
    return report.ok


def _op(op: Operation) -> str:
    from firedrill.drill.journal import encode_op

    data = encode_op(op)
    args = ", ".join(f"{k}={v}" for k, v in data["args"].items())
    return f"{data['op']}({args})"


def recover(
    journal_dir: JournalDirOption = None,
    target: TargetOption = None,
    token_file: TokenFileOption = DEFAULT_TOKEN_FILE,
) -> None:
    """Revert what interrupted drills left injected (also runs at the start of `gameday run`)."""
    try:
        ok = recover_leftovers(journal_dir, target=target, token_file=token_file)
    except FiredrillError as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(EXIT_ERROR) from exc
    if not ok:
        raise typer.Exit(EXIT_ERROR)


def ladder(
    db: Annotated[
        str, typer.Option("--db", help="Store URL: sqlite:///FILE or postgresql://USER@HOST/DB.")
    ] = DEFAULT_DB,
    model: Annotated[str | None, typer.Option("--model", help="One model, rung by rung.")] = None,
) -> None:
    """Per model: the highest rung passed, what may run next, last successful L5, warnings."""
    from firedrill.drill.ladder import RUNG_NAMES, gate, standings
    from firedrill.store import findings as action_items
    from firedrill.store import ladder as stored
    from firedrill.store import open_store

    now = datetime.now(UTC)
    try:
        with open_store(db, read_only=True) as store, store.session() as session:
            history = stored.runs(session=session, model=model)
            open_items = action_items.counts_by_model(
                action_items.list_items(session=session, model=model, status="open")
            )
    except FiredrillError as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(EXIT_ERROR) from exc
    if not history:
        console.print("no drill results yet" + (f" for {model}" if model else ""))
        return
    table = Table(title="drill ladder")
    for column in ("model", "highest passed", "may run up to", "runs", "open items", "L5"):
        table.add_column(column)
    rows = standings(history, now)
    for s in rows:
        top = "-" if s.highest_passed is None else f"L{s.highest_passed}"
        table.add_row(
            s.model,
            top,
            f"L{s.highest_allowed}",
            str(s.runs),
            str(open_items.get(s.model, 0)),
            s.last_l5,
        )
    console.print(table)
    if model is not None:
        detail = Table(title=f"{model}, rung by rung")
        for column in ("rung", "", "runs", "latest (newest first)", "last run by", "gate"):
            detail.add_column(column)
        for rung, title in enumerate(RUNG_NAMES):
            mine = [r for r in history if r.rung == rung]
            latest = ", ".join(r.verdict for r in reversed(mine[-3:])) or "-"
            g = gate(history, model=model, rung=rung)
            detail.add_row(
                f"L{rung}",
                title,
                str(len(mine)),
                latest,
                mine[-1].run_by if mine else "-",
                "[green]open[/]" if g.allowed else "[red]closed[/]",
            )
        console.print(detail)
    for s in rows:
        for warning in s.warnings:
            console.print(f"[yellow]warning[/] {s.model}: {warning}", highlight=False)


def ladder_gate(
    db: str,
    *,
    model: str,
    rung: str | int,
    run_by: str,
    runbook_author: str | None = None,
    override_reason: str | None = None,
    require_closed_findings: bool = False,
    out: Console | None = None,
) -> bool:
    """Before a run: may this rung run for this model? Prints the gate and rotation warnings.

    A store that does not exist yet holds no results: only L0 may run then (or an override).
    """
    from firedrill.store import ladder as stored
    from firedrill.store import open_store

    out = out or err
    try:
        with open_store(db) as store:
            store.migrate()
            with store.session() as session:
                answer = stored.check(
                    session=session,
                    model=model,
                    rung=rung,
                    run_by=run_by,
                    runbook_author=runbook_author,
                    override_reason=override_reason,
                    require_closed_findings=require_closed_findings,
                )
    except FiredrillError as exc:
        out.print(f"[bold red]error:[/] {exc}")
        return False
    verdict = answer.gate
    for warning in answer.warnings:
        out.print(f"[yellow]warning[/] {warning}", highlight=False)
    if not verdict.allowed:
        out.print(f"[bold red]ladder:[/] {verdict.reason} (override with a recorded reason)")
    elif verdict.overridden:
        out.print(f"[yellow]ladder override[/] {verdict.reason}", highlight=False)
    return verdict.allowed


def persist_run(
    db: str,
    result: Mapping[str, Any],
    *,
    model: str,
    rung: str | int,
    run_by: str,
    started_at: datetime,
    at_s: float,
    runbook_author: str | None = None,
    override_reason: str | None = None,
    require_closed_findings: bool = False,
    out: Console | None = None,
) -> bool:
    """After a run: keep its result (who ran it, any override, in the audit log too) and track
    its findings as action items."""
    from firedrill.store import findings as action_items
    from firedrill.store import ladder as stored
    from firedrill.store import open_store

    out = out or err
    try:
        with open_store(db) as store:
            store.migrate()
            with store.session() as session:
                row, answer = stored.record(
                    session=session,
                    name=str(result["drill"]),
                    model=model,
                    rung=rung,
                    verdict=str(result["verdict"]),
                    run_by=run_by,
                    at_s=at_s,
                    report=dict(result),
                    started_at=started_at,
                    runbook_author=runbook_author,
                    override_reason=override_reason,
                    require_closed_findings=require_closed_findings,
                )
                items = action_items.list_items(session=session, model=model, status="open")
    except (FiredrillError, KeyError) as exc:
        out.print(f"[bold red]error:[/] cannot store the drill result: {exc}")
        return False
    out.print(f"stored drill result {row.id} ({answer.gate.reason})", highlight=False)
    raised = [i for i in items if i.last_result_id == row.id]
    if raised:
        out.print(
            f"{len(raised)} finding(s) tracked as action items "
            f"({len(items)} open for {model}): firedrill gameday findings --model {model}",
            highlight=False,
        )
    return True


def register(gameday_app: typer.Typer) -> None:
    """Add ``recover`` and ``ladder`` to the ``gameday`` sub-app."""
    gameday_app.command("recover")(recover)
    gameday_app.command("ladder")(ladder)
