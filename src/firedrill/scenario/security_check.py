"""The ``security`` expectation, and the evidence of a run's security incidents.

Reference self-check 4 asks for containment, evidence, kill switches and comms *without breaking
other tenants*. One check asserts each part for the tenant under investigation:

* ``containment``: the lever kinds applied to the tenant, in this order (others may come between);
* ``deny_all``: whether the fleet-wide egress deny-all was applied (it must not be, short of SEV1
  with the incident commander and the security lead);
* ``pods_quarantined``: at least this many of the tenant's sandbox pods are quarantined, and
  every quarantined pod still exists (retained, never deleted);
* ``evidence``: the incident's evidence bundle holds the suspicious egress records, covers its
  window completely and verifies against its manifest;
* ``comms``: status updates were posted, each status-page entry is product × region and never
  names the tenant, its cells, pods or sessions, and no channel text carries a destination;
* ``others``: these tenants are untouched: no lever or operation targeted them, their flags and
  warm pools are as the spec has them, and none of their pods is quarantined.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from firedrill.model import operations as ops
from firedrill.model.sandbox import (
    DENY_ALL_FLAG,
    SIDE_EFFECT_SUFFIX,
    looks_base64,
    sandbox_namespace,
)
from firedrill.respond.evidence import EvidenceBundle, build_bundle, verify
from firedrill.respond.incidents import Incident

# importing respond.security registers its runbook for the "egress" symptom with the responder
from firedrill.respond.security import window_of

if TYPE_CHECKING:
    from firedrill.scenario.run import ScenarioRun


class SecurityCheck(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    check: Literal["security"]
    tenant: str
    containment: list[str] = []
    deny_all: bool = False
    pods_quarantined: int | None = None
    evidence: bool = True
    comms: bool = True
    others: list[str] = []


def _tenant_of(inc: Incident) -> str:
    return next((v for a in inc.alerts for k, v in a if k == "tenant" and v), "")


def security_incidents(run: ScenarioRun, tenant: str | None = None) -> list[Incident]:
    """The run's security incidents (of one tenant's alerts, when given), in the order opened."""
    if run.responder is None:
        return []
    return [
        inc
        for inc in run.responder.book.incidents
        if inc.kind == "security" and (tenant is None or _tenant_of(inc) == tenant)
    ]


def incident_evidence(run: ScenarioRun, inc: Incident) -> EvidenceBundle:
    """The evidence of one security incident: its tenant's audit records over its window."""
    world = run.world
    tenant = _tenant_of(inc)
    start, end = window_of(inc.opened_at_s, world.now_s())
    levers = []
    if run.responder is not None:
        for r in run.responder.records(inc.id):
            levers.append(r.entry)
            if r.undo is not None:
                levers.append(r.undo)
    return build_bundle(
        incident=inc.id,
        tenant=tenant,
        start_s=start,
        end_s=end,
        egress=world.sandbox.egress_records(start_s=start, end_s=end, tenant=tenant),
        tools=world.sandbox.tool_records(start_s=start, end_s=end, tenant=tenant),
        levers=levers,
        operations=world.operations(),
        compensations=world.sandbox.compensations(tenant=tenant),
        complete_since_s=world.sandbox.complete_since_s(),
        notes={"scenario": run.spec.name, "seed": str(run.spec.seed)},
    )


def evidence_bundles(run: ScenarioRun) -> list[EvidenceBundle]:
    """One bundle per security incident that names a tenant."""
    return [incident_evidence(run, inc) for inc in security_incidents(run) if _tenant_of(inc)]


def _in_order(want: Sequence[str], got: Sequence[str]) -> bool:
    it = iter(got)
    return all(any(g == w for g in it) for w in want)


def _touches(op: ops.Operation, tenant: str) -> bool:
    match op:
        case ops.SetFlag(key=key):
            return key.startswith(f"{tenant}.")
        case (
            ops.SetWarmPool(tenant=t)
            | ops.BlockContentHash(tenant=t)
            | ops.UnblockContentHash(tenant=t)
            | ops.RunCompensations(tenant=t)
        ):
            return t == tenant
        case ops.QuarantinePod(pod=pod) | ops.UnquarantinePod(pod=pod):
            return pod.startswith(sandbox_namespace(tenant) + "/")
    return False


def _problems(c: SecurityCheck, run: ScenarioRun) -> list[str]:
    world = run.world
    sandbox = world.sandbox
    bad: list[str] = []
    incidents = security_incidents(run, c.tenant)
    if not incidents:
        return [f"no security incident for {c.tenant}"]
    inc = incidents[0]
    assert run.responder is not None
    applied = [r.entry for r in run.responder.records(inc.id) if r.applied and r.undo is None]
    kinds = [e.kind for e in applied]
    if c.containment and not _in_order(c.containment, kinds):
        bad.append(f"applied {kinds}")
    deny_all = world.flags().get(DENY_ALL_FLAG) == "true" or any(
        isinstance(a.op, ops.SetFlag) and a.op.key == DENY_ALL_FLAG and a.op.value == "true"
        for a in world.operations()
    )
    if deny_all != c.deny_all:
        bad.append(f"deny-all applied: {deny_all}")
    ns = sandbox_namespace(c.tenant) + "/"
    pods = sorted(p for p in world.quarantined_pods() if p.startswith(ns))
    if c.pods_quarantined is not None and len(pods) < c.pods_quarantined:
        bad.append(f"{len(pods)} pod(s) quarantined")
    gone = [p for p in pods if not sandbox.has_pod(p)]
    if gone:
        bad.append(f"quarantined pods deleted: {gone}")
    bundle = incident_evidence(run, inc)
    if c.evidence:
        egress = bundle.records("egress-proxy.jsonl")
        suspicious = [r for r in egress if r["dest_class"] == "base64-subdomain"]
        problems = verify({f.name: f.data for f in bundle.files})
        if not suspicious:
            bad.append("evidence holds no base64-looking destination")
        if not bundle.complete:
            bad.append("the audit log no longer holds the whole window")
        if problems:
            bad.append(f"evidence does not verify: {problems}")
    if c.comms:
        bad += _comms_problems(run, inc, c.tenant, bundle)
    for other in c.others:
        bad += _touched(run, other)
    return bad


def _comms_problems(
    run: ScenarioRun, inc: Incident, tenant: str, bundle: EvidenceBundle
) -> list[str]:
    assert run.responder is not None
    updates = run.responder.updates(inc.id)
    if not updates:
        return ["no status update posted"]
    egress = bundle.records("egress-proxy.jsonl")
    hidden = {tenant, *(r["pod"] for r in egress), *(r["session"] for r in egress)}
    hidden |= {c.name for c in run.world.cells()}
    hosts = {r["dest_host"] for r in egress if looks_base64(r["dest_host"])}
    bad: list[str] = []
    for u in updates:
        if u.status_page is None:
            bad.append(f"status page refused: {u.refused}")
            continue
        text = f"{u.status_page.product} {u.status_page.text}".lower()
        named = sorted(h for h in hidden if h.lower() in text)
        if named:
            bad.append(f"status page names {named}")
        leaked = sorted(h for h in hosts if h in u.channel_text)
        if leaked:
            bad.append(f"channel text carries destinations {leaked[:2]}")
    return bad


def _touched(run: ScenarioRun, tenant: str) -> list[str]:
    world = run.world
    flags_now = world.flags()
    bad: list[str] = []
    ops_on = [type(a.op).__name__ for a in world.operations() if _touches(a.op, tenant)]
    if ops_on:
        bad.append(f"{tenant} touched by {ops_on}")
    flags = sorted(k for k in flags_now if k.startswith(f"{tenant}."))
    if flags or flags_now.get(DENY_ALL_FLAG) == "true":
        bad.append(f"{tenant} flags set: {flags or [DENY_ALL_FLAG]}")
    spec_pool = next((t.sandboxes for t in world.fleet_spec().tenants if t.name == tenant), None)
    if spec_pool is None:
        return [f"unknown tenant {tenant}"]
    if world.sandbox.warm_pool(tenant) != spec_pool:
        bad.append(f"{tenant} warm pool {world.sandbox.warm_pool(tenant)} != {spec_pool}")
    if flags_now.get(tenant + SIDE_EFFECT_SUFFIX) is not None:
        bad.append(f"{tenant} kill switch set")
    return bad


def evaluate_security(c: SecurityCheck, run: ScenarioRun) -> tuple[str, bool, str, str]:
    """(name, passed, expected, observed) of one security check."""
    fields = c.model_dump(exclude={"check", "tenant"}, exclude_defaults=False)
    expected = ", ".join(f"{k}={v}" for k, v in fields.items() if v not in ([], None))
    bad = _problems(c, run)
    name = f"security {c.tenant}"
    if bad:
        return name, False, expected, "; ".join(bad)
    inc = security_incidents(run, c.tenant)[0]
    return name, True, expected, f"{inc.id} {inc.sev}: contained, evidence verifies"


__all__: Sequence[str] = (
    "SecurityCheck",
    "evaluate_security",
    "evidence_bundles",
    "incident_evidence",
    "security_incidents",
)
