"""Findings: every gap a drill shows becomes an action item with a kind and an owner.

"Findings become structure": each lands as a runbook step, an alert, an admission policy or a
release gate (reference 001), never as a slide. The kinds and their default owners come from the
drill spec (``owners``); a clause may name its own owner and kind.

Sources, in the order they are reported: failed clauses; the RTO over budget and each term over
its plan (detect → alert, the rest → runbook step); a posture problem; a stop condition that
fired; levers and injections the guards refused; GPU fault chains that broke before the drain
(the "alert but no drain" question); hidden cross-region dependencies; security-floor checks
that failed; an unsigned digest admitted; capacity the survivors asked for and did not get.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from firedrill.drill.spec import DrillSpec, FindingKind

TERM_KINDS: Mapping[str, FindingKind] = {
    "detect_s": "alert",
    "decide_s": "runbook_step",
    "shift_s": "runbook_step",
    "hydrate_s": "runbook_step",
    "time_to_slo_s": "runbook_step",
}


def _shape(text: str) -> str:
    """A refusal's text with its numbers masked: the same refusal, whatever the run's values."""
    return re.sub(r"\d+(?:\.\d+)?", "#", text)


def _secs(x: float) -> str:
    return f"{x / 60:.1f} min" if x >= 120 else f"{x:.0f} s"


class Findings:
    def __init__(self, spec: DrillSpec) -> None:
        self.spec = spec
        self.items: list[dict[str, Any]] = []

    def add(
        self,
        kind: FindingKind,
        text: str,
        owner: str | None = None,
        *,
        key: str,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        """Record a finding once. ``key`` names the gap independently of this run's numbers, so
        the same gap found by a later run is the same action item (`firedrill.drill.actions`);
        ``detail`` carries what landing it as an artefact needs (`firedrill.drill.landing`)."""
        item: dict[str, Any] = {"kind": kind, "text": text, "owner": owner or self.spec.owner(kind)}
        if any(i["key"] == key for i in self.items):
            return
        item["key"] = key
        item["detail"] = dict(detail or {})
        self.items.append(item)

    def collect(
        self,
        *,
        clauses: Sequence[Mapping[str, Any]],
        rto_terms: Mapping[str, float | None],
        planned: Mapping[str, float],
        measured: float | None,
        budget: float | None,
        posture: bool,
        fired: Any,
        refused: Sequence[str],
        chains: Sequence[Mapping[str, Any]],
        dependencies: Sequence[Mapping[str, Any]],
        security: Sequence[Mapping[str, Any]],
        unsigned: int | None,
        capacity_errors: int | None,
        survivors: Sequence[str],
        failover_refusals: Sequence[str],
    ) -> None:
        for clause, row in zip(self.spec.hypothesis, clauses, strict=True):
            if not row["passed"]:
                seen = row["observed"]
                shown = "not measured" if seen is None else f"{seen:g}"
                self.add(
                    clause.finding,
                    f"hypothesis failed: '{clause.clause}' expected {clause.metric} "
                    f"{clause.op} {clause.value:g}, observed {shown}",
                    clause.owner,
                    key=f"clause:{clause.clause}",
                    detail={
                        "metric": clause.metric,
                        "op": clause.op,
                        "value": clause.value,
                        "observed": seen,
                        "region": clause.region,
                        "service": clause.service,
                    },
                )
        if budget is not None:
            if measured is None:
                self.add(
                    "runbook_step",
                    "users were never served within SLO again before the cap: the failover "
                    "plan did not complete; walk the runbook from the first page",
                    key="rto:not_served",
                    detail={"budget_s": budget},
                )
            elif measured > budget:
                self.add(
                    "runbook_step",
                    f"measured RTO {_secs(measured)} exceeds the {_secs(budget)} budget",
                    key="rto:over_budget",
                    detail={"measured_s": measured, "budget_s": budget},
                )
        for key, kind in TERM_KINDS.items():
            actual, plan = rto_terms.get(key), planned.get(key)
            if actual is not None and plan is not None and actual > plan:
                name = key.removesuffix("_s").replace("_", " ")
                self.add(
                    kind,
                    f"RTO term '{name}' took {_secs(actual)}, over its {_secs(plan)} plan",
                    key=f"rto_term:{key}",
                    detail={"term": key, "measured_s": actual, "planned_s": plan},
                )
        if posture:
            self.add(
                "runbook_step",
                "posture problem: the hydrate term alone exceeds the RTO budget (pilot light "
                "pretending to be warm standby): hold more warm capacity in the survivor",
                key="posture:hydrate_over_budget",
                detail={
                    "hydrate_s": rto_terms.get("hydrate_s"),
                    "budget_s": budget,
                    "survivors": list(survivors),
                },
            )
        if fired is not None:
            self.add(
                "runbook_step",
                f"stop condition '{fired.name}' fired at T+{fired.fired_at_s:.0f}s and every "
                "injection was reverted: find why the guardrail was reached before the next run",
                key=f"stop:{fired.name}",
                detail={"stop_condition": fired.name, "at_s": fired.fired_at_s},
            )
        for text in (*failover_refusals, *refused):
            self.add(
                "runbook_step",
                f"refused during the drill: {text}",
                key=f"refused:{_shape(text)}",
                detail={"refusal": text},
            )
        for c in chains:
            broken = c.get("broken_at")
            if broken is None or str(c.get("why", "")).startswith("policy:"):
                continue  # complete, or stopped where the policy means it to (a ticket, an app XID)
            reached = [s["name"] for s in c.get("stages", ()) if s.get("status") == "ok"]
            chain_kind: FindingKind = (
                "alert" if broken in ("exporter_series", "alert") else "runbook_step"
            )
            alerted = (
                " alert but no drain:"
                if "alert" in reached
                and broken
                in (
                    "health_condition",
                    "taint",
                    "drain",
                )
                else ""
            )
            self.add(
                chain_kind,
                f"{c.get('kind')} on {c.get('node')} (gpu {c.get('gpu')}):{alerted} the chain "
                f"broke at '{broken}' after {' > '.join(reached) or 'nothing'}: {c.get('why')}",
                key=f"chain:{c.get('kind')}:{broken}",
                detail={
                    "fault": c.get("kind"),
                    "broken_at": broken,
                    "why": c.get("why"),
                    "node": c.get("node"),
                    "reached": reached,
                },
            )
        for d in dependencies:
            crosses = ", ".join(str(x) for x in d.get("crosses_cut") or ()) or "the other side"
            self.add(
                "runbook_step",
                f"hidden cross-region dependency: {d.get('service')} ({d.get('kind')}) lives in "
                f"{d.get('lives_in')} and is used from {crosses}: {d.get('broke')}; run it in "
                "every region or fail it over with the traffic",
                d.get("owner") if isinstance(d.get("owner"), str) else None,
                key=f"dependency:{d.get('service')}",
                detail={
                    "service": d.get("service"),
                    "service_kind": d.get("kind"),
                    "lives_in": d.get("lives_in"),
                    "used_by": list(d.get("used_by") or ()),
                    "crosses_cut": list(d.get("crosses_cut") or ()),
                    "observed": d.get("observed"),
                },
            )
        for check in security:
            if check.get("passed") is False:
                self.add(
                    "admission_policy",
                    f"security floor: {check.get('check')} did not hold: "
                    f"{check.get('detail') or check.get('reason') or ''}".rstrip(": "),
                    key=f"security:{check.get('check')}",
                    detail={"check": check.get("check")},
                )
        if unsigned:
            self.add(
                "admission_policy",
                f"{unsigned} replica(s) ran a digest that is not signed and attested: admission "
                "let it through, the most important finding of the day",
                key="admission:unsigned_admitted",
                detail={"unsigned": unsigned},
            )
        if capacity_errors and survivors:
            self.add(
                "runbook_step",
                "the autoscalers asked for more GPU nodes than the regions had spare "
                f"({capacity_errors} refused node requests over the drill): the plan must work "
                "with the warm capacity the survivors hold",
                key="capacity:survivor_scale_out_refused",
                detail={"refused_node_requests": capacity_errors, "survivors": list(survivors)},
            )
