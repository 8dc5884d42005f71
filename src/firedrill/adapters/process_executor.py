"""``ProcessExecutor``: a sweep's runs on a pool of local processes (the ``Executor`` port).

Processes and signals are the edge of the system: the sweep itself (``drill/many.py``) only hands
an executor its job and ``(index, seed)`` tasks. Each worker is started with ``spawn`` (no state
is inherited but the job), receives the job once through the pool's initializer, then batches of
``job.batch`` tasks one at a time (``drill.many.batches``: one submit per batch, run as one
ensemble by ``drill.many.run_unit``); a finished batch reports its runs in index order. Ctrl-C
(or any error) terminates the workers and waits for them, so nothing is left running; a run
interrupted that way leaves nothing behind either, since every run is on its own in-process
world.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Sequence

from firedrill.drill.many import DoneFn, DrillJob, RunOutcome, Task, batches, run_unit
from firedrill.errors import FiredrillError

__all__ = ["ProcessExecutor", "usable_cpus"]

_WORKER_JOB: DrillJob | None = None  # set once per worker process by the pool's initializer


def _init_worker(job: DrillJob) -> None:
    global _WORKER_JOB
    # Ctrl-C reaches the whole process group: the parent alone decides, and terminates the pool.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER_JOB = job


def _run_batch(batch: list[Task]) -> list[RunOutcome]:
    if _WORKER_JOB is None:
        raise RuntimeError("the worker was started without its drill")
    return run_unit(_WORKER_JOB, batch)


def usable_cpus() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class ProcessExecutor:
    """A pool of ``workers`` local processes (no more than there are batches)."""

    def __init__(self, workers: int | None = None) -> None:
        if workers is not None and workers < 1:
            raise FiredrillError(f"workers must be at least 1 (got {workers})")
        self.workers = workers or usable_cpus()

    def run(self, job: DrillJob, tasks: Sequence[Task], done: DoneFn) -> list[RunOutcome]:
        if not tasks:
            return []
        units = batches(tasks, job.batch)
        ctx = multiprocessing.get_context("spawn")
        pool = ctx.Pool(min(self.workers, len(units)), initializer=_init_worker, initargs=(job,))
        out: list[RunOutcome] = []
        try:
            for outcomes in pool.imap_unordered(_run_batch, units, chunksize=1):
                for outcome in outcomes:
                    done(outcome)
                    out.append(outcome)
            pool.close()
        except BaseException:
            pool.terminate()
            raise
        finally:
            pool.join()
        return out
