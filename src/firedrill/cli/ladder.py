"""``firedrill gameday recover`` and ``firedrill gameday ladder``: thin entry points.

``register(gameday_app)`` adds both commands to the ``gameday`` sub-app. ``print_recovery`` and
``print_gate`` render what the ``gameday run`` use case (``firedrill.app.gameday``) reports
before a run: leftovers reverted, the ladder gate's warnings.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from firedrill.app.gameday import DEFAULT_TOKEN_FILE
from firedrill.cli.common import DEFAULT_DB_URL, ExitCode, console, err
from firedrill.errors import FiredrillError
from firedrill.model.operations import Operation

if TYPE_CHECKING:
    from firedrill.drill.recover import RecoveryReport
    from firedrill.store.ladder import LadderCheck

__all__ = ["ladder", "print_gate", "print_recovery", "recover", "register"]


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


def print_recovery(report: RecoveryReport, directory: Path, out: Console | None = None) -> None:
    """What recovering leftovers did, journal by journal."""
    out = out or console
    for state in report.live:
        out.print(
            f"[yellow]left alone[/] {escape(state.path.name)}: drill "
            f"{escape(state.header.drill)} is still running (pid {state.header.pid})"
        )
    if not report.journals:
        out.print(f"nothing to recover in {escape(str(directory))}")
        return
    for j in report.journals:
        h = j.header
        mark = "[green]recovered[/]" if j.finished else "[bold red]NOT recovered[/]"
        out.print(
            f"{mark} "
            + escape(
                f"{j.path.name}: drill {h.drill} run by {h.run_by}, started {h.started}, "
                f"target {h.target}"
            )
        )
        for i in j.intents:
            colour = "red" if i.outcome == "failed" else "green"
            detail = f" ({i.detail})" if i.detail else ""
            out.print(
                f"  [{colour}]{i.outcome}[/] {escape(f'{_op(i.op)} <- {_op(i.inverse)}{detail}')}",
                highlight=False,
            )
        if j.note:
            out.print(f"  {j.note}", highlight=False, markup=False, soft_wrap=True)
    out.print(
        f"{report.reverted} injection(s) reverted in {len(report.journals)} journal(s)"
        + ("" if report.ok else "; some could not be reverted (see above), run recover again")
    )


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
    from firedrill.app.gameday import recover_leftovers

    try:
        report, directory = recover_leftovers(
            journal_dir=journal_dir, target=target, token_file=token_file
        )
    except FiredrillError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(ExitCode.INPUT) from exc
    print_recovery(report, directory)
    if not report.ok:
        raise typer.Exit(ExitCode.INPUT)


def ladder(
    db: Annotated[
        str, typer.Option("--db", help="Store URL: sqlite:///FILE or postgresql://USER@HOST/DB.")
    ] = DEFAULT_DB_URL,
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
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(ExitCode.INPUT) from exc
    if not history:
        console.print("no drill results yet" + (f" for {model}" if model else ""), markup=False)
        return
    table = Table(title="drill ladder")
    for column in ("model", "highest passed", "may run up to", "runs", "open items", "L5"):
        table.add_column(column)
    rows = standings(history, now)
    for s in rows:
        top = "-" if s.highest_passed is None else f"L{s.highest_passed}"
        table.add_row(
            escape(s.model),
            top,
            f"L{s.highest_allowed}",
            str(s.runs),
            str(open_items.get(s.model, 0)),
            escape(s.last_l5),
        )
    console.print(table)
    if model is not None:
        detail = Table(title=escape(f"{model}, rung by rung"))
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
                escape(latest),
                escape(mine[-1].run_by) if mine else "-",
                "[green]open[/]" if g.allowed else "[red]closed[/]",
            )
        console.print(detail)
    for s in rows:
        for warning in s.warnings:
            console.print(f"[yellow]warning[/] {escape(f'{s.model}: {warning}')}", highlight=False)


def print_gate(answer: LadderCheck, out: Console | None = None) -> None:
    """The ladder gate's rotation warnings and any override, before a run."""
    out = out or err
    for warning in answer.warnings:
        out.print(f"[yellow]warning[/] {escape(str(warning))}", highlight=False)
    if answer.gate.allowed and answer.gate.overridden:
        out.print(f"[yellow]ladder override[/] {escape(answer.gate.reason)}", highlight=False)


def register(gameday_app: typer.Typer) -> None:
    """Add ``recover`` and ``ladder`` to the ``gameday`` sub-app."""
    gameday_app.command("recover")(recover)
    gameday_app.command("ladder")(ladder)
