"""The in-process notifier: grouping, timers, resolution, inhibition, and a real Alertmanager.

Most tests drive ``Notifier`` on its simulated clock with the production timings (group_wait 30 s,
group_interval 5 m, repeat_interval 4 h) and assert exact notification times. The last one feeds
the same alerts to a real Alertmanager running the generated config (fixture shared with
``test_alertmanager.py``) and requires the same notifications, group by group, and the same
inhibition outcome.
"""

from __future__ import annotations

import json
import urllib.request
from collections import defaultdict
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firedrill.detect.alertmanager import RoutingSpec
from firedrill.detect.notify import Matcher, Notification, Notifier
from firedrill.model.series import Labels, labels_of
from tests.detect.test_alertmanager import (
    GROUP_INTERVAL_S,
    GROUP_WAIT_S,
    Alertmanager,
    Recorder,
    alertmanager,
    dcgm_ecc_dbe,
    fast_routing,
    kv_cache_high,
    recorder,
    settle,
    start_alertmanager,
    ttft_burn_fast,
    wait_for,
    xid,
)
from tests.detect.test_alertmanager import Notification as Received

# The real Alertmanager's fixtures, used by name below.
__all__ = ["alertmanager", "fast_routing", "recorder", "start_alertmanager"]

ROUTING = RoutingSpec()
WAIT_S = float(ROUTING.group_wait_s)  # 30
INTERVAL_S = float(ROUTING.group_interval_s)  # 300
REPEAT_S = float(ROUTING.repeat_interval_s)  # 14400

Sent = tuple[tuple[Labels, ...], tuple[Labels, ...]]  # firing, resolved
GroupOf = tuple[str, tuple[str, ...]]  # receiver, group key


def lab(alert: dict[str, str]) -> Labels:
    return labels_of(**alert)


def not_ready(node: str, cell: str = "c1") -> dict[str, str]:
    return {**xid(cell, node), "alertname": "NodeNotReady"}


def sandbox(cell: str) -> dict[str, str]:
    return {
        "alertname": "SandboxMetadataAccess",
        "severity": "security",
        "team": "security",
        "cell": cell,
    }


def nodes(notification: Notification) -> set[str]:
    return {dict(a)["node"] for a in notification.alerts}


# --- grouping -----------------------------------------------------------------------------------


def test_400_nodes_with_the_same_xid_in_one_cell_are_one_ticket_after_group_wait() -> None:
    n = Notifier(ROUTING)
    t0 = 1000.0
    for i in range(400):
        n.fire(t0 + i * 0.01, lab(xid("c1", f"n{i:03d}")))  # 400 nodes within 4 s
    assert n.tick(t0 + WAIT_S - 0.001) == []
    [ticket] = n.tick(t0 + WAIT_S)
    assert (ticket.receiver, ticket.at_s) == ("ticket", t0 + WAIT_S)
    assert (ticket.group_key, ticket.alertname, ticket.cell) == (
        ("c1", "DCGMXidFatal"),
        "DCGMXidFatal",
        "c1",
    )
    assert len(ticket.alerts) == 400
    assert list(ticket.alerts) == sorted(ticket.alerts)
    assert ticket.resolved == ()
    assert n.tick(t0 + REPEAT_S - 1) == []  # nothing changed, the repeat is not due yet
    assert n.notifications == [ticket]
    assert n.page_count == 0


def test_the_same_xid_in_two_cells_is_two_tickets() -> None:
    n = Notifier(ROUTING)
    for i in range(200):
        for cell in ("c1", "c2"):
            n.fire(i * 0.01, lab(xid(cell, f"{cell}-n{i:03d}")))
    tickets = n.tick(WAIT_S)
    assert sorted(t.cell for t in tickets) == ["c1", "c2"]
    for t in tickets:
        assert len(t.alerts) == 200
        assert {dict(a)["cell"] for a in t.alerts} == {t.cell}
    assert n.by_receiver("ticket") == tickets


@pytest.mark.parametrize(
    ("severity", "receivers"),
    [
        ("page", ("page",)),
        ("ticket", ("ticket",)),
        ("security", ("security", "page")),
        (None, ("ticket",)),
    ],
)
def test_each_severity_reaches_its_receivers(
    severity: str | None, receivers: tuple[str, ...]
) -> None:
    alert = {"alertname": "Something", "cell": "c1"}
    if severity:
        alert["severity"] = severity
    n = Notifier(ROUTING)
    assert n.receivers_of(lab(alert)) == receivers
    n.fire(0.0, lab(alert))
    assert tuple(x.receiver for x in n.tick(WAIT_S)) == receivers


def test_a_security_alert_is_one_security_notification_and_one_page() -> None:
    n = Notifier(ROUTING)
    n.fire(0.0, lab(sandbox("c1")))
    sent = n.tick(3600.0)
    assert [(x.receiver, x.at_s) for x in sent] == [("security", WAIT_S), ("page", WAIT_S)]
    assert all(x.alerts == (lab(sandbox("c1")),) for x in sent)
    assert n.page_count == 1
    assert len(n.by_receiver("security")) == 1


# --- timers -------------------------------------------------------------------------------------


def test_an_alert_joining_a_flushed_group_waits_for_the_next_group_interval_tick() -> None:
    n = Notifier(ROUTING)
    n.fire(0.0, lab(xid("c1", "n1")))
    [first] = n.tick(WAIT_S)
    assert nodes(first) == {"n1"}
    n.fire(40.0, lab(xid("c1", "n2")))  # long after group_wait: the group's timer decides
    assert n.tick(WAIT_S + INTERVAL_S - 0.001) == []
    [second] = n.tick(WAIT_S + INTERVAL_S)
    assert (second.at_s, nodes(second)) == (WAIT_S + INTERVAL_S, {"n1", "n2"})


def test_flushes_stay_on_the_groups_grid() -> None:
    n = Notifier(ROUTING)
    n.fire(7.0, lab(xid("c1", "n1")))
    n.fire(7.0 + WAIT_S + 2 * INTERVAL_S + 1, lab(xid("c1", "n2")))  # just after a tick
    n.fire(7.0 + WAIT_S + 4 * INTERVAL_S, lab(xid("c1", "n3")))  # exactly on a tick: too late
    times = [x.at_s for x in n.tick(7.0 + WAIT_S + 6 * INTERVAL_S)]
    assert times == [7.0 + WAIT_S, 7.0 + WAIT_S + 3 * INTERVAL_S, 7.0 + WAIT_S + 5 * INTERVAL_S]


def test_repeat_interval_re_sends_an_unchanged_group() -> None:
    n = Notifier(ROUTING)
    n.fire(0.0, lab(xid("c1", "n1")))
    n.tick(4 * 3600.0 - 1)
    assert [x.at_s for x in n.notifications] == [WAIT_S]
    sent = n.tick(10 * 3600.0)
    assert [x.at_s for x in sent] == [WAIT_S + REPEAT_S, WAIT_S + 2 * REPEAT_S]
    assert all(nodes(x) == {"n1"} for x in sent)


def test_a_change_restarts_the_repeat_interval() -> None:
    n = Notifier(ROUTING)
    n.fire(0.0, lab(xid("c1", "n1")))
    n.fire(3600.0, lab(xid("c1", "n2")))
    sent = n.tick(WAIT_S + 13 * INTERVAL_S + REPEAT_S)
    changed_s = WAIT_S + 12 * INTERVAL_S  # first tick after 3600 s
    assert [x.at_s for x in sent] == [WAIT_S, changed_s, changed_s + REPEAT_S]


def test_time_cannot_go_backwards() -> None:
    n = Notifier(ROUTING)
    n.tick(100.0)
    with pytest.raises(ValueError, match="backwards"):
        n.fire(99.0, lab(xid("c1", "n1")))


def test_a_flush_due_when_an_alert_arrives_goes_out_first_whatever_the_call_order() -> None:
    a, b = Notifier(ROUTING), Notifier(ROUTING)
    for n in (a, b):
        n.fire(0.0, lab(xid("c1", "n1")))
    a.fire(WAIT_S, lab(xid("c1", "n2")))
    first_a = a.tick(WAIT_S)
    first_b = b.tick(WAIT_S)
    b.fire(WAIT_S, lab(xid("c1", "n2")))
    assert first_a == first_b
    assert nodes(first_a[0]) == {"n1"}


# --- resolution ---------------------------------------------------------------------------------


def test_a_resolved_alert_is_sent_once_then_dropped() -> None:
    n = Notifier(ROUTING)
    n1, n2 = lab(xid("c1", "n1")), lab(xid("c1", "n2"))
    n.fire(0.0, n1)
    n.fire(0.0, n2)
    n.tick(WAIT_S)
    n.resolve(100.0, n1)
    [update] = n.tick(WAIT_S + INTERVAL_S)
    assert (update.alerts, update.resolved) == ((n2,), (n1,))
    assert n.tick(WAIT_S + 5 * INTERVAL_S) == []
    n.resolve(WAIT_S + 5 * INTERVAL_S + 1, n2)
    [last] = n.tick(WAIT_S + 6 * INTERVAL_S)
    assert (last.alerts, last.resolved) == ((), (n2,))
    assert n.tick(WAIT_S + 20 * INTERVAL_S) == []
    # The group went away with its last alert: firing again waits group_wait anew.
    n.fire(10_000.0, n2)
    [again] = n.tick(10_000.0 + WAIT_S)
    assert (again.at_s, again.alerts, again.resolved) == (10_000.0 + WAIT_S, (n2,), ())


def test_an_alert_that_fires_and_resolves_within_group_wait_is_never_sent() -> None:
    n = Notifier(ROUTING)
    n.fire(0.0, lab(xid("c1", "n1")))
    n.resolve(10.0, lab(xid("c1", "n1")))
    assert n.tick(REPEAT_S * 2) == []


def test_refiring_before_the_flush_keeps_the_alert_firing() -> None:
    n = Notifier(ROUTING)
    n.fire(0.0, lab(xid("c1", "n1")))
    n.tick(WAIT_S)
    n.resolve(40.0, lab(xid("c1", "n1")))
    n.fire(50.0, lab(xid("c1", "n1")))
    assert n.tick(WAIT_S + 2 * INTERVAL_S) == []


# --- inhibition ---------------------------------------------------------------------------------


def test_a_fast_ttft_burn_mutes_that_cells_pod_queue_and_kv_tickets_only() -> None:
    n = Notifier(ROUTING)
    n.fire(0.0, lab(ttft_burn_fast(cell="cA")))
    muted = [
        {**kv_cache_high(cell="cA", pod="p1"), "alertname": name}
        for name in ("PodTTFTHigh", "VllmQueueDeep", "KVCacheHigh")
    ]
    other_cell = kv_cache_high(cell="cB", pod="p2")
    for alert in (*muted, other_cell):
        n.fire(1.0, lab(alert))
    assert all(n.inhibited(lab(a)) for a in muted)
    assert not n.inhibited(lab(other_cell))
    sent = n.tick(WAIT_S + 1)
    assert [(x.receiver, x.group_key) for x in sent] == [
        ("page", ("cA", "CellTTFTBurnFast")),
        ("ticket", ("cB", "KVCacheHigh")),
    ]
    assert not n.inhibited(lab(ttft_burn_fast(cell="cA")))


def test_a_muted_alert_is_sent_once_its_source_resolves() -> None:
    n = Notifier(ROUTING)
    n.fire(0.0, lab(ttft_burn_fast(cell="cA")))
    n.fire(0.0, lab(kv_cache_high(cell="cA", pod="p1")))
    assert [x.receiver for x in n.tick(WAIT_S)] == ["page"]
    n.resolve(100.0, lab(ttft_burn_fast(cell="cA")))
    sent = n.tick(WAIT_S + INTERVAL_S)
    assert [(x.receiver, x.alerts, x.resolved) for x in sent] == [
        ("page", (), (lab(ttft_burn_fast(cell="cA")),)),
        ("ticket", (lab(kv_cache_high(cell="cA", pod="p1")),), ()),
    ]


def test_a_not_ready_node_mutes_its_own_dcgm_and_thermal_tickets_only() -> None:
    n = Notifier(ROUTING)
    n.fire(0.0, lab(not_ready("n1")))
    thermal = {**xid("c1", "n1"), "alertname": "GPUThermalThrottle"}
    for alert in (dcgm_ecc_dbe("n1"), dcgm_ecc_dbe("n2"), xid("c1", "n1"), thermal):
        n.fire(1.0, lab(alert))
    sent = {x.alertname: x for x in n.tick(WAIT_S + 1)}
    # DCGMEccDbe shares a group with its muted twin: the mute is per alert, not per group.
    assert sorted(sent) == ["DCGMEccDbe", "NodeNotReady"]
    assert nodes(sent["DCGMEccDbe"]) == {"n2"}
    assert n.inhibited(lab(thermal))


def test_a_source_without_cell_does_not_mute_targets_without_cell() -> None:
    n = Notifier(ROUTING)
    n.fire(0.0, lab(ttft_burn_fast()))
    n.fire(0.0, lab(kv_cache_high(pod="p1")))
    n.fire(0.0, lab(kv_cache_high(pod="p2")))
    assert not n.inhibited(lab(kv_cache_high(pod="p1")))
    [_, kv] = n.tick(WAIT_S)
    assert (kv.receiver, kv.group_key, len(kv.alerts)) == ("ticket", ("", "KVCacheHigh"), 2)


def test_a_source_in_another_cell_or_on_another_node_mutes_nothing() -> None:
    n = Notifier(ROUTING)
    n.fire(0.0, lab(ttft_burn_fast(cell="cA")))
    n.fire(0.0, lab(not_ready("n1")))
    assert not n.inhibited(lab(kv_cache_high(cell="cB", pod="p1")))
    assert not n.inhibited(lab(kv_cache_high(pod="p1")))
    assert not n.inhibited(lab(dcgm_ecc_dbe("n2")))
    assert not n.inhibited(lab({**dcgm_ecc_dbe("n1"), "node": ""}))


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ('cell=~".+"', {"cell": "c1"}, True),
        ('cell=~".+"', {}, False),
        ('alertname=~"DCGM.*"', {"alertname": "XDCGM"}, False),  # anchored at both ends
        ('alertname!="A"', {}, True),
        ('alertname!~"A|B"', {"alertname": "B"}, False),
        ('team="a \\"b\\""', {"team": 'a "b"'}, True),
    ],
)
def test_matchers_follow_alertmanager(text: str, labels: dict[str, str], expected: bool) -> None:
    assert Matcher.parse(text).matches(labels) is expected


def test_a_malformed_matcher_is_rejected() -> None:
    with pytest.raises(ValueError, match="not a matcher"):
        Matcher.parse("cell ~ c1")


# --- invariants ---------------------------------------------------------------------------------

ALPHABET = [
    ttft_burn_fast(cell="c1"),
    ttft_burn_fast(),
    kv_cache_high(cell="c1", pod="p1"),
    kv_cache_high(pod="p1"),
    kv_cache_high(cell="c2", pod="p2"),
    not_ready("n1"),
    dcgm_ecc_dbe("n1"),
    dcgm_ecc_dbe("n2"),
    xid("c2", "n3"),
    sandbox("c1"),
]
STEPS = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=2 * INTERVAL_S, allow_nan=False),
        st.booleans(),
        st.integers(min_value=0, max_value=len(ALPHABET) - 1),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(STEPS)
def test_every_firing_unmuted_alert_ends_up_in_its_groups_latest_notification(
    steps: list[tuple[float, bool, int]],
) -> None:
    n = Notifier(ROUTING)
    now_s = 0.0
    for dt_s, fire, index in steps:
        now_s += dt_s
        (n.fire if fire else n.resolve)(now_s, lab(ALPHABET[index]))
    n.tick(now_s + WAIT_S + INTERVAL_S)
    latest: dict[GroupOf, Notification] = {}
    for x in n.notifications:
        assert x.alerts or x.resolved
        assert not set(x.alerts) & set(x.resolved)
        for alert in (*x.alerts, *x.resolved):
            assert x.receiver in n.receivers_of(alert)
            assert (dict(alert).get("cell", ""), dict(alert)["alertname"]) == x.group_key
        latest[x.receiver, x.group_key] = x
    for alert in n.firing:
        if n.inhibited(alert):
            continue
        group_key = (dict(alert).get("cell", ""), dict(alert)["alertname"])
        for receiver in n.receivers_of(alert):
            assert alert in latest[receiver, group_key].alerts


# --- against the real Alertmanager --------------------------------------------------------------


def post_resolved(am: Alertmanager, *alerts: dict[str, str]) -> None:
    """Resolve alerts, each given by its labels, as a sender does: ``endsAt`` now."""
    ends_at = datetime.now(UTC).isoformat()
    body = json.dumps([{"labels": a, "endsAt": ends_at} for a in alerts]).encode()
    request = urllib.request.Request(
        f"{am.url}/api/v2/alerts",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def by_group_sim(notifications: list[Notification]) -> dict[GroupOf, list[Sent]]:
    groups: dict[GroupOf, list[Sent]] = defaultdict(list)
    for x in notifications:
        groups[x.receiver, x.group_key].append((x.alerts, x.resolved))
    return dict(groups)


def by_group_real(received: list[Received], group_by: list[str]) -> dict[GroupOf, list[Sent]]:
    groups: dict[GroupOf, list[Sent]] = defaultdict(list)
    for x in received:
        key = tuple(x.payload["groupLabels"].get(name, "") for name in group_by)
        firing = sorted(lab(a["labels"]) for a in x.alerts if a["status"] == "firing")
        resolved = sorted(lab(a["labels"]) for a in x.alerts if a["status"] == "resolved")
        groups[x.receiver, key].append((tuple(firing), tuple(resolved)))
    return dict(groups)


def test_the_notifier_sends_what_alertmanager_sends(
    alertmanager: Alertmanager, recorder: Recorder, fast_routing: RoutingSpec
) -> None:
    notifier = Notifier(fast_routing)
    phases: list[tuple[bool, list[dict[str, str]]]] = [
        # sources of both inhibitions, one without cell, and a security alert
        (True, [ttft_burn_fast(cell="cA"), ttft_burn_fast(), not_ready("n1"), sandbox("c1")]),
        # targets: muted, in another cell, without cell, sharing a group with a muted one
        (
            True,
            [
                kv_cache_high(cell="cA", pod="p1"),
                kv_cache_high(cell="cB", pod="p2"),
                kv_cache_high(pod="p3"),
                dcgm_ecc_dbe("n1"),
                dcgm_ecc_dbe("n2"),
                *(xid("c1", f"n{i}") for i in range(1, 6)),
            ],
        ),
        # a source resolves (its targets are sent), a target resolves (sent once as resolved)
        (False, [not_ready("n1"), xid("c1", "n2")]),
    ]
    phase_s = float(GROUP_WAIT_S + GROUP_INTERVAL_S)  # every group has flushed by then
    for i, (fire, alerts) in enumerate(phases):
        for alert in alerts:
            (notifier.fire if fire else notifier.resolve)(i * phase_s, lab(alert))
        notifier.tick((i + 1) * phase_s - 0.5)
        if fire:
            alertmanager.post(*alerts)
        else:
            post_resolved(alertmanager, *alerts)
        expected = len(notifier.notifications)

        def caught_up(expected: int = expected) -> bool:
            return len(recorder.received()) >= expected

        # Before the next phase, as the simulation has it: the sources are known, groups flushed.
        wait_for(f"{expected} notifications", caught_up)
    notifier.tick(len(phases) * phase_s + 3 * GROUP_INTERVAL_S)
    settle()

    sim = by_group_sim(notifier.notifications)
    assert len(notifier.notifications) == 12
    assert by_group_real(recorder.received(), fast_routing.group_by) == sim
    muted_real = {
        lab(a["labels"]): a["status"]["state"] == "suppressed" for a in alertmanager.alerts()
    }
    assert muted_real == {a: notifier.inhibited(a) for a in notifier.firing}
    assert [a for a, muted in muted_real.items() if muted] == [
        lab(kv_cache_high(cell="cA", pod="p1"))
    ]
