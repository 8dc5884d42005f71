"""Many runs of a drill: seeds, quantiles, the summary, and executors and batch sizes that agree
run for run."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import random
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from firedrill.adapters import worlds
from firedrill.adapters.process_executor import ProcessExecutor
from firedrill.cli import app
from firedrill.drill.many import (
    DrillJob,
    Executor,
    RunOutcome,
    SerialExecutor,
    Task,
    batches,
    distribution,
    quantile,
    run_many,
    run_one,
    run_seed,
    run_seeds,
    summarize,
)
from firedrill.drill.report import render_many_html, render_many_markdown
from firedrill.drill.run import Jitter, run_drill
from firedrill.errors import FiredrillError
from firedrill.ports import EnsembleFactory
from firedrill.specfile import load_drill
from firedrill.twin.world import embedded_world

DRILL = Path(__file__).parent / "many" / "drill.yaml"  # a 15-minute L5 drill on a 12-node fleet
# the same drill with a steady-state clause that some runs' demand noise breaks (refused runs)
STEADY_EDGE = Path(__file__).parent / "many" / "steady-edge.yaml"
RUNS, SEED = 4, 3
# the embedded twin's ensemble: batches run as ensembles, held to the single runs' outcomes
ENSEMBLE: EnsembleFactory = worlds.EMBEDDED_ENSEMBLE


def _job(path: Path) -> DrillJob:
    d = load_drill(path)
    return DrillJob(d.spec, d.fleet, d.slo, d.policy, d.spec_sha256, make_world=embedded_world,
                    make_ensemble=ENSEMBLE)  # fmt: skip


@pytest.fixture(scope="module")
def job() -> DrillJob:
    return _job(DRILL)


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


def _as_batches(seen: Sequence[int], runs: int, size: int) -> list[list[int]]:
    """The batches ``seen`` (run indices in ``done`` order) is made of, in the order they came;
    fails unless each batch's runs came together, in index order."""
    expected = [[i for i, _ in b] for b in batches([(i, 0) for i in range(runs)], size)]
    came: list[list[int]] = []
    at = 0
    while at < len(seen):
        unit = next((b for b in expected if b[0] == seen[at]), None)
        assert unit is not None, f"run {seen[at]} does not start a batch: {seen}"
        assert list(seen[at : at + len(unit)]) == unit, f"batch {unit} came as {seen}"
        came.append(unit)
        at += len(unit)
    assert sorted(came) == expected
    return came


@dataclasses.dataclass(frozen=True)
class _KillsItsWorkerOnce:
    """A world (or ensemble) factory whose first call in any worker ends that worker's process,
    as a lost node would; every later call builds what ``inner`` builds."""

    inner: Callable[..., Any]
    marker: Path  # created by the call that kills its worker

    def __call__(self, *args: Any) -> Any:
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return self.inner(*args)
        os._exit(1)


def test_the_summary_is_the_same_whatever_the_executor_and_the_batch_size(
    job: DrillJob, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Serial one run at a time, 2 processes in batches of 3, Ray in batches of 4 with an actor
    lost on the way: one summary."""
    pytest.importorskip("ray")
    import ray
    import ray.cloudpickle

    from firedrill.adapters.ray_executor import RayExecutor

    runs = 5  # batches of 3 and of 4 both leave a shorter last batch
    one = run_many(job, runs=runs, seed=SEED, executor=SerialExecutor())
    assert one["verdicts"]["passed"] < runs, "a run that did not pass is in one of the batches"
    # the first batch Ray starts loses its actor: a fresh actor reruns the whole batch
    killed = tmp_path / "killed"
    assert job.make_world is not None
    on_ray = dataclasses.replace(
        job,
        make_world=_KillsItsWorkerOnce(job.make_world, killed),
        make_ensemble=None
        if job.make_ensemble is None
        else _KillsItsWorkerOnce(job.make_ensemble, killed),
    )
    # Ray's workers get the class by value: they may not import this module
    by_value: Callable[[object], None] = ray.cloudpickle.register_pickle_by_value
    by_value(sys.modules[__name__])
    request.addfinalizer(partial(ray.cloudpickle.unregister_pickle_by_value, sys.modules[__name__]))
    sweeps: list[tuple[int, DrillJob, Executor]] = [
        (3, job, ProcessExecutor(2)),
        # Ray's start-up dominates: one small local cluster, once
        (
            4,
            on_ray,
            RayExecutor(workers=2, init_options={"num_cpus": 2, "include_dashboard": False}),
        ),
    ]
    for size, swept, executor in sweeps:
        seen: list[int] = []

        def done(o: RunOutcome, seen: list[int] = seen) -> None:
            seen.append(o.index)

        got = run_many(
            dataclasses.replace(swept, batch=size), runs=runs, seed=SEED, executor=executor,
            done=done,
        )  # fmt: skip
        assert got == one, type(executor).__name__
        _as_batches(seen, runs, size)  # one done per run, each batch's runs together, in order
    assert killed.exists(), "an actor was lost during the Ray sweep"
    assert multiprocessing.active_children() == []
    assert not ray.is_initialized()  # the cluster it started is stopped again


def test_batches_are_consecutive_runs_and_the_last_may_be_shorter() -> None:
    tasks: list[Task] = list(enumerate(run_seeds(SEED, 7)))
    assert batches(tasks, 3) == [tasks[0:3], tasks[3:6], tasks[6:7]]
    assert batches(tasks, 7) == [tasks] == batches(tasks, 50)
    assert batches(tasks, 1) == [[t] for t in tasks]
    assert batches([], 4) == []
    with pytest.raises(FiredrillError, match="at least 1 run"):
        batches(tasks, 0)


def test_a_batch_must_hold_at_least_one_run(job: DrillJob) -> None:
    with pytest.raises(FiredrillError, match=r"a batch is at least 1 run \(got 0\)"):
        dataclasses.replace(job, batch=0)


def test_refused_and_failed_runs_inside_a_batch_have_their_outcomes_alone() -> None:
    edge = dataclasses.replace(_job(STEADY_EDGE), batch=4)
    runs = 6  # batches of runs 0-3 and 4-5
    seen: list[int] = []
    summary = run_many(
        edge, runs=runs, seed=SEED, executor=SerialExecutor(), done=lambda o: seen.append(o.index)
    )
    assert seen == list(range(runs))
    verdicts = [r["verdict"] for r in summary["results"]]
    for unit in ([0, 1, 2, 3], [4, 5]):
        inside = {verdicts[i] for i in unit}
        assert "refused" in inside, f"runs {unit} hold a refusal: {verdicts}"
        assert len(inside) > 1, f"runs {unit} hold a run that was not refused: {verdicts}"
    assert "failed" in verdicts
    tasks = enumerate(run_seeds(SEED, runs))
    for (index, seed), swept in zip(tasks, summary["results"], strict=True):
        assert run_one(edge, index, seed).to_json() == swept
    assert summary == run_many(dataclasses.replace(edge, batch=1), runs=runs, seed=SEED)


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
    # one worker runs in this process; a lower bar passes the same sweep, in ensembles of 3
    again = tmp_path / "again.json"
    res = CliRunner().invoke(
        app,
        [*args[:-5], "--workers", "1", "--min-pass-rate", "0.5", "--batch", "3", "--json",
         str(again)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(again.read_text()) == summary
    assert f"{RUNS} runs in " in res.output
    assert "runs/s; process, 1 worker, in ensembles of 3)" in res.output


def test_the_default_batch_gives_every_worker_an_ensemble_of_at_most_32_runs() -> None:
    from firedrill.cli.many import default_batch

    assert default_batch(4, 2) == 2
    assert default_batch(5, 2) == 3  # ceil: two ensembles, the second shorter
    assert default_batch(3, 8) == 1  # fewer runs than workers: one run each
    assert default_batch(1000, 2) == 32
    assert default_batch(64, 1) == 32


def test_the_default_batch_keeps_the_ensembles_in_half_the_memory() -> None:
    from firedrill.cli.many import default_batch, member_mb

    demo_hour = member_mb(596, 1.0)  # about 12 MB: 32 fit anywhere
    assert 10.0 < demo_hour < 15.0
    assert default_batch(1000, 2, member=demo_hour, memory_mb=24_000) == 32
    day_10k = member_mb(10_000, 24.0)  # a generous 1.7 GB
    assert default_batch(1000, 2, member=day_10k, memory_mb=24_000) == 3  # 6 GB per worker
    assert default_batch(1000, 16, member=day_10k, memory_mb=24_000) == 1  # never below 1
    assert default_batch(4, 2, member=day_10k, memory_mb=None) == 2  # memory unknown


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "2"], "--batch groups the runs of a sweep: give --runs N (N > 1)"),
        (["--runs", "2", "--batch", "0"], "Invalid value for '--batch'"),
    ],
)
def test_gameday_run_refuses_a_batch_it_cannot_use(args: list[str], message: str) -> None:
    res = CliRunner().invoke(app, ["gameday", "run", str(DRILL), *args])
    assert res.exit_code == 2
    assert message in " ".join(res.output.replace("│", " ").split())


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
