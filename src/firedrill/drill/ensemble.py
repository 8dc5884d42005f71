"""An ensemble of runs: R runs of one drill on R worlds that step together.

A sweep's runs are independent, and on the embedded twin most of a run's cost is the per-step
overhead of a small fleet, paid once per run. ``run_batch`` hands R runs to the job's
``make_ensemble`` (a ``WorldEnsemble``: R worlds stepped in lockstep, the twin's serving
arithmetic done once for all R), each run's control plane (detection, incidents, levers, stop
conditions, failover) running on its own world at its own cadence; a run that ends or aborts
drops out. Each world keeps its own random streams, so run ``k`` of an ensemble is the single
run with the same seed and jitter, bit for bit. Without ``make_ensemble`` the runs go one after
the other (the same outcomes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from firedrill.drill.many import DrillJob, RunOutcome, Task, run_one
from firedrill.drill.run import world_args
from firedrill.ports import DrillWorld


def run_batch(job: DrillJob, tasks: Sequence[Task]) -> list[RunOutcome]:
    """The outcomes of ``tasks`` (in their order), run as one ensemble when the job has one."""
    if job.make_ensemble is None or len(tasks) < 2:
        return [run_one(job, index, seed) for index, seed in tasks]
    args = [
        world_args(job.spec, job.fleet, seed=seed, jitter=job.jitter(seed)) for _, seed in tasks
    ]
    hours = max(h for _, _, h in args)
    ensemble = job.make_ensemble([(fleet, twin_seed) for fleet, twin_seed, _ in args], hours)
    bodies: list[Callable[[DrillWorld], RunOutcome]] = [
        partial(run_one, job, index, seed) for index, seed in tasks
    ]
    return ensemble.run(bodies)
