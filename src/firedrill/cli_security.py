"""``firedrill export evidence`` and ``firedrill audit evidence``: security incident evidence.

``export evidence SCENARIO --out DIR`` runs the scenario on the twin (as ``respond`` does) and
writes the evidence of each security incident (or only ``--incident ID``) into ``DIR/<id>/``:
the proxy and gateway audit records of the window, the drops, the lever journal, the operations
and the compensations, with a manifest of sha256s. Evidence is written once and read-only; an
``--out`` that already holds files, or is a symbolic link, is refused before anything runs (exit
4) and nothing is overwritten. With ``--key-file`` (or ``$FIREDRILL_EVIDENCE_KEY_FILE``) each
bundle is signed (``SHA256SUMS.hmac``).
``audit evidence DIR`` checks such a directory against its manifest (exit 1 naming each problem);
with the key it checks the signature too, and without one it says the signature was not checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from firedrill.errors import FiredrillError, SpecError

EXIT_FAILED = 1
EXIT_INPUT = 4

console = Console()
err = Console(stderr=True)

KeyFileOption = Annotated[
    Path | None,
    typer.Option(
        "--key-file",
        envvar="FIREDRILL_EVIDENCE_KEY_FILE",
        help="HMAC-SHA256 key (>= 32 bytes) that signs / checks SHA256SUMS.hmac.",
    ),
]


def export_evidence(
    scenario: Annotated[Path, typer.Argument(help="Scenario spec (YAML).")],
    out: Annotated[Path, typer.Option("--out", help="Directory to write DIR/<incident>/ into.")],
    incident: Annotated[
        str | None, typer.Option(help="Only this incident (default: every security incident).")
    ] = None,
    quiet: Annotated[bool, typer.Option(help="No table.")] = False,
    key_file: KeyFileOption = None,
) -> None:
    """Run a scenario and preserve each security incident's evidence, read-only, with a manifest."""
    from firedrill.adapters.evidence import load_key, refuse_unusable_out, write_bundle
    from firedrill.adapters.worlds import EMBEDDED_SCENARIO
    from firedrill.respond.evidence import sign_bundle
    from firedrill.scenario.run import run_scenario
    from firedrill.scenario.security_check import evidence_bundles
    from firedrill.specfile import load_scenario

    try:
        spec, fleet, slo, policy = load_scenario(scenario)
    except SpecError as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(EXIT_INPUT) from exc
    try:  # refused before anything runs
        refuse_unusable_out(out)
        key = None if key_file is None else load_key(key_file)
    except FiredrillError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_INPUT) from exc
    # incidents need a responder's book; without a policy, one in advise mode keeps it
    run = run_scenario(
        spec, fleet, slo, policy, make_world=EMBEDDED_SCENARIO,
        mode="advise" if spec.responder is None else None,
    )  # fmt: skip
    bundles = [b for b in evidence_bundles(run) if incident is None or b.incident == incident]
    if not bundles:
        what = f"incident {incident}" if incident else "security incident"
        err.print(f"[bold red]error:[/] the run of {spec.name} opened no {what}")
        raise typer.Exit(EXIT_INPUT)
    for b in bundles:
        directory = out / b.incident
        try:
            write_bundle(b if key is None else sign_bundle(b, key), directory)
        except FiredrillError as exc:
            err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_INPUT) from exc
        if not quiet:
            counts = ", ".join(f"{f.name} {f.records}" for f in b.files if f.name.endswith("l"))
            state = "complete" if b.complete else "INCOMPLETE (the audit log rolled over)"
            console.print(
                f"{b.incident} ({b.tenant}, {b.start_s:.0f}-{b.end_s:.0f} s, {state}) -> "
                f"{directory}: {counts}"
            )


def verify_evidence(
    directory: Annotated[Path, typer.Argument(help="An evidence directory (has SHA256SUMS).")],
    key_file: KeyFileOption = None,
) -> None:
    """Check preserved evidence against its manifest (and signature); exit 1 naming every
    problem."""
    from firedrill.adapters.evidence import load_key, verify_dir
    from firedrill.respond.evidence import SIGNATURE

    if not directory.is_dir() and not directory.is_symlink():
        err.print(
            f"error: {directory} is not a directory", markup=False, highlight=False, soft_wrap=True
        )
        raise typer.Exit(EXIT_INPUT)
    try:
        key = None if key_file is None else load_key(key_file)
        problems = verify_dir(directory, key=key)
    except FiredrillError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_INPUT) from exc
    if problems:
        for p in problems:
            err.print(f"BAD {p}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_FAILED)
    console.print(f"ok: evidence in {directory} verifies against its manifest", markup=False)
    if key is not None:
        console.print(f"ok: {SIGNATURE} verifies with the key in {key_file}", markup=False)
    elif (directory / SIGNATURE).exists():
        console.print(
            f"signature: not_exercised ({SIGNATURE} present; pass --key-file to check it)",
            markup=False,
        )
    else:
        console.print("signature: not_exercised (the evidence is not signed)", markup=False)


def register(export_app: typer.Typer, audit_app: typer.Typer) -> None:
    """Add ``export evidence`` and ``audit evidence`` to the CLI."""
    export_app.command("evidence")(export_evidence)
    audit_app.command("evidence")(verify_evidence)
