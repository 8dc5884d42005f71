"""The browser face of ``firedrill serve``: server-rendered pages with htmx, beside the JSON API.

Why server-rendered templates with htmx rather than a single-page app: the pages are mostly
tables and forms an incident commander reads under stress, so HTML from the server is what
they need; every page works with JavaScript off (forms post, the server redirects back); htmx
(one vendored file, see ``static/VENDORED.md``) only swaps fragments in place and the 40-line
``firedrill.js`` turns the server-sent event stream into fragment refreshes. There is no build
step and nothing is fetched from a CDN.

Every read and write goes through the same use cases as ``/api/v1`` (``IncidentService`` and
``web/operations.py``): an approval refused to the API is refused here with the same reason and
status. Who is asking comes from a session (``web/session.py``) opened by typing a bearer token
into the login form; every POST carries the session's CSRF token. Jinja autoescaping is on for
every template, so user text (titles, comms, reasons) is never markup.

Routes (``/ui``): ``login`` ``logout``; ``board`` (+ ``board/rows`` fragment);
``incidents/{id}`` (+ ``/part/{timeline|levers|comms|breakglass|head}`` fragments);
``levers/{id}/{approve|pull|undo}``; ``incidents/{id}/{comms|preview|handoff|breakglass|
postmortem}``; ``breakglass`` and ``breakglass/{request}/approve``; ``gamedays`` and
``gamedays/runs/{id}/report``; ``events`` (the event stream, session-authenticated).
"""

import math
import re
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final
from urllib.parse import quote

from fastapi import APIRouter, Depends, FastAPI, Form, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from pydantic import ValidationError

from firedrill.app.serve import IncidentDetail, IncidentService, ServeError
from firedrill.detect.promql import bucket_quantile
from firedrill.drill.ladder import standings
from firedrill.drill.report import render_html as render_drill_html
from firedrill.errors import FiredrillError, StoreError
from firedrill.report.charts import format_duration
from firedrill.report.drill_charts import Marker, Panel, Series, time_series_chart
from firedrill.respond.comms import CommsError, CommsPlan, redact, status_page_entry
from firedrill.respond.severity import AXES, Sev
from firedrill.store import board as store_board
from firedrill.store import drills, timeline
from firedrill.store import findings as action_items
from firedrill.store.ladder import runs as ladder_runs
from firedrill.store.models import Role
from firedrill.web import operations as ops
from firedrill.web.auth import Tokens
from firedrill.web.events import EventHub
from firedrill.web.session import COOKIE, CSRF_FIELD, CSRF_HEADER, Session, Sessions

HERE: Final = Path(__file__).resolve().parent
LOGIN_COOKIE: Final = "firedrill_login"  # double-submit CSRF token of the login form
BOARD_PAGE: Final = 100  # incidents per board page: a commander reads the top, filters the rest
PARTS: Final = ("head", "timeline", "levers", "comms", "breakglass")
PROBE_SERIES: Final = "firedrill_probe_ttft_seconds"  # the synthetic probe, per model × region
TTFT_BUCKETS: Final = "vllm:time_to_first_token_seconds_bucket"  # per replica, labelled by cell
AUDIT_QUERY: Final = "firedrill audit (incident channel originals)"
# Content-Security-Policy of every page: scripts and styles from firedrill only (the charts are
# inline SVG with presentation attributes); no framing by other sites.
CSP: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'self'; form-action 'self'; base-uri 'none'"
)
REPORT_CSP: Final = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'self'; "
    "base-uri 'none'; form-action 'none'"
)


class LoginRequired(Exception):
    """A page asked for without a session: the browser is sent to the login form."""

    def __init__(self, next_url: str) -> None:
        self.next_url = next_url


@dataclass(frozen=True)
class BoardRow:
    """One line of the incident board."""

    id: str
    title: str
    sev: int
    status: str
    cell: str
    region: str
    kind: str | None
    deciding_axis: str | None
    age_s: float
    commander: str | None
    next_due_s: float | None  # service clock; None: the level has no update deadline


@dataclass(frozen=True)
class Preview:
    """The public status-page entry a draft would become, or why it is withheld."""

    ok: bool
    product: str
    region: str
    text: str  # the entry, or the reason it is withheld (never the forbidden words)
    redacted: tuple[str, ...] = ()


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "—"
    return format_duration(max(seconds, 0.0))


def _clock(at_s: float | None) -> str:
    """``HH:MM:SS`` of a service-clock time (seconds since its epoch: the twin's midnight or
    1970-01-01 UTC on the wall clock)."""
    if at_s is None or not math.isfinite(at_s):
        return "—"
    whole = int(at_s) % 86400
    return f"{whole // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def next_update_due(sev: int, opened_at_s: float, updates: list[tuple[float, str]]) -> float | None:
    """When the next incident-channel update is due, by the comms rules of ``respond.comms``."""
    plan = CommsPlan("board", Sev(sev), opened_at_s)
    for at_s, text in updates:
        if at_s >= opened_at_s and text.strip():
            try:
                plan.post(text, at_s)
            except (CommsError, ValueError):
                continue
    return plan.next_update_due_s


def public_preview(
    detail: IncidentDetail, text: str, *, cells: list[str], nodes: list[str]
) -> Preview:
    """The status-page entry for ``text``: redacted, then refused if it names a cell or node.

    A refusal says what kind of name it found, never the name itself: the preview is what the
    public would see, and the reason is shown right next to it.
    """
    product = _product(detail)
    cleaned = redact(text, AUDIT_QUERY)
    try:
        entry = status_page_entry(product, detail.region, cleaned.text, cells, nodes)
    except CommsError as exc:
        kind = "a node" if "node" in str(exc) else "an internal cell" if "cell" in str(exc) else ""
        why = f"withheld: the draft names {kind}" if kind else "withheld: the draft is empty"
        return Preview(
            False, product, detail.region, why + "; status pages are per product × region"
        )
    return Preview(True, entry.product, entry.region, entry.text, tuple(cleaned.kinds))


def _product(detail: IncidentDetail) -> str:
    for labels in detail.alerts:
        for key in ("product", "model"):
            value = labels.get(key, "").strip()
            if value:
                return value
    return "inference"


def cell_ttft_p99(
    found: Sequence[Any], *, window_s: float = 60.0
) -> list[tuple[float, float | None]]:
    """The cell's TTFT p99 over a sliding window from its histogram buckets (summed over
    replicas and models), as ``histogram_quantile(0.99, sum by (le) (increase(...[1m])))``."""
    by_le: dict[float, dict[float, float]] = {}
    for s in found:
        le = s.label("le")
        try:
            bound = float(le)
        except ValueError:
            continue
        into = by_le.setdefault(bound, {})
        for t, v in zip(s.t_s.tolist(), s.values.tolist(), strict=False):
            if math.isfinite(v):
                into[t] = into.get(t, 0.0) + v
    if len(by_le) < 2:
        return []
    times = sorted(set.intersection(*(set(d) for d in by_le.values())))
    out: list[tuple[float, float | None]] = []
    j = 0
    for t in times:
        while j < len(times) and times[j] < t - window_s:
            j += 1
        if times[j] >= t:
            continue  # no earlier sample inside the window yet
        before = times[j]
        pairs = [(le, max(0.0, d[t] - d[before])) for le, d in by_le.items()]
        q = bucket_quantile(0.99, pairs)
        out.append((t, q if math.isfinite(q) else None))
    return out


def _chart(service: IncidentService, detail: IncidentDetail) -> tuple[str | None, str]:
    """An inline SVG of the cell's TTFT p99 (from its histogram) and the region's synthetic
    probe, from the signals serve reads (Prometheus, or the served twin), or why there is none."""
    if service.signals is None:
        return None, "no chart: serve runs without Prometheus or a fleet to read series from"
    now = service.clock.now_s()
    start = max(0.0, detail.opened_at_s - 1800.0)
    try:
        buckets = service.signals.query(
            TTFT_BUCKETS, {"cell": detail.cell}, start_s=start, end_s=now
        )
        probes = service.signals.query(
            PROBE_SERIES, {"region": detail.region}, start_s=start, end_s=now
        )
    except (FiredrillError, OSError, ValueError) as exc:
        return None, f"no chart: the series could not be read ({exc})"
    series = []
    p99 = cell_ttft_p99(buckets)
    if p99:
        series.append(Series(f"{detail.cell} p99 (1m)", [(t - start, v) for t, v in p99]))
    series += [
        Series(
            f"probe {s.label('model_name') or detail.region}",
            [(float(t) - start, float(v)) for t, v in zip(s.t_s, s.values, strict=False)],
        )
        for s in probes[:4]
        if len(s.t_s)
    ]
    if not series:
        return None, f"no chart: no TTFT samples for {detail.cell} or {detail.region} yet"
    svg = time_series_chart(
        f"ttft-{detail.id}",
        [Panel(series, "TTFT (s)", lambda v: f"{v:.2f} s")],
        title=f"TTFT in {detail.cell} (p99 from its histogram) and the {detail.region} probe, "
        f"from 30 min before {detail.id} opened",
        markers=[Marker(detail.opened_at_s - start, f"{detail.id} opened", "injection")],
        width=820,
        zoom=False,
    )
    return svg, ""


def _cells_and_nodes(
    service: IncidentService, detail: IncidentDetail
) -> tuple[list[str], list[str]]:
    cells = {detail.cell}
    nodes: set[str] = set()
    for labels in detail.alerts:
        for key in ("cell",):
            if labels.get(key):
                cells.add(labels[key])
        for key in ("node", "Hostname", "hostname", "instance", "kubernetes_node"):
            if labels.get(key):
                nodes.add(labels[key])
    if service.fleet is not None:
        try:
            cells |= {c.name for c in service.fleet.cells()}
            nodes |= {n.name for n in service.fleet.node_views(cell=detail.cell)}
        except (FiredrillError, OSError):
            pass  # the built-in patterns still catch cell ids and gpu-* node names
    return sorted(cells), sorted(nodes)


def mount_ui(app: FastAPI, *, service: IncidentService, hub: EventHub, tokens: Tokens) -> Sessions:
    """Add the pages, their static files and the session-authenticated event stream."""
    sessions = Sessions()
    env = Environment(
        loader=FileSystemLoader(str(HERE / "templates")),
        autoescape=True,  # every template, whatever its name: user text is never markup
        undefined=StrictUndefined,
    )
    templates = Jinja2Templates(env=env)
    env.filters["duration"] = _duration
    env.filters["clock"] = _clock
    env.globals["ROLES"] = [r.value for r in Role]
    env.globals["AXES"] = list(AXES)
    app.mount("/ui/static", StaticFiles(directory=str(HERE / "static")), name="static")
    router = APIRouter(prefix="/ui", include_in_schema=False)

    @app.exception_handler(LoginRequired)
    async def _login(_: Request, exc: LoginRequired) -> Response:
        target = quote(_safe_next(exc.next_url), safe="/")
        return RedirectResponse(f"/ui/login?next={target}", status_code=303)

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/ui/board", status_code=303)

    def current(request: Request) -> Session:
        found = sessions.get(request.cookies.get(COOKIE))
        if found is None:
            if request.method == "GET" and "hx-request" not in request.headers:
                raise LoginRequired(str(request.url.path) + _query(request))
            raise HTTPException(401, "log in first: no session")
        if not found.principal.can_read:
            raise HTTPException(403, f"{found.principal.person} may not read incidents")
        return found

    async def writer(request: Request) -> Session:
        """A session whose request carries its CSRF token, held by someone who may decide."""
        found = current(request)
        offered = request.headers.get(CSRF_HEADER)
        if offered is None:
            form = await request.form()
            value = form.get(CSRF_FIELD)
            offered = value if isinstance(value, str) else None
        if not found.csrf_ok(offered):
            raise HTTPException(403, "the form's CSRF token is missing or wrong: reload the page")
        if not found.principal.can_decide:
            raise HTTPException(403, f"{found.principal.person} holds no incident role")
        return found

    Reader = Annotated[Session, Depends(current)]
    Writer = Annotated[Session, Depends(writer)]

    def page(
        request: Request,
        name: str,
        context: Mapping[str, Any],
        *,
        session: Session | None = None,
        status: int = 200,
    ) -> HTMLResponse:
        ctx = {
            "who": session.principal if session else None,
            "csrf": session.csrf if session else "",
            "now_s": service.clock.now_s(),
            "error": "",
            "note": "",
            **context,
        }
        response: HTMLResponse = templates.TemplateResponse(request, name, ctx, status_code=status)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers["Cache-Control"] = "no-store"
        return response

    # --- login ------------------------------------------------------------------------------

    @router.get("/login")
    def login_form(request: Request, next: str = "/ui/board", error: str = "") -> HTMLResponse:
        nonce = secrets.token_urlsafe(24)
        response = page(
            request, "login.html", {"next": _safe_next(next), "error": error, "login_csrf": nonce}
        )
        response.set_cookie(
            LOGIN_COOKIE,
            nonce,
            httponly=True,
            samesite="strict",
            secure=_https(request),
            path="/ui/login",
            max_age=600,
        )
        return response

    @router.post("/login")
    def login(
        request: Request,
        token: Annotated[str, Form(max_length=4096)],
        csrf: Annotated[str, Form(max_length=200)] = "",
        next: Annotated[str, Form(max_length=2000)] = "/ui/board",
    ) -> Response:
        expected = request.cookies.get(LOGIN_COOKIE, "")
        if not expected or not secrets.compare_digest(expected.encode(), csrf.encode()):
            raise HTTPException(403, "the login form's CSRF token is missing or wrong: reload it")
        who = tokens.who(token.strip()) if token.strip() else None
        if who is None:
            return page(
                request,
                "login.html",
                {"next": _safe_next(next), "error": "unknown token", "login_csrf": expected},
                status=401,
            )
        opened = sessions.open(who)
        response = RedirectResponse(_safe_next(next), status_code=303)
        response.set_cookie(
            COOKIE,
            opened.id,
            httponly=True,
            samesite="strict",
            secure=_https(request),
            path="/",
            max_age=int(sessions.ttl_s),
        )
        response.delete_cookie(LOGIN_COOKIE, path="/ui/login")
        return response

    @router.post("/logout")
    async def logout(request: Request, s: Reader) -> Response:
        form = await request.form()
        offered = request.headers.get(CSRF_HEADER) or form.get(CSRF_FIELD)
        if not s.csrf_ok(offered if isinstance(offered, str) else None):
            raise HTTPException(403, "the form's CSRF token is missing or wrong: reload the page")
        sessions.close(s.id)
        response = RedirectResponse("/ui/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # --- the board --------------------------------------------------------------------------

    def board_rows(
        status: str | None,
        sev: int | None,
        region: str | None,
        cell: str | None,
        axis: str | None,
        page_no: int,
    ) -> tuple[list[BoardRow], int]:
        """One page of the board, most severe then oldest first, and how many match in all.

        Only the page's incidents get their IC and update deadline read from the store.
        """
        found = service.list_incidents(
            status=status, cell=cell or None, region=region or None, sev=sev, limit=10**6
        )
        axes = service.deciding_axes()
        if axis:
            found = [i for i in found if axes.get(i.id) == axis]
        found.sort(key=lambda i: (i.sev, i.opened_at_s))
        shown = found[page_no * BOARD_PAGE : (page_no + 1) * BOARD_PAGE]
        with service.store.session() as s:
            facts = store_board.facts(session=s, incident_ids=[i.id for i in shown])
        now = service.clock.now_s()
        rows = []
        for i in shown:
            f = facts[i.id]
            due = None
            if i.status != "resolved":
                due = next_update_due(i.sev, i.opened_at_s, f.updates)
            rows.append(
                BoardRow(
                    id=i.id,
                    title=i.title,
                    sev=i.sev,
                    status=i.status,
                    cell=i.cell,
                    region=i.region,
                    kind=i.kind,
                    deciding_axis=axes.get(i.id),
                    age_s=now - i.opened_at_s,
                    commander=f.commander,
                    next_due_s=due,
                )
            )
        return rows, len(found)

    @router.get("/board")
    def board(
        request: Request,
        s: Reader,
        status: Annotated[str, Query(pattern="^(open|mitigated|resolved|all)$")] = "open",
        sev: Annotated[str, Query(pattern="^[1-4]?$")] = "",
        region: Annotated[str, Query(max_length=200)] = "",
        cell: Annotated[str, Query(max_length=200)] = "",
        axis: Annotated[str, Query(max_length=64)] = "",
        page_no: Annotated[int, Query(alias="page", ge=0, le=10_000)] = 0,
    ) -> HTMLResponse:
        rows, total = board_rows(
            None if status == "all" else status,
            int(sev) if sev else None,
            region,
            cell,
            axis,
            page_no,
        )
        filters = {"status": status, "sev": sev, "region": region, "cell": cell, "axis": axis}
        fragment = request.headers.get("hx-target") == "board-rows"
        ctx = {
            "rows": rows,
            "filters": filters,
            "total": total,
            "page_no": page_no,
            "pages": max(1, -(-total // BOARD_PAGE)),
            "first": page_no * BOARD_PAGE,
        }
        return page(request, "_board_rows.html" if fragment else "board.html", ctx, session=s)

    # --- one incident -----------------------------------------------------------------------

    def incident_context(incident_id: str) -> dict[str, Any]:
        detail = service.incident(incident_id)
        comms_rows = ops.comms_of(service, incident_id)
        updates = [(c.at_s, c.text) for c in comms_rows if c.channel == "incident_channel"]
        due = None
        if detail.status != "resolved":
            due = next_update_due(detail.sev, detail.opened_at_s, updates)
        cells, nodes = _cells_and_nodes(service, detail)
        stored_previews = [
            public_preview(detail, c.text, cells=cells, nodes=nodes)
            for c in comms_rows
            if c.channel == "status_page"
        ]
        return {
            "inc": detail,
            "levers": sorted(detail.levers, key=lambda lv: lv.id),
            "comms": comms_rows,
            "previews": stored_previews,
            "next_due_s": due,
            "handoffs": ops.handoffs_of(service, incident_id),
            "grants": ops.grants_of(service, incident_id),
            "pending_bg": _pending_breakglass(service, incident_id),
            "postmortem": ops.postmortem_of(service, incident_id),
        }

    @router.get("/incidents/{incident_id}")
    def incident_page(request: Request, incident_id: str, s: Reader) -> HTMLResponse:
        ctx = incident_context(incident_id)
        svg, why = _chart(service, ctx["inc"])
        ctx |= {"chart_svg": svg, "chart_why": why}
        return page(request, "incident.html", ctx, session=s)

    @router.get("/incidents/{incident_id}/part/{part}")
    def incident_part(request: Request, incident_id: str, part: str, s: Reader) -> HTMLResponse:
        if part not in PARTS:
            raise HTTPException(404, f"no part {part!r}")
        return page(request, f"_{part}.html", incident_context(incident_id), session=s)

    def after_write(
        request: Request, s: Session, incident_id: str, part: str, note: str
    ) -> Response:
        """htmx: the refreshed fragment; without JavaScript: back to the incident page."""
        if "hx-request" in request.headers:
            ctx = incident_context(incident_id) | {"note": note}
            return page(request, f"_{part}.html", ctx, session=s)
        return RedirectResponse(f"/ui/incidents/{incident_id}#{part}", status_code=303)

    def refused(
        request: Request, s: Session, incident_id: str, part: str, status: int, why: str
    ) -> Response:
        ctx = incident_context(incident_id) | {"error": why}
        if "hx-request" in request.headers:
            return page(request, f"_{part}.html", ctx, session=s, status=status)
        svg, chart_why = _chart(service, ctx["inc"])
        ctx |= {"chart_svg": svg, "chart_why": chart_why}
        return page(request, "incident.html", ctx, session=s, status=status)

    # --- levers -----------------------------------------------------------------------------

    def lever_action(action: str) -> Callable[..., Response]:
        def handler(request: Request, lever_id: int, s: Writer) -> Response:
            p = s.principal
            current_view = service.lever(lever_id)
            incident_id = current_view.incident_id
            try:
                if action == "approve":
                    out = service.approve(lever_id, person=p.person, roles=p.roles)
                elif action == "pull":
                    out = service.pull(lever_id)
                else:
                    out = service.undo(lever_id, person=p.person)
            except ServeError as exc:
                return refused(request, s, incident_id, "levers", exc.status, str(exc))
            note = f"lever {lever_id} {action}: now {out.status}"
            return after_write(request, s, incident_id, "levers", note)

        return handler

    for action in ("approve", "pull", "undo"):
        router.add_api_route(
            f"/levers/{{lever_id}}/{action}", lever_action(action), methods=["POST"]
        )

    # --- comms, handoff, break-glass, postmortem ------------------------------------------

    @router.post("/incidents/{incident_id}/comms")
    def post_comms(
        request: Request,
        incident_id: str,
        s: Writer,
        channel: Annotated[str, Form()],
        text: Annotated[str, Form(max_length=4000)],
    ) -> Response:
        try:
            body = ops.CommsBody(channel=channel, text=text)
            if channel == "status_page":
                detail = service.incident(incident_id)
                cells, nodes = _cells_and_nodes(service, detail)
                preview = public_preview(detail, text, cells=cells, nodes=nodes)
                if not preview.ok:
                    return refused(request, s, incident_id, "comms", 422, preview.text)
                body = ops.CommsBody(channel=channel, text=preview.text)
            ops.post_comms(service, hub, s.principal, incident_id, body)
        except ValidationError as exc:
            return refused(request, s, incident_id, "comms", 422, _first_error(exc))
        except HTTPException as exc:
            return refused(request, s, incident_id, "comms", exc.status_code, str(exc.detail))
        return after_write(request, s, incident_id, "comms", f"posted to {channel}")

    @router.post("/incidents/{incident_id}/preview")
    def preview(
        request: Request,
        incident_id: str,
        s: Writer,
        text: Annotated[str, Form(max_length=4000)] = "",
    ) -> HTMLResponse:
        detail = service.incident(incident_id)
        cells, nodes = _cells_and_nodes(service, detail)
        found = public_preview(detail, text, cells=cells, nodes=nodes)
        return page(request, "_preview.html", {"preview": found, "inc": detail}, session=s)

    @router.post("/incidents/{incident_id}/handoff")
    def handoff(
        request: Request,
        incident_id: str,
        s: Writer,
        role: Annotated[str, Form()],
        to_person: Annotated[str, Form(max_length=200)],
        open_threads: Annotated[str, Form(max_length=10_000)] = "",
        next_update_in_min: Annotated[float, Form(gt=0, le=1440)] = 30.0,
    ) -> Response:
        try:
            body = ops.HandoffBody(
                role=role,
                to_person=to_person,
                open_threads=[t.strip() for t in open_threads.split(",") if t.strip()],
                next_update_in_s=next_update_in_min * 60.0,
            )
            ops.post_handoff(service, hub, s.principal, incident_id, body)
        except ValidationError as exc:
            return refused(request, s, incident_id, "comms", 422, _first_error(exc))
        except StoreError as exc:
            return refused(request, s, incident_id, "comms", 422, str(exc))
        return after_write(request, s, incident_id, "comms", f"{role} handed to {to_person}")

    @router.post("/incidents/{incident_id}/breakglass")
    def request_breakglass(
        request: Request,
        incident_id: str,
        s: Writer,
        identity: Annotated[str, Form(max_length=200)],
        scope: Annotated[str, Form(max_length=200)],
        reason: Annotated[str, Form(max_length=2000)],
        ttl_min: Annotated[float, Form(gt=0, le=240)] = 60.0,
    ) -> Response:
        try:
            service.breakglass_request(
                incident_id,
                person=s.principal.person,
                identity=identity,
                scope=scope,
                reason=reason,
                ttl_s=ttl_min * 60.0,
            )
        except ServeError as exc:
            return refused(request, s, incident_id, "breakglass", exc.status, str(exc))
        return after_write(request, s, incident_id, "breakglass", "break-glass requested")

    @router.post("/breakglass/{request_id}/approve")
    def approve_breakglass(
        request: Request,
        request_id: str,
        s: Writer,
        incident: Annotated[str, Form(max_length=32)],
    ) -> Response:
        try:
            out = service.breakglass_approve(
                request_id, person=s.principal.person, roles=s.principal.roles
            )
        except ServeError as exc:
            return refused(request, s, incident, "breakglass", exc.status, str(exc))
        return after_write(request, s, incident, "breakglass", f"break-glass {out.status}")

    @router.post("/incidents/{incident_id}/postmortem")
    def postmortem(
        request: Request,
        incident_id: str,
        s: Writer,
        root_cause_class: Annotated[str, Form(max_length=200)],
        text: Annotated[str, Form(max_length=100_000)],
        item_kind: Annotated[str, Form()],
        item_text: Annotated[str, Form(max_length=2000)],
        item_owner: Annotated[str, Form(max_length=200)],
        ttd_min: Annotated[float, Form(ge=0)] = 0.0,
        gpu_hours_lost: Annotated[float, Form(ge=0)] = 0.0,
    ) -> Response:
        try:
            body = ops.PostmortemBody(
                root_cause_class=root_cause_class,
                text=text,
                ttd_s=ttd_min * 60.0,
                gpu_hours_lost=gpu_hours_lost,
                action_items=[ops.ActionItemBody(kind=item_kind, text=item_text, owner=item_owner)],
            )
            ops.write_postmortem(service, hub, s.principal, incident_id, body)
        except ValidationError as exc:
            return refused(request, s, incident_id, "head", 422, _first_error(exc))
        except HTTPException as exc:
            return refused(request, s, incident_id, "head", exc.status_code, str(exc.detail))
        return after_write(request, s, incident_id, "head", "postmortem written")

    @router.get("/breakglass")
    def breakglass_page(request: Request, s: Reader) -> HTMLResponse:
        found = service.list_incidents(status=None, limit=10**6)
        rows = []
        for inc in found:
            grants = ops.grants_of(service, inc.id)
            pending = _pending_breakglass(service, inc.id)
            if grants or pending:
                rows.append({"inc": inc, "grants": grants, "pending": pending})
        return page(request, "breakglass.html", {"rows": rows}, session=s)

    # --- game days --------------------------------------------------------------------------

    @router.get("/gamedays")
    def gamedays(request: Request, s: Reader) -> HTMLResponse:
        now = datetime.now(UTC)
        with service.store.session() as db:
            history = ladder_runs(session=db)
            results = list(drills.list(session=db))
            items = action_items.list_items(session=db, status="open")
        results.reverse()
        ctx = {
            "standings": standings(history, now),
            "results": results,
            "items": items,
        }
        return page(request, "gamedays.html", ctx, session=s)

    @router.get("/gamedays/runs/{result_id}/report")
    def run_report(result_id: int, s: Reader) -> HTMLResponse:
        with service.store.session() as db:
            row = drills.get(session=db, result_id=result_id)
            if row is None:
                raise HTTPException(404, f"no drill result {result_id}")
            report = dict(row.report)
        body = render_drill_html(report)
        return HTMLResponse(
            body,
            headers={
                "Content-Security-Policy": REPORT_CSP,
                "X-Content-Type-Options": "nosniff",
                "Cache-Control": "no-store",
            },
        )

    # --- events -----------------------------------------------------------------------------

    @router.get("/events")
    def events(
        request: Request,
        s: Reader,
        incident: Annotated[str | None, Query(max_length=32)] = None,
    ) -> StreamingResponse:
        raw = request.headers.get("last-event-id", "")
        last = int(raw) if raw.isdigit() else None
        return StreamingResponse(
            _unnamed(hub.stream(last, incident=incident)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    app.include_router(router)
    return sessions


_EVENT_LINE: Final = re.compile(r"^event: [^\n]*\n", re.MULTILINE)


async def _unnamed(stream: AsyncIterator[str]) -> AsyncIterator[str]:
    """The hub's events without their ``event:`` names, so one ``onmessage`` sees them all."""
    async for chunk in stream:
        yield _EVENT_LINE.sub("", chunk)


def _pending_breakglass(service: IncidentService, incident_id: str) -> list[dict[str, str]]:
    """Requests asked in the timeline and not granted yet (the store keeps grants only)."""
    with service.store.session() as s:
        events = timeline.list(session=s, incident_id=incident_id)
    asked: dict[str, dict[str, str]] = {}
    granted: set[str] = set()
    for e in events:
        if e.kind != "breakglass":
            continue
        rid = str(e.data.get("request_id", ""))
        if "grant_id" in e.data:
            granted.add(rid)
        elif rid:
            asked[rid] = {"request_id": rid, "text": e.text, "by": e.actor, "at": _clock(e.at_s)}
    return [v for k, v in asked.items() if k not in granted]


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(x) for x in first["loc"]) or "form"
    return f"{where}: {first['msg']}"


def _safe_next(target: str) -> str:
    """Only a path on this server (no scheme, no host, no ``//``): no open redirect."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/ui/board"
    return target


def _query(request: Request) -> str:
    q = request.url.query
    return f"?{q}" if q else ""


def _https(request: Request) -> bool:
    return request.url.scheme == "https"


__all__ = ["BoardRow", "Preview", "mount_ui", "next_update_due", "public_preview"]
