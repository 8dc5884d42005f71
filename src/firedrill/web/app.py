"""``create_app(settings)``: the FastAPI application of ``firedrill serve``.

Routes (all under ``/api/v1`` need a bearer token; see ``web/auth.py``):

- ``POST /api/v1/alerts/webhook``  Alertmanager's webhook (v4); role ``webhook``
- ``GET  /api/v1/incidents``  list, newest first (``status``, ``cell``, ``region``, ``sev``,
  ``limit``, ``offset``); ``GET /api/v1/incidents/{id}`` one incident with its four-axis
  severity, ranked suspects, levers (guard checks, roles needed, approvals) and timeline
- ``GET  /api/v1/incidents/{id}/timeline``, ``/levers``, ``/alerts``
- ``POST /api/v1/levers/{id}/approve`` (the last approval pulls it), ``/pull``, ``/undo``
- ``GET|POST /api/v1/incidents/{id}/comms``, ``GET|POST /api/v1/incidents/{id}/handoffs``
- ``GET|POST /api/v1/incidents/{id}/postmortem`` (written once resolved, by the IC)
- ``GET  /api/v1/incidents/{id}/breakglass``; ``POST .../breakglass`` (a request) and
  ``POST /api/v1/breakglass/{request}/approve`` (two people, not the requester)
- ``GET  /api/v1/drills``, ``GET /api/v1/ladder``
- ``GET  /api/v1/events``  server-sent events of incident, timeline and lever changes
- ``/ui/...`` the browser pages (``web/ui.py``: session cookie from a login form, CSRF tokens)
- ``GET  /api/v1/status`` (mode, open incidents, last evaluation, dependencies up or down);
  ``GET  /api/v1/whoami``; ``GET /metrics`` (role ``metrics`` or any reader);
  ``GET /healthz`` and ``/readyz`` (no token: they reveal nothing)

Limits: request bodies over ``max_body_bytes`` get 413; a client that takes longer than
``body_timeout_s`` to send its body gets 408; when more than ``max_pending`` webhook calls are
waiting for their commit, the next ones get 503 with ``Retry-After`` (Alertmanager retries
a 5xx; nothing is lost, nothing is half-stored).

Webhook calls are validated on the event loop (a bad one gets its 4xx before it is queued), then
committed by one writer in groups (``app/group_commit.py``): the 2xx goes out once the call's
group is committed, never before.
"""

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from firedrill import __version__
from firedrill.app.group_commit import GroupCommit
from firedrill.app.serve import (
    BreakGlassRead,
    IncidentDetail,
    IncidentRead,
    IncidentService,
    IngestResult,
    LeverRead,
    ServeError,
    StatusRead,
    TimelineRead,
)
from firedrill.app.webhook import WebhookPayload
from firedrill.errors import FiredrillError, StoreError
from firedrill.store import drills
from firedrill.store.ladder import runs as ladder_runs
from firedrill.web import operations as ops
from firedrill.web.auth import Principal, Tokens
from firedrill.web.events import EventHub
from firedrill.web.operations import (
    CommsBody,
    CommsRead,
    GrantRead,
    HandoffBody,
    HandoffRead,
    PostmortemBody,
    PostmortemRead,
)

log = logging.getLogger("firedrill.serve")


@dataclass
class WebSettings:
    """What the HTTP layer enforces, and how often the responder runs."""

    tokens: Tokens
    max_body_bytes: int = 1 << 20  # 1 MiB: about 1,000 alerts
    body_timeout_s: float = 10.0  # a client sending its body slower than this gets 408
    max_pending: int = 64  # webhook calls waiting for their commit before 503
    tick_s: float = 2.0  # responder evaluation period (wall seconds); 0: never
    extra: dict[str, Any] = field(default_factory=dict)


# --- limits ------------------------------------------------------------------------------------


class _Limits:
    """Pure ASGI middleware: body size cap (413) and slow-body timeout (408)."""

    def __init__(self, app: ASGIApp, *, max_body: int, timeout_s: float) -> None:
        self.app = app
        self.max_body = max_body
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            await _plain(send, 413, f"request body over {self.max_body} bytes")
            return
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                message = await asyncio.wait_for(receive(), max(left, 0.001))
            except TimeoutError:
                await _plain(send, 408, f"request body not received within {self.timeout_s:g} s")
                return
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_body:
                await _plain(send, 413, f"request body over {self.max_body} bytes")
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _plain(send: Send, status: int, detail: str) -> None:
    body = ('{"detail": "' + detail.replace('"', "'") + '"}').encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
        }
    )
    await send({"type": "http.response.body", "body": body})


# --- metrics -----------------------------------------------------------------------------------


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "firedrill_serve_http_requests", "HTTP requests answered", ["route", "code"], registry=r
        )
        self.latency = Histogram(
            "firedrill_serve_http_request_duration_seconds",
            "Time to answer an HTTP request",
            ["route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.alerts = Counter(
            "firedrill_serve_webhook_alerts",
            "Alert events received by the webhook, new or duplicate",
            ["result"],
            registry=r,
        )
        self.rejected = Counter(
            "firedrill_serve_webhook_rejected",
            "Webhook calls refused",
            ["reason"],
            registry=r,
        )
        self.pending = Gauge(
            "firedrill_serve_webhook_pending", "Webhook calls waiting or in progress", registry=r
        )
        self.ticks = Counter(
            "firedrill_serve_ticks", "Responder evaluations", ["result"], registry=r
        )
        self.subscribers = Gauge(
            "firedrill_serve_event_subscribers", "Open server-sent event streams", registry=r
        )


class _Measure:
    """Pure ASGI middleware: request count and latency per route (no extra task per request)."""

    def __init__(self, app: ASGIApp, *, metrics: _Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", "other")
            self.metrics.latency.labels(route).observe(time.perf_counter() - start)
            self.metrics.requests.labels(route, str(status)).inc()


# --- request and answer bodies ---------------------------------------------------------------


class ApproveBody(BaseModel):
    comment: str = Field(default="", max_length=2000)


class BreakGlassBody(BaseModel):
    identity: str = Field(min_length=1, max_length=200)
    scope: str = Field(min_length=1, max_length=200)
    reason: str = Field(min_length=1, max_length=2000)
    ttl_s: float = Field(default=3600.0, gt=0, le=4 * 3600)


class _Row(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class DrillRead(_Row):
    id: int
    name: str
    rung: int
    model: str
    verdict: str
    run_by: str
    at_s: float
    started_at: str | None


class LadderRead(_Row):
    drill: str
    model: str
    rung: int
    verdict: str
    run_by: str
    started_at: datetime


class Who(BaseModel):
    person: str
    roles: list[str]


# --- the app -----------------------------------------------------------------------------------


def create_app(settings: WebSettings, service: IncidentService) -> FastAPI:
    """The application: routes, auth, limits, metrics and the responder loop."""
    hub = EventHub()
    metrics = _Metrics()
    pending = 0
    pending_lock = threading.Lock()
    stop = threading.Event()
    writer: GroupCommit[IngestResult] = GroupCommit(service)
    prior_sink = service._emit

    def sink(kind: str, incident: str | None, data: Any) -> None:
        prior_sink(kind, incident, data)  # type: ignore[arg-type]
        hub.publish(kind, incident, data)

    service._emit = sink

    def loop() -> None:
        while not stop.wait(settings.tick_s):
            try:
                service.tick()
                metrics.ticks.labels("ok").inc()
            except FiredrillError as exc:
                metrics.ticks.labels("error").inc()
                log.warning("responder evaluation failed: %s", exc)
            except Exception:
                metrics.ticks.labels("crash").inc()
                log.exception("responder evaluation crashed")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(service.start)
        writer.start()
        worker = None
        if settings.tick_s > 0:
            worker = threading.Thread(target=loop, name="firedrill-responder", daemon=True)
            worker.start()
        try:
            yield
        finally:
            stop.set()
            await run_in_threadpool(writer.stop)
            if worker is not None:
                worker.join(timeout=30)

    app = FastAPI(
        title="firedrill serve",
        version=__version__,
        description="Alertmanager webhook in, incidents and lever proposals out; people decide.",
        lifespan=lifespan,
    )
    app.add_middleware(_Limits, max_body=settings.max_body_bytes, timeout_s=settings.body_timeout_s)

    app.add_middleware(_Measure, metrics=metrics)

    @app.exception_handler(ServeError)
    async def _serve_error(_: Request, exc: ServeError) -> JSONResponse:
        headers = {"Retry-After": "2"} if exc.status == 503 else None
        return JSONResponse({"detail": str(exc)}, status_code=exc.status, headers=headers)

    @app.exception_handler(StoreError)
    async def _store_error(_: Request, exc: StoreError) -> JSONResponse:
        text = str(exc)
        status = 404 if text.startswith("no incident") else 503
        headers = {"Retry-After": "5"} if status == 503 else None
        return JSONResponse({"detail": text}, status_code=status, headers=headers)

    @app.exception_handler(FiredrillError)
    async def _firedrill_error(_: Request, exc: FiredrillError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=502)

    def principal(request: Request) -> Principal:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise HTTPException(
                401, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"}
            )
        who = settings.tokens.who(token.strip())
        if who is None:
            raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
        return who

    Caller = Annotated[Principal, Depends(principal)]

    def reader(p: Caller) -> Principal:
        if not p.can_read:
            raise HTTPException(403, f"{p.person} may not read incidents")
        return p

    def decider(p: Caller) -> Principal:
        if not p.can_decide:
            raise HTTPException(403, f"{p.person} holds no incident role")
        return p

    Reader = Annotated[Principal, Depends(reader)]
    Decider = Annotated[Principal, Depends(decider)]

    # --- probes and metrics ---------------------------------------------------------------

    @app.get("/healthz", tags=["probes"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["probes"])
    def readyz() -> JSONResponse:
        if not service.ready:
            return JSONResponse({"status": "starting"}, status_code=503)
        try:
            service.store.revision()
        except StoreError as exc:
            return JSONResponse({"status": "store unreachable", "detail": str(exc)}, 503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", tags=["probes"])
    def metrics_page(p: Caller) -> Response:
        if not (p.can_read or "metrics" in p.roles):
            raise HTTPException(403, f"{p.person} may not scrape metrics")
        metrics.subscribers.set(hub.subscribers)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/v1/status", response_model=StatusRead, tags=["probes"])
    def status(_: Reader) -> StatusRead:
        return service.status()

    @app.get("/api/v1/whoami", response_model=Who, tags=["auth"])
    def whoami(p: Caller) -> Who:
        return Who(person=p.person, roles=sorted(p.roles))

    # --- the webhook ----------------------------------------------------------------------

    @app.post("/api/v1/alerts/webhook", response_model=IngestResult, tags=["alerts"])
    async def webhook(request: Request, p: Caller) -> Any:
        nonlocal pending
        if "webhook" not in p.roles:
            raise HTTPException(403, f"{p.person} may not post alerts (role webhook)")
        body = await request.body()
        try:
            payload = WebhookPayload.model_validate_json(body)
        except ValidationError as exc:
            metrics.rejected.labels("invalid").inc()
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "body"
            errors = [
                {"loc": [str(x) for x in e["loc"]], "msg": str(e["msg"]), "type": str(e["type"])}
                for e in exc.errors()[:20]
            ]
            return JSONResponse(
                {"detail": f"{where}: {first['msg']}", "errors": errors},
                status_code=422,
            )
        with pending_lock:
            if pending >= settings.max_pending:
                metrics.rejected.labels("busy").inc()
                return JSONResponse(
                    {"detail": f"{pending} webhook calls already waiting: retry later"},
                    status_code=503,
                    headers={"Retry-After": "1"},
                )
            pending += 1
            metrics.pending.set(pending)
        try:
            result = await asyncio.wrap_future(writer.submit(payload))
        finally:
            with pending_lock:
                pending -= 1
                metrics.pending.set(pending)
        metrics.alerts.labels("new").inc(result.new)
        metrics.alerts.labels("duplicate").inc(result.duplicates)
        return result

    # --- incidents ------------------------------------------------------------------------

    @app.get("/api/v1/incidents", response_model=list[IncidentRead], tags=["incidents"])
    def list_incidents(
        _: Reader,
        status: Annotated[str | None, Query(pattern="^(open|mitigated|resolved)$")] = None,
        cell: Annotated[str | None, Query(max_length=200)] = None,
        region: Annotated[str | None, Query(max_length=200)] = None,
        sev: Annotated[int | None, Query(ge=1, le=4)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> list[IncidentRead]:
        return service.list_incidents(
            status=status, cell=cell, region=region, sev=sev, limit=limit, offset=offset
        )

    @app.get("/api/v1/incidents/{incident_id}", response_model=IncidentDetail, tags=["incidents"])
    def get_incident(incident_id: str, _: Reader) -> IncidentDetail:
        return service.incident(incident_id)

    @app.get(
        "/api/v1/incidents/{incident_id}/timeline",
        response_model=list[TimelineRead],
        tags=["incidents"],
    )
    def get_timeline(incident_id: str, _: Reader) -> list[TimelineRead]:
        return service.timeline_of(incident_id)

    @app.get(
        "/api/v1/incidents/{incident_id}/levers", response_model=list[LeverRead], tags=["levers"]
    )
    def get_levers(incident_id: str, _: Reader) -> list[LeverRead]:
        return service.levers_of(incident_id)

    @app.post("/api/v1/levers/{lever_id}/approve", response_model=LeverRead, tags=["levers"])
    def approve(lever_id: int, p: Decider, body: ApproveBody | None = None) -> LeverRead:
        return service.approve(lever_id, person=p.person, roles=p.roles)

    @app.post("/api/v1/levers/{lever_id}/pull", response_model=LeverRead, tags=["levers"])
    def pull(lever_id: int, _: Decider) -> LeverRead:
        return service.pull(lever_id)

    @app.post("/api/v1/levers/{lever_id}/undo", response_model=LeverRead, tags=["levers"])
    def undo(lever_id: int, p: Decider) -> LeverRead:
        return service.undo(lever_id, person=p.person)

    @app.get("/api/v1/levers/{lever_id}", response_model=LeverRead, tags=["levers"])
    def get_lever(lever_id: int, _: Reader) -> LeverRead:
        return service.lever(lever_id)

    # --- comms, handoffs, break-glass, postmortems ------------------------------------------

    @app.get(
        "/api/v1/incidents/{incident_id}/comms", response_model=list[CommsRead], tags=["comms"]
    )
    def get_comms(incident_id: str, _: Reader) -> list[CommsRead]:
        return ops.comms_of(service, incident_id)

    @app.post(
        "/api/v1/incidents/{incident_id}/comms",
        response_model=CommsRead,
        status_code=201,
        tags=["comms"],
    )
    def post_comms(incident_id: str, body: CommsBody, p: Decider) -> CommsRead:
        return ops.post_comms(service, hub, p, incident_id, body)

    @app.get(
        "/api/v1/incidents/{incident_id}/handoffs",
        response_model=list[HandoffRead],
        tags=["handoffs"],
    )
    def get_handoffs(incident_id: str, _: Reader) -> list[HandoffRead]:
        return ops.handoffs_of(service, incident_id)

    @app.post(
        "/api/v1/incidents/{incident_id}/handoffs",
        response_model=HandoffRead,
        status_code=201,
        tags=["handoffs"],
    )
    def post_handoff(incident_id: str, body: HandoffBody, p: Decider) -> HandoffRead:
        return ops.post_handoff(service, hub, p, incident_id, body)

    @app.get(
        "/api/v1/incidents/{incident_id}/breakglass",
        response_model=list[GrantRead],
        tags=["break-glass"],
    )
    def get_breakglass(incident_id: str, _: Reader) -> list[GrantRead]:
        return ops.grants_of(service, incident_id)

    @app.post(
        "/api/v1/incidents/{incident_id}/breakglass",
        response_model=BreakGlassRead,
        status_code=201,
        tags=["break-glass"],
    )
    def request_breakglass(incident_id: str, body: BreakGlassBody, p: Decider) -> BreakGlassRead:
        return service.breakglass_request(
            incident_id,
            person=p.person,
            identity=body.identity,
            scope=body.scope,
            reason=body.reason,
            ttl_s=body.ttl_s,
        )

    @app.post(
        "/api/v1/breakglass/{request_id}/approve",
        response_model=BreakGlassRead,
        tags=["break-glass"],
    )
    def approve_breakglass(request_id: str, p: Decider) -> BreakGlassRead:
        return service.breakglass_approve(request_id, person=p.person, roles=p.roles)

    @app.get(
        "/api/v1/incidents/{incident_id}/postmortem",
        response_model=PostmortemRead,
        tags=["postmortems"],
    )
    def get_postmortem(incident_id: str, _: Reader) -> PostmortemRead:
        pm = ops.postmortem_of(service, incident_id)
        if pm is None:
            raise HTTPException(404, f"{incident_id} has no postmortem")
        return pm

    @app.post(
        "/api/v1/incidents/{incident_id}/postmortem",
        response_model=PostmortemRead,
        status_code=201,
        tags=["postmortems"],
    )
    def post_postmortem(incident_id: str, body: PostmortemBody, p: Decider) -> PostmortemRead:
        return ops.write_postmortem(service, hub, p, incident_id, body)

    # --- drills and the ladder ---------------------------------------------------------------

    @app.get("/api/v1/drills", response_model=list[DrillRead], tags=["drills"])
    def get_drills(
        _: Reader, model: Annotated[str | None, Query(max_length=200)] = None
    ) -> list[DrillRead]:
        with service.store.session() as s:
            return [DrillRead.model_validate(d) for d in drills.list(session=s, model=model)]

    @app.get("/api/v1/ladder", response_model=list[LadderRead], tags=["drills"])
    def get_ladder(
        _: Reader, model: Annotated[str | None, Query(max_length=200)] = None
    ) -> list[LadderRead]:
        with service.store.session() as s:
            return [LadderRead.model_validate(r) for r in ladder_runs(session=s, model=model)]

    # --- events ----------------------------------------------------------------------------

    @app.get("/api/v1/events", tags=["events"])
    def events(
        request: Request,
        _: Reader,
        incident: Annotated[str | None, Query(max_length=32)] = None,
    ) -> StreamingResponse:
        raw = request.headers.get("last-event-id", "")
        last = int(raw) if raw.isdigit() else None
        return StreamingResponse(
            hub.stream(last, incident=incident),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    from firedrill.web.ui import mount_ui  # the pages import Jinja2; the API alone does not

    app.state.sessions = mount_ui(app, service=service, hub=hub, tokens=settings.tokens)
    app.state.hub = hub
    app.state.service = service
    app.state.metrics = metrics
    return app
