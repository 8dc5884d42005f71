"""A small ``/metrics`` endpoint, so a real Prometheus can scrape what the twin renders.

Drills against the twin should exercise the same scrape path as production: a Prometheus
server (or the agent of a hosted one) pulls ``/metrics`` over HTTP and content-negotiates
between the classic text format and OpenMetrics. This server does only that and knows nothing
of series: it calls the render functions it was given on every scrape, so what it serves is
always the caller's current state. It binds loopback unless told otherwise, because the twin's
numbers are not meant to leave the machine by accident.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import cast
from urllib.parse import urlsplit

from firedrill.twin.exposition import OPENMETRICS_CONTENT_TYPE, PROMETHEUS_TEXT_CONTENT_TYPE

__all__ = ["MetricsServer", "wants_openmetrics"]

logger = logging.getLogger(__name__)

Render = Callable[[], str]
# A JSON API mounted under /v1/ (the twin's control API): (method, path?query, headers, body)
# -> (status, body, content type). It does its own authorization.
Api = Callable[[str, str, Mapping[str, str], bytes], tuple[int, str, str]]
MAX_API_BODY_BYTES = 1 << 20
# Seconds a connection may sit idle in one socket read or write: a client that opens a
# connection and never sends its request line, headers or announced body would otherwise hold a
# server thread forever.
REQUEST_TIMEOUT_S = 10.0

_TEXT_PLAIN = "text/plain; charset=utf-8"


def wants_openmetrics(accept: str | None) -> bool:
    """Whether an ``Accept`` header asks for OpenMetrics (with a non-zero quality)."""
    if not accept:
        return False
    for media_range in accept.split(","):
        media_type, *params = (part.strip() for part in media_range.split(";"))
        if media_type.lower() != "application/openmetrics-text":
            continue
        quality = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if quality > 0:
            return True
    return False


class _Server(ThreadingHTTPServer):
    """The stdlib server, carrying the render functions for its handlers."""

    def __init__(
        self,
        address: tuple[str, int],
        *,
        render: Render,
        render_openmetrics: Render | None,
        family: socket.AddressFamily,
        api: Api | None = None,
    ) -> None:
        self.address_family = family
        self.render = render
        self.api = api
        self.render_openmetrics = render_openmetrics
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server_version = "firedrill-metrics"
    timeout = REQUEST_TIMEOUT_S  # applied to the socket by StreamRequestHandler.setup

    def do_GET(self) -> None:
        self._serve(with_body=True)

    def do_HEAD(self) -> None:
        self._serve(with_body=False)

    def do_POST(self) -> None:
        self._serve(with_body=True, method="POST")

    def _serve(self, *, with_body: bool, method: str = "GET") -> None:
        server = cast(_Server, self.server)
        path = urlsplit(self.path).path
        if server.api is not None and path.startswith("/v1/"):
            raw_length = self.headers.get("Content-Length") or "0"
            length = int(raw_length) if raw_length.isdigit() else -1
            if not 0 <= length <= MAX_API_BODY_BYTES:
                self._reply(413, "request body too large\n", _TEXT_PLAIN, with_body=with_body)
                return
            try:
                payload = self.rfile.read(length) if length else b""
            except TimeoutError:
                self.close_connection = True
                reason = f"request body not received within {REQUEST_TIMEOUT_S:g} s\n"
                self._reply(408, reason, _TEXT_PLAIN, with_body=with_body)
                return
            if len(payload) < length:  # the client closed before sending what it announced
                self.close_connection = True
                return
            status, text, content_type = server.api(method, self.path, dict(self.headers), payload)
            self._reply(status, text, content_type, with_body=with_body)
        elif method == "POST":
            self._reply(405, f"{path} takes GET\n", _TEXT_PLAIN, with_body=with_body)
        elif path == "/metrics":
            openmetrics = server.render_openmetrics is not None and wants_openmetrics(
                self.headers.get("Accept")
            )
            render = server.render_openmetrics if openmetrics else server.render
            assert render is not None
            try:
                body = render()
            # A failing render must answer the scrape with a 500 (which Prometheus records as
            # `up == 0`) rather than drop the connection; the traceback goes to the log.
            except Exception:
                logger.exception("rendering /metrics failed")
                self._reply(500, "rendering metrics failed\n", _TEXT_PLAIN, with_body=with_body)
                return
            content_type = OPENMETRICS_CONTENT_TYPE if openmetrics else PROMETHEUS_TEXT_CONTENT_TYPE
            self._reply(200, body, content_type, with_body=with_body)
        elif path == "/-/healthy":
            self._reply(200, "OK\n", _TEXT_PLAIN, with_body=with_body)
        else:
            reason = f"not found: {path} (this server serves /metrics and /-/healthy)\n"
            self._reply(404, reason, _TEXT_PLAIN, with_body=with_body)

    def _reply(self, status: int, body: str, content_type: str, *, with_body: bool) -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if with_body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        logger.debug("%s " + format, self.address_string(), *args)


class MetricsServer:
    """Serves ``GET /metrics`` (and ``/-/healthy``) from a background thread.

    ``render`` returns the classic text format 0.0.4; ``render_openmetrics``, when given, is
    used for scrapers whose ``Accept`` header asks for OpenMetrics. Both are called on the
    request's own thread, possibly concurrently. ``api``, when given, answers every request
    under ``/v1/`` (GET and POST; see ``Api``). Port 0 picks a free port; read it from ``port``
    after ``start()``.
    """

    def __init__(
        self,
        render: Render,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        render_openmetrics: Render | None = None,
        api: Api | None = None,
    ) -> None:
        self._render = render
        self._render_openmetrics = render_openmetrics
        self._api = api
        self._host = host
        self._requested_port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve in a daemon thread; ``OSError`` if the address cannot be bound."""
        if self._server is not None:
            raise RuntimeError("metrics server already started")
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        server = _Server(
            (self._host, self._requested_port),
            render=self._render,
            render_openmetrics=self._render_openmetrics,
            family=family,
            api=self._api,
        )
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},  # seconds; bounds how long stop() waits
            name=f"metrics-server:{server.server_address[1]}",
            daemon=True,
        )
        self._server = server
        self._thread = thread
        thread.start()

    def stop(self) -> None:
        """Stop serving, close the socket and join the threads; a no-op if not started."""
        server, thread = self._server, self._thread
        self._server = None
        self._thread = None
        if server is None:
            return
        server.shutdown()
        # Joins the per-request threads too (ThreadingMixIn.block_on_close).
        server.server_close()
        if thread is not None:
            thread.join()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def port(self) -> int:
        """The bound port (the free one picked when asked for port 0)."""
        if self._server is None:
            raise RuntimeError("metrics server not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:9400``."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    def __enter__(self) -> MetricsServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
