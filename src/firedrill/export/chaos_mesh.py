"""Chaos Mesh manifests for a drill, and the Kyverno policy that keeps chaos inside its allowlist.

A drill runs on the twin first; the same drill, exported, runs on a real fleet. Chaos Mesh can
express the Kubernetes-level faults: a replica kill (``PodChaos`` pod-kill), a cell cut from its
registry (``NetworkChaos`` partition to an external target) and, approximately, a straggler
(``StressChaos``). Everything else a drill injects is either a GPU signal (``dcgmi test
--inject``), host-level (NVLink flaps, real GPU thermal stress with gpu-burn or dcgmproftester), a
cloud-level fault (the region cut, replication pause and capacity denial belong to AWS FIS:
``firedrill export fis``) or a control-plane step (a drain, a rollout, a bad-digest deploy that
admission must deny). Those come out as notes with the commands to run, never as a manifest that
would pretend to do the same thing.

Every chaos resource that lasts has a ``duration`` that ends it at or before the drill's duration
cap (the controller reverts on expiry); a pod kill is one-shot and carries none. Each has a
namespace selector taken from the drill's target or injection
(never ``kube-system``: the export refuses it even when handed an unvalidated drill), label
selectors ``{app: MODEL, cell: CELL}``, and labels naming the drill and its rung. The Kyverno
``ClusterPolicy`` enforces the allowlist at admission, so a typo in a hand-edited manifest is
denied by the cluster too. Chaos Mesh itself should only act in namespaces annotated
``chaos-mesh.org/inject=enabled`` (``controllerManager.enableFilterNamespace=true``); the notes
list the namespaces to annotate.

An L0 drill is a tabletop: its export holds the policy and, for every injection, a note of what
would be injected, and not one chaos resource.

``chaos_workflow`` puts the same resources into one Chaos Mesh ``Workflow`` that carries the
timeline: a ``Parallel`` entry whose branches each wait (a ``Suspend`` node) until the injection's
offset and then inject for its duration (the chaos node's ``deadline``); every node has a deadline
and the entry's is the drill's cap. Creating the Workflow starts the drill on the cluster;
deleting it ends every chaos it created (the conductor's auto-revert).

The output is deterministic: the same drill gives the same bytes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from firedrill.drill.spec import (
    BLACKHOLE_MAX_S,
    BadDigest,
    CapacityDenial,
    CellDrain,
    DcgmField,
    DrillSpec,
    HydrateStorm,
    Injection,
    NewDigestDuringPause,
    NvlinkFlap,
    RegionBlackhole,
    RegistryPartition,
    ReplicaKill,
    Thermal,
    seconds,
)
from firedrill.errors import ExportError
from firedrill.model.spec import FleetSpec

API_VERSION = "chaos-mesh.org/v1alpha1"
CHAOS_KINDS = ("PodChaos", "NetworkChaos", "StressChaos")  # the kinds the export writes
# Every Chaos Mesh kind the Kyverno policy guards: the pod-selecting chaos, the ones that select
# no pods at all (cloud and physical-machine: denied, since they name no namespace), and the
# two that carry other chaos inside them (Schedule, Workflow).
POD_CHAOS_KINDS = (
    "PodChaos",
    "NetworkChaos",
    "StressChaos",
    "IOChaos",
    "TimeChaos",
    "DNSChaos",
    "HTTPChaos",
    "KernelChaos",
    "JVMChaos",
    "BlockChaos",
    "AWSChaos",
    "GCPChaos",
    "AzureChaos",
    "PhysicalMachineChaos",
)
CARRIER_KINDS = ("Schedule", "Workflow")
ONE_SHOT_ACTIONS = ("pod-kill", "container-kill")  # PodChaos actions a duration means nothing to
POD_KILL_DEADLINE_S = 30  # a workflow node for a pod kill: the kill is immediate
# Namespaces no chaos resource may ever select, whatever an allowlist glob says.
NEVER_TARGET = ("kube-system", "kube-public", "kube-node-lease")
INJECT_ANNOTATION = "chaos-mesh.org/inject=enabled"
LABEL_DRILL = "firedrill.dev/drill"
LABEL_RUNG = "firedrill.dev/rung"
LABEL_INJECTION = "firedrill.dev/injection"
ANNOTATION_AT = "firedrill.dev/at"
ANNOTATION_NOTE = "firedrill.dev/note"
POLICY_NAME = "restrict-chaos-targets"


@dataclass(frozen=True)
class ChaosMeshOptions:
    """Where the chaos resources live and what the registry of a region is called."""

    chaos_namespace: str = "chaos-system"
    registry_host: str = "registry.{region}.corp"  # an external target; {region} is replaced


@dataclass(frozen=True)
class Note:
    """An injection Chaos Mesh does not express (or only in part), and what to run instead."""

    index: int  # the injection's position in the drill
    at: str
    kind: str
    reason: str
    commands: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChaosMeshExport:
    """The manifests (chaos resources, then the Kyverno policy) and the notes beside them."""

    drill: str
    rung: str
    manifests: tuple[dict[str, Any], ...]
    notes: tuple[Note, ...]
    namespaces: tuple[str, ...]  # the namespaces the chaos resources select (to annotate)
    setup: tuple[str, ...] = field(default=())  # commands to run once before the drill


# --- durations --------------------------------------------------------------------------------


def go_duration(seconds: float) -> str:
    """A Go duration string (``1h30m``, ``15m``, ``90s`` -> ``1m30s``) for whole seconds."""
    total = int(seconds)
    if total <= 0:
        return "0s"
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v)


def capped_duration_s(spec: DrillSpec, inj: Injection) -> float:
    """How long the injection may last: its own duration, cut at the drill's cap (and at 12 h).

    An injection without a duration lasts until the cap. A region blackhole never lasts more
    than 12 h (the FIS scenario's maximum), whatever the spec says.
    """
    cap = spec.duration_cap_s
    if cap is None:
        raise ExportError(f"drill '{spec.name}' has no duration cap: nothing can be exported")
    remaining = cap - inj.at_s
    wanted = inj.duration_s if inj.duration_s is not None else remaining
    out = min(wanted, remaining)
    if isinstance(inj, RegionBlackhole):
        out = min(out, BLACKHOLE_MAX_S)
    return float(int(out))  # whole seconds, rounded down: never past the cap


# --- names and selectors ----------------------------------------------------------------------


def _dns_name(*parts: str) -> str:
    """A DNS-1123 name of at most 63 characters (long names keep a hash of the whole)."""
    raw = "-".join(parts).lower()
    name = re.sub(r"[^a-z0-9-]+", "-", raw).strip("-")
    if len(name) > 63:
        digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
        name = name[:54].rstrip("-") + "-" + digest
    return name


def _label_value(text: str) -> str:
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63]
    return value.strip("-._")


def _namespace(spec: DrillSpec, index: int, inj: Injection) -> str:
    ns = inj.namespace or spec.target.namespace
    where = f"injections[{index}].namespace" if inj.namespace else "target.namespace"
    if ns in NEVER_TARGET:
        raise ExportError(f"{where}: chaos never targets '{ns}'")
    if not any(fnmatch.fnmatchcase(ns, g) for g in spec.allowlist.namespaces):
        raise ExportError(
            f"{where}: namespace '{ns}' is not allowlisted "
            f"({', '.join(spec.allowlist.namespaces) or 'none'})"
        )
    return ns


def _check_allowlist(spec: DrillSpec) -> None:
    for glob in spec.allowlist.namespaces:
        hit = [ns for ns in NEVER_TARGET if fnmatch.fnmatchcase(ns, glob)]
        if hit:
            raise ExportError(
                f"allowlist.namespaces: '{glob}' would let chaos reach {', '.join(hit)}"
            )


def _metadata(
    spec: DrillSpec, index: int, inj: Injection, suffix: str, opts: ChaosMeshOptions, note: str
) -> dict[str, Any]:
    annotations = {ANNOTATION_AT: inj.at}
    if note:
        annotations[ANNOTATION_NOTE] = note
    return {
        "name": _dns_name(spec.name, str(index), suffix),
        "namespace": opts.chaos_namespace,
        "labels": {
            LABEL_DRILL: _label_value(spec.name),
            LABEL_RUNG: spec.rung,
            LABEL_INJECTION: str(index),
        },
        "annotations": annotations,
    }


def _selector(namespace: str, model: str, cell: str) -> dict[str, Any]:
    return {"namespaces": [namespace], "labelSelectors": {"app": model, "cell": cell}}


# --- the resources ----------------------------------------------------------------------------


@dataclass
class _Builder:
    spec: DrillSpec
    fleet: FleetSpec
    opts: ChaosMeshOptions
    manifests: list[dict[str, Any]] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)

    def region_of(self, cell: str) -> str:
        for r in self.fleet.regions:
            if any(c.name == cell for c in r.cells):
                return r.name
        raise ExportError(f"unknown cell '{cell}' (not in fleet '{self.fleet.name}')")

    def cells_of(self, region: str) -> list[str]:
        for r in self.fleet.regions:
            if r.name == region:
                return [c.name for c in r.cells]
        raise ExportError(f"unknown region '{region}' (not in fleet '{self.fleet.name}')")

    def note(self, index: int, inj: Injection, reason: str, *commands: str) -> None:
        self.notes.append(Note(index, inj.at, inj.kind, reason, tuple(commands)))

    def chaos(
        self, kind: str, index: int, inj: Injection, suffix: str, spec: dict[str, Any], note: str
    ) -> None:
        ns = spec["selector"]["namespaces"][0]
        if ns not in self.namespaces:
            self.namespaces.append(ns)
        self.manifests.append(
            {
                "apiVersion": API_VERSION,
                "kind": kind,
                "metadata": _metadata(self.spec, index, inj, suffix, self.opts, note),
                "spec": spec,
            }
        )

    def add(self, index: int, inj: Injection) -> None:
        spec, model = self.spec, self.spec.target.model
        if spec.rung == "L0":
            self.note(
                index,
                inj,
                f"tabletop (L0): walk {inj.kind} at {inj.at} on paper; nothing is injected",
            )
            return
        if capped_duration_s(spec, inj) <= 0:
            self.note(index, inj, "starts at or after the duration cap: not exported")
            return
        duration = go_duration(capped_duration_s(spec, inj))
        match inj:
            case ReplicaKill(cell=cell, count=count, model=m):
                ns = _namespace(spec, index, inj)
                body: dict[str, Any] = {"action": "pod-kill", "mode": "one"}
                if count > 1:
                    body = {"action": "pod-kill", "mode": "fixed", "value": str(count)}
                body |= {"selector": _selector(ns, m or model, cell)}  # one-shot: no duration
                self.chaos("PodChaos", index, inj, f"kill-{cell}", body, "")
            case RegistryPartition(cell=cell):
                ns = _namespace(spec, index, inj)
                host = self.opts.registry_host.format(region=self.region_of(cell))
                body = {
                    "action": "partition",
                    "mode": "all",
                    "selector": _selector(ns, model, cell),
                    "direction": "to",
                    "externalTargets": [host],
                    "duration": duration,
                }
                self.chaos("NetworkChaos", index, inj, f"registry-{cell}", body, "")
            case RegionBlackhole(region=region, pause_replication=pause, edge=edge):
                self._blackhole(index, inj, region, duration, pause=pause, edge=edge)
            case Thermal(cell=cell, nodes=nodes, slowdown=slowdown):
                ns = _namespace(spec, index, inj)
                load = min(100, round(100.0 * (1.0 - 1.0 / slowdown)))
                body = {
                    "mode": "one" if nodes == 1 else "fixed",
                    **({} if nodes == 1 else {"value": str(nodes)}),
                    "selector": _selector(ns, model, cell),
                    "stressors": {"cpu": {"workers": 8, "load": load}},
                    "duration": duration,
                }
                self.chaos(
                    "StressChaos",
                    index,
                    inj,
                    f"straggler-{cell}",
                    body,
                    "CPU stress on the replica's pod: a straggler proxy. It does not heat the "
                    "GPU; real thermal/power stress is gpu-burn or dcgmproftester on the node.",
                )
                self.note(
                    index,
                    inj,
                    f"StressChaos only stresses CPU/memory; for a real GPU straggler run gpu-burn "
                    f"(or dcgmproftester) on {nodes} node(s) of {cell}, GPU {inj.gpu}",
                    f"./gpu_burn {int(capped_duration_s(spec, inj))}",
                    "# watch: DCGM_FI_DEV_GPU_TEMP, DCGM_FI_DEV_POWER_VIOLATION, "
                    "router TPOT per replica",
                )
            case DcgmField(cell=cell, field=fid, value=value, gpu=gpu, nodes=n, share=share):
                if n is not None:
                    how_many = f"{n} node(s)"
                elif share is not None:
                    how_many = f"{share:.0%} of the nodes"
                else:
                    how_many = "1 node"
                v = int(value) if float(value).is_integer() else value
                self.note(
                    index,
                    inj,
                    f"DCGM error injection (a contrived field value, hardware untouched) on "
                    f"{how_many} of {cell}: not a Chaos Mesh fault",
                    "dcgmi policy --set 0,0 -p && dcgmi policy --reg   # policy watch",
                    f"dcgmi test --inject --gpuid {gpu} -f {fid} -v {v}",
                    "kubectl get node NODE -o jsonpath='{.spec.taints}{\"\\n\"}'   # verify",
                )
            case NvlinkFlap(cell=cell, nodes=n):
                self.note(
                    index,
                    inj,
                    f"NVLink/IB flap on {n} node(s) of {cell}: host-level (down a link or NIC "
                    "port), outside Chaos Mesh; watch NCCL timeouts and whole-replica ejection",
                )
            case CellDrain(cell=cell):
                self.note(
                    index,
                    inj,
                    f"drain {cell}: a control-plane lever (route weights 100 -> 50 -> 0 behind "
                    "the headroom check), not a chaos fault",
                )
            case HydrateStorm(cell=cell, percent=pct, max_surge=surge, model=m):
                ns = _namespace(spec, index, inj)
                deploy = m or model
                self.note(
                    index,
                    inj,
                    f"hydrate storm: recycle {pct:g}% of {deploy} in {cell} with maxSurge "
                    f"{surge:g}%; a rollout, not a chaos fault",
                    f"kubectl --context {cell} -n {ns} patch deploy {deploy} --type=merge -p "
                    f'\'{{"spec":{{"strategy":{{"rollingUpdate":{{"maxSurge":"{surge:g}%",'
                    f'"maxUnavailable":0}}}}}}}}\'',
                    f"kubectl --context {cell} -n {ns} rollout restart deploy/{deploy}",
                )
            case CapacityDenial(region=region):
                self.note(
                    index,
                    inj,
                    f"insufficient GPU capacity in {region}: a cloud fault, use "
                    "`firedrill export fis` (aws:ec2:asg-insufficient-instance-capacity-error)",
                )
            case BadDigest(model=m, region=region):
                self.note(
                    index,
                    inj,
                    f"deploy an unsigned/unattested digest of {m} in {region}: admission must "
                    "deny it (a finding if it does not); not a chaos fault",
                )
            case NewDigestDuringPause(model=m, region=region):
                self.note(
                    index,
                    inj,
                    f"promote a new signed digest of {m} in {region} while replication is "
                    "paused; the survivors' ready-gate must refuse it until it lands",
                )

    def _blackhole(
        self, index: int, inj: Injection, region: str, duration: str, *, pause: bool, edge: bool
    ) -> None:
        spec, model = self.spec, self.spec.target.model
        ns = _namespace(spec, index, inj)
        others = [r.name for r in self.fleet.regions if r.name != region]
        hosts = [self.opts.registry_host.format(region=r) for r in others]
        note = (
            f"A region cut is better done at the cloud's routing layer (AWS FIS Cross-Region: "
            f"Connectivity, `firedrill export fis`); this only cuts the {model} pods of the cell "
            f"from the other regions' endpoints."
        )
        for cell in self.cells_of(region):
            body = {
                "action": "partition",
                "mode": "all",
                "selector": _selector(ns, model, cell),
                "direction": "to",
                "externalTargets": hosts,
                "duration": duration,
            }
            self.chaos("NetworkChaos", index, inj, f"blackhole-{cell}", body, note)
        reasons = [
            "the cross-region cut belongs to the cloud's routing (FIS transit-gateway "
            "and route-table actions)"
        ]
        if pause:
            reasons.append("the replication pause is aws:s3:bucket-pause-replication")
        if edge:
            reasons.append("the users' cut at the global edge is a GSLB/route change")
        self.note(
            index,
            inj,
            f"region blackhole of {region}: NetworkChaos partitions approximate it per cell; "
            + "; ".join(reasons),
            "firedrill export fis DRILL",
        )


def chaos_mesh(
    spec: DrillSpec, fleet: FleetSpec, *, options: ChaosMeshOptions | None = None
) -> ChaosMeshExport:
    """The Chaos Mesh resources for ``spec`` (in timeline order), the policy, and the notes."""
    opts = options or ChaosMeshOptions()
    if spec.duration_cap_s is None:
        raise ExportError(f"drill '{spec.name}' has no duration cap: nothing can be exported")
    _check_allowlist(spec)
    b = _Builder(spec, fleet, opts)
    order = sorted(range(len(spec.injections)), key=lambda i: (spec.injections[i].at_s, i))
    for i in order:
        b.add(i, spec.injections[i])
    # The policy comes first: applied in stream order, it is in force before any chaos resource.
    manifests = [kyverno_policy(spec, namespaces=b.namespaces), *b.manifests]
    setup = (
        "helm upgrade chaos-mesh chaos-mesh/chaos-mesh --reuse-values "
        "--set controllerManager.enableFilterNamespace=true",
        *(f"kubectl annotate ns {ns} {INJECT_ANNOTATION}" for ns in b.namespaces),
        f"kubectl apply the ClusterPolicy {POLICY_NAME} (the first document) before any chaos",
    )
    return ChaosMeshExport(
        drill=spec.name,
        rung=spec.rung,
        manifests=tuple(manifests),
        notes=tuple(b.notes),
        namespaces=tuple(b.namespaces),
        setup=setup,
    )


# --- one Workflow carrying the timeline --------------------------------------------------------


@dataclass(frozen=True)
class ChaosWorkflowExport:
    """The Kyverno policy and one Workflow (None for a tabletop) with the notes beside them."""

    drill: str
    rung: str
    policy: dict[str, Any]
    workflow: dict[str, Any] | None
    notes: tuple[Note, ...]
    namespaces: tuple[str, ...]
    setup: tuple[str, ...] = field(default=())

    @property
    def manifests(self) -> tuple[dict[str, Any], ...]:
        return (self.policy,) if self.workflow is None else (self.policy, self.workflow)


def _camel(kind: str) -> str:
    return kind[0].lower() + kind[1:]


def _seconds_of(go: str) -> int:
    """``1h30m`` -> 5400 (the inverse of ``go_duration``)."""
    return sum(int(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in re.findall(r"(\d+)([hms])", go))


def chaos_workflow(
    spec: DrillSpec, fleet: FleetSpec, *, options: ChaosMeshOptions | None = None
) -> ChaosWorkflowExport:
    """The drill as one Chaos Mesh Workflow: each injection waits for its offset, then runs."""
    export = chaos_mesh(spec, fleet, options=options)
    opts = options or ChaosMeshOptions()
    cap = spec.duration_cap_s
    assert cap is not None  # chaos_mesh refused a drill without one
    chaos = [m for m in export.manifests if m["kind"] in CHAOS_KINDS]
    if not chaos:
        return ChaosWorkflowExport(
            export.drill, export.rung, export.manifests[0], None, export.notes, (), export.setup
        )
    templates: list[dict[str, Any]] = []
    branches: list[str] = []
    for j, m in enumerate(chaos):
        index = m["metadata"]["labels"][LABEL_INJECTION]
        at_s = int(seconds(m["metadata"]["annotations"][ANNOTATION_AT]))
        body = {k: v for k, v in m["spec"].items() if k != "duration"}
        one_shot = m["kind"] == "PodChaos" and body.get("action") in ONE_SHOT_ACTIONS
        lasts_s = POD_KILL_DEADLINE_S if one_shot else _seconds_of(m["spec"]["duration"])
        lasts_s = min(lasts_s, int(cap) - at_s)
        branch = f"i{index}-{j}"
        node = f"{branch}-{m['kind'].lower()}"
        children = []
        if at_s > 0:
            children.append(f"{branch}-wait")
            templates.append(
                {"name": f"{branch}-wait", "templateType": "Suspend", "deadline": go_duration(at_s)}
            )
        children.append(node)
        templates.append(
            {
                "name": node,
                "templateType": m["kind"],
                "deadline": go_duration(lasts_s),
                _camel(m["kind"]): body,
            }
        )
        templates.append(
            {
                "name": branch,
                "templateType": "Serial",
                "deadline": go_duration(at_s + lasts_s),
                "children": children,
            }
        )
        branches.append(branch)
    entry = {
        "name": "drill",
        "templateType": "Parallel",
        "deadline": go_duration(cap),
        "children": branches,
    }
    workflow = {
        "apiVersion": API_VERSION,
        "kind": "Workflow",
        "metadata": {
            "name": _dns_name(spec.name),
            "namespace": opts.chaos_namespace,
            "labels": {LABEL_DRILL: _label_value(spec.name), LABEL_RUNG: spec.rung},
            "annotations": {
                "firedrill.dev/timeline": ", ".join(
                    f"{m['metadata']['annotations'][ANNOTATION_AT]} {m['kind']}" for m in chaos
                ),
            },
        },
        "spec": {"entry": "drill", "templates": [entry, *templates]},
    }
    setup = tuple(c.replace("before any chaos", "before the Workflow") for c in export.setup)
    return ChaosWorkflowExport(
        export.drill,
        export.rung,
        export.manifests[0],
        workflow,
        export.notes,
        export.namespaces,
        setup,
    )


def render_workflow(export: ChaosWorkflowExport) -> str:
    """The policy, then the Workflow (if any), with the setup and notes as a comment header."""
    lines = [
        f"# Chaos Mesh Workflow for drill {export.drill} (rung {export.rung}), from firedrill.",
        "# Creating the Workflow starts the timeline; deleting it ends every chaos it created.",
        "# Once, before the drill:",
        *(f"#   {c}" for c in export.setup),
    ]
    if export.workflow is None:
        lines.append("# No Workflow: nothing in this drill is injected by Chaos Mesh.")
    if export.notes:
        lines.append("# Not exportable to Chaos Mesh (or only in part): run these instead.")
        for n in export.notes:
            lines.append(f"#   [{n.index}] at {n.at} {n.kind}: {n.reason}")
            lines += [f"#       {c}" for c in n.commands]
    docs = [
        yaml.dump(m, Dumper=_NoAliases, sort_keys=False, default_flow_style=False, width=100)
        for m in export.manifests
    ]
    return "\n".join(lines) + "\n---\n" + "---\n".join(docs)


# --- Kyverno ----------------------------------------------------------------------------------


def _deny(
    name: str, kinds: Sequence[str], message: str, conditions: dict[str, Any]
) -> dict[str, Any]:
    """One Enforce rule (the per-rule ``validate.failureAction``, not the deprecated spec field)."""
    return {
        "name": name,
        "match": {"any": [{"resources": {"kinds": [f"{API_VERSION}/{k}" for k in kinds]}}]},
        "validate": {
            "failureAction": "Enforce",
            "message": message,
            "deny": {"conditions": conditions},
        },
    }


# JMESPath (Kyverno variables) for the namespaces a chaos resource selects, wherever they sit: the
# spec of a chaos kind, the chaos spec a Schedule embeds (``spec.podChaos``, ...), or the chaos
# templates of a Workflow (``spec.templates[].podChaos``, ...).
NAMESPACE_KEYS = (
    "request.object.spec.selector.namespaces[]",
    "request.object.spec.target.selector.namespaces[]",
    "request.object.spec.* | [?type(@) == 'object'].selector.namespaces[]",
    "request.object.spec.* | [?type(@) == 'object'].target.selector.namespaces[]",
    "request.object.spec.templates[].* | [] | [?type(@) == 'object'].selector.namespaces[]",
    "request.object.spec.templates[].* | [] | [?type(@) == 'object'].target.selector.namespaces[]",
)
_EMBEDDED = "[?type(@) == 'object' && selector]"  # the chaos specs among a spec's values


def _key(expr: str) -> str:
    return "{{ " + expr + " }}"


def kyverno_policy(spec: DrillSpec, *, namespaces: Sequence[str] = ()) -> dict[str, Any]:
    """A ClusterPolicy that denies chaos outside the drill's allowlist, for every chaos kind.

    Every rule enforces (``rules[].validate.failureAction: Enforce``). The namespaces a chaos
    resource selects (and a NetworkChaos's ``target``), directly or inside a Schedule or a
    Workflow, must be allowlisted and never ``kube-system`` or its siblings whatever a glob
    says; a selector must name its namespaces (an empty one means "wherever the controller may
    act"); chaos that lasts has a ``duration`` (a pod kill is one-shot and needs none) and every
    Workflow node a ``deadline``, so the controller ends it; a Workflow may not nest a Schedule
    and a Schedule may not run a Workflow, so nothing escapes these checks by nesting.
    """
    _check_allowlist(spec)
    allow = list(spec.allowlist.namespaces)
    every = [*POD_CHAOS_KINDS, *CARRIER_KINDS]
    selected = [_key(f"({k}) || `[]`") for k in NAMESPACE_KEYS]
    one_shot = " && ".join(f"action != '{a}'" for a in ONE_SHOT_ACTIONS)
    rules = [
        _deny(
            "chaos-namespace-allowlist",
            every,
            f"Chaos experiments may only target {', '.join(allow)} namespaces.",
            {"any": [{"key": k, "operator": "AnyNotIn", "value": allow} for k in selected]},
        ),
        _deny(
            "chaos-never-system-namespaces",
            every,
            f"Chaos experiments never target {', '.join(NEVER_TARGET)}.",
            {"any": [{"key": k, "operator": "AnyIn", "value": [*NEVER_TARGET]} for k in selected]},
        ),
        _deny(
            "chaos-namespaces-required",
            POD_CHAOS_KINDS,
            "Chaos experiments must name the namespaces they select.",
            {
                "any": [
                    {
                        "key": _key("length(request.object.spec.selector.namespaces || `[]`)"),
                        "operator": "Equals",
                        "value": 0,
                    }
                ]
            },
        ),
        _deny(
            "chaos-duration-required",
            POD_CHAOS_KINDS,
            "Chaos experiments must have a duration (a hard cap); only a kill is one-shot.",
            {
                "all": [
                    {
                        "key": _key("request.object.spec.duration || ''"),
                        "operator": "Equals",
                        "value": "",
                    },
                    {
                        "key": _key("request.object.spec.action || ''"),
                        "operator": "AnyNotIn",
                        "value": [*ONE_SHOT_ACTIONS],
                    },
                ]
            },
        ),
        _deny(
            "schedule-chaos-bounded",
            ["Schedule"],
            "A Schedule's chaos must name its namespaces and have a duration (kills excepted).",
            {
                "any": [
                    {
                        "key": _key(
                            f"request.object.spec.* | {_EMBEDDED} | [?!(selector.namespaces)] "
                            "| length(@)"
                        ),
                        "operator": "GreaterThan",
                        "value": 0,
                    },
                    {
                        "key": _key(
                            f"request.object.spec.* | {_EMBEDDED} | [?!duration && {one_shot}] "
                            "| length(@)"
                        ),
                        "operator": "GreaterThan",
                        "value": 0,
                    },
                ]
            },
        ),
        _deny(
            "workflow-chaos-bounded",
            ["Workflow"],
            "Every Workflow node needs a deadline and every chaos node named namespaces.",
            {
                "any": [
                    {
                        "key": _key("length(request.object.spec.templates[?!deadline] || `[]`)"),
                        "operator": "GreaterThan",
                        "value": 0,
                    },
                    {
                        "key": _key(
                            f"request.object.spec.templates[].* | [] | {_EMBEDDED} "
                            "| [?!(selector.namespaces)] | length(@)"
                        ),
                        "operator": "GreaterThan",
                        "value": 0,
                    },
                ]
            },
        ),
        _deny(
            "chaos-no-nesting",
            [*CARRIER_KINDS],
            "A Workflow may not nest a Schedule, nor a Schedule run a Workflow.",
            {
                "any": [
                    {
                        "key": _key("length(request.object.spec.templates[?schedule] || `[]`)"),
                        "operator": "GreaterThan",
                        "value": 0,
                    },
                    {
                        "key": _key("request.object.spec.workflow || ''"),
                        "operator": "NotEquals",
                        "value": "",
                    },
                ]
            },
        ),
    ]
    annotations: dict[str, str] = {
        "policies.kyverno.io/title": "Restrict chaos targets",
        "policies.kyverno.io/description": (
            "Chaos Mesh resources, Schedules and Workflows may only select pods in the drill's "
            "allowlisted namespaces, never kube-system, and always end."
        ),
    }
    if namespaces:
        annotations["firedrill.dev/selected-namespaces"] = ",".join(namespaces)
    return {
        "apiVersion": "kyverno.io/v1",
        "kind": "ClusterPolicy",
        "metadata": {
            "name": POLICY_NAME,
            "labels": {LABEL_DRILL: _label_value(spec.name), LABEL_RUNG: spec.rung},
            "annotations": annotations,
        },
        "spec": {"background": True, "rules": rules},
    }


# --- rendering --------------------------------------------------------------------------------


class _NoAliases(yaml.SafeDumper):
    """Write shared values out in full: anchors and aliases confuse reviewers and some tools."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(export: ChaosMeshExport) -> str:
    """Multi-document YAML: a comment header (setup, notes), then one document per manifest."""
    lines = [
        f"# Chaos Mesh manifests for drill {export.drill} (rung {export.rung}), from firedrill.",
        "# Apply each chaos resource at its firedrill.dev/at offset from T0; its duration ends",
        "# it at or before the drill's duration cap. Once, before the drill:",
        *(f"#   {c}" for c in export.setup),
    ]
    if export.notes:
        lines.append("# Not exportable to Chaos Mesh (or only in part): run these instead.")
        for n in export.notes:
            lines.append(f"#   [{n.index}] at {n.at} {n.kind}: {n.reason}")
            lines += [f"#       {c}" for c in n.commands]
    docs = [
        yaml.dump(m, Dumper=_NoAliases, sort_keys=False, default_flow_style=False, width=100)
        for m in export.manifests
    ]
    return "\n".join(lines) + "\n---\n" + "---\n".join(docs)
