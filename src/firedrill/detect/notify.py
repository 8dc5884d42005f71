"""What Alertmanager sends for the generated config, computed in process on a simulated clock.

A drill needs to know how many pages and tickets an incident would have produced, and when, without
starting an Alertmanager and waiting in wall-clock time. ``Notifier`` interprets the configuration
``alertmanager_config`` generates (the route tree, the inhibit rules, ``send_resolved``) the way
Alertmanager's dispatcher and notification pipeline do:

- Routing walks the tree depth first; a matching child stops the walk unless it has
  ``continue: true``; a node none of whose children match takes the alert itself. Children inherit
  ``group_by`` and the timings from their parent.
- Each route keeps its own aggregation groups, keyed by the values of the ``group_by`` labels. A new
  group starts a timer: the first flush is ``group_wait`` after its first alert, every later one
  ``group_interval`` after the previous, so a group's flushes lie on its own grid.
- At a flush, inhibited alerts are dropped (the target matches a rule, and a currently firing alert
  matches the source with the same values of the ``equal`` labels, alerts matching both sides not
  counting as sources). What is left is sent only when the notification log says so: the first
  time there is something firing; when an alert fires that the last notification did not carry;
  when everything carried as firing has resolved; when an alert resolved that the last
  notification did not carry as resolved (``send_resolved``); or when ``repeat_interval`` has
  passed since the last notification. Resolved alerts leave the group after the flush.
- The notification log is kept per route and group and outlives the group, as Alertmanager keeps it.

Time only moves forward. A flush due at time t happens before alerts that arrive at t, whichever of
``fire``/``resolve`` and ``tick`` is called first; flushes that fall due while ``fire`` or
``resolve`` moves the clock are returned by the next ``tick``.

Simplifications, each choosing one of Alertmanager's possible outcomes or its default settings:

- Notifications take no time and never fail, so the log's timestamp is the flush time, and a group
  is re-sent at the first flush at least ``repeat_interval`` after the last notification.
  Alertmanager stamps the log after the webhook returns and compares with a strict "before", so
  when ``repeat_interval`` is a multiple of ``group_interval`` it re-sends on that flush or on the
  next one, depending on how long the previous send took.
- A group left empty after a flush is removed at once. Alertmanager removes empty groups on a
  30 s sweep, so an alert arriving in that window joins the old group's timer instead of waiting
  ``group_wait``.
- Alerts fire until resolved: ``resolve_timeout`` (the sender stopped re-sending) is not modelled,
  nor the notification log's retention (120 h by default), silences or time intervals, which the
  generated config does not use.
- Alertmanager flushes a new group at once if its first alert started more than ``group_wait``
  ago; here every alert starts when it is fired, so that never applies.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from firedrill.detect.alertmanager import RoutingSpec, alertmanager_config
from firedrill.detect.slo import duration_s
from firedrill.model.series import Labels

_MATCHER_RE = re.compile(
    r'\s*(?P<name>[a-zA-Z_][a-zA-Z0-9_]*)\s*(?P<op>=~|!~|!=|=)\s*"(?P<value>(?:[^"\\]|\\.)*)"\s*'
)
_OPS = ("=", "!=", "=~", "!~")
_UNESCAPE = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass(frozen=True)
class Matcher:
    """One label matcher, as Alertmanager's ``matchers`` syntax writes it: ``name=~"regex"``.

    A missing label matches as the empty string; regular expressions are anchored at both ends.
    """

    name: str
    op: str  # = | != | =~ | !~
    value: str
    _pattern: re.Pattern[str] | None = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"not a matcher operator: {self.op!r}")
        regex = re.compile(self.value) if self.op in ("=~", "!~") else None
        object.__setattr__(self, "_pattern", regex)

    @classmethod
    def parse(cls, text: str) -> Matcher:
        m = _MATCHER_RE.fullmatch(text)
        if m is None:
            raise ValueError(f"not a matcher: {text!r}")
        value = re.sub(r"\\(.)", lambda e: _UNESCAPE.get(e.group(1), e.group(0)), m["value"])
        return cls(m["name"], m["op"], value)

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.name, "")
        if self._pattern is None:
            return (actual == self.value) == (self.op == "=")
        return (self._pattern.fullmatch(actual) is not None) == (self.op == "=~")


def _all_match(matchers: Sequence[Matcher], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)


@dataclass(frozen=True)
class Route:
    """A node of the route tree, with the settings it inherited already filled in."""

    path: tuple[int, ...]  # child indices from the root: identifies the route's groups
    receiver: str
    matchers: tuple[Matcher, ...]
    continue_: bool
    group_by: tuple[str, ...]
    group_wait_s: float
    group_interval_s: float
    repeat_interval_s: float
    routes: tuple[Route, ...]

    @classmethod
    def parse(
        cls, node: Mapping[str, Any], parent: Route | None = None, path: tuple[int, ...] = ()
    ) -> Route:
        def setting(key: str, inherited: float | None) -> float:
            if key in node:
                return duration_s(str(node[key]))
            if inherited is None:
                raise ValueError(f"the root route needs {key}")
            return inherited

        receiver = node.get("receiver", parent.receiver if parent else None)
        if receiver is None:
            raise ValueError("the root route needs a receiver")
        route = cls(
            path=path,
            receiver=str(receiver),
            matchers=tuple(Matcher.parse(str(t)) for t in node.get("matchers", ())),
            continue_=bool(node.get("continue", False)),
            group_by=tuple(node.get("group_by", parent.group_by if parent else ())),
            group_wait_s=setting("group_wait", parent.group_wait_s if parent else None),
            group_interval_s=setting("group_interval", parent.group_interval_s if parent else None),
            repeat_interval_s=setting(
                "repeat_interval", parent.repeat_interval_s if parent else None
            ),
            routes=(),
        )
        children = tuple(
            cls.parse(child, route, (*path, i)) for i, child in enumerate(node.get("routes", ()))
        )
        return replace(route, routes=children)

    def match(self, labels: Mapping[str, str]) -> list[Route]:
        """The routes that take an alert with ``labels``, in tree order."""
        if not _all_match(self.matchers, labels):
            return []
        taken: list[Route] = []
        for child in self.routes:
            matched = child.match(labels)
            taken.extend(matched)
            if matched and not child.continue_:
                break
        return taken or [self]


@dataclass(frozen=True)
class InhibitRule:
    """While a firing alert matches ``source``, mute the ``target`` alerts that share ``equal``."""

    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...]

    @classmethod
    def parse(cls, rule: Mapping[str, Any]) -> InhibitRule:
        return cls(
            source=tuple(Matcher.parse(str(t)) for t in rule.get("source_matchers", ())),
            target=tuple(Matcher.parse(str(t)) for t in rule.get("target_matchers", ())),
            equal=tuple(str(n) for n in rule.get("equal", ())),
        )


@dataclass(frozen=True)
class Notification:
    """One webhook call: a group's firing and resolved alerts, sent to one receiver."""

    receiver: str  # page | ticket | security
    group_key: tuple[str, ...]  # the group_by label values, "" where an alert lacks the label
    alertname: str
    cell: str
    at_s: float
    alerts: tuple[Labels, ...]  # firing, sorted
    resolved: tuple[Labels, ...]  # resolved since the last notification, sorted


@dataclass
class _Group:
    route: Route
    key: tuple[str, ...]
    serial: int
    first_s: float
    flushes: int = 0
    alerts: dict[Labels, bool] = field(default_factory=dict)  # labels -> resolved

    @property
    def next_flush_s(self) -> float:
        # Computed from the group's start, not accumulated, so long runs do not drift.
        return self.first_s + self.route.group_wait_s + self.flushes * self.route.group_interval_s


@dataclass(frozen=True)
class _LogEntry:
    firing: frozenset[Labels]
    resolved: frozenset[Labels]
    at_s: float


_GroupId = tuple[tuple[int, ...], tuple[str, ...]]  # route path, group key


class Notifier:
    """Alertmanager's dispatcher and notification pipeline for ``alertmanager_config(routing)``."""

    def __init__(self, routing: RoutingSpec) -> None:
        config = alertmanager_config(routing)
        self.routing = routing
        self._root = Route.parse(config["route"])
        self._rules = tuple(InhibitRule.parse(r) for r in config.get("inhibit_rules", ()))
        self._send_resolved = {
            r["name"]: all(w.get("send_resolved", True) for w in r.get("webhook_configs", ()))
            for r in config["receivers"]
        }
        self.notifications: list[Notification] = []
        self._now_s = float("-inf")
        self._firing: set[Labels] = set()
        self._sources: tuple[set[Labels], ...] = tuple(set() for _ in self._rules)
        self._groups: dict[_GroupId, _Group] = {}
        self._by_serial: dict[int, _Group] = {}
        self._timers: list[tuple[float, int]] = []  # (next flush, group serial), a heap
        self._serials = 0
        self._log: dict[_GroupId, _LogEntry] = {}
        self._pending: list[Notification] = []

    # --- alerts in ------------------------------------------------------------------------------

    def fire(self, at_s: float, labels: Labels) -> None:
        """An alert with ``labels`` is firing from ``at_s`` (again, if it had resolved)."""
        self._advance(at_s)
        self._firing.add(labels)
        as_map = dict(labels)
        for sources, rule in zip(self._sources, self._rules, strict=True):
            if _all_match(rule.source, as_map):
                sources.add(labels)
        self._insert(at_s, labels, resolved=False)

    def resolve(self, at_s: float, labels: Labels) -> None:
        """The alert with ``labels`` resolved at ``at_s``."""
        self._advance(at_s)
        self._firing.discard(labels)
        for sources in self._sources:
            sources.discard(labels)
        # As in Alertmanager, a resolved alert is routed like any other; one that never fired
        # reaches its groups but is never sent (nothing was notified as firing).
        self._insert(at_s, labels, resolved=True)

    def tick(self, now_s: float) -> list[Notification]:
        """Flush every group due by ``now_s``; the notifications sent since the last tick."""
        self._advance(now_s)
        sent, self._pending = self._pending, []
        return sent

    # --- queries --------------------------------------------------------------------------------

    @property
    def now_s(self) -> float:
        return self._now_s

    @property
    def firing(self) -> tuple[Labels, ...]:
        """Alerts firing now, sorted."""
        return tuple(sorted(self._firing))

    @property
    def page_count(self) -> int:
        return len(self.by_receiver("page"))

    def by_receiver(self, name: str) -> list[Notification]:
        return [n for n in self.notifications if n.receiver == name]

    def receivers_of(self, labels: Labels) -> tuple[str, ...]:
        """Where an alert with ``labels`` is routed, in tree order."""
        return tuple(r.receiver for r in self._root.match(dict(labels)))

    def inhibited(self, labels: Labels) -> bool:
        """Whether an alert with ``labels`` is muted by an alert firing now."""
        as_map = dict(labels)
        for sources, rule in zip(self._sources, self._rules, strict=True):
            if not _all_match(rule.target, as_map):
                continue
            # An alert matching both sides never counts as a source for another such alert.
            two_sided = _all_match(rule.source, as_map)
            for source in sources:
                source_map = dict(source)
                if any(source_map.get(n, "") != as_map.get(n, "") for n in rule.equal):
                    continue
                if two_sided and _all_match(rule.target, source_map):
                    continue
                return True
        return False

    # --- the dispatcher -------------------------------------------------------------------------

    def _insert(self, at_s: float, labels: Labels, *, resolved: bool) -> None:
        as_map = dict(labels)
        for route in self._root.match(as_map):
            key = tuple(as_map.get(name, "") for name in route.group_by)
            group = self._groups.get((route.path, key))
            if group is None:
                self._serials += 1
                group = _Group(route, key, self._serials, first_s=at_s)
                self._groups[route.path, key] = group
                self._by_serial[group.serial] = group
                heapq.heappush(self._timers, (group.next_flush_s, group.serial))
            group.alerts[labels] = resolved

    def _advance(self, until_s: float) -> None:
        if until_s < self._now_s:
            raise ValueError(f"time went backwards: {until_s} s after {self._now_s} s")
        self._now_s = until_s
        while self._timers and self._timers[0][0] <= until_s:
            at_s, serial = heapq.heappop(self._timers)
            group = self._by_serial.get(serial)
            if group is None:
                continue  # removed after an earlier flush left it empty
            self._flush(group, at_s)
            if group.alerts:
                heapq.heappush(self._timers, (group.next_flush_s, serial))
            else:
                del self._groups[group.route.path, group.key]
                del self._by_serial[serial]

    def _flush(self, group: _Group, at_s: float) -> None:
        group.flushes += 1
        visible = [(a, r) for a, r in group.alerts.items() if not self.inhibited(a)]
        if visible:
            firing = frozenset(a for a, r in visible if not r)
            resolved = frozenset(a for a, r in visible if r)
            gid = (group.route.path, group.key)
            entry = self._log.get(gid)
            if self._needs_update(group.route, entry, firing, resolved, at_s):
                self._log[gid] = _LogEntry(firing, resolved, at_s)
                self._send(group, at_s, firing, resolved)
        # Resolved alerts have been dealt with, sent or muted; firing ones stay.
        for labels in [a for a, r in group.alerts.items() if r]:
            del group.alerts[labels]

    def _needs_update(
        self,
        route: Route,
        entry: _LogEntry | None,
        firing: frozenset[Labels],
        resolved: frozenset[Labels],
        at_s: float,
    ) -> bool:
        if entry is None:
            return bool(firing)
        if not firing <= entry.firing:
            return True
        if not firing:
            # Everything the receiver knew as firing has resolved (or it never knew any).
            return bool(entry.firing)
        if self._send_resolved.get(route.receiver, True) and not resolved <= entry.resolved:
            return True
        return at_s - entry.at_s >= route.repeat_interval_s

    def _send(
        self, group: _Group, at_s: float, firing: frozenset[Labels], resolved: frozenset[Labels]
    ) -> None:
        receiver = group.route.receiver
        if not self._send_resolved.get(receiver, True):
            if not firing:
                return  # logged as notified, but there is nothing to send
            resolved = frozenset()
        named = dict(zip(group.route.group_by, group.key, strict=True))
        notification = Notification(
            receiver=receiver,
            group_key=group.key,
            alertname=named.get("alertname", ""),
            cell=named.get("cell", ""),
            at_s=at_s,
            alerts=tuple(sorted(firing)),
            resolved=tuple(sorted(resolved)),
        )
        self.notifications.append(notification)
        self._pending.append(notification)
