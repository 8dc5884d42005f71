"""Prometheus rules generated from an SLO spec: what a real fleet loads, and what the twin means.

Symptoms page (multiwindow burn rate per cell); causes ticket; the remediation system pages on its
own rate; security tripwires always page security. Recording rule names follow Sloth's convention
(``slo:sli_error:ratio_rate5m`` ...) so dashboards built for it keep working; every alert also says
which burn tier fired (``burn_tier``), which Sloth and Pyrra do not.

Every alert carries a non-empty ``cell`` label (region-scoped alerts use ``cell="region:<name>"``)
so that Alertmanager's "missing label equals empty" rule cannot make an inhibition fleet-wide.
Node-scoped alerts carry ``node`` (copied from DCGM's host label) for the node inhibition.

The rules fit the real exporters of the versions the spec names (``model.exporters``): histogram
thresholds sit on real bucket boundaries, every SLI is a ratio of series of one metric family (so
it stays in [0, 1] at startup, under 5xx and across restarts), and rules on series only the twin
emits (``firedrill_*``) are generated only when the spec sets ``twin_series``, with one
``absent()`` ticket that fires where the twin's series are missing.
``tests/detect/test_rules_fit_exporters.py`` holds every generated selector to the reference
lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from firedrill.detect.disagg import pd_group
from firedrill.detect.quality import quality_group
from firedrill.detect.selectors import selectors
from firedrill.detect.slo import SLI_TITLES, BurnTier, Objective, SloSpec, duration_s
from firedrill.model.exporters import dcgm_host_label

FATAL_XIDS = (48, 62, 64, 79, 95, 119, 120, 140)
APP_XIDS = (13, 31, 43)
# Denied connections to base64-looking subdomains per tenant and cell in 5 m that page security:
# a sandbox never needs one, a few are a typo or a CDN, a spike is data leaving as DNS names.
EXFIL_DENIALS_PER_5M = 10
# Cause tickets on twin-only series (the registry's errors as the twin models them).
TWIN_ONLY_CAUSES = frozenset({"HydrateOrigin5xx"})
# Series firedrill's own components emit (no exporter of the reference does).
FIREDRILL_OWN_SERIES = frozenset({"gpu_quarantine_actions_total"})
TWIN_SERIES_ABSENT = "TwinOnlySeriesAbsent"
TWIN_MARKER = "firedrill_cell_nodes"  # written by the twin for every cell at every scrape


def _le(threshold_s: float) -> str:
    return repr(float(threshold_s))


def window_suffix(window: str) -> str:
    return window


def sloth_id(spec: SloSpec, o: Objective) -> str:
    return f"{spec.service}-{o.name}"


# vLLM's OpenAI-compatible routes; prometheus-fastapi-instrumentator labels unmatched paths
# handler="none", and vLLM already excludes /metrics and /health.
API_HANDLERS = "/v1/.+"


def _sel(o: Objective, extra: str = "") -> str:
    inner = f"model_name={_q(o.model)}"
    return "{" + inner + (f", {extra}" if extra else "") + "}"


def _http_sel(o: Objective, extra: str = "") -> str:
    # vLLM's http_* series carry no model_name of their own: the generated ServiceMonitor copies
    # the pod's served-model annotation onto them (export.monitors), so this matches per model.
    return _sel(o, f'handler=~"{API_HANDLERS}"' + (f", {extra}" if extra else ""))


def _by(expr: str) -> str:
    return f"sum by (cell, region) ({expr})"


def _ratio(num: str, den: str) -> str:
    """``num / den`` of two series of one family scraped together, clamped to [0, 1].

    Within one family both counters share their scrape timestamps, so Prometheus extrapolates
    both the same way and the numerator's increase cannot pass the denominator's; only a
    restart that one counter's reset detection misses (its first sample after the restart above
    its last before) could. The clamp keeps that case a ratio too. Without events the ratio is
    absent, not NaN (``den > 0``).
    """
    return f"clamp({num} / ({den} > 0), 0, 1)"


def ttft_good_share_expr(o: Objective, window: str) -> str:
    """Share of first tokens within the threshold: one histogram, bucket over count."""
    good = _good_ttft(o, window)
    total = _by(f"rate(vllm:time_to_first_token_seconds_count{_sel(o)}[{window}])")
    return _ratio(good, total)


def http_bad_ratio_expr(o: Objective, window: str) -> str:
    """Share of API requests answered 5xx: one counter family, status 5xx over all."""
    bad = _by(f"rate(http_requests_total{_http_sel(o, 'status=' + _q('5xx'))}[{window}])")
    total = _by(f"rate(http_requests_total{_http_sel(o)}[{window}])")
    return _ratio(bad, total)


def sli_error_expr(o: Objective, window: str) -> str:
    """PromQL for the SLI's error ratio per cell over ``window``, always in [0, 1].

    Goodput (requests answered and with a first token within the threshold, over all requests)
    is the product of two shares, each a ratio within one metric family: answered (non-5xx)
    over all requests from ``http_requests_total``, and fast over all first tokens from the TTFT
    histogram. Dividing one family by the other, as a single ratio would, mixes two sets of
    scrape timestamps and extrapolations and leaves [0, 1] on a 5xx storm or at startup.
    """
    if o.sli == "ttft":
        return f"1 - {ttft_good_share_expr(o, window)}"
    if o.sli == "availability":
        return http_bad_ratio_expr(o, window)
    # Without a first token in the window the fast share is absent and the answered share alone
    # counts (all 5xx: goodput 0, not NaN).
    ok = f"(1 - {http_bad_ratio_expr(o, window)})"
    return f"1 - ({ok} * {ttft_good_share_expr(o, window)} or {ok})"


def _good_ttft(o: Objective, window: str) -> str:
    sel = _sel(o, f"le={_q(_le(o.ttft_threshold_s))}")
    return _by(f"rate(vllm:time_to_first_token_seconds_bucket{sel}[{window}])")


def sli_events_expr(o: Objective, window: str) -> str:
    """Events per second of the SLI's denominator per cell over ``window``."""
    if o.sli == "ttft":
        return _by(f"rate(vllm:time_to_first_token_seconds_count{_sel(o)}[{window}])")
    return _by(f"rate(http_requests_total{_http_sel(o)}[{window}])")


def _q(s: str) -> str:
    """A PromQL string literal (a model name is the spec author's text)."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def alert_name(o: Objective, tier: BurnTier) -> str:
    return f"Cell{SLI_TITLES[o.sli]}Burn{tier.tier.capitalize()}"


def _slo_labels(spec: SloSpec, o: Objective) -> dict[str, str]:
    return {
        "sloth_service": spec.service,
        "sloth_slo": o.name,
        "sloth_id": sloth_id(spec, o),
        "model_name": o.model,
        "product": o.product,
    }


def _fmt(x: float) -> str:
    return f"{x:.10g}"


def slo_group(spec: SloSpec, o: Objective) -> dict[str, Any]:
    labels = _slo_labels(spec, o)
    rules: list[dict[str, Any]] = []
    for w in spec.windows():
        rules.append(
            {
                "record": f"slo:sli_error:ratio_rate{window_suffix(w)}",
                "expr": sli_error_expr(o, w),
                "labels": {**labels, "sloth_window": w},
            }
        )
    rules.append(
        {
            "record": "slo:sli_events:rate1h",
            "expr": sli_events_expr(o, "1h"),
            "labels": {**labels, "sloth_window": "1h"},
        }
    )
    rules.append(
        {"record": "slo:objective:ratio", "expr": f"vector({_fmt(o.target)})", "labels": labels}
    )
    rules.append(
        {"record": "slo:error_budget:ratio", "expr": f"vector({_fmt(o.budget)})", "labels": labels}
    )
    rules.append(
        {
            "record": "slo:time_period:days",
            "expr": f"vector({_fmt(spec.period_s / 86400)})",
            "labels": labels,
        }
    )
    sid = sloth_id(spec, o)
    for t in spec.tiers:
        rules.append(burn_alert(spec, o, t, sid))
    return {"name": f"slo-{o.name}", "interval": spec.evaluation_interval, "rules": rules}


def burn_alert(spec: SloSpec, o: Objective, t: BurnTier, sid: str) -> dict[str, Any]:
    threshold = _fmt(t.factor * o.budget)
    m = f'{{sloth_id="{sid}", sloth_window="{{w}}"}}'
    long_sel = m.replace("{w}", t.long)
    short_sel = m.replace("{w}", t.short)
    events_sel = f'{{sloth_id="{sid}", sloth_window="1h"}}'
    expr = (
        f"(\n  slo:sli_error:ratio_rate{t.long}{long_sel} > {threshold}\n"
        f"  and ignoring (sloth_window)\n"
        f"  slo:sli_error:ratio_rate{t.short}{short_sel} > {threshold}\n)\n"
        f"and ignoring (sloth_window)\n"
        f"(slo:sli_events:rate1h{events_sel} * 3600 >= {o.min_events_per_hour})"
    )
    title = SLI_TITLES[o.sli]
    return {
        "alert": alert_name(o, t),
        "expr": expr,
        "labels": {
            "severity": t.severity,
            "team": "inference",
            "burn_tier": t.tier,
            "burn_factor": _fmt(t.factor),
            "long_window": t.long,
            "short_window": t.short,
            "slo": o.name,
        },
        "annotations": {
            "summary": (
                f"{title} SLO {o.name} burning {_fmt(t.factor)}x budget in {{{{ $labels.cell }}}}"
            ),
            "description": (
                f"{o.product}/{o.model}: error ratio over {t.long} and {t.short} above "
                f"{_fmt(t.factor)} x {_fmt(o.budget)} in cell {{{{ $labels.cell }}}} "
                f"({{{{ $labels.region }}}}). Tier {t.tier} ({t.severity})."
            ),
            "runbook_url": f"https://runbooks.firedrill.dev/inference/{o.sli}-burn",
        },
    }


def cause_group(spec: SloSpec, *, for_fleet: bool = False) -> dict[str, Any]:
    """The cause tickets. The twin evaluates all of them (it emits every series they read);
    ``for_fleet`` keeps only those a real fleet's exporters feed: no firedrill_* series unless
    the spec asks for twin series, and no off-by-default DCGM field the spec does not enable."""
    c = spec.causes
    host = dcgm_host_label(spec.exporters.dcgm_exporter)
    enabled = set(spec.exporters.dcgm_extra_fields)

    def fits(*fields: str) -> bool:
        return not for_fleet or all(f in enabled for f in fields)

    def _node_expr(expr: str) -> str:
        # Copy DCGM's host label into ``node`` so NodeNotReady can inhibit on it.
        return f'label_replace({expr}, "node", "$1", "{host}", "(.+)")'

    thermal = f"(DCGM_FI_DEV_GPU_TEMP > {_fmt(c.gpu_temp_c)})"
    if fits("DCGM_FI_DEV_POWER_VIOLATION"):
        thermal += " or (rate(DCGM_FI_DEV_POWER_VIOLATION[5m]) > 0)"
    fatal = " or ".join(f"DCGM_FI_DEV_XID_ERRORS == {x}" for x in FATAL_XIDS)
    app = " or ".join(f"DCGM_FI_DEV_XID_ERRORS == {x}" for x in APP_XIDS)
    fresh = "changes(DCGM_FI_DEV_XID_ERRORS[15m]) > 0"

    def t(team: str) -> dict[str, str]:
        return {"severity": "ticket", "team": team}

    by_pool = "cell, region, model_name"
    rules: list[dict[str, Any]] = [
        {
            "alert": "PodTTFTHigh",
            "expr": (
                f"histogram_quantile(0.99, sum by ({by_pool}, le) "
                f"(rate(vllm:time_to_first_token_seconds_bucket[5m]))) > {_fmt(c.pod_ttft_p99_s)}"
            ),
            "for": "5m",
            "labels": t("inference"),
        },
        {
            "alert": "VllmQueueDeep",
            "expr": (
                f"sum by ({by_pool}) (vllm:num_requests_waiting) / "
                f"sum by ({by_pool}) (vllm:num_requests_running) > {_fmt(c.queue_to_running_ratio)}"
            ),
            "for": "5m",
            "labels": t("inference"),
        },
        {
            "alert": "KVCacheHigh",
            "expr": f"max by ({by_pool}) (vllm:kv_cache_usage_perc) > {_fmt(c.kv_usage)}",
            "for": "5m",
            "labels": t("inference"),
        },
        {
            "alert": "VllmPreemptions",
            "expr": f"sum by ({by_pool}) (rate(vllm:num_preemptions_total[5m])) > 0",
            "for": "5m",
            "labels": t("inference"),
        },
        {
            "alert": "DCGMXidFatal",
            "expr": _node_expr(f"(({fatal}) and {fresh})"),
            "labels": t("gpu-fleet"),
            "annotations": {
                "summary": f"XID {{{{ $value }}}} on {{{{ $labels.{host} }}}} GPU "
                "{{ $labels.gpu }}"
            },
        },
        {
            "alert": "DCGMXidNVLink",
            "expr": _node_expr(f"((DCGM_FI_DEV_XID_ERRORS == 74) and {fresh})"),
            "labels": t("gpu-fleet"),
        },
        {
            "alert": "DCGMXidAppRepeated",
            "expr": _node_expr(f"(({app}) and changes(DCGM_FI_DEV_XID_ERRORS[1h]) >= 2)"),
            "labels": t("inference"),
        },
        {
            "alert": "DCGMEccDbe",
            "expr": _node_expr("increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[1h]) > 0"),
            "labels": t("gpu-fleet"),
        },
        {
            "alert": "DCGMRowRemapPending",
            "expr": _node_expr("DCGM_FI_DEV_ROW_REMAP_PENDING > 0"),
            "labels": t("gpu-fleet"),
        },
        {
            "alert": "DCGMPcieReplayStorm",
            "expr": _node_expr(
                f"increase(DCGM_FI_DEV_PCIE_REPLAY_COUNTER[5m]) > {_fmt(c.pcie_replays_per_5m)}"
            ),
            "labels": t("gpu-fleet"),
        },
        {
            "alert": "GPUThermalViolation",
            "expr": _node_expr(thermal),
            "for": "2m",
            "labels": t("gpu-fleet"),
        },
        {
            "alert": "HydrateOrigin5xx",
            "expr": (
                "label_replace(sum by (region, code) "
                "(rate(firedrill_registry_errors_total[5m])) > 0, "
                '"cell", "region:$1", "region", "(.+)")'
            ),
            "labels": t("release"),
        },
        {
            "alert": "NodeNotReady",
            "expr": 'kube_node_status_condition{condition="Ready", status="false"} == 1',
            "for": "2m",
            "labels": t("gpu-fleet"),
        },
    ]
    for r in rules:
        r.setdefault("annotations", {"summary": f"{r['alert']} in {{{{ $labels.cell }}}}"})
    if for_fleet:
        needs = {
            "DCGMEccDbe": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",),
            "DCGMRowRemapPending": ("DCGM_FI_DEV_ROW_REMAP_PENDING",),
        }
        rules = [
            r
            for r in rules
            if fits(*needs.get(r["alert"], ()))
            and (spec.twin_series or r["alert"] not in TWIN_ONLY_CAUSES)
        ]
    return {"name": "causes", "interval": spec.evaluation_interval, "rules": rules}


def guardrail_group(spec: SloSpec) -> dict[str, Any]:
    g = spec.guardrails
    return {
        "name": "remediation-guardrails",
        "interval": spec.evaluation_interval,
        "rules": [
            {
                "alert": "QuarantineRateAnomalous",
                "expr": (
                    "sum by (cell, region) (increase(gpu_quarantine_actions_total[1h])) "
                    f"> {g.quarantines_per_cell_hour}"
                ),
                "labels": {"severity": "page", "team": "gpu-fleet"},
                "annotations": {
                    "summary": (
                        f"Auto-remediation quarantined >{g.quarantines_per_cell_hour} nodes/h in "
                        "{{ $labels.cell }}: suspect exporter or rollout, "
                        "consider pausing automation"
                    )
                },
            },
            {
                "alert": "NodeRemediationFlapping",
                "expr": (
                    "sum by (cell, region, node) "
                    f"(increase(gpu_quarantine_actions_total[{g.flapping_window}])) >= 2"
                ),
                "labels": {"severity": "ticket", "team": "gpu-fleet"},
                "annotations": {
                    "summary": "{{ $labels.node }} remediated twice within " + g.flapping_window
                },
            },
            {
                "alert": "QuarantinedFractionHigh",
                "expr": (
                    'sum by (cell, region) (kube_node_spec_taint{key="gpu.corp/quarantine"}) '
                    "/ sum by (cell, region) (firedrill_cell_nodes) "
                    f"> {_fmt(g.quarantined_fraction)}"
                ),
                "labels": {"severity": "page", "team": "gpu-fleet"},
                "annotations": {"summary": "Quarantined share of {{ $labels.cell }} above budget"},
            },
        ],
    }


def security_group(spec: SloSpec) -> dict[str, Any]:
    sec = {"severity": "security", "team": "security"}
    return {
        "name": "security-tripwires",
        "interval": spec.evaluation_interval,
        "rules": [
            {
                "alert": "SandboxMetadataAccess",
                "expr": (
                    "sum by (cell, region, tenant) (increase(firedrill_sandbox_connections_total"
                    '{dest_class="metadata"}[5m])) > 0'
                ),
                "labels": sec,
                "annotations": {
                    "summary": "A sandbox of {{ $labels.tenant }} reached the metadata endpoint"
                },
            },
            {
                "alert": "SandboxKubeApiAccess",
                "expr": (
                    "sum by (cell, region, tenant) (increase(firedrill_sandbox_connections_total"
                    '{dest_class="kube-api"}[5m])) > 0'
                ),
                "labels": sec,
                "annotations": {
                    "summary": "A sandbox of {{ $labels.tenant }} reached the kube API"
                },
            },
            {
                "alert": "MoneyToolWithoutApproval",
                "expr": (
                    "sum by (cell, region, tenant) (increase(firedrill_toolgw_calls_total"
                    '{side_effect="money", approved="false"}[5m])) > 0'
                ),
                "labels": sec,
                "annotations": {
                    "summary": "A money-class tool ran without approval for {{ $labels.tenant }}"
                },
            },
            {
                "alert": "WeightsReadByNonServing",
                "expr": (
                    "sum by (cell, region, principal) (increase(firedrill_bucket_reads_total"
                    '{prefix="models", principal_class!="serving"}[5m])) > 0'
                ),
                "labels": sec,
                "annotations": {"summary": "{{ $labels.principal }} read models/*"},
            },
            {
                "alert": "WriteToolWithoutApproval",
                "expr": (
                    "sum by (cell, region, tenant) (increase(firedrill_toolgw_calls_total"
                    '{side_effect="write", approved="false"}[5m])) > 0'
                ),
                "labels": sec,
                "annotations": {
                    "summary": "A write-class tool was called without approval for "
                    "{{ $labels.tenant }}"
                },
            },
            {
                "alert": "EgressExfilPattern",
                "expr": (
                    "sum by (cell, region, tenant) (increase(firedrill_sandbox_connections_total"
                    '{dest_class="base64-subdomain", decision="deny"}[5m])) '
                    f"> {EXFIL_DENIALS_PER_5M}"
                ),
                "labels": sec,
                "annotations": {
                    "summary": "Egress proxy denials to base64-looking subdomains from "
                    "{{ $labels.tenant }}'s sandboxes: data leaving as DNS names"
                },
            },
        ],
    }


@dataclass(frozen=True)
class RuleSet:
    groups: list[dict[str, Any]]

    def rule_file(self) -> dict[str, Any]:
        """The plain Prometheus rule file (``rule_files:``)."""
        return {"groups": self.groups}

    def prometheus_rule(self, *, name: str, namespace: str = "monitoring") -> dict[str, Any]:
        """The same groups as a prometheus-operator ``PrometheusRule``."""
        return {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "firedrill", "role": "alert-rules"},
            },
            "spec": {"groups": self.groups},
        }


def twin_groups(spec: SloSpec) -> list[dict[str, Any]]:
    """The groups on series only the twin and firedrill's own components emit."""
    return [
        guardrail_group(spec),
        security_group(spec),
        quality_group(spec.quality, spec.evaluation_interval),
        pd_group(spec.prefill_decode, spec.evaluation_interval),
    ]


def twin_series_guard(spec: SloSpec, groups: list[dict[str, Any]]) -> dict[str, Any]:
    """One ticket, firing while the twin's own series are missing: the twin-only rules are
    inert on this fleet.

    The marker is ``firedrill_cell_nodes``, which the twin writes for every cell at every scrape.
    The twin-only series themselves cannot be the guard: many are counters that appear only at
    their first event (a quarantine, a sandbox connection), so ``absent()`` on them would fire on
    the twin too. The annotation names every twin-only series the rules read.
    """
    names: dict[str, set[str]] = {}
    for g in groups:
        for r in g["rules"]:
            for sel in selectors(str(r["expr"])):
                if is_twin_series(sel.name):
                    names.setdefault(sel.name, set()).add(str(g["name"]))
    listed = "; ".join(f"{n} ({', '.join(sorted(gs))})" for n, gs in sorted(names.items()))
    rule = {
        "alert": TWIN_SERIES_ABSENT,
        "expr": f"absent({TWIN_MARKER})",
        "for": "1h",
        "labels": {"severity": "ticket", "team": "observability", "cell": "fleet"},
        "annotations": {
            "summary": "No firedrill twin series here: the twin-only rule groups are inert",
            "description": (
                "These rules read series only the firedrill twin (or firedrill's own components) "
                f"emit, and {TWIN_MARKER} is absent: {listed}. Set twin_series: false in the SLO "
                "spec for a fleet without them."
            ),
        },
    }
    return {"name": "twin-series-guard", "interval": spec.evaluation_interval, "rules": [rule]}


def is_twin_series(name: str) -> bool:
    """Whether only the twin (or firedrill itself) emits series of this name."""
    return name.startswith("firedrill_") or name in FIREDRILL_OWN_SERIES


def generate(spec: SloSpec) -> RuleSet:
    """The rules a fleet loads: only what its exporters (of the spec's versions) feed, plus the
    twin-only groups, guarded by an ``absent()`` ticket, when the spec asks."""
    groups = [slo_group(spec, o) for o in spec.objectives]
    groups.append(cause_group(spec, for_fleet=True))
    if spec.twin_series:
        twin = twin_groups(spec)
        groups.append(twin_series_guard(spec, [*twin, cause_group(spec)]))
        groups += twin
    return RuleSet(groups)


def longest_window_s(spec: SloSpec) -> float:
    return max(duration_s(w) for w in spec.windows())
