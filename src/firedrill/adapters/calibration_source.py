"""Read what ``twin calibrate`` fits from a real Prometheus, over its HTTP API.

The fits (``firedrill.calibrate``) are pure; this adapter asks Prometheus the PromQL that shapes
each series the way a fit takes it (sums by model and cell, rates, a histogram's increase over the
window) and hands back ``Observations``. It reads through ``PrometheusSignals`` (retries, error
mapping) and never writes anything.

Errors: ``SignalsUnavailable`` when Prometheus cannot be reached (from the signals adapter),
``CalibrationError`` when the window holds nothing to fit: no series at all, or no
kube-state-metrics Deployment series (without them there is no topology to calibrate).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from firedrill.adapters.prometheus import PrometheusSignals
from firedrill.calibrate.fleet import Histogram, Observations, Sampled
from firedrill.errors import CalibrationError

RATE_WINDOW_MIN_S = 300.0  # a rate() window never shorter than five minutes
MAX_POINTS = 11_000  # Prometheus refuses longer ranges per series
TILE_S = 3600.0  # a counter's increase over the window is summed over tiles this long
SUBQUERY_POINTS = 200  # evaluations of the subquery that finds GPUs with events
HOSTS_PER_QUERY = 50  # hosts (of 8 GPUs each) per range query
# the label naming a GPU's node: dcgm-exporter's (before and after its rename), kube-state's
HOST_LABELS = ("Hostname", "hostname", "node", "instance")


def _duration(seconds: float) -> str:
    return f"{max(math.ceil(seconds), 1)}s"


class CalibrationSource:
    """The PromQL behind each observation, against one Prometheus."""

    def __init__(self, signals: PrometheusSignals) -> None:
        self.signals = signals

    def _matrix(self, promql: str, start: float, end: float, step: float) -> tuple[Sampled, ...]:
        out = []
        for labels, t, v in self.signals.matrix(promql, start_s=start, end_s=end, step_s=step):
            kept = tuple((k, val) for k, val in labels if k != "__name__")
            out.append(Sampled(kept, t, v))
        return tuple(out)

    def _instant(self, promql: str, at: float) -> tuple[Sampled, ...]:
        out = []
        for s in self.signals.vector(promql, at_s=at):
            kept = tuple((k, val) for k, val in s.labels if k != "__name__")
            out.append(Sampled(kept, np.array([at]), np.array([s.value])))
        return tuple(out)

    def _increase(
        self, selector: str, by: str, start: float, end: float, step: float
    ) -> tuple[Sampled, ...]:
        """``increase`` of a counter over the window, by ``by``: one sample per group at ``end``.

        Summed over tiles of an hour (or the step, if longer) rather than asked in one range
        selector as long as the window, which would load every sample of every series at once.
        """
        tile = min(max(step, TILE_S), end - start)
        totals: dict[tuple[tuple[str, str], ...], float] = {}
        rows = self._matrix(
            f"sum by ({by}) (increase({selector}[{_duration(tile)}]))", start + tile, end, tile
        )
        for row in rows:
            totals[row.labels] = totals.get(row.labels, 0.0) + float(np.nansum(row.values))
        return tuple(
            Sampled(labels, np.array([end]), np.array([total]))
            for labels, total in sorted(totals.items())
        )

    def _histograms(self, rows: tuple[Sampled, ...]) -> tuple[Histogram, ...]:
        groups: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
        for s in rows:
            le = s.label("le")
            rest = tuple((k, v) for k, v in s.labels if k != "le")
            try:
                bound = math.inf if le == "+Inf" else float(le)
            except ValueError:
                continue
            groups.setdefault(rest, []).append((bound, float(s.values[0])))
        out = []
        for labels, pairs in sorted(groups.items()):
            pairs.sort()
            if not pairs or not math.isinf(pairs[-1][0]):
                continue  # a histogram without its +Inf bucket has no total
            edges = np.array([b for b, _ in pairs[:-1]])
            cumulative = np.array([c for _, c in pairs])
            out.append(Histogram(labels, edges, cumulative))
        return tuple(out)

    def _gpus_with_events(
        self, name: str, names: set[str], start: float, end: float, step: float
    ) -> tuple[Sampled, ...]:
        """The GPU series of ``name`` that were non-zero in the window, over the window.

        A fleet has a series per GPU (80,000 at 10,000 nodes) and a handful with events: the
        GPUs are found first by an instant subquery sampled a few hundred times over the window
        (an XID gauge and a DBE counter stay up once set), then read host by host, in chunks, so
        no query reaches Prometheus's per-query sample limit.
        """
        if name not in names:
            return ()
        sub = _duration(max(step, (end - start) / SUBQUERY_POINTS))
        hits = self._instant(f"max_over_time({name}[{_duration(end - start)}:{sub}]) > 0", end)
        if not hits:
            return ()
        host = next((k for k in HOST_LABELS if all(h.label(k) for h in hits)), None)
        if host is None:  # no host label to select by: read the name whole
            return self._matrix(name, start, end, step)
        hosts = sorted({h.label(host) for h in hits})
        out: list[Sampled] = []
        for i in range(0, len(hosts), HOSTS_PER_QUERY):
            pattern = "|".join(re.escape(h) for h in hosts[i : i + HOSTS_PER_QUERY])
            literal = pattern.replace("\\", "\\\\").replace('"', '\\"')
            out.extend(self._matrix(f'{name}{{{host}=~"{literal}"}}', start, end, step))
        return tuple(out)

    def read(self, *, end_unix_s: float, window_s: float, step_s: float) -> Observations:
        """Every observation over [end − window, end]; raises when there is nothing to fit."""
        if window_s <= 0 or step_s <= 0:
            raise CalibrationError("the window and the step must be positive")
        start = end_unix_s - window_s
        step = max(step_s, window_s / MAX_POINTS)
        rate_w = _duration(max(4.0 * step, RATE_WINDOW_MIN_S))
        whole = _duration(window_s)
        names = set(self.signals.series_names())

        def m(q: str) -> tuple[Sampled, ...]:
            return self._matrix(q, start, end_unix_s, step)

        desired = m("max by (deployment, cell, region) (kube_deployment_spec_replicas)")
        requests = m(f"sum by (model_name, region) (rate(http_requests_total[{rate_w}]))")
        where = f"{self.signals.url} in the window [{start:.0f}, {end_unix_s:.0f}]"
        if not desired and not requests:
            raise CalibrationError(
                f"the window is empty: no kube_deployment_spec_replicas and no "
                f"http_requests_total samples at {where} (check --end and --window)"
            )
        if not desired:
            raise CalibrationError(
                f"no kube-state-metrics Deployment series (kube_deployment_spec_replicas) at "
                f"{where}: topology and replica counts come from kube-state-metrics; is it "
                "scraped, with honorLabels?"
            )
        if not requests:
            raise CalibrationError(
                f"no http_requests_total samples at {where}: nothing to fit demand to "
                "(are vLLM's HTTP metrics scraped?)"
            )
        nodes = m("count by (cell, region) (kube_node_info)")
        nodes_source = "count by (cell, region) (kube_node_info)"
        if not nodes and "firedrill_cell_nodes" in names:
            nodes = m("max by (cell, region) (firedrill_cell_nodes)")
            nodes_source = "firedrill_cell_nodes (firedrill's own)"
        tpot = "vllm:time_per_output_token_seconds"
        if f"{tpot}_sum" not in names and "vllm:inter_token_latency_seconds_sum" in names:
            tpot = "vllm:inter_token_latency_seconds"  # the name after vLLM 0.11
        kv = "vllm:kv_cache_usage_perc"
        if kv not in names and "vllm:gpu_cache_usage_perc" in names:
            kv = "vllm:gpu_cache_usage_perc"  # early V1
        by_pool = "model_name, cell"
        hydrate = "firedrill_hydrate_bytes_total" in names
        return Observations(
            start_unix_s=start,
            end_unix_s=end_unix_s,
            step_s=step,
            replicas_desired=desired,
            # gauges averaged over the rate window, so they pair with the rates they explain
            replicas_available=m(
                "sum by (deployment, cell) "
                f"(avg_over_time(kube_deployment_status_replicas_available[{rate_w}]))"
            ),
            nodes=nodes,
            nodes_source=nodes_source,
            request_rate=requests,
            running=m(f"sum by ({by_pool}) (avg_over_time(vllm:num_requests_running[{rate_w}]))"),
            tpot_sum_rate=m(f"sum by ({by_pool}) (rate({tpot}_sum[{rate_w}]))"),
            tpot_count_rate=m(f"sum by ({by_pool}) (rate({tpot}_count[{rate_w}]))"),
            kv_usage=m(f"avg by ({by_pool}) (avg_over_time({kv}[{rate_w}]))"),
            ttft=self._histograms(
                self._increase(
                    "vllm:time_to_first_token_seconds_bucket",
                    "model_name, le",
                    start,
                    end_unix_s,
                    step,
                )
            ),
            xid=self._gpus_with_events("DCGM_FI_DEV_XID_ERRORS", names, start, end_unix_s, step),
            ecc_dbe=self._gpus_with_events(
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", names, start, end_unix_s, step
            ),
            hydrate_bytes=(
                self._increase(
                    "firedrill_hydrate_bytes_total", "region, source", start, end_unix_s, step
                )
                if hydrate
                else ()
            ),
            hydrate_peak_bytes_per_s=(
                self._instant(
                    "max_over_time(sum by (region, source) "
                    f"(rate(firedrill_hydrate_bytes_total[{rate_w}]))[{whole}:{_duration(step)}])",
                    end_unix_s,
                )
                if hydrate
                else ()
            ),
        )


def read_observations(
    url: str, *, end_unix_s: float, window_s: float, step_s: float, timeout_s: float = 30.0
) -> Observations:
    """Open ``url``, read the observations, close."""
    with PrometheusSignals(url, timeout_s=timeout_s) as signals:
        return CalibrationSource(signals).read(
            end_unix_s=end_unix_s, window_s=window_s, step_s=step_s
        )


__all__: Sequence[str] = ["CalibrationSource", "read_observations"]
