"""The twin against a per-request discrete-event simulation (SimPy) of the same small cell.

A time-stepped twin pays a fixed cost per step whatever the load; a per-request simulation pays
per request. On a small cell the second is cheap, so this is where the twin's fixed per-step cost
shows. The cell: one cell of ``--replicas`` replicas with ``--seats`` seats each (c servers),
Poisson arrivals at utilisation ``--rho``, exponential service of mean ``--service`` seconds
(the twin's flat decode curve: every request costs the same mean), FIFO, requests that waited
``--timeout`` seconds give up; simulated for ``--hours`` (24). It is the shape of fleet the
queueing fidelity tests use (``queue_fidelity.py``), with one cell.

The SimPy model is the textbook one: a source process draws exponential inter-arrival times,
each request is a process that asks a ``simpy.Resource`` of c seats for a seat (or gives up at
the timeout), then holds it for an exponential service time. Both report the mean queue wait
next to Erlang C's, so the two are seen to simulate the same thing.

Each side is timed with ``time.process_time`` (minimum of ``--repeats``). The twin runs without
recorded series, in a child process per side: with ``--baseline REV`` on ``REV``'s code and on
this tree's, alternately (``side_by_side.py``), so the ratio before and after a change comes
from one run:

    .venv/bin/python benchmarks/cell_vs_simpy.py --baseline cec5384
    .venv/bin/python benchmarks/cell_vs_simpy.py --service 20 --hours 24

``--quiescent`` adds a third twin: this tree with the fleet spec's quiescent steps on
(``FleetSpec.quiescent``, macro steps of up to ``--max-step`` seconds), measured in the same
rounds as the others, so the default path, the quiescent one and SimPy come from one run. With
``--baseline REV`` too (and ``REV`` has the option), the quiescent twin runs on both sides as
well, alternately, so a change to the quiescent path is timed old against new in one run:

    .venv/bin/python benchmarks/cell_vs_simpy.py --quiescent --max-step 60
    .venv/bin/python benchmarks/cell_vs_simpy.py --baseline main --quiescent --max-step 60
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def simpy_cell(
    *, c: int, lam: float, service_s: float, timeout_s: float, hours: float, seed: int
) -> dict[str, float]:
    """Simulate the cell request by request; the mean wait of the admitted, counts."""
    import simpy

    env = simpy.Environment()
    seats = simpy.Resource(env, capacity=c)
    rng = random.Random(seed)
    served = [0]
    gave_up = [0]
    waited = [0.0]
    admitted = [0]

    def request(env: simpy.Environment) -> Generator[simpy.Event, Any, None]:
        t0 = env.now
        with seats.request() as seat:
            got = yield seat | env.timeout(timeout_s)
            if seat not in got:
                gave_up[0] += 1
                return
            admitted[0] += 1
            waited[0] += env.now - t0
            yield env.timeout(rng.expovariate(1.0 / service_s))
            served[0] += 1

    def source(env: simpy.Environment) -> Generator[simpy.Event, Any, None]:
        while True:
            yield env.timeout(rng.expovariate(lam))
            env.process(request(env))

    env.process(source(env))
    env.run(until=hours * 3600.0)
    return {
        "served": served[0],
        "gave_up": gave_up[0],
        "admitted": admitted[0],
        "mean_wait_s": waited[0] / max(admitted[0], 1),
    }


def _cell(args: argparse.Namespace) -> tuple[int, float]:
    c = args.seats * args.replicas
    return c, args.rho * c / args.service


def _time(fn: Any, repeats: int) -> tuple[float, Any]:
    best = float("inf")
    out = None
    for _ in range(repeats):
        t = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t)
    return best, out


def child_twin(args: argparse.Namespace) -> dict[str, Any]:
    """The twin side, on the firedrill first on the path (one side of --baseline)."""
    from queue_fidelity import _spec

    from firedrill.twin.engine import Twin

    spec = _spec(args.service, args.seats, args.replicas, 1, [args.rho])
    spec = spec.model_copy(
        update={"models": [spec.models[0].model_copy(update={"queue_timeout_s": args.timeout})]}
    )
    if args.quiescent:  # only this tree's spec has the option: the flag goes to its child only
        spec = spec.model_copy(
            update={
                "quiescent": spec.quiescent.model_copy(
                    update={"enabled": True, "max_step_s": args.max_step}
                )
            }
        )

    def run() -> Any:
        twin = Twin(spec, seed=args.seed, record=False, hours_hint=args.hours)
        twin.run_for(args.hours * 3600.0)
        twin.flush_ttft()
        return twin

    cpu, twin = _time(run, args.repeats)
    admitted = int(twin.admitted_total.sum())
    return {
        "cpu_s": cpu,
        "steps": twin.step_no,
        "macro_steps": getattr(twin, "macro_steps", 0),  # quiescent steps (older code: none)
        "admitted": admitted,
        "timed_out_or_failed": int(twin.errors.sum()),
        "mean_wait_s": float(twin.queue_wait_sum.sum()) / max(admitted, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--service", type=float, default=2.0, help="mean service time, seconds")
    ap.add_argument("--seats", type=int, default=2, help="max_num_seqs per replica")
    ap.add_argument("--replicas", type=int, default=8, help="replicas in the cell")
    ap.add_argument("--rho", type=float, default=0.7, help="utilisation")
    ap.add_argument("--timeout", type=float, default=300.0, help="queue timeout, seconds")
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--baseline", default=None, help="git revision: twin old and new")
    ap.add_argument("--rounds", type=int, default=1, help="--baseline: children per side")
    ap.add_argument(
        "--quiescent",
        action="store_true",
        help="also the twin with quiescent steps on (each side with --baseline)",
    )
    ap.add_argument("--max-step", type=float, default=60.0, help="--quiescent: max_step_s")
    ap.add_argument("--child-twin", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.child_twin:
        result = child_twin(args)
        if args.json is not None:
            args.json.write_text(json.dumps(result) + "\n")
        return 0

    from side_by_side import run_child, sides
    from twin_bench import machine_info

    c, lam = _cell(args)
    print(" ".join(f"{k}={v}" for k, v in machine_info().items()))
    print(
        f"cell: c = {c} seats ({args.replicas} replicas x {args.seats}), {lam:g} rps, "
        f"service {args.service:g} s (exponential), rho {args.rho:g}, "
        f"{args.hours:g} h, seed {args.seed}"
    )
    child = [
        "--child-twin",
        *("--service", str(args.service), "--seats", str(args.seats)),
        *("--replicas", str(args.replicas), "--rho", str(args.rho)),
        *("--timeout", str(args.timeout), "--hours", str(args.hours)),
        *("--seed", str(args.seed), "--repeats", str(args.repeats)),
    ]
    script = Path(__file__).resolve()
    both = sides(args.baseline) if args.baseline else [("this tree", ROOT / "src")]
    twin: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in both}
    # the quiescent twin on each side that has the option (an older REV may not)
    quiet_sides = [
        (
            f"quiescent {args.max_step:g} s"
            + (f", {label.split(' ')[0]}" if len(both) > 1 else ""),
            src,
        )
        for label, src in both
        if args.quiescent and (src / "firedrill" / "twin" / "quiescent.py").is_file()
    ]
    for label, _ in quiet_sides:
        twin[label] = []
    sim: list[tuple[float, dict[str, float]]] = []
    for _ in range(args.rounds):
        sim.append(
            _time(
                lambda: simpy_cell(
                    c=c,
                    lam=lam,
                    service_s=args.service,
                    timeout_s=args.timeout,
                    hours=args.hours,
                    seed=args.seed,
                ),
                args.repeats,
            )
        )
        for label, src in both:
            twin[label].append(run_child(script, child, src))
        q_child = [*child, "--quiescent", "--max-step", str(args.max_step)]
        for label, src in quiet_sides:
            twin[label].append(run_child(script, q_child, src))
    sim_cpu = min(s for s, _ in sim)
    sim_out = sim[0][1]
    erlang = _erlang_c_wait(c, lam, args.service)
    arrived = sim_out["admitted"] + sim_out["gave_up"]
    print(
        f"{'SimPy':<22} cpu {sim_cpu:8.3f} s  requests {arrived:>9.0f}"
        f"  mean wait {sim_out['mean_wait_s']:.4f} s (Erlang C {erlang:.4f} s)"
    )
    rows: dict[str, Any] = {"simpy": {"cpu_s": sim_cpu, **sim_out}, "erlang_c_wait_s": erlang}
    for label in twin:
        best = min(r["cpu_s"] for r in twin[label])
        r0 = twin[label][0]
        print(
            f"{label:<22} cpu {best:8.3f} s  admitted {r0['admitted']:>9}  mean wait "
            f"{r0['mean_wait_s']:.4f} s  {1e6 * best / r0['steps']:.1f} us/step  "
            f"SimPy/twin {sim_cpu / best:.2f}x"
        )
        rows[label] = {**r0, "cpu_s": best, "simpy_over_twin": sim_cpu / best}
    if len(both) == 2:
        (old, _), (new, _) = both
        print(f"twin old / new: {rows[old]['cpu_s'] / rows[new]['cpu_s']:.2f}x")
    if quiet_sides:
        new, quiet = both[-1][0], quiet_sides[-1][0]
        print(f"twin default / quiescent: {rows[new]['cpu_s'] / rows[quiet]['cpu_s']:.2f}x")
    if len(quiet_sides) == 2:
        (q_old, _), (q_new, _) = quiet_sides
        print(f"quiescent old / new: {rows[q_old]['cpu_s'] / rows[q_new]['cpu_s']:.2f}x")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


def _erlang_c_wait(c: int, lam: float, service_s: float) -> float:
    """Erlang C mean wait (M/M/c), computed here so the parent needs no firedrill import."""
    a = lam * service_s
    term = 1.0
    total = 1.0
    for k in range(1, c):
        term *= a / k
        total += term
    last = term * a / c / (1.0 - a / c)
    p_wait = last / (total + last)
    return p_wait * service_s / (c - a)


if __name__ == "__main__":
    sys.exit(main())
