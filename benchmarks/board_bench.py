"""The incident board under load: 1,000 open incidents and 100 updates per second.

Starts ``firedrill serve``'s application as its own process (``tests/web/ui_server.py``: uvicorn
on loopback, SQLite, responder off) with ``--incidents`` open incidents in the store, logs in
through the login form like a browser, and measures:

1. **board render**: ``GET /ui/board`` (the whole page, every open incident with its SEV,
   deciding axis, IC and next update due) and the rows fragment htmx re-fetches, ``--renders``
   times each, idle;
2. **event fan-out**: ``--subscribers`` browser-like clients hold ``/ui/events`` open while the
   server publishes ``--rate`` events per second for ``--seconds`` on its event hub (a thread in
   the server process, each event stamped with the wall time it was published): latency from
   publication to each subscriber having read the event, and events missed;
2b. **writes through the API**: the same subscribers while ``--writers`` people post
   incident-channel updates through the JSON API, aiming at ``--rate`` in total. Latency is from
   the moment an update is sent to the moment each subscriber has read its event (the k-th event
   by a writer is that writer's k-th update; each writer posts one at a time);
3. **board render under that load** (the rows fragment once a second: an open board page
   re-fetches it at most every 2 s, however many events arrive).

Prints one line per measure; the figures go in BENCHMARKS.md. Usage:

    python benchmarks/board_bench.py [--incidents 1000] [--rate 100] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
FRAGMENT = {"HX-Request": "true", "HX-Target": "board-rows"}  # what htmx sends on a refresh


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def login(base: str, token: str) -> tuple[httpx.Client, str]:
    client = httpx.Client(base_url=base, timeout=60, follow_redirects=True)
    form = client.get("/ui/login")
    nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert nonce is not None, form.text[:500]
    r = client.post("/ui/login", data={"token": token, "csrf": nonce.group(1)})
    assert r.status_code == 200, r.text[:500]
    return client, r.text


def render(client: httpx.Client, fragment: bool) -> float:
    headers = FRAGMENT if fragment else {}
    start = time.perf_counter()
    r = client.get("/ui/board", headers=headers)
    took = time.perf_counter() - start
    assert r.status_code == 200, r.text[:300]
    return took


async def synthetic(base: str, cookie: str, args: argparse.Namespace) -> tuple[list[float], int]:
    """Latencies (s) of the server's own events to every subscriber, and how many went missing."""
    got: list[list[float]] = [[] for _ in range(args.subscribers)]
    ready = 0
    last_seq = int(args.rate * args.seconds) - 1

    async def subscribe(i: int) -> None:
        nonlocal ready
        async with (
            httpx.AsyncClient(
                base_url=base, timeout=None, cookies={"firedrill_session": cookie}
            ) as c,
            c.stream("GET", "/ui/events") as r,
        ):
            ready += 1
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    data = json.loads(line[6:])
                    if data.get("type") == "bench":
                        got[i].append(time.time() - float(data["sent"]))
                        if int(data["seq"]) >= last_seq:
                            return

    subs = [asyncio.create_task(subscribe(i)) for i in range(args.subscribers)]
    while ready < args.subscribers:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    async with httpx.AsyncClient(base_url=base, timeout=60) as c:
        r = await c.post("/bench/publish", params={"rate": args.rate, "seconds": args.seconds})
        assert r.status_code == 200, r.text
    await asyncio.wait(subs, timeout=args.seconds + 30)
    for t in subs:
        t.cancel()
    expected = (last_seq + 1) * args.subscribers
    latencies = [x for per in got for x in per]
    return latencies, expected - len(latencies)


async def fan_out(
    base: str, cookie: str, args: argparse.Namespace
) -> tuple[list[float], int, int, list[float]]:
    sent: dict[str, list[float]] = {f"writer-{w}": [] for w in range(args.writers)}
    got: list[dict[str, list[float]]] = [
        {f"writer-{w}": [] for w in range(args.writers)} for _ in range(args.subscribers)
    ]
    ready = 0
    done = asyncio.Event()

    async def subscribe(i: int) -> None:
        nonlocal ready
        async with (
            httpx.AsyncClient(
                base_url=base, timeout=None, cookies={"firedrill_session": cookie}
            ) as c,
            c.stream("GET", "/ui/events") as r,
        ):
            ready += 1
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    data = json.loads(line[6:])
                    if data.get("type") == "comms" and data.get("by") in got[i]:
                        got[i][data["by"]].append(time.perf_counter())
                if done.is_set():
                    return

    async def write(w: int) -> None:
        person = f"writer-{w}"
        interval = args.writers / args.rate  # seconds between this writer's updates
        async with httpx.AsyncClient(
            base_url=base, timeout=60, headers={"Authorization": f"Bearer {person}-token"}
        ) as c:
            start = time.perf_counter() + w * interval / args.writers
            k = 0
            while time.perf_counter() - start < args.seconds:
                due = start + k * interval
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                sent[person].append(time.perf_counter())
                r = await c.post(
                    f"/api/v1/incidents/INC-{1 + k % args.incidents:04d}/comms",
                    json={"channel": "incident_channel", "text": f"update {k} from {person}"},
                )
                assert r.status_code == 201, r.text
                k += 1

    board_times: list[float] = []

    async def board_while_loaded() -> None:
        async with httpx.AsyncClient(
            base_url=base, timeout=60, cookies={"firedrill_session": cookie}
        ) as c:
            while not done.is_set():
                t0 = time.perf_counter()
                r = await c.get(
                    "/ui/board", headers={"HX-Request": "true", "HX-Target": "board-rows"}
                )
                assert r.status_code == 200
                board_times.append(time.perf_counter() - t0)
                await asyncio.sleep(1.0)

    subs = [asyncio.create_task(subscribe(i)) for i in range(args.subscribers)]
    while ready < args.subscribers:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    boards = asyncio.create_task(board_while_loaded())
    started = time.perf_counter()
    await asyncio.gather(*(write(w) for w in range(args.writers)))
    elapsed = time.perf_counter() - started
    await asyncio.sleep(2.0)  # let the last events arrive
    done.set()
    boards.cancel()
    for t in subs:
        t.cancel()
    await asyncio.gather(*subs, boards, return_exceptions=True)
    latencies: list[float] = []
    missing = 0
    for per_sub in got:
        for person, times in sent.items():
            received = per_sub[person]
            missing += max(0, len(times) - len(received))
            latencies += [r - s for s, r in zip(times, received, strict=False)]
    total = sum(len(t) for t in sent.values())
    print(f"  posted {total} updates in {elapsed:.1f} s ({total / elapsed:.1f}/s)")
    return latencies, total, missing, board_times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--incidents", type=int, default=1000)
    parser.add_argument("--renders", type=int, default=20)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--writers", type=int, default=20)
    parser.add_argument("--subscribers", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        people = {"viewer-token": ("Vera", ["incident_commander"])}
        people |= {
            f"writer-{w}-token": (f"writer-{w}", ["comms_lead"]) for w in range(args.writers)
        }
        tokens = {
            "tokens": [
                {"sha256": hashlib.sha256(t.encode()).hexdigest(), "person": p, "roles": r}
                for t, (p, r) in people.items()
            ]
        }
        (work / "tokens.yml").write_text(yaml.safe_dump(tokens))
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        log = (work / "serve.log").open("wb")
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.web.ui_server",
                "--port",
                str(port),
                "--db",
                f"sqlite:///{work / 'store.db'}",
                "--tokens",
                str(work / "tokens.yml"),
                "--tick",
                "0",
                "--incidents",
                str(args.incidents),
                "--bench-publisher",
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit((work / "serve.log").read_text()[-3000:])
                time.sleep(0.2)
            client, page = login(base, "viewer-token")
            rows = page.count('href="/ui/incidents/INC-')
            total = re.search(r"(\d+) incidents", page)
            print(
                f"board: {total.group(1) if total else '?'} open incidents, {rows} on its first "
                f"page ({len(page) / 1024:.0f} KiB)"
            )
            for fragment in (False, True):
                times = [render(client, fragment) for _ in range(args.renders)]
                what = "rows fragment" if fragment else "whole page"
                print(
                    f"  render {what}: median {statistics.median(times) * 1000:.0f} ms, "
                    f"p95 {pct(times, 95) * 1000:.0f} ms over {args.renders}"
                )
            cookie = client.cookies["firedrill_session"]
            print(
                f"fan-out: {args.subscribers} subscribers, {args.writers} writers, "
                f"{args.rate:g} updates/s for {args.seconds:g} s"
            )
            latencies, missing = asyncio.run(synthetic(base, cookie, args))
            print(
                f"  server events -> subscribers: p50 {pct(latencies, 50) * 1000:.1f} ms, "
                f"p95 {pct(latencies, 95) * 1000:.1f} ms, p99 {pct(latencies, 99) * 1000:.1f} ms, "
                f"max {max(latencies) * 1000:.1f} ms over {len(latencies)} deliveries; "
                f"missing {missing}"
            )
            print(f"writes through the API ({args.writers} writers, aiming at {args.rate:g}/s):")
            latencies, total, missing, boards = asyncio.run(fan_out(base, cookie, args))
            print(
                f"  event latency: p50 {pct(latencies, 50) * 1000:.1f} ms, p95 "
                f"{pct(latencies, 95) * 1000:.1f} ms, p99 {pct(latencies, 99) * 1000:.1f} ms, "
                f"max {max(latencies) * 1000:.1f} ms over {len(latencies)} deliveries; "
                f"missing {missing} of {total * args.subscribers}"
            )
            print(
                f"  board fragment under load: median {statistics.median(boards) * 1000:.0f} ms, "
                f"max {max(boards) * 1000:.0f} ms over {len(boards)}"
            )
        finally:
            server.terminate()
            server.wait(timeout=30)
            log.close()


if __name__ == "__main__":
    main()
