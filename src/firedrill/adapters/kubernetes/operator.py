"""``firedrill controller`` as a process: the budgeted GPU health controller on a real cluster.

The policy, budgets, flapping detection, minHealthy floor and hourly cap are the control plane's
``RemediationController``, unchanged. This module gives it what a cluster deployment needs:

- **leader election** on a Lease (``lease.py``): replicas stand by; only the leader observes and
  acts. Leadership lost means the controller's in-memory cases are dropped: the next leader
  starts from the cluster as it reads it, never from a stale copy. Nodes it finds tainted
  ``gpu.corp/quarantine`` count against the floor and, conservatively, against this hour's
  budget (``RemediationController.adopt``); finishing their remediation is left to a human;
- **a node cache** kept by an informer (list, then watch with bookmarks; relist on 410) on a
  background thread, so reading the fleet's nodes every tick costs no request;
- **signals** from Prometheus through the ``Signals`` port (the DCGM exporter's series);
- **operations** through ``KubernetesFleet``: in advise mode (the default of the command) every
  write goes out as a server-side dry run (``dryRun=All``) and the journal keeps the requests;
- **probes**: ``/healthz`` (the loop ticked within three intervals) and ``/readyz`` (the last tick
  reached the apiserver and Prometheus);
- **its own metrics** on ``/metrics``: ``gpu_quarantine_actions_total{node,cell,region}`` (the
  series the generated ``QuarantineRateAnomalous`` and flapping rules read, so they mean the same
  here as on the twin), actions and budget blocks by kind, pages, leadership, API errors by
  outcome, and the time of the last tick.

Time is injected (``now``/``sleep``), so the loop runs in tests on a fake clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lightkube.resources.core_v1 import Node
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from firedrill.adapters.kubernetes.client import Connection
from firedrill.adapters.kubernetes.conventions import Conventions
from firedrill.adapters.kubernetes.fleet import KubernetesFleet
from firedrill.adapters.kubernetes.lease import LeaderElector
from firedrill.adapters.kubernetes.watch import Informer, change_events
from firedrill.errors import FiredrillError
from firedrill.ports import Signals
from firedrill.remediate.controller import QUARANTINE_KEY, RemediationController
from firedrill.remediate.policy import PolicySpec

__all__ = ["ControllerMetrics", "ControllerProcess", "ProbeServer"]


@dataclass
class ControllerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.quarantines = Counter(
            "gpu_quarantine_actions_total",
            "Nodes quarantined by the controller.",
            ["node", "cell", "region"],
            registry=r,
        )
        self.actions = Counter(
            "firedrill_controller_actions_total",
            "Remediation actions recorded, by kind.",
            ["action", "cell"],
            registry=r,
        )
        self.blocked = Counter(
            "firedrill_controller_blocked_total",
            "Quarantines a budget refused, by budget.",
            ["budget", "cell"],
            registry=r,
        )
        self.pages = Counter(
            "firedrill_controller_pages_total",
            "Budget pages (QuarantineRateAnomalous) raised.",
            ["cell", "budget"],
            registry=r,
        )
        self.errors = Counter(
            "firedrill_controller_errors_total",
            "Ticks that failed to read signals or reach the apiserver, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.leader = Gauge(
            "firedrill_controller_leader", "1 while this replica holds the Lease.", registry=r
        )
        self.last_tick = Gauge(
            "firedrill_controller_last_tick_timestamp_seconds",
            "Unix time of the last completed tick.",
            registry=r,
        )


class ControllerProcess:
    """One replica: elect, read signals, let the policy decide, act through the cluster's API."""

    def __init__(
        self,
        policy: PolicySpec,
        conn: Connection,
        signals: Signals,
        elector: LeaderElector,
        *,
        now: Callable[[], datetime],
        advise: bool = True,
        conventions: Conventions | None = None,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self.policy = policy
        self.signals = signals
        self.elector = elector
        self.now = now
        self.epoch = now()
        self.fleet = KubernetesFleet(
            conn.client,
            conn.transport,
            conventions=conventions,
            dry_run=advise,
            epoch=self.epoch,
            now=now,
        )
        self.metrics = metrics or ControllerMetrics()
        self.informer = Informer(conn.client, Node, on_change=self._node_changed)
        self.controller: RemediationController | None = None
        self.last_tick: datetime | None = None
        self.ticks = 0
        self.last_ok: bool = False
        self.last_error = ""
        self._seen = (0, 0, 0)

    def _node_changed(self, old: dict[str, Any] | None, new: dict[str, Any]) -> None:
        """A node's versions changed: a node_layer change for "what changed"."""
        at_s = (self.now() - self.epoch).total_seconds()
        self.fleet.changes_log.extend(change_events(old, new, at_s))

    def tick(self) -> None:
        """One evaluation interval."""
        leader = self.elector.step()
        self.metrics.leader.set(1.0 if leader else 0.0)
        try:
            if not leader:
                self.controller = None  # another replica acts; our cases would go stale
                self._seen = (0, 0, 0)
                self.last_ok = self.elector.last_error == ""
                self.last_error = self.elector.last_error
                return
            now_s = (self.now() - self.epoch).total_seconds()
            if self.controller is None:  # just became the leader: start from the cluster
                self.controller = RemediationController(self.policy, self.fleet)
                self.controller.adopt(
                    [
                        v.name
                        for v in self.fleet.node_views()
                        if any(t[0] == QUARANTINE_KEY for t in v.taints)
                    ],
                    now_s,
                )
            self.controller.observe(now_s, self.signals)
            self._export()
            self.last_ok, self.last_error = True, ""
        except FiredrillError as exc:
            outcome = getattr(exc, "outcome", type(exc).__name__)
            self.metrics.errors.labels(outcome=str(outcome)).inc()
            self.last_ok, self.last_error = False, str(exc)
        finally:
            self.ticks += 1
            self.last_tick = self.now()
            self.metrics.last_tick.set(self.last_tick.timestamp())

    def _export(self) -> None:
        assert self.controller is not None
        st = self.controller.state
        a0, b0, p0 = self._seen
        for rec in st.actions[a0:]:
            self.metrics.actions.labels(action=rec.action, cell=rec.cell).inc()
            if rec.action == "quarantine" and not rec.dry_run:
                region = self.controller.node_region.get(rec.node, "")
                self.metrics.quarantines.labels(node=rec.node, cell=rec.cell, region=region).inc()
        for blk in st.blocked[b0:]:
            self.metrics.blocked.labels(budget=blk.budget, cell=blk.cell).inc()
        for page in st.pages[p0:]:
            self.metrics.pages.labels(cell=page.cell, budget=page.budget).inc()
        self._seen = (len(st.actions), len(st.blocked), len(st.pages))

    def run(self, stop: Callable[[], bool], sleep: Callable[[float], None]) -> None:
        """Tick every evaluation interval until ``stop()``; give the Lease up on the way out."""
        self.informer.relist()
        self.fleet.node_cache = self.informer.values
        watcher = threading.Thread(target=self.informer.follow, args=(stop,), daemon=True)
        watcher.start()
        try:
            while not stop():
                self.tick()
                sleep(self.policy.timings.evaluation_interval_s)
        finally:
            self.elector.release()

    # -- probes ---------------------------------------------------------------------------------
    def healthy(self) -> bool:
        if self.last_tick is None:
            return True  # starting
        age_s = (self.now() - self.last_tick).total_seconds()
        return age_s <= 3 * self.policy.timings.evaluation_interval_s

    def ready(self) -> bool:
        return self.last_tick is not None and self.last_ok


class _Handler(BaseHTTPRequestHandler):
    process: ControllerProcess

    def do_GET(self) -> None:
        p = self.process
        if self.path == "/metrics":
            body, ctype, code = generate_latest(p.metrics.registry), CONTENT_TYPE_LATEST, 200
        elif self.path == "/healthz":
            ok = p.healthy()
            body, ctype, code = (b"ok\n" if ok else b"stale\n"), "text/plain", 200 if ok else 503
        elif self.path == "/readyz":
            ok = p.ready()
            text = "ok\n" if ok else f"not ready: {p.last_error or 'no tick yet'}\n"
            body, ctype, code = text.encode(), "text/plain", 200 if ok else 503
        else:
            body, ctype, code = b"not found\n", "text/plain", 404
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return  # probes every few seconds would flood the log


class ProbeServer:
    """``/healthz``, ``/readyz`` and ``/metrics`` for one process, on a background thread."""

    def __init__(self, process: ControllerProcess, host: str = "0.0.0.0", port: int = 8080) -> None:
        handler = type("Handler", (_Handler,), {"process": process})
        self.server = ThreadingHTTPServer((host, port), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> ProbeServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
