"""Webhook ingestion through the real HTTP stack: ``firedrill serve`` (uvicorn) on loopback.

Starts ``firedrill serve`` as its own process on a SQLite store in a temporary directory, then
posts Alertmanager v4 payloads (``--batch`` alerts per call, one cell and alertname per call, as
Alertmanager groups them) at a paced rate from ``--clients`` threads for ``--seconds``:

1. the target rate (default 2,000 alerts/s): achieved rate, latency p50/p99, and whether every
   alert sent is stored (none lost);
2. ten times that: how many calls the server turned away with 503/429 + ``Retry-After``; those
   are re-sent after the delay asked (what Alertmanager does), and at the end every alert must
   be stored once.

Prints one line per phase; the figures go in BENCHMARKS.md. Usage:

    python benchmarks/webhook_bench.py [--rate 2000] [--batch 20] [--seconds 10]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

TOKEN = "bench-webhook-token"


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


def run_phase(
    url: str, *, rate: float, batch: int, seconds: float, clients: int, first: int
) -> dict[str, Any]:
    calls = int(rate * seconds / batch)
    interval = batch / rate  # seconds between calls, all clients together
    latencies: list[float] = []
    refused: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = time.perf_counter() + 0.2
    headers = {"Authorization": f"Bearer {TOKEN}"}

    def worker(k: int) -> None:
        with httpx.Client(base_url=url, timeout=30, headers=headers) as client:
            for n in range(k, calls, clients):
                due = start + n * interval
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                body = payload(first + n, batch)
                while True:
                    t0 = time.perf_counter()
                    try:
                        r = client.post("/api/v1/alerts/webhook", json=body)
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

    def q(p: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000
            if latencies
            else float("nan")
        )

    return {
        "calls": calls,
        "alerts": calls * batch,
        "wall_s": wall,
        "alerts_per_s": calls * batch / wall,
        "p50_ms": q(0.5),
        "p99_ms": q(0.99),
        "refused": len(refused),
        "errors": errors[:5],
        "n_errors": len(errors),
    }


def stored(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM received_alerts").fetchone()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=2000.0, help="alerts/s of the sustained phase")
    ap.add_argument("--batch", type=int, default=20, help="alerts per webhook call")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-pending", type=int, default=16)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="firedrill-bench-"))
    tokens = work / "tokens.yml"
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    tokens.write_text(
        f"tokens:\n  - sha256: {digest}\n    person: alertmanager\n    roles: [webhook]\n"
    )
    db = work / "serve.db"
    port = free_port()
    exe = Path(sys.executable).with_name("firedrill")
    cmd = [
        str(exe),
        "serve",
        "--tokens",
        str(tokens),
        "--db",
        f"sqlite:///{db}",
        "--port",
        str(port),
        "--tick",
        "0",
        "--max-pending",
        str(args.max_pending),
    ]
    log = (work / "serve.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline or proc.poll() is not None:
                raise SystemExit(f"serve did not start:\n{(work / 'serve.log').read_text()}")
            time.sleep(0.2)
        print(f"machine: {os.cpu_count()} cores; serve: uvicorn, SQLite (WAL), batch {args.batch}")
        sent = 0
        for label, rate in (("sustained", args.rate), ("10x", args.rate * 10)):
            res = run_phase(
                url,
                rate=rate,
                batch=args.batch,
                seconds=args.seconds,
                clients=args.clients if label == "sustained" else args.clients * 4,
                first=sent // args.batch + 1_000_000 * (label == "10x"),
            )
            sent += res["alerts"]
            kept = stored(db)
            print(
                f"{label:>9}: target {rate:,.0f} alerts/s -> {res['alerts_per_s']:,.0f} alerts/s "
                f"over {res['wall_s']:.1f} s; "
                f"p50 {res['p50_ms']:.1f} ms, p99 {res['p99_ms']:.1f} ms; "
                f"{res['refused']} calls refused with Retry-After (re-sent); "
                f"{res['n_errors']} errors {res['errors']}; stored {kept:,} of {sent:,} sent "
                f"({'none lost' if kept == sent else f'{sent - kept} LOST'})"
            )
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()


if __name__ == "__main__":
    main()
