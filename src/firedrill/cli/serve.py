"""``firedrill serve``: parse options, build the service and its adapters, run uvicorn.

Everything the service decides lives in ``firedrill.app.serve``; the HTTP face in
``firedrill.web``. This module only wires the adapters the options name: the store (SQLite file
or PostgreSQL URL), Prometheus (the verification probe), the fleet's control endpoint (a served
twin today) and the clock (the fleet's own when it has one, else the wall clock).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from firedrill.errors import FiredrillError

DEFAULT_DB = "sqlite:///firedrill.db"
err = Console(stderr=True)
console = Console()


def register(app: typer.Typer) -> None:
    """Add ``serve`` to the ``firedrill`` command."""
    app.command("serve")(serve)


def serve(
    tokens: Annotated[
        Path, typer.Option(help="Tokens file (YAML): token SHA-256 -> person and roles.")
    ],
    db: Annotated[str, typer.Option(help="Store: sqlite:///FILE or postgresql://...")] = DEFAULT_DB,
    host: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port.")] = 8080,
    prometheus: Annotated[
        str | None, typer.Option(help="Prometheus URL: verification reads burn rates there.")
    ] = None,
    slo: Annotated[
        Path | None, typer.Option(help="SLO spec (YAML): the SLIs verification evaluates.")
    ] = None,
    fleet_spec: Annotated[
        Path | None,
        typer.Option(
            "--fleet-spec",
            help="Fleet spec (YAML): the GPU-hour price the severity's cost axis uses.",
        ),
    ] = None,
    fleet_url: Annotated[
        str | None, typer.Option(help="Fleet control endpoint (firedrill twin serve's URL).")
    ] = None,
    fleet_token_file: Annotated[
        Path | None, typer.Option(help="Bearer token of the fleet control endpoint.")
    ] = None,
    alertmanager: Annotated[
        str | None,
        typer.Option(help="Alertmanager URL: on start, catch up with the alerts firing there."),
    ] = None,
    policy: Annotated[
        Path | None, typer.Option(help="Responder policy (YAML); advise mode unless it says.")
    ] = None,
    tick: Annotated[float, typer.Option(min=0.0, help="Responder period, seconds (0: off).")] = 2.0,
    verify_burn_window: Annotated[
        str, typer.Option(help="PromQL range the verification burn rate is read over.")
    ] = "5m",
    verify_window: Annotated[
        float, typer.Option(min=1.0, help="Seconds (service clock) a pull has to clear the burn.")
    ] = 600.0,
    max_body: Annotated[int, typer.Option(min=1024, help="Largest request body, bytes.")] = 1 << 20,
    max_pending: Annotated[
        int, typer.Option(min=1, help="Webhook calls queued before answering 503.")
    ] = 64,
    body_timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds a client may take to send its body.")
    ] = 10.0,
    migrate: Annotated[bool, typer.Option(help="Migrate the store to the latest schema.")] = True,
) -> None:
    """Receive Alertmanager webhooks, open incidents, propose levers; pull them on approval."""
    import uvicorn

    from firedrill.adapters.alertmanager import AlertmanagerClient
    from firedrill.adapters.clock import WallClock
    from firedrill.adapters.prometheus import PrometheusSignals
    from firedrill.adapters.remote_twin import RemoteTwin, load_token
    from firedrill.app.serve import IncidentService, ServeSettings, SloBurnProbe
    from firedrill.detect.slo import SloSpec
    from firedrill.ports import Clock
    from firedrill.respond.responder import ResponderPolicy
    from firedrill.respond.severity import severity_for
    from firedrill.specfile import load_fleet, load_spec
    from firedrill.store import open_store
    from firedrill.web import WebSettings, create_app
    from firedrill.web.auth import Tokens

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        token_map = Tokens.load(tokens)
        store = open_store(db)
        if migrate:
            store.migrate()
        the_policy = load_spec(policy, ResponderPolicy) if policy else ResponderPolicy()
        slo_spec = load_spec(slo, SloSpec) if slo else None
        severity = severity_for(load_fleet(fleet_spec).gpu_hour_usd if fleet_spec else 2.0)
        twin = None
        if fleet_url:
            twin = RemoteTwin(fleet_url, load_token(fleet_token_file))
        clock: Clock = twin if twin is not None else WallClock()
        prom = PrometheusSignals(prometheus) if prometheus else None
        probe_factory = None
        if prom is not None and slo_spec is not None:
            spec, p = slo_spec, prom

            def probe_factory(firing):  # type: ignore[no-untyped-def]
                return SloBurnProbe(p, spec, window=verify_burn_window, firing=firing)

        service = IncidentService(
            store,
            clock=clock,
            settings=ServeSettings(
                policy=the_policy, verify_window_s=verify_window, severity=severity
            ),
            fleet=twin,
            # a served twin keeps its own clock: its series are read through it, Prometheus's
            # wall-clock windows then serve verification only
            signals=twin if twin is not None else prom,
            probe_factory=probe_factory,
            alertmanager=AlertmanagerClient(alertmanager) if alertmanager else None,
        )
        app = create_app(
            WebSettings(
                tokens=token_map,
                max_body_bytes=max_body,
                body_timeout_s=body_timeout,
                max_pending=max_pending,
                tick_s=tick,
            ),
            service,
        )
    except FiredrillError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}")
        raise typer.Exit(4) from exc
    mode = the_policy.mode
    console.print(
        f"firedrill serve on http://{host}:{port} ({mode} mode, store {escape(store.name)})",
        highlight=False,
    )
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        timeout_keep_alive=5,  # seconds an idle keep-alive connection is held
        limit_concurrency=max_pending * 4,  # beyond this uvicorn answers 503 itself
        backlog=2048,
    )
