"""Reading the series selectors back out of PromQL, as the exporter-fit check does."""

from __future__ import annotations

import pytest

from firedrill.detect.selectors import Matcher, SelectorError, selectors


def test_functions_aggregations_and_label_lists_are_not_series() -> None:
    expr = (
        'label_replace(sum by (cell, region) (rate(vllm:x_bucket{le="2.5", model_name="m"}[5m]))'
        ' / on (cell) group_left (region) max without (gpu) (y), "node", "$1", "Hostname", "(.+)")'
        " and ignoring (sloth_window) histogram_quantile(0.99, z) > 4 or absent(firedrill_a)"
    )
    found = selectors(expr)
    assert [s.name for s in found] == ["vllm:x_bucket", "y", "z", "firedrill_a"]
    assert found[0].matchers == (Matcher("le", "=", "2.5"), Matcher("model_name", "=", "m"))
    assert found[0].value_of("le") == "2.5"


def test_matcher_operators_and_escapes() -> None:
    (sel,) = selectors(r'http_requests_total{handler=~"/v1/.+", status!="5xx", a="q\"x"}')
    assert sel.matchers == (
        Matcher("handler", "=~", "/v1/.+"),
        Matcher("status", "!=", "5xx"),
        Matcher("a", "=", 'q"x'),
    )
    assert sel.value_of("handler") is None


def test_a_name_in_braces_and_keywords() -> None:
    (sel,) = selectors('{__name__="up", job="x"} == bool 1')
    assert sel.name == "up"
    with pytest.raises(SelectorError):
        selectors('{job="x"}')
    with pytest.raises(SelectorError):
        selectors("rate(x[5m]) ` 2")
