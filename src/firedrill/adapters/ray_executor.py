"""Many drill runs on a Ray cluster (``firedrill gameday run DRILL --runs N --executor ray``).

The adapter side of `firedrill.drill.many`: the same runs, fanned out over Ray actors instead of
local processes, so a sweep of thousands of runs can use a whole cluster. Each actor receives the
loaded drill once (put in the object store once, resolved in the actor's constructor) and then
only batches of ``(index, seed)`` pairs: one actor call per batch of ``job.batch`` runs
(``drill.many.batches``), run as one ensemble (``drill.many.run_unit``), returning a
`RunOutcome` of a few hundred bytes per run. Batches are handed to whichever actor is free; a
finished batch reports its runs in index order, and the summary sorts them by index, so it is
the same as with processes, whatever the number of actors and the batch size.

Without an address, Ray starts a local cluster for the sweep with ``workers`` CPUs (default: the
usable cores) and stops it afterwards. With an address (``ray://head:10001`` or ``auto``), it
connects to that cluster; its workers must have the same ``firedrill`` installed. Ray is an
optional dependency (``pip install 'firedrill[ray]'``); nothing imports it until a sweep asks
for it. Ctrl-C kills the actors and, for a local cluster, stops it: nothing is left running. An
actor lost with its node is replaced and its batch rerun whole (twice at most per batch): a run
is pure and deterministic, so the rerun has the same outcomes.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from firedrill.adapters.process_executor import usable_cpus
from firedrill.drill.many import DoneFn, DrillJob, RunOutcome, Task, batches, run_unit
from firedrill.errors import FiredrillError

MAX_LOST_ACTORS = 2  # a batch whose actor died more often than this fails the sweep


class RayUnavailableError(FiredrillError):
    """Ray is not installed, or the cluster could not be reached."""


class _Runner:
    """A Ray actor holding the loaded drill; runs one batch of it per call."""

    def __init__(self, job: DrillJob) -> None:
        self.job = job

    def run(self, batch: list[Task]) -> list[RunOutcome]:
        return run_unit(self.job, batch)


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailableError(
            "the ray executor needs Ray: pip install 'firedrill[ray]'"
        ) from exc
    return ray


class RayExecutor:
    """Runs a sweep on Ray: a local cluster of ``workers`` CPUs, or the cluster at ``address``.

    ``workers`` is the number of actors (one CPU each; no more than there are batches); by
    default, every CPU of the cluster.
    ``init_options`` are passed on to ``ray.init`` (tests use them to keep the local cluster
    small and quiet).
    """

    def __init__(
        self,
        address: str | None = None,
        workers: int | None = None,
        init_options: Mapping[str, Any] | None = None,
    ) -> None:
        if workers is not None and workers < 1:
            raise FiredrillError(f"workers must be at least 1 (got {workers})")
        self.address = address
        self.workers = workers
        self.init_options = dict(init_options or {})

    def _init(self, ray: Any) -> bool:
        """Start or join a cluster; True when this call started it (and must stop it)."""
        if ray.is_initialized():
            return False
        options: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
        if self.address is None:
            options.update(num_cpus=self.workers or usable_cpus(), include_dashboard=False)
        else:
            options["address"] = self.address
        options.update(self.init_options)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ray.init(**options)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = self.address or "a local cluster"
            raise RayUnavailableError(f"cannot start Ray on {where}: {exc}") from exc
        return True

    def run(self, job: DrillJob, tasks: Sequence[Task], done: DoneFn) -> list[RunOutcome]:
        if not tasks:
            return []
        ray = _ray()
        started = self._init(ray)
        actors: list[Any] = []
        try:
            units = batches(tasks, job.batch)
            cpus = int(ray.cluster_resources().get("CPU", 1))
            count = min(self.workers or max(cpus, 1), len(units))
            runner = ray.remote(num_cpus=1)(_Runner)
            job_ref = ray.put(job)
            actors = [runner.remote(job_ref) for _ in range(count)]
            queue = list(reversed(range(len(units))))  # batch numbers, the next one last
            busy: dict[Any, tuple[Any, int]] = {}  # object ref -> (its actor, its batch number)
            lost: dict[int, int] = {}  # batch number -> actors lost while running it

            def submit(actor: Any, unit: int) -> None:
                busy[actor.run.remote(units[unit])] = (actor, unit)

            for actor in actors:
                if queue:
                    submit(actor, queue.pop())
            out: list[RunOutcome] = []
            while busy:
                ready, _ = ray.wait(list(busy), num_returns=1)
                for ref in ready:
                    actor, unit = busy.pop(ref)
                    try:
                        outcomes: list[RunOutcome] = ray.get(ref)
                    except ray.exceptions.RayActorError:
                        # the actor died (its node was lost): a run is pure and deterministic,
                        # so a fresh actor reruns the whole batch with the same outcomes
                        lost[unit] = lost.get(unit, 0) + 1
                        if lost[unit] > MAX_LOST_ACTORS:
                            raise
                        actor = runner.remote(job_ref)
                        actors.append(actor)
                        submit(actor, unit)
                        continue
                    for outcome in outcomes:
                        done(outcome)
                        out.append(outcome)
                    if queue:
                        submit(actor, queue.pop())
            return out
        finally:
            for actor in actors:
                ray.kill(actor)
            if started:
                ray.shutdown()
