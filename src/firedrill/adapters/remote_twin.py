"""``RemoteTwin``: a drill's and a scenario's world (``DrillWorld``, ``ScenarioWorld``) over a
``firedrill twin serve`` control API.

A drill that runs against a twin in another process can be killed without taking the world with
it, which is exactly what recovery has to handle; and the chaos side of a drill then holds only
a bearer token with inject-only rights, never the world itself. A scenario (``firedrill respond``)
reads more of the world than a drill does (JobSets and their flight recorders, the sandboxes'
audit records, the change journal, flags and quarantines, the fleet spec), so that it can run
against the same served twin a real Prometheus scrapes. The server side is
``adapters/twin_api.py``.

Errors: the twin's refusals come back as the same types the in-process twin raises
(``UnknownTargetError`` for a target that does not exist, ``OperationError`` for an operation the
state does not allow), so the control plane cannot tell the two worlds apart. Anything else (no
connection, a wrong token, a malformed answer) is a ``RemoteWorldError`` naming the URL, chained
to the transport's exception.
"""

from __future__ import annotations

import json
import math
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from firedrill.drill.journal import decode_applied, decode_op, encode_op
from firedrill.errors import JournalError, OperationError, RemoteWorldError, UnknownTargetError
from firedrill.model.changes import ChangeEvent
from firedrill.model.operations import Applied, Operation
from firedrill.model.release import DigestRecord, RolloutView, ServingDigest
from firedrill.model.sandbox import CompensationRecord, EgressRecord, ToolCallRecord
from firedrill.model.series import Labels, Series
from firedrill.model.spec import FleetSpec
from firedrill.model.state import CellView, FaultRecord, NodeView, ReplicaTransition
from firedrill.model.wire import WireError, from_wire
from firedrill.twin.training import JobSetView, RankRecord

__all__ = ["TOKEN_ENV", "RemoteSandboxes", "RemoteTwin", "load_token"]

TOKEN_ENV = "FIREDRILL_TWIN_TOKEN"
DEFAULT_TIMEOUT_S = 30.0  # seconds; an advance of hours of simulated time takes a while


def load_token(token_file: Path | None, environ: Mapping[str, str] | None = None) -> str:
    """The control token: ``$FIREDRILL_TWIN_TOKEN`` if set, else the first line of the file."""
    env = os.environ if environ is None else environ
    from_env = env.get(TOKEN_ENV, "").strip()
    if from_env:
        return from_env
    if token_file is None:
        raise RemoteWorldError(f"no control token: set {TOKEN_ENV} or pass a token file")
    try:
        token = token_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise RemoteWorldError(f"cannot read the control token from {token_file}: {exc}") from exc
    if not token:
        raise RemoteWorldError(f"{token_file}: the control token file is empty")
    return token


def _nan(value: object) -> float:
    return math.nan if value is None else float(value)  # type: ignore[arg-type]


def _labels(raw: object) -> Labels:
    if not isinstance(raw, list):
        raise WireError(f"labels must be a list, got {raw!r}")
    return tuple((str(k), str(v)) for k, v in raw)


class RemoteTwin:
    """A twin served by ``firedrill twin serve``, reached at ``url`` with a bearer ``token``."""

    def __init__(self, url: str, token: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise RemoteWorldError(f"a remote twin URL is http(s)://HOST:PORT, got {url!r}")
        self.url = url.rstrip("/")
        self._token = token
        self._timeout_s = timeout_s
        self._operations: list[Applied] = []  # the twin's journal only grows: read the new end
        self._fleet: FleetSpec | None = None  # the spec a twin was built from never changes
        self._sandbox = RemoteSandboxes(self)

    def __repr__(self) -> str:
        return f"RemoteTwin({self.url!r})"  # never the token

    # transport

    def _call(
        self, method: str, path: str, params: Sequence[tuple[str, str]] = (), body: object = None
    ) -> Any:
        url = f"{self.url}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(list(params))
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self._token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                raw = exc.read()
            self._raise_refusal(exc.code, raw, f"{method} {path}", exc)
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RemoteWorldError(f"cannot reach the twin at {self.url}: {reason}") from exc
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RemoteWorldError(f"{method} {url}: the answer is not JSON") from exc

    def _raise_refusal(self, status: int, raw: bytes, what: str, exc: Exception) -> NoReturn:
        try:
            answer = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        message = str(answer.get("error") or raw[:200].decode(errors="replace").strip())
        kind = answer.get("kind")
        if kind == "unknown_target":
            raise UnknownTargetError(
                str(answer.get("target_kind")), str(answer.get("name"))
            ) from exc
        if kind == "operation":
            raise OperationError(message) from exc
        if status == 401:
            raise RemoteWorldError(
                f"the twin at {self.url} refused the control token (401): {message}", status=401
            ) from exc
        if status == 404 and not answer:
            message = "no control API here (is `twin serve` running with --control?)"
        raise RemoteWorldError(f"{what} at {self.url}: {status} {message}", status=status) from exc

    def _field(
        self,
        method: str,
        path: str,
        key: str,
        params: Sequence[tuple[str, str]] = (),
        body: object = None,
    ) -> Any:
        """One field of the JSON object an endpoint answers."""
        answer = self._call(method, path, params, body)
        if not isinstance(answer, dict) or key not in answer:
            raise RemoteWorldError(f"{method} {self.url}{path}: the answer has no '{key}'")
        return answer[key]

    def _decode(self, what: str, decode: Any, raw: object) -> Any:
        try:
            return decode(raw)
        except (
            WireError,
            JournalError,
            ValidationError,
            TypeError,
            ValueError,
            KeyError,
            IndexError,
        ) as exc:
            raise RemoteWorldError(f"{self.url}: a malformed {what}: {exc}") from exc

    # Clock

    def now_s(self) -> float:
        return float(self._field("GET", "/v1/now", "now_s"))

    def advance(self, seconds: float) -> None:
        self._call("POST", "/v1/advance", body={"seconds": seconds})

    def settle(self) -> None:
        self._call("POST", "/v1/settle", body={})

    # Fleet

    def apply(self, op: Operation) -> Operation:
        inverse: Operation = self._decode(
            "inverse", decode_op, self._call("POST", "/v1/apply", body=encode_op(op))
        )
        return inverse

    def inverse_of(self, op: Operation) -> Operation:
        inverse: Operation = self._decode(
            "inverse", decode_op, self._call("POST", "/v1/inverse", body=encode_op(op))
        )
        return inverse

    def node(self, name: str) -> NodeView:
        nodes = self._field("GET", "/v1/nodes", "nodes", [("name", name)])
        view: NodeView = self._decode("node", lambda raw: from_wire(NodeView, raw[0]), nodes)
        return view

    def node_views(self, *, cell: str | None = None) -> Sequence[NodeView]:
        params = [] if cell is None else [("cell", cell)]
        nodes = self._field("GET", "/v1/nodes", "nodes", params)
        views: list[NodeView] = self._decode(
            "node list", lambda raw: [from_wire(NodeView, n) for n in raw], nodes
        )
        return views

    def pods_on(self, node: str, gpu: int | None = None) -> Sequence[str]:
        params = [("node", node)] + ([] if gpu is None else [("gpu", str(gpu))])
        return [str(p) for p in self._field("GET", "/v1/pods", "pods", params)]

    def burn_in_result(self, node: str) -> tuple[float, bool, str] | None:
        result = self._field("GET", "/v1/burn_in", "result", [("node", node)])
        if result is None:
            return None
        at_s, passed, detail = result
        return float(at_s), bool(passed), str(detail)

    def cells(self) -> Sequence[CellView]:
        cells = self._field("GET", "/v1/cells", "cells")
        views: list[CellView] = self._decode(
            "cell list", lambda raw: [from_wire(CellView, c) for c in raw], cells
        )
        return views

    def changes(self, *, since_s: float, cell: str | None = None) -> Sequence[ChangeEvent]:
        params = [("since_s", repr(float(since_s)))] + ([] if cell is None else [("cell", cell)])
        changes = self._field("GET", "/v1/changes", "changes", params)
        events: list[ChangeEvent] = self._decode(
            "change list", lambda raw: [from_wire(ChangeEvent, c) for c in raw], changes
        )
        return events

    # Signals

    def series_names(self) -> Sequence[str]:
        return [str(n) for n in self._field("GET", "/v1/series", "names")]

    def query(
        self,
        name: str,
        matchers: Mapping[str, str] | None = None,
        *,
        start_s: float,
        end_s: float,
    ) -> Sequence[Series]:
        params = [("name", name), ("start_s", repr(float(start_s))), ("end_s", repr(float(end_s)))]
        params += [("match", f"{k}={v}") for k, v in (matchers or {}).items()]
        answer = self._call("GET", "/v1/query", params)

        def decode(raw: Any) -> list[Series]:
            return [
                Series(
                    name=str(s["name"]),
                    labels=_labels(s["labels"]),
                    t_s=np.array(s["t_s"], dtype=np.float64),
                    values=np.array([_nan(v) for v in s["values"]], dtype=np.float64),
                )
                for s in raw["series"]
            ]

        series: list[Series] = self._decode("series", decode, answer)
        return series

    def instant(
        self, name: str, matchers: Mapping[str, str] | None = None
    ) -> tuple[float, Sequence[Labels], npt.NDArray[np.float64]]:
        params = [("name", name)] + [("match", f"{k}={v}") for k, v in (matchers or {}).items()]
        answer = self._call("GET", "/v1/instant", params)

        def decode(raw: Any) -> tuple[float, list[Labels], npt.NDArray[np.float64]]:
            values = np.array([_nan(v) for v in raw["values"]], dtype=np.float64)
            return float(raw["t_s"]), [_labels(lab) for lab in raw["labels"]], values

        result: tuple[float, list[Labels], npt.NDArray[np.float64]] = self._decode(
            "instant vector", decode, answer
        )
        return result

    # FleetHistory

    def fault_events(self, *, since_s: float = 0.0) -> Sequence[FaultRecord]:
        raw = self._field("GET", "/v1/faults", "faults", [("since_s", repr(float(since_s)))])
        events: list[FaultRecord] = self._decode(
            "fault list", lambda r: [from_wire(FaultRecord, e) for e in r], raw
        )
        return events

    def replica_transitions(self, *, since_s: float = 0.0) -> Sequence[ReplicaTransition]:
        params = [("since_s", repr(float(since_s)))]
        raw = self._field("GET", "/v1/replica_transitions", "transitions", params)
        events: list[ReplicaTransition] = self._decode(
            "replica transition list", lambda r: [from_wire(ReplicaTransition, e) for e in r], raw
        )
        return events

    # Capacity

    def max_rps_per_replica(self, model: str, cell: str) -> float:
        params = [("model", model), ("cell", cell)]
        return float(self._field("GET", "/v1/capacity", "max_rps_per_replica", params))

    def cold_cache_penalty(self, model: str, cell: str) -> float:
        params = [("model", model), ("cell", cell)]
        return float(self._field("GET", "/v1/capacity", "cold_cache_penalty", params))

    def capacity_errors(self) -> int:
        return int(self._field("GET", "/v1/capacity_errors", "capacity_errors"))

    # Digests

    def published(self, model: str) -> Sequence[DigestRecord]:
        raw = self._field("GET", "/v1/digests", "digests", [("model", model)])
        records: list[DigestRecord] = self._decode(
            "digest list", lambda r: [from_wire(DigestRecord, d) for d in r], raw
        )
        return records

    def digest_record(self, digest: str) -> DigestRecord | None:
        raw = self._field("GET", "/v1/digests", "digests", [("digest", digest)])
        records: list[DigestRecord] = self._decode(
            "digest list", lambda r: [from_wire(DigestRecord, d) for d in r], raw
        )
        return records[0] if records else None

    def serving_digests(self, region: str) -> Sequence[ServingDigest]:
        raw = self._field("GET", "/v1/serving_digests", "serving", [("region", region)])
        serving: list[ServingDigest] = self._decode(
            "serving digest list", lambda r: [from_wire(ServingDigest, d) for d in r], raw
        )
        return serving

    def unsigned_replicas_admitted(self) -> int:
        return int(self._field("GET", "/v1/unsigned_admitted", "unsigned_replicas_admitted"))

    # ScenarioWorld: what a scenario reads beyond a drill

    def rollout_view(self, model: str) -> RolloutView:
        raw = self._field("GET", "/v1/rollout", "rollout", [("model", model)])
        view: RolloutView = self._decode("rollout", lambda r: from_wire(RolloutView, r), raw)
        return view

    def jobset(self, name: str) -> JobSetView:
        raw = self._field("GET", "/v1/jobset", "jobset", [("name", name)])
        view: JobSetView = self._decode("JobSet", lambda r: from_wire(JobSetView, r), raw)
        return view

    def flight_recorder(self, jobset: str) -> Sequence[RankRecord]:
        raw = self._field("GET", "/v1/flight_recorder", "ranks", [("jobset", jobset)])
        records: list[RankRecord] = self._decode(
            "flight recorder", lambda r: [from_wire(RankRecord, x) for x in r], raw
        )
        return records

    def egress_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[EgressRecord]:
        raw = self._field("GET", "/v1/egress", "records", _window(start_s, end_s, tenant))
        records: list[EgressRecord] = self._decode(
            "egress record list", lambda r: [from_wire(EgressRecord, x) for x in r], raw
        )
        return records

    def tool_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[ToolCallRecord]:
        raw = self._field("GET", "/v1/tool_calls", "records", _window(start_s, end_s, tenant))
        records: list[ToolCallRecord] = self._decode(
            "tool call record list", lambda r: [from_wire(ToolCallRecord, x) for x in r], raw
        )
        return records

    def operations(self) -> Sequence[Applied]:
        params = [("since", str(len(self._operations)))]
        raw = self._field("GET", "/v1/operations", "operations", params)
        new: list[Applied] = self._decode(
            "change journal", lambda r: [decode_applied(x) for x in r], raw
        )
        self._operations.extend(new)
        return list(self._operations)

    def flags(self) -> Mapping[str, str]:
        raw = self._field("GET", "/v1/flags", "flags")
        flags: dict[str, str] = self._decode("flag map", lambda r: _str_map(r, str), raw)
        return flags

    def quarantined_pods(self) -> frozenset[str]:
        raw = self._field("GET", "/v1/quarantined_pods", "pods")
        pods: frozenset[str] = self._decode("pod list", lambda r: frozenset(_strings(r)), raw)
        return pods

    def quarantine_actions(self) -> Mapping[str, int]:
        raw = self._field("GET", "/v1/quarantine_actions", "actions")
        actions: dict[str, int] = self._decode(
            "quarantine actions", lambda r: _str_map(r, int), raw
        )
        return actions

    def fleet_spec(self) -> FleetSpec:
        if self._fleet is None:
            raw = self._field("GET", "/v1/fleet", "fleet")
            self._fleet = self._decode("fleet spec", FleetSpec.model_validate, raw)
        return self._fleet

    @property
    def sandbox(self) -> RemoteSandboxes:
        return self._sandbox

    # beyond the ports: what a drill left behind

    def injected(self) -> list[dict[str, Any]]:
        """What differs from the twin's baseline (``GET /v1/injected``)."""
        found: list[dict[str, Any]] = self._field("GET", "/v1/injected", "injected")
        return found


class RemoteSandboxes:
    """The served twin's agent sandboxes (``Sandboxes``): their audit trail and warm pools."""

    def __init__(self, twin: RemoteTwin) -> None:
        self._twin = twin

    def __repr__(self) -> str:
        return f"RemoteSandboxes({self._twin.url!r})"

    def egress_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[EgressRecord]:
        return self._twin.egress_records(start_s=start_s, end_s=end_s, tenant=tenant)

    def tool_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[ToolCallRecord]:
        return self._twin.tool_records(start_s=start_s, end_s=end_s, tenant=tenant)

    def compensations(self, *, tenant: str | None = None) -> Sequence[CompensationRecord]:
        params = [] if tenant is None else [("tenant", tenant)]
        raw = self._twin._field("GET", "/v1/compensations", "compensations", params)
        records: list[CompensationRecord] = self._twin._decode(
            "compensation list", lambda r: [from_wire(CompensationRecord, x) for x in r], raw
        )
        return records

    def complete_since_s(self) -> float:
        raw = self._twin._field("GET", "/v1/audit_complete_since", "complete_since_s")
        if raw is None:  # nothing rolled off yet: every record since the start is held
            return -math.inf
        value: float = self._twin._decode("time", _number, raw)
        return value

    def warm_pool(self, tenant: str) -> int:
        raw = self._twin._field("GET", "/v1/warm_pool", "warm_pool", [("tenant", tenant)])
        value: int = self._twin._decode("warm pool", _integer, raw)
        return value

    def has_pod(self, pod: str) -> bool:
        raw = self._twin._field("GET", "/v1/sandbox_pod", "exists", [("pod", pod)])
        if not isinstance(raw, bool):
            raise RemoteWorldError(f"{self._twin.url}: a malformed pod answer: {raw!r}")
        return raw


def _window(start_s: float, end_s: float, tenant: str | None) -> list[tuple[str, str]]:
    params = [("start_s", repr(float(start_s))), ("end_s", repr(float(end_s)))]
    return params + ([] if tenant is None else [("tenant", tenant)])


def _number(raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise WireError(f"expected a number, got {raw!r}")
    return float(raw)


def _integer(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise WireError(f"expected an integer, got {raw!r}")
    return raw


def _strings(raw: object) -> list[str]:
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise WireError(f"expected a list of strings, got {raw!r}")
    return list(raw)


def _str_map(raw: object, kind: type[Any]) -> dict[str, Any]:
    """A JSON object of ``kind`` values (``str`` or ``int``), checked."""
    if not isinstance(raw, dict):
        raise WireError(f"expected an object, got {raw!r}")
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, kind):
            raise WireError(f"{key!r}: expected {kind.__name__}, got {value!r}")
    return dict(raw)
