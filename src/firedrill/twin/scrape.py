"""The twin's series: the families it exports and what each scrape writes.

Every series carries a real exporter's name (vLLM's ``vllm:*``, kube-state-metrics, dcgm-exporter)
or the twin's own ``firedrill_*`` name for what only the twin can tell; the sub-simulations
register and write their own families through the same store. A scrape also flushes the TTFT
bins, so the histograms move at the scrape cadence whether or not series are recorded.
"""

from __future__ import annotations

import numpy as np

from firedrill.model.series import labels_of
from firedrill.model.spec import VLLM_TPOT_BUCKETS_S, VLLM_TTFT_BUCKETS_S
from firedrill.twin.state import TTFT_EXPORT
from firedrill.twin.traffic import Traffic


class Scrape(Traffic):
    """Series registration and the scrape."""

    def _register_series(self) -> None:
        if not self.record:
            return
        s = self.store
        base = [
            dict(
                model_name=self.models[int(self.pool_model[p])].name,
                cell=self.cell_names[int(self.pool_cell[p])],
                region=self.region_names[int(self.pool_region[p])],
            )
            for p in range(self.n_pools)
        ]
        self._series_pools = np.array([p for p in range(self.n_pools)], dtype=np.int64)
        plain = [labels_of(**b) for b in base]
        for name in (
            "vllm:num_requests_waiting",
            "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc",
            "vllm:num_preemptions_total",
            "vllm:time_to_first_token_seconds_count",
            "vllm:time_to_first_token_seconds_sum",
            "vllm:time_per_output_token_seconds_count",
            "vllm:time_per_output_token_seconds_sum",
            "vllm:generation_tokens_total",
            "firedrill_replicas_ready",
            "firedrill_replicas_desired",
            "firedrill_route_weight",
            "firedrill_offered_requests_per_second",
        ):
            s.family(name, plain)
        # kube-state-metrics' Deployment series: one Deployment per model and cell, named after
        # the served model (what ``twin calibrate`` reads replica counts from)
        deployments = [
            labels_of(
                namespace="serving", deployment=b["model_name"], cell=b["cell"], region=b["region"]
            )
            for b in base
        ]
        s.family("kube_deployment_spec_replicas", deployments)
        s.family("kube_deployment_status_replicas_available", deployments)
        for reason in ("stop", "length"):
            s.family(
                f"vllm:request_success_total|{reason}",
                [labels_of(**b, finished_reason=reason) for b in base],
            )
        for status in ("2xx", "5xx"):
            s.family(
                f"http_requests_total|{status}",
                [
                    labels_of(**b, handler="/v1/completions", method="POST", status=status)
                    for b in base
                ],
            )
        ttft_le = [*(_fmt_le(x) for x in VLLM_TTFT_BUCKETS_S), "+Inf"]
        s.family(
            "vllm:time_to_first_token_seconds_bucket",
            [labels_of(**b, le=le) for b in base for le in ttft_le],
        )
        tpot_le = [*(_fmt_le(x) for x in VLLM_TPOT_BUCKETS_S), "+Inf"]
        s.family(
            "vllm:time_per_output_token_seconds_bucket",
            [labels_of(**b, le=le) for b in base for le in tpot_le],
        )
        reg = [labels_of(region=r) for r in self.region_names]
        for name in ("origin", "p2p"):
            s.family(
                f"firedrill_hydrate_bytes_total|{name}",
                [labels_of(region=r, source=name) for r in self.region_names],
            )
        for code in ("503", "429"):
            s.family(
                f"firedrill_registry_errors_total|{code}",
                [labels_of(region=r, code=code) for r in self.region_names],
            )
        s.family("firedrill_hydrate_pulls_active", reg)
        s.family(
            "firedrill_cell_nodes",
            [
                labels_of(cell=c, region=self.region_names[self.cell_region[i]])
                for i, c in enumerate(self.cell_names)
            ],
        )
        s.family("firedrill_admission_decisions_total|admit", [labels_of(decision="admit")])
        s.family("firedrill_admission_decisions_total|deny", [labels_of(decision="deny")])
        self._ttft_export_idx = np.searchsorted(self.edges, TTFT_EXPORT)
        if self.spec.training:
            self.training.register_series(s)
        self.recovery.register_series(s)
        if self.sandbox.enabled:
            self.sandbox.register_series(s)
        self.golden.register_series(s)
        if self.pd is not None:
            self.pd.register_series(s)

    def _scrape(self) -> None:
        self.flush_ttft()
        s = self.store
        k = s.begin_scrape(self.t)
        self.scrapes += 1
        waiting = self.queue.sum(axis=1)
        if self.pd is not None:
            waiting = waiting + self.pd.waiting()  # a disaggregated pool's prefill backlog too
        s.write("vllm:num_requests_waiting", k, waiting.astype(np.float64))
        s.write("vllm:num_requests_running", k, self.busy.astype(np.float64))
        s.write("vllm:kv_cache_usage_perc", k, self.kv_usage)
        s.write("vllm:num_preemptions_total", k, self.preemptions.astype(np.float64))
        s.write(
            "vllm:time_to_first_token_seconds_count",
            k,
            self.ttft_hist.sum(axis=1).astype(np.float64),
        )
        s.write("vllm:time_to_first_token_seconds_sum", k, self.ttft_sum)
        s.write(
            "vllm:time_per_output_token_seconds_count",
            k,
            self.tpot_hist.sum(axis=1).astype(np.float64),
        )
        s.write("vllm:time_per_output_token_seconds_sum", k, self.tpot_sum)
        s.write("vllm:generation_tokens_total", k, self.generation_tokens)
        s.write("firedrill_replicas_ready", k, self.ready.astype(np.float64))
        s.write("firedrill_replicas_desired", k, self.desired.astype(np.float64))
        s.write("kube_deployment_spec_replicas", k, self.desired.astype(np.float64))
        s.write("kube_deployment_status_replicas_available", k, self.ready.astype(np.float64))
        s.write("firedrill_route_weight", k, self.weights.reshape(-1))
        s.write("firedrill_offered_requests_per_second", k, self.lam)
        s.write("vllm:request_success_total|stop", k, self.success_stop.astype(np.float64))
        s.write("vllm:request_success_total|length", k, self.success_length.astype(np.float64))
        s.write("http_requests_total|2xx", k, self.ok.astype(np.float64))
        s.write("http_requests_total|5xx", k, self.errors.astype(np.float64))
        cum = np.cumsum(self.ttft_hist, axis=1)
        buckets = np.concatenate([cum[:, self._ttft_export_idx], cum[:, -1:]], axis=1)
        s.write(
            "vllm:time_to_first_token_seconds_bucket", k, buckets.reshape(-1).astype(np.float64)
        )
        tcum = np.cumsum(self.tpot_hist, axis=1)
        s.write("vllm:time_per_output_token_seconds_bucket", k, tcum.reshape(-1).astype(np.float64))
        rs = self.supply.regions
        s.write(
            "firedrill_hydrate_bytes_total|origin", k, np.array([r.origin_gb * 1e9 for r in rs])
        )
        s.write("firedrill_hydrate_bytes_total|p2p", k, np.array([r.p2p_gb * 1e9 for r in rs]))
        s.write("firedrill_registry_errors_total|503", k, np.array([r.errors_503 for r in rs]))
        s.write("firedrill_registry_errors_total|429", k, np.array([r.errors_429 for r in rs]))
        active = np.zeros(len(rs))
        for p in self.supply.pulls.values():
            if p.digest >= 0:  # serving pulls (competing pullers have their own series)
                active[p.region] += 1
        s.write("firedrill_hydrate_pulls_active", k, active)
        s.write("firedrill_cell_nodes", k, np.array([float(len(n)) for n in self.cell_nodes]))
        s.write(
            "firedrill_admission_decisions_total|admit",
            k,
            np.array([float(self.admission["admitted"])]),
        )
        s.write(
            "firedrill_admission_decisions_total|deny",
            k,
            np.array([float(self.admission["denied"])]),
        )
        if self.spec.training:
            self.training.scrape(s, k)
        self.recovery.scrape(s, k)
        if self.sandbox.enabled:
            self.sandbox.scrape(s, k)
        self.golden.scrape(s, k, self.t - (s.times[-2] if len(s.times) > 1 else self.t))
        if self.pd is not None:
            self.pd.scrape(s, k)


def _fmt_le(x: float) -> str:
    return repr(float(x))
