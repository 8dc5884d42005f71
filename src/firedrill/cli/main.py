"""The root ``firedrill`` app, its own commands, and the list of command modules it registers.

Exit codes are ``firedrill.cli.common.ExitCode``; how to add a command module is in the package's
docstring (``firedrill.cli``).
"""

from __future__ import annotations

import json
import math
import re
import signal
import sys
import threading
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Protocol

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from firedrill import __version__
from firedrill.cli import calibrate as calibrate_cli
from firedrill.cli import controller, export_drill, gameday, incident, security, serve
from firedrill.cli.common import (
    DEFAULT_DB_URL,
    ExitCode,
    PrometheusOption,
    SpeedOption,
    console,
    err,
)
from firedrill.errors import FiredrillError, SpecError
from firedrill.model.series import Series
from firedrill.model.spec import FleetSpec

app = typer.Typer(
    name="firedrill",
    help="Incident response and DR game days for GPU inference and training fleets.",
    no_args_is_help=True,
    add_completion=False,
)
twin_app = typer.Typer(help="Run the built-in digital twin of a GPU fleet.", no_args_is_help=True)
app.add_typer(twin_app, name="twin")
alerting_app = typer.Typer(help="Choosing alert parameters.", no_args_is_help=True)
app.add_typer(alerting_app, name="alerting")
rules_app = typer.Typer(
    help="Prometheus rules and Alertmanager config for a real fleet.", no_args_is_help=True
)
app.add_typer(rules_app, name="rules")
export_app = typer.Typer(help="Manifests for the real tools.", no_args_is_help=True)
app.add_typer(export_app, name="export")
audit_app = typer.Typer(help="The store's append-only audit log.", no_args_is_help=True)
app.add_typer(audit_app, name="audit")


class CommandModule(Protocol):
    """A module of ``firedrill.cli`` that adds its commands to the root app."""

    def register(self, app: typer.Typer) -> None: ...


COMMAND_MODULES: tuple[CommandModule, ...] = (
    incident,  # incident list, show, timeline, handoff, postmortem
    security,  # export evidence, audit evidence
    gameday,  # gameday run, plan, recover, ladder
    export_drill,  # export chaos-mesh, export fis
    serve,  # serve: Alertmanager webhook, incidents API, lever approvals
    controller,  # controller (GPU health on a cluster), conduct (a drill as a Chaos Mesh Workflow)
    calibrate_cli,  # twin calibrate: fit a fleet spec to a real fleet's Prometheus
)
for _module in COMMAND_MODULES:
    _module.register(app)
SEED_MAX = 2**63 - 1  # seeds are non-negative (NumPy's generators refuse negative ones)


class SchemaKind(StrEnum):
    fleet = "fleet"
    slo = "slo"
    policy = "policy"
    scenario = "scenario"
    drill = "drill"
    drill_report = "drill-report"
    respond_report = "respond-report"


class SeriesFormat(StrEnum):
    openmetrics = "openmetrics"
    promtool = "promtool"
    none = "none"


def _progress(verb: str, *, quiet: bool) -> Progress:
    """The progress bar every long command shows on stderr (simulated time done)."""
    return Progress(
        TextColumn(f"[bold]{verb}[/] {{task.description}}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        disable=quiet,
        transient=True,
    )


def _fail(exc: FiredrillError) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
    return typer.Exit(ExitCode.INPUT)


def _check_outputs(
    *files: tuple[Path | None, str], directory: tuple[Path | None, str] = (None, "")
) -> None:
    """Refuse, before anything runs, outputs that could not be written at the end (exit 4)."""
    from firedrill.adapters import outputs

    try:
        outputs.check_directory(*directory)
        for path, option in files:
            outputs.check_file(path, option)
    except FiredrillError as exc:
        raise _fail(exc) from exc


def _write_output(path: Path, text: str) -> None:
    from firedrill.adapters import outputs

    try:
        outputs.write(path, text)
    except FiredrillError as exc:
        raise _fail(exc) from exc


def _load_fleet(path: Path) -> tuple[FleetSpec, str]:
    from firedrill.specfile import load_fleet, spec_sha256

    try:
        return load_fleet(path), spec_sha256(path)
    except SpecError as exc:
        raise _fail(exc) from exc


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        console.print(f"firedrill {__version__}")
        raise typer.Exit(0)


@app.command()
def schema(kind: Annotated[SchemaKind, typer.Argument(help="Which spec or report.")]) -> None:
    """Print the JSON Schema of a spec or of a report (for editors and CI validation)."""
    if kind in (SchemaKind.drill_report, SchemaKind.respond_report):
        from firedrill.drill.result import drill_report_schema
        from firedrill.scenario.result import respond_report_schema

        doc = drill_report_schema() if kind is SchemaKind.drill_report else respond_report_schema()
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")
        return
    from firedrill.detect.slo import SloSpec
    from firedrill.drill.spec import DrillSpec
    from firedrill.remediate.policy import PolicySpec
    from firedrill.scenario.spec import ScenarioSpec
    from firedrill.specfile import json_schema

    models: dict[SchemaKind, type[Any]] = {
        SchemaKind.fleet: FleetSpec,
        SchemaKind.slo: SloSpec,
        SchemaKind.policy: PolicySpec,
        SchemaKind.scenario: ScenarioSpec,
        SchemaKind.drill: DrillSpec,
    }
    sys.stdout.write(json.dumps(json_schema(models[kind]), indent=2, sort_keys=False) + "\n")


_DURATION_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def _seconds(text: str, what: str) -> float:
    """Simulated seconds from ``900``, ``90.5``, ``15m``, ``1h30m`` or ``1d``."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        parts = _DURATION_PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise typer.BadParameter(
                f"{what} {text!r} is neither seconds (900) nor a duration (15m, 1h30m, 1d)",
                param_hint="--window",
            ) from None
        value = sum(float(n) * _DURATION_UNITS_S[u] for n, u in parts)
    if not math.isfinite(value) or value < 0:
        raise typer.BadParameter(f"{what} must be >= 0 s, got {text!r}", param_hint="--window")
    return value


def _parse_window(window: str | None, hours: float, interval_s: float) -> tuple[float, float]:
    """The export window in simulated seconds: START:END, either side a number of seconds or a
    duration, an empty side meaning the run's start or end; refused when it holds no scrape."""
    run_s = hours * 3600.0
    if window is None:
        return 0.0, run_s
    if ":" not in window:
        raise typer.BadParameter(
            "expected START:END (seconds or durations), e.g. 0:3600 or 6h:12h",
            param_hint="--window",
        )
    a_text, b_text = window.split(":", 1)
    a = _seconds(a_text, "START") if a_text.strip() else 0.0
    b = _seconds(b_text, "END") if b_text.strip() else run_s
    if not a < b:
        raise typer.BadParameter(
            f"empty window: START {a:g} s is not before END {b:g} s", param_hint="--window"
        )
    if a > run_s:
        raise typer.BadParameter(
            f"the window starts at {a:g} s, after the run ends ({run_s:g} s: --hours {hours:g})",
            param_hint="--window",
        )
    end = min(b, run_s)
    first_scrape = math.ceil(a / interval_s - 1e-9) * interval_s
    if first_scrape > end + 1e-9:
        raise typer.BadParameter(
            f"empty window: no scrape between {a:g} s and {end:g} s (one every {interval_s:g} s)",
            param_hint="--window",
        )
    return a, b


@twin_app.command("run")
def twin_run(
    fleet: Annotated[Path, typer.Argument(help="Fleet spec (YAML).")],
    hours: Annotated[float, typer.Option(min=0.001, max=24 * 14, help="Simulated hours.")] = 1.0,
    seed: Annotated[
        int, typer.Option(min=0, max=SEED_MAX, help="Seed: same spec + seed, same result.")
    ] = 0,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/twin"),
    series: Annotated[
        SeriesFormat, typer.Option(help="Series export written to OUT (none to skip).")
    ] = SeriesFormat.openmetrics,
    window: Annotated[
        str | None,
        typer.Option(
            help="Series window START:END in simulated seconds or durations (0:3600, 6h:12h, "
            "23h:); default the whole run."
        ),
    ] = None,
    families: Annotated[
        list[str] | None,
        typer.Option(
            "--families",
            help="Metric families to export: names or globs ('vllm:*', DCGM_FI_DEV_XID_ERRORS), "
            "repeatable or comma-separated; default every family, so any rule can be tested on "
            "the export. Only these are recorded (all of them with --slo).",
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option(help="No progress bar or table.")] = False,
    slo: Annotated[
        Path | None, typer.Option(help="SLO spec: evaluate its burn-rate alerts during the run.")
    ] = None,
) -> None:
    """Run the twin; write OUT/summary.json and the series; print a summary table.

    The series are written as they are read from the twin's store, family by family, so the
    export's size on disk is the only limit on how long a run and how many families it holds.
    """
    from firedrill.detect.evaluator import AlertEvent, BurnRateEvaluator
    from firedrill.detect.monitor import event_dict, watch
    from firedrill.twin.engine import Twin
    from firedrill.twin.run import run_twin, summarize

    spec, digest = _load_fleet(fleet)
    _check_outputs(directory=(out, "--out"))
    slo_spec = _load_slo(slo) if slo is not None else None
    if slo_spec is not None and series is SeriesFormat.none:
        raise typer.BadParameter("--slo needs the series: drop --series none")
    patterns = [p.strip() for item in families or [] for p in item.split(",") if p.strip()]
    if families is not None and series is SeriesFormat.none:
        raise typer.BadParameter("--families chooses what to export: drop --series none")
    if families is not None and not patterns:
        raise typer.BadParameter("--families names no family", param_hint="--families")
    selected: set[str] | None = None

    def prepare(tw: Twin) -> None:
        nonlocal selected
        if not patterns:
            return
        from firedrill.twin.exposition import family_of
        from firedrill.twin.run import choose_families

        try:
            chosen = choose_families(tw, patterns)
        except FiredrillError as exc:
            raise typer.BadParameter(str(exc), param_hint="--families") from exc
        selected = chosen
        if slo_spec is None:  # the burn-rate evaluator reads its own families from the store
            tw.store.restrict(lambda name: family_of(name) in chosen)

    alerts: list[AlertEvent] = []
    evaluators: dict[int, BurnRateEvaluator] = {}

    def advance(tw: Twin, seconds: float) -> None:
        if slo_spec is None:
            tw.run_for(seconds)
            return
        ev = evaluators.setdefault(id(tw), BurnRateEvaluator(slo_spec, tw))
        alerts.extend(watch(tw, ev, seconds=seconds, every_s=spec.scrape_interval_s))

    start_s, end_s = _parse_window(window, hours, spec.scrape_interval_s)
    out.mkdir(parents=True, exist_ok=True)
    total_s = hours * 3600.0
    wall0 = time.perf_counter()
    with _progress("twin", quiet=quiet) as progress:
        task = progress.add_task(f"{spec.name} {hours:g} h", total=total_s)
        twin = run_twin(
            spec,
            seed=seed,
            hours=hours,
            record=series is not SeriesFormat.none,
            progress=lambda done: progress.update(task, completed=done),
            progress_every_s=max(60.0, total_s / 200.0),
            advance=advance,
            prepare=prepare,
        )
    wall = time.perf_counter() - wall0
    summary = summarize(twin, spec_sha256=digest)
    if slo_spec is not None:
        summary["alerts"] = [event_dict(a) for a in alerts]
    summary["wall_seconds"] = round(wall, 3)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    if series is not SeriesFormat.none:
        _write_series(twin, out, series, start_s, min(end_s, twin.t), selected, quiet=quiet)
    if not quiet:
        _print_summary(summary)
        if slo_spec is not None:
            _print_alerts(alerts)
        console.print(f"wrote [bold]{escape(str(out / 'summary.json'))}[/] in {wall:.2f} s wall")


def _all_series(twin: Any, start_s: float, end_s: float) -> list[Series]:
    out: list[Series] = []
    for name in twin.series_names():
        out.extend(twin.query(name, start_s=start_s, end_s=end_s))
    return out


def _write_series(
    twin: Any,
    out: Path,
    fmt: SeriesFormat,
    start_s: float,
    end_s: float,
    selected: set[str] | None,
    *,
    quiet: bool,
) -> None:
    """Stream the chosen families' series over the window into OUT, one family at a time."""
    from firedrill.adapters import outputs
    from firedrill.twin.exposition import (
        family_of,
        stream_openmetrics,
        stream_promtool_input_series,
    )

    names = list(twin.series_names())
    if selected is not None:
        names = [n for n in names if family_of(n) in selected]
        missing = sorted(selected - {family_of(n) for n in names})
        if missing and not quiet:
            err.print(
                f"no series in this run for {escape(', '.join(missing))} "
                "(the twin writes them only when something happens)",
                highlight=False,
            )
    sources = twin.store.stored(names, start_s=start_s, end_s=end_s)
    if fmt is SeriesFormat.openmetrics:
        path, chunks = out / "series.om.txt", stream_openmetrics(sources)
    else:
        path = out / "input_series.yaml"
        chunks = stream_promtool_input_series(
            sources, interval_s=twin.spec.scrape_interval_s, start_s=start_s, end_s=end_s
        )
    try:
        size = outputs.write_chunks(path, chunks)
    except FiredrillError as exc:
        raise _fail(exc) from exc
    if not quiet:
        console.print(
            f"wrote [bold]{escape(str(path))}[/] ({size / 1e6:,.1f} MB, "
            f"{start_s:g}–{end_s:g} s, "
            f"{len({family_of(n) for n in names})} families)"
        )


def _public(s: Series) -> Series:
    """Strip the store's internal family suffix ('name|variant') from a series name."""
    return Series(s.name.split("|", 1)[0], s.labels, s.t_s, s.values)


def _print_summary(summary: dict[str, Any]) -> None:
    table = Table(
        title=escape(
            f"twin {summary['fleet']}: {summary['sim_seconds']:g} s, seed {summary['seed']}"
        ),
        box=None,
        header_style="bold",
    )
    for col in ("cell", "model", "requests", "err", "p50", "p99", "queue", "util", "KV", "ready"):
        table.add_column(col, justify="left" if col in ("cell", "model") else "right")
    for name, c in summary["cells"].items():
        for model, m in c["models"].items():
            errors = m["errors"] / max(m["requests"], 1)
            table.add_row(
                escape(name),
                escape(model),
                _count(m["requests"]),
                f"{errors * 100:.2f}%",
                _ms(m["ttft_p50_s"]),
                _ms(m["ttft_p99_s"]),
                _ms(m["mean_queue_wait_s"]),
                f"{(m['utilization'] or 0) * 100:.0f}%",
                f"{(m['kv_usage_mean'] or 0) * 100:.0f}%",
                f"{m['ready_replicas_mean'] or 0:.0f}",
            )
    console.print(table)
    console.print("p50/p99: TTFT; queue: mean wait for a seat; util: of saturation throughput")
    faults = summary["gpu_fault_events"]
    console.print(
        f"GPU fault events: {sum(faults.values())} "
        f"({summary['gpu_fault_events_remediable']} remediable, "
        f"{summary['gpu_fault_events_phantom']} phantom) "
        + (", ".join(f"{k}={v}" for k, v in faults.items()) if faults else "")
    )


def _print_alerts(alerts: list[Any]) -> None:
    firing = [a for a in alerts if a.state == "firing"]
    if not firing:
        console.print("alerts: none fired")
        return
    table = Table(title="alerts fired", box=None, header_style="bold")
    for col in ("at", "alert", "severity", "cell", "slo"):
        table.add_column(col)
    for a in firing:
        table.add_row(
            f"{a.at_s:.0f} s",
            *(escape(str(x)) for x in (a.alertname, a.label("severity"), a.label("cell"))),
            escape(str(a.label("slo"))),
        )
    console.print(table)


def _count(n: int) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms"


@twin_app.command("serve")
def twin_serve(
    fleet: Annotated[Path, typer.Argument(help="Fleet spec (YAML).")],
    speed: Annotated[
        float, typer.Option(min=0.1, max=10_000, help="Simulated s per wall s.")
    ] = 1.0,
    seed: Annotated[int, typer.Option(min=0, max=SEED_MAX, help="Seed.")] = 0,
    host: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free).")] = 9400,
    hours: Annotated[
        float,
        typer.Option(
            min=0.0, help="Stop after this many simulated hours (0: run until interrupted)."
        ),
    ] = 0.0,
    control: Annotated[
        bool | None,
        typer.Option(
            "--control/--no-control",
            help="Serve the control API on /v1/ (default: on when bound to loopback only).",
        ),
    ] = None,
    token_file: Annotated[
        Path, typer.Option(help="Where to write the control API's bearer token (mode 0600).")
    ] = Path(".firedrill/twin-token"),
    manual_clock: Annotated[
        bool, typer.Option(help="Time moves only on POST /v1/advance, not with the wall clock.")
    ] = False,
) -> None:
    """Run the twin live and serve its series on /metrics for a real Prometheus to scrape."""
    from firedrill.adapters.metrics_server import MetricsServer
    from firedrill.adapters.twin_api import control_api
    from firedrill.twin.engine import Twin
    from firedrill.twin.exposition import exporter_labels, to_openmetrics, to_prometheus_text

    spec, _ = _load_fleet(fleet)
    twin = Twin(spec, seed, hours_hint=max(hours, 1.0))
    lock = threading.Lock()

    def latest() -> tuple[float, list[Series]]:
        with lock:
            t = twin.store.times[-1] if twin.store.times else 0.0
            return t, exporter_labels([_public(s) for s in _all_series(twin, t, t)])

    def render() -> str:
        _, series = latest()
        return to_prometheus_text(series)

    def render_om() -> str:
        t, series = latest()
        return to_openmetrics(series, at_s=t, with_timestamps=False)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        api = control_api(twin, lock, host=host, enabled=control, token_file=token_file)
    except FiredrillError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise typer.Exit(ExitCode.INPUT) from exc
    server = MetricsServer(
        render,
        host=host,
        port=port,
        render_openmetrics=render_om,
        api=None if api is None else api.handle,
    )
    server.start()
    console.print(f"serving [bold]{escape(spec.name)}[/] on {server.url}/metrics at {speed:g}x")
    if api is not None:
        console.print(
            f"control API on {server.url}/v1/ (bearer token in {escape(str(token_file))})"
        )
    wall0 = time.monotonic()
    try:
        while not stop.is_set():
            target = (time.monotonic() - wall0) * speed
            if hours and twin.t >= hours * 3600.0:
                break
            with lock:
                while not manual_clock and twin.t + spec.dt_s <= target:
                    twin.step()
            stop.wait(min(0.25, max(spec.dt_s / speed, 0.01)))
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        console.print(f"stopped at simulated {twin.t:.0f} s")


def _load_slo(path: Path) -> Any:
    from firedrill.detect.slo import SloSpec
    from firedrill.specfile import load_spec

    try:
        return load_spec(path, SloSpec)
    except SpecError as exc:
        raise _fail(exc) from exc


RULE_FILE = "rules.yml"
PROMETHEUS_RULE = "prometheusrule.yaml"
ALERTMANAGER = "alertmanager.yml"
SERVICE_MONITOR = "servicemonitor-vllm.yaml"
POD_MONITOR = "podmonitor-dcgm-exporter.yaml"


@rules_app.command("generate")
def rules_generate(
    slo: Annotated[Path, typer.Argument(help="SLO spec (YAML).")],
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/rules"),
    name: Annotated[str, typer.Option(help="PrometheusRule name.")] = "firedrill-slos",
    namespace: Annotated[str, typer.Option(help="PrometheusRule namespace.")] = "monitoring",
) -> None:
    """Write the PrometheusRule manifest, the plain rule file, alertmanager.yml, and the
    ServiceMonitor/PodMonitor that put cell and region on vLLM's and dcgm-exporter's series."""
    import yaml

    from firedrill.detect.alertmanager import alertmanager_yaml
    from firedrill.detect.rules import generate
    from firedrill.export.monitors import pod_monitor, service_monitor

    spec = _load_slo(slo)
    _check_outputs(directory=(out, "--out"))
    ruleset = generate(spec)
    out.mkdir(parents=True, exist_ok=True)

    def dump(data: Any) -> str:
        return str(yaml.safe_dump(data, sort_keys=False, width=1000))

    (out / RULE_FILE).write_text(dump(ruleset.rule_file()))
    (out / PROMETHEUS_RULE).write_text(
        dump(ruleset.prometheus_rule(name=name, namespace=namespace))
    )
    (out / ALERTMANAGER).write_text(alertmanager_yaml(spec.routing))
    (out / SERVICE_MONITOR).write_text(dump(service_monitor(spec.scrape)))
    (out / POD_MONITOR).write_text(dump(pod_monitor(spec.scrape)))
    n_rules = sum(len(g["rules"]) for g in ruleset.groups)
    n_alerts = sum(1 for g in ruleset.groups for r in g["rules"] if "alert" in r)
    console.print(
        f"wrote {n_rules} rules ({n_alerts} alerts) in {len(ruleset.groups)} groups to "
        f"[bold]{escape(str(out / RULE_FILE))}[/] and "
        f"[bold]{escape(str(out / PROMETHEUS_RULE))}[/]; "
        f"routing to [bold]{escape(str(out / ALERTMANAGER))}[/]; scrape labels to "
        f"[bold]{escape(str(out / SERVICE_MONITOR))}[/] and "
        f"[bold]{escape(str(out / POD_MONITOR))}[/]"
    )
    e = spec.exporters
    console.print(
        f"rules fit vLLM {e.vllm} and dcgm-exporter {e.dcgm_exporter}"
        + (f" (+ {', '.join(e.dcgm_extra_fields)})" if e.dcgm_extra_fields else "")
        + (
            "; twin-only groups included (twin_series: true), guarded by a "
            "TwinOnlySeriesAbsent ticket where the twin's series are missing"
            if spec.twin_series
            else "; twin-only groups (quality, prefill/decode, security, guardrails) left out: "
            "set twin_series: true to include them"
        ),
        markup=False,
    )
    if spec.routing.receivers.is_placeholder():
        err.print(
            "warning: alertmanager.yml sends to placeholder receivers; set routing.receivers "
            "in the SLO spec (see docs/alerting-receivers.md)",
            markup=False,
        )


@rules_app.command("check")
def rules_check(
    directory: Annotated[Path, typer.Argument(help="Directory written by 'rules generate'.")],
) -> None:
    """Check the generated files with promtool and amtool; exit 1 if either rejects them."""
    from firedrill.adapters import promtool

    missing = [f for f in (RULE_FILE, ALERTMANAGER) if not (directory / f).is_file()]
    if missing:
        err.print(
            f"[bold red]error:[/] {escape(str(directory))} lacks {', '.join(missing)}: "
            "run 'rules generate'"
        )
        raise typer.Exit(ExitCode.INPUT)
    try:
        results = [
            promtool.check_rules(directory / RULE_FILE),
            promtool.check_alertmanager(directory / ALERTMANAGER),
        ]
    except promtool.ToolError as exc:
        raise _fail(exc) from exc
    for r in results:
        mark = "[green]ok[/]" if r.ok else "[bold red]FAILED[/]"
        console.print(f"{mark} {escape(r.tool)} {escape(' '.join(r.args))}", highlight=False)
        if not r.ok:
            console.print(r.output, markup=False, highlight=False)
    if not all(r.ok for r in results):
        raise typer.Exit(ExitCode.FAILED)


@alerting_app.command("compare")
def alerting_compare(
    slo: Annotated[Path, typer.Argument(help="SLO spec (YAML).")],
    fleet: Annotated[Path, typer.Option(help="Fleet spec.")] = Path("examples/fleet.yaml"),
    seed: Annotated[
        int, typer.Option(min=0, max=SEED_MAX, help="Seed for the incident plan and the twin.")
    ] = 0,
    objective: Annotated[
        str | None, typer.Option(help="Availability objective (default: the first).")
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results as JSON.")] = None,
    html_out: Annotated[Path | None, typer.Option("--html", help="Write an HTML report.")] = None,
    quiet: Annotated[bool, typer.Option(help="No progress bar or table.")] = False,
) -> None:
    """Run the SRE workbook's six alerting strategies over generated incidents on the twin."""
    from firedrill.detect.compare import (
        availability_objective,
        compare,
        first_cell_serving,
        plan_incidents,
    )
    from firedrill.report.charts import render_html, render_table
    from firedrill.twin.engine import Twin

    spec, _ = _load_fleet(fleet)
    slo_spec = _load_slo(slo)
    _check_outputs((json_out, "--json"), (html_out, "--html"))
    quiet = quiet or any(str(p) == "-" for p in (json_out, html_out) if p is not None)
    try:
        obj = availability_objective(slo_spec, objective)
        cell = first_cell_serving(spec, obj.model)
    except FiredrillError as exc:
        raise _fail(exc) from exc
    plan = plan_incidents(seed, obj, cell=cell, period_s=slo_spec.period_s)
    twin = Twin(spec, seed, record=True, hours_hint=plan.horizon_s / 3600.0)
    with _progress("compare", quiet=quiet) as progress:
        task = progress.add_task(f"{obj.name} on {cell}", total=plan.horizon_s)
        result = compare(
            twin, plan, slo_spec, obj, progress=lambda t: progress.update(task, completed=t)
        )
    data = result.to_json()
    if json_out is not None:
        _write_output(json_out, json.dumps(data, indent=2, sort_keys=True) + "\n")
    if html_out is not None:
        _write_output(html_out, render_html(result))
    if not quiet:
        console.print(render_table(result))


@app.command()
def respond(
    scenario: Annotated[Path, typer.Argument(help="Scenario spec (YAML).")],
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the run as JSON.")] = None,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            envvar="FIREDRILL_DB",
            help="Also keep the incidents in this store: a SQLite file path, sqlite:///FILE or "
            "postgresql://USER@HOST/DB (default: not kept).",
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option(help="No progress bar or tables.")] = False,
    mode: Annotated[
        str | None,
        typer.Option(
            help="Responder mode, advise|auto: propose levers, or apply the allowed ones and "
            "verify them (default: the scenario's responder policy, else advise).",
        ),
    ] = None,
    target: Annotated[
        str | None,
        typer.Option(
            "--target", help="Run against a twin served by `twin serve` (URL), not embedded."
        ),
    ] = None,
    token_file: Annotated[
        Path, typer.Option("--token-file", help="The served twin's control token.")
    ] = Path(".firedrill/twin-token"),
    prometheus: PrometheusOption = None,
    speed: SpeedOption = None,
) -> None:
    """Run a scenario on the twin with detection and remediation; exit 1 if expectations fail.

    With --target the scenario runs against a twin served by `twin serve` (serve the scenario's
    fleet at its seed, with --manual-clock), through its control API. With --prometheus too it
    runs on a live fleet, in wall time: the timeline and levers go to the target, every signal
    is read from Prometheus."""
    if mode not in (None, "advise", "auto"):
        raise typer.BadParameter(f"--mode is advise or auto, not {mode!r}", param_hint="--mode")
    from firedrill.app.respond import load_scenario
    from firedrill.app.respond import respond as respond_use_case
    from firedrill.cli.incident import operator, print_persisted
    from firedrill.errors import StoreError

    try:
        loaded = load_scenario(scenario)
    except SpecError as exc:
        raise _fail(exc) from exc
    _check_outputs((json_out, "--json"))  # before the run, like the store
    quiet = quiet or (json_out is not None and str(json_out) == "-")
    with _progress("respond", quiet=quiet) as progress:
        task = progress.add_task(loaded.spec.name, total=loaded.spec.duration_s)
        try:
            outcome = respond_use_case(
                loaded=loaded,
                actor=operator(),
                mode="auto" if mode == "auto" else "advise" if mode == "advise" else None,
                db=db,
                progress=lambda t: progress.update(task, completed=t),
                target=target,
                token_file=token_file,
                prometheus=prometheus,
                speed=speed,
            )
        except StoreError as exc:  # before the run: a bad store is refused, nothing run
            raise _fail(exc) from exc
        except FiredrillError as exc:  # a target that cannot run it, or was lost during the run
            raise _fail(exc) from exc
    if json_out is not None:
        _write_output(json_out, outcome.report.dumps())
    if not quiet:
        _print_scenario(outcome.report.to_json())
        if (live := outcome.live) is not None:
            console.print(
                f"live: the fleet ran {live.speed:g}x the wall clock, the scenario from its "
                f"{live.offset_s:.0f} s; a step fell at most {live.max_late_s:.3g} s behind it; "
                f"readings known to {live.resolution_s:.3g} s of its time (one scrape)",
                highlight=False,
                markup=False,
            )
    if outcome.store_error is not None:
        raise _fail(outcome.store_error)
    if outcome.kept is not None and outcome.store_name is not None:
        print_persisted(outcome.kept, outcome.store_name)
    if not outcome.passed:
        raise typer.Exit(ExitCode.FAILED)


def _print_scenario(data: dict[str, Any]) -> None:
    console.print(f"[bold]{escape(data['scenario'])}[/]: {data['sim_seconds']:.0f} s simulated")
    by: dict[str, int] = {}
    for n in data["notifications"]:
        by[n["receiver"]] = by.get(n["receiver"], 0) + 1
    console.print(
        "notifications: " + (", ".join(f"{k} {v}" for k, v in sorted(by.items())) or "none")
    )
    rem = data["remediation"]
    acts: dict[str, int] = {}
    for a in rem["actions"]:
        acts[a["action"]] = acts.get(a["action"], 0) + 1
    console.print(
        "remediation: "
        + (", ".join(f"{k} {v}" for k, v in sorted(acts.items())) or "nothing")
        + (f"; blocked {len(rem['blocked'])}" if rem["blocked"] else "")
        + (" (dry-run)" if rem["dry_run"] else "")
    )
    for c in rem["chains"][:10]:
        reached = [s["name"] for s in c["stages"] if s["status"] == "ok"]
        end = f"broken at {c['broken_at']}: {c['why']}" if c["broken_at"] else "complete"
        line = f"chain {c['kind']} on {c['node']}: {' > '.join(reached)} ({end})"
        console.print(line, markup=False, highlight=False)
    if len(rem["chains"]) > 10:
        console.print(f"... and {len(rem['chains']) - 10} more chains")
    for js, t in data.get("training", {}).items():
        console.print(f"training {js}: {t.get('page', '')}", markup=False, highlight=False)
        if "rank" in t:
            console.print(
                f"  rank {t['rank']} on {t['node']}: suspended at {t['suspended_at_s']:.0f} s, "
                f"resumed from step {t['resumed_from_step']} without {', '.join(t['excluded'])}; "
                f"{t['gpu_hours_lost']:,.0f} GPU-h lost (${t['usd_lost']:,.0f})",
                markup=False,
                highlight=False,
            )
    table = Table(title="expectations", box=None, header_style="bold")
    for col in ("", "check", "expected", "observed"):
        table.add_column(col)
    for e in data["expectations"]:
        mark = "[green]PASS[/]" if e["passed"] else "[bold red]FAIL[/]"
        table.add_row(
            mark,
            *(escape(str(e[k])) for k in ("check", "expected")),
            escape(str(e["observed"])[:80]),
        )
    console.print(table)


@export_app.command("nhc")
def export_nhc(
    policy: Annotated[Path, typer.Argument(help="Remediation policy (YAML).")],
    name: Annotated[str, typer.Option(help="NodeHealthCheck name.")] = "gpu-nodes",
    cell: Annotated[str | None, typer.Option(help="Scope the selector to one cell.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write to a file instead of stdout.")] = None,
) -> None:
    """Write a NodeHealthCheck manifest equivalent to the policy (and say what it cannot hold)."""
    import yaml

    from firedrill.export.nhc import NOT_EXPRESSIBLE, node_health_check
    from firedrill.remediate.policy import PolicySpec
    from firedrill.specfile import load_spec

    try:
        spec = load_spec(policy, PolicySpec)
    except SpecError as exc:
        raise _fail(exc) from exc
    _check_outputs((out, "--out"))
    text = yaml.safe_dump(node_health_check(spec, name=name, cell=cell), sort_keys=False)
    header = "# Enforced by firedrill, not expressible in NodeHealthCheck:\n" + "".join(
        f"#   - {x}\n" for x in NOT_EXPRESSIBLE
    )
    if out is None:
        sys.stdout.write(header + text)
    else:
        _write_output(out, header + text)
        err.print(f"wrote {escape(str(out))}", highlight=False)


@audit_app.command("verify")
def audit_verify(
    db: Annotated[
        str, typer.Option("--db", help="Store URL: sqlite:///FILE or postgresql://USER@HOST/DB.")
    ] = DEFAULT_DB_URL,
    expect_head: Annotated[
        str | None,
        typer.Option(
            "--expect-head",
            help="The head hash 'audit head' printed earlier (kept outside the database): "
            "that record must still be in the log.",
        ),
    ] = None,
    expect_count: Annotated[
        int | None,
        typer.Option(
            "--expect-count",
            min=0,
            help="How many records the log held when 'audit head' was run: it holds at least "
            "as many now.",
        ),
    ] = None,
) -> None:
    """Check the audit log's hash chain; exit 1 at the first record that was tampered with.

    Without an anchor (--expect-head, --expect-count) records removed from the end of the log,
    or the whole log, cannot be told from a log that is shorter.
    """
    from firedrill.errors import StoreError
    from firedrill.store import ChainHead, audit, open_store

    if expect_head is not None and not _HASH_RE.fullmatch(expect_head.strip().lower()):
        raise typer.BadParameter("a head hash is 64 hex digits", param_hint="--expect-head")
    anchor = None
    if expect_head is not None:  # with the count too, the head must be exactly that record
        anchor = ChainHead(seq=expect_count or 0, hash=expect_head.strip().lower())
    try:
        with open_store(db, read_only=True) as store, store.session() as session:
            result = audit.verify(session, anchor=anchor, expect_count=expect_count)
    except StoreError as exc:
        raise _fail(exc) from exc
    if not result.ok:
        err.print(
            f"[bold red]TAMPERED[/] audit log of {result.records} records: "
            f"first bad record is seq {result.first_bad_seq}: {escape(str(result.problem))}",
            highlight=False,
        )
        raise typer.Exit(ExitCode.FAILED)
    if anchor is None and expect_count is None:
        console.print(
            f"[green]ok[/] audit log consistent: {result.records} records; [yellow]unanchored[/]: "
            "records removed from its end would not show (keep 'firedrill audit head' outside "
            "the database and pass --expect-head/--expect-count)",
            highlight=False,
        )
        return
    console.print(
        f"[green]ok[/] audit log intact: {result.records} records, anchor held", highlight=False
    )


_HASH_RE = re.compile(r"[0-9a-f]{64}")


@audit_app.command("head")
def audit_head(
    db: Annotated[
        str, typer.Option("--db", help="Store URL: sqlite:///FILE or postgresql://USER@HOST/DB.")
    ] = DEFAULT_DB_URL,
    as_json: Annotated[bool, typer.Option("--json", help="Print {seq, hash} as JSON.")] = False,
) -> None:
    """Print the audit log's anchor (record count and head hash) to keep outside the database.

    Pass it back later as `audit verify --expect-count SEQ --expect-head HASH`: records removed
    from the end of the log, or the whole log, then show as tampering.
    """
    from firedrill.errors import StoreError
    from firedrill.store import audit, open_store

    try:
        with open_store(db, read_only=True) as store, store.session() as session:
            head = audit.head(session)
    except StoreError as exc:
        raise _fail(exc) from exc
    seq, digest = (0, audit.GENESIS) if head is None else (head.seq, head.hash)
    if as_json:
        sys.stdout.write(json.dumps({"seq": seq, "hash": digest}) + "\n")
    else:
        sys.stdout.write(f"--expect-count {seq} --expect-head {digest}\n")


def main() -> None:
    try:
        app()
    except FiredrillError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(ExitCode.INPUT)
