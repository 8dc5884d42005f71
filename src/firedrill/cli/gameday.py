"""``firedrill gameday run`` and ``gameday plan``: a game day from the command line.

Thin entry points: load and validate the drill (a bad spec exits 4 naming file, line and field),
call the ``run_gameday`` use case (``firedrill.app.gameday``: recover leftovers, ladder gate,
world, journal, run, keep the result) with a progress bar, write the reports, print the verdict
table, and exit with the verdict's ``ExitCode``: 0 passed, 1 failed, 3 aborted by a stop
condition, 2 Click's usage error, 4 a bad spec or input, 5 refused to start (steady state does
not hold, the ladder gate is closed, leftovers of an interrupted drill could not be reverted).
An L0 drill is a tabletop: ``run`` prints its plan and injects nothing.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from firedrill.cli.common import ExitCode, PrometheusOption, SpeedOption, console, err
from firedrill.cli.many import ExecutorKind, as_json, write_outputs
from firedrill.errors import FiredrillError, SpecError
from firedrill.model.jsontypes import JsonObject

if TYPE_CHECKING:
    from firedrill.adapters.live_world import LiveTiming
    from firedrill.drill.recover import RecoveryReport
    from firedrill.drill.result import DrillReport
    from firedrill.store.ladder import LadderCheck

VERDICT_EXIT = {"passed": ExitCode.OK, "failed": ExitCode.FAILED, "aborted": ExitCode.ABORTED}

gameday_app = typer.Typer(
    help="Game days: drills as falsifiable experiments.", no_args_is_help=True
)

DrillArg = Annotated[Path, typer.Argument(help="Drill spec (YAML).")]


def _load(path: Path) -> Any:
    from firedrill.specfile import load_drill

    try:
        return load_drill(path)
    except SpecError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        for more in exc.errors[1:]:
            err.print(f"[red]error:[/] {escape(str(more))}", highlight=False)
        raise typer.Exit(ExitCode.INPUT) from exc


# -- what the use case reports while it runs ------------------------------------------------------


class _Listener:
    """Prints what ``run_gameday`` reports, on stderr, under the progress bar."""

    def __init__(self, progress: Progress, task: TaskID, *, quiet: bool) -> None:
        self._progress = progress
        self._task = task
        self._quiet = quiet

    def recovered(self, report: RecoveryReport, directory: Path) -> None:
        """Said only when there was something to revert (or a drill still running)."""
        from firedrill.cli.ladder import print_recovery

        buffer = io.StringIO()
        print_recovery(report, directory, Console(file=buffer, width=100))
        text = buffer.getvalue()
        if (not self._quiet or not report.ok) and not text.startswith("nothing to recover"):
            err.print(text, end="", highlight=False, markup=False, soft_wrap=True)

    def gated(self, answer: LadderCheck) -> None:
        from firedrill.cli.ladder import print_gate

        print_gate(answer, err)

    def progress(self, sim_s: float) -> None:
        self._progress.update(self._task, completed=sim_s)

    def stored(self, result_id: int, answer: LadderCheck) -> None:
        err.print(f"stored drill result {result_id} ({answer.gate.reason})", highlight=False)

    def store_failed(self, error: FiredrillError) -> None:
        err.print(
            f"[bold red]error:[/] cannot store the drill result: {escape(str(error))}",
            highlight=False,
        )


def _check_outputs(
    *, json_out: Path | None, markdown: Path | None, html: Path | None, out: Path | None
) -> None:
    """Refuse, before anything runs, outputs that could not be written at the end (exit 4)."""
    from firedrill.adapters import outputs as files

    try:
        files.check_directory(out, "--out")
        for path, option in ((json_out, "--json"), (markdown, "--markdown"), (html, "--html")):
            files.check_file(path, option)
        given = [str(p) for p in (json_out, markdown, html) if p is not None]
        if given.count("-") > 1:
            raise FiredrillError("only one output can go to stdout ('-')")
    except FiredrillError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))} (nothing was run)", highlight=False)
        raise typer.Exit(ExitCode.INPUT) from exc


def _write_reports(
    report: JsonObject, *, json_out: Path | None, md_out: Path | None, html_out: Path | None
) -> list[Path]:
    """The JSON result, and the Markdown / HTML reports (``drill.report``)."""
    from firedrill.drill.report import render_html, render_markdown

    return write_outputs(
        report, [(json_out, as_json), (md_out, render_markdown), (html_out, render_html)]
    )


# -- rendering -------------------------------------------------------------------------------------


def _num(v: Any, metric: str = "") -> str:
    """The same units as the Markdown and HTML reports (``2m 45s``, ``9.0%``)."""
    from firedrill.drill.report import format_value

    return format_value(v, metric or None)


def _print_plan(plan: dict[str, Any]) -> None:
    where = plan["target"].get("region") or ", ".join(plan["target"].get("cells") or []) or "?"
    console.print(
        f"[bold]{escape(str(plan['drill']))}[/] "
        + escape(
            f"({plan['rung']}): target {plan['target']['model']} in {where}"
            f"; cap {_num(plan['duration_cap_s'], '_s')}; T0 at {_num(plan['t0_s'], '_s')}"
        ),
        highlight=False,
    )
    t = Table(title="hypothesis", box=None, header_style="bold")
    for col in ("clause", "metric", "expected"):
        t.add_column(col)
    for h in plan["hypothesis"]:
        t.add_row(*(escape(str(h[k])) for k in ("clause", "metric", "expected")))
    console.print(t)
    t = Table(title="injections (nothing is injected by plan or an L0 tabletop)", box=None)
    for col in ("at", "injection", "lasts", "operations"):
        t.add_column(col)
    for row in plan["injections"]:
        t.add_row(
            _num(row["at_s"], "_s"),
            escape(str(row["injection"])),
            _num(row["duration_s"], "_s") if row["duration_s"] is not None else "to the cap",
            escape("\n".join(row["operations"])) or "—",
        )
    console.print(t)
    stops = ", ".join(f"{s['name']} ({s['kind']})" for s in plan["stop_conditions"])
    console.print(
        f"stop conditions: {stops}; abort owner: {plan['abort_owner'] or '—'}", markup=False
    )
    if plan["rto"] is not None:
        terms = ", ".join(
            f"{k.removesuffix('_s')} {_num(v, '_s')}" for k, v in plan["rto"]["planned"].items()
        )
        console.print(f"RTO budget {_num(plan['rto']['budget_s'], '_s')}: {terms}")


def _print_result(r: DrillReport) -> None:
    from firedrill.drill.report import format_expected

    colour = {"passed": "green", "failed": "bold red", "aborted": "magenta"}.get(r.verdict, "")
    console.print(
        f"[{colour}]{r.verdict.upper()}[/] "
        + escape(f"{r.drill} ({r.rung}, seed {r.seed}): {r.reason}"),
        highlight=False,
    )
    t = Table(title="hypothesis", header_style="bold")
    for col in ("clause", "expected", "observed", "pass"):
        t.add_column(col)
    for h in r.hypothesis:
        t.add_row(
            escape(h.clause),
            escape(format_expected(h.op, h.value, h.metric)),
            escape(_num(h.observed, h.metric)),
            "[green]PASS[/]" if h.passed else "[bold red]FAIL[/]",
        )
    console.print(t)
    rto = r.rto
    t = Table(title=f"RTO (budget {_num(rto.budget_s, '_s')})", header_style="bold")
    for col in ("term", "plan", "actual"):
        t.add_column(col)
    for key, actual in rto.terms.items():
        plan = rto.planned.get(key)
        over = actual is not None and plan is not None and actual > plan
        mark = "[red]" if over else ""
        t.add_row(key.removesuffix("_s"), _num(plan, "_s"), f"{mark}{_num(actual, '_s')}")
    t.add_row(
        "[bold]measured[/]",
        _num(rto.budget_s, "_s"),
        f"[bold]{_num(rto.measured_s, '_s')}[/]",
    )
    console.print(t)
    if rto.posture_problem:
        console.print("[bold red]posture problem:[/] the hydrate term alone exceeds the budget")
    t = Table(title="stop conditions", header_style="bold")
    for col in ("name", "kind", "fired", "at"):
        t.add_column(col)
    for s in r.stop_conditions:
        t.add_row(escape(s.name), escape(s.kind), _num(s.fired), _num(s.at_s, "_s"))
    console.print(t)
    if r.security_floor:
        t = Table(title="security floor", header_style="bold")
        for col in ("check", "held", "detail"):
            t.add_column(col)
        for c in r.security_floor:
            held = (
                "[yellow]not exercised[/]"
                if c.status == "not_exercised"
                else "[green]yes[/]"
                if c.passed
                else "[bold red]NO[/]"
            )
            t.add_row(escape(c.check), held, escape(c.detail[:100]))
        console.print(t)
    console.print(
        f"reverted: {len(r.reverted.injections)} "
        + ("(every injection and lever)" if r.reverted.all else "[bold red](NOT all)[/]")
    )
    if r.findings:
        t = Table(title="findings", header_style="bold")
        for col in ("kind", "finding", "owner"):
            t.add_column(col)
        for f in r.findings:
            t.add_row(escape(f.kind), escape(f.text), escape(f.owner or ""))
        console.print(t)


def _print_live(timing: LiveTiming) -> None:
    """How a live run maps its time, said before it starts (it runs in wall time)."""
    err.print(
        f"live: the fleet's time runs {timing.speed:g}x the wall clock; the drill starts at "
        f"its {timing.offset_s:.0f} s (anchored to ±{timing.anchor_uncertainty_s:.2f} s); "
        f"Prometheus scrapes it every {timing.scrape_interval_wall_s:g} s, "
        f"{timing.resolution_s:g} s of its time: the readings' resolution",
        highlight=False,
        markup=False,
    )


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
    seed: Annotated[
        int | None, typer.Option(min=0, max=2**63 - 1, help="Seed (default: the drill's).")
    ] = None,
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
    prometheus: PrometheusOption = None,
    speed: SpeedOption = None,
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
    batch: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="--runs: runs per ensemble (default min(32, ceil(N / workers)), fewer when the "
            "ensembles would not fit in half the memory; 1: one at a time). The summary is the "
            "same whatever it is.",
        ),
    ] = None,
    min_pass_rate: Annotated[
        float, typer.Option("--min-pass-rate", help="--runs: exit 1 below this pass rate.")
    ] = 1.0,
) -> None:
    """Run a game day; exit 0 passed, 1 failed, 3 aborted by a stop condition.

    With --target and --prometheus the drill runs on a live fleet, in wall time: operations go
    to the target, hypothesis, stop conditions and RTO terms are read from Prometheus.
    """
    if batch is not None and runs == 1:
        raise typer.BadParameter(
            "--batch groups the runs of a sweep: give --runs N (N > 1) with it",
            param_hint="--batch",
        )
    loaded = _load(drill)
    if out is not None and runs == 1:  # a sweep names its own files in OUT (summary.*)
        json_out = json_out or out / "result.json"
        markdown = markdown or out / "report.md"
        html = html or out / "report.html"
    _check_outputs(json_out=json_out, markdown=markdown, html=html, out=out)
    quiet = quiet or any(str(p) == "-" for p in (json_out, markdown, html) if p is not None)
    spec = loaded.spec
    if run_by is not None:
        spec = spec.model_copy(update={"run_by": run_by})
    if spec.rung == "L0":
        from firedrill.adapters.worlds import EMBEDDED
        from firedrill.drill.run import plan as drill_plan

        if not quiet:
            _print_plan(drill_plan(spec, loaded.fleet, make_world=EMBEDDED, seed=seed))
            console.print("[green]L0 tabletop[/]: plan validated, nothing injected")
        return
    if runs > 1 and prometheus is not None:
        err.print("[bold red]error:[/] --prometheus runs one live drill (no --runs)")
        raise typer.Exit(ExitCode.INPUT)
    if runs > 1:  # a sweep on embedded twins (cli.many): the summary replaces the run's outputs
        from firedrill.cli.many import run_sweep

        raise typer.Exit(
            run_sweep(
                loaded, spec, runs=runs, seed=spec.seed if seed is None else seed,
                executor=executor, workers=workers, ray_address=ray_address, json_out=json_out,
                md_out=markdown, html_out=html, out=out, min_pass_rate=min_pass_rate,
                quiet=quiet, target=target, db=db,
                batch=batch,
            )
        )  # fmt: skip
    from firedrill.app.gameday import Refused, run_gameday

    cap = spec.duration_cap_s or 0.0
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
            result = run_gameday(
                loaded=loaded, listener=_Listener(progress, task, quiet=quiet), seed=seed,
                run_by=run_by, db=db, override_reason=override_reason, target=target,
                token_file=token_file, journal_dir=journal_dir, jitter=jitter,
                spec_path=str(drill), prometheus=prometheus, speed=speed,
                on_live=None if quiet else _print_live,
            )  # fmt: skip
    except Refused as exc:
        err.print(f"[bold red]refused:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(ExitCode.REFUSED) from exc
    except FiredrillError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(ExitCode.INPUT) from exc
    report = result.report
    if out is not None:
        json_out = json_out or out / "result.json"
        markdown = markdown or out / "report.md"
        html = html or out / "report.html"
    try:
        written = _write_reports(
            report.to_json(), json_out=json_out, md_out=markdown, html_out=html
        )
    except FiredrillError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(ExitCode.INPUT) from exc
    if not quiet:
        _print_result(report)
        for path in written:
            console.print(f"wrote [bold]{escape(str(path))}[/]")
        if (live := result.live) is not None:
            gap = (
                ""
                if live.max_gap_wall_s is None
                else (f", the longest gap {live.max_gap_wall_s * live.speed:.3g} s")
            )
            console.print(
                f"{cap / 3600:.2g} h of the live fleet's time in {result.wall_s:.2f} s wall "
                f"({live.speed:g}x) from its {live.offset_s:.0f} s; the fleet's clock was "
                f"{live.drift_s:+.1f} s off the run's at the end; a step fell at most "
                f"{live.max_late_s:.3g} s behind it; readings known to "
                f"{live.resolution_s:.3g} s of its time (one scrape{gap})",
                highlight=False,
                markup=False,
            )
        else:
            console.print(f"{cap / 3600:.2g} h simulated in {result.wall_s:.2f} s wall")
    raise typer.Exit(VERDICT_EXIT.get(result.verdict, ExitCode.INPUT))


def register(app: typer.Typer) -> None:
    """Hook the ``gameday`` sub-app (recover, ladder, findings, land, next) into the root."""
    from firedrill.cli import findings, ladder

    ladder.register(gameday_app)
    findings.register(gameday_app)
    app.add_typer(gameday_app, name="gameday")
