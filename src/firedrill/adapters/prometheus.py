"""``PrometheusSignals``: the Signals port over a real Prometheus's HTTP API.

On a real fleet the series the control plane reads (burn rates, KV usage, Ready nodes) live in
Prometheus, not in the twin. This adapter answers the same ``Signals`` questions the twin does
through ``/api/v1/query`` (an instant vector), ``/api/v1/query_range`` (a matrix) and
``/api/v1/label/__name__/values`` (the series names), and offers ``vector``/``matrix`` for
PromQL the port's name-and-matchers shape cannot say (a burn rate is a ratio of two sums).

Times: the port speaks seconds since the run's epoch; Prometheus speaks Unix seconds.
``epoch_unix_s`` maps one onto the other (0, the default, makes the run's seconds Unix seconds,
which is what the wall clock in ``adapters/clock.py`` reads). A fleet whose time runs faster
than the wall's (a twin served at ``--speed 60``) passes a ``TimeMap`` instead: query times and
steps are converted to wall seconds on the way out, and every sample's Unix timestamp back to the
run's seconds on the way in, so rates, windows and quantiles computed over the answers see the
fleet's time. A sample then stands for the fleet's state at its scrape, known to one scrape
interval (scaled: 0.5 s of wall at 60x is 30 s of the twin's time).

Errors (``firedrill.errors``), always chained ``from`` the transport's exception:

- ``SignalsUnavailable``: no connection, a timeout, or a 5xx, after ``retries`` attempts spaced
  by exponential back-off (``backoff_s`` × 2^n, capped at ``max_backoff_s``); a 503 or 429 with
  ``Retry-After`` waits what the server asked, within the same cap;
- ``BadQueryError``: Prometheus refused the query (HTTP 400/422, ``errorType`` ``bad_data``),
  or its answer is not the JSON the API documents. Never retried.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpx
import numpy as np
import numpy.typing as npt

from firedrill.adapters.clock import TimeMap
from firedrill.errors import BadQueryError, SignalsUnavailable
from firedrill.model.series import Labels, Series, label_value

__all__ = ["PrometheusSignals", "Sample", "selector"]

DEFAULT_TIMEOUT_S: Final = 10.0  # seconds, per attempt
DEFAULT_RETRIES: Final = 3  # attempts in all
DEFAULT_STEP_S: Final = 15.0  # query_range resolution, seconds
MAX_POINTS: Final = 11_000  # Prometheus refuses a range with more points per series
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selector(name: str, matchers: Mapping[str, str] | None = None) -> str:
    """``name{k="v",...}`` with values escaped; names are checked, never interpolated raw."""
    if not _METRIC_NAME.match(name):
        raise BadQueryError(f"not a metric name: {name!r}", url="")
    parts = []
    for key, value in sorted((matchers or {}).items()):
        if not _LABEL_NAME.match(key):
            raise BadQueryError(f"not a label name: {key!r}", url="")
        parts.append(f"{key}={_quote(value)}")
    return f"{name}{{{','.join(parts)}}}" if parts else name


@dataclass(frozen=True)
class Sample:
    """One element of an instant vector: its labels (``__name__`` included) and value."""

    labels: Labels
    value: float

    def label(self, key: str) -> str:
        return label_value(self.labels, key)


def _labels(raw: object) -> Labels:
    if not isinstance(raw, dict):
        raise ValueError(f"a metric is an object of labels, got {raw!r}")
    return tuple(sorted((str(k), str(v)) for k, v in raw.items()))


def _value(raw: object) -> tuple[float, float]:
    if not isinstance(raw, list) or len(raw) != 2:
        raise ValueError(f"a sample is [time, value], got {raw!r}")
    return float(raw[0]), float(raw[1])  # "NaN", "+Inf" parse as floats


class PrometheusSignals:
    """The Signals port (and raw PromQL) over the Prometheus at ``url``."""

    def __init__(
        self,
        url: str,
        *,
        epoch_unix_s: float = 0.0,
        time_map: TimeMap | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        step_s: float = DEFAULT_STEP_S,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        now_unix_s: Callable[[], float] = time.time,
    ) -> None:
        parts = httpx.URL(url)
        if parts.scheme not in ("http", "https") or not parts.host:
            raise BadQueryError(f"a Prometheus URL is http(s)://HOST:PORT, got {url!r}", url=url)
        if retries < 1 or timeout_s <= 0 or step_s <= 0:
            raise ValueError("retries >= 1, timeout_s > 0 and step_s > 0")
        self.url = url.rstrip("/")
        # run seconds <-> Unix seconds; ``epoch_unix_s`` alone is the map at the wall's speed
        self.time_map = time_map or TimeMap(anchor_unix_s=epoch_unix_s)
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.step_s = step_s
        self._sleep = sleep
        self._now = now_unix_s
        self._client = httpx.Client(
            base_url=self.url,
            timeout=httpx.Timeout(timeout_s),
            headers=dict(headers or {}),
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"PrometheusSignals({self.url!r})"

    @property
    def epoch_unix_s(self) -> float:
        """The Unix second at which the run's time was 0."""
        return self.time_map.epoch_unix_s

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> PrometheusSignals:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the HTTP API ---------------------------------------------------------------------------

    def _get(self, path: str, params: Mapping[str, str]) -> Any:
        """The ``data`` of a successful API answer, retried and mapped to firedrill's errors."""
        what = f"{self.url}{path}"
        delay = self.backoff_s
        for attempt in range(1, self.retries + 1):
            last = attempt == self.retries
            try:
                response = self._client.get(path, params=params)
            except httpx.TimeoutException as exc:
                if last:
                    raise SignalsUnavailable(
                        f"Prometheus at {self.url} timed out ({path}) after {attempt} attempt(s)",
                        url=self.url,
                    ) from exc
            except httpx.TransportError as exc:
                if last:
                    raise SignalsUnavailable(
                        f"cannot reach Prometheus at {self.url} ({type(exc).__name__}: {exc}) "
                        f"after {attempt} attempt(s)",
                        url=self.url,
                    ) from exc
            else:
                status = response.status_code
                if status < 400:
                    return self._data(what, response)
                if status in (429,) or status >= 500:
                    if last:
                        raise SignalsUnavailable(
                            f"Prometheus at {self.url} answered {status} to {path} after "
                            f"{attempt} attempt(s): {self._error(response)}",
                            url=self.url,
                            status=status,
                        )
                    asked = _retry_after_s(response.headers.get("Retry-After"))
                    if asked is not None:
                        delay = max(delay, asked)
                else:
                    raise BadQueryError(
                        f"Prometheus refused {path} ({status}): {self._error(response)}",
                        url=self.url,
                        status=status,
                    )
            self._sleep(min(delay, self.max_backoff_s))
            delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def _error(self, response: httpx.Response) -> str:
        try:
            body = response.json()
        except ValueError:
            return response.text[:200] or response.reason_phrase
        if isinstance(body, dict) and "error" in body:
            return f"{body.get('errorType', 'error')}: {body['error']}"
        return response.text[:200]

    def _data(self, what: str, response: httpx.Response) -> Any:
        try:
            body = response.json()
        except ValueError as exc:
            raise BadQueryError(
                f"{what} did not answer JSON: {response.text[:120]!r}",
                url=self.url,
                status=response.status_code,
            ) from exc
        if not isinstance(body, dict) or body.get("status") != "success" or "data" not in body:
            raise BadQueryError(
                f"{what} did not answer success: {str(body)[:200]}",
                url=self.url,
                status=response.status_code,
            )
        return body["data"]

    # --- raw PromQL ------------------------------------------------------------------------------

    def vector(self, promql: str, *, at_s: float | None = None) -> list[Sample]:
        """The instant vector ``promql`` evaluates to (now, or at run second ``at_s``)."""
        params = {"query": promql}
        if at_s is not None:
            params["time"] = f"{self.time_map.unix_s(at_s):.3f}"
        data = self._get("/api/v1/query", params)
        try:
            kind = data["resultType"]
            if kind == "scalar":
                return [Sample((), _value(data["result"])[1])]
            if kind != "vector":
                raise ValueError(f"expected a vector, got {kind}")
            return [Sample(_labels(r["metric"]), _value(r["value"])[1]) for r in data["result"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise BadQueryError(f"unexpected answer to {promql!r}: {exc}", url=self.url) from exc

    def matrix(
        self, promql: str, *, start_s: float, end_s: float, step_s: float | None = None
    ) -> list[tuple[Labels, npt.NDArray[np.float64], npt.NDArray[np.float64]]]:
        """``promql`` over [start, end] at ``step_s``: (labels, run seconds, values) per series."""
        if not (math.isfinite(start_s) and math.isfinite(end_s)) or end_s < start_s:
            raise BadQueryError(f"bad window [{start_s}, {end_s}]", url=self.url)
        step = step_s or self.step_s
        # Prometheus refuses more than 11,000 points per series: widen the step instead
        step = max(step, (end_s - start_s) / MAX_POINTS)
        tm = self.time_map
        params = {
            "query": promql,
            "start": f"{tm.unix_s(start_s):.3f}",
            "end": f"{tm.unix_s(end_s):.3f}",
            "step": f"{tm.wall_s(step):.6g}",  # Prometheus steps in wall seconds
        }
        return self._matrix(promql, self._get("/api/v1/query_range", params))

    def _matrix(
        self, promql: str, data: Any
    ) -> list[tuple[Labels, npt.NDArray[np.float64], npt.NDArray[np.float64]]]:
        """A matrix answer as (labels, run seconds, values) per series."""
        out = []
        try:
            if data["resultType"] != "matrix":
                raise ValueError(f"expected a matrix, got {data['resultType']}")
            for r in data["result"]:
                pairs = [_value(v) for v in r["values"]]
                t = np.array([self.time_map.run_s(p[0]) for p in pairs], dtype=np.float64)
                v = np.array([p[1] for p in pairs], dtype=np.float64)
                out.append((_labels(r["metric"]), t, v))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadQueryError(f"unexpected answer to {promql!r}: {exc}", url=self.url) from exc
        return out

    def raw(
        self, series: str, *, window_s: float, at_s: float | None = None
    ) -> list[tuple[Labels, npt.NDArray[np.float64], npt.NDArray[np.float64]]]:
        """The samples of a selector (``selector(...)``) as scraped, not resampled, in the
        ``window_s`` run seconds up to ``at_s`` (now): (labels, run seconds, values) per
        series."""
        if not (math.isfinite(window_s) and window_s > 0):
            raise BadQueryError(f"bad window {window_s}", url=self.url)
        wall_ms = max(1, math.ceil(self.time_map.wall_s(window_s) * 1000))
        params = {"query": f"{series}[{wall_ms}ms]"}
        if at_s is not None:
            params["time"] = f"{self.time_map.unix_s(at_s):.3f}"
        return self._matrix(series, self._get("/api/v1/query", params))

    # --- the Signals port ------------------------------------------------------------------------

    def series_names(self) -> Sequence[str]:
        data = self._get("/api/v1/label/__name__/values", {})
        if not isinstance(data, list):
            raise BadQueryError(f"unexpected series names: {str(data)[:120]}", url=self.url)
        return [str(n) for n in data]

    def query(
        self,
        name: str,
        matchers: Mapping[str, str] | None = None,
        *,
        start_s: float,
        end_s: float,
    ) -> Sequence[Series]:
        """Series with this name whose labels equal ``matchers``, sampled in [start, end]."""
        out = []
        for labels, t, v in self.matrix(selector(name, matchers), start_s=start_s, end_s=end_s):
            kept = tuple((k, val) for k, val in labels if k != "__name__")
            out.append(Series(name, kept, t, v))
        return out

    def instant(
        self, name: str, matchers: Mapping[str, str] | None = None
    ) -> tuple[float, Sequence[Labels], npt.NDArray[np.float64]]:
        """The latest sample of each matching series: (run seconds, labels, values)."""
        at_s = self.time_map.run_s(self._now())
        samples = self.vector(selector(name, matchers), at_s=at_s)
        labels = [tuple((k, v) for k, v in s.labels if k != "__name__") for s in samples]
        values = np.array([s.value for s in samples], dtype=np.float64)
        return at_s, labels, values


def _retry_after_s(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (the seconds form; HTTP dates are ignored)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
