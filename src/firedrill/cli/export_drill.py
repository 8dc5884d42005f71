"""``firedrill export chaos-mesh DRILL`` and ``firedrill export fis DRILL``: thin entry points.

``register(app)`` adds both commands to the ``export`` sub-app. Each loads the drill the
way ``gameday run`` does (validated against its fleet: a bad drill exits 4 naming the file, line
and field, and nothing is written), calls the exporter and writes the result to stdout or a file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from firedrill.cli.common import ExitCode, err, group
from firedrill.errors import FiredrillError

__all__ = ["export_chaos_mesh", "export_fis", "register"]

DrillArgument = Annotated[Path, typer.Argument(help="Drill spec (YAML).")]
OutOption = Annotated[
    Path | None, typer.Option("--out", "-o", help="Write to a file instead of stdout.")
]


def _fail(exc: FiredrillError) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(str(exc))}")
    return typer.Exit(ExitCode.INPUT)


def _load(drill: Path) -> Any:
    from firedrill.specfile import load_drill

    try:
        return load_drill(drill)
    except FiredrillError as exc:
        raise _fail(exc) from exc


def _write(text: str, out: Path | None) -> None:
    if out is None:
        typer.echo(text, nl=False)
        return
    from firedrill.adapters import outputs

    try:
        outputs.write(out, text)
    except FiredrillError as exc:
        raise _fail(exc) from exc
    err.print(f"wrote {escape(str(out))}")


def export_chaos_mesh(
    drill: DrillArgument,
    out: OutOption = None,
    chaos_namespace: Annotated[
        str, typer.Option(help="Namespace the chaos resources are created in.")
    ] = "chaos-system",
    registry_host: Annotated[
        str, typer.Option(help="A region's registry host ({region} is replaced).")
    ] = "registry.{region}.corp",
    workflow: Annotated[
        bool, typer.Option("--workflow", help="One Chaos Mesh Workflow carrying the timeline.")
    ] = False,
) -> None:
    """Chaos Mesh resources for a drill, with the Kyverno policy that bounds them."""
    from firedrill.export.chaos_mesh import (
        ChaosMeshOptions,
        chaos_mesh,
        chaos_workflow,
        render,
        render_workflow,
    )

    loaded = _load(drill)
    opts = ChaosMeshOptions(chaos_namespace=chaos_namespace, registry_host=registry_host)
    if workflow:
        try:
            wf = chaos_workflow(loaded.spec, loaded.fleet, options=opts)
        except FiredrillError as exc:
            raise _fail(exc) from exc
        _write(render_workflow(wf), out)
        what = "one Workflow" if wf.workflow is not None else "no Workflow (nothing injected)"
        err.print(f"{what} and the Kyverno policy; {len(wf.notes)} injection(s) noted")
        return
    try:
        export = chaos_mesh(loaded.spec, loaded.fleet, options=opts)
    except FiredrillError as exc:
        raise _fail(exc) from exc
    _write(render(export), out)
    chaos = len(export.manifests) - 1
    err.print(
        f"{chaos} chaos resource(s) and the Kyverno policy; "
        f"{len(export.notes)} injection(s) noted as not (fully) exportable"
    )


def export_fis(
    drill: DrillArgument,
    out: OutOption = None,
    account: Annotated[
        str, typer.Option(help="AWS account id (default: the documentation's placeholder).")
    ] = "111122223333",
    region: Annotated[
        str | None, typer.Option(help="Experiment region (default: the drill's target region).")
    ] = None,
    role_arn: Annotated[
        str | None,
        typer.Option(help="The FIS experiment role (default: a REPLACE-ME placeholder)."),
    ] = None,
    availability_zone: Annotated[
        list[str] | None,
        typer.Option(help="AZ for the capacity-denial actions (repeat; default: REGIONa,b,c)."),
    ] = None,
    capacity_role_arn: Annotated[
        list[str] | None,
        typer.Option(help="Node role for the API capacity error (repeat, at most 5)."),
    ] = None,
    tag_key: Annotated[
        str, typer.Option(help="Targets are the resources tagged TAG_KEY=REGION.")
    ] = "dr-drill",
) -> None:
    """An AWS FIS experiment template (CreateExperimentTemplate input) for the cloud faults."""
    from firedrill.export.fis import PLACEHOLDER_ROLE, FisOptions, fis_template, render

    loaded = _load(drill)
    opts = FisOptions(
        account=account,
        region=region,
        role_arn=role_arn,
        availability_zones=tuple(availability_zone or ()),
        tag_key=tag_key,
        capacity_role_arns=tuple(capacity_role_arn or ()),
    )
    try:
        export = fis_template(loaded.spec, loaded.fleet, options=opts)
    except FiredrillError as exc:
        raise _fail(exc) from exc
    _write(render(export), out)
    err.print(f"FIS template for {export.region}; create these CloudWatch alarms there first:")
    for name, meaning in export.alarms:
        err.print(f"  {escape(name)}: {escape(meaning)}")
    if PLACEHOLDER_ROLE in export.template["roleArn"]:
        err.print("[yellow]roleArn is a placeholder:[/] pass --role-arn")
    for index, kind, reason in export.skipped:
        err.print(f"  not in this template: injections[{index}] {kind}: {escape(reason)}")
    for other in export.other_regions:
        err.print(f"also: firedrill export fis {escape(str(drill))} --region {other}")


def register(app: typer.Typer) -> None:
    """Add ``chaos-mesh`` and ``fis`` to the ``export`` sub-app."""
    export_app = group(app, "export")
    export_app.command("chaos-mesh")(export_chaos_mesh)
    export_app.command("fis")(export_fis)
