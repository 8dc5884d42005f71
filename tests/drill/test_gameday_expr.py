"""The PromQL subset against series whose answers are computed by hand."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
import pytest

from firedrill.drill import expr
from firedrill.model.series import Labels, Series, labels_of

T = np.arange(0.0, 301.0, 15.0)  # 0, 15, ..., 300: 21 scrapes


class FakeSignals:
    """A Signals port over fixed series (every series sampled at T)."""

    def __init__(self, series: dict[tuple[str, Labels], npt.NDArray[np.float64]]) -> None:
        self.series = series

    def series_names(self) -> Sequence[str]:
        return sorted({n for n, _ in self.series})

    def _match(
        self, name: str, matchers: Mapping[str, str] | None
    ) -> list[tuple[Labels, npt.NDArray[np.float64]]]:
        want = dict(matchers or {})
        return [
            (lab, v)
            for (n, lab), v in sorted(self.series.items())
            if n == name and all(dict(lab).get(k, "") == x for k, x in want.items())
        ]

    def query(
        self, name: str, matchers: Mapping[str, str] | None = None, *, start_s: float, end_s: float
    ) -> Sequence[Series]:
        keep = (start_s <= T) & (end_s >= T)
        return [Series(name, lab, T[keep], v[keep]) for lab, v in self._match(name, matchers)]

    def instant(
        self, name: str, matchers: Mapping[str, str] | None = None
    ) -> tuple[float, Sequence[Labels], npt.NDArray[np.float64]]:
        found = self._match(name, matchers)
        return float(T[-1]), [lab for lab, _ in found], np.array([v[-1] for _, v in found])


def _req(region: str, status: str) -> Labels:
    return labels_of(region=region, status=status, model_name="llm-70b")


@pytest.fixture
def signals() -> FakeSignals:
    # counters growing linearly: 2xx at 10/s and 5xx at 1/s in us-west-2; 20/s and 0 elsewhere
    s: dict[tuple[str, Labels], npt.NDArray[np.float64]] = {
        ("http_requests_total", _req("us-west-2", "2xx")): 10.0 * T,
        ("http_requests_total", _req("us-west-2", "5xx")): 1.0 * T,
        ("http_requests_total", _req("eu-west-1", "2xx")): 20.0 * T,
        ("http_requests_total", _req("eu-west-1", "5xx")): 0.0 * T,
        ("vllm:kv_cache_usage_perc", labels_of(cell="a", region="us-west-2")): np.full(T.size, 0.4),
        ("vllm:kv_cache_usage_perc", labels_of(cell="b", region="us-west-2")): np.full(T.size, 0.9),
        ("vllm:kv_cache_usage_perc", labels_of(cell="c", region="eu-west-1")): np.full(T.size, 0.2),
    }
    # a histogram: per second, 50 observations <= 0.5 s, 40 more <= 1 s, 10 more <= 2 s
    for le, per_s in (("0.5", 50.0), ("1.0", 90.0), ("2.0", 100.0), ("+Inf", 100.0)):
        s[("ttft_bucket", labels_of(le=le, region="us-west-2"))] = per_s * T
    return FakeSignals(s)


def _eval(text: str, signals: FakeSignals) -> expr.Value:
    return expr.evaluate(text, signals, lambda: float(T[-1]))


def test_rate_of_a_linear_counter(signals: FakeSignals) -> None:
    v = _eval('rate(http_requests_total{region="us-west-2",status="5xx"}[5m])', signals)
    assert isinstance(v, dict)
    assert list(v.values()) == pytest.approx([1.0])


def test_increase_is_rate_times_range(signals: FakeSignals) -> None:
    v = _eval('sum(increase(http_requests_total{status="2xx"}[5m]))', signals)
    assert isinstance(v, dict)
    assert v[()] == pytest.approx((10.0 + 20.0) * 300.0)


def test_error_ratio_and_a_comparison(signals: FakeSignals) -> None:
    ratio = (
        'sum(rate(http_requests_total{region="us-west-2",status="5xx"}[5m])) / '
        'sum(rate(http_requests_total{region="us-west-2"}[5m]))'
    )
    v = _eval(ratio, signals)
    assert isinstance(v, dict)
    assert v[()] == pytest.approx(1.0 / 11.0)
    assert expr.fires(_eval(ratio + " > 0.05", signals))
    assert not expr.fires(_eval(ratio + " > 0.1", signals))


def test_sum_by_and_regex_and_negative_matchers(signals: FakeSignals) -> None:
    v = _eval('sum by (region) (rate(http_requests_total{region=~"us-.*|eu-.*"}[5m]))', signals)
    assert v == pytest.approx({(("region", "eu-west-1"),): 20.0, (("region", "us-west-2"),): 11.0})
    v = _eval('sum(rate(http_requests_total{region!="us-west-2"}[5m]))', signals)
    assert isinstance(v, dict)
    assert v[()] == pytest.approx(20.0)
    v = _eval('count(rate(http_requests_total{status!~"2.."}[5m]))', signals)
    assert isinstance(v, dict)
    assert v[()] == 2.0


def test_max_avg_min_without(signals: FakeSignals) -> None:
    assert _eval("max(vllm:kv_cache_usage_perc)", signals) == pytest.approx({(): 0.9})
    assert _eval("min(vllm:kv_cache_usage_perc)", signals) == pytest.approx({(): 0.2})
    v = _eval("avg without (cell) (vllm:kv_cache_usage_perc)", signals)
    assert v == pytest.approx({(("region", "eu-west-1"),): 0.2, (("region", "us-west-2"),): 0.65})


def test_histogram_quantile_interpolates_in_the_bucket(signals: FakeSignals) -> None:
    # p50: rank 50 of 100 falls at the top of the first bucket; p95: rank 95 in (1, 2]:
    # 1 + (95 - 90) / 10 = 1.5 s; p99: 1 + 9/10 = 1.9 s
    for q, want in ((0.5, 0.5), (0.95, 1.5), (0.99, 1.9)):
        v = _eval(f"histogram_quantile({q}, sum by (le) (rate(ttft_bucket[5m])))", signals)
        assert isinstance(v, dict)
        assert v[()] == pytest.approx(want)


def test_scalar_arithmetic_and_precedence(signals: FakeSignals) -> None:
    assert _eval("1 + 2 * 3", signals) == 7.0
    assert _eval("(1 + 2) * 3", signals) == 9.0
    assert _eval("-2 * -3", signals) == 6.0
    assert _eval("2 > 1", signals) == 1.0
    assert math.isinf(expr.scalar_of(_eval("1 / 0", signals)))


def test_vector_arithmetic_matches_identical_labels(signals: FakeSignals) -> None:
    v = _eval("vllm:kv_cache_usage_perc * 100", signals)
    assert isinstance(v, dict)
    assert sorted(v.values()) == pytest.approx([20.0, 40.0, 90.0])
    v = _eval("vllm:kv_cache_usage_perc - vllm:kv_cache_usage_perc", signals)
    assert isinstance(v, dict)
    assert set(v.values()) == {0.0}


def test_scalar_of_takes_the_largest_sample(signals: FakeSignals) -> None:
    assert expr.scalar_of(_eval("vllm:kv_cache_usage_perc", signals)) == pytest.approx(0.9)
    assert math.isnan(expr.scalar_of(_eval("vllm:kv_cache_usage_perc > 5", signals)))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("sum(rate(x[5m])", "expected ')'"),
        ("rate(x)", "needs a range selector"),
        ('x{a="b"', "expected ',' or '}'"),
        ("x{a=b}", "quoted label value"),
        ("frobnicate(x)", "unknown function"),
        ("x[5q]", "duration"),
        ("", "empty expression"),
        ("x > ", "expected a number"),
        ('x{a=~"("}', "bad regex"),
    ],
)
def test_parse_errors_say_what_and_where(text: str, words: str) -> None:
    with pytest.raises(expr.ExprError) as info:
        expr.parse(text)
    assert words in str(info.value)
    assert "column" in str(info.value)
