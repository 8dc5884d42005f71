"""Agent sandboxes on the twin: sessions, the egress proxy, the tool gateway, and the levers.

The demo fleet (examples/fleet.yaml) has two tenants: acme (share 0.6, 40 sandboxes) and globex
(share 0.4, 20). Runs are minutes of simulated time.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from firedrill.errors import OperationError
from firedrill.model import operations as ops
from firedrill.model.sandbox import dest_class, looks_base64
from firedrill.model.spec import FleetSpec
from firedrill.respond import guards
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin
from firedrill.twin.sandbox import ALLOWLIST, ATTACKER_DOMAINS, UNLISTED

FLEET_YAML = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"
SEED = 5
HASH = "sha256:" + "be" * 32
EVER = math.inf


@pytest.fixture(scope="module")
def spec() -> FleetSpec:
    return load_fleet(FLEET_YAML)


def twin_of(spec: FleetSpec, seed: int = SEED) -> Twin:
    return Twin(spec, seed=seed)


def decisions(twin: Twin, tenant: str, since_s: float = 0.0) -> Counter[tuple[str, str]]:
    recs = twin.sandbox.egress_records(start_s=since_s, end_s=EVER, tenant=tenant)
    return Counter((r.dest_class, r.decision) for r in recs)


def calls(twin: Twin, tenant: str, since_s: float = 0.0) -> Counter[tuple[str, str, str]]:
    recs = twin.sandbox.tool_records(start_s=since_s, end_s=EVER, tenant=tenant)
    return Counter((r.side_effect, r.approved, r.outcome) for r in recs)


def series_sum(twin: Twin, name: str, **match: str) -> float:
    _, _, values = twin.instant(name, match)
    return float(np.nansum(values))


# -- the classifier ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "U_XGRSVEnjThyLlhJdEQDV9xKO-ElT1B.telemetry-edge.io",
        "aGVsbG8gd29ybGQgc2VjcmV0IGRhdGE1.cdn-sync.net",
        "ZXhmaWx0cmF0aW9uLXRlc3QtMTIzNDU2Nzg5.example.org",
    ],
)
def test_base64_labels_are_recognised(host: str) -> None:
    assert looks_base64(host)
    assert dest_class(host, frozenset(ALLOWLIST)) == "base64-subdomain"


@pytest.mark.parametrize(
    "host",
    [
        "pypi.org",
        "raw.githubusercontent.com",
        "objects-cdn-eu-west-1-prod.example.com",  # long, but lower case words
        "aaaaaaaaaaaaaaaaAAAA1111.example.com",  # mixed case and digits, no entropy
        "QWxhZGRpbjpvcGVuIHNlc2FtZQ",  # no domain under it
        *UNLISTED,
        *ALLOWLIST,
    ],
)
def test_ordinary_hosts_are_not_base64(host: str) -> None:
    assert not looks_base64(host)


def test_metadata_and_kube_api_are_their_own_class() -> None:
    allow = frozenset(ALLOWLIST)
    assert dest_class("169.254.169.254", allow) == "metadata"
    assert dest_class("kubernetes.default.svc", allow) == "kube-api"
    assert dest_class("pypi.mirror.corp", allow) == "allowlisted"
    assert dest_class("pastebin.com", allow) == "unlisted"


def test_flag_names_agree_with_the_guards() -> None:
    from firedrill.model import sandbox as model

    assert model.DENY_ALL_FLAG == guards.DENY_ALL_FLAG
    assert model.SIDE_EFFECT_SUFFIX == guards.SIDE_EFFECT_SUFFIX
    assert model.SIDE_EFFECT_LEVELS == guards.SIDE_EFFECT_LEVELS


# -- the baseline -----------------------------------------------------------------------------


def test_sessions_start_warm_and_follow_the_pools(spec: FleetSpec) -> None:
    twin = twin_of(spec)
    sb = twin.sandbox
    acme, globex = sb.tenants
    # about half of the 60 sandboxes in use at the start, acme with 60% of the demand
    assert 15 <= acme.active + globex.active <= 45
    assert acme.active > 0
    assert globex.active > 0
    twin.run_for(900)
    for t in sb.tenants:
        assert 0 < t.active <= t.pool
        assert t.started.sum() > 0
    active = series_sum(twin, "firedrill_sandbox_sessions_active", tenant="acme")
    assert active == acme.active


def test_session_counts_stay_in_step_with_the_sessions(spec: FleetSpec) -> None:
    twin = twin_of(spec)
    twin.apply(ops.InjectExfiltration("acme", "usw2-b", 1.0))  # holds a session open
    twin.run_for(300)
    pod = sorted(twin.sandbox.active_sessions("globex").values())[0]
    twin.apply(ops.QuarantinePod(pod))  # its session ends later, the pod is retained
    twin.apply(ops.SetWarmPool("acme", 3))  # claims get rejected
    twin.run_for(900)
    for t in twin.sandbox.tenants:
        per_cell = [len(serials) for serials in t.by_cell]
        assert t.per_cell.tolist() == per_cell
        assert t.active == sum(per_cell) == len(t.sessions)
        for ci, cell in enumerate(twin.cell_names):
            scraped = series_sum(
                twin, "firedrill_sandbox_sessions_active", tenant=t.name, cell=cell
            )
            assert scraped == per_cell[ci]
    assert twin.sandbox.tenants[0].rejected.sum() > 0


def test_egress_is_mostly_allowed_and_never_base64_at_baseline(spec: FleetSpec) -> None:
    twin = twin_of(spec)
    twin.run_for(900)
    for tenant in ("acme", "globex"):
        d = decisions(twin, tenant)
        allowed = d[("allowlisted", "allow")]
        denied = d[("unlisted", "deny")]
        assert allowed > 10 * denied > 0
        assert set(d) == {("allowlisted", "allow"), ("unlisted", "deny")}
        c = calls(twin, tenant)
        assert c[("read", "not_required", "ok")] > c[("write", "true", "ok")] > 0
        assert not any(approved == "false" for _, approved, _ in c)  # calls carry approval
    # the counters say what the records say
    recorded = decisions(twin, "acme")[("allowlisted", "allow")]
    counted = series_sum(
        twin,
        "firedrill_sandbox_connections_total",
        tenant="acme",
        dest_class="allowlisted",
        decision="allow",
    )
    assert counted <= recorded  # the counter is scraped up to the last scrape
    assert counted > 0.9 * recorded


def test_same_seed_same_records_other_seed_others(spec: FleetSpec) -> None:
    a, b, c = twin_of(spec), twin_of(spec), twin_of(spec, seed=SEED + 1)
    for t in (a, b, c):
        t.run_for(300)
    assert a.sandbox.tenant_snapshot("acme") == b.sandbox.tenant_snapshot("acme")
    assert a.sandbox.tenant_snapshot("acme") != c.sandbox.tenant_snapshot("acme")


# -- levers -----------------------------------------------------------------------------------


def test_warm_pool_to_zero_starts_no_session_and_keeps_the_running_ones(spec: FleetSpec) -> None:
    twin = twin_of(spec)
    twin.run_for(60)
    acme = twin.sandbox.tenants[0]
    running = set(twin.sandbox.active_sessions("acme"))
    started = acme.started.sum()
    twin.apply(ops.SetWarmPool("acme", 0))
    twin.run_for(30)
    # running sessions are not killed: they end on their own (5 minutes on average)
    assert len(running & set(twin.sandbox.active_sessions("acme"))) > len(running) // 2
    twin.run_for(1200)
    assert acme.started.sum() == started
    assert acme.rejected.sum() > 0
    assert set(twin.sandbox.active_sessions("acme")) <= running  # only old ones, ending
    assert series_sum(twin, "firedrill_sandbox_warm_pool_replicas", tenant="acme") == 0.0


def test_kill_switch_read_blocks_writes_and_money_but_not_reads(spec: FleetSpec) -> None:
    twin = twin_of(spec)
    twin.run_for(60)
    twin.apply(ops.SetFlag("acme.max_side_effect", "read"))
    since = twin.now_s()
    twin.run_for(900)
    c = calls(twin, "acme", since)
    assert c[("read", "not_required", "ok")] > 0
    assert c[("write", "true", "blocked")] > 0
    assert c[("write", "true", "ok")] == c[("money", "true", "ok")] == 0
    g = calls(twin, "globex", since)  # another tenant's tools are not switched off
    assert g[("write", "true", "ok")] > 0
    twin.apply(ops.SetFlag("acme.max_side_effect", "none"))
    since = twin.now_s()
    twin.run_for(300)
    assert calls(twin, "acme", since)[("read", "not_required", "ok")] == 0


def test_proxy_deny_all_denies_every_tenant_even_the_allowlist(spec: FleetSpec) -> None:
    twin = twin_of(spec)
    twin.run_for(60)
    twin.apply(ops.SetFlag("proxy.deny_all", "true"))
    since = twin.now_s() + 1e-6
    twin.run_for(300)
    for tenant in ("acme", "globex"):
        d = decisions(twin, tenant, since)
        assert d[("allowlisted", "deny")] > 0
        assert d[("allowlisted", "allow")] == 0


def test_exfiltration_is_a_deny_spike_to_base64_subdomains(spec: FleetSpec) -> None:
    twin = twin_of(spec)
    twin.run_for(60)
    assert twin.apply(ops.InjectExfiltration("acme", "use1-a", 2.0)) == ops.ClearExfiltration(
        "acme", "use1-a"
    )
    twin.run_for(300)
    recs = [
        r
        for r in twin.sandbox.egress_records(start_s=60.0, end_s=EVER, tenant="acme")
        if r.dest_class == "base64-subdomain"
    ]
    assert 450 <= len(recs) <= 750  # ~2 a second for 5 minutes
    assert {r.decision for r in recs} == {"deny"}
    assert {r.cell for r in recs} == {"use1-a"}
    assert len({r.session for r in recs}) == 1
    assert len({r.dest_host for r in recs}) == len(recs)  # the data differs every time
    assert {r.dest_host.split(".", 1)[1] for r in recs} <= set(ATTACKER_DOMAINS)
    counted = series_sum(
        twin,
        "firedrill_sandbox_connections_total",
        tenant="acme",
        cell="use1-a",
        dest_class="base64-subdomain",
        decision="deny",
    )
    assert counted > 400
    assert not any(
        r.dest_class == "base64-subdomain"
        for r in twin.sandbox.egress_records(start_s=0.0, end_s=EVER, tenant="globex")
    )
    # the compromised session is held open while the injection runs
    session = recs[0].session
    twin.run_for(1200)  # four mean session lengths
    assert session in twin.sandbox.active_sessions("acme")
    twin.apply(ops.ClearExfiltration("acme", "use1-a"))
    twin.run_for(30)
    assert session not in twin.sandbox.active_sessions("acme")


def test_a_quarantined_pod_is_cut_off_and_retained_after_its_session(spec: FleetSpec) -> None:
    twin = twin_of(spec)
    twin.apply(ops.InjectExfiltration("acme", "use1-a", 2.0))
    twin.run_for(60)
    (pod,) = {
        r.pod
        for r in twin.sandbox.egress_records(start_s=0.0, end_s=EVER, tenant="acme")
        if r.dest_class == "base64-subdomain"
    }
    assert twin.apply(ops.QuarantinePod(pod)) == ops.UnquarantinePod(pod)
    since = twin.now_s() + 1e-6
    twin.run_for(300)
    recs = twin.sandbox.egress_records(start_s=since, end_s=EVER, tenant="acme")
    mine = [r for r in recs if r.pod == pod]
    assert mine
    assert {r.decision for r in mine} == {"dropped"}  # never reaches the proxy
    assert all(r.decision != "dropped" for r in recs if r.pod != pod)
    assert series_sum(twin, "hubble_drop_total", namespace="sbx-tenant-acme") >= len(mine)
    assert series_sum(twin, "firedrill_sandbox_pods_quarantined", tenant="acme") == 1.0
    # the session ends; the pod stays (shutdownPolicy: Retain)
    twin.apply(ops.ClearExfiltration("acme", "use1-a"))
    twin.run_for(60)
    session = pod.split("/", 1)[1].removesuffix("-0")
    assert session not in twin.sandbox.active_sessions("acme")
    assert twin.sandbox.has_pod(pod)
    assert pod in twin.quarantined_pods
    assert twin.inverse_of(ops.QuarantinePod(pod)) == ops.Noop("already")


def test_an_ended_unquarantined_pod_is_gone(spec: FleetSpec) -> None:
    twin = twin_of(spec)
    first = dict(twin.sandbox.active_sessions("globex"))
    twin.run_for(1200)  # sessions last 5 minutes on average
    ended = [pod for sid, pod in first.items() if sid not in twin.sandbox.active_sessions("globex")]
    assert ended
    assert not any(twin.sandbox.has_pod(p) for p in ended)


def test_prompt_injection_calls_without_approval_and_a_block_stops_it(spec: FleetSpec) -> None:
    twin = twin_of(spec)
    twin.apply(ops.InjectPromptInjection("acme", "use1-b", HASH, "write", 0.5, 0.25))
    twin.run_for(600)
    injected = [
        r
        for r in twin.sandbox.tool_records(start_s=0.0, end_s=EVER, tenant="acme")
        if r.content_hash == HASH
    ]
    assert len(injected) > 150
    assert {r.side_effect for r in injected} == {"write"}
    outcome = Counter((r.approved, r.outcome) for r in injected)
    assert outcome[("false", "refused")] > outcome[("true", "ok")] > 0
    assert set(outcome) == {("false", "refused"), ("true", "ok")}
    assert series_sum(twin, "firedrill_toolgw_calls_total", tenant="acme", approved="false") > 0
    # the kill switch blocks them before the approval check
    twin.apply(ops.SetFlag("acme.max_side_effect", "read"))
    since = twin.now_s() + 1e-6
    twin.run_for(120)
    late = [
        r
        for r in twin.sandbox.tool_records(start_s=since, end_s=EVER, tenant="acme")
        if r.content_hash == HASH
    ]
    assert late
    assert {r.outcome for r in late} == {"blocked"}
    # blocking the content at retrieval stops the calls
    twin.apply(ops.BlockContentHash("acme", HASH))
    since = twin.now_s() + 1e-6
    twin.run_for(300)
    assert not any(
        r.content_hash == HASH
        for r in twin.sandbox.tool_records(start_s=since, end_s=EVER, tenant="acme")
    )
    assert series_sum(twin, "firedrill_retrieval_blocked_total", tenant="acme") > 0


def test_compensations_run_once_for_the_writes_they_name(spec: FleetSpec) -> None:
    twin = twin_of(spec)
    twin.apply(ops.InjectPromptInjection("acme", "use1-b", HASH, "money", 0.5, 0.5))
    twin.run_for(600)
    done = [
        r
        for r in twin.sandbox.tool_records(start_s=0.0, end_s=EVER, tenant="acme")
        if r.content_hash == HASH and r.outcome == "ok"
    ]
    assert done
    inverse = twin.apply(ops.RunCompensations("acme", 0.0, content_hash=HASH))
    assert isinstance(inverse, ops.Noop)
    comps = twin.sandbox.compensations(tenant="acme")
    assert sorted(c.call_id for c in comps) == sorted(r.call_id for r in done)
    assert {c.side_effect for c in comps} == {"money"}
    twin.apply(ops.RunCompensations("acme", 0.0, content_hash=HASH))
    assert len(twin.sandbox.compensations(tenant="acme")) == len(comps)  # not twice
    # by session: the writes of one session since a time, nobody else's
    rec = next(
        r
        for r in twin.sandbox.tool_records(start_s=0.0, end_s=EVER, tenant="globex")
        if r.side_effect != "read" and r.outcome == "ok"
    )
    twin.apply(ops.RunCompensations("globex", rec.at_s, sessions=(rec.session,)))
    g = twin.sandbox.compensations(tenant="globex")
    assert rec.call_id in {c.call_id for c in g}
    assert {c.session for c in g} == {rec.session}
    assert all(c.completed_at_s >= rec.at_s for c in g)


def test_frozen_promotions_refuse_new_digests_and_let_rollbacks_go(spec: FleetSpec) -> None:
    twin = twin_of(spec)
    model = "llm-8b"  # the code product
    old_bundle = twin.bundle[twin.model_index[model]].digest
    new_a, new_b = "sha256:" + "a1" * 32, "sha256:" + "b2" * 32
    twin.apply(ops.SetServingConfig(model, new_a, 256, 0.9))  # before the freeze: goes
    twin.apply(ops.FreezePromotions("code", "bundle"))
    with pytest.raises(OperationError, match="frozen"):
        twin.apply(ops.SetServingConfig(model, new_b, 256, 0.9))
    with pytest.raises(OperationError, match="frozen"):
        twin.inverse_of(ops.SetServingConfig(model, new_b, 256, 0.9))
    twin.apply(ops.SetServingConfig(model, old_bundle, 256, 0.9))  # a rollback goes
    twin.apply(ops.SetServingConfig("llm-70b", new_b, 256, 0.9))  # chat is not frozen
    old_toolset = twin.bundle[twin.model_index[model]].toolset_digest
    twin.apply(ops.PromoteToolset(model, new_a))  # toolsets are not frozen yet
    twin.apply(ops.FreezePromotions("code", "toolset"))
    with pytest.raises(OperationError, match="toolset promotions of product 'code'"):
        twin.apply(ops.PromoteToolset(model, new_b))
    twin.apply(ops.PromoteToolset(model, old_toolset))
    twin.apply(ops.UnfreezePromotions("code", "toolset"))
    twin.apply(ops.PromoteToolset(model, new_b))
    assert series_sum(twin, "firedrill_catalog_promotions_frozen", product="code") >= 0.0
    twin.run_for(15)
    assert series_sum(twin, "firedrill_catalog_promotions_frozen", product="code") == 1.0
    streams = {(c.stream, c.subject) for c in twin.changes(since_s=0.0)}
    assert ("bundle", model) in streams


def test_levers_leave_change_events(spec: FleetSpec) -> None:
    twin = twin_of(spec)
    twin.apply(ops.SetWarmPool("acme", 0))
    twin.apply(ops.BlockContentHash("acme", HASH))
    subjects = {c.subject for c in twin.changes(since_s=0.0) if c.stream == "network_policy"}
    assert {"sbx-tenant-acme/sandboxwarmpool", "retrieval-blocklist/acme"} <= subjects


def test_injections_never_draw_from_another_tenant_or_from_serving(spec: FleetSpec) -> None:
    """globex's sessions, egress and tool calls and every pool's serving are the same bit for bit
    whatever happens to acme: an exfiltration, a prompt injection and the whole containment."""
    control, treated = twin_of(spec), twin_of(spec)
    control.run_for(120)
    treated.run_for(120)
    treated.apply(ops.InjectExfiltration("acme", "use1-a", 3.0))
    treated.apply(ops.InjectPromptInjection("acme", "usw2-a", HASH, "money", 1.0, 0.5))
    control.run_for(300)
    treated.run_for(300)
    pod = next(
        r.pod
        for r in treated.sandbox.egress_records(start_s=0.0, end_s=EVER, tenant="acme")
        if r.dest_class == "base64-subdomain"
    )
    for op in (
        ops.SetFlag("acme.max_side_effect", "read"),
        ops.SetWarmPool("acme", 0),
        ops.QuarantinePod(pod),
        ops.FreezePromotions("chat", "bundle"),
        ops.FreezePromotions("chat", "toolset"),
        ops.BlockContentHash("acme", HASH),
        ops.RunCompensations("acme", 0.0),
    ):
        treated.apply(op)
    control.run_for(900)
    treated.run_for(900)
    assert treated.sandbox.tenant_snapshot("acme") != control.sandbox.tenant_snapshot("acme")
    assert treated.sandbox.tenant_snapshot("globex") == control.sandbox.tenant_snapshot("globex")
    for name in ("ttft_hist", "tpot_hist", "lam", "ok", "errors", "ready"):
        assert np.array_equal(getattr(treated, name), getattr(control, name)), name
    for labels in ({"tenant": "globex"}, {"model_name": "llm-70b"}):
        for name in (
            "firedrill_sandbox_connections_total",
            "vllm:time_to_first_token_seconds_bucket",
        ):
            a = treated.query(name, labels, start_s=0.0, end_s=EVER)
            b = control.query(name, labels, start_s=0.0, end_s=EVER)
            assert len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                assert x.labels == y.labels
                assert np.array_equal(x.values, y.values, equal_nan=True)
