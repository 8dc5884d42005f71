"""Validate a drill against the fleet it runs on, before anything is injected.

Pydantic checks a drill's shape; this module checks the rules of a safe game day, which need the
fleet (which cells a region has, how many nodes a cell holds):

* a hard duration cap and at least one stop condition, always;
* from L1 up, at least one bad-digest injection (admission must deny it) and a written hypothesis;
  from L3 up an abort owner; from L5 up an RTO budget;
* admission stays ``Enforce``: ``Ignore`` (or ``Audit``) is refused whatever the reason;
* the target and every injection inside the allowlist (namespaces by glob, cells, regions);
* no injection wider than the blast radius (its regions and cells, at most ``max_nodes`` nodes);
* a region blackhole lasts at most 12 h;
* no release, promotion or node rollout on the calendar during the change freeze;
* every name resolves (model, cells, regions), PromQL-subset expressions parse, and injections
  fall inside the cap and leave a minute of steady state to check before the first one.

Each problem names the field it is about as a path into the drill (``("injections", 2, "cell")``),
so the spec loader can point at the file and line. Nothing here reads files.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

from firedrill.detect.rules import generate
from firedrill.detect.slo import SloSpec
from firedrill.drill import expr
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
)
from firedrill.model.spec import FleetSpec

Loc = tuple[int | str, ...]
STEADY_STATE_MIN_S = 60.0  # the first injection leaves at least this much steady state to check


@dataclass(frozen=True)
class Problem:
    """One reason to refuse the drill, and the field it is about."""

    loc: Loc
    reason: str

    @property
    def field(self) -> str:
        out = ""
        for part in self.loc:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
        return out


@dataclass(frozen=True)
class _Topology:
    region_of_cell: dict[str, str]
    cells_of_region: dict[str, list[str]]
    cell_nodes: dict[str, int]
    pool_nodes: dict[tuple[str, str], int]
    models: dict[str, list[str]]  # model -> node pools it may run on (empty: any)

    @classmethod
    def of(cls, fleet: FleetSpec) -> _Topology:
        region_of_cell: dict[str, str] = {}
        cells_of_region: dict[str, list[str]] = {}
        cell_nodes: dict[str, int] = {}
        pool_nodes: dict[tuple[str, str], int] = {}
        for r in fleet.regions:
            cells_of_region[r.name] = [c.name for c in r.cells]
            for c in r.cells:
                region_of_cell[c.name] = r.name
                cell_nodes[c.name] = sum(p.nodes for p in c.node_pools)
                for p in c.node_pools:
                    pool_nodes[(c.name, p.name)] = p.nodes
        models = {m.name: list(m.node_pools) for m in fleet.models}
        return cls(region_of_cell, cells_of_region, cell_nodes, pool_nodes, models)

    def region_nodes(self, region: str) -> int:
        return sum(self.cell_nodes[c] for c in self.cells_of_region.get(region, []))

    def model_nodes(self, cell: str, model: str) -> int:
        pools = self.models.get(model, [])
        return sum(
            n for (c, p), n in self.pool_nodes.items() if c == cell and (not pools or p in pools)
        )


def validate(spec: DrillSpec, fleet: FleetSpec, slo: SloSpec | None = None) -> list[Problem]:
    """Every reason to refuse ``spec`` on ``fleet``, in the drill's field order; empty if none."""
    topo = _Topology.of(fleet)
    out: list[Problem] = []
    out += _guardrails(spec)
    out += _names(spec, topo)
    out += _allowlist(spec, topo)
    out += _blast_radius(spec, topo)
    out += _timeline(spec)
    out += _change_freeze(spec)
    out += _expressions(spec, slo)
    return out


# --- the guardrails every drill has ---------------------------------------------------------------


def _guardrails(spec: DrillSpec) -> list[Problem]:
    out: list[Problem] = []
    rung = spec.rung_index
    if spec.duration_cap is None:
        out.append(Problem(("duration_cap",), "a drill needs a hard duration cap"))
    if not spec.stop_conditions:
        out.append(
            Problem(
                ("stop_conditions",),
                "a drill needs at least one stop condition that auto-reverts it "
                "(a human watching a dashboard is not a stop condition)",
            )
        )
    if spec.admission != "Enforce":
        out.append(
            Problem(
                ("admission",),
                f"admission '{spec.admission}' refused: a drill proves the security floor holds, "
                "it never suspends it; keep Enforce and let the bad-digest injection show that "
                "admission denies an unsigned digest",
            )
        )
    if rung >= 1 and not any(isinstance(i, BadDigest) for i in spec.injections):
        out.append(
            Problem(
                ("injections",),
                f"every drill from L1 up tries to deploy a bad digest that admission must deny; "
                f"{spec.rung} has no 'bad_digest' injection",
            )
        )
    if rung >= 1 and not spec.hypothesis:
        out.append(Problem(("hypothesis",), "write the hypothesis, with numbers, before the drill"))
    if rung >= 3 and not spec.abort_owner:
        out.append(
            Problem(("abort_owner",), f"{spec.rung} needs an abort owner who may stop the drill")
        )
    if rung >= 5 and spec.rto is None:
        out.append(Problem(("rto",), f"{spec.rung} needs an RTO budget to measure against"))
    return out


# --- names resolve --------------------------------------------------------------------------------


def _names(spec: DrillSpec, topo: _Topology) -> list[Problem]:
    out: list[Problem] = []
    t = spec.target
    if t.model not in topo.models:
        out.append(Problem(("target", "model"), f"unknown model '{t.model}'"))
    if t.region is not None and t.region not in topo.cells_of_region:
        out.append(Problem(("target", "region"), f"unknown region '{t.region}'"))
    for i, c in enumerate(t.cells):
        if c not in topo.region_of_cell:
            out.append(Problem(("target", "cells", i), f"unknown cell '{c}'"))
    for i, r in enumerate(spec.survivor):
        if r not in topo.cells_of_region:
            out.append(Problem(("survivor", i), f"unknown region '{r}'"))
        elif r == t.region:
            out.append(Problem(("survivor", i), f"the target region '{r}' cannot survive itself"))
    for name, loc in (
        *((r, ("blast_radius", "regions", i)) for i, r in enumerate(spec.blast_radius.regions)),
        *((r, ("allowlist", "regions", i)) for i, r in enumerate(spec.allowlist.regions)),
    ):
        if name not in topo.cells_of_region:
            out.append(Problem(loc, f"unknown region '{name}'"))
    for name, loc in (
        *((c, ("blast_radius", "cells", i)) for i, c in enumerate(spec.blast_radius.cells)),
        *((c, ("allowlist", "cells", i)) for i, c in enumerate(spec.allowlist.cells)),
    ):
        if name not in topo.region_of_cell:
            out.append(Problem(loc, f"unknown cell '{name}'"))
    for i, inj in enumerate(spec.injections):
        cell = getattr(inj, "cell", None)
        if isinstance(cell, str) and cell not in topo.region_of_cell:
            out.append(Problem(("injections", i, "cell"), f"unknown cell '{cell}'"))
        region = getattr(inj, "region", None)
        if isinstance(region, str) and region not in topo.cells_of_region:
            out.append(Problem(("injections", i, "region"), f"unknown region '{region}'"))
        model = getattr(inj, "model", None)
        if isinstance(model, str) and model not in topo.models:
            out.append(Problem(("injections", i, "model"), f"unknown model '{model}'"))
        if (
            isinstance(inj, HydrateStorm)
            and isinstance(cell, str)
            and inj.pool is not None
            and (cell, inj.pool) not in topo.pool_nodes
        ):
            out.append(
                Problem(("injections", i, "pool"), f"cell '{cell}' has no pool '{inj.pool}'")
            )
    for i, p in enumerate(spec.competing_pullers):
        if p.region not in topo.cells_of_region:
            out.append(Problem(("competing_pullers", i, "region"), f"unknown region '{p.region}'"))
    for i, h in enumerate(spec.hypothesis):
        if h.region is not None and h.region not in topo.cells_of_region:
            out.append(Problem(("hypothesis", i, "region"), f"unknown region '{h.region}'"))
        if h.model is not None and h.model not in topo.models:
            out.append(Problem(("hypothesis", i, "model"), f"unknown model '{h.model}'"))
    for i, s in enumerate(spec.stop_conditions):
        region = getattr(s, "region", None)
        if isinstance(region, str) and region not in topo.cells_of_region:
            out.append(Problem(("stop_conditions", i, "region"), f"unknown region '{region}'"))
    return out


# --- allowlist and blast radius -------------------------------------------------------------------


def _namespace_allowed(namespace: str, globs: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(namespace, g) for g in globs)


def _injection_scope(inj: Injection, topo: _Topology) -> tuple[list[str], list[str]]:
    """The (regions, cells) an injection reaches."""
    cell = getattr(inj, "cell", None)
    if isinstance(cell, str):
        region = topo.region_of_cell.get(cell)
        return ([region] if region else []), [cell]
    region = getattr(inj, "region", None)
    if isinstance(region, str):
        return [region], list(topo.cells_of_region.get(region, []))
    return [], []


def _injection_nodes(inj: Injection, topo: _Topology, model: str) -> int:
    """How many nodes an injection may disturb at most."""
    match inj:
        case DcgmField(cell=cell, nodes=nodes, share=share):
            if nodes is not None:
                return nodes
            total = topo.model_nodes(cell, model) or topo.cell_nodes.get(cell, 0)
            return max(1, round(total * share)) if share is not None else 1
        case NvlinkFlap(nodes=nodes) | Thermal(nodes=nodes):
            return nodes
        case ReplicaKill(count=count):
            return count
        case CellDrain(cell=cell) | RegistryPartition(cell=cell):
            return topo.cell_nodes.get(cell, 0)
        case HydrateStorm(cell=cell, pool=pool, percent=percent, model=m):
            total = (
                topo.pool_nodes.get((cell, pool), 0)
                if pool is not None
                else topo.model_nodes(cell, m or model)
            )
            return round(total * percent / 100.0)
        case RegionBlackhole(region=region):
            return topo.region_nodes(region)
        case CapacityDenial() | BadDigest() | NewDigestDuringPause():
            return 0
    return 0


def _allowlist(spec: DrillSpec, topo: _Topology) -> list[Problem]:
    out: list[Problem] = []
    allow = spec.allowlist
    if not _namespace_allowed(spec.target.namespace, allow.namespaces):
        out.append(
            Problem(
                ("target", "namespace"),
                f"namespace '{spec.target.namespace}' is not allowlisted "
                f"({', '.join(allow.namespaces) or 'none'}): a typo must not target kube-system",
            )
        )
    for i, c in enumerate(spec.target.cells):
        if allow.cells and c not in allow.cells:
            out.append(Problem(("target", "cells", i), f"cell '{c}' is not allowlisted"))
    for i, inj in enumerate(spec.injections):
        ns = inj.namespace
        if ns is not None and not _namespace_allowed(ns, allow.namespaces):
            out.append(
                Problem(
                    ("injections", i, "namespace"),
                    f"namespace '{ns}' is not allowlisted "
                    f"({', '.join(allow.namespaces) or 'none'})",
                )
            )
        if isinstance(inj, BadDigest):
            continue  # a probe admission must deny, wherever it is tried
        regions, cells = _injection_scope(inj, topo)
        field = "cell" if hasattr(inj, "cell") else "region"
        if allow.cells and hasattr(inj, "cell"):
            for c in cells:
                if c not in allow.cells:
                    out.append(Problem(("injections", i, field), f"cell '{c}' is not allowlisted"))
        if allow.regions:
            for r in regions:
                if r not in allow.regions:
                    out.append(
                        Problem(("injections", i, field), f"region '{r}' is not allowlisted")
                    )
    return out


def _blast_radius(spec: DrillSpec, topo: _Topology) -> list[Problem]:
    out: list[Problem] = []
    br = spec.blast_radius
    radius_cells = set(br.cells) or {c for r in br.regions for c in topo.cells_of_region.get(r, [])}
    for i, inj in enumerate(spec.injections):
        if isinstance(inj, BadDigest):
            continue  # admission denies it: it reaches nothing when the floor holds
        regions, cells = _injection_scope(inj, topo)
        field = "cell" if hasattr(inj, "cell") else "region"
        for r in regions:
            if r not in br.regions:
                out.append(
                    Problem(
                        ("injections", i, field),
                        f"{inj.kind} reaches region '{r}', outside the blast radius "
                        f"({', '.join(br.regions) or 'no regions declared'})",
                    )
                )
        if br.cells and hasattr(inj, "cell"):
            for c in cells:
                if c not in radius_cells:
                    out.append(
                        Problem(
                            ("injections", i, field),
                            f"{inj.kind} reaches cell '{c}', outside the blast radius "
                            f"({', '.join(br.cells)})",
                        )
                    )
        nodes = _injection_nodes(inj, topo, spec.target.model)
        if nodes > br.max_nodes:
            out.append(
                Problem(
                    ("injections", i),
                    f"{inj.kind} disturbs {nodes} nodes, more than the blast radius allows "
                    f"(max_nodes {br.max_nodes})",
                )
            )
    return out


# --- time -----------------------------------------------------------------------------------------


def _timeline(spec: DrillSpec) -> list[Problem]:
    out: list[Problem] = []
    cap = spec.duration_cap_s
    for i, inj in enumerate(spec.injections):
        if inj.at_s < STEADY_STATE_MIN_S:
            out.append(
                Problem(
                    ("injections", i, "at"),
                    f"the first {STEADY_STATE_MIN_S:.0f} s are the steady state checked before "
                    f"T0; inject at {STEADY_STATE_MIN_S:.0f}s or later",
                )
            )
        if cap is not None and inj.at_s >= cap:
            out.append(
                Problem(
                    ("injections", i, "at"),
                    f"{inj.kind} at {inj.at} is not before the duration cap ({spec.duration_cap})",
                )
            )
        if isinstance(inj, RegionBlackhole):
            d = inj.duration_s
            if d is not None and d > BLACKHOLE_MAX_S:
                out.append(
                    Problem(
                        ("injections", i, "duration"),
                        f"a region blackhole lasts at most 12h (got {inj.duration})",
                    )
                )
    for i, p in enumerate(spec.competing_pullers):
        if cap is not None and p.at_s >= cap:
            out.append(
                Problem(("competing_pullers", i, "at"), "puller starts after the duration cap")
            )
    return out


def _change_freeze(spec: DrillSpec) -> list[Problem]:
    out: list[Problem] = []
    cap = spec.duration_cap_s
    if cap is None:
        return out
    start, end = -spec.change_freeze.before_s, cap + spec.change_freeze.after_s
    for i, ch in enumerate(spec.scheduled_changes):
        if start <= ch.at_s <= end:
            out.append(
                Problem(
                    ("scheduled_changes", i, "at"),
                    f"{ch.kind} '{ch.name}' at T{'+' if ch.at_s >= 0 else ''}{ch.at} falls in "
                    f"the change freeze ({spec.change_freeze.before} before T0 to "
                    f"{spec.change_freeze.after} after the cap): move it or move the drill",
                )
            )
    return out


# --- expressions and alert names ------------------------------------------------------------------


def _expressions(spec: DrillSpec, slo: SloSpec | None) -> list[Problem]:
    out: list[Problem] = []
    alertnames: set[str] | None = None
    if slo is not None:
        rules = generate(slo).rule_file()
        alertnames = {str(r["alert"]) for g in rules["groups"] for r in g["rules"] if "alert" in r}
    for i, s in enumerate(spec.stop_conditions):
        if s.kind == "expr":
            try:
                expr.parse(s.expr)
            except expr.ExprError as exc:
                out.append(Problem(("stop_conditions", i, "expr"), str(exc)))
        elif s.kind == "alert" and alertnames is not None and s.alertname not in alertnames:
            out.append(
                Problem(
                    ("stop_conditions", i, "alertname"),
                    f"no generated rule is named '{s.alertname}' "
                    f"(known: {', '.join(sorted(alertnames)[:8])}, ...)",
                )
            )
    for i, h in enumerate(spec.hypothesis):
        if h.expr is not None:
            try:
                expr.parse(h.expr)
            except expr.ExprError as exc:
                out.append(Problem(("hypothesis", i, "expr"), str(exc)))
    return out
