"""``firedrill twin calibrate``: fit a fleet spec to a real fleet's Prometheus.

Parses the options, reads the window through the Prometheus adapter, fits with the pure
``firedrill.calibrate`` functions, writes the calibrated spec (YAML, the schema ``twin run`` and
drills load) and prints the fit quality per parameter; ``--json`` writes the same report.
"""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from firedrill.cli.common import group
from firedrill.errors import FiredrillError

# emoji off: a parameter note such as "a:b:c" must print as written, not as ":b:" emoji
err = Console(stderr=True, emoji=False)
console = Console(emoji=False)
EXIT_ERROR = 4  # spec and other errors (DESIGN.md's exit codes)


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` to the ``twin`` group of the root app."""
    group(app, "twin", "Run the built-in digital twin of a GPU fleet.").command("calibrate")(
        calibrate
    )


def _seconds(text: str, option: str) -> float:
    from firedrill.detect.slo import duration_s

    try:
        value = duration_s(text)
    except ValueError as exc:
        raise typer.BadParameter(
            f"{text!r} is not a duration like 90s, 15m, 7d", param_hint=option
        ) from exc
    if value <= 0:
        raise typer.BadParameter("must be positive", param_hint=option)
    return value


def _end(text: str | None) -> float:
    if text is None:
        return time.time()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise typer.BadParameter(
            f"{text!r} is neither Unix seconds nor an RFC 3339 time", param_hint="--end"
        ) from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.4g}"


def _error(p: object) -> str:
    from firedrill.calibrate.fleet import Fitted

    assert isinstance(p, Fitted)
    if p.error_kind == "poisson_95":
        return f"95% [{_fmt(p.low)}, {_fmt(p.high)}]"
    if p.error is None or p.error_kind in ("none", "exact"):
        return "exact" if p.error_kind == "exact" else "-"
    if p.error_kind == "abs_stderr":
        return f"±{p.error:.3g}"
    return f"{p.error:.1%} ({p.error_kind})"


def calibrate(
    prometheus: Annotated[str, typer.Option(help="Prometheus URL, e.g. http://127.0.0.1:9090.")],
    base: Annotated[
        Path,
        typer.Option(
            help="Fleet spec (YAML) whose unfitted fields are kept: digests, bundles, node pools' "
            "hardware, registries, services."
        ),
    ],
    out: Annotated[Path, typer.Option(help="Calibrated fleet spec (YAML) to write.")],
    window: Annotated[str, typer.Option(help="How far back to fit, e.g. 7d.")] = "7d",
    step: Annotated[str, typer.Option(help="Query resolution, e.g. 60s.")] = "60s",
    end: Annotated[
        str | None, typer.Option(help="Window end: Unix seconds or RFC 3339 (default: now).")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the fit report as JSON.")
    ] = None,
) -> None:
    """Fit a fleet spec to a real fleet's Prometheus and report the fit per parameter."""
    from firedrill.adapters import outputs
    from firedrill.adapters.calibration_source import read_observations
    from firedrill.calibrate.fleet import calibrate_fleet
    from firedrill.calibrate.report import report_json
    from firedrill.specfile import load_fleet

    window_s = _seconds(window, "--window")
    step_s = _seconds(step, "--step")
    end_s = _end(end)
    try:
        outputs.check_file(out, "--out")
        outputs.check_file(json_out, "--json")
        base_spec = load_fleet(base)
        obs = read_observations(prometheus, end_unix_s=end_s, window_s=window_s, step_s=step_s)
        result = calibrate_fleet(base_spec, obs)
    except FiredrillError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(EXIT_ERROR) from exc
    table = Table(title=escape(f"calibration of {result.fleet.name} from {prometheus}"))
    for col in ("parameter", "base", "fitted", "unit", "error", "samples", "note"):
        table.add_column(col, overflow="fold")
    for p in result.parameters:
        table.add_row(
            escape(p.parameter),
            _fmt(p.base),
            _fmt(p.value) if p.fitted else "[dim]kept[/dim]",
            escape(p.unit),
            escape(_error(p)),
            str(p.samples),
            escape(p.note),
        )
    console.print(table)
    console.print(
        f"{len(result.fitted)} parameters fitted, {len(result.not_fitted)} kept from the base"
    )
    header = (
        f"# Calibrated by `firedrill twin calibrate` from {prometheus} over "
        f"{datetime.fromtimestamp(result.start_unix_s, UTC).isoformat()} to "
        f"{datetime.fromtimestamp(result.end_unix_s, UTC).isoformat()} (base: {base.name}).\n"
    )
    document = result.fleet.model_dump(mode="json", exclude_defaults=True)
    try:
        outputs.write(out, header + yaml.safe_dump(document, sort_keys=False))
        if json_out is not None:
            outputs.write(json_out, json.dumps(report_json(result), indent=2) + "\n")
    except FiredrillError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(EXIT_ERROR) from exc
