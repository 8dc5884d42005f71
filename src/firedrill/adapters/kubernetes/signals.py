"""The controller's reader of DCGM series: the ``Signals`` port over Prometheus's HTTP API.

The remediation controller only needs ``instant``: the latest value of each
``DCGM_FI_DEV_XID_ERRORS`` / ECC / row-remap / PCIe / temperature series, labelled ``Hostname``
and ``gpu`` as dcgm-exporter labels them. ``query`` (a range) and ``series_names`` are here so the
object is a whole ``Signals``; the full Prometheus adapter (alerts, PromQL toolbox) lives
elsewhere and can replace this one wherever both are installed. Times are seconds since the
reader's ``epoch`` (the controller's start), as everywhere in the control plane.

Errors are the adapter's: an unreachable or failing Prometheus is a ``KubernetesError``-like
``SignalsError`` (a ``RemoteWorldError``), never an empty answer that would read as "healthy".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt

from firedrill.errors import RemoteWorldError
from firedrill.model.series import Labels, Series

__all__ = ["PrometheusSignals", "SignalsError"]


class SignalsError(RemoteWorldError):
    """Prometheus could not be reached or refused a query."""


def _selector(name: str, matchers: Mapping[str, str] | None) -> str:
    if not matchers:
        return name
    terms = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in sorted(matchers.items())
    )
    return f"{name}{{{terms}}}"


def _labels(metric: Mapping[str, str]) -> Labels:
    return tuple(sorted((k, v) for k, v in metric.items() if k != "__name__"))


class PrometheusSignals:
    """``Signals`` on a Prometheus server (``/api/v1/query``, ``query_range``, label values)."""

    def __init__(
        self,
        url: str,
        *,
        now: Callable[[], datetime],
        epoch: datetime,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = 10.0,
        step_s: float = 15.0,
    ) -> None:
        self.http = httpx.Client(base_url=url, transport=transport, timeout=timeout_s)
        self.now = now
        self.epoch = epoch
        self.step_s = step_s

    def _get(self, path: str, params: dict[str, str]) -> Any:
        try:
            resp = self.http.get(path, params=params)
        except httpx.TransportError as exc:
            raise SignalsError(f"prometheus unreachable: {exc}") from exc
        try:
            body = resp.json()
        except ValueError as exc:
            raise SignalsError(f"prometheus {path}: not JSON", status=resp.status_code) from exc
        if resp.status_code != 200 or body.get("status") != "success":
            raise SignalsError(
                f"prometheus {path}: {body.get('errorType', '')} {body.get('error', '')}".strip(),
                status=resp.status_code,
            )
        return body["data"]

    def _abs(self, t_s: float) -> float:
        return self.epoch.timestamp() + t_s

    def _rel(self, unix_s: float) -> float:
        return unix_s - self.epoch.timestamp()

    def series_names(self) -> Sequence[str]:
        data = self._get("/api/v1/label/__name__/values", {})
        return sorted(str(n) for n in data)

    def query(
        self,
        name: str,
        matchers: Mapping[str, str] | None = None,
        *,
        start_s: float,
        end_s: float,
    ) -> Sequence[Series]:
        data = self._get(
            "/api/v1/query_range",
            {
                "query": _selector(name, matchers),
                "start": f"{self._abs(start_s):.3f}",
                "end": f"{self._abs(end_s):.3f}",
                "step": f"{self.step_s:g}",
            },
        )
        out = []
        for r in data.get("result", []):
            t = np.array([self._rel(float(ts)) for ts, _ in r["values"]], dtype=np.float64)
            v = np.array([float(x) for _, x in r["values"]], dtype=np.float64)
            out.append(Series(name, _labels(r["metric"]), t, v))
        return sorted(out, key=lambda s: s.labels)

    def instant(
        self, name: str, matchers: Mapping[str, str] | None = None
    ) -> tuple[float, Sequence[Labels], npt.NDArray[np.float64]]:
        at = self.now().timestamp()
        data = self._get("/api/v1/query", {"query": _selector(name, matchers), "time": f"{at:.3f}"})
        if data.get("resultType") != "vector":
            raise SignalsError(f"prometheus: {name} is a {data.get('resultType')}, not a vector")
        rows = sorted((_labels(r["metric"]), float(r["value"][1])) for r in data["result"])
        values = np.array([v for _, v in rows], dtype=np.float64)
        return self._rel(at), [lab for lab, _ in rows], values
