"""``firedrill controller POLICY`` and ``firedrill conduct DRILL``: the cluster's long-running
GPU health controller and its drill conductor (thin entry points).

``register(app)`` adds both commands. ``conduct`` creates the drill's Chaos Mesh Workflow through
the API, evaluates the drill's stop conditions on Prometheus every step (``ALERTS`` for alert
conditions, the serving series for the rest) and deletes the Workflow when one fires or at the
cap; ``gameday recover`` finishes what an interrupted conductor left. Like the controller it
advises (a server-side dry run) unless ``--apply``.

``controller`` It loads the remediation policy, connects to the cluster
(the pod's service account in a cluster, else the kubeconfig), reads DCGM series from Prometheus,
elects a leader on a Lease, serves ``/healthz``, ``/readyz`` and ``/metrics``, and ticks every
evaluation interval until SIGTERM. It advises by default: every write goes out as a server-side
dry run and nothing changes until ``--apply`` is given.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from firedrill.cli.common import ExitCode, err
from firedrill.errors import FiredrillError

__all__ = ["controller", "register"]

EXIT_ERROR = ExitCode.INPUT


def _now() -> datetime:
    return datetime.now(UTC)


def controller(
    policy: Annotated[Path, typer.Argument(help="Remediation policy (YAML).")],
    prometheus: Annotated[
        str,
        typer.Option(envvar="FIREDRILL_PROMETHEUS_URL", help="Prometheus with the DCGM series."),
    ],
    apply: Annotated[
        bool, typer.Option("--apply", help="Act for real (default: advise, dryRun=All).")
    ] = False,
    kubeconfig: Annotated[
        Path | None, typer.Option(help="Kubeconfig (default: in-cluster, else $KUBECONFIG).")
    ] = None,
    context: Annotated[str | None, typer.Option(help="Kubeconfig context.")] = None,
    identity: Annotated[
        str | None, typer.Option(envvar="POD_NAME", help="This replica's Lease identity.")
    ] = None,
    lease_namespace: Annotated[str, typer.Option(help="Namespace of the Lease.")] = (
        "firedrill-system"
    ),
    lease_name: Annotated[str, typer.Option(help="Name of the Lease.")] = "firedrill-controller",
    port: Annotated[int, typer.Option(help="Port for /healthz, /readyz and /metrics.")] = 8080,
    once: Annotated[bool, typer.Option("--once", help="One tick, print a summary, exit.")] = False,
) -> None:
    """Run the budgeted GPU health controller against a cluster, with leader election."""
    from firedrill.adapters.kubernetes.client import connect
    from firedrill.adapters.kubernetes.lease import LeaderElector, LeaseConfig
    from firedrill.adapters.kubernetes.operator import ControllerProcess, ProbeServer
    from firedrill.adapters.kubernetes.signals import PrometheusSignals
    from firedrill.remediate.policy import PolicySpec
    from firedrill.specfile import load_spec

    try:
        spec = load_spec(policy, PolicySpec)
        conn = connect(kubeconfig, context=context, keep_calls=10_000)  # runs for months
    except (FiredrillError, OSError, ValueError) as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}")
        raise typer.Exit(EXIT_ERROR) from exc
    who = identity or f"{socket.gethostname()}-{os.getpid()}"
    elector = LeaderElector(conn, who, _now, LeaseConfig(lease_namespace, lease_name))
    signals = PrometheusSignals(prometheus, now=_now, epoch=_now())
    process = ControllerProcess(spec, conn, signals, elector, now=_now, advise=not apply)
    if once:
        process.tick()
        summary = {
            "identity": who,
            "leader": elector.is_leader,
            "advise": not apply,
            "ready": process.ready(),
            "error": process.last_error,
            "requests": conn.transport.mark(),
        }
        typer.echo(json.dumps(summary, sort_keys=True))
        raise typer.Exit(0 if process.ready() else EXIT_ERROR)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    probes = ProbeServer(process, port=port).start()
    mode = "applying" if apply else "advising (dryRun=All)"
    err.print(f"controller {escape(who)} {mode}; probes and metrics on :{probes.port}")

    def sleep(seconds: float) -> None:
        stopping.wait(seconds)  # not time.sleep: SIGTERM ends the wait at once

    try:
        process.run(stopping.is_set, sleep)
    finally:
        probes.stop()


class _WallClock:
    """The ``Clock`` port on the wall clock; ``advance`` waits (and ends early on SIGTERM)."""

    def __init__(self, stopping: threading.Event) -> None:
        self.start = time.monotonic()
        self.stopping = stopping

    def now_s(self) -> float:
        return time.monotonic() - self.start

    def advance(self, seconds: float) -> None:
        self.stopping.wait(seconds)


def conduct(
    drill: Annotated[Path, typer.Argument(help="Drill spec (YAML).")],
    prometheus: Annotated[
        str,
        typer.Option(envvar="FIREDRILL_PROMETHEUS_URL", help="Prometheus for the stop conditions."),
    ],
    apply: Annotated[
        bool, typer.Option("--apply", help="Create the Workflow for real (default: dry run).")
    ] = False,
    kubeconfig: Annotated[
        Path | None, typer.Option(help="Kubeconfig (default: in-cluster).")
    ] = None,
    context: Annotated[str | None, typer.Option(help="Kubeconfig context.")] = None,
    chaos_namespace: Annotated[str, typer.Option(help="Namespace of the Workflow.")] = (
        "chaos-system"
    ),
    journal_dir: Annotated[
        Path | None, typer.Option(help="Drill journals (default: $FIREDRILL_JOURNAL_DIR).")
    ] = None,
    step_s: Annotated[float, typer.Option(help="Seconds between stop-condition checks.")] = 15.0,
    run_by: Annotated[str, typer.Option(envvar="USER", help="Who runs the drill.")] = "unknown",
) -> None:
    """Run a drill on the cluster as one Chaos Mesh Workflow, with auto-reverting stops."""
    from firedrill.adapters.journal_file import default_directory
    from firedrill.adapters.kubernetes.client import connect
    from firedrill.adapters.kubernetes.conductor import WorkflowConductor
    from firedrill.adapters.kubernetes.signals import PrometheusSignals
    from firedrill.drill.observe import Observer
    from firedrill.drill.stop import StopConditions
    from firedrill.export.chaos_mesh import ChaosMeshOptions, chaos_workflow
    from firedrill.specfile import load_drill

    try:
        loaded = load_drill(drill)
        export = chaos_workflow(
            loaded.spec, loaded.fleet, options=ChaosMeshOptions(chaos_namespace=chaos_namespace)
        )
        conn = connect(kubeconfig, context=context)
    except (FiredrillError, OSError, ValueError) as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}")
        raise typer.Exit(EXIT_ERROR) from exc
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    clock = _WallClock(stopping)
    signals = PrometheusSignals(prometheus, now=_now, epoch=_now())
    observer = Observer(signals, loaded.spec.target.model, [r.name for r in loaded.fleet.regions])

    def firing() -> list[tuple[tuple[str, str], ...]]:
        _, labels, _values = signals.instant("ALERTS", {"alertstate": "firing"})
        return list(labels)

    stops = StopConditions(loaded.spec.stop_conditions, observer, signals, clock.now_s, firing)

    def stop(t_s: float) -> str | None:
        if stopping.is_set():
            return "SIGTERM"
        observer.sample(t_s)
        fired = stops.check(t_s)
        return None if fired is None else fired.name

    conductor = WorkflowConductor(
        conn, clock, journal_dir or default_directory(), step_s=step_s, dry_run=not apply
    )
    try:
        result = conductor.run(loaded.spec, export, stop, run_by=run_by)
    except FiredrillError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}")
        raise typer.Exit(EXIT_ERROR) from exc
    typer.echo(
        json.dumps(
            {
                "workflow": f"{result.namespace}/{result.workflow}",
                "created": result.created,
                "deleted": result.deleted,
                "stopped_by": result.stopped_by,
                "at_s": round(result.at_s, 3),
                "verdict": result.verdict,
                "journal": str(result.journal),
            },
            sort_keys=True,
        )
    )
    raise typer.Exit(3 if result.stopped_by is not None else 0)


def register(app: typer.Typer) -> None:
    """Add ``controller`` and ``conduct`` to the CLI."""
    app.command("controller")(controller)
    app.command("conduct")(conduct)
