"""Release and quality runbooks: weights that are fast and wrong, and bad canaries.

The model owner owns these levers (reference 000: "the model owner owns weight and bundle
rollback"; the bundle revert is in ``inference.py``, with the KV runbook it serves), and each is
the cheapest way back to what ran before:

* **Quality** (``ModelQualityBurn``: a digest's golden-set pass rate dropped). If the failing
  digest is a running canary, abort the rollout (``rollout_abort``): the stable digest goes back
  to 100%, which ``stable_at_100`` then checks. If it is the region's stable digest, roll the
  region back (``digest_rollback``) to the last digest of the model published before it that is
  signed and attested: a rollback is a deploy and goes through admission, so an unsigned or
  unattested digest is never a target (``check_rollback_target``), and neither is a digest
  failing the golden set itself.

Runbooks are pure: they read the incident's alerts and suspects, the ``Fleet`` port (and, where
it offers one, its ``rollout_view``) and a ``DigestCatalog``, and return ordered ``Candidate``s
for the responder to vet, approve and pull.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from firedrill.model.release import RolloutView
from firedrill.model.series import Labels, label_value
from firedrill.ports import Fleet, Signals
from firedrill.respond.guards import (
    DigestCatalog,
    GuardResult,
    check_rollback_target,
    check_stable_at_100,
)
from firedrill.respond.levers import DigestParams, Lever
from firedrill.respond.responder import Candidate, RunbookContext
from firedrill.respond.suspects import Symptom

QUALITY_ALERT = "ModelQualityBurn"
GOLDEN_SERIES = "firedrill_golden_set_requests_total"
CANARY_SHARE = "firedrill_rollout_canary_share"


@runtime_checkable
class Releases(Protocol):
    """A fleet that reports its weights rollouts (Argo Rollouts' ``get rollout``)."""

    def rollout_view(self, model: str) -> RolloutView: ...


@dataclass(frozen=True)
class BadDigest:
    """A weights digest failing the golden set: where, and by how much."""

    model: str
    digest: str
    drop_pts: float  # the largest drop seen, percentage points
    cells: tuple[str, ...]


def bad_digests(alerts: Iterable[Labels]) -> list[BadDigest]:
    """The digests an incident's ``ModelQualityBurn`` alerts name, worst drop first."""
    found: dict[tuple[str, str], tuple[float, list[str]]] = {}
    for a in alerts:
        if label_value(a, "alertname") != QUALITY_ALERT:
            continue
        model, digest = label_value(a, "model_name"), label_value(a, "digest")
        if not model or not digest:
            continue
        try:
            drop = float(label_value(a, "golden_drop_pts") or 0.0)
        except ValueError:
            drop = 0.0
        worst, cells = found.get((model, digest), (0.0, []))
        cell = label_value(a, "cell")
        found[(model, digest)] = (max(worst, drop), [*cells, cell] if cell not in cells else cells)
    out = [BadDigest(m, d, drop, tuple(cells)) for (m, d), (drop, cells) in found.items()]
    return sorted(out, key=lambda b: (-b.drop_pts, b.model, b.digest))


def golden_drops(
    signals: Signals,
    cell: str,
    *,
    at_s: float,
    window_s: float = 600.0,
    baseline_pass_rate: float = 0.97,
    min_probes: int = 100,
) -> list[BadDigest]:
    """Digests whose golden-set pass rate in ``cell`` over the window is below the baseline.

    For an incident that has no quality alert yet (a person declared it): the same ratio the
    alert computes, from the counters' first and last samples in the window.
    """
    sums: dict[tuple[str, str], list[float]] = {}
    for s in signals.query(GOLDEN_SERIES, {"cell": cell}, start_s=at_s - window_s, end_s=at_s):
        if s.values.size < 2:
            continue
        d = dict(s.labels)
        key = (d.get("model_name", ""), d.get("digest", ""))
        inc = float(s.values[-1] - s.values[0])
        acc = sums.setdefault(key, [0.0, 0.0])
        acc[1] += inc
        if d.get("result") == "fail":
            acc[0] += inc
    out = []
    for (model, digest), (fails, total) in sorted(sums.items()):
        if total < min_probes:
            continue
        drop = 100.0 * (fails / total - (1.0 - baseline_pass_rate))
        if drop > 0:
            out.append(BadDigest(model, digest, round(drop, 1), (cell,)))
    return sorted(out, key=lambda b: (-b.drop_pts, b.model, b.digest))


def rollback_target(
    catalog: DigestCatalog, model: str, bad: Collection[str]
) -> tuple[str | None, list[str]]:
    """The last signed and attested digest of ``model`` published before the bad ones.

    Returns the target (None when there is none) and why each later candidate was passed over.
    """
    published = [d.digest for d in catalog.published(model)]
    position = {d: i for i, d in enumerate(published)}
    first_bad = min((position[b] for b in bad if b in position), default=-1)
    before = [i for i in range(len(published)) if first_bad < 0 or i < first_bad]
    passed_over: list[str] = []
    for i in reversed(before or range(len(published))):
        digest = published[i]
        if digest in bad:
            continue
        verdict = check_rollback_target(catalog, model, digest)
        if verdict.ok:
            return digest, passed_over
        passed_over.append(verdict.reason)
    return None, passed_over


def quality_runbook(
    symptom: Symptom,
    fleet: Fleet,
    catalog: DigestCatalog | None,
    *,
    alerts: Sequence[Labels] = (),
    signals: Signals | None = None,
) -> list[Candidate]:
    """Bad weights serving traffic: abort the canary, or roll the region's digest back."""
    bad = bad_digests(alerts)
    if not bad and signals is not None and not symptom.cell.startswith("region:"):
        bad = [
            b for b in golden_drops(signals, symptom.cell, at_s=symptom.onset_s) if b.drop_pts >= 5
        ]
    out: list[Candidate] = []
    bad_by_model: dict[str, set[str]] = {}
    for b in bad:
        bad_by_model.setdefault(b.model, set()).add(b.digest)
    for b in bad:
        view = fleet.rollout_view(b.model) if isinstance(fleet, Releases) else None
        drop = f"golden-set pass rate down {b.drop_pts:g} points in {', '.join(b.cells)}"
        if view is not None and view.running and view.canary_digest == b.digest:
            out.append(
                Candidate(
                    Lever("rollout_abort", b.model),
                    f"canary {b.digest} at {view.canary_percent}% is fast and wrong ({drop}): "
                    f"abort the rollout, stable {view.stable_in(symptom.region)} back to 100%",
                )
            )
            continue
        if view is not None and view.stable_in(symptom.region) not in (None, b.digest):
            continue  # neither the canary nor the region's stable digest: already gone here
        if catalog is None:
            continue
        target, passed_over = rollback_target(catalog, b.model, bad_by_model[b.model])
        if target is None:
            continue
        skipped = f"; passed over: {'; '.join(passed_over)}" if passed_over else ""
        out.append(
            Candidate(
                Lever("digest_rollback", b.model, DigestParams(symptom.region, target)),
                f"{b.model} {b.digest} is fast and wrong ({drop}): roll {symptom.region} back to "
                f"{target}, the last signed and attested digest before it{skipped}",
            )
        )
    seen: set[tuple[str, str, str]] = set()
    unique = []
    for c in out:
        assert isinstance(c.request, Lever)
        key = (c.request.kind, c.request.target, repr(c.request.params))
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return sorted(unique, key=lambda c: 0 if c.request.kind == "rollout_abort" else 1)


def stable_at_100(
    fleet: Fleet, signals: Signals, model: str, cells: Collection[str]
) -> GuardResult:
    """After an abort: no canary runs and no pool of ``cells`` has traffic on a canary digest."""
    if isinstance(fleet, Releases):
        view = fleet.rollout_view(model)
        if view.running:
            running = f"{view.canary_digest} still at {view.canary_percent}%"
            return check_stable_at_100(model, cells, running_canary=running, on_canary=())
    _, labels, values = signals.instant(CANARY_SHARE, {"model_name": model})
    on_canary = [
        f"{label_value(lab, 'cell')} {v:.0%}"
        for lab, v in zip(labels, values.tolist(), strict=True)
        if label_value(lab, "cell") in cells and math.isfinite(v) and v > 0
    ]
    return check_stable_at_100(model, cells, running_canary=None, on_canary=on_canary)


def quality_symptom_runbook(ctx: RunbookContext) -> list[Candidate]:
    """A quality symptom: the release runbook over the incident's alerts and signals."""
    return quality_runbook(
        ctx.symptom, ctx.fleet, ctx.catalog, alerts=ctx.alerts, signals=ctx.signals
    )
