"""``firedrill export evidence`` and ``firedrill audit evidence``: security incident evidence.

``export evidence SCENARIO --out DIR`` runs the scenario on the twin (as ``respond`` does) and
writes the evidence of each security incident (or only ``--incident ID``) into ``DIR/<id>/``:
the proxy and gateway audit records of the window, the drops, the lever journal, the operations
and the compensations, with a manifest of sha256s. Evidence is written once and read-only; a
directory that already holds files is refused (exit 4) and nothing is overwritten.
``audit evidence DIR`` checks such a directory against its manifest (exit 1 naming each problem).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from firedrill.errors import FiredrillError, SpecError

EXIT_FAILED = 1
EXIT_INPUT = 4

console = Console()
err = Console(stderr=True)


def export_evidence(
    scenario: Annotated[Path, typer.Argument(help="Scenario spec (YAML).")],
    out: Annotated[Path, typer.Option("--out", help="Directory to write DIR/<incident>/ into.")],
    incident: Annotated[
        str | None, typer.Option(help="Only this incident (default: every security incident).")
    ] = None,
    quiet: Annotated[bool, typer.Option(help="No table.")] = False,
) -> None:
    """Run a scenario and preserve each security incident's evidence, read-only, with a manifest."""
    from firedrill.adapters.evidence import write_bundle
    from firedrill.scenario.run import run_scenario
    from firedrill.scenario.security_check import evidence_bundles
    from firedrill.specfile import load_scenario

    try:
        spec, fleet, slo, policy = load_scenario(scenario)
    except SpecError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(EXIT_INPUT) from exc
    if incident is not None:  # refused before anything runs
        d = out / incident
        if d.exists() and (not d.is_dir() or any(d.iterdir())):
            err.print(
                f"[bold red]error:[/] {escape(str(d))} already holds files: "
                "evidence is written once"
            )
            raise typer.Exit(EXIT_INPUT)
    # incidents need a responder's book; without a policy, one in advise mode keeps it
    run = run_scenario(spec, fleet, slo, policy, mode="advise" if spec.responder is None else None)
    bundles = [b for b in evidence_bundles(run) if incident is None or b.incident == incident]
    if not bundles:
        what = f"incident {incident}" if incident else "security incident"
        err.print(f"[bold red]error:[/] the run of {spec.name} opened no {escape(what)}")
        raise typer.Exit(EXIT_INPUT)
    for b in bundles:
        directory = out / b.incident
        try:
            write_bundle(b, directory)
        except FiredrillError as exc:
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
            raise typer.Exit(EXIT_INPUT) from exc
        if not quiet:
            counts = ", ".join(f"{f.name} {f.records}" for f in b.files if f.name.endswith("l"))
            state = "complete" if b.complete else "INCOMPLETE (the audit log rolled over)"
            console.print(
                f"{b.incident} ({b.tenant}, {b.start_s:.0f}-{b.end_s:.0f} s, {state}) -> "
                f"{directory}: {counts}",
                markup=False,
                highlight=False,
            )


def verify_evidence(
    directory: Annotated[Path, typer.Argument(help="An evidence directory (has SHA256SUMS).")],
) -> None:
    """Check preserved evidence against its manifest; exit 1 naming every problem."""
    from firedrill.adapters.evidence import verify_dir

    if not directory.is_dir():
        err.print(f"[bold red]error:[/] {escape(str(directory))} is not a directory")
        raise typer.Exit(EXIT_INPUT)
    try:
        problems = verify_dir(directory)
    except FiredrillError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(EXIT_INPUT) from exc
    if problems:
        for p in problems:
            err.print(f"[bold red]BAD[/] {escape(str(p))}", highlight=False)
        raise typer.Exit(EXIT_FAILED)
    console.print(
        f"[green]ok[/] evidence in {escape(str(directory))} verifies against its manifest"
    )


def register(export_app: typer.Typer, audit_app: typer.Typer) -> None:
    """Add ``export evidence`` and ``audit evidence`` to the CLI."""
    export_app.command("evidence")(export_evidence)
    audit_app.command("evidence")(verify_evidence)
