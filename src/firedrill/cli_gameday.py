"""``firedrill gameday run`` and ``gameday plan``: a game day from the command line.

Thin entry points: load and validate the drill (a bad spec exits 4 naming file, line and field),
recover what an interrupted drill left behind, check the ladder when a store is given, run the
drill with a progress bar, write the reports, print the verdict table, and exit with the
verdict's code: 0 passed, 1 failed, 3 aborted by a stop condition, 2 Click's usage error, 4 a
bad spec or input, 5 refused to start (steady state does not hold, the ladder gate is closed,
leftovers of an interrupted drill could not be reverted). An L0 drill is a tabletop: ``run``
prints its plan and injects nothing.
"""

from __future__ import annotations

import io
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from firedrill.cli_many import ExecutorKind, as_json, write_outputs
from firedrill.errors import FiredrillError, SpecError

EXIT_FAILED = 1
EXIT_ABORTED = 3
EXIT_SPEC = 4
EXIT_REFUSED = 5
VERDICT_EXIT = {"passed": 0, "failed": EXIT_FAILED, "aborted": EXIT_ABORTED}

gameday_app = typer.Typer(
    help="Game days: drills as falsifiable experiments.", no_args_is_help=True
)
console = Console()
err = Console(stderr=True)

DrillArg = Annotated[Path, typer.Argument(help="Drill spec (YAML).")]


def _load(path: Path) -> Any:
    from firedrill.specfile import load_drill

    try:
        return load_drill(path)
    except SpecError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        for more in exc.errors[1:]:
            err.print(f"[red]error:[/] {more}", highlight=False)
        raise typer.Exit(EXIT_SPEC) from exc


# -- hooks (other modules provide them; each is one call site) -------------------------------------


def _recover_leftovers(
    journal_dir: Path | None, quiet: bool, token_file: Path, target: str | None = None
) -> bool:
    """Revert what interrupted drills left behind before starting a new one (said only when
    there was something to revert); only through this run's own ``--target``."""
    from firedrill.cli_ladder import recover_leftovers

    buffer = io.StringIO()
    out = Console(file=buffer, width=100)
    ok = recover_leftovers(
        journal_dir, target=target, token_file=token_file, out=out, must_match=True
    )
    text = buffer.getvalue()
    if (not quiet or not ok) and not text.startswith("nothing to recover"):
        err.print(text, end="", highlight=False, markup=False, soft_wrap=True)
    return ok


def _ladder_gate(db: str, spec: Any, run_by: str, override: str | None) -> bool:
    from firedrill.cli_ladder import ladder_gate

    return ladder_gate(
        db, model=spec.target.model, rung=spec.rung, run_by=run_by,
        runbook_author=spec.runbook_author, override_reason=override,
        require_closed_findings=spec.require_closed_findings,
    )  # fmt: skip


def _persist(
    db: str, report: dict[str, Any], spec: Any, run_by: str, started: datetime, override: str | None
) -> bool:
    from firedrill.cli_ladder import persist_run

    return persist_run(
        db, report, model=spec.target.model, rung=spec.rung, run_by=run_by, started_at=started,
        at_s=float(report.get("end_s") or 0.0), runbook_author=spec.runbook_author,
        override_reason=override, require_closed_findings=spec.require_closed_findings,
    )  # fmt: skip


def _write_reports(
    report: dict[str, Any], *, json_out: Path | None, md_out: Path | None, html_out: Path | None
) -> list[Path]:
    """The JSON result, and the Markdown / HTML reports (``drill.report``)."""
    from firedrill.drill.report import render_html, render_markdown

    return write_outputs(
        report, [(json_out, as_json), (md_out, render_markdown), (html_out, render_html)]
    )


# -- rendering -------------------------------------------------------------------------------------


def _num(v: Any, metric: str = "") -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int | float):
        if metric.endswith("_s"):
            if abs(v) < 10:
                return f"{v:.2f} s"
            return f"{v:.0f} s" if abs(v) < 120 else f"{v / 60:.1f} min"
        return f"{v:.4g}"
    return str(v)


def _print_plan(plan: dict[str, Any]) -> None:
    console.print(
        f"[bold]{plan['drill']}[/] ({plan['rung']}): target {plan['target']['model']} in "
        f"{plan['target'].get('region') or ', '.join(plan['target'].get('cells') or []) or '?'}"
        f"; cap {_num(plan['duration_cap_s'], '_s')}; T0 at {_num(plan['t0_s'], '_s')}",
        highlight=False,
    )
    t = Table(title="hypothesis", box=None, header_style="bold")
    for col in ("clause", "metric", "expected"):
        t.add_column(col)
    for h in plan["hypothesis"]:
        t.add_row(h["clause"], h["metric"], h["expected"])
    console.print(t)
    t = Table(title="injections (nothing is injected by plan or an L0 tabletop)", box=None)
    for col in ("at", "injection", "lasts", "operations"):
        t.add_column(col)
    for row in plan["injections"]:
        t.add_row(
            _num(row["at_s"], "_s"),
            row["injection"],
            _num(row["duration_s"], "_s") if row["duration_s"] is not None else "to the cap",
            "\n".join(row["operations"]) or "—",
        )
    console.print(t)
    stops = ", ".join(f"{s['name']} ({s['kind']})" for s in plan["stop_conditions"])
    console.print(f"stop conditions: {stops}; abort owner: {plan['abort_owner'] or '—'}")
    if plan["rto"] is not None:
        terms = ", ".join(
            f"{k.removesuffix('_s')} {_num(v, '_s')}" for k, v in plan["rto"]["planned"].items()
        )
        console.print(f"RTO budget {_num(plan['rto']['budget_s'], '_s')}: {terms}")


def _print_result(r: dict[str, Any]) -> None:
    colour = {"passed": "green", "failed": "bold red", "aborted": "magenta"}.get(r["verdict"], "")
    console.print(
        f"[{colour}]{r['verdict'].upper()}[/] {r['drill']} ({r['rung']}, seed {r['seed']}): "
        f"{r['reason']}",
        highlight=False,
    )
    t = Table(title="hypothesis", header_style="bold")
    for col in ("clause", "expected", "observed", "pass"):
        t.add_column(col)
    for h in r["hypothesis"]:
        t.add_row(
            h["clause"],
            h["expected"],
            _num(h["observed"], h["metric"]),
            "[green]PASS[/]" if h["passed"] else "[bold red]FAIL[/]",
        )
    console.print(t)
    rto = r["rto"]
    t = Table(title=f"RTO (budget {_num(rto['budget_s'], '_s')})", header_style="bold")
    for col in ("term", "plan", "actual"):
        t.add_column(col)
    for key, actual in rto["terms"].items():
        plan = rto["planned"].get(key)
        over = actual is not None and plan is not None and actual > plan
        mark = "[red]" if over else ""
        t.add_row(key.removesuffix("_s"), _num(plan, "_s"), f"{mark}{_num(actual, '_s')}")
    t.add_row(
        "[bold]measured[/]",
        _num(rto["budget_s"], "_s"),
        f"[bold]{_num(rto['measured_s'], '_s')}[/]",
    )
    console.print(t)
    if rto.get("posture_problem"):
        console.print("[bold red]posture problem:[/] the hydrate term alone exceeds the budget")
    t = Table(title="stop conditions", header_style="bold")
    for col in ("name", "kind", "fired", "at"):
        t.add_column(col)
    for s in r["stop_conditions"]:
        t.add_row(s["name"], s["kind"], _num(s["fired"]), _num(s["at_s"], "_s"))
    console.print(t)
    if r["security_floor"]:
        t = Table(title="security floor", header_style="bold")
        for col in ("check", "held", "detail"):
            t.add_column(col)
        for c in r["security_floor"]:
            held = (
                "[yellow]not exercised[/]"
                if c.get("status") == "not_exercised"
                else "[green]yes[/]"
                if c.get("passed")
                else "[bold red]NO[/]"
            )
            t.add_row(str(c.get("check")), held, str(c.get("detail", ""))[:100])
        console.print(t)
    reverted = r["reverted"]
    console.print(
        f"reverted: {len(reverted['injections'])} "
        + ("(every injection and lever)" if reverted["all"] else "[bold red](NOT all)[/]")
    )
    if r["findings"]:
        t = Table(title="findings", header_style="bold")
        for col in ("kind", "finding", "owner"):
            t.add_column(col)
        for f in r["findings"]:
            t.add_row(f["kind"], f["text"], f["owner"])
        console.print(t)


# -- commands --------------------------------------------------------------------------------------


@gameday_app.command("plan")
def plan(drill: DrillArg) -> None:
    """Validate a drill and print its plan (what an L0 tabletop walks through); inject nothing."""
    from firedrill.adapters.worlds import EMBEDDED
    from firedrill.drill.run import plan as drill_plan

    loaded = _load(drill)
    _print_plan(drill_plan(loaded.spec, loaded.fleet, make_world=EMBEDDED))


@gameday_app.command("run")
def run(
    drill: DrillArg,
    seed: Annotated[int | None, typer.Option(help="Seed (default: the drill's).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the result JSON.")] = None,
    markdown: Annotated[
        Path | None, typer.Option("--markdown", help="Write a Markdown report.")
    ] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Write an HTML report.")] = None,
    out: Annotated[
        Path | None, typer.Option(help="Directory for result.json, report.md and report.html.")
    ] = None,
    run_by: Annotated[str | None, typer.Option("--run-by", help="Who runs it.")] = None,
    db: Annotated[
        str | None,
        typer.Option("--db", help="Store URL: check the ladder and keep the result there."),
    ] = None,
    override_reason: Annotated[
        str | None, typer.Option("--override-reason", help="Run past a closed ladder gate.")
    ] = None,
    target: Annotated[
        str | None, typer.Option("--target", help="A twin served by `twin serve` (URL).")
    ] = None,
    token_file: Annotated[
        Path, typer.Option("--token-file", help="The remote twin's control token.")
    ] = Path(".firedrill/twin-token"),
    journal_dir: Annotated[
        Path | None,
        typer.Option("--journal-dir", help="Drill journals (default .firedrill/journal)."),
    ] = None,
    quiet: Annotated[bool, typer.Option(help="No progress bar or tables.")] = False,
    runs: Annotated[
        int, typer.Option(min=1, help="Run N times with jitter; report the distributions.")
    ] = 1,
    jitter: Annotated[
        bool, typer.Option(help="Jitter fault timing and demand from the seed (one run).")
    ] = False,
    executor: Annotated[
        ExecutorKind, typer.Option(help="Where --runs execute: local processes or Ray.")
    ] = ExecutorKind.process,
    workers: Annotated[
        int | None, typer.Option(min=1, help="Workers for --runs (default: all cores).")
    ] = None,
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="Ray cluster (ray://host:10001, auto).")
    ] = None,
    min_pass_rate: Annotated[
        float, typer.Option("--min-pass-rate", help="--runs: exit 1 below this pass rate.")
    ] = 1.0,
) -> None:
    """Run a game day; exit 0 passed, 1 failed, 3 aborted by a stop condition."""
    from firedrill.adapters.journal_file import Journal, default_directory
    from firedrill.drill.run import Jitter, SteadyStateError, run_drill

    loaded = _load(drill)
    spec = loaded.spec
    if run_by is not None:
        spec = spec.model_copy(update={"run_by": run_by})
    who = spec.run_by or "unknown"
    if spec.rung == "L0":
        from firedrill.adapters.worlds import EMBEDDED
        from firedrill.drill.run import plan as drill_plan

        if not quiet:
            _print_plan(drill_plan(spec, loaded.fleet, make_world=EMBEDDED, seed=seed))
            console.print("[green]L0 tabletop[/]: plan validated, nothing injected")
        return
    if runs > 1:  # a sweep on embedded twins (cli_many): the summary replaces the run's outputs
        from firedrill.cli_many import run_sweep

        raise typer.Exit(
            run_sweep(
                loaded, spec, runs=runs, seed=spec.seed if seed is None else seed,
                executor=executor, workers=workers, ray_address=ray_address, json_out=json_out,
                md_out=markdown, html_out=html, out=out, min_pass_rate=min_pass_rate,
                quiet=quiet, target=target, db=db,
            )
        )  # fmt: skip
    try:
        if not _recover_leftovers(journal_dir, quiet, token_file, target):
            err.print("[bold red]refused:[/] an interrupted drill's leftovers are not reverted")
            raise typer.Exit(EXIT_REFUSED)
    except FiredrillError as exc:
        err.print(f"[bold red]refused:[/] cannot recover leftovers: {exc}", highlight=False)
        raise typer.Exit(EXIT_REFUSED) from exc
    if db is not None and not _ladder_gate(db, spec, who, override_reason):
        raise typer.Exit(EXIT_REFUSED)
    from firedrill.adapters.worlds import EMBEDDED, load_token, remote
    from firedrill.ports import DrillWorld

    world: DrillWorld | None = None
    target_name = "embedded"
    if target is not None:
        try:
            world = remote(target, load_token(token_file))
        except FiredrillError as exc:
            err.print(f"[bold red]error:[/] {exc}", highlight=False)
            raise typer.Exit(EXIT_SPEC) from exc
        target_name = target
    started = datetime.now(UTC)
    run_seed = spec.seed if seed is None else seed
    journal = Journal.create(
        journal_dir or default_directory(), drill=spec.name, spec_sha256=loaded.spec_sha256,
        seed=run_seed, run_by=who, target=target_name,
    )  # fmt: skip
    cap = spec.duration_cap_s or 0.0
    wall0 = time.perf_counter()
    try:
        with Progress(
            TextColumn("[bold]gameday[/] {task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>5.1f}%"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=err,
            disable=quiet,
            transient=True,
        ) as progress:
            task = progress.add_task(f"{spec.name} {spec.duration_cap}", total=cap)
            result = run_drill(
                spec, loaded.fleet, loaded.slo, loaded.policy, seed=run_seed, journal=journal,
                world=world, make_world=EMBEDDED,
                progress=lambda t: progress.update(task, completed=t),
                spec_sha256=loaded.spec_sha256, jitter=Jitter(seed=run_seed) if jitter else None,
            )  # fmt: skip
    except SteadyStateError as exc:
        err.print(f"[bold red]refused:[/] {exc} (nothing was injected)", highlight=False)
        raise typer.Exit(EXIT_REFUSED) from exc
    except FiredrillError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(EXIT_SPEC) from exc
    finally:
        journal.close()
    wall = time.perf_counter() - wall0
    report = result.report
    report["spec_path"] = str(drill)
    if out is not None:
        json_out = json_out or out / "result.json"
        markdown = markdown or out / "report.md"
        html = html or out / "report.html"
    written = _write_reports(report, json_out=json_out, md_out=markdown, html_out=html)
    if db is not None:
        _persist(db, report, spec, who, started, override_reason)
    if not quiet:
        _print_result(report)
        for path in written:
            console.print(f"wrote [bold]{path}[/]")
        console.print(f"{cap / 3600:.2g} h simulated in {wall:.2f} s wall")
    raise typer.Exit(VERDICT_EXIT.get(result.verdict, EXIT_SPEC))


def register(app: typer.Typer) -> None:
    """Hook the ``gameday`` sub-app (recover, ladder, findings, land, next) into the root."""
    from firedrill import cli_findings, cli_ladder

    cli_ladder.register(gameday_app)
    cli_findings.register(gameday_app)
    app.add_typer(gameday_app, name="gameday")
