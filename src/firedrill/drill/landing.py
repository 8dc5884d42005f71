"""Land a drill's findings as artefacts a team can review and commit, not as a slide.

Each finding kind lands as the change that closes it (reference 001, "Findings become
structure"):

- a broken detection-to-ready chain → the missing policy mapping (an unmapped DCGM field or XID)
  as a policy change, with the policy file it gives (the caller re-renders the NodeHealthCheck
  from it); a field the exporter never showed → the dcgm-exporter counter line to add; a series
  no alert matched → an alert rule for it;
- a missing or late alert → the SLO objective to add (the caller generates and checks its rules);
- a hidden cross-region dependency → the fleet's ``services`` with a copy in every region that
  used it across the cut, and a drill clause (``hidden_dependencies == 0``) that fails until the
  fleet spec is fixed;
- a posture problem (hydrate over budget) → a warm-pool recommendation with its arithmetic;
- a security-floor gap or an unsigned digest admitted → a Kyverno ``verifyImages`` policy;
- anything else → a runbook entry with the finding's owner and due date.

Everything here is pure: it reads the run's JSON report and the specs and returns text; writing
files, rendering the NodeHealthCheck and running promtool belong to the caller. Every artefact
names the findings (``FND-…``) it fixes, and a finding that cannot be landed says why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from firedrill.detect.slo import SloSpec
from firedrill.drill.actions import identity
from firedrill.drill.spec import DrillSpec
from firedrill.model.spec import FleetSpec
from firedrill.remediate.policy import PolicySpec

__all__ = ["Artefact", "Landing", "land"]

# What a fatal field means when the policy under test lost its mapping: the reference's catalogue
# (NVIDIA's XID catalogue and the DBE ECC row of the reference runbook), the same defaults the
# policy has.
_FIELD_DEFAULTS: Mapping[str, str] = {"ecc_dbe": "reset", "thermal": "eject"}
# dcgm-exporter counters (default-counters.csv format: name, type, help) for each fault kind
_EXPORTER_COUNTERS: Mapping[str, tuple[str, str, str]] = {
    "ecc_dbe": (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "Total number of double-bit volatile ECC errors.",
    ),
    "pcie_replay": ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    "thermal": ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    "row_remap": ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Pending row remapping."),
}  # fmt: skip
# where the admission policy reads the signing key from (a Secret Kyverno can read)
SIGNING_KEY_REF = "k8s://firedrill-system/model-signing-key"
_XID_COUNTER = ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.")


@dataclass(frozen=True)
class Artefact:
    """One reviewable file: where it goes under the output directory, what it fixes and why."""

    path: str
    content: str
    kind: str
    fixes: tuple[str, ...]
    summary: str


@dataclass(frozen=True)
class Landing:
    """What a run's findings land as."""

    drill: str
    artefacts: tuple[Artefact, ...]
    policy: PolicySpec | None  # the fixed policy, when a policy change was landed
    not_landed: tuple[tuple[str, str], ...] = ()  # (finding id, why)
    clauses: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)  # added to the drill

    def summary_markdown(self) -> str:
        lines = [f"# What the findings of {self.drill} land as", ""]
        for a in self.artefacts:
            lines.append(f"- `{a.path}` ({a.kind}) fixes {', '.join(a.fixes)}: {a.summary}")
        for ident, why in self.not_landed:
            lines.append(f"- {ident} was not landed: {why}")
        if not self.artefacts and not self.not_landed:
            lines.append("- the run raised no finding: nothing to land")
        return "\n".join(lines) + "\n"


def _dump(data: object) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def _findings(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    raw = report.get("findings") or []
    return [f for f in raw if isinstance(f, Mapping)]


def land(
    report: Mapping[str, Any],
    *,
    drill: DrillSpec,
    policy: PolicySpec,
    fleet: FleetSpec,
    slo: SloSpec,
) -> Landing:
    """The artefacts that close the findings of one run (``report``: its JSON)."""
    name = str(report.get("drill") or drill.name)
    arts: list[Artefact] = []
    skipped: list[tuple[str, str]] = []
    runbook: list[tuple[str, Mapping[str, Any]]] = []
    clauses: list[dict[str, Any]] = []
    policy_fix: dict[str, Any] = {}
    policy_ids: list[str] = []
    counters: list[tuple[str, str]] = []  # (finding id, csv line)
    series_rules: list[tuple[str, dict[str, Any]]] = []
    services = [s.model_dump(mode="json") for s in fleet.services]
    service_ids: list[str] = []
    admission_ids: list[str] = []
    slo_adds: list[tuple[str, dict[str, Any]]] = []
    for f in _findings(report):
        key = str(f.get("key") or "")
        ident = identity(name, key or f"text:{f.get('kind')}:{f.get('text')}")
        detail = f.get("detail") if isinstance(f.get("detail"), Mapping) else {}
        assert isinstance(detail, Mapping)
        head = key.split(":", 1)[0]
        if head == "chain":
            done = _chain(detail, policy, policy_fix, counters, series_rules, ident)
            if done == "policy":
                policy_ids.append(ident)
            elif done is None:
                runbook.append((ident, f))
        elif head == "dependency":
            fixed = _split_service(services, detail)
            if fixed:
                service_ids.append(ident)
                clauses.append(_dependency_clause(detail))
            else:
                skipped.append((ident, f"service {detail.get('service')!r} is not in the fleet"))
        elif head in ("security", "admission"):
            admission_ids.append(ident)
        elif head == "rto_term" and detail.get("term") == "detect_s":
            objective = _missing_objective(drill, slo)
            if objective is not None:
                slo_adds.append((ident, objective))
            else:
                runbook.append((ident, f))
        elif head == "posture":
            arts.append(_posture(report, detail, drill, fleet, ident))
        else:
            runbook.append((ident, f))
    if policy_fix:
        fixed_policy = _merge(policy.model_dump(), policy_fix)
        new_policy = PolicySpec.model_validate(fixed_policy)
        arts.append(
            Artefact(
                "policy/policy.patch.yaml",
                "# Merge into the remediation policy (the drill's policy_overrides or its file)\n"
                + _dump(policy_fix),
                "policy_change",
                tuple(policy_ids),
                "maps the fault the controller did not act on, so the chain reaches a drain",
            )
        )
        arts.append(
            Artefact(
                "policy/policy.yaml",
                "# The remediation policy with the fix applied (the drill's overrides included)\n"
                + _dump(new_policy.model_dump()),
                "policy_change",
                tuple(policy_ids),
                "the whole fixed policy: point the drill's `policy:` at it and drop the "
                "overrides it already contains",
            )
        )
    else:
        new_policy = None
    if counters:
        arts.append(
            Artefact(
                "dcgm-exporter/counters.csv",
                "# Add to dcgm-exporter's counters file (-f): the exporter did not show these\n"
                + "".join(line for _, line in counters),
                "exporter_counters",
                tuple(i for i, _ in counters),
                "puts the fault's field in the exporter's counter set",
            )
        )
    if series_rules:
        rules = [r for _, r in series_rules]
        arts.append(
            Artefact(
                "alerts/gpu-health.rules.yaml",
                _dump({"groups": [{"name": "firedrill-landed-gpu-health", "rules": rules}]}),
                "alert_rules",
                tuple(i for i, _ in series_rules),
                "alerts on the fault's series, which no rule matched",
            )
        )
    if slo_adds:
        arts.append(
            Artefact(
                "slo/objectives.patch.yaml",
                "# Append to the SLO spec's objectives, then run `firedrill rules generate`\n"
                + _dump({"objectives": [o for _, o in slo_adds]}),
                "slo_change",
                tuple(i for i, _ in slo_adds),
                "adds the objective whose burn-rate page was missing for the drill's target",
            )
        )
    if service_ids:
        arts.append(
            Artefact(
                "fleet/services.patch.yaml",
                "# Replace the fleet spec's services (or set them in the drill's fleet_overrides)\n"
                + _dump({"services": services}),
                "fleet_change",
                tuple(service_ids),
                "runs each service that crossed the cut in every region that used it",
            )
        )
        arts.append(
            Artefact(
                "drill/clauses.yaml",
                "# Append to the drill's hypothesis (each fails while its dependency crosses)\n"
                + _dump({"hypothesis": clauses}),
                "drill_clauses",
                tuple(service_ids),
                "a clause per hidden dependency, so the next run tests it",
            )
        )
    if admission_ids:
        arts.append(_kyverno(drill, tuple(admission_ids)))
    if runbook:
        arts.append(_runbook(name, runbook))
    return Landing(
        drill=name,
        artefacts=tuple(arts),
        policy=new_policy,
        not_landed=tuple(skipped),
        clauses=tuple(clauses),
    )


# -- chains ----------------------------------------------------------------------------------------


def _chain(
    detail: Mapping[str, Any],
    policy: PolicySpec,
    fix: dict[str, Any],
    counters: list[tuple[str, str]],
    rules: list[tuple[str, dict[str, Any]]],
    ident: str,
) -> str | None:
    """Land one broken chain; the kind of change made ("policy", "exporter", "alert") or None."""
    fault = str(detail.get("fault") or "")
    broken = str(detail.get("broken_at") or "")
    if broken == "health_condition":
        if fault in _FIELD_DEFAULTS and getattr(policy.fields, fault) is None:
            fix.setdefault("fields", {})[fault] = _FIELD_DEFAULTS[fault]
            return "policy"
        if fault.startswith("xid") and fault[3:].isdigit():
            xid = int(fault[3:])
            if policy.action_for_xid(xid) is None:
                default = PolicySpec().xids.get(xid)
                if default is not None:
                    fix.setdefault("xids", {})[xid] = default
                    return "policy"
        return None  # mapped, or nothing the catalogue knows: a runbook question
    if broken == "exporter_series":
        counter = _XID_COUNTER if fault.startswith("xid") else _EXPORTER_COUNTERS.get(fault)
        if counter is None:
            return None
        counters.append((ident, f"{counter[0]}, {counter[1]}, {counter[2]}\n"))
        return "exporter"
    if broken == "alert":
        counter = _XID_COUNTER if fault.startswith("xid") else _EXPORTER_COUNTERS.get(fault)
        if counter is None:
            return None
        metric = counter[0]
        expr = f"{metric} > 0" if counter[1] == "gauge" else f"increase({metric}[5m]) > 0"
        rules.append(
            (
                ident,
                {
                    "alert": f"GpuHealth{''.join(p.title() for p in fault.split('_'))}",
                    "expr": expr,
                    "for": "30s",
                    "labels": {"severity": "ticket", "source": "firedrill-landed"},
                    "annotations": {
                        "summary": f"{fault} on {{{{ $labels.Hostname }}}} "
                        "GPU {{ $labels.gpu }}"
                    },
                },
            )
        )
        return "alert"
    return None


# -- dependencies ----------------------------------------------------------------------------------


def _split_service(services: list[dict[str, Any]], detail: Mapping[str, Any]) -> bool:
    """Replace a service that crossed the cut by one copy per region that used it (in place)."""
    svc = str(detail.get("service") or "")
    index = next((i for i, s in enumerate(services) if s.get("name") == svc), None)
    if index is None:
        return False
    original = services[index]
    home = str(original["region"])
    crossing = [str(r) for r in detail.get("crosses_cut") or ()]
    used = original.get("used_by")
    users = [str(u) for u in used] if isinstance(used, list) else None
    kept_users = [home] if users is None else [u for u in users if u not in crossing]
    services[index] = {**original, "used_by": kept_users or [home]}
    names = {str(s["name"]) for s in services}
    for region in crossing:
        copy = f"{svc}-{region}"
        while copy in names:
            copy += "-copy"
        names.add(copy)
        services.append(
            {"name": copy, "kind": original["kind"], "region": region, "used_by": [region]}
        )
    return True


def _dependency_clause(detail: Mapping[str, Any]) -> dict[str, Any]:
    svc = str(detail.get("service"))
    return {
        "clause": f"{svc} does not cross the cut (it runs in every region that uses it)",
        "metric": "hidden_dependencies",
        "service": svc,
        "op": "==",
        "value": 0,
        "finding": "runbook_step",
    }


# -- alerts ----------------------------------------------------------------------------------------


def _missing_objective(drill: DrillSpec, slo: SloSpec) -> dict[str, Any] | None:
    """The availability objective for the drill's model when the SLO spec has none."""
    model = drill.target.model
    mine = [o for o in slo.objectives if o.model == model]
    if any(o.sli == "availability" for o in mine):
        return None
    product = mine[0].product if mine else "default"
    return {
        "name": f"{product}-availability-{model}",
        "product": product,
        "model": model,
        "sli": "availability",
        "target": 0.999,
    }


# -- posture ---------------------------------------------------------------------------------------


def _posture(
    report: Mapping[str, Any],
    detail: Mapping[str, Any],
    drill: DrillSpec,
    fleet: FleetSpec,
    ident: str,
) -> Artefact:
    model = next((m for m in fleet.models if m.name == drill.target.model), None)
    weights_gb = model.weights_gb if model is not None else float("nan")
    hydrate_s = _num(detail.get("hydrate_s"))
    budget_s = _num(detail.get("budget_s"))
    stats = report.get("hydrate") if isinstance(report.get("hydrate"), Mapping) else {}
    assert isinstance(stats, Mapping)
    gbps = _num(stats.get("peak_gbps_per_node"))
    became_ready = _num(stats.get("replicas_became_ready"))
    pull_s = weights_gb * 8.0 / gbps if gbps and gbps > 0 else float("nan")
    warm = int(became_ready) if became_ready is not None and not math.isnan(became_ready) else None
    survivors = ", ".join(drill.survivor) or "the survivor"
    lines = [
        f"# Warm-pool recommendation for {drill.target.model} ({drill.name})",
        "",
        f"Finding {ident}: the hydrate term alone exceeded the RTO budget.",
        "",
        "| quantity | value |",
        "|---|---|",
        f"| hydrate term measured | {_fmt_s(hydrate_s)} |",
        f"| RTO budget | {_fmt_s(budget_s)} |",
        f"| weights per replica | {weights_gb:g} GB |",
        f"| peak pull rate per node | {_fmt(gbps, 'Gb/s')} |",
        f"| one replica's pull at that rate | {_fmt_s(pull_s)} (= {weights_gb:g} GB × 8 / rate) |",
        f"| replicas that had to hydrate during the drill | {_fmt(became_ready, '')} |",
        "",
        (
            f"Hold {warm} warm replica(s) of {drill.target.model} in {survivors} (raise the "
            "autoscaler's minimum by that many, or keep a pre-pulled warm pool), so the shift "
            "needs no hydrate: the hydrate term then drops to zero and the RTO is detect + "
            "decide + shift + time to SLO."
            if warm
            else f"Keep a pre-pulled warm pool of {drill.target.model} in {survivors} sized to "
            "the replicas the survivor scales out to at peak."
        ),
    ]
    return Artefact(
        "capacity/warm-pool.md",
        "\n".join(lines) + "\n",
        "capacity",
        (ident,),
        "how much warm capacity removes the hydrate term, with the numbers",
    )


def _num(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def _fmt_s(v: float | None) -> str:
    if v is None or math.isnan(v):
        return "not measured"
    return f"{v / 60:.1f} min" if v >= 120 else f"{v:.0f} s"


def _fmt(v: float | None, unit: str) -> str:
    if v is None or math.isnan(v):
        return "not measured"
    return f"{v:g} {unit}".rstrip()


# -- admission -------------------------------------------------------------------------------------


def _kyverno(drill: DrillSpec, fixes: tuple[str, ...]) -> Artefact:
    namespace = drill.target.namespace or "*"
    policy = {
        "apiVersion": "kyverno.io/v1",
        "kind": "ClusterPolicy",
        "metadata": {
            "name": f"require-signed-attested-{drill.target.model}",
            "annotations": {
                "policies.kyverno.io/title": "Serve only signed and attested model images",
                "firedrill.dev/fixes": ",".join(fixes),
            },
        },
        "spec": {
            "background": False,
            "webhookConfiguration": {"failurePolicy": "Fail"},
            "rules": [
                {
                    "name": "verify-signature-and-attestation",
                    "match": {
                        "any": [{"resources": {"kinds": ["Pod"], "namespaces": [namespace]}}]
                    },
                    "verifyImages": [
                        {
                            "imageReferences": ["*"],
                            "failureAction": "Enforce",
                            "mutateDigest": True,
                            "verifyDigest": True,
                            "required": True,
                            "attestors": [
                                {
                                    "entries": [
                                        {
                                            # the release pipeline's cosign public key
                                            "keys": {"publicKeys": SIGNING_KEY_REF}
                                        }
                                    ]
                                }
                            ],
                        }
                    ],
                }
            ],
        },
    }
    return Artefact(
        "admission/kyverno-require-signed.yaml",
        _dump(policy),
        "admission_policy",
        fixes,
        "admission denies (Enforce, fail closed) any serving image that is not signed and "
        "digest-pinned",
    )


# -- runbook ---------------------------------------------------------------------------------------


def _runbook(drill: str, items: Sequence[tuple[str, Mapping[str, Any]]]) -> Artefact:
    lines = [f"# Runbook entries from {drill}", ""]
    for ident, f in items:
        lines += [
            f"## {ident}: {f.get('kind', 'runbook_step')}",
            "",
            f"- owner: {f.get('owner') or 'unowned'}",
            f"- what the drill showed: {f.get('text')}",
            "- step: reproduce it with the same seed (`firedrill gameday run DRILL --seed S`), "
            "write the step that prevents it here, and close the item with "
            f"`firedrill gameday findings close {ident} --by WHO --note WHAT`",
            "",
        ]
    return Artefact(
        f"runbooks/{drill}.md",
        "\n".join(lines),
        "runbook",
        tuple(i for i, _ in items),
        "one runbook entry per finding no configuration change can close",
    )


def _merge(base: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in patch.items():
        key: Any = k
        if isinstance(v, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), v)
        else:
            out[key] = v
    return out
