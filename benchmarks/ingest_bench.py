"""Alert ingestion to incidents: in process (``IncidentBook``) and through the store (SQLite).

Generates N deterministic alert notifications (default 20,000) shaped like real storms, in
episodes that repeat until N is reached:

- an XID storm: 400 nodes of one cell raise ``DCGMXidFatal`` tickets within a minute (one
  incident, not 400);
- burn-rate pages over 7 cells (fast and slow tier of two objectives each, paid tier);
- security tripwires (two per episode, each its own SEV1 incident);
- then every alert resolves, and each incident whose alerts all resolved is resolved.

Each alert is one notification (labels + at_s), the hardest case for the store: one group, one
write. Three ways through:

- ``book``: ``IncidentBook.ingest`` alone, in memory;
- ``store``: ``AlertIngestor`` on a SQLite file in a temporary directory, **one transaction per
  alert** (what a webhook receiver does: each alert is committed before the next is taken);
- ``store-batched``: the same, one transaction per ``--batch`` alerts.

Prints alerts/s and p50/p99/max latency per alert (for ``store``, each alert's whole
transaction: begin, writes, commit; batched, each alert's share of its batch), the same for the
firing alerts alone (a resolved alert writes nothing), incidents opened, audit records, the
database's size, CPU seconds (well below wall: the run waited for a core) and the machine. A
benchmark, not a test: nothing is asserted; targets live in BENCHMARKS.md (≥ 2,000 alerts/s and
p99 < 50 ms per alert through the store on SQLite).

    python benchmarks/ingest_bench.py                    # 20,000 alerts, all three ways
    python benchmarks/ingest_bench.py --alerts 5000 --batch 200 --json out/ingest.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import sqlalchemy
from sqlalchemy.orm import Session

from firedrill.detect.notify import Notification
from firedrill.model.series import Labels, labels_of
from firedrill.respond.incidents import IncidentBook
from firedrill.store import audit, open_store
from firedrill.store.ingest import AlertIngestor

STORM_NODES = 400
BURN_CELLS = 7
TRIPWIRES = 2
REGIONS = ("us-east-1", "us-west-2", "eu-west-1")


@dataclass(frozen=True)
class Alert:
    labels: Labels
    at_s: float
    resolved: bool = False


@dataclass(frozen=True)
class Resolve:
    """Resolve every incident whose alerts have all resolved (a human's call, between alerts)."""

    at_s: float


Event = Alert | Resolve


def workload(n: int, seed: int) -> list[Event]:
    """``n`` alerts (firing and resolved) in storm episodes, plus the resolve points."""
    rng = random.Random(seed)
    out: list[Event] = []
    count = 0
    t = 0.0
    episode = 0
    while count < n:
        cells = [f"c{(episode * 3 + i) % 40:02d}" for i in range(BURN_CELLS)]
        storm_cell = cells[0]
        region = REGIONS[episode % len(REGIONS)]
        firing: list[Alert] = []
        for i in range(STORM_NODES):
            node = f"gpu-{storm_cell}-{i:04d}"
            labels = labels_of(
                alertname="DCGMXidFatal",
                severity="ticket",
                cell=storm_cell,
                region=region,
                node=node,
                gpu=str(rng.randrange(8)),
                team="gpu-fleet",
            )
            firing.append(Alert(labels, t + rng.uniform(0.0, 60.0)))
        for cell in cells:
            for objective in ("ttft", "availability"):
                for tier, factor in (("fast", "14.4"), ("slow", "6")):
                    labels = labels_of(
                        alertname=f"Cell{objective.upper()}Burn{tier.capitalize()}",
                        severity="page",
                        cell=cell,
                        region=REGIONS[(episode + int(cell[1:])) % len(REGIONS)],
                        burn_tier=tier,
                        burn_factor=factor,
                        tier="paid",
                        slo=objective,
                    )
                    firing.append(Alert(labels, t + rng.uniform(30.0, 120.0)))
        for i in range(TRIPWIRES):
            labels = labels_of(
                alertname="SandboxReachedMetadata",
                severity="security",
                cell=cells[1 + i],
                region=region,
                tenant=f"tenant-{rng.randrange(100):03d}",
            )
            firing.append(Alert(labels, t + rng.uniform(0.0, 120.0)))
        firing.sort(key=lambda a: a.at_s)
        end = t + 900.0
        resolved = [Alert(a.labels, end + i * 0.01, resolved=True) for i, a in enumerate(firing)]
        for alert in (*firing, *resolved):
            if count == n:
                break
            out.append(alert)
            count += 1
        out.append(Resolve(end + 60.0))
        t = end + 3600.0
        episode += 1
    return out


def _notification(a: Alert) -> Notification:
    m = dict(a.labels)
    receiver = m["severity"] if m["severity"] in ("page", "security") else "ticket"
    return Notification(
        receiver=receiver,
        group_key=(m["cell"], m["alertname"]),
        alertname=m["alertname"],
        cell=m["cell"],
        at_s=a.at_s,
        alerts=() if a.resolved else (a.labels,),
        resolved=(a.labels,) if a.resolved else (),
    )


@dataclass
class Result:
    way: str
    alerts: int
    wall_s: float
    alerts_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    incidents: int
    firing_per_s: float = 0.0  # firing alerts only: the ones that write
    firing_p99_ms: float = 0.0
    audit_records: int | None = None
    db_mb: float | None = None
    cpu_s: float = 0.0  # process CPU time of the run: well below wall_s means it waited for a core


def _q(lat: list[int], p: float) -> float:
    return lat[min(len(lat) - 1, int(p * len(lat)))] / 1e6


def _result(
    way: str, lat_ns: list[int], firing: list[bool], wall_s: float, incidents: int
) -> Result:
    lat = sorted(lat_ns)
    n = len(lat)
    fired = sorted(x for x, f in zip(lat_ns, firing, strict=True) if f)
    return Result(
        way,
        n,
        wall_s,
        n / wall_s,
        _q(lat, 0.50),
        _q(lat, 0.99),
        lat[-1] / 1e6,
        incidents,
        firing_per_s=len(fired) / (sum(fired) / 1e9) if fired else 0.0,
        firing_p99_ms=_q(fired, 0.99) if fired else 0.0,
    )


def run_book(events: list[Event]) -> Result:
    cpu0 = time.process_time()
    book = IncidentBook()
    lat: list[int] = []
    firing: list[bool] = []
    clock = time.perf_counter_ns
    t0 = clock()
    for ev in events:
        if isinstance(ev, Resolve):
            for inc in book.incidents:
                if inc.status != "resolved" and not inc.firing:
                    book.resolve(inc.id, ev.at_s)
            continue
        a = clock()
        book.ingest(_notification(ev))
        lat.append(clock() - a)
        firing.append(not ev.resolved)
    res = _result("book", lat, firing, (clock() - t0) / 1e9, len(book.incidents))
    res.cpu_s = time.process_time() - cpu0
    return res


def _in_units(events: list[Event], batch: int) -> Iterator[list[Event]]:
    unit: list[Event] = []
    for ev in events:
        unit.append(ev)
        if isinstance(ev, Alert) and sum(isinstance(e, Alert) for e in unit) >= batch:
            yield unit
            unit = []
    if unit:
        yield unit


def run_store(events: list[Event], directory: Path, *, batch: int) -> Result:
    """Through ``AlertIngestor`` on a fresh SQLite file; one transaction per ``batch`` alerts."""
    path = directory / f"ingest-{batch}.db"
    store = open_store(f"sqlite:///{path}")
    store.migrate()
    ing = AlertIngestor(actor="alertmanager")
    lat: list[int] = []
    firing: list[bool] = []
    clock = time.perf_counter_ns

    def resolve_quiet(session: Session, at_s: float) -> None:
        for inc in ing.book.incidents:
            if inc.status != "resolved" and not inc.firing:
                ing.resolve(session, ing.store_id(inc.id), at_s)

    t0 = clock()
    cpu0 = time.process_time()
    for unit in _in_units(events, batch):
        a = clock()
        with store.session() as session:
            for ev in unit:
                if isinstance(ev, Resolve):
                    resolve_quiet(session, ev.at_s)
                else:
                    ing.ingest(session, ev.labels, ev.at_s, resolved=ev.resolved)
        took = clock() - a
        alerts = [e for e in unit if isinstance(e, Alert)]
        lat.extend([took // max(len(alerts), 1)] * len(alerts))  # per alert: its share
        firing.extend(not e.resolved for e in alerts)
    wall = (clock() - t0) / 1e9
    cpu = time.process_time() - cpu0
    with store.session() as session:
        records = audit.verify(session).records
    store.close()
    way = "store" if batch == 1 else f"store-batched ({batch}/tx)"
    res = _result(way, lat, firing, wall, len(ing.book.incidents))
    res.audit_records = records
    res.cpu_s = cpu
    res.db_mb = sum(p.stat().st_size for p in directory.glob(f"{path.name}*")) / 1e6
    return res


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, object]:
    return {
        "cpu": _cpu_model(),
        "cores_online": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "os": platform.platform(),
        "python": platform.python_version(),
        "sqlalchemy": sqlalchemy.__version__,
        "sqlite": sqlite3.sqlite_version,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--alerts", type=int, default=20_000, help="alert notifications (20,000)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--batch", type=int, default=500, help="alerts per transaction, batched")
    ap.add_argument("--ways", default="book,store,batched", help="which ways, comma-separated")
    ap.add_argument("--dir", type=Path, default=None, help="where the SQLite files go (a tmp dir)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON")
    args = ap.parse_args()
    events = workload(args.alerts, args.seed)
    machine = machine_info()
    print(
        f"machine: {machine['cpu']}, {machine['cores_usable']} usable of "
        f"{machine['cores_online']} cores; Python {machine['python']}, "
        f"SQLAlchemy {machine['sqlalchemy']}, SQLite {machine['sqlite']}"
    )
    firing = sum(isinstance(e, Alert) and not e.resolved for e in events)
    print(
        f"workload: {args.alerts:,} alerts ({firing:,} firing, {args.alerts - firing:,} resolved), "
        f"seed {args.seed}"
    )
    ways = set(args.ways.split(","))
    runs: list[Callable[[Path], Result]] = []
    if "book" in ways:
        runs.append(lambda d: run_book(events))
    if "store" in ways:
        runs.append(lambda d: run_store(events, d, batch=1))
    if "batched" in ways:
        runs.append(lambda d: run_store(events, d, batch=args.batch))
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="firedrill-ingest-", dir=args.dir) as tmp:
        print(
            f"{'way':<26} {'alerts':>7} {'wall s':>7} {'alerts/s':>9} {'p50 ms':>7} "
            f"{'p99 ms':>7} {'max ms':>7} {'firing/s':>9} {'f p99 ms':>8} {'incidents':>9} "
            f"{'audit':>6} {'db MB':>6} {'cpu s':>6}"
        )
        for run in runs:
            r = run(Path(tmp))
            results.append(r)
            print(
                f"{r.way:<26} {r.alerts:>7,} {r.wall_s:>7.2f} {r.alerts_per_s:>9,.0f} "
                f"{r.p50_ms:>7.3f} {r.p99_ms:>7.3f} {r.max_ms:>7.2f} {r.firing_per_s:>9,.0f} "
                f"{r.firing_p99_ms:>8.3f} {r.incidents:>9,} "
                f"{'' if r.audit_records is None else r.audit_records:>6} "
                f"{'' if r.db_mb is None else f'{r.db_mb:.1f}':>6} {r.cpu_s:>6.2f}",
                flush=True,
            )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        data = {"machine": machine, "alerts": args.alerts, "seed": args.seed}
        data["results"] = [asdict(r) for r in results]
        args.json.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
