"""Incident communication: update deadlines, status-page entries, redaction and handoffs.

Comms fail in predictable ways, so the rules are checked in code rather than remembered:

* **First update within 15 minutes** of a SEV1/SEV2 declaration, even if all it says is
  "investigating elevated latency for model X in region Y"; then one every 30 minutes. The
  deadline is known up front, and an update posted after it is recorded as missed, with how late.
* **Status pages are per product × region.** Cell IDs and node names are internal topology: they
  mean nothing to a customer and tell an attacker where to look. An entry naming one is refused.
* **The incident channel is a data store.** Customer prompts, tokens, keys, secrets and PII never
  go in it; ``redact`` replaces them with a pointer to the audit-store query that holds them.
* **Handoffs are explicit**: who hands to whom and when, what is still open, when the next
  update is due.

Times are simulated seconds since the incident clock's epoch; wall-clock time appears only when
a caller formats it against an epoch it passes in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Literal

from firedrill.errors import FiredrillError
from firedrill.respond.severity import Sev

FIRST_UPDATE_S: Final = 15 * 60.0  # seconds from a SEV1/SEV2 declaration to the first update
CADENCE_S: Final[Mapping[Sev, float]] = {
    Sev.SEV1: 30 * 60.0,
    Sev.SEV2: 30 * 60.0,
}  # seconds between updates; a level missing here has no cadence
DEADLINE_SEVS: Final = frozenset({Sev.SEV1, Sev.SEV2})  # levels with a first-update deadline

# Topology that must never reach a status page, even when it is not in the known lists.
NODE_NAME: Final = re.compile(r"(?<![\w-])gpu-[a-z0-9-]*?-\d{3,}(?![\w-])", re.IGNORECASE)
CELL_ID: Final = re.compile(r"(?<![\w-])[a-z]{2,5}\d{1,2}-[a-z](?![\w-])", re.IGNORECASE)

RedactionKind = Literal["prompt", "bearer_token", "api_key", "aws_key", "secret", "email", "phone"]


class CommsError(FiredrillError):
    """A message breaks a comms rule; ``token`` is the forbidden text, when there is one."""

    def __init__(self, message: str, *, token: str | None = None) -> None:
        self.token = token
        super().__init__(message)


def _check_time(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")


@dataclass(frozen=True)
class Update:
    """One posted update, against the deadline it answered."""

    at_s: float
    text: str
    first: bool  # the first update of the incident
    due_s: float | None  # None when the incident's level has no deadline
    missed_deadline: bool
    late_s: float  # seconds after the deadline; 0 when on time


class CommsPlan:
    """An incident's update schedule: the first-update deadline, then a fixed cadence."""

    def __init__(
        self,
        incident_id: str,
        sev: Sev,
        declared_at_s: float,
        *,
        first_update_s: float = FIRST_UPDATE_S,
        cadence_s: Mapping[Sev, float] = CADENCE_S,
    ) -> None:
        _check_time("declared_at_s", declared_at_s)
        if not first_update_s > 0:
            raise ValueError(f"first_update_s must be > 0, got {first_update_s}")
        if any(not v > 0 for v in cadence_s.values()):
            raise ValueError(f"every cadence must be > 0 seconds, got {dict(cadence_s)}")
        self.incident_id = incident_id
        self._sev = sev
        self._declared_at_s = declared_at_s
        self._first_update_s = first_update_s
        self._cadence_s = dict(cadence_s)
        self._updates: list[Update] = []
        # A SEV3 that escalates to SEV2 starts its first-update clock at the escalation.
        self._first_due_s: float | None = (
            declared_at_s + first_update_s if sev in DEADLINE_SEVS else None
        )

    @property
    def sev(self) -> Sev:
        """The level the schedule follows."""
        return self._sev

    @property
    def updates(self) -> list[Update]:
        """Every update posted, oldest first."""
        return list(self._updates)

    @property
    def first_update_due_s(self) -> float | None:
        """When the first update is due; None when the level has no deadline."""
        return self._first_due_s

    @property
    def next_update_due_s(self) -> float | None:
        """When the next update is due; None when nothing is due."""
        if not self._updates:
            return self._first_due_s
        cadence = self._cadence_s.get(self._sev)
        return None if cadence is None else self._updates[-1].at_s + cadence

    def escalate(self, sev: Sev, at_s: float) -> None:
        """Follow a more severe level; a first deadline starts now if there was none."""
        _check_time("at_s", at_s)
        if sev >= self._sev:
            raise ValueError(f"escalate needs a more severe level than {self._sev}, got {sev}")
        self._sev = sev
        if not self._updates and self._first_due_s is None and sev in DEADLINE_SEVS:
            self._first_due_s = at_s + self._first_update_s

    def overdue_s(self, now_s: float) -> float:
        """Seconds the next update is overdue at ``now_s``; 0 when it is not."""
        due = self.next_update_due_s
        return 0.0 if due is None else max(0.0, now_s - due)

    def post(self, text: str, at_s: float) -> Update:
        """Record an update; one posted after its deadline is marked missed, with how late."""
        _check_time("at_s", at_s)
        if not text.strip():
            raise CommsError("an update needs text, even if it only says 'investigating'")
        if self._updates and at_s < self._updates[-1].at_s:
            raise ValueError(f"at_s {at_s} is before the last update ({self._updates[-1].at_s})")
        if at_s < self._declared_at_s:
            raise ValueError(f"at_s {at_s} is before the declaration ({self._declared_at_s})")
        due = self.next_update_due_s
        late_s = 0.0 if due is None else max(0.0, at_s - due)
        update = Update(at_s, text, not self._updates, due, late_s > 0, late_s)
        self._updates.append(update)
        return update

    def due_line(self, now_s: float, epoch: datetime) -> str:
        """The deadline as people read it: "next update due 04:15 UTC (in 7 min)"."""
        due = self.next_update_due_s
        if due is None:
            return f"no update deadline at {self._sev}"
        what = "first update" if not self._updates else "next update"
        delta = due - now_s
        when = f"in {delta / 60:.0f} min" if delta >= 0 else f"{-delta / 60:.0f} min overdue"
        return f"{what} due {clock(due, epoch)} UTC ({when})"


@dataclass(frozen=True)
class StatusPageEntry:
    """A customer-facing entry: product × region granularity, nothing finer."""

    product: str
    region: str
    text: str


def _mentions(text: str, token: str) -> bool:
    pattern = rf"(?<![\w-]){re.escape(token)}(?![\w-])"
    return re.search(pattern, text, re.IGNORECASE) is not None


def status_page_entry(
    product: str,
    region: str,
    text: str,
    known_cells: Iterable[str],
    known_nodes: Iterable[str],
) -> StatusPageEntry:
    """A status-page entry, refused if it names a cell or a node."""
    if not product.strip() or not region.strip():
        raise CommsError("a status-page entry needs a product and a region")
    if not text.strip():
        raise CommsError("a status-page entry needs text")
    fields = f"{product}\n{text}"  # the region field names the region, which may share a cell id
    for kind, tokens in (("node", known_nodes), ("cell", known_cells)):
        for token in sorted({t for t in tokens if t.strip()}, key=lambda t: (-len(t), t)):
            if token.lower() != region.lower() and _mentions(fields, token):
                raise CommsError(
                    f"status page names {kind} '{token}': entries are per product × region",
                    token=token,
                )
    for kind, pattern in (("node", NODE_NAME), ("cell", CELL_ID)):
        found = pattern.search(fields)
        if found:
            raise CommsError(
                f"status page names {kind} '{found.group(0)}': entries are per product × region",
                token=found.group(0),
            )
    return StatusPageEntry(product.strip(), region.strip(), text.strip())


# Each pattern's group "v" is the part replaced; without one the whole match is.
_REDACTIONS: Final[tuple[tuple[RedactionKind, re.Pattern[str]], ...]] = (
    (
        "prompt",
        re.compile(r"\bprompt\s*[:=]\s*(?P<v>\"[^\"]*\"|'[^']*'|“[^”]*”|[^\n]+)", re.IGNORECASE),
    ),
    ("bearer_token", re.compile(r"\bBearer\s+(?P<v>[A-Za-z0-9._~+/=-]+)", re.IGNORECASE)),
    ("api_key", re.compile(r"(?<![\w-])sk-[A-Za-z0-9_-]{8,}")),
    ("aws_key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    (
        "secret",
        re.compile(
            r"\b(?:password|passwd|pwd|secret|client_secret|api[_-]?key|access[_-]?key)"
            r"\s*[:=]\s*(?P<v>\"[^\"]*\"|'[^']*'|[^\s,;]+)",
            re.IGNORECASE,
        ),
    ),
    ("email", re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")),
    (
        "phone",
        re.compile(
            r"(?<![\w+])(?:\+\d{10,15}|(?:\+\d{1,3}[\s.-]?)?\(?\d{3}\)?[\s.-]\d{3}[\s.-]\d{4})"
            r"(?![\w-])"
        ),
    ),
)


@dataclass(frozen=True)
class Redacted:
    """Text safe for the incident channel, and the kinds of data taken out of it."""

    text: str
    kinds: list[RedactionKind]  # each kind once, in the order of the patterns


def redact(text: str, audit_query_url: str) -> Redacted:
    """Replace prompts, tokens, keys, secrets, emails and phone numbers with an audit link."""
    if not audit_query_url.strip():
        raise CommsError("redaction needs the audit-store query that holds the original")
    spans: list[tuple[int, int, RedactionKind]] = []
    # Earlier kinds win an overlap: a prompt that quotes an email is redacted as a prompt.
    for kind, pattern in _REDACTIONS:
        for found in pattern.finditer(text):
            group = "v" if "v" in pattern.groupindex else 0
            start, end = found.span(group)
            if all(end <= s or start >= e for s, e, _ in spans):
                spans.append((start, end, kind))
    spans.sort()
    replacement = f"[redacted: see {audit_query_url.strip()}]"
    parts: list[str] = []
    pos = 0
    for start, end, _ in spans:
        parts.append(text[pos:start])
        parts.append(replacement)
        pos = end
    parts.append(text[pos:])
    found_kinds = {kind for _, _, kind in spans}
    kinds = [kind for kind, _ in _REDACTIONS if kind in found_kinds]
    return Redacted("".join(parts), kinds)


def clock(at_s: float, epoch: datetime) -> str:
    """Simulated seconds as an "HH:MM" UTC time, counted from ``epoch``."""
    if epoch.tzinfo is None:
        raise ValueError("epoch must be timezone-aware (UTC)")
    _check_time("at_s", at_s)
    return (epoch + timedelta(seconds=at_s)).astimezone(UTC).strftime("%H:%M")


def handoff_text(
    from_role_person: str,
    to_person: str,
    at: float,
    open_threads: Sequence[str],
    next_update: float,
    *,
    epoch: datetime,
) -> str:
    """The explicit handoff line: "IC handing to @name at 04:00 UTC; open threads: A, B; ..."."""
    who = from_role_person.strip()
    to = to_person.strip().lstrip("@")
    if not who or not to:
        raise CommsError("a handoff names who hands over and to whom")
    if next_update < at:
        raise ValueError(f"next_update {next_update} is before the handoff at {at}")
    threads = ", ".join(t.strip() for t in open_threads if t.strip()) or "none"
    return (
        f"{who} handing to @{to} at {clock(at, epoch)} UTC; open threads: {threads}; "
        f"next update {clock(next_update, epoch)}"
    )
