"""Many runs of a drill: seeds, quantiles, the summary, and executors that agree run for run."""

from __future__ import annotations

import json
import multiprocessing
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from firedrill.adapters.process_executor import ProcessExecutor
from firedrill.cli import app
from firedrill.drill.many import (
    DrillJob,
    RunOutcome,
    SerialExecutor,
    distribution,
    quantile,
    run_many,
    run_seed,
    run_seeds,
    summarize,
)
from firedrill.drill.report import render_many_html, render_many_markdown
from firedrill.drill.run import Jitter, run_drill
from firedrill.errors import FiredrillError
from firedrill.specfile import load_drill
from firedrill.twin.world import embedded_world

DRILL = Path(__file__).parent / "many" / "drill.yaml"  # a 15-minute L5 drill on a 12-node fleet
RUNS, SEED = 4, 3


@pytest.fixture(scope="module")
def job() -> DrillJob:
    d = load_drill(DRILL)
    return DrillJob(d.spec, d.fleet, d.slo, d.policy, d.spec_sha256, make_world=embedded_world)


@pytest.fixture(scope="module")
def serial(job: DrillJob) -> dict[str, Any]:
    return run_many(job, runs=RUNS, seed=SEED, executor=SerialExecutor())


# -- quantiles and seeds ---------------------------------------------------------------------------


def test_quantiles_interpolate_between_closest_ranks() -> None:
    assert quantile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    hundred = [float(x) for x in range(1, 101)]
    assert quantile(hundred, 0.95) == pytest.approx(95.05)
    assert quantile(hundred, 0.99) == pytest.approx(99.01)
    assert quantile(hundred, 0.0) == 1.0
    assert quantile(hundred, 1.0) == 100.0
    assert quantile([7.0], 0.99) == 7.0
    rng = random.Random(1)
    for n in (2, 3, 10, 999):
        xs = [rng.uniform(0, 600) for _ in range(n)]
        for p in (0.5, 0.95, 0.99):
            assert quantile(xs, p) == pytest.approx(float(np.quantile(xs, p, method="linear")))
    with pytest.raises(ValueError, match="no values"):
        quantile([], 0.5)
    with pytest.raises(ValueError, match="between 0 and 1"):
        quantile([1.0], 1.5)


def test_a_distribution_counts_unmeasured_runs_apart() -> None:
    d = distribution([10.0, None, 30.0, 20.0, None])
    assert d == {
        "p50": 20.0,
        "p95": 29.0,
        "p99": 29.8,
        "min": 10.0,
        "max": 30.0,
        "mean": 20.0,
        "n": 3,
        "unmeasured": 2,
    }
    empty = distribution([None, None])
    assert empty["p50"] is None
    assert (empty["n"], empty["unmeasured"]) == (0, 2)


def test_run_seeds_come_from_a_seed_sequence_of_the_sweep_seed_and_the_index() -> None:
    seeds = run_seeds(SEED, 50)
    assert seeds[2] == int(np.random.SeedSequence([SEED, 2]).generate_state(1)[0])
    assert seeds[2] == 960329833  # pinned: a sweep's seeds never change between releases
    assert len(set(seeds)) == 50
    assert run_seeds(SEED, 10) == seeds[:10]  # a longer sweep extends a shorter one
    assert run_seeds(SEED + 1, 10) != seeds[:10]
    assert all(0 <= s < 2**32 for s in seeds)
    with pytest.raises(FiredrillError, match="non-negative"):
        run_seed(-1, 0)


# -- the summary -----------------------------------------------------------------------------------


def outcome(index: int, verdict: str, measured: float | None, **kw: Any) -> RunOutcome:
    terms = {"detect_s": None if measured is None else measured / 4, "decide_s": 90.0}
    return RunOutcome(index, 1000 + index, verdict, f"run {index} {verdict}", measured,
                      terms, **kw)  # fmt: skip


def test_the_summary_counts_verdicts_stops_clauses_and_lists_runs_to_rerun(job: DrillJob) -> None:
    stop = job.spec.stop_conditions[0].name
    outcomes = [
        outcome(3, "aborted", None, stop=stop, stop_at_s=400.0, clauses=(False, True, False)),
        outcome(0, "passed", 100.0, clauses=(True, True, True)),
        outcome(2, "refused", None),
        outcome(1, "failed", 700.0, clauses=(True, True, False)),
        outcome(4, "passed", 300.0, clauses=(True, True, True)),
    ]
    s = summarize(job, outcomes, runs=5, seed=9)
    assert (s["runs"], s["seed"]) == (5, 9)
    assert s["verdicts"] == {"passed": 2, "failed": 1, "aborted": 1, "refused": 1}
    assert s["pass_rate"] == 0.4
    # the refused run measured nothing; the aborted one never served users within SLO again
    assert (s["measured"]["n"], s["measured"]["unmeasured"]) == (3, 1)
    assert (s["measured"]["p50"], s["measured"]["max"]) == (300.0, 700.0)
    assert s["terms"]["detect_s"]["p50"] == 75.0
    assert s["terms"]["shift_s"] == distribution([None] * 4)
    assert s["within_budget"] == 2
    assert s["stop_conditions"] == [{"name": stop, "kind": "paid_5xx_ratio", "fired": 1}]
    assert [c["held"] for c in s["hypothesis"]] == [3, 4, 2]
    assert all(c["runs"] == 4 for c in s["hypothesis"])
    assert [(r["index"], r["seed"], r["verdict"]) for r in s["not_passed"]] == [
        (1, 1001, "failed"),
        (2, 1002, "refused"),
        (3, 1003, "aborted"),
    ]
    assert [r["index"] for r in s["results"]] == [0, 1, 2, 3, 4]
    assert summarize(job, list(reversed(outcomes)), runs=5, seed=9) == s  # order does not matter
    json.dumps(s, allow_nan=False)
    md = render_many_markdown(s)
    assert "Pass rate 40.0% over 5 runs (2 passed, 1 failed, 1 aborted)" in md
    assert "<svg" in render_many_html(s)
    with pytest.raises(FiredrillError, match=r"expected runs 0\.\.5"):
        summarize(job, outcomes, runs=6, seed=9)


def test_a_sweep_reports_term_distributions_and_is_deterministic(
    job: DrillJob, serial: dict[str, Any]
) -> None:
    assert serial["runs"] == RUNS
    assert sum(serial["verdicts"].values()) == RUNS
    assert [r["seed"] for r in serial["results"]] == run_seeds(SEED, RUNS)
    # the jitter moves the fault, so detection differs from run to run
    detect = [r["terms"]["detect_s"] for r in serial["results"]]
    assert len(set(detect)) == RUNS
    d = serial["terms"]["detect_s"]
    assert d["min"] <= d["p50"] <= d["p95"] <= d["p99"] <= d["max"]
    assert d["p50"] == round(quantile(detect, 0.5), 3)
    assert serial["measured"]["n"] == RUNS
    assert serial["pass_rate"] == serial["verdicts"]["passed"] / RUNS
    assert run_many(job, runs=2, seed=SEED)["results"] == serial["results"][:2]


def test_runs_that_did_not_pass_rerun_alone_to_the_same_verdict(
    job: DrillJob, serial: dict[str, Any], tmp_path: Path
) -> None:
    bad = serial["not_passed"]
    assert bad, "the test drill's 210 s clause fails in some runs of this sweep"
    for row in bad:
        seed = row["seed"]
        alone = run_drill(job.spec, job.fleet, job.slo, job.policy, seed=seed,
                          jitter=Jitter(seed=seed), make_world=embedded_world).report  # fmt: skip
        swept = serial["results"][row["index"]]
        assert alone["verdict"] == swept["verdict"] == row["verdict"]
        assert alone["rto"]["measured_s"] == swept["measured_s"]
    # and from the command line, as the summary tells
    out = tmp_path / "one.json"
    res = CliRunner().invoke(
        app,
        ["gameday", "run", str(DRILL), "--seed", str(bad[0]["seed"]), "--jitter", "--quiet",
         "--journal-dir", str(tmp_path / "journal"), "--json", str(out)],
    )  # fmt: skip
    assert res.exit_code == 1, res.output
    assert json.loads(out.read_text())["verdict"] == bad[0]["verdict"]


# -- executors -------------------------------------------------------------------------------------


def test_two_worker_processes_give_the_serial_summary(
    job: DrillJob, serial: dict[str, Any]
) -> None:
    seen: list[int] = []
    got = run_many(
        job, runs=RUNS, seed=SEED, executor=ProcessExecutor(2), done=lambda o: seen.append(o.index)
    )
    assert got == serial
    assert sorted(seen) == list(range(RUNS))
    assert multiprocessing.active_children() == []


def test_an_interrupted_pool_stops_every_worker(job: DrillJob) -> None:
    def interrupt(_o: RunOutcome) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_many(job, runs=6, seed=SEED, executor=ProcessExecutor(2), done=interrupt)
    assert multiprocessing.active_children() == []


def test_ray_on_a_local_cluster_gives_the_process_summary(
    job: DrillJob, serial: dict[str, Any]
) -> None:
    pytest.importorskip("ray")
    from firedrill.adapters.ray_executor import RayExecutor

    ray_exec = RayExecutor(workers=2, init_options={"num_cpus": 2, "include_dashboard": False})
    runs = 3  # Ray's start-up dominates: keep the sweep small
    got = run_many(job, runs=runs, seed=SEED, executor=ray_exec)
    assert got["results"] == serial["results"][:runs]
    assert got == run_many(job, runs=runs, seed=SEED, executor=SerialExecutor())
    import ray

    assert not ray.is_initialized()  # the cluster it started is stopped again


# -- the command line ------------------------------------------------------------------------------


def test_gameday_run_with_runs_writes_the_summary_and_exits_by_pass_rate(
    serial: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "sweep"
    args = ["gameday", "run", str(DRILL), "--runs", str(RUNS), "--seed", str(SEED),
            "--workers", "2", "--out", str(out), "--quiet"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == (0 if serial["pass_rate"] == 1.0 else 1), res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary == {**serial, "spec_path": str(DRILL)}
    assert (out / "summary.md").read_text() == render_many_markdown(summary)
    assert (out / "summary.html").read_text() == render_many_html(summary)
    # one worker runs in this process; a lower bar passes the same sweep
    res = CliRunner().invoke(
        app, [*args[:-5], "--workers", "1", "--min-pass-rate", "0.5", "--quiet"]
    )
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--target", "http://127.0.0.1:9"], "--target and --db are for a single run"),
        (["--ray-address", "auto"], "--ray-address needs --executor ray"),
        (["--min-pass-rate", "2"], "a rate between 0 and 1"),
    ],
)
def test_gameday_run_refuses_a_sweep_it_cannot_run(extra: list[str], message: str) -> None:
    res = CliRunner().invoke(app, ["gameday", "run", str(DRILL), "--runs", "2", *extra])
    assert res.exit_code == 2
    assert message in " ".join(res.output.replace("│", " ").split())  # Rich wraps it in a box
