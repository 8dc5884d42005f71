"""An AWS FIS experiment template (the CreateExperimentTemplate input) for a drill.

The cloud-level faults of a drill are AWS Fault Injection Service actions: the region blackhole is
the Cross-Region: Connectivity scenario (transit-gateway and route-table disruption towards every
other region, and a pause of the weights bucket's replication), the capacity denial is an
insufficient-capacity error on the GPU Auto Scaling groups (and, given the node roles, on the
RunInstances API). Kubernetes-level and GPU faults are not FIS's (``firedrill export
chaos-mesh``).

An experiment runs in one region, so a template holds the actions of one region: the drill's
target region by default, or ``FisOptions.region``. FIS has no start offsets, so the drill's
timeline becomes a chain of ``aws:fis:wait`` actions and ``startAfter``; every action's duration
ends at or before the drill's duration cap and never exceeds 12 h (the scenario's maximum). Each
drill stop condition becomes one ``aws:cloudwatch:alarm`` stop condition; the alarm it names must
exist (``FisExport.alarms`` says what each one watches). Targets resolve by a tag
(``dr-drill: REGION`` unless told otherwise) and the experiment fails rather than skipping an
action whose targets resolve to nothing: a drill that injects nothing must not pass.

``FIS_ACTIONS`` lists the action ids this module emits with the parameters and target keys the
FIS actions reference documents for each; tests hold the emitted template to it and to botocore's
service model. The output is deterministic, including the client token (a digest of the template,
so creating it twice is idempotent).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from firedrill.drill.spec import (
    AlertStop,
    CapacityDenial,
    DrillSpec,
    ErrorRatioStop,
    ExprStop,
    Injection,
    KvUsageStop,
    Paid5xxStop,
    RegionBlackhole,
    StopCondition,
    TtftStop,
)
from firedrill.errors import ExportError
from firedrill.export.chaos_mesh import capped_duration_s
from firedrill.model.spec import FleetSpec

# The AWS documentation's example account: a placeholder, never a real one.
PLACEHOLDER_ACCOUNT = "111122223333"
PLACEHOLDER_ROLE = "REPLACE-ME-fis-drill-role"
MAX_ACTION_S = 12 * 3600.0  # the cross-region actions' maximum; the blackhole's too
MAX_DESCRIPTION = 512


@dataclass(frozen=True)
class FisAction:
    """One FIS action as documented: its parameters (required ones too) and its target key."""

    parameters: tuple[str, ...]
    required: tuple[str, ...]
    target_key: str | None  # the key in the action's ``targets``; None: the action has none
    resource_type: str | None  # the resource type of that target


# The action ids this module emits, with their documented parameters and target keys.
FIS_ACTIONS: dict[str, FisAction] = {
    "aws:fis:wait": FisAction(("duration",), ("duration",), None, None),
    "aws:network:transit-gateway-disrupt-cross-region-connectivity": FisAction(
        ("duration", "region"), ("duration", "region"), "TransitGateways", "aws:ec2:transit-gateway"
    ),
    "aws:network:route-table-disrupt-cross-region-connectivity": FisAction(
        ("duration", "region", "addIpamPoolCidrs", "addPrefixLists", "addTransitGatewayRoutes"),
        ("duration", "region"),
        "Subnets",
        "aws:ec2:subnet",
    ),
    "aws:s3:bucket-pause-replication": FisAction(
        ("duration", "region", "destinationBuckets", "prefixes"),
        ("duration", "region"),
        "Buckets",
        "aws:s3:bucket",
    ),
    "aws:ec2:asg-insufficient-instance-capacity-error": FisAction(
        ("availabilityZoneIdentifiers", "duration", "percentage"),
        ("availabilityZoneIdentifiers", "duration"),
        "AutoScalingGroups",
        "aws:ec2:autoscaling-group",
    ),
    "aws:ec2:api-insufficient-instance-capacity-error": FisAction(
        ("availabilityZoneIdentifiers", "duration", "percentage"),
        ("availabilityZoneIdentifiers", "duration"),
        "Roles",
        "aws:iam:role",
    ),
}


@dataclass(frozen=True)
class FisOptions:
    """Account, region and the names the template cannot know from the drill."""

    account: str = PLACEHOLDER_ACCOUNT
    region: str | None = None  # the experiment region; None: the drill's target region
    role_arn: str | None = None  # None: a clearly marked placeholder in ``account``
    availability_zones: tuple[str, ...] = ()  # for capacity denial; empty: REGIONa,b,c
    tag_key: str = "dr-drill"  # targets are the resources tagged TAG_KEY=REGION
    capacity_role_arns: tuple[str, ...] = ()  # node roles for the API capacity error (max 5)


@dataclass(frozen=True)
class FisExport:
    """The template for one region, the alarms it expects, and what it left out."""

    region: str
    template: dict[str, Any]
    alarms: tuple[tuple[str, str], ...]  # (alarm name, what it must watch)
    other_regions: tuple[str, ...]  # regions with FIS actions of their own (another template)
    skipped: tuple[tuple[int, str, str], ...] = field(default=())  # (index, kind, reason)


def iso_duration(seconds: float) -> str:
    """ISO-8601 duration for whole seconds: ``PT45M``, ``PT1H30M``, ``PT90S`` -> ``PT1M30S``."""
    total = int(seconds)
    if total <= 0:
        return "PT0S"
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    return "PT" + "".join(f"{v}{u}" for v, u in ((h, "H"), (m, "M"), (s, "S")) if v)


def alarm_name(spec: DrillSpec, stop: StopCondition) -> str:
    """The CloudWatch alarm name for a stop condition: ``DRILL-STOP``, ARN-safe, at most 255."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{spec.name}-{stop.name}")[:255]


def _alarm_meaning(stop: StopCondition) -> str:
    match stop:
        case AlertStop(alertname=name, matchers=m):
            labels = ",".join(f"{k}={v}" for k, v in sorted(m.items()))
            return f"the {name} alert firing" + (f" ({labels})" if labels else "")
        case Paid5xxStop(threshold=t, window=w, region=r):
            return f"paid-tier 5xx ratio over {w} > {t:g}" + (f" in {r}" if r else "")
        case ErrorRatioStop(threshold=t, window=w, region=r):
            return f"error ratio over {w} > {t:g}" + (f" in {r}" if r else "")
        case TtftStop(threshold_s=t, window=w, region=r):
            return f"TTFT p99 over {w} > {t:g} s in {r}"
        case KvUsageStop(threshold=t, region=r):
            return f"highest cell KV-cache usage > {t:g} in {r}"
        case ExprStop(expr=e):
            return f"PromQL: {' '.join(e.split())}"
    return stop.kind


def _injection_region(inj: Injection) -> str | None:
    if isinstance(inj, RegionBlackhole | CapacityDenial):
        return inj.region
    return None


def experiment_regions(spec: DrillSpec) -> list[str]:
    """The regions that have FIS actions, in timeline order of their first action."""
    out: list[str] = []
    for inj in sorted(spec.injections, key=lambda i: i.at_s):
        r = _injection_region(inj)
        if r is not None and r not in out:
            out.append(r)
    return out


def _action_s(spec: DrillSpec, inj: Injection) -> float:
    return min(capped_duration_s(spec, inj), MAX_ACTION_S)


@dataclass
class _Template:
    spec: DrillSpec
    region: str
    opts: FisOptions
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)
    actions: dict[str, dict[str, Any]] = field(default_factory=dict)
    waits: dict[float, str] = field(default_factory=dict)  # at_s -> the wait that ends there

    def target(self, name: str, action_id: str) -> str:
        resource_type = FIS_ACTIONS[action_id].resource_type
        assert resource_type is not None
        self.targets.setdefault(
            name,
            {
                "resourceType": resource_type,
                "resourceTags": {self.opts.tag_key: self.region},
                "selectionMode": "ALL",
            },
        )
        return name

    def action(
        self, name: str, action_id: str, at_s: float, params: dict[str, str], target: str | None
    ) -> None:
        body: dict[str, Any] = {"actionId": action_id, "parameters": params}
        key = FIS_ACTIONS[action_id].target_key
        if key is not None and target is not None:
            body["targets"] = {key: target}
        wait = self.waits.get(at_s)
        if wait is not None:
            body["startAfter"] = [wait]
        self.actions[name] = body

    def chain_waits(self, starts: list[float]) -> None:
        """``aws:fis:wait`` actions in a chain, one ending at each distinct start time."""
        prev_s, prev_name = 0.0, None
        for at_s in sorted(set(starts)):
            if at_s <= 0:
                continue
            name = f"wait-until-t{iso_duration(at_s)[2:].lower()}"
            body: dict[str, Any] = {
                "actionId": "aws:fis:wait",
                "description": f"the drill timeline: T0 + {iso_duration(at_s)}",
                "parameters": {"duration": iso_duration(at_s - prev_s)},
            }
            if prev_name is not None:
                body["startAfter"] = [prev_name]
            self.actions[name] = body
            self.waits[at_s] = name
            prev_s, prev_name = at_s, name


def fis_template(
    spec: DrillSpec, fleet: FleetSpec, *, options: FisOptions | None = None
) -> FisExport:
    """The CreateExperimentTemplate input for the drill's FIS actions in one region."""
    opts = options or FisOptions()
    if spec.duration_cap_s is None:
        raise ExportError(f"drill '{spec.name}' has no duration cap: nothing can be exported")
    if not spec.stop_conditions:
        raise ExportError(f"drill '{spec.name}' has no stop condition: FIS needs at least one")
    regions = experiment_regions(spec)
    if not regions:
        raise ExportError(
            f"drill '{spec.name}' has no FIS action (region_blackhole or capacity_denial); "
            "see `firedrill export chaos-mesh` for Kubernetes-level faults"
        )
    region = opts.region or (spec.target.region if spec.target.region in regions else regions[0])
    if region not in regions:
        raise ExportError(
            f"drill '{spec.name}' has no FIS action in region '{region}' "
            f"(regions with actions: {', '.join(regions)})"
        )
    fleet_regions = [r.name for r in fleet.regions]
    tpl = _Template(spec, region, opts)
    mine = [
        (i, inj)
        for i, inj in enumerate(spec.injections)
        if _injection_region(inj) == region and _action_s(spec, inj) > 0
    ]
    tpl.chain_waits([inj.at_s for _, inj in mine])
    skipped: list[tuple[int, str, str]] = []
    for i, inj in enumerate(spec.injections):
        r = _injection_region(inj)
        if r is None:
            skipped.append((i, inj.kind, "not a FIS fault (see `firedrill export chaos-mesh`)"))
        elif r != region:
            skipped.append((i, inj.kind, f"in {r}: another template (--region {r})"))
        elif _action_s(spec, inj) <= 0:
            skipped.append((i, inj.kind, "starts at or after the duration cap"))
    for i, inj in mine:
        duration = iso_duration(_action_s(spec, inj))
        if isinstance(inj, RegionBlackhole):
            tgw = tpl.target(
                f"tgw-{region}", "aws:network:transit-gateway-disrupt-cross-region-connectivity"
            )
            subnets = tpl.target(
                f"subnets-{region}", "aws:network:route-table-disrupt-cross-region-connectivity"
            )
            for dest in (r for r in fleet_regions if r != region):
                tpl.action(
                    f"i{i}-cut-tgw-{dest}",
                    "aws:network:transit-gateway-disrupt-cross-region-connectivity",
                    inj.at_s,
                    {"duration": duration, "region": dest},
                    tgw,
                )
                tpl.action(
                    f"i{i}-cut-routes-{dest}",
                    "aws:network:route-table-disrupt-cross-region-connectivity",
                    inj.at_s,
                    {"duration": duration, "region": dest},
                    subnets,
                )
                if inj.pause_replication:
                    buckets = tpl.target(f"weights-{region}", "aws:s3:bucket-pause-replication")
                    tpl.action(
                        f"i{i}-pause-crr-{dest}",
                        "aws:s3:bucket-pause-replication",
                        inj.at_s,
                        {"duration": duration, "region": dest},
                        buckets,
                    )
        elif isinstance(inj, CapacityDenial):
            zones = ",".join(opts.availability_zones or tuple(f"{region}{z}" for z in "abc"))
            params = {
                "availabilityZoneIdentifiers": zones,
                "duration": duration,
                "percentage": "100",
            }
            asg = tpl.target(
                f"gpu-asg-{region}", "aws:ec2:asg-insufficient-instance-capacity-error"
            )
            tpl.action(
                f"i{i}-no-gpu-capacity-asg",
                "aws:ec2:asg-insufficient-instance-capacity-error",
                inj.at_s,
                dict(params),
                asg,
            )
            if opts.capacity_role_arns:
                roles = f"node-roles-{region}"
                tpl.targets.setdefault(
                    roles,
                    {
                        "resourceType": "aws:iam:role",
                        "resourceArns": list(opts.capacity_role_arns[:5]),
                        "selectionMode": "ALL",
                    },
                )
                tpl.action(
                    f"i{i}-no-gpu-capacity-api",
                    "aws:ec2:api-insufficient-instance-capacity-error",
                    inj.at_s,
                    dict(params),
                    roles,
                )
    if all(a["actionId"] == "aws:fis:wait" for a in tpl.actions.values()):
        raise ExportError(f"drill '{spec.name}' has no FIS action to run in region '{region}'")
    account = opts.account
    role_arn = opts.role_arn or f"arn:aws:iam::{account}:role/{PLACEHOLDER_ROLE}"
    stops = [
        {
            "source": "aws:cloudwatch:alarm",
            "value": f"arn:aws:cloudwatch:{region}:{account}:alarm:{alarm_name(spec, s)}",
        }
        for s in spec.stop_conditions
    ]
    description = f"{spec.rung} drill {spec.name} ({region}): {spec.description or 'game day'}"
    template: dict[str, Any] = {
        "description": description[:MAX_DESCRIPTION],
        "roleArn": role_arn,
        "stopConditions": stops,
        "targets": tpl.targets,
        "actions": tpl.actions,
        "experimentOptions": {
            "accountTargeting": "single-account",
            "emptyTargetResolutionMode": "fail",
        },
        "tags": {"drill": spec.name, "rung": spec.rung, "model": spec.target.model},
    }
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
    template = {"clientToken": f"firedrill-{digest[:32]}", **template}
    alarms = tuple((alarm_name(spec, s), _alarm_meaning(s)) for s in spec.stop_conditions)
    return FisExport(
        region=region,
        template=template,
        alarms=alarms,
        other_regions=tuple(r for r in regions if r != region),
        skipped=tuple(skipped),
    )


def render(export: FisExport) -> str:
    """The template as JSON for ``aws fis create-experiment-template --cli-input-json``."""
    return json.dumps(export.template, indent=2) + "\n"


__all__ = [
    "FIS_ACTIONS",
    "FisAction",
    "FisExport",
    "FisOptions",
    "alarm_name",
    "experiment_regions",
    "fis_template",
    "iso_duration",
    "render",
]
