"""The next hypothesis: a drill's measured terms and findings, proposed back as a spec diff.

"A drill that does not feed OUT back into the next hypothesis (tighter RTO, new alert, new gate)
is theatre" (reference 001). ``propose`` reads the results of runs of a drill (single runs, or a
``--runs N`` sweep) and proposes the next version of the drill's YAML:

- **a tighter RTO budget**: the p95 of the measured RTOs plus a stated margin, rounded up to the
  half minute, never below what the physics allows (the fastest page's time to fire on a total
  outage, by the SRE workbook's arithmetic, plus the drill's decide latency and one evaluation
  step for the shift), and never looser than today's budget; the same for each RTO term's plan;
- **new clauses** for what the findings revealed (a hidden cross-region dependency gets a
  ``hidden_dependencies == 0`` clause; an unsigned digest admitted gets ``unsigned_admitted == 0``
  when the drill has no such clause);
- **the next rung** when the runs show this rung passed twice in a row, as a note.

Nothing is applied: the output is the new text and a unified diff in which every changed line
carries its reason as a YAML comment, and the same reasons as a list. Quantiles are type 7
(linear between closest ranks), as ``gameday run --runs`` reports them.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from firedrill.detect.slo import SloSpec
from firedrill.drill.ladder import RUNG_NAMES, TOP_RUNG, rung_number
from firedrill.drill.spec import DrillSpec, seconds

__all__ = ["Change", "Proposal", "detect_floor_s", "propose", "quantile"]

ROUND_S = 30.0  # budgets are proposed in half minutes
TERM_KEYS: tuple[tuple[str, str], ...] = (
    ("detect", "detect_s"),
    ("decide", "decide_s"),
    ("shift", "shift_s"),
    ("hydrate", "hydrate_s"),
    ("time_to_slo", "time_to_slo_s"),
)


@dataclass(frozen=True)
class Change:
    """One changed or added line of the spec and why."""

    where: str  # rto.budget, rto.terms.detect, hypothesis[+], note
    old: str | None
    new: str
    reason: str


@dataclass(frozen=True)
class Proposal:
    drill: str
    runs: int
    changes: tuple[Change, ...]
    old_text: str
    new_text: str

    def diff(self, path: str = "drill.yaml") -> str:
        return "".join(
            difflib.unified_diff(
                self.old_text.splitlines(keepends=True),
                self.new_text.splitlines(keepends=True),
                fromfile=f"a/{path}",
                tofile=f"b/{path}",
            )
        )


def quantile(values: Sequence[float], p: float) -> float:
    """Type-7 quantile (numpy's default): linear between the closest ranks."""
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    h = (len(xs) - 1) * p
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def detect_floor_s(drill: DrillSpec, slo: SloSpec) -> tuple[float, str]:
    """The fastest a page can fire on a total outage of the drill's model, and the arithmetic.

    A tier with factor f over windows (long L, short S) fires once both windows' error ratios
    reach f × budget; with every request failing from t = 0 after a clean history, a window W
    reaches it at t = f × budget × W. The floor is the smallest, over page tiers, of the larger
    of the two windows' times.
    """
    mine = [o for o in slo.objectives if o.model == drill.target.model] or list(slo.objectives)
    best: tuple[float, str] | None = None
    for o in mine:
        for t in slo.tiers:
            if t.severity != "page":
                continue
            long_s, short_s = seconds(t.long), seconds(t.short)
            at = max(t.factor * o.budget * long_s, t.factor * o.budget * short_s)
            text = f"{o.name}: {t.factor:g} × {o.budget:.4g} × {t.long} = {at:.1f} s"
            if best is None or at < best[0]:
                best = (at, text)
    if best is None:
        return 0.0, "no page tier: no detect floor"
    return best


def _measured(reports: Sequence[Mapping[str, Any]]) -> tuple[list[float], dict[str, list[float]]]:
    """Measured RTOs and terms of every run in ``reports`` (single runs or sweeps)."""
    rtos: list[float] = []
    terms: dict[str, list[float]] = {k: [] for _, k in TERM_KEYS}

    def take(rto: object, ts: object) -> None:
        if isinstance(rto, int | float) and not isinstance(rto, bool):
            rtos.append(float(rto))
        if isinstance(ts, Mapping):
            for _, k in TERM_KEYS:
                v = ts.get(k)
                if isinstance(v, int | float) and not isinstance(v, bool):
                    terms[k].append(float(v))

    for r in reports:
        results = r.get("results")
        if isinstance(results, list):  # a sweep: every run's outcome
            for o in results:
                if isinstance(o, Mapping) and o.get("verdict") != "refused":
                    take(o.get("measured_s"), o.get("terms"))
        else:
            rto = r.get("rto") if isinstance(r.get("rto"), Mapping) else {}
            assert isinstance(rto, Mapping)
            take(rto.get("measured_s"), rto.get("terms"))
    return rtos, terms


def _verdicts(reports: Sequence[Mapping[str, Any]]) -> list[str]:
    out: list[str] = []
    for r in reports:
        results = r.get("results")
        if isinstance(results, list):
            out += [str(o.get("verdict")) for o in results if isinstance(o, Mapping)]
        else:
            out.append(str(r.get("verdict")))
    return out


def _dur(s: float) -> str:
    """A duration as the specs write it: whole minutes as 'Nm', else seconds."""
    s = float(math.ceil(s))
    return f"{int(s // 60)}m" if s % 60 == 0 else f"{int(s)}s"


def _round_up(s: float) -> float:
    return math.ceil(s / ROUND_S) * ROUND_S


def propose(
    text: str,
    drill: DrillSpec,
    reports: Sequence[Mapping[str, Any]],
    slo: SloSpec,
    *,
    margin: float = 0.2,
) -> Proposal:
    """The next version of the drill whose YAML is ``text``, from the results ``reports``."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    lines = text.splitlines(keepends=True)
    changes: list[Change] = []
    rtos, terms = _measured(reports)
    step_s = seconds(drill.evaluation_step)
    detect_s, detect_text = detect_floor_s(drill, slo)
    decide_s = drill.decide_latency_s
    floor_s = detect_s + decide_s + step_s
    floor_text = (
        f"floor {floor_s:.0f} s = detect {detect_s:.1f} s ({detect_text}) + decide "
        f"{decide_s:.0f} s + one {step_s:.0f} s evaluation step for the shift"
    )
    if drill.rto is not None and rtos:
        budget = drill.rto.budget_s
        p95 = quantile(rtos, 0.95)
        want = max(floor_s, _round_up(p95 * (1.0 + margin)))
        arithmetic = (
            f"p95 of {len(rtos)} measured RTO(s) {p95:.1f} s × (1 + {margin:g}) = "
            f"{p95 * (1 + margin):.1f} s, rounded up to {ROUND_S:.0f} s; {floor_text}"
        )
        if want < budget:
            new = _dur(want)
            reason = f"was {drill.rto.budget}: {arithmetic} → {new}"
            if _replace_key(lines, "rto", "budget", new, reason):
                changes.append(Change("rto.budget", drill.rto.budget, new, reason))
        else:
            changes.append(
                Change(
                    "rto.budget",
                    drill.rto.budget,
                    drill.rto.budget,
                    f"kept: {arithmetic} is not below today's {budget:.0f} s",
                )
            )
        planned = drill.rto.terms.seconds()
        floors = {"detect_s": detect_s, "decide_s": decide_s}
        new_terms: dict[str, str] = {}
        reasons: list[str] = []
        for name, key in TERM_KEYS:
            values = terms.get(key) or []
            plan = planned.get(key)
            if not values or plan is None:
                continue
            p95t = quantile(values, 0.95)
            tw = max(floors.get(key, 0.0), step_s, _round_up(p95t * (1.0 + margin)))
            if tw < plan:
                new_terms[name] = _dur(tw)
                reasons.append(
                    f"{name} {_dur(plan)}→{_dur(tw)} (p95 {p95t:.0f} s × {1 + margin:g}"
                    + (f", floor {floors[key]:.0f} s" if key in floors else "")
                    + ")"
                )
        if new_terms:
            reason = "; ".join(reasons)
            merged = {
                name: new_terms.get(name, _dur(planned[k])) for name, k in TERM_KEYS if k in planned
            }
            if _replace_terms(lines, merged, reason):
                for name, value in new_terms.items():
                    key = dict(TERM_KEYS)[name]
                    changes.append(Change(f"rto.terms.{name}", _dur(planned[key]), value, reason))
    # new clauses from what the findings revealed
    have_services = {h.service for h in drill.hypothesis if h.metric == "hidden_dependencies"}
    has_unsigned = any(h.metric == "unsigned_admitted" for h in drill.hypothesis)
    added: list[tuple[str, str]] = []
    for r in reports:
        for f in r.get("findings") or []:
            if not isinstance(f, Mapping):
                continue
            key = str(f.get("key") or "")
            detail = f.get("detail") if isinstance(f.get("detail"), Mapping) else {}
            assert isinstance(detail, Mapping)
            if key.startswith("dependency:"):
                svc = str(detail.get("service") or key.split(":", 1)[1])
                if svc in have_services:
                    continue
                have_services.add(svc)
                clause = (
                    f'{{clause: "{svc} does not cross the cut", metric: hidden_dependencies, '
                    f'service: {svc}, op: "==", value: 0, finding: runbook_step}}'
                )
                crossing = ", ".join(str(x) for x in detail.get("crosses_cut") or ())
                added.append(
                    (
                        clause,
                        f"a run found {svc} in {detail.get('lives_in')} used from {crossing}: "
                        "fails until the fleet runs it on both sides of the cut",
                    )
                )
            elif key == "admission:unsigned_admitted" and not has_unsigned:
                has_unsigned = True
                added.append(
                    (
                        "{clause: zero unsigned digests admitted, metric: unsigned_admitted, "
                        'op: "==", value: 0, finding: admission_policy}',
                        "a run admitted an unsigned digest",
                    )
                )
    for clause, reason in added:
        if _append_clause(lines, clause, reason):
            changes.append(Change("hypothesis[+]", None, clause, reason))
    # the next rung
    verdicts = _verdicts(reports)
    rung = rung_number(drill.rung)
    if rung < TOP_RUNG and len(verdicts) >= 2 and all(v == "passed" for v in verdicts[-2:]):
        note = (
            f"# next rung: L{rung + 1} ({RUNG_NAMES[rung + 1]}) may run for "
            f"{drill.target.model}: the last two runs of this L{rung} drill passed\n"
        )
        lines.insert(0, note)
        changes.append(Change("note", None, note.strip(), "the ladder allows the next rung"))
    return Proposal(
        drill=drill.name,
        runs=len(verdicts),
        changes=tuple(changes),
        old_text=text,
        new_text="".join(lines),
    )


# -- line editing (comments and layout of the reviewed file are kept) ------------------------------


def _block(lines: list[str], key: str) -> tuple[int, int] | None:
    """[start, end) of the top-level ``key:`` block."""
    start = next((i for i, ln in enumerate(lines) if re.match(rf"^{key}:(\s|$)", ln)), None)
    if start is None:
        return None
    end = start + 1
    while end < len(lines):
        ln = lines[end]
        if ln.strip() and not ln.startswith((" ", "\t", "#", "-")):
            break
        end += 1
    return start, end


def _replace_key(lines: list[str], block: str, key: str, value: str, reason: str) -> bool:
    span = _block(lines, block)
    if span is None:
        return False
    for i in range(*span):
        m = re.match(rf"^(\s+{key}:\s*)([^#\n]*?)(\s*#.*)?$", lines[i].rstrip("\n"))
        if m:
            lines[i] = f"{m.group(1)}{value}  # {reason}\n"
            return True
    return False


def _replace_terms(lines: list[str], terms: Mapping[str, str], reason: str) -> bool:
    span = _block(lines, "rto")
    if span is None:
        return False
    for i in range(*span):
        m = re.match(r"^(\s+)terms:\s*\{", lines[i])
        if m:
            flow = ", ".join(f"{k}: {v}" for k, v in terms.items())
            lines[i] = f"{m.group(1)}terms: {{{flow}}}  # {reason}\n"
            return True
        m = re.match(r"^(\s+)terms:\s*$", lines[i])
        if m:
            indent = len(m.group(1))
            done = False
            for j in range(i + 1, span[1]):
                mm = re.match(r"^(\s+)(\w+):\s*([^#\n]*?)(\s*#.*)?$", lines[j].rstrip("\n"))
                if not mm or len(mm.group(1)) <= indent:
                    break
                if mm.group(2) in terms and mm.group(3).strip() != terms[mm.group(2)]:
                    lines[j] = f"{mm.group(1)}{mm.group(2)}: {terms[mm.group(2)]}  # {reason}\n"
                    done = True
            return done
    return False


def _append_clause(lines: list[str], clause: str, reason: str) -> bool:
    span = _block(lines, "hypothesis")
    if span is None:
        return False
    body = range(span[0] + 1, span[1])
    last = max(
        (i for i in body if lines[i].strip() and not lines[i].lstrip().startswith("#")),
        default=span[0],
    )
    item = next((ln for ln in lines[span[0] + 1 : span[1]] if ln.lstrip().startswith("- ")), "  - ")
    indent = item[: len(item) - len(item.lstrip())]
    lines.insert(last + 1, f"{indent}- {clause}  # {reason}\n")
    return True
