"""``firedrill serve``'s application in its own process, for the browser tests and the board
benchmark: ``python -m tests.web.ui_server --port P --db sqlite:///F --tokens T [--incidents N]``.

Same application, same uvicorn settings as ``firedrill serve``; what differs is the world behind
it, built in process so the test is fast and deterministic: the demo fleet's twin (seed 3) as the
fleet, a stand-in burn probe that keeps burning, and a runbook whose lever moves two cells' route
weights (fleet scope: it needs two approvers). One game-day result (the report tests' L5 fixture)
is stored so the game-day pages have a run to show. ``--incidents N`` opens N more incidents
straight in the store (the board benchmark's 1,000). ``--bench-publisher`` adds
``POST /bench/publish?rate=R&seconds=S``: a thread in this process publishes R events a second on
the event hub, each stamped with the wall time it was published, so the benchmark measures the
fan-out to subscribers apart from what a write costs (never part of ``firedrill serve``).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import uvicorn

from firedrill.app.serve import IncidentService, ServeSettings
from firedrill.specfile import load_fleet
from firedrill.store import incidents, ladder, open_store
from firedrill.twin.engine import Twin
from firedrill.web import WebSettings, create_app
from firedrill.web.auth import Tokens

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.drill.test_report import fixture_report  # noqa: E402
from tests.web.test_serve_levers import FLEET, Probe, both_cells  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--tokens", type=Path, required=True)
    parser.add_argument("--tick", type=float, default=0.5)
    parser.add_argument("--incidents", type=int, default=0)
    parser.add_argument("--bench-publisher", action="store_true")
    args = parser.parse_args()

    store = open_store(args.db)
    store.migrate()
    twin = Twin(load_fleet(FLEET), 3)
    twin.advance(60)
    probe = Probe()
    with store.session() as s:
        ladder.record(  # the gate wants L4 first: overridden, as a reason on the record
            session=s,
            name="l5-region-blackhole-llm-70b",
            rung=5,
            model="llm-70b",
            verdict="passed",
            run_by="Carol",
            runbook_author="Carol",
            at_s=3600.0,
            report=fixture_report(),
            started_at=datetime(2026, 11, 20, 10, tzinfo=UTC),
            override_reason="a stored run for the pages to show",
        )
        cells = [c.name for c in twin.cells()]
        for i in range(args.incidents):
            cell = cells[i % len(cells)]
            incidents.create(
                session=s,
                cell=cell,
                region=next(c.region for c in twin.cells() if c.name == cell),
                title=f"bench incident {i}",
                sev=1 + i % 4,
                opened_at_s=float(i),
            )
    service = IncidentService(
        store,
        clock=twin,
        settings=ServeSettings(verify_window_s=3600),
        fleet=twin,
        signals=twin,
        probe_factory=lambda firing: probe,
        runbooks={"ttft": both_cells, "availability": both_cells},
    )
    app = create_app(WebSettings(tokens=Tokens.load(args.tokens), tick_s=args.tick), service)
    if args.bench_publisher:
        hub = app.state.hub

        def publish(rate: float, seconds: float) -> None:
            start = time.perf_counter()
            k = 0
            while (due := start + k / rate) < start + seconds:
                time.sleep(max(0.0, due - time.perf_counter()))
                hub.publish("bench", "INC-0001", {"seq": k, "sent": time.time()})
                k += 1

        @app.post("/bench/publish")
        def bench_publish(rate: float, seconds: float) -> dict[str, float]:
            threading.Thread(target=publish, args=(rate, seconds), daemon=True).start()
            return {"rate": rate, "seconds": seconds}

    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", timeout_keep_alive=5)


if __name__ == "__main__":
    main()
