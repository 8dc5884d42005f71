"""The control API of ``firedrill twin serve``: a twin in another process, driven over HTTP.

A drill against a twin in its own process leaves real state behind when the drill process dies
(``kill -9``): a region is still blackholed, replication still paused, capacity still denied.
That is the world ``firedrill gameday recover`` has to clean up, so the twin must be reachable
from a different process: this module is the server side, ``adapters/remote_twin.py`` the client
(``RemoteTwin`` implements a drill's world, ``DrillWorld``, over it). Every answer beyond the
Fleet, Signals and Clock reads comes from the same adapter the embedded runs use
(``firedrill.twin.world.TwinWorld``), so a drill reads the same values either way.

Endpoints (JSON; every one needs ``Authorization: Bearer <token>``)::

    POST /v1/apply      {"op": TypeName, "args": {...}} -> the inverse, same shape
    POST /v1/inverse    the same, but only computes the inverse (changes nothing)
    POST /v1/advance    {"seconds": s} -> {"now_s": t}   (the twin steps s seconds now)
    POST /v1/settle     {} -> {"now_s": t}   (bins what was admitted since the last scrape)
    GET  /v1/now        {"now_s": t}
    GET  /v1/series     {"names": [...]}
    GET  /v1/query      ?name=N&start_s=A&end_s=B[&match=key=value...] -> {"series": [...]}
    GET  /v1/instant    ?name=N[&match=key=value...] -> {"t_s", "labels", "values"}
    GET  /v1/cells      {"cells": [CellView...]}
    GET  /v1/nodes      [?cell=C | ?name=N] -> {"nodes": [NodeView...]}
    GET  /v1/pods       ?node=N[&gpu=G] -> {"pods": [...]}
    GET  /v1/burn_in    ?node=N -> {"result": null | [at_s, passed, detail]}
    GET  /v1/changes    ?since_s=S[&cell=C] -> {"changes": [ChangeEvent...]}
    GET  /v1/faults     ?since_s=S -> {"faults": [FaultRecord...]}
    GET  /v1/replica_transitions ?since_s=S -> {"transitions": [ReplicaTransition...]}
    GET  /v1/capacity   ?model=M&cell=C -> {"max_rps_per_replica", "cold_cache_penalty"}
    GET  /v1/capacity_errors -> {"capacity_errors": n}
    GET  /v1/digests    ?model=M | ?digest=D -> {"digests": [DigestRecord...]}
    GET  /v1/serving_digests ?region=R -> {"serving": [ServingDigest...]}
    GET  /v1/unsigned_admitted -> {"unsigned_replicas_admitted": n}
    GET  /v1/injected   what differs from the baseline -> {"now_s", "injected": [...]}

What a scenario (``firedrill respond``) reads beyond a drill (``ScenarioWorld``)::

    GET  /v1/rollout    ?model=M -> {"rollout": RolloutView}
    GET  /v1/jobset     ?name=N -> {"jobset": JobSetView}
    GET  /v1/flight_recorder ?jobset=N -> {"ranks": [RankRecord...]}
    GET  /v1/egress     ?start_s=A&end_s=B[&tenant=T] -> {"records": [EgressRecord...]}
    GET  /v1/tool_calls ?start_s=A&end_s=B[&tenant=T] -> {"records": [ToolCallRecord...]}
    GET  /v1/compensations [?tenant=T] -> {"compensations": [CompensationRecord...]}
    GET  /v1/audit_complete_since -> {"complete_since_s": t | null (every record held)}
    GET  /v1/warm_pool  ?tenant=T -> {"warm_pool": n}
    GET  /v1/sandbox_pod ?pod=P -> {"exists": bool}
    GET  /v1/operations [?since=K] -> {"operations": [{"op", "inverse", "at_s", "notes"}...]}
    GET  /v1/flags      {"flags": {name: value}}
    GET  /v1/quarantined_pods -> {"pods": [...]}
    GET  /v1/quarantine_actions -> {"actions": {node: n}}
    GET  /v1/fleet      {"fleet": FleetSpec}   (the spec the twin was built from)

Records travel as their dataclasses' fields (``firedrill.model.wire``), operations as
``{"op", "args"}`` (``firedrill.drill.journal.encode_op``); the client checks both against the
types, so a malformed answer is an error naming the field, never a half-read record.

A bad operation answers 400 with ``{"error", "kind"}`` (``kind``: ``bad_request``,
``unknown_target`` with ``target_kind`` and ``name``, or ``operation``) and applies nothing: its
arguments are checked first (finite, in range, typed: ``firedrill.model.bounds``), then the
inverse is computed, which validates every target, and the twin's ``apply`` checks values
before it changes state. A request the handler did not foresee answers 500 with a JSON body
rather than dropping the connection.

Security: the chaos platform gets inject-only access. The token is generated per start (256
random bits), written to a file only its owner can read, compared in constant time, and grants
exactly the endpoints above: typed, reversible operations and reads; nothing that stops the
server, reloads a spec or changes what the token is. The server binds loopback unless told
otherwise, and ``twin serve`` turns the API off on a non-loopback address unless asked.

``/v1/injected`` compares against a baseline: the state that operations control (partitions,
paused replication, denied capacity, flags, quarantined cells and pods, paused scalers, route
weights, rollouts, digests per region, serving configs, injected serving errors, cordons, taints,
labels, node versions, queue stop policies, suspended JobSets) as it was when the server started;
and, for state the twin also changes by itself (DCGM fields, link flaps, thermal stress, desired
replicas, training faults), the value each key had before the API first touched it, so background
faults and the autoscaler are not mistaken for leftovers of a drill.
"""

from __future__ import annotations

import hmac
import json
import math
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from firedrill.adapters.safe_files import replace_private
from firedrill.drill.journal import decode_op, encode_applied, encode_op
from firedrill.errors import (
    FiredrillError,
    JournalError,
    OperationError,
    UnknownTargetError,
    UnsafePathError,
)
from firedrill.model import bounds
from firedrill.model import operations as ops
from firedrill.model.wire import to_wire
from firedrill.twin.engine import Twin
from firedrill.twin.world import TwinWorld

__all__ = [
    "DEFAULT_TOKEN_FILE",
    "MAX_ADVANCE_S",
    "ControlApi",
    "Injected",
    "control_api",
    "is_loopback",
    "read_token_file",
    "write_token_file",
]

DEFAULT_TOKEN_FILE = Path(".firedrill/twin-token")
MAX_ADVANCE_S = 7 * 86400.0  # one call may step the twin at most a week of simulated time
MAX_BODY_BYTES = 1 << 20

_JSON = "application/json"

Key = tuple[str, str]  # (kind, target)
Value = str | int | float | bool | None


def is_loopback(host: str) -> bool:
    """Whether a bind address only accepts connections from this machine."""
    return host in ("localhost", "::1") or host.startswith("127.")


def write_token_file(path: Path) -> str:
    """A fresh bearer token, written to ``path`` readable by its owner only (0600).

    Never through a link planted at ``path`` (``UnsafePathError``): the token goes into a new
    file created exclusively and renamed into place (``adapters/safe_files.py``).
    """
    token = secrets.token_urlsafe(32)
    try:
        replace_private(path, (token + "\n").encode(), what="control token")
    except OSError as exc:
        raise UnsafePathError(f"cannot write the control token to {path}: {exc}") from exc
    return token


def read_token_file(path: Path) -> str:
    """The token in ``path``; ``OSError``/``ValueError`` when it is missing or empty."""
    token = path.read_text(encoding="utf-8").strip()
    if not token:
        raise ValueError(f"{path}: empty token file")
    return token


# --- what a drill left behind -----------------------------------------------------------------


@dataclass(frozen=True)
class Injected:
    """One piece of state that differs from the baseline."""

    kind: str
    target: str
    baseline: Value
    now: Value


def _static_state(twin: Twin) -> dict[Key, Value]:
    """Operation-controlled state the twin never changes by itself; absent keys are defaults."""
    state: dict[Key, Value] = {}
    cells, regions, models = twin.cell_names, twin.region_names, twin.models
    nc = len(cells)
    for kind, a, b in twin.partitions:
        state[("partition", f"{kind} {a}/{b}")] = "cut"
    for s, t in twin.replication_paused:
        state[("replication_paused", f"{regions[s]}->{regions[t]}")] = "paused"
    for ri in twin.capacity_denied:
        state[("capacity_denied", regions[ri])] = "denied"
    for key, value in twin.flags.items():
        state[("flag", key)] = value
    for pod in twin.quarantined_pods:
        state[("pod_quarantined", pod)] = True
    for ci, name in enumerate(cells):
        if twin.cell_quarantined[ci]:
            state[("cell_quarantined", name)] = True
    for mi, m in enumerate(models):
        ro = twin.rollout[mi]
        if ro is not None:
            state[("rollout", m.name)] = f"{twin.digests[ro[0]].digest} canary {ro[1]}%"
        for ri, region in enumerate(regions):
            state[("digest", f"{m.name}/{region}")] = twin.digests[
                int(twin.region_digest[mi, ri])
            ].digest
        bundle = twin.bundle[mi]
        config = bundle.serving_config
        state[("serving_config", m.name)] = (
            f"{bundle.digest} max_num_seqs={config.max_num_seqs}"
            f" gpu_memory_utilization={config.gpu_memory_utilization:g}"
        )
        for ci, cell in enumerate(cells):
            p = mi * nc + ci
            state[("route_weight", f"{m.name}/{cell}")] = int(twin.weights[mi, ci])
            if twin.scaler_paused[p] >= 0:
                state[("scaler_paused", f"{m.name}/{cell}")] = int(twin.scaler_paused[p])
            if twin.error_fraction[p] > 0:
                state[("serving_errors", f"{m.name}/{cell}")] = float(twin.error_fraction[p])
    for n in twin.nodes:
        if n.cordoned:
            state[("cordon", n.name)] = True
        for key, (value, effect) in n.taints.items():
            state[("taint", f"{n.name} {key}")] = f"{value}:{effect}"
        for key, value in n.labels.items():
            state[("label", f"{n.name} {key}")] = value
        for comp, version in n.versions.items():
            state[("version", f"{n.name} {comp}")] = version
    # competing pullers and their freeze, pool recycling, admission modes, region homing
    for part, setting in twin.recovery.state().items():
        state[("recovery", part)] = repr(setting)
    training = twin.training
    for queue, policy in training.stop_policy.items():
        if policy is not None:
            state[("queue_stop_policy", queue)] = policy
    for js in training.jobs:
        if js.suspend:
            state[("jobset_suspended", js.spec.name)] = True
    return state


def _touched_keys(op: ops.Operation) -> list[Key]:
    """Keys of state the twin also changes by itself, that ``op`` sets."""
    match op:
        case (
            ops.InjectDcgmField(node=node, gpu=gpu, field_id=fid)
            | ops.ClearDcgmField(node=node, gpu=gpu, field_id=fid)
        ):
            return [("dcgm", f"{node} gpu{gpu} field{fid}")]
        case ops.InjectLinkFlap(node=node) | ops.ClearLinkFlap(node=node):
            return [("link_down", node)]
        case ops.InjectThermal(node=node, gpu=gpu) | ops.ClearThermal(node=node, gpu=gpu):
            return [("thermal", f"{node} gpu{gpu}")]
        case ops.SetReplicas(model=model, cell=cell):
            return [("replicas", f"{model}/{cell}")]
        case (
            ops.InjectHang(jobset=name)
            | ops.InjectStraggler(jobset=name)
            | ops.ClearTrainingFault(jobset=name)
        ):
            return [("training_fault", name)]
    return []


def _read_touched(twin: Twin, key: Key) -> Value:
    kind, target = key
    if kind == "dcgm":
        node, gpu, fid = target.split(" ")
        ni = twin.node_index[node]
        return float(twin.dcgm.get((ni, int(gpu[3:]), int(fid[5:])), 0.0))
    if kind == "link_down":
        return bool(twin.nodes[twin.node_index[target]].link_down)
    if kind == "thermal":
        node, gpu = target.split(" ")
        return bool(twin.dcgm.get((twin.node_index[node], int(gpu[3:]), -2), 0.0))
    if kind == "replicas":
        model, cell = target.split("/")
        p = twin.model_index[model] * len(twin.cell_names) + twin.cell_index[cell]
        return int(twin.desired[p])
    if kind == "training_fault":
        fault = twin.training.jobs[twin.training.index[target]].fault
        return None if fault is None else f"{fault.kind} node {twin.nodes[fault.node].name}"
    raise KeyError(key)


class _Baseline:
    """The state to compare against; see the module docstring."""

    def __init__(self, twin: Twin) -> None:
        self.static = _static_state(twin)
        self.touched: dict[Key, Value] = {}
        self.nodes = frozenset(n.name for n in twin.nodes)

    def before_apply(self, twin: Twin, op: ops.Operation) -> None:
        for key in _touched_keys(op):
            if key not in self.touched:
                self.touched[key] = _read_touched(twin, key)

    def diff(self, twin: Twin) -> list[Injected]:
        now = _static_state(twin)
        out = [
            Injected(kind, target, self.static.get((kind, target)), now.get((kind, target)))
            for kind, target in self.static.keys() | now.keys()
            if not _same(self.static.get((kind, target)), now.get((kind, target)))
            and not self._joined_as_built(twin, kind, target, now.get((kind, target)))
        ]
        for key, before in self.touched.items():
            current = _read_touched(twin, key)
            if not _same(current, before):
                out.append(Injected(key[0], key[1], before, current))
        return sorted(out, key=lambda i: (i.kind, i.target))

    def _joined_as_built(self, twin: Twin, kind: str, target: str, now: Value) -> bool:
        """A node the autoscaler added since the baseline, with the versions a joining node gets.

        The twin builds a scaled-out node from the first node of its cell, so its versions are
        that node's: not something an operation left behind. A version that differs from it
        still shows (and a change to the first node shows on that node).
        """
        if kind != "version":
            return False
        node, _, component = target.partition(" ")
        if node in self.nodes or node not in twin.node_index:
            return False
        members = twin.cell_nodes[twin.nodes[twin.node_index[node]].cell]
        prototype = twin.nodes[members[0]] if members else None
        return prototype is not None and prototype.versions.get(component) == now


def _same(a: Value, b: Value) -> bool:
    """Equality that holds for NaN too (a value that stays NaN is not a change)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


# --- the handler ------------------------------------------------------------------------------


class _Reply(Exception):
    """Answer now with this status and JSON body (errors and early exits)."""

    def __init__(self, status: int, body: Mapping[str, object]) -> None:
        super().__init__(status)
        self.status = status
        self.body = body


def _bad(message: str) -> _Reply:
    return _Reply(400, {"error": message, "kind": "bad_request"})


def _json_float(value: float) -> float | None:
    return value if math.isfinite(value) else None  # NaN/inf travel as null


class _Query:
    def __init__(self, raw: str) -> None:
        self.params = parse_qs(raw, keep_blank_values=True)

    def opt_text(self, name: str) -> str | None:
        values = self.params.get(name)
        return values[-1] if values else None

    def text(self, name: str) -> str:
        value = self.opt_text(name)
        if value is None:
            raise _bad(f"missing query parameter '{name}'")
        return value

    def opt_number(self, name: str) -> float | None:
        raw = self.opt_text(name)
        if raw is None:
            return None
        try:
            value = float(raw)
        except ValueError:
            raise _bad(f"query parameter '{name}' must be a number, got {raw!r}") from None
        if not math.isfinite(value):
            raise _bad(f"query parameter '{name}' must be finite, got {raw!r}")
        return value

    def number(self, name: str) -> float:
        value = self.opt_number(name)
        if value is None:
            raise _bad(f"missing query parameter '{name}'")
        return value

    def matchers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for item in self.params.get("match", []):
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise _bad(f"'match' takes key=value, got {item!r}")
            out[key] = value
        return out


Route = Callable[[_Query, bytes], Mapping[str, object]]


class ControlApi:
    """Handles ``/v1/*`` requests for one twin; ``lock`` is the lock its stepping loop holds."""

    def __init__(self, twin: Twin, lock: threading.Lock, token: str) -> None:
        if len(token) < 16:
            raise ValueError("a control token has at least 16 characters")
        self._twin = twin
        self._world = TwinWorld(twin)
        self._lock = lock
        self._token = token.encode()
        with lock:
            self._baseline = _Baseline(twin)
        self._get: dict[str, Route] = {
            "/v1/now": self._now,
            "/v1/series": self._series_names,
            "/v1/query": self._query,
            "/v1/instant": self._instant,
            "/v1/cells": self._cells,
            "/v1/nodes": self._nodes,
            "/v1/pods": self._pods,
            "/v1/burn_in": self._burn_in,
            "/v1/changes": self._changes,
            "/v1/injected": self._injected,
            "/v1/faults": self._faults,
            "/v1/replica_transitions": self._replica_transitions,
            "/v1/capacity": self._capacity,
            "/v1/capacity_errors": self._capacity_errors,
            "/v1/digests": self._digests,
            "/v1/serving_digests": self._serving_digests,
            "/v1/unsigned_admitted": self._unsigned_admitted,
            # a scenario's reads (ScenarioWorld)
            "/v1/rollout": self._rollout,
            "/v1/jobset": self._jobset,
            "/v1/flight_recorder": self._flight_recorder,
            "/v1/egress": self._egress,
            "/v1/tool_calls": self._tool_calls,
            "/v1/compensations": self._compensations,
            "/v1/audit_complete_since": self._audit_complete_since,
            "/v1/warm_pool": self._warm_pool,
            "/v1/sandbox_pod": self._sandbox_pod,
            "/v1/operations": self._operations,
            "/v1/flags": self._flags,
            "/v1/quarantined_pods": self._quarantined_pods,
            "/v1/quarantine_actions": self._quarantine_actions,
            "/v1/fleet": self._fleet,
        }
        self._post: dict[str, Route] = {
            "/v1/apply": self._apply,
            "/v1/inverse": self._inverse,
            "/v1/advance": self._advance,
            "/v1/settle": self._settle,
        }

    def handle(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, str, str]:
        """(status, body, content type) for one request; never raises for bad input."""
        parts = urlsplit(target)
        try:
            self._authorize(headers)
            routes = self._post if method == "POST" else self._get
            route = routes.get(parts.path)
            if route is None:
                other = self._get if method == "POST" else self._post
                if parts.path in other:
                    wanted = "GET" if method == "POST" else "POST"
                    raise _Reply(405, {"error": f"{parts.path} takes {wanted}", "kind": "method"})
                known = sorted(self._get) + sorted(self._post)
                raise _Reply(404, {"error": f"not found: {parts.path} (known: {', '.join(known)})"})
            result = route(_Query(parts.query), body)
            return 200, json.dumps(result, allow_nan=False), _JSON
        except _Reply as reply:
            return reply.status, json.dumps(reply.body), _JSON
        # The thread serving this request must answer, whatever went wrong below: a dropped
        # connection tells the client nothing. The arguments were checked before anything was
        # applied, so this is a defect to report, not bad input.
        except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
            reason = {"error": f"internal error: {type(exc).__name__}: {exc}", "kind": "internal"}
            return 500, json.dumps(reason), _JSON

    def _authorize(self, headers: Mapping[str, str]) -> None:
        given = ""
        for name, value in headers.items():
            if name.lower() == "authorization":
                scheme, _, credential = value.partition(" ")
                if scheme.lower() == "bearer":
                    given = credential.strip()
        if not hmac.compare_digest(given.encode(), self._token):
            raise _Reply(401, {"error": "missing or wrong bearer token", "kind": "unauthorized"})

    # writes

    def _op(self, body: bytes) -> ops.Operation:
        data = _json_body(body)
        try:
            op = decode_op(data)
        except JournalError as exc:
            raise _bad(str(exc)) from None
        found = bounds.problems(op)
        if found:  # the same kind as the twin's own refusals: the client raises OperationError
            raise _Reply(400, {"error": "; ".join(found), "kind": "operation"})
        return op

    def _apply(self, _: _Query, body: bytes) -> Mapping[str, object]:
        op = self._op(body)
        with self._lock, _mapped():
            self._twin.inverse_of(op)  # validates every target before anything changes
            self._baseline.before_apply(self._twin, op)
            inverse = self._twin.apply(op)
        return encode_op(inverse)

    def _inverse(self, _: _Query, body: bytes) -> Mapping[str, object]:
        op = self._op(body)
        with self._lock, _mapped():
            return encode_op(self._twin.inverse_of(op))

    def _advance(self, _: _Query, body: bytes) -> Mapping[str, object]:
        data = _json_body(body)
        seconds = data.get("seconds") if isinstance(data, dict) else None
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise _bad('advance takes {"seconds": number}')
        if not 0.0 <= seconds <= MAX_ADVANCE_S:
            raise _bad(f"seconds must be within 0..{MAX_ADVANCE_S:g}, got {seconds}")
        with self._lock:
            self._twin.advance(float(seconds))
            return {"now_s": self._twin.now_s()}

    def _settle(self, _: _Query, __: bytes) -> Mapping[str, object]:
        with self._lock:
            self._world.settle()
            return {"now_s": self._twin.now_s()}

    # reads

    def _now(self, _: _Query, __: bytes) -> Mapping[str, object]:
        with self._lock:
            return {"now_s": self._twin.now_s()}

    def _series_names(self, _: _Query, __: bytes) -> Mapping[str, object]:
        with self._lock:
            return {"names": list(self._twin.series_names())}

    def _query(self, q: _Query, _: bytes) -> Mapping[str, object]:
        name, start_s, end_s = q.text("name"), q.number("start_s"), q.number("end_s")
        with self._lock:
            found = self._twin.query(name, q.matchers(), start_s=start_s, end_s=end_s)
        return {
            "series": [
                {
                    "name": s.name,
                    "labels": [list(kv) for kv in s.labels],
                    "t_s": [float(t) for t in s.t_s],
                    "values": [_json_float(float(v)) for v in s.values],
                }
                for s in found
            ]
        }

    def _instant(self, q: _Query, _: bytes) -> Mapping[str, object]:
        name = q.text("name")
        with self._lock:
            t_s, labels, values = self._twin.instant(name, q.matchers())
        return {
            "t_s": float(t_s),
            "labels": [[list(kv) for kv in lab] for lab in labels],
            "values": [_json_float(float(v)) for v in values],
        }

    def _cells(self, _: _Query, __: bytes) -> Mapping[str, object]:
        with self._lock:
            return {"cells": to_wire(list(self._twin.cells()))}

    def _nodes(self, q: _Query, _: bytes) -> Mapping[str, object]:
        name, cell = q.opt_text("name"), q.opt_text("cell")
        with self._lock, _mapped():
            if name is not None:
                return {"nodes": [to_wire(self._twin.node(name))]}
            return {"nodes": to_wire(list(self._twin.node_views(cell=cell)))}

    def _pods(self, q: _Query, _: bytes) -> Mapping[str, object]:
        node, gpu_raw = q.text("node"), q.opt_text("gpu")
        try:
            gpu = None if gpu_raw is None else int(gpu_raw)
        except ValueError:
            raise _bad(f"query parameter 'gpu' must be an integer, got {gpu_raw!r}") from None
        with self._lock, _mapped():
            return {"pods": list(self._twin.pods_on(node, gpu))}

    def _burn_in(self, q: _Query, _: bytes) -> Mapping[str, object]:
        node = q.text("node")
        with self._lock, _mapped():
            result = self._twin.burn_in_result(node)
        return {"result": None if result is None else list(result)}

    def _changes(self, q: _Query, _: bytes) -> Mapping[str, object]:
        since_s, cell = q.opt_number("since_s"), q.opt_text("cell")
        with self._lock, _mapped():
            found = self._twin.changes(since_s=since_s or 0.0, cell=cell)
        return {"changes": to_wire(list(found))}

    def _faults(self, q: _Query, _: bytes) -> Mapping[str, object]:
        since_s = q.opt_number("since_s") or 0.0
        with self._lock:
            return {"faults": to_wire(list(self._world.fault_events(since_s=since_s)))}

    def _replica_transitions(self, q: _Query, _: bytes) -> Mapping[str, object]:
        since_s = q.opt_number("since_s") or 0.0
        with self._lock:
            found = self._world.replica_transitions(since_s=since_s)
        return {"transitions": to_wire(list(found))}

    def _capacity(self, q: _Query, _: bytes) -> Mapping[str, object]:
        model, cell = q.text("model"), q.text("cell")
        with self._lock, _mapped():
            return {
                "max_rps_per_replica": _json_float(self._world.max_rps_per_replica(model, cell)),
                "cold_cache_penalty": _json_float(self._world.cold_cache_penalty(model, cell)),
            }

    def _capacity_errors(self, _: _Query, __: bytes) -> Mapping[str, object]:
        with self._lock:
            return {"capacity_errors": self._world.capacity_errors()}

    def _digests(self, q: _Query, _: bytes) -> Mapping[str, object]:
        model, digest = q.opt_text("model"), q.opt_text("digest")
        if (model is None) == (digest is None):
            raise _bad("digests takes exactly one of 'model' or 'digest'")
        with self._lock, _mapped():
            if model is not None:
                return {"digests": to_wire(list(self._world.published(model)))}
            assert digest is not None
            record = self._world.digest_record(digest)
        return {"digests": [] if record is None else [to_wire(record)]}

    def _serving_digests(self, q: _Query, _: bytes) -> Mapping[str, object]:
        region = q.text("region")
        with self._lock, _mapped():
            return {"serving": to_wire(list(self._world.serving_digests(region)))}

    def _unsigned_admitted(self, _: _Query, __: bytes) -> Mapping[str, object]:
        with self._lock:
            return {"unsigned_replicas_admitted": self._world.unsigned_replicas_admitted()}

    # a scenario's reads

    def _rollout(self, q: _Query, _: bytes) -> Mapping[str, object]:
        model = q.text("model")
        with self._lock, _mapped():
            return {"rollout": to_wire(self._world.rollout_view(model))}

    def _jobset(self, q: _Query, _: bytes) -> Mapping[str, object]:
        name = q.text("name")
        with self._lock, _mapped():
            return {"jobset": to_wire(self._world.jobset(name))}

    def _flight_recorder(self, q: _Query, _: bytes) -> Mapping[str, object]:
        name = q.text("jobset")
        with self._lock, _mapped():
            return {"ranks": to_wire(list(self._world.flight_recorder(name)))}

    def _window(self, q: _Query) -> tuple[float, float, str | None]:
        start_s, end_s = q.number("start_s"), q.number("end_s")
        if end_s < start_s:
            raise _bad(f"end_s ({end_s:g}) is before start_s ({start_s:g})")
        return start_s, end_s, q.opt_text("tenant")

    def _egress(self, q: _Query, _: bytes) -> Mapping[str, object]:
        start_s, end_s, tenant = self._window(q)
        with self._lock, _mapped():
            found = self._world.egress_records(start_s=start_s, end_s=end_s, tenant=tenant)
        return {"records": to_wire(list(found))}

    def _tool_calls(self, q: _Query, _: bytes) -> Mapping[str, object]:
        start_s, end_s, tenant = self._window(q)
        with self._lock, _mapped():
            found = self._world.tool_records(start_s=start_s, end_s=end_s, tenant=tenant)
        return {"records": to_wire(list(found))}

    def _compensations(self, q: _Query, _: bytes) -> Mapping[str, object]:
        tenant = q.opt_text("tenant")
        with self._lock:
            found = self._world.sandbox.compensations(tenant=tenant)
        return {"compensations": to_wire(list(found))}

    def _audit_complete_since(self, _: _Query, __: bytes) -> Mapping[str, object]:
        with self._lock:
            since = self._world.sandbox.complete_since_s()
        # -inf (nothing rolled off yet: every record since the start is held) travels as null
        return {"complete_since_s": None if since == -math.inf else since}

    def _warm_pool(self, q: _Query, _: bytes) -> Mapping[str, object]:
        tenant = q.text("tenant")
        with self._lock, _mapped():
            return {"warm_pool": self._world.sandbox.warm_pool(tenant)}

    def _sandbox_pod(self, q: _Query, _: bytes) -> Mapping[str, object]:
        pod = q.text("pod")
        with self._lock:
            return {"exists": self._world.sandbox.has_pod(pod)}

    def _operations(self, q: _Query, _: bytes) -> Mapping[str, object]:
        raw = q.opt_text("since") or "0"
        if not raw.isdigit():
            raise _bad(f"query parameter 'since' is a count of operations, got {raw!r}")
        since = int(raw)
        with self._lock:
            journal = self._world.operations()
            if since > len(journal):  # a client that read another twin's journal
                raise _bad(f"'since' is {since}, but only {len(journal)} operations were applied")
            applied = list(journal[since:])
        return {"operations": [encode_applied(a) for a in applied]}

    def _flags(self, _: _Query, __: bytes) -> Mapping[str, object]:
        with self._lock:
            return {"flags": dict(self._world.flags())}

    def _quarantined_pods(self, _: _Query, __: bytes) -> Mapping[str, object]:
        with self._lock:
            return {"pods": sorted(self._world.quarantined_pods())}

    def _quarantine_actions(self, _: _Query, __: bytes) -> Mapping[str, object]:
        with self._lock:
            return {"actions": dict(self._world.quarantine_actions())}

    def _fleet(self, _: _Query, __: bytes) -> Mapping[str, object]:
        with self._lock:
            return {"fleet": self._world.fleet_spec().model_dump(mode="json")}

    def _injected(self, _: _Query, __: bytes) -> Mapping[str, object]:
        with self._lock:
            found = self._baseline.diff(self._twin)
            now_s = self._twin.now_s()
        return {"now_s": now_s, "injected": [_json_injected(i) for i in found]}


def _json_body(body: bytes) -> object:
    """The request body as JSON; a 400 for anything else (too big, too deep, not JSON)."""
    if len(body) > MAX_BODY_BYTES:
        raise _bad(f"body over {MAX_BODY_BYTES} bytes")
    try:
        return json.loads(body or b"null")
    except RecursionError:
        raise _bad("body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, a 5,000-digit integer
        raise _bad(f"body is not JSON: {exc}") from None


def _json_value(value: Value) -> Value:
    return _json_float(value) if isinstance(value, float) else value


def _json_injected(item: Injected) -> dict[str, Value]:
    return {
        "kind": item.kind,
        "target": item.target,
        "baseline": _json_value(item.baseline),
        "now": _json_value(item.now),
    }


class _mapped:
    """Map the twin's refusals to 4xx replies (a context manager)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, UnknownTargetError):
            raise _Reply(
                400,
                {
                    "error": str(exc),
                    "kind": "unknown_target",
                    "target_kind": exc.kind,
                    "name": exc.name,
                },
            ) from exc
        if isinstance(exc, OperationError):
            raise _Reply(400, {"error": str(exc), "kind": "operation"}) from exc
        if isinstance(exc, FiredrillError):
            raise _Reply(400, {"error": str(exc), "kind": "bad_request"}) from exc


def describe(injected: Sequence[Injected] | Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per leftover, for humans."""
    lines = []
    for i in injected:
        d = to_wire(i) if isinstance(i, Injected) else i
        lines.append(f"{d['kind']} {d['target']}: {d['baseline']!r} -> {d['now']!r}")
    return lines


def control_api(
    twin: Twin, lock: threading.Lock, *, host: str, enabled: bool | None, token_file: Path
) -> ControlApi | None:
    """The API ``twin serve`` mounts: on by default only on loopback; writes a fresh token."""
    if enabled is None:
        enabled = is_loopback(host)
    if not enabled:
        return None
    return ControlApi(twin, lock, write_token_file(token_file))
