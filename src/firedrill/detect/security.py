"""In-process evaluation of the security tripwires, on the twin's simulated clock.

Security tripwires always page security (``rules.security_group``): a sandbox reaching the
metadata endpoint or the kube API, a write or money tool called without approval, models/* read by
a non-serving principal, and the exfiltration pattern: a spike of egress-proxy denials to
base64-looking subdomains. A drill on the twin must raise them at the same evaluations a real
Prometheus would, so ``SecurityEvaluator`` computes what those rules ask for, and checks at
construction that the rule file says exactly that (``TRIPWIRES`` is the one table both follow).

Every tripwire has one shape: ``sum by (<labels>) (increase(<counter>{<matchers>}[<range>])) >
<threshold>``, with no ``for:``, so an alert fires at the first evaluation that returns it and
resolves at the first that does not. ``increase`` is Prometheus 2.x's (``prom_increase``: the
first and last samples in [t - range, t], both ends included, extrapolated, counter resets added
back); the sum adds in label order, as Prometheus walks its sorted series. The counters are
dense on the twin (every tenant × cell series exists from the first scrape), so there is no
"absent is zero" case to mirror; a counter the twin does not export
(``firedrill_bucket_reads_total``) simply never fires.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from firedrill.detect.promql import AlertEvent, prom_increase
from firedrill.detect.rules import EXFIL_DENIALS_PER_5M, security_group
from firedrill.detect.slo import SloSpec, duration_s
from firedrill.model.series import Labels
from firedrill.ports import Signals

MatchOp = Literal["=", "!="]
CONNECTIONS = "firedrill_sandbox_connections_total"
TOOLGW_CALLS = "firedrill_toolgw_calls_total"
BUCKET_READS = "firedrill_bucket_reads_total"
_TENANT_CELL = ("cell", "region", "tenant")


@dataclass(frozen=True)
class Tripwire:
    """One security rule as data: what it reads, how it groups, when it fires."""

    alertname: str
    metric: str
    matchers: tuple[tuple[str, MatchOp, str], ...]
    by: tuple[str, ...] = _TENANT_CELL
    threshold: float = 0.0
    range: str = "5m"

    @property
    def expr(self) -> str:
        """The PromQL the rule file carries for this tripwire."""
        sel = ", ".join(f'{k}{op}"{v}"' for k, op, v in self.matchers)
        return (
            f"sum by ({', '.join(self.by)}) (increase({self.metric}{{{sel}}}[{self.range}])) "
            f"> {self.threshold:g}"
        )


TRIPWIRES: tuple[Tripwire, ...] = (
    Tripwire("SandboxMetadataAccess", CONNECTIONS, (("dest_class", "=", "metadata"),)),
    Tripwire("SandboxKubeApiAccess", CONNECTIONS, (("dest_class", "=", "kube-api"),)),
    Tripwire(
        "MoneyToolWithoutApproval",
        TOOLGW_CALLS,
        (("side_effect", "=", "money"), ("approved", "=", "false")),
    ),
    Tripwire(
        "WeightsReadByNonServing",
        BUCKET_READS,
        (("prefix", "=", "models"), ("principal_class", "!=", "serving")),
        by=("cell", "region", "principal"),
    ),
    Tripwire(
        "WriteToolWithoutApproval",
        TOOLGW_CALLS,
        (("side_effect", "=", "write"), ("approved", "=", "false")),
    ),
    Tripwire(
        "EgressExfilPattern",
        CONNECTIONS,
        (("dest_class", "=", "base64-subdomain"), ("decision", "=", "deny")),
        threshold=float(EXFIL_DENIALS_PER_5M),
    ),
)


def _normalise(expr: str) -> str:
    return re.sub(r"\s+", " ", expr).strip()


@dataclass
class _Active:
    labels: Labels
    fired_s: float
    value: float


@dataclass
class _Rule:
    wire: Tripwire
    static: dict[str, str]
    range_s: float
    active: dict[Labels, _Active] = field(default_factory=dict)

    def alert_labels(self, sample: Labels) -> Labels:
        merged = {**dict(sample), **self.static, "alertname": self.wire.alertname}
        return tuple(sorted(merged.items()))


class SecurityEvaluator:
    """Evaluates every security tripwire at each call of ``evaluate``."""

    def __init__(self, spec: SloSpec, signals: Signals) -> None:
        self.signals = signals
        self.events: list[AlertEvent] = []
        self.evaluations = 0
        self._now_s = -math.inf
        group = security_group(spec)
        rules = {str(r["alert"]): r for r in group["rules"]}
        wires = {w.alertname: w for w in TRIPWIRES}
        if sorted(rules) != sorted(wires):
            raise ValueError(
                f"the security evaluator mirrors {sorted(wires)} but the rules define "
                f"{sorted(rules)}"
            )
        for name, rule in rules.items():
            if _normalise(str(rule["expr"])) != wires[name].expr or "for" in rule:
                raise ValueError(
                    f"{name}: the rule file says {rule['expr']!r}, the evaluator mirrors "
                    f"{wires[name].expr!r} (without for:)"
                )
        self.rules = [
            _Rule(
                wire=wires[name],
                static={str(k): str(v) for k, v in rules[name].get("labels", {}).items()},
                range_s=duration_s(wires[name].range),
            )
            for name in sorted(rules, key=[w.alertname for w in TRIPWIRES].index)
        ]

    def evaluate(self) -> list[AlertEvent]:
        """Evaluate every tripwire at the latest scrape; return the state changes."""
        t_s, _, _ = self.signals.instant(CONNECTIONS)
        if t_s <= self._now_s:
            return []
        self._now_s = t_s
        self.evaluations += 1
        out: list[AlertEvent] = []
        for rule in self.rules:
            samples = self._samples(rule, t_s)
            out += self._step(rule, samples, t_s)
        self.events.extend(out)
        return out

    def _samples(self, rule: _Rule, t_s: float) -> dict[Labels, float]:
        wire = rule.wire
        equal = {k: v for k, op, v in wire.matchers if op == "="}
        unequal = [(k, v) for k, op, v in wire.matchers if op == "!="]
        start_s = t_s - rule.range_s
        series = self.signals.query(wire.metric, equal, start_s=start_s, end_s=t_s)
        sums: dict[Labels, float] = {}
        for s in sorted(series, key=lambda x: x.labels):
            if any(s.label(k) == v for k, v in unequal):
                continue
            keep = ~np.isnan(s.values)
            values, times = s.values[keep], s.t_s[keep]
            if values.size < 2 or times[-1] <= times[0]:
                continue
            drops = values[1:] < values[:-1]
            resets = float(values[:-1][drops].sum())
            inc = prom_increase(
                values[:1],
                values[-1:] + resets,
                float(times[0]),
                float(times[-1]),
                int(values.size),
                start_s,
                t_s,
            )
            key = tuple((k, v) for k, v in s.labels if k in wire.by)
            sums[key] = sums.get(key, 0.0) + float(inc[0])
        return {k: v for k, v in sums.items() if v > wire.threshold}

    def _step(self, rule: _Rule, samples: Mapping[Labels, float], t_s: float) -> list[AlertEvent]:
        name = rule.wire.alertname
        seen = {rule.alert_labels(k): v for k, v in samples.items()}
        out: list[AlertEvent] = []
        for key in sorted(set(rule.active) - set(seen)):
            gone = rule.active.pop(key)
            out.append(AlertEvent(t_s, name, "resolved", key, gone.value))
        for key in sorted(seen):
            if key in rule.active:
                rule.active[key].value = seen[key]
                continue
            rule.active[key] = _Active(key, t_s, seen[key])
            out.append(AlertEvent(t_s, name, "firing", key, seen[key]))
        return out

    def firing(self) -> list[AlertEvent]:
        """Every tripwire firing now: when it fired, its labels, its latest value."""
        return [
            AlertEvent(a.fired_s, r.wire.alertname, "firing", a.labels, a.value)
            for r in self.rules
            for a in sorted(r.active.values(), key=lambda a: a.labels)
        ]


def tripwire(alertname: str) -> Tripwire:
    """The tripwire of that name."""
    for w in TRIPWIRES:
        if w.alertname == alertname:
            return w
    raise KeyError(alertname)


__all__: Sequence[str] = ("TRIPWIRES", "SecurityEvaluator", "Tripwire", "tripwire")
