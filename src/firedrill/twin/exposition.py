"""Render twin series in the text formats Prometheus tooling reads.

The twin is only worth trusting if its signals meet the real tools unchanged: alert rules are
unit-tested by ``promtool test rules`` against the twin's series (``input_series``), and scrapers,
dashboards and the control plane's own Prometheus adapter read them as OpenMetrics or as the
classic text format a ``/metrics`` endpoint serves. This module turns ``Series`` values into
those strings and does nothing else: no files, no sockets, so it stays in the pure core and can
be checked exactly.

Two rules hold throughout. Numbers are printed so that they parse back to the same float64
(shortest round-trip form, integers without a decimal point), so a rule test sees exactly the
twin's values. Metric types follow exporter naming: ``*_total`` is a counter, ``*_bucket`` /
``*_count`` / ``*_sum`` make a histogram (a summary when there are no buckets), anything else
is a gauge, unless the real exporter says otherwise (``firedrill.model.exporters``: dcgm-exporter
types ``DCGM_FI_DEV_PCIE_REPLAY_COUNTER`` a counter without the suffix).

What a scrape sees (``to_prometheus_text``, and ``to_openmetrics`` at an instant) is written by
``prometheus_client``, the library vLLM itself exposes with: each family's real type and a
``# HELP`` line (``firedrill.model.exporters``). ``exporter_labels`` adds the labels the real
exporters write that the twin's series leave out (vLLM's ``engine``, dcgm-exporter's ``device``,
``UUID``, ``pci_bus_id``). The
twin serves the whole fleet from one endpoint, so its series also carry the target labels a real
fleet's ServiceMonitor/PodMonitor adds at scrape time (``cell``, ``region``, and ``model_name`` on
vLLM's ``http_*`` series; see ``firedrill.export.monitors``).
"""

from __future__ import annotations

import difflib
import hashlib
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Generic, Literal, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
import yaml
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import ALLOWUTF8
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector

from firedrill.errors import ExportError
from firedrill.model.exporters import (
    DCGM_DEFAULT_VERSION,
    KUBE_STATE_METRICS,
    VLLM_DEFAULT_VERSION,
    MetricFamily,
    dcgm_catalog,
    vllm_catalog,
)
from firedrill.model.series import Labels, Series

__all__ = [
    "OPENMETRICS_CONTENT_TYPE",
    "PROMETHEUS_TEXT_CONTENT_TYPE",
    "Named",
    "SeriesSource",
    "as_sources",
    "compress_values",
    "ensure_series_are_valid",
    "ensure_window_is_valid",
    "exporter_labels",
    "exporter_series_names",
    "family_of",
    "grid_of",
    "promtool_duration",
    "promtool_test_file",
    "resample",
    "select_families",
    "series_selector",
    "stream_openmetrics",
    "stream_promtool_input_series",
    "to_openmetrics",
    "to_prometheus_text",
    "to_promtool_input_series",
]

PROMETHEUS_TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

# A window whose length is a whole number of intervals up to float noise still ends on a grid
# point: (end - start) / interval = 2.9999999999 means three intervals, not two.
_GRID_SLACK = 1e-9

# Integral values below 2**53 are printed as integers; every one of them is exact in float64.
_EXACT_INT_LIMIT = 2.0**53

Kind = Literal["counter", "gauge", "histogram", "summary"]

F64 = npt.NDArray[np.float64]


class Named(Protocol):
    """What grouping series into families needs: a name and labels (``Series`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def labels(self) -> Labels: ...

    def label(self, key: str) -> str: ...


class SeriesSource(Named, Protocol):
    """A series whose samples are read only when it is written (a streamed export holds one
    histogram point's series at a time, never the whole export)."""

    def samples(self) -> tuple[F64, npt.NDArray[np.floating]]: ...


N = TypeVar("N", bound=Named)


# -- validation ---------------------------------------------------------------------------------


def ensure_window_is_valid(*, interval_s: float, start_s: float, end_s: float) -> None:
    """Raise ``ExportError`` unless the window is finite, non-empty and the interval positive."""
    if not (math.isfinite(interval_s) and math.isfinite(start_s) and math.isfinite(end_s)):
        raise ExportError(
            f"window must be finite: start_s={start_s}, end_s={end_s}, interval_s={interval_s}"
        )
    if interval_s <= 0:
        raise ExportError(f"interval_s must be positive, got {interval_s}")
    if end_s < start_s:
        raise ExportError(f"empty window: end_s={end_s} is before start_s={start_s}")


def ensure_series_are_valid(series: Sequence[Series]) -> None:
    """Raise ``ExportError`` for a name or label Prometheus rejects, bad sample arrays, or two
    series with the same name and labels."""
    seen: set[tuple[str, Labels]] = set()
    for s in series:
        _ensure_series_is_valid(s)
        key = (s.name, s.labels)
        if key in seen:
            raise ExportError(f"series {series_selector(s)} appears more than once")
        seen.add(key)


def _ensure_names_are_valid(series: Iterable[Named]) -> None:
    """``ensure_series_are_valid`` without the samples: names, labels, no duplicates."""
    seen: set[tuple[str, Labels]] = set()
    for s in series:
        _ensure_name_is_valid(s)
        key = (s.name, s.labels)
        if key in seen:
            raise ExportError(f"series {series_selector(s)} appears more than once")
        seen.add(key)


def _ensure_series_is_valid(s: Series) -> None:
    _ensure_name_is_valid(s)
    _ensure_samples_are_valid(s.name, s.t_s, s.values)


def _ensure_name_is_valid(s: Named) -> None:
    if _METRIC_NAME.fullmatch(s.name) is None:
        raise ExportError(f"invalid metric name {s.name!r}")
    names = [k for k, _ in s.labels]
    for k in names:
        if _LABEL_NAME.fullmatch(k) is None or k.startswith("__"):
            raise ExportError(f"series {s.name}: invalid label name {k!r}")
    if len(set(names)) != len(names):
        raise ExportError(f"series {s.name}: a label name appears twice in {names}")


def _ensure_samples_are_valid(
    name: str, t_s: npt.NDArray[np.floating], values: npt.NDArray[np.floating]
) -> None:
    if t_s.ndim != 1 or values.ndim != 1 or t_s.shape != values.shape:
        raise ExportError(
            f"series {name}: t_s {t_s.shape} and values {values.shape} must be 1-D "
            "and of equal length"
        )
    if t_s.size and not bool(np.all(np.isfinite(t_s))):
        raise ExportError(f"series {name}: sample times must be finite")
    if t_s.size > 1 and not bool(np.all(np.diff(t_s) > 0)):
        raise ExportError(f"series {name}: sample times must be strictly increasing")


# -- numbers and names --------------------------------------------------------------------------


def _format_finite(value: float) -> str:
    """Shortest text that parses back to exactly ``value``; integers without a decimal point."""
    if value.is_integer() and abs(value) < _EXACT_INT_LIMIT:
        if value == 0 and math.copysign(1.0, value) < 0:
            return "-0"
        return str(int(value))
    return repr(value)


def _format_exposition_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return _format_finite(value)


def _format_promtool_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return _format_finite(value)


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _render_labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape_label_value(v)}"' for k, v in labels)
    return "{" + inner + "}"


def series_selector(s: Named) -> str:
    """The series as PromQL writes it: ``name{a="b",...}`` (just ``name`` without labels)."""
    return s.name + _render_labels(s.labels)


def promtool_duration(seconds: float) -> str:
    """A duration as promtool parses it (``15s``, ``500ms``); whole milliseconds only."""
    if not math.isfinite(seconds) or seconds <= 0:
        raise ExportError(f"duration must be positive, got {seconds} s")
    ms = round(seconds * 1000.0)
    if ms <= 0 or abs(ms - seconds * 1000.0) > 1e-6:
        raise ExportError(f"duration {seconds} s is not a whole number of milliseconds")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


# -- promtool input_series ----------------------------------------------------------------------


def grid_of(*, interval_s: float, start_s: float, end_s: float) -> npt.NDArray[np.float64]:
    """Grid points start_s, start_s + interval_s, ... up to end_s (s since the run's start)."""
    ensure_window_is_valid(interval_s=interval_s, start_s=start_s, end_s=end_s)
    steps = math.floor((end_s - start_s) / interval_s + _GRID_SLACK)
    # Multiply rather than accumulate so that point k does not carry k rounding errors.
    return start_s + interval_s * np.arange(steps + 1, dtype=np.float64)


def resample(
    s: Series,
    *,
    interval_s: float,
    start_s: float,
    end_s: float,
    max_age_s: float | None = None,
) -> list[float | None]:
    """The value of ``s`` at each grid point: its last sample at or before the point.

    ``None`` where there is no such sample (before the first one) or, when ``max_age_s`` is
    given, where the last sample is older than that (a scrape gap, as Prometheus's lookback
    window would see it).
    """
    _ensure_series_is_valid(s)
    grid = grid_of(interval_s=interval_s, start_s=start_s, end_s=end_s)
    last = np.searchsorted(s.t_s, grid, side="right") - 1
    out: list[float | None] = []
    for point_s, i in zip(grid.tolist(), last.tolist(), strict=True):
        if i < 0 or (max_age_s is not None and point_s - float(s.t_s[i]) > max_age_s):
            out.append(None)
        else:
            out.append(float(s.values[i]))
    return out


def _same(a: float, b: float) -> bool:
    """Equal as float64 values, down to the sign of zero."""
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def _run_end(values: Sequence[float | None], i: int, a: float) -> tuple[int, float]:
    """End (exclusive) and step of the longest run from ``i`` that promtool notation can expand.

    promtool expands ``a+bxN`` by repeated float64 addition (a, a+b, (a+b)+b, ...) and ``axN``
    by repeating ``a``; a run only counts if that expansion reproduces every value exactly.
    """
    n = len(values)
    nxt = values[i + 1] if i + 1 < n else None
    if nxt is None or not math.isfinite(nxt):
        return i + 1, 0.0
    step = nxt - a
    j = i + 1
    if step == 0:
        while j < n and (v := values[j]) is not None and _same(v, a):
            j += 1
        return j, 0.0
    if not math.isfinite(step):
        return i + 1, 0.0
    current = a
    while j < n and (v := values[j]) is not None and math.isfinite(v) and _same(current + step, v):
        current = current + step
        j += 1
    return j, step


def compress_values(values: Sequence[float | None]) -> str:
    """promtool's expanding notation for a sequence of samples (``None`` = missing).

    Emits ``axN`` for constant runs, ``a+bxN`` / ``a-bxN`` for arithmetic runs (N + 1 values,
    as promtool counts), ``_xN`` for N missing samples, and single values otherwise. NaN and
    infinities are never folded into a run: promtool lexes ``Infx3`` as one word.
    """
    terms: list[str] = []
    i = 0
    n = len(values)
    while i < n:
        v = values[i]
        if v is None:
            j = i
            while j < n and values[j] is None:
                j += 1
            terms.append("_" if j - i == 1 else f"_x{j - i}")
            i = j
            continue
        if not math.isfinite(v):
            terms.append(_format_promtool_value(v))
            i += 1
            continue
        j, step = _run_end(values, i, v)
        length = j - i
        if step == 0 and length >= 2:
            terms.append(f"{_format_finite(v)}x{length - 1}")
            i = j
        elif step != 0 and length >= 3:
            sign = "+" if step > 0 else "-"
            terms.append(f"{_format_finite(v)}{sign}{_format_finite(abs(step))}x{length - 1}")
            i = j
        else:
            terms.append(_format_finite(v))
            i += 1
    return " ".join(terms)


def to_promtool_input_series(
    series: Sequence[Series],
    *,
    interval_s: float,
    start_s: float,
    end_s: float,
    max_age_s: float | None = None,
) -> str:
    """YAML for a promtool test's ``input_series:`` list, one entry per series.

    The series are resampled onto the grid ``start_s, start_s + interval_s, ... <= end_s``;
    grid point k is promtool's time ``k * interval`` (so the test's interval must be
    ``interval_s``). Missing samples (see ``resample``) are written ``_``.
    """
    ensure_window_is_valid(interval_s=interval_s, start_s=start_s, end_s=end_s)
    ensure_series_are_valid(series)
    entries = [
        {
            "series": series_selector(s),
            "values": compress_values(
                resample(
                    s, interval_s=interval_s, start_s=start_s, end_s=end_s, max_age_s=max_age_s
                )
            ),
        }
        for s in series
    ]
    return _dump_yaml(entries)


def promtool_test_file(
    input_series_yaml: str,
    *,
    rule_files: Sequence[str],
    interval_s: float,
    alert_rule_tests: Sequence[Mapping[str, object]] | None = None,
    evaluation_interval_s: float | None = None,
) -> str:
    """A whole ``promtool test rules`` file with one test group over ``input_series_yaml``.

    Rules are evaluated every ``evaluation_interval_s`` (default: the sample interval).
    """
    try:
        input_series = yaml.safe_load(input_series_yaml)
    except yaml.YAMLError as exc:
        raise ExportError(f"input_series is not valid YAML: {exc}") from exc
    if input_series is None:
        input_series = []
    if not isinstance(input_series, list):
        raise ExportError("input_series must be a YAML list")
    group: dict[str, object] = {
        "interval": promtool_duration(interval_s),
        "input_series": input_series,
    }
    if alert_rule_tests:
        group["alert_rule_test"] = [dict(t) for t in alert_rule_tests]  # promtool's key
    document: dict[str, object] = {
        "rule_files": list(rule_files),
        "evaluation_interval": promtool_duration(
            interval_s if evaluation_interval_s is None else evaluation_interval_s
        ),
        "tests": [group],
    }
    return _dump_yaml(document)


def _dump_yaml(document: object) -> str:
    try:
        # A wide line keeps each values string on one line; it would be folded at 80 otherwise.
        return yaml.safe_dump(
            document, sort_keys=False, allow_unicode=True, default_flow_style=False, width=2**30
        )
    except yaml.YAMLError as exc:
        raise ExportError(f"cannot write YAML: {exc}") from exc


# -- families -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Family(Generic[N]):
    """Series that expose as one metric family, in exposition order."""

    name: str
    kind: Kind
    members: tuple[N, ...]


_HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def _role(name: str) -> tuple[str, str]:
    """(family name, role) for a series name by exporter convention."""
    for suffix in ("_total", *_HISTOGRAM_SUFFIXES):
        base = name.removesuffix(suffix)
        if base != name and base:
            return base, suffix
    return name, ""


def _canonical_bound(s: Named, key: str) -> tuple[float, str]:
    """A bucket's ``le`` (or a summary's ``quantile``) as a float and in canonical text."""
    text = s.label(key)
    if not any(k == key for k, _ in s.labels):
        raise ExportError(f"series {series_selector(s)} has no '{key}' label")
    try:
        bound = float(text)
    except ValueError as exc:
        raise ExportError(f"series {series_selector(s)}: '{key}' is not a number") from exc
    if math.isnan(bound):
        raise ExportError(f"series {series_selector(s)}: '{key}' is NaN")
    if math.isinf(bound):
        return bound, "+Inf" if bound > 0 else "-Inf"
    # OpenMetrics wants floats in canonical form: "1.0", not "1".
    return bound, repr(bound)


def _without(labels: Labels, key: str) -> Labels:
    return tuple((k, v) for k, v in labels if k != key)


def _families(series: Sequence[N]) -> list[_Family[N]]:
    by_family: dict[str, list[tuple[str, N]]] = {}
    for s in series:
        base, role = _role(s.name)
        by_family.setdefault(base, []).append((role, s))
    families: list[_Family[N]] = []
    for name in sorted(by_family):
        roles = {role for role, _ in by_family[name]}
        members = [s for _, s in by_family[name]]
        kind: Kind
        if roles == {"_total"}:
            kind = "counter"
        elif roles == {""}:
            kind = "gauge"
        elif "_bucket" in roles and roles <= set(_HISTOGRAM_SUFFIXES):
            kind = "histogram"
        elif roles <= {"_count", "_sum", ""} and all(
            any(k == "quantile" for k, _ in s.labels) for r, s in by_family[name] if r == ""
        ):
            kind = "summary"
        else:
            names = sorted({s.name for s in members})
            raise ExportError(f"series {names} claim the same metric family '{name}'")
        families.append(_Family(name, kind, tuple(sorted(members, key=_order_key(name, kind)))))
    return families


def _order_key(name: str, kind: Kind) -> Callable[[Named], tuple[Labels, int, float]]:
    bound_key = {"histogram": "le", "summary": "quantile"}.get(kind)
    rank = {"_bucket": 0, "": 0, "_count": 1, "_sum": 2}

    def key(s: Named) -> tuple[Labels, int, float]:
        if bound_key is None:
            return s.labels, 0, 0.0
        role = s.name.removeprefix(name)
        if role in ("_bucket", ""):
            return _without(s.labels, bound_key), 0, _canonical_bound(s, bound_key)[0]
        return s.labels, rank[role], 0.0

    return key


def _exposed_labels(family: _Family[N], s: N) -> Labels:
    """The series' labels with ``le`` / ``quantile`` rewritten in canonical form."""
    bound_key = {"histogram": "le", "summary": "quantile"}.get(family.kind)
    if bound_key is None or s.name.removeprefix(family.name) not in ("_bucket", ""):
        return s.labels
    text = _canonical_bound(s, bound_key)[1]
    return tuple((k, text if k == bound_key else v) for k, v in s.labels)


def _group_of(family: _Family[N], s: N) -> Labels:
    """Labels shared by the samples that form one histogram/summary point."""
    if family.kind == "histogram":
        return _without(s.labels, "le")
    if family.kind == "summary":
        return _without(s.labels, "quantile")
    return s.labels


def _ensure_openmetrics_value(s: Named, value: float) -> None:
    role = _role(s.name)[1]
    if role and math.isnan(value):
        raise ExportError(f"series {series_selector(s)}: counter-like sample is NaN")
    if role in ("_total", "_count", "_bucket") and value < 0:
        raise ExportError(f"series {series_selector(s)}: counter-like sample {value} < 0")
    if role in ("_count", "_bucket") and not value.is_integer():
        raise ExportError(f"series {series_selector(s)}: count {value} is not an integer")


# -- OpenMetrics and the classic text format ----------------------------------------------------


def _last_at_or_before(s: Series, at_s: float | None) -> int | None:
    if s.t_s.size == 0:
        return None
    if at_s is None:
        return int(s.t_s.size - 1)
    i = int(np.searchsorted(s.t_s, at_s, side="right")) - 1
    return None if i < 0 else i


def _sample_line(head: str, value: float, timestamp_s: float | None) -> str:
    line = f"{head} {_format_exposition_value(value)}"
    if timestamp_s is not None:
        line += f" {timestamp_s!r}"
    return line + "\n"


def to_openmetrics(
    series: Sequence[Series],
    *,
    at_s: float | None = None,
    epoch_s: float = 0.0,
    with_timestamps: bool = True,
) -> str:
    """OpenMetrics 1.0 text exposition, ending in ``# EOF``.

    With ``at_s`` None every sample is written, timestamped ``epoch_s + t_s`` (seconds); with
    ``at_s`` only each series' last sample at or before it, as a scrape would see it (written by
    ``prometheus_client``). Histogram points are written whole (buckets by ``le``, then
    ``_count``, ``_sum``) per labels and timestamp, as the format asks.
    """
    if at_s is None and not with_timestamps:
        raise ExportError("several samples per series need timestamps: give at_s or timestamps")
    ensure_series_are_valid(series)
    if at_s is not None:
        metrics = _scrape_metrics(
            series, at_s=at_s, epoch_s=epoch_s if with_timestamps else None, openmetrics=True
        )
        # ALLOWUTF8: the default escaping rewrites the colon of vLLM's names in OpenMetrics
        # sample lines (``vllm_num_requests_waiting``); the names are valid as they are.
        text: bytes = generate_openmetrics(  # type: ignore[no-untyped-call]
            _Collected(metrics), escaping=ALLOWUTF8
        )
        return text.decode("utf-8")
    out: list[str] = []
    for family in _families(series):
        lines: list[str] = []
        heads = {id(s): s.name + _render_labels(_exposed_labels(family, s)) for s in family.members}
        for group in _groups(family):
            for t_s, s, value in _merged_samples(group):
                _ensure_openmetrics_value(s, value)
                lines.append(_sample_line(heads[id(s)], value, epoch_s + t_s))
        if lines:
            out.append(f"# TYPE {family.name} {family.kind}\n")
            out.extend(lines)
    out.append("# EOF\n")
    return "".join(out)


def _groups(family: _Family[N]) -> list[list[N]]:
    """Members split into consecutive runs that share a histogram/summary group."""
    groups: list[list[N]] = []
    last: Labels | None = None
    for s in family.members:
        g = _group_of(family, s)
        if not groups or g != last:
            groups.append([])
        groups[-1].append(s)
        last = g
    return groups


def _merged_samples(group: Sequence[Series]) -> list[tuple[float, Series, float]]:
    """(t_s, series, value) of a group by time, members in exposition order at each time."""
    rows = [
        (float(t), rank, s, float(v))
        for rank, s in enumerate(group)
        for t, v in zip(s.t_s.tolist(), s.values.tolist(), strict=True)
    ]
    rows.sort(key=lambda row: (row[0], row[1]))
    return [(t, s, v) for t, _, s, v in rows]


def to_prometheus_text(series: Sequence[Series], *, at_s: float | None = None) -> str:
    """The classic text format 0.0.4 a ``/metrics`` endpoint serves: each series' last sample at
    or before ``at_s`` (the latest if None), no timestamps, ``# HELP`` and ``# TYPE`` per family.

    Written by ``prometheus_client``, except counters whose real name lacks ``_total``
    (dcgm-exporter's): ``prometheus_client`` would rename them, so they are written as
    dcgm-exporter writes them.
    """
    ensure_series_are_valid(series)
    metrics = _scrape_metrics(series, at_s=at_s, epoch_s=None, openmetrics=False)
    plain = [m for m in metrics if not isinstance(m, _SuffixlessCounter)]
    out = generate_latest(_Collected(plain)).decode("utf-8")
    for m in metrics:
        if isinstance(m, _SuffixlessCounter):
            out += m.render()
    return out


# -- streamed exports ---------------------------------------------------------------------------
#
# A day of a 10,000-node fleet is some 115 million samples, 15 GB of OpenMetrics text: the text
# cannot be built in memory, so these writers yield it piece by piece, in the same bytes as
# ``to_openmetrics`` / ``to_promtool_input_series`` would return for the same series. OpenMetrics
# wants a family's samples contiguous, so the layout is family-major, as there: each family's
# series are read (``SeriesSource.samples``) one histogram point group at a time and written in
# chunks of ``chunk_samples`` timestamps, so what is held at once is one group's samples and one
# chunk's text, whatever the run's length and the fleet's size.

_CHUNK_SAMPLES = 2048


@dataclass(frozen=True)
class _Eager:
    """A ``Series`` as a ``SeriesSource``."""

    series: Series

    @property
    def name(self) -> str:
        return self.series.name

    @property
    def labels(self) -> Labels:
        return self.series.labels

    def label(self, key: str) -> str:
        return self.series.label(key)

    def samples(self) -> tuple[F64, npt.NDArray[np.floating]]:
        return self.series.t_s, self.series.values


def as_sources(series: Iterable[Series]) -> list[SeriesSource]:
    """In-memory series as sources for the streamed writers."""
    return [_Eager(s) for s in series]


def family_of(series_name: str) -> str:
    """The metric family a series name belongs to (``x_bucket`` -> ``x``, ``y_total`` -> ``y``)."""
    return _role(series_name)[0]


def select_families(
    available: Iterable[str], patterns: Sequence[str], *, known: Iterable[str] = ()
) -> set[str]:
    """The families (see ``family_of``) that ``patterns`` select among the series names
    ``available``.

    A pattern is a family or series name or a shell glob over them (``vllm:*``,
    ``DCGM_FI_DEV_*``); naming one series of a family selects the whole family, so a histogram
    is never exported without its buckets. A pattern that selects nothing in ``available`` or in
    ``known`` (families the twin may write later in a run) is an ``ExportError``.
    """
    names = set(available)
    families = {family_of(n) for n in names}
    later = set(known)
    selected: set[str] = set()
    for pattern in patterns:
        hits = {
            family_of(n)
            for n in names
            if fnmatchcase(n, pattern) or fnmatchcase(family_of(n), pattern)
        }
        maybe = {f for f in later if fnmatchcase(f, pattern) or fnmatchcase(family_of(f), pattern)}
        if not hits and not maybe:
            near = difflib.get_close_matches(pattern, sorted(families), n=5, cutoff=0.6)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise ExportError(
                f"no metric family matches {pattern!r} (the run has {len(families)}, e.g. "
                f"{', '.join(sorted(families)[:3])}){hint}"
            )
        selected |= hits | {family_of(f) for f in maybe}
    return selected


def stream_openmetrics(
    sources: Sequence[SeriesSource], *, epoch_s: float = 0.0, chunk_samples: int = _CHUNK_SAMPLES
) -> Iterator[str]:
    """``to_openmetrics(series)`` (every sample, timestamped ``epoch_s + t_s``), piece by piece.

    Names and labels are checked before the first piece; samples as their group is written, so
    an error may come after some pieces (write them somewhere that can be thrown away).
    """
    if chunk_samples < 1:
        raise ExportError(f"chunk_samples must be positive, got {chunk_samples}")
    _ensure_names_are_valid(sources)
    stamps = _Stamps(epoch_s)
    for family in _families(sources):
        typed = False
        for group in _groups(family):
            for text in _group_text(family, group, stamps, chunk_samples):
                if not typed:
                    yield f"# TYPE {family.name} {family.kind}\n"
                    typed = True
                yield text
    yield "# EOF\n"


class _Stamps:
    """Timestamp texts of a chunk, reused while consecutive groups share their sample times
    (every dense series of a store does)."""

    def __init__(self, epoch_s: float) -> None:
        self.epoch_s = epoch_s
        self._key: tuple[F64, int, int] | None = None
        self._text: list[str] = []

    def text(self, t_s: F64, lo: int, hi: int) -> list[str]:
        key = self._key
        if key is None or key[0] is not t_s or key[1] != lo or key[2] != hi:
            self._text = [repr(x) for x in (self.epoch_s + t_s[lo:hi]).tolist()]
            self._key = (t_s, lo, hi)
        return self._text


def _loaded(s: SeriesSource) -> tuple[F64, F64]:
    t_s, values = s.samples()
    _ensure_samples_are_valid(s.name, t_s, values)
    return np.asarray(t_s, dtype=np.float64), np.asarray(values, dtype=np.float64)


def _group_text(
    family: _Family[SeriesSource], group: Sequence[SeriesSource], stamps: _Stamps, chunk: int
) -> Iterator[str]:
    heads = [s.name + _render_labels(_exposed_labels(family, s)) for s in group]
    loaded = [_loaded(s) for s in group]
    t0 = loaded[0][0]
    if not all(t is t0 or np.array_equal(t, t0) for t, _ in loaded[1:]):
        yield from _merged_text(group, heads, loaded, stamps.epoch_s, chunk)
        return
    for lo in range(0, t0.size, chunk):
        hi = min(lo + chunk, t0.size)
        columns = [values[lo:hi] for _, values in loaded]
        for s, values in zip(group, columns, strict=True):
            if _has_bad_openmetrics_value(s, values):
                for j in range(hi - lo):  # the first bad sample in output order raises
                    for s2, v2 in zip(group, columns, strict=True):
                        _ensure_openmetrics_value(s2, float(v2[j]))
        ts = stamps.text(t0, lo, hi)
        texts = [_format_values(v) for v in columns]
        if len(group) == 1:
            head = heads[0]
            yield "".join([f"{head} {v} {t}\n" for v, t in zip(texts[0], ts, strict=True)])
        else:
            pairs = list(zip(heads, texts, strict=True))
            yield "".join([f"{h} {vs[j]} {t}\n" for j, t in enumerate(ts) for h, vs in pairs])


def _merged_text(
    group: Sequence[SeriesSource],
    heads: Sequence[str],
    loaded: Sequence[tuple[F64, F64]],
    epoch_s: float,
    chunk: int,
) -> Iterator[str]:
    """A group whose series do not share their sample times, merged by time as the format
    asks (members in exposition order at each time)."""
    rows = sorted(
        (float(t), rank, float(v))
        for rank, (t_s, values) in enumerate(loaded)
        for t, v in zip(t_s.tolist(), values.tolist(), strict=True)
    )
    for lo in range(0, len(rows), chunk):
        lines: list[str] = []
        for t, rank, v in rows[lo : lo + chunk]:
            _ensure_openmetrics_value(group[rank], v)
            lines.append(_sample_line(heads[rank], v, epoch_s + t))
        yield "".join(lines)


def _has_bad_openmetrics_value(s: Named, values: F64) -> bool:
    """Whether ``_ensure_openmetrics_value`` would refuse any of ``values`` (vectorised)."""
    role = _role(s.name)[1]
    if not role:
        return False
    bad = np.isnan(values)
    if role in ("_total", "_count", "_bucket"):
        bad |= values < 0
    if role in ("_count", "_bucket"):
        bad |= ~np.isfinite(values) | (values != np.floor(values))
    return bool(bad.any())


def _format_values(values: F64) -> list[str]:
    """``_format_exposition_value`` of each value; integers (the common case) vectorised."""
    if values.size and bool(
        np.all(np.isfinite(values))
        and np.all(values == np.trunc(values))
        and np.all(np.abs(values) < _EXACT_INT_LIMIT)
        and not np.any(np.signbit(values) & (values == 0))
    ):
        return [str(x) for x in values.astype(np.int64).tolist()]
    return [_format_exposition_value(x) for x in values.tolist()]


def stream_promtool_input_series(
    sources: Sequence[SeriesSource],
    *,
    interval_s: float,
    start_s: float,
    end_s: float,
    max_age_s: float | None = None,
) -> Iterator[str]:
    """``to_promtool_input_series`` piece by piece: one YAML list entry per series, each series
    read only when its entry is written."""
    ensure_window_is_valid(interval_s=interval_s, start_s=start_s, end_s=end_s)
    _ensure_names_are_valid(sources)
    if not sources:
        yield _dump_yaml([])
        return
    for s in sources:
        t_s, values = _loaded(s)
        series = Series(s.name, s.labels, t_s, values)
        entry = {
            "series": series_selector(series),
            "values": compress_values(
                resample(
                    series, interval_s=interval_s, start_s=start_s, end_s=end_s, max_age_s=max_age_s
                )
            ),
        }
        yield _dump_yaml([entry])


# -- what a scrape sees, through prometheus_client ------------------------------------------------


class _Collected(Collector):
    """A prometheus_client collector over metric families built for one scrape."""

    def __init__(self, metrics: Sequence[Metric]) -> None:
        self._metrics = list(metrics)

    def collect(self) -> Iterator[Metric]:
        return iter(self._metrics)


class _SuffixlessCounter(Metric):
    """A counter whose real name has no ``_total`` (dcgm-exporter's), written as its exporter
    writes it in the classic format."""

    def render(self) -> str:
        doc = self.documentation.replace("\\", r"\\").replace("\n", r"\n")
        lines = [f"# HELP {self.name} {doc}\n", f"# TYPE {self.name} counter\n"]
        for s in self.samples:
            inner = ",".join(f'{k}="{_escape_label_value(v)}"' for k, v in sorted(s.labels.items()))
            head = s.name + ("{" + inner + "}" if inner else "")
            lines.append(_sample_line(head, float(s.value), None))
        return "".join(lines)


def _catalog(
    vllm_version: str = VLLM_DEFAULT_VERSION, dcgm_version: str = DCGM_DEFAULT_VERSION
) -> dict[str, MetricFamily]:
    out: dict[str, MetricFamily] = {}
    for cat in (vllm_catalog(vllm_version), dcgm_catalog(dcgm_version), KUBE_STATE_METRICS):
        for f in cat.families:
            out[f.name] = f
    return out


_CATALOG = _catalog()


def exporter_series_names() -> frozenset[str]:
    """Every family name the reference's exporters publish (vLLM, dcgm-exporter,
    kube-state-metrics), whether or not a twin run writes it."""
    return frozenset(_CATALOG)


def _real_family(family: _Family[Series]) -> MetricFamily | None:
    for name in (family.name, family.name + "_total", *(s.name for s in family.members[:1])):
        found = _CATALOG.get(name)
        if found is not None:
            return found
    return None


def _help(family: _Family[Series], real: MetricFamily | None) -> str:
    if real is not None:
        return real.help
    return f"{family.name}: a series of the firedrill twin (no exporter of the reference emits it)."


def _scrape_metrics(
    series: Sequence[Series], *, at_s: float | None, epoch_s: float | None, openmetrics: bool
) -> list[Metric]:
    """One prometheus_client family per metric family: each series' last sample at ``at_s``."""
    out: list[Metric] = []
    for family in _families(series):
        real = _real_family(family)
        doc = _help(family, real)
        suffixless = (
            real is not None
            and real.kind == "counter"
            and not any(m.name.endswith("_total") for m in family.members)
        )
        metric: Metric
        if suffixless:
            # OpenMetrics has no counter without _total: there it is an unknown-typed family.
            metric = (
                UnknownMetricFamily(family.name, doc)
                if openmetrics
                else _SuffixlessCounter(family.name, doc, "counter")
            )
        elif family.kind == "counter":
            metric = CounterMetricFamily(family.name, doc)
        elif family.kind == "histogram":
            metric = HistogramMetricFamily(family.name, doc)
        elif family.kind == "summary":
            metric = SummaryMetricFamily(family.name, doc)
        else:
            metric = GaugeMetricFamily(family.name, doc)
        for s in family.members:
            i = _last_at_or_before(s, at_s)
            if i is None:
                continue
            value = float(s.values[i])
            if openmetrics:
                _ensure_openmetrics_value(s, value)
            stamp = None if epoch_s is None else epoch_s + float(s.t_s[i])
            labels = dict(_exposed_labels(family, s))
            metric.add_sample(s.name, labels, value, timestamp=stamp)
        if metric.samples:
            out.append(metric)
    return out


def exporter_labels(series: Sequence[Series]) -> list[Series]:
    """The series with the labels their real exporters write and the twin leaves out.

    vLLM's engine series get ``engine="0"`` (one engine per pod in the twin); dcgm-exporter's get
    ``device`` (``nvidia<gpu>``), a stable ``UUID`` and ``pci_bus_id`` derived from the node and
    GPU index. Labels a series already has are kept.
    """
    out: list[Series] = []
    for s in series:
        have = {k for k, _ in s.labels}
        extra: dict[str, str] = {}
        if s.name.startswith("vllm:") and "engine" not in have:
            extra["engine"] = "0"
        elif s.name.startswith("DCGM_") and "gpu" in have:
            gpu = s.label("gpu")
            host = s.label("Hostname") or s.label("hostname")
            digest = hashlib.sha256(f"{host}/{gpu}".encode()).hexdigest()
            extra = {
                "device": f"nvidia{gpu}",
                "UUID": "GPU-"
                + "-".join((digest[:8], digest[8:12], digest[12:16], digest[16:20], digest[20:32])),
                "pci_bus_id": f"00000000:{0x18 + int(gpu) if gpu.isdigit() else 0:02X}:00.0",
            }
            extra = {k: v for k, v in extra.items() if k not in have}
        if extra:
            labels = tuple(sorted((*s.labels, *extra.items())))
            out.append(Series(s.name, labels, s.t_s, s.values))
        else:
            out.append(s)
    return out
