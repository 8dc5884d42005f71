"""What changed? Rank the changes of the last hours as suspects for a symptom.

Most incidents are changes, and an ML platform has six change streams, not one: weights, the
serving bundle, the serving image, the node layer (driver, firmware, kernel, node image, DCGM
exporter), network policy, and demand. Triage reads all six for the incident's cell and its
neighbours over the last 2-6 hours. Each change scores

    timing × scope × prior

* **timing**: ``1 / (1 + lead / 1 h)``, where lead is how long before onset it landed; a change
  at onset scores 1, one an hour earlier 0.5. A change after onset is not a cause: it scores 0
  and ranks below every change before onset. Changes more than ``window_s`` (6 h) before onset
  are ignored.
* **scope**: the symptom's own cell 1.0, the same region (a neighbour cell, or region-wide) 0.6,
  fleet-wide (region ``*``) 0.4; a cell in another region is out of scope and ignored.
* **prior**: how often a stream causes this kind of symptom (``PRIORS``): a serving-config
  change in the bundle (``max_num_seqs``, ``gpu_memory_utilization``) causes KV OOMs and TTFT;
  weights cause quality and availability; the node layer causes XIDs; network policy causes
  egress and availability; demand causes TTFT.

The demand trap: TTFT rising in cell A right after neighbour B drained looks exactly like a
regression, and it is a capacity problem. Demand changes are ``demand``-stream events by
convention: a route-weight change has numeric ``before``/``after`` weights (a drain lowers B's
weight, often to 0), and a traffic shift into A names its source in ``detail`` ("traffic moved
from B"). A drain in a same-region neighbour pushes its traffic into the symptom's cell, so it
scores with the cell's scope (1.0), not a neighbour's. ``recommend`` then says capacity, not
rollback.

A node-layer rollout records one change per node; the changes of one rollout step (same cell,
same before, after and component) fold into one suspect that counts them.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from firedrill.model.changes import CHANGE_STREAMS, ChangeEvent, ChangeStream
from firedrill.model.state import NodeView

SymptomKind = Literal[
    "ttft", "availability", "kv_oom", "quality", "xid", "egress", "pd_imbalance", "training_stall"
]
SYMPTOM_KINDS: tuple[SymptomKind, ...] = (
    "ttft",
    "availability",
    "kv_oom",
    "quality",
    "xid",
    "egress",
    "pd_imbalance",
    "training_stall",  # a JobSet holds its GPUs with zero progress (a hang, no crash, no XID)
)

WINDOW_S: Final = 6 * 3600.0  # how far before onset triage looks
TIMING_HALF_S: Final = 3600.0  # a change this long before onset gets half the timing score
SCOPE_CELL: Final = 1.0
SCOPE_REGION: Final = 0.6
SCOPE_FLEET: Final = 0.4
PRIOR_FLOOR: Final = 0.05  # any change can cause anything, rarely
WEAK_SCORE: Final = 0.1  # a top suspect below this is reported as weak evidence
FLEET: Final = "*"

# How often a change in each stream causes each kind of symptom, 0..1.
PRIORS: Final[Mapping[ChangeStream, Mapping[SymptomKind, float]]] = {
    "weights": {
        "quality": 1.0,
        "availability": 0.8,
        "ttft": 0.3,
        "kv_oom": 0.2,
        "xid": PRIOR_FLOOR,
        "egress": PRIOR_FLOOR,
        "pd_imbalance": 0.2,
        "training_stall": PRIOR_FLOOR,
    },
    "bundle": {
        "kv_oom": 1.0,
        "ttft": 0.8,
        "quality": 0.6,  # prompt and toolset digests live in the bundle too
        "availability": 0.4,
        "egress": 0.3,
        "xid": PRIOR_FLOOR,
        "pd_imbalance": 0.8,  # the prefill/decode split is serving config
        "training_stall": PRIOR_FLOOR,
    },
    "serving_image": {
        "availability": 0.7,
        "ttft": 0.6,
        "kv_oom": 0.5,
        "quality": 0.4,
        "xid": 0.3,
        "egress": PRIOR_FLOOR,
        "pd_imbalance": 0.4,
        "training_stall": PRIOR_FLOOR,
    },
    "node_layer": {
        "xid": 1.0,
        "availability": 0.4,
        "ttft": 0.2,
        "kv_oom": PRIOR_FLOOR,
        "quality": PRIOR_FLOOR,
        "egress": PRIOR_FLOOR,
        "pd_imbalance": PRIOR_FLOOR,
        "training_stall": 0.8,  # a driver, NCCL or firmware change under the gang
    },
    "network_policy": {
        "egress": 1.0,
        "availability": 0.8,
        "ttft": 0.2,
        "kv_oom": PRIOR_FLOOR,
        "quality": PRIOR_FLOOR,
        "xid": PRIOR_FLOOR,
        "pd_imbalance": PRIOR_FLOOR,
        "training_stall": 0.3,  # the collective's fabric
    },
    "demand": {
        "ttft": 1.0,
        "kv_oom": 0.6,
        "availability": 0.5,
        "egress": 0.3,  # a new agent product calls out more
        "quality": PRIOR_FLOOR,
        "xid": PRIOR_FLOOR,
        "pd_imbalance": 1.0,  # a shift in request shape (long prompts) unbalances the roles
        "training_stall": PRIOR_FLOOR,
    },
}

# The first lever for a top suspect in each stream.
LEVERS: Final[Mapping[ChangeStream, str]] = {
    "demand": "capacity: add headroom / rebalance routes; do not roll back",
    "bundle": "roll back the bundle label (bundle_revert) to the last-known-good digest",
    "weights": "abort the weight rollout (rollout_abort): stable back to 100%",
    "serving_image": "roll back the serving image (image_revert) to the last-known-good tag",
    "node_layer": (
        "quarantine the changed nodes (node_quarantine) and pause the node-layer rollout; "
        "the driver rolls back last"
    ),
    "network_policy": "revert the policy change (policy_revert); kill switches narrowest first",
}

_FROM_CELL = re.compile(r"\bfrom\s+(?:cell\s+)?([A-Za-z0-9][\w.:-]*)", re.IGNORECASE)


@dataclass(frozen=True)
class Symptom:
    """What hurts, where, and since when."""

    kind: SymptomKind
    onset_s: float
    cell: str
    region: str

    def __post_init__(self) -> None:
        if self.kind not in SYMPTOM_KINDS:
            raise ValueError(f"unknown symptom kind '{self.kind}': one of {SYMPTOM_KINDS}")
        if not math.isfinite(self.onset_s):
            raise ValueError(f"onset_s must be finite, got {self.onset_s}")


@dataclass(frozen=True)
class Suspect:
    """A change ranked against a symptom, with the evidence behind its score."""

    stream: ChangeStream
    change: ChangeEvent  # for folded node changes: the one closest to onset
    at_s: float
    score: float  # timing × scope × prior, 0..1; 0 for a change after onset
    evidence: list[str]
    lead_s: float  # seconds from the change to onset; negative after onset
    count: int = 1  # changes folded into this suspect (a node-layer rollout: one per node)

    @property
    def before_onset(self) -> bool:
        """Whether the change could be a cause at all."""
        return self.lead_s >= 0


def _duration(s: float) -> str:
    s = abs(s)
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def drains(change: ChangeEvent) -> bool:
    """Whether a demand change takes traffic out of its cell (a route weight lowered, a drain)."""
    if change.stream != "demand":
        return False
    before, after = _number(change.before), _number(change.after)
    if before is not None and after is not None:
        return after < before
    return "drain" in f"{change.after} {change.detail}".lower()


def source_cell(change: ChangeEvent) -> str | None:
    """The cell a demand change says traffic moved from, if it names one."""
    if change.stream != "demand":
        return None
    found = _FROM_CELL.search(change.detail)
    return found.group(1) if found else None


def _scope(change: ChangeEvent, symptom: Symptom) -> tuple[float, str]:
    """The scope weight and why; 0 for a cell in another region (out of scope)."""
    if change.region == FLEET:
        return SCOPE_FLEET, "fleet-wide"
    if change.region != symptom.region:
        return 0.0, f"another region ({change.region})"
    if change.cell == symptom.cell:
        return SCOPE_CELL, f"same cell {symptom.cell}"
    if change.cell == FLEET:
        return SCOPE_REGION, f"region-wide in {symptom.region}"
    if drains(change):
        return (
            SCOPE_CELL,
            f"neighbour {change.cell} drained: its traffic shifts into {symptom.cell} "
            f"(same region {symptom.region})",
        )
    return SCOPE_REGION, f"same region {symptom.region} (neighbour cell {change.cell})"


def _prior_words(prior: float) -> str:
    if prior >= 0.7:
        return "commonly cause"
    if prior >= 0.3:
        return "sometimes cause"
    return "seldom cause"


def _what(change: ChangeEvent) -> str:
    text = f"{change.subject}: {change.before or '(none)'} → {change.after or '(none)'}"
    return f"{text} ({change.detail})" if change.detail else text


def _group_key(change: ChangeEvent, after_onset: bool) -> tuple[object, ...]:
    # One rollout step across many nodes is one suspect; every other change stands alone.
    subject = "" if change.stream == "node_layer" else change.subject
    return (
        change.stream,
        change.region,
        change.cell,
        subject,
        change.before,
        change.after,
        change.detail,
        after_onset,
        change.at_s if change.stream != "node_layer" else 0.0,
    )


def _canonical(change: ChangeEvent) -> tuple[object, ...]:
    return (
        change.at_s,
        CHANGE_STREAMS.index(change.stream),
        change.region,
        change.cell,
        change.subject,
        change.before,
        change.after,
        change.detail,
    )


def rank(
    changes: Iterable[ChangeEvent],
    symptom: Symptom,
    *,
    window_s: float = WINDOW_S,
    priors: Mapping[ChangeStream, Mapping[SymptomKind, float]] = PRIORS,
) -> list[Suspect]:
    """Every in-scope change since ``onset - window_s``, as suspects, most likely first."""
    if not window_s > 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    onset = symptom.onset_s
    in_scope = [
        c
        for c in sorted(changes, key=_canonical)
        if c.at_s >= onset - window_s and _scope(c, symptom)[0] > 0
    ]
    drained_at: dict[str, float] = {}  # neighbour cell -> latest drain before onset
    for c in in_scope:
        if c.region == symptom.region and c.at_s <= onset and drains(c):
            drained_at[c.cell] = c.at_s
    groups: dict[tuple[object, ...], list[ChangeEvent]] = {}
    for c in in_scope:
        groups.setdefault(_group_key(c, c.at_s > onset), []).append(c)

    suspects = [_suspect(group, symptom, drained_at, priors) for group in groups.values()]
    return sorted(suspects, key=_rank_key)


def _suspect(
    group: Sequence[ChangeEvent],
    symptom: Symptom,
    drained_at: Mapping[str, float],
    priors: Mapping[ChangeStream, Mapping[SymptomKind, float]],
) -> Suspect:
    onset = symptom.onset_s
    after_onset = group[0].at_s > onset
    # The change closest to onset speaks for the group: the latest before, the first after.
    change = group[0] if after_onset else group[-1]
    scope_w, scope_why = _scope(change, symptom)
    prior = priors.get(change.stream, {}).get(symptom.kind, PRIOR_FLOOR)
    lead_s = onset - change.at_s
    evidence: list[str] = []
    if after_onset:
        evidence.append(f"changed {_duration(lead_s)} after onset: not a cause")
        score = 0.0
    else:
        timing = 1.0 / (1.0 + lead_s / TIMING_HALF_S)
        score = timing * scope_w * prior
        evidence.append(f"changed {_duration(lead_s)} before onset (timing {timing:.2f})")
    evidence.append(f"{scope_why} (scope {scope_w:.1f})")
    evidence.append(
        f"{change.stream} changes {_prior_words(prior)} {symptom.kind} (prior {prior:.2f})"
    )
    evidence.append(_what(change))
    if len(group) > 1:
        first = group[-1] if after_onset else group[0]
        side = "after" if after_onset else "before"
        span = (
            f"between {_duration(onset - first.at_s)} and {_duration(lead_s)}"
            if first.at_s != change.at_s
            else _duration(lead_s)
        )
        evidence.append(f"{len(group)} nodes changed {span} {side} onset")
    source = source_cell(change)
    if source is not None:
        evidence.append(f"traffic moved into {change.cell} from {source}")
        if source in drained_at:
            evidence.append(
                f"{source} was drained {_duration(onset - drained_at[source])} before onset"
            )
    if change.stream == "demand" and score > 0:
        evidence.append("demand (stream 6) looks like a regression: it is a capacity problem")
    return Suspect(change.stream, change, change.at_s, score, evidence, lead_s, len(group))


def _rank_key(s: Suspect) -> tuple[object, ...]:
    return (-s.score, not s.before_onset, abs(s.lead_s), _canonical(s.change), s.count)


def recommend(suspects: Sequence[Suspect], symptom: Symptom) -> str:
    """The first lever for the top suspect before onset, or what to do when there is none."""
    causes = [s for s in suspects if s.before_onset]
    if not causes:
        return (
            f"no change before onset explains {symptom.kind} in {symptom.cell}: "
            "mitigate on the symptom and widen the search"
        )
    top = causes[0]
    c = top.change
    lever = LEVERS[top.stream]
    lead = _duration(symptom.onset_s - top.at_s)
    if top.stream == "demand":
        moved = source_cell(c) or (c.cell if drains(c) else None)
        origin = f" from {moved}" if moved and moved != symptom.cell else ""
        why = (
            f"demand shift{origin} into {symptom.cell} {lead} before onset: "
            "a capacity problem (stream 6), not a regression"
        )
    else:
        where = c.cell if c.cell != FLEET else "the fleet"
        why = f"{top.stream} change in {where} {lead} before onset: {_what(c)}"
    weak = "weak evidence; " if top.score < WEAK_SCORE else ""
    return f"{weak}{lever} ({why})"


# The node-layer components the reference's skew check counts per cell (driver, node image) plus
# the DCGM exporter, whose bad versions report phantom XIDs.
SKEW_COMPONENTS: Final = ("driver", "node_image", "dcgm_exporter")


def version_skew(
    node_versions: Iterable[Mapping[str, str]], components: Collection[str] | None = None
) -> dict[str, dict[str, int]]:
    """Count nodes per version of each component (of ``components``, default every one);
    a component with two versions is skewed."""
    counts: dict[str, Counter[str]] = {}
    for versions in node_versions:
        for component, version in versions.items():
            if components is None or component in components:
                counts.setdefault(component, Counter())[version] += 1
    return {
        component: dict(sorted(counts[component].items(), key=lambda kv: (-kv[1], kv[0])))
        for component in sorted(counts)
    }


def cell_skew(
    nodes: Iterable[NodeView], components: Collection[str] = SKEW_COMPONENTS
) -> dict[str, dict[str, int]]:
    """The version skew across a cell's GPU nodes: ``version_skew`` of their node layer."""
    return version_skew((dict(n.versions) for n in nodes if n.gpus > 0), components)


def skew_evidence(skew: Mapping[str, Mapping[str, int]]) -> list[str]:
    """One line per skewed component: its versions, most common first."""
    return [
        f"{component} skew: " + ", ".join(f"{version} ×{n}" for version, n in versions.items())
        for component, versions in skew.items()
        if len(versions) > 1
    ]
