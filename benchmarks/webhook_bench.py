"""Webhook ingestion through the real HTTP stack: ``firedrill serve`` (uvicorn) on loopback.

Starts ``firedrill serve`` as its own process on a store (a SQLite file in a temporary
directory, and/or a database on a PostgreSQL server the script starts on loopback with its
durable defaults: ``fsync`` and ``synchronous_commit`` on), then posts Alertmanager v4 payloads
(``--batch`` alerts per call, one cell and alertname per call, as Alertmanager groups them) at a
paced rate from ``--clients`` threads for ``--seconds``. The bodies are encoded before the clock
starts, so the load generator spends its CPU on sending, not on JSON:

1. the target rate (default 2,000 alerts/s): achieved rate, latency p50/p99/max, and whether
   every alert sent is stored (none lost);
2. ten times that: how many calls the server turned away with 503/429 + ``Retry-After``; those
   are re-sent after the delay asked (what Alertmanager does), and at the end every alert must
   be stored once.

``--compare REV`` runs the same phases, in the same run, on the source tree of git revision
REV too (``git archive``; the server then imports that tree), alternating ``--rounds`` times
between the two so both see the same load. Prints one line per phase with the server's CPU
seconds; the figures go in BENCHMARKS.md. Usage:

    python benchmarks/webhook_bench.py [--rate 2000] [--batch 50] [--seconds 5]
        [--db sqlite,postgresql] [--compare REV] [--rounds 1] [--phases sustained,10x]
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

TOKEN = "bench-webhook-token"
ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def payload(seq: int, batch: int) -> dict[str, Any]:
    cell = f"cell-{seq % 50:02d}"
    alerts = [
        {
            "status": "firing",
            "labels": {
                "alertname": "DCGMXidFatal",
                "cell": cell,
                "region": "us-east-1",
                "severity": "ticket",
                "node": f"node-{seq}-{i}",
            },
            "annotations": {},
            "startsAt": "2026-12-03T10:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "",
            "fingerprint": hashlib.sha256(f"{seq}/{i}".encode()).hexdigest()[:16],
        }
        for i in range(batch)
    ]
    return {
        "version": "4",
        "groupKey": cell,
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "ticket",
        "groupLabels": {"cell": cell},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "",
        "alerts": alerts,
    }


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_phase(
    url: str, *, rate: float, batch: int, seconds: float, clients: int, first: int
) -> dict[str, Any]:
    calls = int(rate * seconds / batch)
    interval = batch / rate  # seconds between calls, all clients together
    bodies = [json.dumps(payload(first + n, batch)).encode() for n in range(calls)]
    latencies: list[float] = []
    steady: list[float] = []  # calls due after the first second (incidents opened, code warm)
    refused: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = time.perf_counter() + 0.2
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    def worker(k: int) -> None:
        with httpx.Client(base_url=url, timeout=30, headers=headers) as client:
            for n in range(k, calls, clients):
                due = start + n * interval
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                while True:
                    t0 = time.perf_counter()
                    try:
                        r = client.post("/api/v1/alerts/webhook", content=bodies[n])
                    except httpx.HTTPError as exc:
                        with lock:
                            errors.append(type(exc).__name__)
                        time.sleep(0.5)
                        continue
                    took = time.perf_counter() - t0
                    if r.status_code in (429, 503):
                        with lock:
                            refused.append(r.status_code)
                        time.sleep(float(r.headers.get("Retry-After", "1")))
                        continue
                    with lock:
                        if r.status_code == 200:
                            latencies.append(took)
                            if n * interval >= 1.0:
                                steady.append(took)
                        else:
                            errors.append(str(r.status_code))
                    break

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    latencies.sort()
    steady.sort()

    def q(p: float, of: list[float] = latencies) -> float:
        return of[min(len(of) - 1, int(p * len(of)))] * 1000 if of else float("nan")

    return {
        "calls": calls,
        "alerts": calls * batch,
        "wall_s": wall,
        "alerts_per_s": calls * batch / wall,
        "p50_ms": q(0.5),
        "p99_ms": q(0.99),
        "steady_p99_ms": q(0.99, steady),
        "max_ms": latencies[-1] * 1000 if latencies else float("nan"),
        "refused": len(refused),
        "errors": errors[:5],
        "n_errors": len(errors),
    }


# --- stores ------------------------------------------------------------------------------------


@dataclass
class Postgres:
    """A PostgreSQL server on loopback with its durable defaults, for the whole run."""

    root: Path
    port: int
    as_postgres: list[str]
    bin: Path
    n: int = 0

    def new_url(self) -> str:
        import psycopg

        self.n += 1
        name = f"bench{self.n}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def stored(self, url: str) -> int:
        import psycopg

        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM received_alerts").fetchone()
            return int(row[0]) if row else 0

    def settings(self) -> str:
        import psycopg

        with psycopg.connect(self.url("postgres")) as conn:
            got = [
                f"{name}={conn.execute(f'SHOW {name}').fetchone()[0]}"  # type: ignore[index]
                for name in ("fsync", "synchronous_commit", "wal_sync_method")
            ]
        return ", ".join(got)


@contextmanager
def postgres() -> Iterator[Postgres]:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise SystemExit("PostgreSQL server binaries not found: make tools")
    pg_bin = Path(found[-1]).parent
    root = Path(tempfile.mkdtemp(prefix="firedrill-bench-pg-"))
    as_postgres: list[str] = []
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        as_postgres = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, user="postgres", group="postgres")
    data, port = root / "data", free_port()
    subprocess.run(
        [*as_postgres, str(pg_bin / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
         "-E", "UTF8", "--locale=C"],
        check=True, capture_output=True,
    )  # fmt: skip
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root}"  # durability as shipped
    subprocess.run(
        [*as_postgres, str(pg_bin / "pg_ctl"), "-D", str(data), "-l", str(root / "log"),
         "-o", options, "-w", "start"],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        yield Postgres(root, port, as_postgres, pg_bin)
    finally:
        subprocess.run(
            [*as_postgres, str(pg_bin / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


def stored_sqlite(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM received_alerts").fetchone()[0])


# --- one server --------------------------------------------------------------------------------


def source_tree(rev: str, work: Path) -> Path:
    """``src`` of git revision ``rev``, unpacked under ``work``."""
    out = work / f"src-{rev}"
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "src"],
        check=True,
        capture_output=True,
    ).stdout
    out.mkdir()
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(out, filter="data")
    return out / "src"


def serve_once(
    args: argparse.Namespace,
    *,
    label: str,
    src: Path,
    db_url: str,
    stored: Any,
    work: Path,
    tokens: Path,
) -> None:
    port = free_port()
    exe = Path(sys.executable).with_name("firedrill")
    cmd = [
        str(exe),
        "serve",
        "--tokens",
        str(tokens),
        "--db",
        db_url,
        "--port",
        str(port),
        "--tick",
        "0",
        "--max-pending",
        str(args.max_pending),
    ]
    env = dict(os.environ, PYTHONPATH=str(src))
    log_path = work / f"serve-{label.replace(' ', '-')}.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline or proc.poll() is not None:
                raise SystemExit(f"serve did not start:\n{log_path.read_text()}")
            time.sleep(0.2)
        sent = 0
        rates = {"sustained": args.rate, "10x": args.rate * 10}
        for phase in args.phases.split(","):
            rate = rates[phase]
            load = os.getloadavg()[0]
            cpu0 = cpu_s(proc.pid)
            res = run_phase(
                url,
                rate=rate,
                batch=args.batch,
                seconds=args.seconds,
                clients=args.clients if phase == "sustained" else args.clients * 4,
                first=sent // args.batch + 1_000_000 * (phase == "10x"),
            )
            cpu = cpu_s(proc.pid) - cpu0
            sent += res["alerts"]
            kept = stored(db_url)
            print(
                f"{label:>18} {phase:>9}: target {rate:,.0f} alerts/s -> "
                f"{res['alerts_per_s']:,.0f} alerts/s over {res['wall_s']:.1f} s; "
                f"p50 {res['p50_ms']:.1f} ms, p99 {res['p99_ms']:.1f} ms, "
                f"max {res['max_ms']:.1f} ms, p99 after the first second "
                f"{res['steady_p99_ms']:.1f} ms; {res['refused']} calls refused with Retry-After "
                f"(re-sent); {res['n_errors']} errors {res['errors']}; server CPU {cpu:.1f} s; "
                f"load {load:.1f}; stored {kept:,} of {sent:,} sent "
                f"({'none lost' if kept == sent else f'{sent - kept} LOST'})",
                flush=True,
            )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=2000.0, help="alerts/s of the sustained phase")
    ap.add_argument("--batch", type=int, default=50, help="alerts per webhook call")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-pending", type=int, default=16)
    ap.add_argument("--db", default="sqlite", help="comma-separated: sqlite, postgresql")
    ap.add_argument("--compare", metavar="REV", help="also run git revision REV's source tree")
    ap.add_argument("--rounds", type=int, default=1, help="alternations of the two trees")
    ap.add_argument(
        "--phases", default="sustained,10x", help="comma-separated: sustained, 10x (in order)"
    )
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="firedrill-bench-"))
    tokens = work / "tokens.yml"
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    tokens.write_text(
        f"tokens:\n  - sha256: {digest}\n    person: alertmanager\n    roles: [webhook]\n"
    )
    trees = [("this tree", ROOT / "src")]
    if args.compare:
        trees.insert(0, (args.compare, source_tree(args.compare, work)))
    backends = [b.strip() for b in args.db.split(",") if b.strip()]
    print(
        f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; serve: uvicorn; "
        f"batch {args.batch}, {args.clients} clients ({args.clients * 4} at 10x), "
        f"max-pending {args.max_pending}",
        flush=True,
    )
    for backend in backends:
        if backend == "sqlite":
            print("store: SQLite file (WAL; synchronous as each tree sets it)", flush=True)
            for r in range(args.rounds):
                for name, src in trees:
                    db = work / f"{name}-{r}.db"
                    serve_once(
                        args,
                        label=f"sqlite {name}",
                        src=src,
                        db_url=f"sqlite:///{db}",
                        stored=lambda _url, db=db: stored_sqlite(db),
                        work=work,
                        tokens=tokens,
                    )
        elif backend == "postgresql":
            with postgres() as pg:
                print(f"store: PostgreSQL on loopback ({pg.settings()})", flush=True)
                for _ in range(args.rounds):
                    for name, src in trees:
                        serve_once(
                            args,
                            label=f"postgresql {name}",
                            src=src,
                            db_url=pg.new_url(),
                            stored=pg.stored,
                            work=work,
                            tokens=tokens,
                        )
        else:
            raise SystemExit(f"unknown --db {backend!r}: sqlite or postgresql")


if __name__ == "__main__":
    main()
