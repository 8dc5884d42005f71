"""Every generated rule selects series a real vLLM / dcgm-exporter / kube-state-metrics emits.

The reference lists (``firedrill.model.exporters``, from shared/reference/exporter-metrics.md) are
the oracle: each selector's metric name must be a sample of a family of the named exporter
version, each label matcher must name a label that series carries (its exporter's own, or one the
scrape adds), each fixed value must be one the exporter writes, and each ``le`` a real boundary.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from firedrill.detect.rules import TWIN_SERIES_ABSENT, generate, is_twin_series
from firedrill.detect.selectors import Selector, selectors
from firedrill.detect.slo import ExporterVersions, Objective, SloSpec
from firedrill.errors import SpecError
from firedrill.model.exporters import (
    FIREDRILL_TARGET_LABELS,
    KUBE_STATE_METRICS,
    SCRAPE_TARGET_LABELS,
    Catalog,
    MetricFamily,
    dcgm_catalog,
    vllm_catalog,
)
from firedrill.specfile import load_spec

ROOT = Path(__file__).resolve().parents[2]

OBJECTIVES = [
    Objective(name="chat-ttft", product="chat", model="llm-70b", sli="ttft", ttft_threshold_s=1.0),
    Objective(name="chat-avail", product="chat", model="llm-70b", sli="availability"),
    Objective(name="chat-goodput", product="chat", model="llm-70b", sli="goodput"),
]
# The label the generated ServiceMonitor copies onto vLLM's http_* series from the pod.
HTTP_SCRAPE_LABELS = frozenset({"model_name"})


def _family(spec: SloSpec, name: str) -> tuple[Catalog, MetricFamily] | None:
    e = spec.exporters
    for cat in (vllm_catalog(e.vllm), dcgm_catalog(e.dcgm_exporter), KUBE_STATE_METRICS):
        fam = cat.family_of(name)
        if fam is not None:
            return cat, fam
    return None


def _problems(spec: SloSpec, sel: Selector, recorded: set[str]) -> list[str]:
    if sel.name in recorded:
        return []
    found = _family(spec, sel.name)
    if found is None:
        return [f"{sel.name}: no exporter of the reference emits it"]
    cat, fam = found
    out: list[str] = []
    if not fam.default_on and fam.name not in spec.exporters.dcgm_extra_fields:
        out.append(f"{sel.name}: off by default in {cat.exporter} and not enabled by the spec")
    allowed = fam.labels | SCRAPE_TARGET_LABELS | FIREDRILL_TARGET_LABELS
    if fam.name.startswith("http_"):
        allowed |= HTTP_SCRAPE_LABELS
    for m in sel.matchers:
        if m.label == "le":
            if not sel.name.endswith("_bucket") or float(m.value) not in fam.buckets:
                out.append(f'{sel.name}: le="{m.value}" is not a boundary of {cat.exporter}')
            continue
        if m.label not in allowed and not fam.has_label(m.label):
            out.append(f"{sel.name}: {cat.exporter} {cat.version} has no label {m.label}")
            continue
        fixed = fam.label_values.get(m.label)
        if fixed is not None and m.op == "=" and m.value not in fixed:
            out.append(f'{sel.name}: {m.label}="{m.value}" is never written')
        if fixed is not None and m.op == "=~" and not any(re.fullmatch(m.value, v) for v in fixed):
            out.append(f'{sel.name}: {m.label}=~"{m.value}" matches no value written')
    return out


def _check(spec: SloSpec) -> tuple[list[str], int]:
    groups = generate(spec).groups
    recorded = {str(r["record"]) for g in groups for r in g["rules"] if "record" in r}
    problems: list[str] = []
    n = 0
    for g in groups:
        for r in g["rules"]:
            for sel in selectors(str(r["expr"])):
                n += 1
                problems += [f"{g['name']}/{r.get('alert', r.get('record'))}: {p}"
                             for p in _problems(spec, sel, recorded)]  # fmt: skip
    return problems, n


@pytest.mark.parametrize(
    "exporters",
    [
        ExporterVersions(),
        ExporterVersions(vllm="0.17.1", dcgm_exporter="4.6.0-4.9.0"),
        ExporterVersions(dcgm_extra_fields=["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]),
    ],
)
def test_every_generated_rule_selects_real_series(exporters: ExporterVersions) -> None:
    spec = SloSpec(objectives=OBJECTIVES, exporters=exporters)
    problems, n = _check(spec)
    assert n > 100  # the check looked at every selector, not at an empty rule set
    assert problems == []


def test_the_check_catches_what_a_real_fleet_lacks() -> None:
    """The oracle is not vacuous: the old rules' selectors fail it."""
    spec = SloSpec(objectives=OBJECTIVES)
    recorded: set[str] = set()
    old = [
        'vllm:time_to_first_token_seconds_bucket{model_name="m", le="2.0"}',
        'http_requests_total{model_name="m", code="500"}',
        "firedrill_cell_nodes",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        'vllm:request_success_total{finished_reason="repetition"}',
    ]
    for text in old:
        (sel,) = selectors(text)
        assert _problems(spec, sel, recorded), text
    (sel,) = selectors('vllm:request_success_total{finished_reason="repetition"}')
    newer = SloSpec(objectives=OBJECTIVES, exporters=ExporterVersions(vllm="0.17.0"))
    assert _problems(newer, sel, recorded) == []


def test_the_examples_fit_apart_from_their_twin_groups() -> None:
    spec = load_spec(ROOT / "examples/slo.yaml", SloSpec)
    assert spec.twin_series
    groups = generate(spec).groups
    recorded = {str(r["record"]) for g in groups for r in g["rules"] if "record" in r}
    twin = {
        "twin-series-guard", "remediation-guardrails", "security-tripwires", "model-quality",
        "prefill-decode",
    }  # fmt: skip
    (guard,) = next(g for g in groups if g["name"] == "twin-series-guard")["rules"]
    assert guard["alert"] == TWIN_SERIES_ABSENT
    assert guard["expr"] == "absent(firedrill_cell_nodes)"
    description = guard["annotations"]["description"]
    for g in groups:
        for r in g["rules"]:
            for sel in selectors(str(r["expr"])):
                if g["name"] in twin or (g["name"] == "causes" and is_twin_series(sel.name)):
                    # Twin-only reads are named by the guard's ticket.
                    if is_twin_series(sel.name):
                        assert sel.name in description
                    continue
                assert _problems(spec, sel, recorded) == [], (g["name"], r.get("alert"))


def test_twin_groups_only_when_asked() -> None:
    names = {g["name"] for g in generate(SloSpec(objectives=OBJECTIVES)).groups}
    assert names == {"slo-chat-ttft", "slo-chat-avail", "slo-chat-goodput", "causes"}
    on = {g["name"] for g in generate(SloSpec(objectives=OBJECTIVES, twin_series=True)).groups}
    assert on - names == {
        "twin-series-guard", "remediation-guardrails", "security-tripwires", "model-quality",
        "prefill-decode",
    }  # fmt: skip


def test_host_label_follows_the_dcgm_version() -> None:
    def exprs(version: str) -> str:
        spec = SloSpec(objectives=OBJECTIVES, exporters=ExporterVersions(dcgm_exporter=version))
        return "\n".join(str(r["expr"]) for g in generate(spec).groups for r in g["rules"])

    assert '"Hostname", "(.+)"' in exprs("4.5.3-4.8.2")
    assert '"hostname", "(.+)"' in exprs("4.6.0-4.9.0")


def test_a_threshold_off_the_buckets_is_a_spec_error_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "slo.yaml"
    path.write_text(
        "exporters: {vllm: 0.11.0}\n"
        "objectives:\n"
        "  - name: chat-ttft\n"
        "    product: chat\n"
        "    model: llm-70b\n"
        "    sli: ttft\n"
        "    ttft_threshold_s: 2.0\n"
    )
    with pytest.raises(SpecError) as info:
        load_spec(path, SloSpec)
    assert info.value.line == 7
    assert info.value.field == "objectives[0].ttft_threshold_s"
    assert "2.5" in str(info.value)
    assert "vLLM 0.11.0" in str(info.value)


@pytest.mark.parametrize(
    "exporters",
    [
        {"vllm": "0.9.2"},
        {"vllm": 0.17},  # YAML's float: "0.10" would read 0.1
        {"dcgm_exporter": "3.3.8-3.6.0"},
        {"dcgm_extra_fields": ["DCGM_FI_X"]},
    ],
)
def test_unknown_exporter_facts_are_refused(exporters: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match="exporters"):
        SloSpec.model_validate(
            {"objectives": [o.model_dump() for o in OBJECTIVES], "exporters": exporters}
        )
