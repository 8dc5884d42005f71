"""The exporters' output, read back by the parsers the real tools use."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.parser import text_string_to_metric_families

from firedrill.errors import ExportError
from firedrill.model.series import Labels, Series, labels_of
from firedrill.twin.exposition import (
    OPENMETRICS_CONTENT_TYPE,
    PROMETHEUS_TEXT_CONTENT_TYPE,
    compress_values,
    grid_of,
    promtool_duration,
    promtool_test_file,
    resample,
    to_openmetrics,
    to_prometheus_text,
    to_promtool_input_series,
)

Value = float | None

EPOCH_S = 1_700_000_000.0
NASTY = 'say "hi"\\path\nnext line'


def series(name: str, labels: Labels, t_s: Sequence[float], values: Sequence[float]) -> Series:
    return Series(
        name=name,
        labels=labels,
        t_s=np.asarray(t_s, dtype=np.float64),
        values=np.asarray(values, dtype=np.float64),
    )


def parse_openmetrics(text: str) -> list[Metric]:
    return list(openmetrics_parser.text_string_to_metric_families(text))  # type: ignore[no-untyped-call]


def parse_prometheus_text(text: str) -> list[Metric]:
    return list(text_string_to_metric_families(text))


# -- an independent reader for promtool's notation ----------------------------------------------

_NUMBER = r"(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|Inf|NaN)"
_TERM = re.compile(
    rf"(?P<a>[+-]?{_NUMBER})(?:(?P<sign>[+-])(?P<b>{_NUMBER}))?(?:x(?P<n>\d+))?|_(?:x(?P<gap>\d+))?"
)


def expand(text: str) -> list[Value]:
    """Expand promtool's series values as promtool does (float64 repeated addition)."""
    out: list[Value] = []
    for term in text.split():
        m = _TERM.fullmatch(term)
        assert m is not None, f"not promtool notation: {term!r}"
        if m.group("a") is None:
            out.extend([None] * (int(m.group("gap")) if m.group("gap") else 1))
            continue
        a = float(m.group("a"))
        if m.group("n") is None:
            assert m.group("b") is None, term
            out.append(a)
            continue
        n = int(m.group("n"))
        if m.group("b") is None:
            out.extend([a] * (n + 1))
            continue
        step = float(m.group("b")) * (1.0 if m.group("sign") == "+" else -1.0)
        current = a
        for _ in range(n + 1):
            out.append(current)
            current += step
    return out


def identical(xs: Sequence[Value], ys: Sequence[Value]) -> bool:
    """Equal element by element as float64 bit patterns would be (NaN equals NaN)."""
    if len(xs) != len(ys):
        return False
    for x, y in zip(xs, ys, strict=True):
        if x is None or y is None:
            if x is not y:
                return False
        elif math.isnan(x) or math.isnan(y):
            if not (math.isnan(x) and math.isnan(y)):
                return False
        elif x != y or math.copysign(1.0, x) != math.copysign(1.0, y):
            return False
    return True


_SELECTOR = re.compile(r"(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?")
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"(?:,|$)')


def parse_selector(text: str) -> tuple[str, Labels]:
    m = _SELECTOR.fullmatch(text)
    assert m is not None, text
    labels: list[tuple[str, str]] = []
    rest = m.group("labels") or ""
    while rest:
        lm = _LABEL.match(rest)
        assert lm is not None, rest
        unescaped = re.sub(
            r"\\(.)", lambda e: {"n": "\n"}.get(e.group(1), e.group(1)), lm.group("value")
        )
        labels.append((lm.group("key"), unescaped))
        rest = rest[lm.end() :]
    return m.group("name"), tuple(labels)


# -- promtool input_series ----------------------------------------------------------------------


def test_expand_follows_promtool_counting() -> None:
    # Examples from the promtool documentation: axN and a+bxN give N + 1 values, _xN gives N.
    assert expand("-2+4x3") == [-2.0, 2.0, 6.0, 10.0]
    assert expand("1x4") == [1.0] * 5
    assert expand("1 _x3 2") == [1.0, None, None, None, 2.0]
    assert expand("5-1x2") == [5.0, 4.0, 3.0]


def test_counter_growing_linearly_is_one_term() -> None:
    counter = series(
        "http_requests_total",
        labels_of(code="200", job="api"),
        [15.0 * k for k in range(21)],
        [10.0 * k for k in range(21)],
    )
    text = to_promtool_input_series([counter], interval_s=15.0, start_s=0.0, end_s=300.0)
    (entry,) = yaml.safe_load(text)
    assert entry == {"series": 'http_requests_total{code="200",job="api"}', "values": "0+10x20"}
    assert expand(entry["values"]) == [10.0 * k for k in range(21)]


def test_gauge_with_gap_and_late_start() -> None:
    gauge = series(
        "vllm:num_requests_waiting",
        labels_of(model_name="llama-70b"),
        [30.0, 45.0, 60.0, 150.0, 165.0],
        [3.0, 5.0, 0.25, 7.0, 7.0],
    )
    expected: list[Value] = [
        None, None,  # 0, 15: before the first sample
        3.0, 5.0, 0.25,  # 30, 45, 60
        0.25,  # 75: last sample is 15 s old
        None, None, None, None,  # 90..135: older than max_age_s
        7.0, 7.0, 7.0,  # 150, 165, 180
    ]  # fmt: skip
    got = resample(gauge, interval_s=15.0, start_s=0.0, end_s=180.0, max_age_s=20.0)
    assert identical(got, expected)
    text = to_promtool_input_series(
        [gauge], interval_s=15.0, start_s=0.0, end_s=180.0, max_age_s=20.0
    )
    (entry,) = yaml.safe_load(text)
    assert entry["values"] == "_x2 3 5 0.25x1 _x4 7x2"
    assert identical(expand(entry["values"]), expected)


def test_without_max_age_the_last_sample_holds() -> None:
    gauge = series("DCGM_FI_DEV_GPU_TEMP", labels_of(gpu="0"), [7.0, 22.0], [61.5, 62.0])
    got = resample(gauge, interval_s=15.0, start_s=0.0, end_s=60.0)
    assert identical(got, [None, 61.5, 62.0, 62.0, 62.0])


def test_mixed_fleet_round_trips_through_yaml_and_notation() -> None:
    t_s = [10.0 * k for k in range(31)]
    fleet = [
        series(
            "vllm:time_to_first_token_seconds_bucket",
            labels_of(le="0.1", model_name="m"),
            t_s,
            [float(3 * k) for k in range(31)],
        ),
        series(
            "DCGM_FI_DEV_XID_ERRORS",
            labels_of(gpu="3", Hostname="node-a"),
            t_s,
            [0.0] * 10 + [79.0] * 5 + [0.0] * 16,
        ),
        series(
            "kube_node_spec_taint",
            labels_of(key=NASTY, node="node-b", effect="NoSchedule"),
            t_s[5:],
            [1.0] * 26,
        ),
        series(
            "vllm:gpu_cache_usage_perc",
            labels_of(model_name="m"),
            t_s,
            [0.1 * k for k in range(31)],  # not exact in binary: must still round-trip
        ),
        series(
            "node_load1",
            (),
            t_s,
            [math.nan, math.inf, -math.inf, 1e300, -1e-300, 2.0**60, -0.0, 5e-324] + [1.0] * 23,
        ),
    ]
    text = to_promtool_input_series(fleet, interval_s=10.0, start_s=0.0, end_s=300.0)
    entries = yaml.safe_load(text)
    assert [e["series"] for e in entries][1] == 'DCGM_FI_DEV_XID_ERRORS{Hostname="node-a",gpu="3"}'
    for s, entry in zip(fleet, entries, strict=True):
        assert parse_selector(entry["series"]) == (s.name, s.labels)
        expected = resample(s, interval_s=10.0, start_s=0.0, end_s=300.0)
        assert identical(expand(entry["values"]), expected), entry
    assert entries[0]["values"] == "0+3x30"
    assert entries[2]["values"] == "_x5 1x25"


def test_resampling_is_last_sample_at_or_before_each_point() -> None:
    s = series("vllm:num_requests_running", (), [7.0, 22.0, 37.0, 38.0], [1.0, 2.0, 3.0, 4.0])
    assert identical(resample(s, interval_s=15.0, start_s=7.0, end_s=52.0), [1, 2, 3, 4])
    assert identical(resample(s, interval_s=15.0, start_s=8.0, end_s=53.0), [1, 2, 4, 4])


def test_grid_includes_an_end_that_float_noise_puts_just_past_it() -> None:
    assert grid_of(interval_s=0.1, start_s=0.0, end_s=0.3).size == 4
    assert grid_of(interval_s=15.0, start_s=5.0, end_s=5.0).tolist() == [5.0]
    assert grid_of(interval_s=15.0, start_s=0.0, end_s=44.0).tolist() == [0.0, 15.0, 30.0]


@pytest.mark.parametrize(
    ("interval_s", "start_s", "end_s"),
    [(15.0, 10.0, 5.0), (0.0, 0.0, 10.0), (-1.0, 0.0, 10.0), (math.nan, 0.0, 1.0)],
)
def test_invalid_window_is_an_export_error(interval_s: float, start_s: float, end_s: float) -> None:
    s = series("up", (), [0.0], [1.0])
    with pytest.raises(ExportError):
        to_promtool_input_series([s], interval_s=interval_s, start_s=start_s, end_s=end_s)


@pytest.mark.parametrize(
    "bad",
    [
        series("9lives", (), [0.0], [1.0]),
        series("up", (("bad-label", "x"),), [0.0], [1.0]),
        series("up", (("__name__", "x"),), [0.0], [1.0]),
        series("up", (), [0.0, 0.0], [1.0, 2.0]),
        series("up", (), [0.0, 1.0], [1.0]),
    ],
)
def test_invalid_series_is_an_export_error(bad: Series) -> None:
    with pytest.raises(ExportError):
        to_promtool_input_series([bad], interval_s=1.0, start_s=0.0, end_s=1.0)
    with pytest.raises(ExportError):
        to_openmetrics([bad])


def test_duplicate_series_is_an_export_error() -> None:
    s = series("up", labels_of(job="a"), [0.0], [1.0])
    with pytest.raises(ExportError, match="more than once"):
        to_prometheus_text([s, s])


def test_promtool_test_file_is_a_whole_test() -> None:
    s = series("http_requests_total", labels_of(code="500"), [0.0, 60.0], [0.0, 120.0])
    inputs = to_promtool_input_series([s], interval_s=30.0, start_s=0.0, end_s=60.0)
    alert = {
        "eval_time": "1m",
        "alertname": "HighErrorRate",
        "exp_alerts": [{"exp_labels": {"severity": "page"}}],
    }
    text = promtool_test_file(
        inputs, rule_files=["rules/slo.yaml"], interval_s=30.0, alert_rule_tests=[alert]
    )
    doc = yaml.safe_load(text)
    assert doc == {
        "rule_files": ["rules/slo.yaml"],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "30s",
                "input_series": [
                    {"series": 'http_requests_total{code="500"}', "values": "0x1 120"}
                ],
                "alert_rule_test": [alert],
            }
        ],
    }


def test_promtool_durations() -> None:
    assert promtool_duration(15.0) == "15s"
    assert promtool_duration(0.5) == "500ms"
    assert promtool_duration(90.0) == "90s"
    with pytest.raises(ExportError):
        promtool_duration(0.0001)
    with pytest.raises(ExportError):
        promtool_test_file("[]", rule_files=[], interval_s=-1.0)
    with pytest.raises(ExportError):
        promtool_test_file("series: not-a-list", rule_files=[], interval_s=1.0)


def _segment() -> st.SearchStrategy[list[Value]]:
    ints = st.integers(-(10**6), 10**6).map(float)
    floats = st.floats(allow_nan=True, allow_infinity=True)
    finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12)
    missing: st.SearchStrategy[list[Value]] = st.lists(st.none(), min_size=1, max_size=5)
    constant = st.builds(lambda v, n: [v] * n, st.one_of(ints, floats), st.integers(1, 6))
    arithmetic = st.builds(
        lambda a, b, n: [a + b * k for k in range(n)],
        st.one_of(ints, finite),
        ints,
        st.integers(2, 8),
    )
    accumulated = st.builds(_accumulate, finite, finite, st.integers(2, 8))
    scattered: st.SearchStrategy[list[Value]] = st.lists(
        st.one_of(st.none(), ints, floats), max_size=6
    )
    return st.one_of(missing, constant, arithmetic, accumulated, scattered)


def _accumulate(a: float, b: float, n: int) -> list[Value]:
    out: list[Value] = []
    current = a
    for _ in range(n):
        out.append(current)
        current += b
    return out


@given(st.lists(_segment(), max_size=8).map(lambda parts: [v for p in parts for v in p]))
def test_expand_of_compress_is_identity(values: list[Value]) -> None:
    text = compress_values(values)
    assert identical(expand(text), values), text


def test_compress_folds_runs() -> None:
    assert compress_values([None, None, 1.0, 1.0, 1.0, 2.0, 4.0, 6.0, 8.0]) == "_x2 1x2 2+2x3"
    assert compress_values([5.0, 3.0, 1.0]) == "5-2x2"
    assert compress_values([math.inf, math.inf, math.nan]) == "Inf Inf NaN"
    assert compress_values([0.5, -0.0, 1e16]) == "0.5 -0 1e+16"
    assert compress_values([]) == ""


# -- OpenMetrics and the classic text format ----------------------------------------------------

T_S = [0.0, 15.0, 30.0, 45.5]


def _fleet() -> list[Series]:
    model = labels_of(model_name="llama-70b")
    buckets = {"0.1": [0, 1, 1, 4], "1": [0, 2, 5, 9], "+Inf": [0, 3, 6, 10]}
    return [
        series("vllm:request_success_total", labels_of(finished_reason="stop"), T_S, [0, 3, 6, 10]),
        series("vllm:num_requests_waiting", model, T_S, [0, 2, 1.5, 0]),
        *(
            series(
                "vllm:time_to_first_token_seconds_bucket",
                labels_of(model_name="llama-70b", le=le),
                T_S,
                counts,
            )
            for le, counts in buckets.items()
        ),
        series("vllm:time_to_first_token_seconds_count", model, T_S, [0, 3, 6, 10]),
        series("vllm:time_to_first_token_seconds_sum", model, T_S, [0, 1.25, 4.5, 6.125]),
        series("DCGM_FI_DEV_XID_ERRORS", labels_of(gpu="0", err_msg=NASTY), T_S, [0, 0, 79, 79]),
        series("http_requests_total", (), T_S[1:], [1, 2, 3]),
    ]


EXPECTED_TYPES = {
    "vllm:request_success": "counter",
    "vllm:num_requests_waiting": "gauge",
    "vllm:time_to_first_token_seconds": "histogram",
    "DCGM_FI_DEV_XID_ERRORS": "gauge",
    "http_requests": "counter",
}


def _expected_samples(
    fleet: Sequence[Series], *, at_s: float | None, stamped: bool
) -> set[tuple[str, Labels, float, float | None]]:
    out: set[tuple[str, Labels, float, float | None]] = set()
    for s in fleet:
        labels = tuple(
            (k, _canonical_le(v) if k == "le" else v) for k, v in s.labels
        )  # the exporter rewrites le canonically; the bound itself is unchanged
        for t, v in zip(s.t_s.tolist(), s.values.tolist(), strict=True):
            if at_s is not None:
                before = [u for u in s.t_s.tolist() if u <= at_s]
                if not before or t != before[-1]:
                    continue
            out.add((s.name, labels, v, EPOCH_S + t if stamped else None))
    return out


def _canonical_le(text: str) -> str:
    bound = float(text)
    return "+Inf" if math.isinf(bound) else repr(bound)


def _parsed(
    families: Sequence[Metric],
) -> tuple[dict[str, str], set[tuple[str, Labels, float, float | None]]]:
    types: dict[str, str] = {}
    samples: set[tuple[str, Labels, float, float | None]] = set()
    for family in families:
        types[family.name] = family.type
        for s in family.samples:
            ts = None if s.timestamp is None else float(s.timestamp)
            samples.add((s.name, tuple(sorted(s.labels.items())), float(s.value), ts))
    return types, samples


def _parse_openmetrics_by_point(text: str) -> list[Metric]:
    """Parse OpenMetrics history one histogram point at a time.

    OpenMetrics lets a histogram expose several points (one per timestamp) in a row, but
    prometheus_client's parser drops all but the first sample of each series within a group
    after the first point, so each histogram point is parsed as its own document.
    """
    assert text.endswith("# EOF\n")
    documents: list[str] = []
    for block in text.removesuffix("# EOF\n").split("# TYPE ")[1:]:
        header, *lines = block.splitlines()
        if not header.endswith(" histogram"):
            documents.append("# TYPE " + block + "# EOF\n")
            continue
        points: dict[str, list[str]] = {}
        for line in lines:
            points.setdefault(line.rsplit(" ", 1)[1], []).append(line)
        documents.extend(
            "# TYPE " + "\n".join([header, *point, "# EOF"]) + "\n" for point in points.values()
        )
    return [family for document in documents for family in parse_openmetrics(document)]


def test_openmetrics_all_samples_parse_back_exactly() -> None:
    fleet = _fleet()
    text = to_openmetrics(fleet, epoch_s=EPOCH_S)
    assert text.endswith("# EOF\n")
    types, samples = _parsed(_parse_openmetrics_by_point(text))
    assert types == EXPECTED_TYPES
    assert samples == _expected_samples(fleet, at_s=None, stamped=True)
    assert 'le="1.0"' in text
    assert 'le="0.1"' in text
    assert 'le="+Inf"' in text
    assert "# TYPE vllm:request_success counter\n" in text
    # A histogram point is written whole: buckets by le, then _count and _sum, one timestamp.
    point = [
        line.split(" ")[0]
        for line in text.splitlines()
        if line.startswith("vllm:time_to_first_token") and line.endswith(" 1700000015.0")
    ]
    assert point == [
        'vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="llama-70b"}',
        'vllm:time_to_first_token_seconds_bucket{le="1.0",model_name="llama-70b"}',
        'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="llama-70b"}',
        'vllm:time_to_first_token_seconds_count{model_name="llama-70b"}',
        'vllm:time_to_first_token_seconds_sum{model_name="llama-70b"}',
    ]


def test_openmetrics_at_an_instant() -> None:
    fleet = _fleet()
    for stamped in (True, False):
        text = to_openmetrics(fleet, at_s=40.0, epoch_s=EPOCH_S, with_timestamps=stamped)
        types, samples = _parsed(parse_openmetrics(text))
        assert types == EXPECTED_TYPES
        assert samples == _expected_samples(fleet, at_s=40.0, stamped=stamped)
    # Before http_requests_total's first sample it is left out, and so is its family.
    text = to_openmetrics(fleet, at_s=5.0)
    assert "http_requests" not in text
    assert _parsed(parse_openmetrics(text))[0].keys() == EXPECTED_TYPES.keys() - {"http_requests"}


def test_openmetrics_needs_timestamps_for_history() -> None:
    with pytest.raises(ExportError, match="timestamps"):
        to_openmetrics(_fleet(), with_timestamps=False)


def test_openmetrics_rejects_what_its_parsers_reject() -> None:
    negative = series("http_requests_total", (), [0.0], [-1.0])
    with pytest.raises(ExportError, match="< 0"):
        to_openmetrics([negative])
    fractional = series("rpc_seconds_count", (), [0.0], [1.5])
    with pytest.raises(ExportError, match="integer"):
        to_openmetrics([fractional, series("rpc_seconds_sum", (), [0.0], [2.0])])
    no_le = series("rpc_seconds_bucket", (), [0.0], [1.0])
    with pytest.raises(ExportError, match="'le'"):
        to_openmetrics([no_le])


def test_names_that_claim_one_family_are_an_export_error() -> None:
    clash = [series("jobs_total", (), [0.0], [1.0]), series("jobs", (), [0.0], [1.0])]
    with pytest.raises(ExportError, match="same metric family"):
        to_openmetrics(clash)


def test_count_and_sum_without_buckets_are_a_summary() -> None:
    fleet = [
        series("rpc_duration_seconds", labels_of(quantile="0.5"), [0.0], [0.25]),
        series("rpc_duration_seconds_count", (), [0.0], [4.0]),
        series("rpc_duration_seconds_sum", (), [0.0], [1.5]),
    ]
    (family,) = parse_openmetrics(to_openmetrics(fleet))
    assert family.type == "summary"
    assert [(s.name, s.value) for s in family.samples] == [
        ("rpc_duration_seconds", 0.25),
        ("rpc_duration_seconds_count", 4),
        ("rpc_duration_seconds_sum", 1.5),
    ]


def test_prometheus_text_serves_the_latest_values() -> None:
    fleet = _fleet()
    text = to_prometheus_text(fleet)
    assert "# EOF" not in text
    assert "# TYPE vllm:request_success_total counter\n" in text
    assert "# TYPE vllm:time_to_first_token_seconds histogram\n" in text
    types, samples = _parsed(parse_prometheus_text(text))
    assert types == EXPECTED_TYPES
    assert samples == _expected_samples(fleet, at_s=math.inf, stamped=False)
    # Counters keep their _total sample name after parsing.
    assert ("http_requests_total", (), 3.0, None) in samples


def test_prometheus_text_at_an_instant_and_special_values() -> None:
    fleet = _fleet()
    _, samples = _parsed(parse_prometheus_text(to_prometheus_text(fleet, at_s=20.0)))
    assert samples == _expected_samples(fleet, at_s=20.0, stamped=False)
    odd = series("node_temp", (), [0.0, 1.0, 2.0], [math.inf, -math.inf, math.nan])
    for at_s, check in ((0.0, math.isinf), (2.0, math.isnan)):
        (family,) = parse_prometheus_text(to_prometheus_text([odd], at_s=at_s))
        assert check(family.samples[0].value)
    assert to_prometheus_text([odd], at_s=-1.0) == ""


def test_content_types() -> None:
    assert PROMETHEUS_TEXT_CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    assert OPENMETRICS_CONTENT_TYPE.startswith("application/openmetrics-text; version=1.0.0")
