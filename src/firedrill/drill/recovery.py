"""The recovery half of a game day: hydrate storms, hidden dependencies, the security floor and a
controlled failback.

Everything here reads the world through the ports (``Signals`` series, ``Fleet`` views and
operations), so it measures the embedded twin and a remote one alike:

* ``hydrate_stats`` — the storm's curve, not just its end: GB/s per node, P2P peer hit rate,
  origin 503/429s, time to the first ready replica, time to SLO;
* ``puller_ops`` — the drill's competing pullers on the timeline, and the freeze that pauses
  them (with and without the freeze is the comparison worth making);
* ``dependency_findings`` — the services that cross a region blackhole's cut, and what each
  broke (often the most valuable finding of the day);
* ``security_floor`` — the bad digest denied by admission everywhere, nothing unsigned admitted,
  the survivor on its last attested digest while replication is paused (the ready-gate refusing
  the new one until it lands), admission never set to Ignore. Each check has a ``status``:
  ``passed``, ``failed`` or ``not_exercised``; a check the drill never put to the test (nothing
  tried to run the unlanded digest, no digest promoted during a pause, no admission decision)
  says so and is not a pass (``passed`` is ``None``; ``hint`` says how the drill could have
  exercised it). A drill exercises the ready-gate with ``new_digest_during_pause`` and
  ``survivor_attempt: true``;
* ``Failback`` — a second failover with less adrenaline: same signed digest and bundle on both
  sides, a green synthetic TTFT probe for N minutes, the primary's prefix cache warmed by
  mirrored traffic, weights stepped 0 → 10 → 40 → 70 → 100 while both regions are watched (one
  step back on a burn), the survivor kept warm until the primary has held its SLO for the
  hysteresis, and paused autoscalers thawed last, survivor side last.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from firedrill.detect.promql import bucket_quantile
from firedrill.detect.slo import SloSpec
from firedrill.drill.spec import DrillSpec, FailbackSpec
from firedrill.errors import FiredrillError
from firedrill.model import operations as ops
from firedrill.model.operations import Operation
from firedrill.model.series import Series
from firedrill.model.spec import FleetSpec
from firedrill.ports import Fleet, Signals

FAST_BURN = 14.4  # the workbook's page tier: 2% of a 30-day budget in an hour
PULLER_KINDS: tuple[ops.PullerKind, ...] = ("batch", "eval", "scale_out")

BROKE: Mapping[str, str] = {
    "tokenizer": "new replicas could not finish loading (no tokenizer); replicas already serving "
    "kept serving, so the region could not scale out or replace replicas",
    "bundle_api": "CatalogBundle changes were refused (the bundle API was out of reach)",
    "signature_mirror": "admission failed closed for digests the region had not verified yet",
    "idp": "synthetic probes could not get a token (auth_failed): the region's probes went blind "
    "and no failback to it can go green",
    "registry": "weights pulls from the registry's origin failed (pull-seconds without origin)",
}


class World(Fleet, Signals, Protocol):
    """What the security floor reads: fleet changes and series."""


# ---------------------------------------------------------------------------------------------
# series helpers


def _value_at(s: Series, t_s: float) -> float:
    """The last non-NaN sample at or before ``t_s`` (0 when none: a counter not born yet)."""
    idx = int(np.searchsorted(s.t_s, t_s, side="right"))
    vals = s.values[:idx]
    ok = vals[~np.isnan(vals)]
    return float(ok[-1]) if ok.size else 0.0


def _increase(series: Sequence[Series], start_s: float, end_s: float) -> float:
    """Summed counter increase over (start, end] (counters here never reset)."""
    return sum(max(_value_at(s, end_s) - _value_at(s, start_s), 0.0) for s in series)


def _query(
    signals: Signals, name: str, matchers: Mapping[str, str], end_s: float
) -> Sequence[Series]:
    """Every sample up to ``end_s``: a counter's value before a window is its baseline."""
    return signals.query(name, dict(matchers), start_s=0.0, end_s=end_s)


def _in_cells(series: Sequence[Series], cells: Sequence[str] | None) -> list[Series]:
    return [s for s in series if cells is None or s.label("cell") in cells]


def _summed(
    series: Sequence[Series], start_s: float, end_s: float
) -> tuple[list[float], list[float]]:
    """Sum of aligned series (one scrape grid) at each sample time in [start, end]."""
    acc: dict[float, float] = {}
    for s in series:
        for t, v in zip(s.t_s.tolist(), s.values.tolist(), strict=True):
            if start_s <= t <= end_s and not math.isnan(v):
                acc[t] = acc.get(t, 0.0) + v
    times = sorted(acc)
    return times, [acc[t] for t in times]


def _buckets(series: Sequence[Series]) -> dict[float, list[Series]]:
    by_le: dict[float, list[Series]] = {}
    for s in series:
        by_le.setdefault(float(s.label("le")), []).append(s)
    return by_le


def _ttft_p99(by_le: Mapping[float, Sequence[Series]], start_s: float, end_s: float) -> float:
    pairs = [(le, _increase(ss, start_s, end_s)) for le, ss in by_le.items()]
    return bucket_quantile(0.99, pairs)


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None or math.isnan(x) else round(float(x), nd)


# ---------------------------------------------------------------------------------------------
# hydrate storms


def hydrate_stats(
    signals: Signals,
    *,
    region: str,
    model: str,
    start_s: float,
    end_s: float,
    cells: Sequence[str] | None = None,
    slo_ttft_s: float | None = None,
    slo_hold_s: float = 120.0,
    ttft_window_s: float = 60.0,
) -> dict[str, object]:
    """The storm's curve in one region (or some of its cells) over [start, end].

    ``first_ready_s``: seconds from ``start_s`` to the first replica that finished warming;
    ``time_to_slo_s`` (with ``slo_ttft_s``): to the first moment from which the TTFT p99 (over
    ``ttft_window_s``) stayed within the threshold for ``slo_hold_s`` (or to the end).
    Byte, error and per-node rate figures are the region's serving hydrate; competing pullers'
    bytes are reported apart.
    """
    reg = {"region": region}
    pool = {"region": region, "model_name": model}

    def inc(name: str, matchers: Mapping[str, str]) -> float:
        return _increase(_query(signals, name, matchers, end_s), start_s, end_s)

    origin_b = inc("firedrill_hydrate_bytes_total", {**reg, "source": "origin"})
    p2p_b = inc("firedrill_hydrate_bytes_total", {**reg, "source": "p2p"})
    e503 = inc("firedrill_registry_errors_total", {**reg, "code": "503"})
    e429 = inc("firedrill_registry_errors_total", {**reg, "code": "429"})
    competing = inc("firedrill_competing_pull_bytes_total", reg)
    peak = [
        float(np.nanmax(s.values[(s.t_s >= start_s) & (s.t_s <= end_s)], initial=0.0))
        for s in signals.query("firedrill_hydrate_node_gbps_max", reg, start_s=start_s, end_s=end_s)
    ]
    ready_series = _in_cells(
        signals.query("firedrill_replicas_ready", pool, start_s=start_s, end_s=end_s), cells
    )
    times, ready = _summed(ready_series, start_s, end_s)
    became = _in_cells(
        signals.query("firedrill_replicas_became_ready_total", pool, start_s=0.0, end_s=end_s),
        cells,
    )
    base = sum(_value_at(s, start_s) for s in became)
    b_times, b_vals = _summed(became, start_s, end_s)
    first_ready = next(
        (t - start_s for t, v in zip(b_times, b_vals, strict=True) if v > base), None
    )
    # the last replica of the wave: the first sample at the final count
    last_ready = None
    if b_vals and b_vals[-1] > base:
        last_ready = next(
            t - start_s for t, v in zip(b_times, b_vals, strict=True) if v == b_vals[-1]
        )
    total = origin_b + p2p_b
    node_s = inc("firedrill_hydrate_pull_seconds_total", reg)  # node-seconds spent pulling
    out: dict[str, object] = {
        "region": region,
        "model": model,
        "start_s": start_s,
        "end_s": end_s,
        "gbytes_pulled": _r(total / 1e9),
        "peak_gbps_per_node": _r(max(peak, default=0.0)),
        "mean_gbps_per_node": _r(total / 1e9 / node_s) if node_s > 0 else None,
        "p2p_hit_rate": _r(p2p_b / total) if total > 0 else None,
        "origin_503": round(e503),
        "origin_429": round(e429),
        "origin_errors": round(e503 + e429),
        "competing_gbytes": _r(competing / 1e9),
        "replicas_became_ready": round(sum(b_vals[-1:]) - base) if b_vals else 0,
        "first_ready_s": _r(first_ready, 1),
        "last_ready_s": _r(last_ready, 1),
        "min_ready": round(min(ready)) if ready else None,
        "ready_curve": [[_r(t - start_s, 1), round(v)] for t, v in zip(times, ready, strict=True)],
        "time_to_slo_s": None,
    }
    if slo_ttft_s is not None:
        out["time_to_slo_s"] = _r(
            _time_to_slo(
                signals,
                pool,
                cells,
                start_s=start_s,
                end_s=end_s,
                threshold_s=slo_ttft_s,
                hold_s=slo_hold_s,
                window_s=ttft_window_s,
            ),
            1,
        )
    return out


def _time_to_slo(
    signals: Signals,
    pool: Mapping[str, str],
    cells: Sequence[str] | None,
    *,
    start_s: float,
    end_s: float,
    threshold_s: float,
    hold_s: float,
    window_s: float,
) -> float | None:
    series = _in_cells(
        signals.query(
            "vllm:time_to_first_token_seconds_bucket",
            dict(pool),
            start_s=max(0.0, start_s - window_s),
            end_s=end_s,
        ),
        cells,
    )
    if not series:
        return None
    by_le = _buckets(series)
    grid = [float(t) for t in series[0].t_s if start_s <= t <= end_s]
    within = [_ttft_p99(by_le, t - window_s, t) <= threshold_s for t in grid]
    for i, t in enumerate(grid):
        if not within[i]:
            continue
        j = i
        while j < len(grid) and within[j] and grid[j] - t < hold_s:
            j += 1
        if j == len(grid) or grid[j] - t >= hold_s:
            return t - start_s
    return None


# ---------------------------------------------------------------------------------------------
# competing pullers


def puller_ops(spec: DrillSpec) -> list[tuple[float, Operation]]:
    """The drill's competing pullers on its timeline, and the freeze if ``freeze_competitors``.

    The freeze lands with the first injection (the recovery wave follows it), in every region a
    puller runs in, the survivors and the target region.
    """
    timeline: list[tuple[float, Operation]] = []
    for p in spec.competing_pullers:
        kind = getattr(p, "kind", "batch")
        timeline.append(
            (
                p.at_s,
                ops.StartPullers(
                    p.name,
                    p.region,
                    p.nodes,
                    float(p.gbytes),
                    kind if kind in PULLER_KINDS else "batch",
                    p.critical,
                ),
            )
        )
    if spec.freeze_competitors and spec.competing_pullers:
        at = min((i.at_s for i in spec.injections), default=0.0)
        regions = {p.region for p in spec.competing_pullers} | set(spec.survivor)
        if spec.target.region is not None:
            regions.add(spec.target.region)
        timeline.extend((at, ops.FreezePullers(r, True)) for r in sorted(regions))
    timeline.sort(key=lambda e: (e[0], isinstance(e[1], ops.StartPullers)))
    return timeline


# ---------------------------------------------------------------------------------------------
# hidden dependencies


def dependency_findings(
    fleet: FleetSpec,
    signals: Signals,
    *,
    cut: Sequence[str],
    start_s: float,
    end_s: float,
) -> list[dict[str, object]]:
    """Services whose users sit on the other side of the cut (``cut``: the isolated regions),
    with what each broke during [start, end] and the evidence in the series."""
    isolated = set(cut)
    regions = [r.name for r in fleet.regions]
    findings: list[dict[str, object]] = []
    for svc in fleet.services:
        users = regions if svc.used_by == "all" else list(svc.used_by)
        crossing = [
            u for u in users if u != svc.region and (u in isolated) != (svc.region in isolated)
        ]
        if not crossing:
            continue
        evidence: dict[str, int] = {}
        for u in crossing:
            n = _increase(
                _query(
                    signals,
                    "firedrill_dependency_failures_total",
                    {"service": svc.name, "region": u},
                    end_s,
                ),
                start_s,
                end_s,
            )
            if n > 0:
                evidence[u] = round(n)
        observed = bool(evidence)
        broke = BROKE[svc.kind]
        findings.append(
            {
                "service": svc.name,
                "kind": svc.kind,
                "lives_in": svc.region,
                "used_by": users,
                "crosses_cut": crossing,
                "observed": observed,
                "broke": broke
                if observed
                else f"not exercised during the drill; would break: {broke}",
                "evidence": {
                    u: f"{n} failed {_UNIT[svc.kind]} in {u}" for u, n in sorted(evidence.items())
                },
            }
        )
    findings.sort(key=lambda f: (not f["observed"], str(f["kind"]), str(f["service"])))
    return findings


_UNIT = {
    "tokenizer": "replica starts",
    "bundle_api": "bundle changes",
    "signature_mirror": "admissions",
    "idp": "probe token requests",
    "registry": "pull-seconds",
}


# ---------------------------------------------------------------------------------------------
# the security floor


Event = ops.Applied | tuple[float, Operation]


def _events(events: Sequence[Event]) -> list[tuple[float, Operation]]:
    out = [(e.at_s, e.op) if isinstance(e, ops.Applied) else (e[0], e[1]) for e in events]
    return sorted(out, key=lambda e: e[0])


def security_floor(
    world: World,
    spec: DrillSpec,
    events: Sequence[Event],
    *,
    start_s: float = 0.0,
    end_s: float | None = None,
) -> list[dict[str, object]]:
    """The floor every drill must prove: one dict per check (``check``, ``passed``, ``detail``).

    ``events`` are the operations the drill applied (``ops.Applied`` or ``(at_s, op)``).
    """
    timeline = _events(events)
    end = float(end_s) if end_s is not None else max([start_s, *(t for t, _ in timeline)])
    admissions = world.query("firedrill_admission_requests_total", {}, start_s=0.0, end_s=end)
    checks = [
        _bad_digest_denied(admissions, timeline, start_s, end),
        _nothing_unsigned_admitted(admissions, start_s, end),
        *_replication_pause(world, spec, timeline, start_s, end),
        _admission_never_ignore(world, spec, timeline, start_s, end),
    ]
    return checks


def _check(check: str, passed: bool, detail: str) -> dict[str, object]:
    status = "passed" if passed else "failed"
    return {"check": check, "status": status, "passed": passed, "detail": detail}


def _not_exercised(check: str, detail: str, hint: str | None = None) -> dict[str, object]:
    """A check the drill never put to the test: neither a pass nor a failure. ``hint``: how
    this drill could have exercised it."""
    out: dict[str, object] = {
        "check": check,
        "status": "not_exercised",
        "passed": None,
        "detail": detail,
    }
    if hint is not None:
        out["hint"] = hint
    return out


def _bad_digest_denied(
    admissions: Sequence[Series], timeline: list[tuple[float, Operation]], start: float, end: float
) -> dict[str, object]:
    bad = sorted(
        {
            op.digest
            for _, op in timeline
            if isinstance(op, ops.PromoteDigest) and not (op.signed and op.attested)
        }
    )
    name = "bad_digest_denied_everywhere"
    if not bad:
        return _check(name, False, "no bad digest was injected: every drill must try one")
    denied: dict[str, set[str]] = {}
    admitted: dict[str, set[str]] = {}
    for s in admissions:
        d = s.label("digest")
        if d not in bad or _increase([s], start, end) <= 0:
            continue
        into = admitted if s.label("decision") == "admit" else denied
        into.setdefault(d, set()).add(s.label("region"))
    problems = [f"{d} admitted in {', '.join(sorted(admitted[d]))}" for d in bad if d in admitted]
    untried = [d for d in bad if d not in denied and d not in admitted]
    if problems:
        return _check(name, False, "; ".join(problems))
    if untried and len(untried) == len(bad):
        return _not_exercised(
            name,
            f"admission never saw {', '.join(untried)}: the injection did not reach it",
            "inject the bad digest where replicas are created, so admission has to decide",
        )
    if untried:
        return _check(
            name, False, f"admission never saw {', '.join(untried)}: the injection did not reach it"
        )
    where = "; ".join(f"{d} denied in {', '.join(sorted(denied[d]))}" for d in bad)
    return _check(name, True, where)


def _nothing_unsigned_admitted(
    admissions: Sequence[Series], start: float, end: float
) -> dict[str, object]:
    bad = [
        s
        for s in admissions
        if s.label("decision") == "admit"
        and s.label("reason") in ("unsigned", "unattested")
        and _increase([s], start, end) > 0
    ]
    if bad:
        what = sorted(
            {f"{s.label('digest')} ({s.label('reason')}) in {s.label('region')}" for s in bad}
        )
        return _check("no_unsigned_digest_admitted", False, "admitted: " + "; ".join(what))
    n = sum(_increase([s], start, end) for s in admissions if s.label("decision") == "admit")
    if n <= 0:
        return _not_exercised(
            "no_unsigned_digest_admitted", "admission admitted nothing during the drill"
        )
    return _check(
        "no_unsigned_digest_admitted", True, f"{round(n)} admissions, all signed and attested"
    )


def _replication_pause(
    world: World,
    spec: DrillSpec,
    timeline: list[tuple[float, Operation]],
    start: float,
    end: float,
) -> list[dict[str, object]]:
    """During a replication pause (or cut) a digest promoted upstream must not reach the
    survivor: it keeps its last attested digest, and the ready-gate refuses the new one."""
    serve, gate = "survivor_serves_last_attested_digest", "ready_gate_refuses_unlanded_digest"
    paused: dict[tuple[str, str], float] = {}  # (source, target) -> since
    resumed: dict[tuple[str, str], float] = {}
    promotions: list[tuple[float, ops.PromoteDigest, str]] = []  # (at, op, target region)
    for at, op in timeline:
        match op:
            case ops.PauseReplication(source=s, target=t):
                paused.setdefault((s, t), at)
            case ops.ResumeReplication(source=s, target=t):
                if (s, t) in paused:
                    resumed.setdefault((s, t), at)
            case ops.Partition(kind="region-region", a=a, b=b):
                paused.setdefault((a, b), at)
                paused.setdefault((b, a), at)
            case ops.Heal(kind="region-region", a=a, b=b):
                for link in ((a, b), (b, a)):
                    if link in paused:
                        resumed.setdefault(link, at)
            case ops.PromoteDigest(signed=True, attested=True):
                for (s, t), since in paused.items():
                    if s == op.region and since <= at and resumed.get((s, t), math.inf) > at:
                        promotions.append((at, op, t))
    targets = [(at, op, t) for at, op, t in promotions if not spec.survivor or t in spec.survivor]
    if not targets:
        note = "no digest was promoted while replication to the survivor was paused"
        return [_not_exercised(serve, note), _not_exercised(gate, note)]
    serve_problems: list[str] = []
    gate_notes: list[str] = []
    gate_ok = True
    gate_tried = False
    for at, op, target in targets:
        landed_ok_from = resumed.get((op.region, target), math.inf)
        early = [
            c
            for c in world.changes(since_s=at)
            if c.stream == "weights"
            and c.region == target
            and c.after == op.digest
            and c.at_s < landed_ok_from
        ]
        if early:
            serve_problems.append(
                f"{target} switched to {op.digest} at {early[0].at_s:g}s, "
                "before replication resumed"
            )
        info = world.query(
            "firedrill_weights_digest_info",
            {"region": target, "model_name": op.model, "digest": op.digest},
            start_s=0.0,
            end_s=end,
        )
        before_landing = [
            v
            for s in info
            for t, v in zip(s.t_s.tolist(), s.values.tolist(), strict=True)
            if at <= t < landed_ok_from and v == 1.0
        ]
        if before_landing and not early:
            serve_problems.append(f"{target} reported {op.digest} as its digest before it landed")
        refusals = _increase(
            world.query(
                "firedrill_ready_gate_refusals_total",
                {"region": target, "digest": op.digest},
                start_s=0.0,
                end_s=end,
            ),
            start,
            end,
        )
        admitted = _increase(
            [
                s
                for s in world.query(
                    "firedrill_admission_requests_total",
                    {"region": target, "digest": op.digest, "decision": "admit"},
                    start_s=0.0,
                    end_s=end,
                )
            ],
            start,
            min(end, landed_ok_from),
        )
        if admitted > 0:
            gate_ok = False
            gate_notes.append(
                f"{round(admitted)} replicas of {op.digest} admitted in {target} before it landed"
            )
        elif refusals > 0:
            gate_tried = True
            gate_notes.append(
                f"refused {op.digest} {round(refusals)} times in {target} until it landed"
            )
        else:
            gate_notes.append(f"nothing tried to run {op.digest} in {target} before it landed")
    serve_detail = "; ".join(serve_problems) or "; ".join(
        f"{t} kept its last attested digest while {op.digest} waited in {op.region}"
        for _, op, t in targets
    )
    gate_check = (
        _check(gate, gate_ok, "; ".join(gate_notes))
        if gate_tried or not gate_ok
        else _not_exercised(
            gate,
            "; ".join(gate_notes),
            "set survivor_attempt: true on new_digest_during_pause, so a survivor really tries "
            "to run the digest before it lands",
        )
    )
    return [_check(serve, not serve_problems, serve_detail), gate_check]


def _admission_never_ignore(
    world: World,
    spec: DrillSpec,
    timeline: list[tuple[float, Operation]],
    start: float,
    end: float,
) -> dict[str, object]:
    name = "admission_never_ignore"
    if spec.admission == "Ignore":
        return _check(name, False, "the drill asks for admission Ignore")
    set_ignore = [
        f"{op.region} at {at:g}s"
        for at, op in timeline
        if isinstance(op, ops.SetAdmission) and op.mode == "Ignore"
    ]
    seen = sorted(
        {
            s.label("region")
            for s in world.query(
                "firedrill_admission_mode_info", {"mode": "Ignore"}, start_s=start, end_s=end
            )
            if bool(np.any(s.values == 1.0))
        }
    )
    if set_ignore or seen:
        where = ", ".join(set_ignore) or ", ".join(seen)
        return _check(name, False, f"admission was set to Ignore: {where}")
    return _check(name, True, f"admission stayed {spec.admission} in every region")


# ---------------------------------------------------------------------------------------------
# controlled failback


@dataclass(frozen=True)
class _Slo:
    ttft_threshold_s: float
    ttft_target: float
    availability_target: float


def _slo_for(slo: SloSpec | float, model: str) -> _Slo:
    if not isinstance(slo, SloSpec):
        return _Slo(float(slo), 0.99, 0.999)
    ttft = [o for o in slo.objectives if o.model == model and o.sli == "ttft"]
    avail = [o for o in slo.objectives if o.model == model and o.sli == "availability"]
    return _Slo(
        ttft[0].ttft_threshold_s if ttft else 2.0,
        ttft[0].target if ttft else 0.99,
        avail[0].target if avail else 0.999,
    )


@dataclass
class _Step:
    weight: int
    at_s: float
    held: bool = False
    backed_off: bool = False
    reason: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "weight": self.weight,
            "at_s": self.at_s,
            "held": self.held,
            "backed_off": self.backed_off,
            "reason": self.reason,
        }


class Failback:
    """A stepped return of traffic to the primary, one evaluation step (``tick``) at a time.

    Phases: ``precheck`` (same signed digest and bundle on both sides; waits ``precheck_wait_s``
    for replication to catch up, then refuses) → ``probe`` (the primary's synthetic TTFT probe
    green for ``probe_green``; mirrored traffic warms its prefix cache meanwhile) → ``stepping``
    (region weight through ``steps``, each held ``step_hold``; a fast burn in either region steps
    back one and retries, ``max_backoffs`` times at most) → ``hysteresis`` (the primary holds its
    SLO for ``hysteresis``: the survivor's scalers stay pinned) → ``thaw`` (primary side, then,
    one ``step_hold`` later, survivor side) → ``done``. ``refused`` and ``halted`` end it early.

    Heal first is the drill's job; the failback assumes the primary is reachable again.
    """

    def __init__(
        self,
        plan: FailbackSpec,
        *,
        fleet: Fleet,
        signals: Signals,
        model: str,
        primary: str,
        survivor: str | Sequence[str],
        slo: SloSpec | float,
        apply: Callable[[Operation], Operation] | None = None,
        burn_factor: float = FAST_BURN,
        burn_window_s: float = 300.0,
        min_requests: int = 100,
        warm_enough: float = 0.5,
        precheck_wait_s: float = 900.0,
        max_backoffs: int = 3,
    ) -> None:
        self.plan = plan
        self.fleet = fleet
        self.signals = signals
        self.model = model
        self.primary = primary
        self.survivors = [survivor] if isinstance(survivor, str) else list(survivor)
        self.slo = _slo_for(slo, model)
        self._apply_fn = apply or fleet.apply
        self.burn_factor = burn_factor
        self.burn_window_s = burn_window_s
        self.min_requests = min_requests
        self.warm_enough = warm_enough
        self.precheck_wait_s = precheck_wait_s
        self.max_backoffs = max_backoffs

        self.phase = "precheck"
        self.reason: str | None = None
        self.started_s: float | None = None
        self.applied: list[tuple[float, Operation, Operation]] = []
        self.steps: list[_Step] = []
        self.same_digest: bool | None = None
        self.same_bundle: bool | None = None
        self.digests: dict[str, str | None] = {}
        self.bundles: dict[str, str | None] = {}
        self.probe_green_since_s: float | None = None
        self.probe_green_at_s: float | None = None
        self.warmed_at_s: float | None = None
        self.mirror_stopped_at_s: float | None = None
        self.hysteresis_from_s: float | None = None
        self.hysteresis_held_at_s: float | None = None
        self.thaw: list[dict[str, object]] = []
        self.thawed_at_s: float | None = None
        self.backoffs = 0
        self._probe_counts: dict[str, float] | None = None
        self._index = 0  # position in plan.steps of the weight in force
        self._pinned: dict[str, list[str]] = {"primary": [], "survivor": []}
        self._primary_thawed_s: float | None = None

    # -- the state machine ------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.phase in ("done", "refused", "halted")

    def tick(self, now_s: float) -> None:
        if self.done:
            return
        if self.started_s is None:
            self.started_s = now_s
        match self.phase:
            case "precheck":
                self._precheck(now_s)
            case "probe":
                self._probe(now_s)
            case "stepping":
                self._stepping(now_s)
            case "hysteresis":
                self._hysteresis(now_s)
            case "thaw":
                self._thaw(now_s)

    def _precheck(self, now: float) -> None:
        regions = [self.primary, *self.survivors]
        self.digests = {
            r: self._current("firedrill_weights_digest_info", r, signed=True) for r in regions
        }
        self.bundles = {r: self._current("firedrill_bundle_digest_info", r) for r in regions}
        self.same_digest = (
            None not in self.digests.values() and len(set(self.digests.values())) == 1
        )
        self.same_bundle = (
            None not in self.bundles.values() and len(set(self.bundles.values())) == 1
        )
        if not (self.same_digest and self.same_bundle):
            assert self.started_s is not None
            if now - self.started_s >= self.precheck_wait_s:
                what = []
                if not self.same_digest:
                    what.append(
                        f"weights digests differ or are not signed and attested: {self.digests}"
                    )
                if not self.same_bundle:
                    what.append(f"CatalogBundle digests differ: {self.bundles}")
                self.phase, self.reason = "refused", "; ".join(what)
            return
        # Start from 0 at home; put the primary's cell weights back so the region weight is
        # what moves traffic; keep the survivor warm (no scale-in); warm the primary's cache.
        self._do(now, ops.SetRegionWeight(self.model, self.primary, 0))
        primary_cells = self._cells(self.primary)
        if all(w == 0 for _, w, _ in primary_cells):
            weights = tuple((c, max(d, 1)) for c, _, d in primary_cells)
            if weights:
                self._do(now, ops.SetRouteWeights(self.model, weights))
        for side, regions in (("primary", [self.primary]), ("survivor", self.survivors)):
            for region in regions:
                for cell, _, desired in self._cells(region):
                    if self._paused(cell):
                        self._pinned[side].append(cell)
                    elif side == "survivor" and desired > 0:
                        ready = self._ready(cell)
                        self._do(now, ops.PauseScaler(self.model, cell, max(desired, ready)))
                        self._pinned[side].append(cell)
        if self.plan.prefix_warmup:
            self._do(now, ops.MirrorTraffic(self.model, self.primary, 100))
        self.phase = "probe"

    def _probe(self, now: float) -> None:
        green = self._probe_green(now)
        if not green:
            self.probe_green_since_s = None
        elif self.probe_green_since_s is None:
            self.probe_green_since_s = now
        probe_ok = (
            self.probe_green_since_s is not None
            and now - self.probe_green_since_s >= self.plan.probe_green_s
        )
        if probe_ok and self.probe_green_at_s is None:
            self.probe_green_at_s = now
        warm = not self.plan.prefix_warmup or self._warm()
        if warm and self.plan.prefix_warmup and self.warmed_at_s is None:
            self.warmed_at_s = now
        if probe_ok and warm:
            self.phase = "stepping"
            self._index = 0
            self.steps.append(_Step(self.plan.steps[0], now, held=True))
            if self.plan.steps[0] != 0:
                self._do(now, ops.SetRegionWeight(self.model, self.primary, self.plan.steps[0]))

    def _stepping(self, now: float) -> None:
        step = self.steps[-1]
        if not step.held:
            burning = self._burning(since_s=step.at_s, now_s=now)
            if burning:
                step.backed_off = True
                step.reason = burning
                self.backoffs += 1
                if self.backoffs > self.max_backoffs:
                    self.phase = "halted"
                    self.reason = (
                        f"backed off {self.backoffs} times; last at {step.weight}%: {burning}"
                    )
                    return
                self._index = max(self._index - 1, 0)
                self._move(now, self.plan.steps[self._index], reason="back-off")
                return
            if now - step.at_s < self.plan.step_hold_s:
                return
            step.held = True
        if self._index + 1 >= len(self.plan.steps):
            self._to_hysteresis(now)
            return
        self._index += 1
        self._move(now, self.plan.steps[self._index])

    def _move(self, now: float, weight: int, reason: str | None = None) -> None:
        self._do(now, ops.SetRegionWeight(self.model, self.primary, weight))
        self.steps.append(_Step(weight, now, reason=reason))

    def _to_hysteresis(self, now: float) -> None:
        if self.plan.prefix_warmup and self.mirror_stopped_at_s is None:
            self._do(now, ops.MirrorTraffic(self.model, self.primary, 0))  # real traffic now
            self.mirror_stopped_at_s = now
        self.phase = "hysteresis"
        self.hysteresis_from_s = now

    def _hysteresis(self, now: float) -> None:
        assert self.hysteresis_from_s is not None
        burning = self._burning(since_s=self.hysteresis_from_s, now_s=now)
        if burning:
            self.backoffs += 1
            if self.backoffs > self.max_backoffs:
                self.phase = "halted"
                self.reason = f"primary burned during the hysteresis: {burning}"
                return
            self.steps[-1].backed_off = True
            self.steps[-1].reason = burning
            self._index = max(self._index - 1, 0)
            self._move(now, self.plan.steps[self._index], reason="back-off in hysteresis")
            self.phase = "stepping"
            return
        if now - self.hysteresis_from_s < self.plan.hysteresis_s:
            return
        held = self._held_slo(self.hysteresis_from_s, now)
        if held is not None:  # burned slowly: not a page, but not held either; watch on
            self.hysteresis_from_s = now
            self.reason = f"hysteresis restarted: {held}"
            return
        self.hysteresis_held_at_s = now
        self.phase = "thaw"
        self._thaw(now)

    def _thaw(self, now: float) -> None:
        if self._primary_thawed_s is None:
            self._unpause("primary", now)
            self._primary_thawed_s = now
            return
        burning = self._burning(since_s=self._primary_thawed_s, now_s=now)
        if burning:
            self._primary_thawed_s = now  # primary not stable yet: the survivor stays pinned
            return
        if now - self._primary_thawed_s >= self.plan.step_hold_s:
            self._unpause("survivor", now)
            self.thawed_at_s = now
            self.phase = "done"

    def _unpause(self, side: str, now: float) -> None:
        cells = sorted(set(self._pinned[side]))
        for cell in cells:
            self._do(now, ops.UnpauseScaler(self.model, cell))
        self.thaw.append({"side": side, "at_s": now, "cells": cells})

    # -- reading the world ------------------------------------------------------------------------
    def _do(self, now: float, op: Operation) -> None:
        inverse = self._apply_fn(op)
        self.applied.append((now, op, inverse))

    def _cells(self, region: str) -> list[tuple[str, int, int]]:
        """(cell, route weight, desired replicas) of the model in the region's cells."""
        out = []
        for view in self.fleet.cells():
            if view.region != region:
                continue
            weight = dict(view.route_weights).get(self.model, 0)
            desired = next((rc.desired for rc in view.replicas if rc.model == self.model), 0)
            out.append((view.name, weight, desired))
        return out

    def _ready(self, cell: str) -> int:
        for view in self.fleet.cells():
            if view.name == cell:
                return next((rc.ready for rc in view.replicas if rc.model == self.model), 0)
        return 0

    def _paused(self, cell: str) -> bool:
        return isinstance(
            self.fleet.inverse_of(ops.UnpauseScaler(self.model, cell)), ops.PauseScaler
        )

    def _current(self, name: str, region: str, *, signed: bool = False) -> str | None:
        _, labels, values = self.signals.instant(name, {"model_name": self.model, "region": region})
        now = [dict(lab) for lab, v in zip(labels, values.tolist(), strict=True) if v == 1.0]
        if len(now) != 1:
            return None
        if signed and not (now[0].get("signed") == "true" and now[0].get("attested") == "true"):
            return None
        return now[0].get("digest")

    def _probe_green(self, now: float) -> bool:
        _, labels, values = self.signals.instant(
            "firedrill_probe_requests_total", {"model_name": self.model, "region": self.primary}
        )
        counts = {
            dict(lab)["result"]: float(v) for lab, v in zip(labels, values.tolist(), strict=True)
        }
        before, self._probe_counts = self._probe_counts, counts
        if before is None:
            return False
        new = {k: counts.get(k, 0.0) - before.get(k, 0.0) for k in counts}
        if any(n > 0 for k, n in new.items() if k != "ok"):
            return False  # a failed probe since the last tick
        if new.get("ok", 0.0) <= 0:
            return self.probe_green_since_s is not None  # no new probe: nothing changed
        _, _, ttft = self.signals.instant(
            "firedrill_probe_ttft_seconds", {"model_name": self.model, "region": self.primary}
        )
        return bool(ttft.size) and bool(np.all(ttft <= self.slo.ttft_threshold_s))

    def _warm(self) -> bool:
        m = {"model_name": self.model, "region": self.primary}
        _, labels, mirrored = self.signals.instant("firedrill_mirrored_requests_per_second", m)
        _, labels_w, warm = self.signals.instant(
            "firedrill_prefix_cache_warm_requests_per_second", m
        )
        warm_by = dict(zip(labels_w, warm.tolist(), strict=True))
        pairs = [
            (float(v), warm_by.get(lab, 0.0))
            for lab, v in zip(labels, mirrored.tolist(), strict=True)
            if v > 0
        ]
        if not pairs:
            return False  # the mirror has not reached the cells yet
        return all(w >= self.warm_enough * m_ for m_, w in pairs)

    def _ratios(self, region: str, start: float, end: float) -> tuple[float, float, float]:
        """(requests, TTFT share over the threshold, 5xx share) for the model in a region."""
        m = {"model_name": self.model, "region": region}
        le = repr(float(self.slo.ttft_threshold_s))
        fast_series = self.signals.query(
            "vllm:time_to_first_token_seconds_bucket", {**m, "le": le}, start_s=0.0, end_s=end
        )
        every_series = self.signals.query(
            "vllm:time_to_first_token_seconds_bucket",
            {**m, "le": "+Inf"},
            start_s=0.0,
            end_s=end,
        )
        if every_series and not fast_series:
            # a threshold off the histogram's boundaries reads as every request slow
            raise FiredrillError(
                f'the TTFT histogram of {self.model} in {region} has no bucket le="{le}": '
                "the failback's TTFT threshold must be one of the exporter's bucket boundaries"
            )
        fast = _increase(fast_series, start, end)
        every = _increase(every_series, start, end)
        http = self.signals.query("http_requests_total", m, start_s=0.0, end_s=end)
        errors = _increase([s for s in http if s.label("status") == "5xx"], start, end)
        total = _increase(http, start, end)
        slow = 1.0 - fast / every if every > 0 else 0.0
        return total, slow, errors / total if total > 0 else 0.0

    def _burning(self, *, since_s: float, now_s: float) -> str | None:
        """A fast burn in either region since ``since_s`` (over the last ``burn_window_s``)."""
        start = max(since_s, now_s - self.burn_window_s)
        if now_s - start < 60.0:
            return None  # not enough to judge yet
        ttft_budget = 1.0 - self.slo.ttft_target
        err_budget = 1.0 - self.slo.availability_target
        for region in (self.primary, *self.survivors):
            total, slow, err = self._ratios(region, start, now_s)
            if total < self.min_requests:
                continue
            if slow > self.burn_factor * ttft_budget:
                return f"{region} TTFT burn {slow / ttft_budget:.1f}x"
            if err > self.burn_factor * err_budget:
                return f"{region} error burn {err / err_budget:.1f}x"
        return None

    def _held_slo(self, start: float, end: float) -> str | None:
        total, slow, err = self._ratios(self.primary, start, end)
        if total < self.min_requests:
            return None
        if slow > 1.0 - self.slo.ttft_target:
            return f"{self.primary} TTFT over its SLO ({slow:.2%} slow)"
        if err > 1.0 - self.slo.availability_target:
            return f"{self.primary} errors over its SLO ({err:.3%})"
        return None

    # -- the result -------------------------------------------------------------------------------
    def result(self) -> dict[str, object]:
        return {
            "state": self.phase,
            "reason": self.reason,
            "primary": self.primary,
            "survivor": list(self.survivors),
            "same_digest": self.same_digest,
            "same_bundle": self.same_bundle,
            "digests": dict(sorted(self.digests.items())),
            "bundles": dict(sorted(self.bundles.items())),
            "started_s": self.started_s,
            "probe_green_since_s": self.probe_green_since_s,
            "probe_green_at_s": self.probe_green_at_s,
            "warmed_at_s": self.warmed_at_s,
            "steps": [s.as_dict() for s in self.steps],
            "backoffs": self.backoffs,
            "mirror_stopped_at_s": self.mirror_stopped_at_s,
            "hysteresis_held_at_s": self.hysteresis_held_at_s,
            "thaw": list(self.thaw),
            "thawed_at_s": self.thawed_at_s,
            "operations": len(self.applied),
        }
