"""Every request the adapter sends, recorded exactly as it went on the wire.

The adapter hands lightkube a ``RecordingTransport`` wrapped around the real transport (or, in
tests, around an ``httpx2.MockTransport`` that answers like an apiserver). Each exchange becomes
an ``ApiCall``: method, path, query, content type, the JSON body, the status that came back and,
for failures, the apiserver's ``Status`` reason. The fleet's journal holds these records, so an
advise-mode run shows the exact requests it would have made (each sent with ``dryRun=All``), and
the RBAC test derives the verbs firedrill needs from them instead of from a hand-written list.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias
from urllib.parse import parse_qsl

import httpx2

__all__ = ["ApiCall", "JsonValue", "RecordingTransport", "RequestTarget", "parse_path"]

JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None


@dataclass(frozen=True)
class RequestTarget:
    """What a request path addresses: ``/apis/GROUP/VERSION/namespaces/NS/PLURAL/NAME/SUB``."""

    group: str  # "" for the core group
    version: str
    plural: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_path(path: str) -> RequestTarget:
    """Split an API path into its group, version, namespace, resource, name and subresource."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        group, rest = "", parts[1:]
    elif parts[:1] == ["apis"]:
        group, rest = parts[1], parts[2:]
    else:
        raise ValueError(f"not an API path: {path}")
    version, rest = rest[0], rest[1:]
    namespace = None
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:
        namespace, rest = rest[1], rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    return RequestTarget(group, version, plural, namespace, name, sub)


@dataclass(frozen=True)
class ApiCall:
    """One exchange with the apiserver, as sent and as answered."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...]
    content_type: str
    body: JsonValue
    status: int  # 0: no answer (the apiserver could not be reached)
    reason: str = ""  # the Status reason of a failure (Conflict, Forbidden, TooManyRequests, ...)

    @property
    def dry_run(self) -> bool:
        return ("dryRun", "All") in self.query

    @property
    def target(self) -> RequestTarget:
        return parse_path(self.path)

    @property
    def watch(self) -> bool:
        return ("watch", "true") in self.query or ("watch", "1") in self.query

    @property
    def verb(self) -> str:
        """The RBAC verb the apiserver authorises this request as."""
        t = self.target
        match self.method:
            case "GET":
                if self.watch:
                    return "watch"
                return "get" if t.name is not None else "list"
            case "POST":
                return "create"
            case "PUT":
                return "update"
            case "PATCH":
                return "patch"
            case "DELETE":
                return "delete" if t.name is not None else "deletecollection"
        raise ValueError(f"unknown method {self.method}")

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "method": self.method,
            "path": self.path,
            "query": [list(q) for q in self.query],
            "content_type": self.content_type,
            "body": self.body,
            "status": self.status,
            "reason": self.reason,
        }


def _body(request: httpx2.Request) -> JsonValue:
    raw = request.content
    if not raw:
        return None
    try:
        value: JsonValue = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")
    return value


def _reason(response: httpx2.Response) -> str:
    if response.status_code < 400:
        return ""
    try:
        response.read()
        data = json.loads(response.content)
    except (ValueError, httpx2.StreamError):
        return ""
    return str(data.get("reason", "")) if isinstance(data, dict) else ""


class RecordingTransport(httpx2.BaseTransport):
    """Wraps a transport; every request and its status go to ``calls`` (and to ``listener``)."""

    def __init__(
        self,
        inner: httpx2.BaseTransport,
        listener: Callable[[ApiCall], None] | None = None,
        *,
        keep: int | None = None,
    ) -> None:
        self.inner = inner
        self.calls: list[ApiCall] = []  # the newest ``keep`` calls (all of them by default)
        self.dropped = 0  # calls forgotten to stay within ``keep`` (a long-running controller)
        self.keep = keep
        self.listener = listener

    def mark(self) -> int:
        """A position in the stream of calls, for ``since``."""
        return self.dropped + len(self.calls)

    def since(self, mark: int) -> tuple[ApiCall, ...]:
        """The calls made after ``mark`` (those still kept)."""
        return tuple(self.calls[max(0, mark - self.dropped) :])

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        query = tuple(parse_qsl(request.url.query.decode(), keep_blank_values=True))

        def call(status: int, reason: str) -> ApiCall:
            return ApiCall(
                method=request.method,
                path=request.url.path,
                query=query,
                content_type=request.headers.get("content-type", ""),
                body=_body(request),
                status=status,
                reason=reason,
            )

        try:
            response = self.inner.handle_request(request)
        except httpx2.TransportError:
            self._record(call(0, "Unreachable"))
            raise
        is_watch = ("watch", "true") in query
        self._record(call(response.status_code, "" if is_watch else _reason(response)))
        return response

    def _record(self, call: ApiCall) -> None:
        self.calls.append(call)
        if self.keep is not None and len(self.calls) > 2 * self.keep:
            drop = len(self.calls) - self.keep
            del self.calls[:drop]
            self.dropped += drop
        if self.listener is not None:
            self.listener(call)

    def close(self) -> None:
        self.inner.close()
