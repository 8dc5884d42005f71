"""Many runs of one drill: how the RTO terms are distributed when fault timing and demand vary.

One run says whether the hypothesis held once; ``--runs N`` says how often it holds. The drill
runs N times on fresh embedded twins with the runner's jitter on (injection times ± 30 s, extra
per-minute demand noise), and the runs are summarised: the pass rate, the runs by verdict, p50 /
p95 / p99 of every RTO term and of the measured RTO, how often each stop condition fired and each
clause held, and the seed of every run that did not pass, so that any one can be rerun alone.

**Seeds.** Run ``i`` (0-based) of a sweep with seed ``S`` uses the seed
``numpy.random.SeedSequence([S, i]).generate_state(1)[0]`` (an unsigned 32-bit integer), as both
the drill seed and the jitter seed: ``run_drill(spec, …, seed=s, jitter=Jitter(seed=s))``. The
runs are independent streams (SeedSequence hashes its entropy), the same ``(S, i)`` always gives
the same run, and ``firedrill gameday run DRILL --seed s --jitter`` reruns run ``i`` alone with the
same verdict and the same numbers.

**Quantiles.** Linear interpolation between the closest ranks (Hyndman & Fan type 7, numpy's
default ``"linear"`` method): with the ``n`` measured values sorted, ``h = (n - 1) p`` and
``q = x[⌊h⌋] + (h - ⌊h⌋) (x[⌊h⌋ + 1] - x[⌊h⌋])``. A term is summarised over the runs that measured
it (``n`` says how many): a run whose users were never served within SLO again has no measured
RTO, and counts in ``unmeasured`` rather than as a number.

**Executors.** Each worker receives the loaded drill once (a process pool initializer, or a Ray
actor's constructor) and then only ``(index, seed)`` pairs; each run returns a `RunOutcome` of a
few hundred bytes — never the charts or the timeline — so a thousand runs stay cheap to move.
The summary is sorted by run index, so it is identical whatever the executor and the number of
workers. `SerialExecutor` lives here; the process pool (``firedrill.adapters.process_executor``)
and Ray (``firedrill.adapters.ray_executor``) are adapters behind the ``Executor`` port, so that
nothing here starts a process, handles a signal or imports Ray.

**Ensembles.** The unit of work is a batch, not a run: every executor cuts the tasks it is
given into consecutive batches of ``job.batch`` runs (`batches`: indices and seeds unchanged, the
last batch shorter when ``batch`` does not divide the runs; the ``Executor`` port is unchanged,
the batch size travels with the job) and hands each batch whole to `run_unit`, that is to
``firedrill.drill.ensemble.run_batch``, which runs it as one ensemble of twins stepped in
lockstep when the job has a ``make_ensemble`` and one run after the other otherwise. A run of an
ensemble is the single run with the same seed, bit for bit, so the summary is identical whatever
the batch size too. ``done`` is still called once per run, in index order within a batch, as
each batch finishes: a progress bar counts runs. ``batch = 1`` is one run per unit of work.

**Worlds.** Every run is on a fresh world from the job's ``make_world`` (the embedded twin, as the
caller chooses it): a picklable factory, so a worker builds its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from firedrill.detect.slo import SloSpec
from firedrill.drill.run import Jitter, SteadyStateError, run_drill
from firedrill.drill.spec import DrillSpec
from firedrill.errors import FiredrillError
from firedrill.model.spec import FleetSpec
from firedrill.ports import DrillWorld, EnsembleFactory, WorldFactory
from firedrill.ports import Executor as ExecutorPort
from firedrill.ports import Task as Task  # re-exported: the executors take these
from firedrill.remediate.policy import PolicySpec

TERMS: tuple[str, ...] = ("detect_s", "decide_s", "shift_s", "hydrate_s", "time_to_slo_s")
QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))
VERDICTS: tuple[str, ...] = ("passed", "failed", "aborted", "refused")
SEED_DERIVATION = "numpy.random.SeedSequence([S, i]).generate_state(1)[0]"
QUANTILE_METHOD = "linear interpolation between closest ranks (Hyndman-Fan type 7)"
_ND = 3  # decimals kept in the summary (milliseconds)


# -- seeds and quantiles ---------------------------------------------------------------------------


def run_seed(sweep_seed: int, index: int) -> int:
    """The seed of run ``index`` of a sweep seeded ``sweep_seed`` (see the module doc)."""
    if sweep_seed < 0 or index < 0:
        raise FiredrillError(
            f"seeds are non-negative integers (got seed {sweep_seed}, run {index})"
        )
    return int(np.random.SeedSequence([sweep_seed, index]).generate_state(1)[0])


def run_seeds(sweep_seed: int, runs: int) -> list[int]:
    """The seeds of runs 0 … runs-1."""
    return [run_seed(sweep_seed, i) for i in range(runs)]


def quantile(values: Sequence[float], p: float) -> float:
    """The ``p`` quantile of ``values`` by linear interpolation between closest ranks."""
    if not values:
        raise ValueError("the quantile of no values")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"a quantile is between 0 and 1, not {p}")
    xs = sorted(values)
    h = (len(xs) - 1) * p
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def distribution(values: Sequence[float | None]) -> dict[str, Any]:
    """p50/p95/p99, min, max and mean of the values; ``n`` measured, ``unmeasured`` (None)."""
    seen = [float(v) for v in values if v is not None]
    out: dict[str, Any] = {}
    if seen:
        out.update({name: round(quantile(seen, p), _ND) for name, p in QUANTILES})
        out["min"] = round(min(seen), _ND)
        out["max"] = round(max(seen), _ND)
        out["mean"] = round(math.fsum(seen) / len(seen), _ND)
    else:
        out.update({name: None for name, _ in QUANTILES})
        out.update({"min": None, "max": None, "mean": None})
    out["n"] = len(seen)
    out["unmeasured"] = len(values) - len(seen)
    return out


# -- one run ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DrillJob:
    """What every worker needs to run the drill: the loaded specs and the jitter amplitudes."""

    spec: DrillSpec
    fleet: FleetSpec
    slo: SloSpec
    policy: PolicySpec
    spec_sha256: str | None = None
    make_world: WorldFactory | None = None  # picklable: each worker builds its own worlds
    make_ensemble: EnsembleFactory | None = None  # picklable: R worlds stepped in lockstep
    injection_jitter_s: float = Jitter.injection_s  # seconds, ± around each injection's time
    demand_noise: float = Jitter.demand_noise  # added to each product's per-minute demand noise
    batch: int = 1  # runs per unit of work (one ensemble); see the module doc

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise FiredrillError(f"a batch is at least 1 run (got {self.batch})")

    def jitter(self, seed: int) -> Jitter:
        return Jitter(
            seed=seed, injection_s=self.injection_jitter_s, demand_noise=self.demand_noise
        )


@dataclass(frozen=True)
class RunOutcome:
    """The small summary of one run: what the aggregate needs, never the charts."""

    index: int
    seed: int
    verdict: str  # passed | failed | aborted | refused (the steady state did not hold)
    reason: str
    measured_s: float | None
    terms: Mapping[str, float | None] = field(default_factory=dict)
    stop: str | None = None  # the stop condition that fired
    stop_at_s: float | None = None
    clauses: tuple[bool, ...] = ()  # each hypothesis clause held, in spec order

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "seed": self.seed,
            "verdict": self.verdict,
            "reason": self.reason,
            "measured_s": self.measured_s,
            "terms": {k: self.terms.get(k) for k in TERMS},
            "stop": self.stop,
            "stop_at_s": self.stop_at_s,
            "clauses": list(self.clauses),
        }

    @classmethod
    def from_report(cls, index: int, seed: int, report: Mapping[str, Any]) -> RunOutcome:
        """Keep, from a run's result, only what the summary uses."""
        rto = report.get("rto") or {}
        terms = rto.get("terms") or {}
        fired = next((s for s in report.get("stop_conditions") or [] if s.get("fired")), None)
        return cls(
            index=index,
            seed=seed,
            verdict=str(report["verdict"]),
            reason=str(report.get("reason", "")),
            measured_s=_num(rto.get("measured_s")),
            terms={k: _num(terms.get(k)) for k in TERMS},
            stop=None if fired is None else str(fired.get("name")),
            stop_at_s=None if fired is None else _num(fired.get("at_s")),
            clauses=tuple(bool(c.get("passed")) for c in report.get("hypothesis") or []),
        )


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    x = float(v)
    return None if math.isnan(x) or math.isinf(x) else x


def run_one(job: DrillJob, index: int, seed: int, world: DrillWorld | None = None) -> RunOutcome:
    """Run the drill once with jitter on ``world`` (an ensemble's member), or on a fresh one from
    the job's ``make_world``; a refused start is an outcome."""
    try:
        result = run_drill(
            job.spec, job.fleet, job.slo, job.policy, seed=seed, jitter=job.jitter(seed),
            spec_sha256=job.spec_sha256, world=world, make_world=job.make_world,
        )  # fmt: skip
    except SteadyStateError as exc:
        return RunOutcome(index, seed, "refused", str(exc), None)
    return RunOutcome.from_report(index, seed, result.report)


# -- executors -------------------------------------------------------------------------------------

DoneFn = Callable[[RunOutcome], None]
Executor = ExecutorPort[DrillJob, RunOutcome]  # runs a job's tasks; see ``firedrill.ports``


def batches(tasks: Sequence[Task], size: int) -> list[list[Task]]:
    """``tasks`` cut into consecutive batches of ``size`` (the last one shorter if need be)."""
    if size < 1:
        raise FiredrillError(f"a batch is at least 1 run (got {size})")
    return [list(tasks[i : i + size]) for i in range(0, len(tasks), size)]


def run_unit(job: DrillJob, batch: Sequence[Task]) -> list[RunOutcome]:
    """One unit of work: the batch's outcomes, in its order (one ensemble when the job has one)."""
    # drill.ensemble imports this module: imported here, when a batch runs
    from firedrill.drill.ensemble import run_batch

    outcomes = run_batch(job, batch)
    got = [(o.index, o.seed) for o in outcomes]
    if got != list(batch):
        raise FiredrillError(f"a batch of runs {[i for i, _ in batch]} returned runs {got}")
    return outcomes


class SerialExecutor:
    """One batch after the other in this process (tests, and ``--workers 1`` without a pool)."""

    def run(self, job: DrillJob, tasks: Sequence[Task], done: DoneFn) -> list[RunOutcome]:
        out: list[RunOutcome] = []
        for batch in batches(tasks, job.batch):
            for outcome in run_unit(job, batch):
                done(outcome)
                out.append(outcome)
        return out


# -- the sweep -------------------------------------------------------------------------------------


def run_many(
    job: DrillJob,
    *,
    runs: int,
    seed: int,
    executor: Executor | None = None,
    done: DoneFn | None = None,
) -> dict[str, Any]:
    """Run the drill ``runs`` times (seeds from ``seed``) in batches of ``job.batch``, and
    summarise (see `summarize`): the same summary whatever the executor and the batch size."""
    if runs < 1:
        raise FiredrillError(f"--runs must be at least 1 (got {runs})")
    tasks = list(enumerate(run_seeds(seed, runs)))
    outcomes = (executor or SerialExecutor()).run(job, tasks, done or (lambda _o: None))
    return summarize(job, outcomes, runs=runs, seed=seed)


def summarize(
    job: DrillJob, outcomes: Sequence[RunOutcome], *, runs: int, seed: int
) -> dict[str, Any]:
    """The sweep's summary (JSON-ready, key order fixed, sorted by run index).

    The shape ``render_many_markdown`` / ``render_many_html`` read (``drill``, ``runs``, ``seed``,
    ``pass_rate``, ``verdicts``, ``terms``, ``measured``, ``budget_s``, ``planned``), plus the
    stop conditions and clauses over the runs, the runs that did not pass (index, seed, verdict,
    reason) and every run's outcome.
    """
    spec = job.spec
    ordered = sorted(outcomes, key=lambda o: o.index)
    indices = [o.index for o in ordered]
    if indices != list(range(runs)):
        raise FiredrillError(f"expected runs 0..{runs - 1}, got {len(ordered)} outcome(s)")
    counts = {v: 0 for v in VERDICTS}
    for o in ordered:
        counts[o.verdict] = counts.get(o.verdict, 0) + 1
    measured_runs = [o for o in ordered if o.verdict != "refused"]
    budget = spec.rto.budget_s if spec.rto is not None else None
    planned = spec.rto.terms.seconds() if spec.rto is not None else {}
    measured = distribution([o.measured_s for o in measured_runs])
    terms = {k: distribution([o.terms.get(k) for o in measured_runs]) for k in TERMS}
    within = [
        o.measured_s is not None and budget is not None and o.measured_s <= budget
        for o in measured_runs
    ]
    stops = [
        {
            "name": c.name,
            "kind": c.kind,
            "fired": sum(1 for o in ordered if o.stop == c.name),
        }
        for c in spec.stop_conditions
    ]
    clauses = [
        {
            "clause": h.clause,
            "metric": h.metric,
            "expected": f"{h.op} {h.value:g}",
            "held": sum(1 for o in measured_runs if i < len(o.clauses) and o.clauses[i]),
            "runs": len(measured_runs),
        }
        for i, h in enumerate(spec.hypothesis)
    ]
    not_passed = [
        {
            "index": o.index,
            "seed": o.seed,
            "verdict": o.verdict,
            "reason": o.reason,
            "stop": o.stop,
        }
        for o in ordered
        if o.verdict != "passed"
    ]
    return {
        "drill": spec.name,
        "rung": spec.rung,
        "spec_sha256": job.spec_sha256,
        "runs": runs,
        "seed": seed,
        "seed_derivation": SEED_DERIVATION.replace("S", str(seed), 1),
        "jitter": {
            "injection_s": job.injection_jitter_s,
            "demand_noise": job.demand_noise,
        },
        "quantile_method": QUANTILE_METHOD,
        "pass_rate": round(counts["passed"] / runs, 6),
        "verdicts": counts,
        "budget_s": budget,
        "within_budget": None if budget is None else sum(within),
        "planned": planned,
        "terms": terms,
        "measured": measured,
        "stop_conditions": stops,
        "hypothesis": clauses,
        "not_passed": not_passed,
        "results": [o.to_json() for o in ordered],
    }


def rerun_command(spec_path: str, seed: int) -> str:
    """The command that reruns one run of a sweep alone."""
    return f"firedrill gameday run {spec_path} --seed {seed} --jitter"
