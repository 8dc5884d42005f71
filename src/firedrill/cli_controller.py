"""``firedrill controller POLICY``: the GPU health controller on a cluster (thin entry point).

``register(app)`` adds the command. It loads the remediation policy, connects to the cluster
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from firedrill.errors import FiredrillError

__all__ = ["controller", "register"]

EXIT_ERROR = 4
err = Console(stderr=True)


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
        conn = connect(kubeconfig, context=context)
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
            "requests": len(conn.transport.calls),
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


def register(app: typer.Typer) -> None:
    app.command("controller")(controller)
