"""From a fleet's observed series to a fleet spec, parameter by parameter, saying how well.

``calibrate_fleet`` takes the base spec (what Prometheus cannot say: digests, bundles, node
pools' hardware, registries, services) and the series an adapter read (``Observations``), and
returns the calibrated spec with one ``Fitted`` row per parameter: its value, the base value, an
error measure, the samples behind it and where it came from. A parameter without data keeps the
base value and its row says why; nothing is guessed.

Series and what they fit (names as the real exporters emit them, ``firedrill_*`` where none does):

- replicas per model and cell: ``kube_deployment_spec_replicas`` (kube-state-metrics), the most
  the window saw (the fleet's provisioned capacity at its busiest); the Deployment is named after
  the served model and carries the ``cell``/``region`` target labels;
- nodes per cell: ``count by (cell, region) (kube_node_info)``, else ``firedrill_cell_nodes``;
- demand per product × region: ``rate(http_requests_total)`` summed by model and region (vLLM's
  HTTP layer), fitted to the twin's diurnal shape;
- prefill curve: ``vllm:time_to_first_token_seconds`` buckets over the window;
- decode step: ``vllm:time_per_output_token_seconds`` sum/count against the batch
  (``vllm:num_requests_running`` over ``kube_deployment_status_replicas_available``);
- KV bytes per token: ``vllm:kv_cache_usage_perc`` against the same batch;
- GPU fault rates: ``DCGM_FI_DEV_XID_ERRORS`` (a new code is an event) per XID class and
  ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` increases, per 1,000 node-days;
- hydrate: ``firedrill_hydrate_bytes_total{source="origin"|"p2p"}`` (no real exporter has it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from firedrill.calibrate.fit import (
    count_events,
    counter_increase,
    fit_diurnal,
    fit_line,
    fit_prefill_scale,
    poisson_rate,
)
from firedrill.errors import CalibrationError
from firedrill.model.series import Labels, label_value
from firedrill.model.spec import (
    CellSpec,
    FaultsSpec,
    FleetSpec,
    LatencySpec,
    ModelSpec,
    NodePoolSpec,
    ProductSpec,
    RegionSpec,
    XidRateSpec,
)
from firedrill.twin.faults import KIND_XID
from firedrill.twin.serving import kv_capacity_tokens

F64 = npt.NDArray[np.float64]
# rel_stderr: standard error over the value; abs_stderr: standard error in the value's unit;
# log_spread: spread of the fitted points in log space; poisson_95: see low/high
ErrorKind = Literal[
    "rel_stderr", "abs_stderr", "rel_rmse", "log_spread", "poisson_95", "exact", "none"
]


@dataclass(frozen=True)
class Sampled:
    """One series as read: its labels, Unix seconds and values."""

    labels: Labels
    t_unix_s: F64
    values: F64

    def label(self, key: str) -> str:
        return label_value(self.labels, key)


@dataclass(frozen=True)
class Histogram:
    """A histogram's bucket increases over the window: finite edges, cumulative counts + total."""

    labels: Labels
    edges_s: F64
    cumulative: F64

    def label(self, key: str) -> str:
        return label_value(self.labels, key)


@dataclass(frozen=True)
class Observations:
    """Everything the adapter read, in the shapes the fits take. Empty tuple: not exported."""

    start_unix_s: float
    end_unix_s: float
    step_s: float
    replicas_desired: tuple[Sampled, ...]  # by deployment, cell, region
    replicas_available: tuple[Sampled, ...]  # by deployment, cell
    nodes: tuple[Sampled, ...]  # by cell, region
    nodes_source: str
    request_rate: tuple[Sampled, ...]  # by model_name, region
    running: tuple[Sampled, ...]  # by model_name, cell
    tpot_sum_rate: tuple[Sampled, ...]  # by model_name, cell
    tpot_count_rate: tuple[Sampled, ...]  # by model_name, cell
    kv_usage: tuple[Sampled, ...]  # by model_name, cell
    ttft: tuple[Histogram, ...]  # by model_name
    xid: tuple[Sampled, ...]  # raw, one per GPU and code
    ecc_dbe: tuple[Sampled, ...]  # raw, one per GPU
    hydrate_bytes: tuple[Sampled, ...]  # by region, source: increase over the window (1 sample)
    hydrate_peak_bytes_per_s: tuple[Sampled, ...]  # by region, source: max rate (1 sample)

    @property
    def window_s(self) -> float:
        return self.end_unix_s - self.start_unix_s


@dataclass(frozen=True)
class Fitted:
    """One parameter: fitted (value replaces base) or not (base kept, ``note`` says why)."""

    parameter: str
    unit: str
    base: float | None
    value: float | None
    fitted: bool
    error: float | None
    error_kind: ErrorKind
    samples: int
    source: str
    note: str = ""
    low: float | None = None  # 95% interval where the fit has one
    high: float | None = None


@dataclass(frozen=True)
class Calibration:
    """The calibrated fleet and the story of each parameter."""

    fleet: FleetSpec
    parameters: tuple[Fitted, ...]
    start_unix_s: float
    end_unix_s: float
    step_s: float

    @property
    def fitted(self) -> tuple[Fitted, ...]:
        return tuple(p for p in self.parameters if p.fitted)

    @property
    def not_fitted(self) -> tuple[Fitted, ...]:
        return tuple(p for p in self.parameters if not p.fitted)


_PRODUCT_KEPT = (
    ("noise", "kept from the base: per-minute noise is not separated from Poisson noise here"),
    ("tokens", "kept from the base: vLLM's request_prompt_tokens histogram is not read yet"),
    ("events", "kept from the base: a one-off spike is not part of the diurnal shape"),
)


def sig(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant digits: no fit is better, and the YAML stays readable."""
    return float(f"{x:.{digits}g}")


def _kept(parameter: str, unit: str, base: float | None, source: str, note: str) -> Fitted:
    return Fitted(parameter, unit, base, None, False, None, "none", 0, source, note)


def _key(s: Sampled | Histogram, *names: str) -> tuple[str, ...]:
    return tuple(s.label(n) for n in names)


def _by(series: Sequence[Sampled], *names: str) -> dict[tuple[str, ...], Sampled]:
    return {_key(s, *names): s for s in series}


def _aligned(a: Sampled, b: Sampled) -> tuple[F64, F64, F64]:
    """Values of two series at the times both have."""
    t, ia, ib = np.intersect1d(a.t_unix_s, b.t_unix_s, return_indices=True)
    return t, a.values[ia], b.values[ib]


@dataclass
class _Build:
    base: FleetSpec
    obs: Observations
    rows: list[Fitted]

    # -- topology ---------------------------------------------------------------------------------
    def regions(self) -> list[RegionSpec]:
        desired = _by(self.obs.replicas_desired, "cell", "deployment")
        nodes = _by(self.obs.nodes, "cell")
        models = {m.name for m in self.base.models}
        seen_cells = {c for c, _ in desired} | {c for (c,) in nodes}
        known = {c.name for r in self.base.regions for c in r.cells}
        for cell in sorted(seen_cells - known - {""}):
            self.rows.append(
                _kept(
                    f"cells.{cell}",
                    "cell",
                    None,
                    "kube_deployment_spec_replicas",
                    "a cell the base spec does not have: add it to --base to calibrate it",
                )
            )
        out = []
        for r in self.base.regions:
            cells = []
            for c in r.cells:
                cells.append(self._cell(c, desired, nodes, models))
            out.append(r.model_copy(update={"cells": cells}))
        return out

    def _cell(
        self,
        c: CellSpec,
        desired: dict[tuple[str, ...], Sampled],
        nodes: dict[tuple[str, ...], Sampled],
        models: set[str],
    ) -> CellSpec:
        replicas = dict(c.replicas)
        for m in sorted(models):
            name = f"cells.{c.name}.replicas.{m}"
            base = c.replicas.get(m)
            s = desired.get((c.name, m))
            vals = s.values[np.isfinite(s.values)] if s is not None else np.zeros(0)
            if vals.size == 0:
                if base is not None:
                    self.rows.append(
                        _kept(
                            name,
                            "replicas",
                            float(base),
                            "kube_deployment_spec_replicas",
                            "no Deployment of this model in this cell in the window",
                        )
                    )
                continue
            top = round(float(vals.max()))
            replicas[m] = top
            self.rows.append(
                Fitted(
                    name,
                    "replicas",
                    None if base is None else float(base),
                    float(top),
                    True,
                    0.0,
                    "exact",
                    int(vals.size),
                    "max_over_time(kube_deployment_spec_replicas)",
                )
            )
        pools = list(c.node_pools)
        s = nodes.get((c.name,))
        name = f"cells.{c.name}.nodes"
        base_nodes = sum(p.nodes for p in pools)
        vals = s.values[np.isfinite(s.values)] if s is not None else np.zeros(0)
        serving = [i for i, p in enumerate(pools) if p.role == "serving"]
        if vals.size == 0:
            self.rows.append(
                _kept(
                    name,
                    "nodes",
                    float(base_nodes),
                    self.obs.nodes_source or "kube_node_info",
                    "no node series for this cell",
                )
            )
        elif len(serving) != 1 and round(float(np.median(vals))) != base_nodes:
            self.rows.append(
                _kept(
                    name,
                    "nodes",
                    float(base_nodes),
                    self.obs.nodes_source,
                    f"saw {round(float(np.median(vals)))} nodes but the cell has "
                    f"{len(serving)} serving pools: which pool changed is not in the series",
                )
            )
        else:
            seen = round(float(np.median(vals)))
            if serving:
                i = serving[0]
                others = base_nodes - pools[i].nodes
                pools[i] = pools[i].model_copy(update={"nodes": max(seen - others, 0)})
            self.rows.append(
                Fitted(
                    name,
                    "nodes",
                    float(base_nodes),
                    float(seen),
                    True,
                    0.0,
                    "exact",
                    int(vals.size),
                    f"median {self.obs.nodes_source}",
                )
            )
        return CellSpec(
            name=c.name,
            node_pools=[NodePoolSpec(**p.model_dump()) for p in pools],
            replicas=replicas,
        )

    # -- demand -----------------------------------------------------------------------------------
    def products(self) -> list[ProductSpec]:
        rate = _by(self.obs.request_rate, "model_name", "region")
        per_model: dict[str, list[ProductSpec]] = {}
        for p in self.base.products:
            per_model.setdefault(p.model, []).append(p)
        out = []
        for p in self.base.products:
            siblings = per_model[p.model]
            peak = dict(p.peak_rps)
            hours = dict(p.peak_hour_utc)
            amps: list[tuple[float, float]] = []  # (amplitude, weight)
            for region in [r.name for r in self.base.regions]:
                name = f"products.{p.name}.peak_rps.{region}"
                s = rate.get((p.model, region))
                fit = None if s is None else fit_diurnal(s.t_unix_s, s.values)
                base_peak = p.peak_rps.get(region)
                if fit is None:
                    self.rows.append(
                        _kept(
                            name,
                            "requests/s",
                            base_peak,
                            "rate(http_requests_total)",
                            "no request series (or too few samples) for this model and region",
                        )
                    )
                    continue
                share = 1.0
                note = ""
                if len(siblings) > 1:
                    total = sum(q.peak_rps.get(region, 0.0) for q in siblings)
                    share = p.peak_rps.get(region, 0.0) / total if total > 0 else 1 / len(siblings)
                    note = (
                        f"model {p.model} serves {len(siblings)} products: split by the "
                        f"base's peak shares ({share:.2f})"
                    )
                peak[region] = sig(fit.peak_rps * share)
                self.rows.append(
                    Fitted(
                        name,
                        "requests/s",
                        base_peak,
                        peak[region],
                        True,
                        fit.peak_rel_stderr,
                        "rel_stderr",
                        fit.samples,
                        "sum by (model_name, region) (rate(http_requests_total))",
                        note,
                    )
                )
                hname = f"products.{p.name}.peak_hour_utc.{region}"
                hours[region] = round(fit.peak_hour_utc, 3) % 24.0
                self.rows.append(
                    Fitted(
                        hname,
                        "hour UTC",
                        p.peak_hour_utc.get(region),
                        hours[region],
                        True,
                        fit.peak_hour_stderr_h,
                        "abs_stderr",
                        fit.samples,
                        "phase of the diurnal fit",
                    )
                )
                amps.append((fit.amplitude, fit.peak_rps))
                self.rows.append(
                    Fitted(
                        f"products.{p.name}.diurnal_amplitude.{region}",
                        "fraction",
                        p.diurnal_amplitude,
                        fit.amplitude,
                        True,
                        fit.amplitude_stderr,
                        "abs_stderr",
                        fit.samples,
                        "amplitude of the diurnal fit",
                        f"residual RMS {fit.rel_rmse:.1%} of the mean rate (noise, events)",
                    )
                )
            amplitude = p.diurnal_amplitude
            if amps:
                w = sum(wt for _, wt in amps)
                amplitude = sig(sum(a * wt for a, wt in amps) / w) if w > 0 else amplitude
                self.rows.append(
                    Fitted(
                        f"products.{p.name}.diurnal_amplitude",
                        "fraction",
                        p.diurnal_amplitude,
                        amplitude,
                        True,
                        None,
                        "none",
                        len(amps),
                        "peak-weighted mean over regions",
                        "the spec has one amplitude per product",
                    )
                )
            for what, why in _PRODUCT_KEPT:
                self.rows.append(_kept(f"products.{p.name}.{what}", "", None, "", why))
            out.append(
                p.model_copy(
                    update={
                        "peak_rps": peak,
                        "peak_hour_utc": hours,
                        "diurnal_amplitude": min(max(amplitude, 0.0), 1.0),
                    }
                )
            )
        return out

    # -- serving ----------------------------------------------------------------------------------
    def models(self, regions: list[RegionSpec]) -> list[ModelSpec]:
        return [self._model(m, regions) for m in self.base.models]

    def _product_of(self, m: ModelSpec) -> ProductSpec | None:
        return next((p for p in self.base.products if p.model == m.name), None)

    def _batch(self, m: ModelSpec) -> list[tuple[str, F64, F64, F64]]:
        """(cell, batch per replica, decode seconds per token, completions/s) per step."""
        running = _by(self.obs.running, "model_name", "cell")
        ready = _by(self.obs.replicas_available, "deployment", "cell")
        tsum = _by(self.obs.tpot_sum_rate, "model_name", "cell")
        tcount = _by(self.obs.tpot_count_rate, "model_name", "cell")
        out = []
        for (model, cell), run in sorted(running.items()):
            if model != m.name or (model, cell) not in ready:
                continue
            t, busy, rep = _aligned(run, ready[(model, cell)])
            keep = rep > 0
            batch = np.where(keep, busy / np.where(keep, rep, 1.0), np.nan)
            per_tok = np.full(t.shape, np.nan)
            done = np.zeros(t.shape)
            if (model, cell) in tsum and (model, cell) in tcount:
                ts, s_sum, s_cnt = _aligned(tsum[(model, cell)], tcount[(model, cell)])
                idx = np.searchsorted(t, ts)
                ok = (idx < t.size) & (s_cnt > 0)
                ok[ok] &= t[idx[ok]] == ts[ok]
                per_tok[idx[ok]] = s_sum[ok] / s_cnt[ok]
                done[idx[ok]] = s_cnt[ok]
            out.append((cell, batch, per_tok, done))
        return out

    def _model(self, m: ModelSpec, regions: list[RegionSpec]) -> ModelSpec:
        lat = m.latency
        prod = self._product_of(m)
        batches = self._batch(m)
        update: dict[str, float] = {}
        pre = f"models.{m.name}.latency"
        # decode: step seconds = a + (b·tokens_per_seq + c)·batch
        if prod is not None and batches:
            tokens = prod.tokens
            prompt_mean = tokens.prompt_median * math.exp(tokens.prompt_sigma**2 / 2.0)
            per_seq = prompt_mean + tokens.output_mean / 2.0
            x = np.concatenate([b for _, b, _, _ in batches])
            y = np.concatenate([tp for _, _, tp, _ in batches])
            line = fit_line(x, y)
            base_slope = lat.decode_b_s_per_token * per_seq + lat.decode_c_s_per_seq
            src = "rate(vllm:time_per_output_token_seconds_sum / _count) ~ batch"
            if line is None or base_slope <= 0 or line.slope <= 0:
                for f in ("decode_a_s", "decode_b_s_per_token", "decode_c_s_per_seq"):
                    self.rows.append(
                        _kept(
                            f"{pre}.{f}",
                            "s",
                            getattr(lat, f),
                            src,
                            "no decode series, or the batch never moved",
                        )
                    )
            else:
                k = line.slope / base_slope
                update["decode_a_s"] = sig(max(line.intercept, 0.0))
                update["decode_b_s_per_token"] = sig(lat.decode_b_s_per_token * k)
                update["decode_c_s_per_seq"] = sig(lat.decode_c_s_per_seq * k)
                a_err = line.intercept_stderr / line.intercept if line.intercept > 0 else None
                self.rows.append(
                    Fitted(
                        f"{pre}.decode_a_s",
                        "s",
                        lat.decode_a_s,
                        update["decode_a_s"],
                        True,
                        a_err,
                        "rel_stderr",
                        line.samples,
                        src + " (intercept)",
                        f"residual RMS {line.rel_rmse:.1%} of the mean step time",
                    )
                )
                for f in ("decode_b_s_per_token", "decode_c_s_per_seq"):
                    self.rows.append(
                        Fitted(
                            f"{pre}.{f}",
                            "s",
                            getattr(lat, f),
                            update[f],
                            True,
                            line.slope_stderr / line.slope,
                            "rel_stderr",
                            line.samples,
                            src + " (slope)",
                            "slope = b·tokens_per_seq + c: one slope cannot split b from c, "
                            "the base's b:c ratio is kept",
                        )
                    )
        else:
            for f in ("decode_a_s", "decode_b_s_per_token", "decode_c_s_per_seq"):
                self.rows.append(
                    _kept(
                        f"{pre}.{f}",
                        "s",
                        getattr(lat, f),
                        "vllm:num_requests_running",
                        "no batch series",
                    )
                )
        # prefill from the TTFT buckets, net of the interference the batch caused
        hist = next((h for h in self.obs.ttft if h.label("model_name") == m.name), None)
        seats = float(m.bundle.serving_config.max_num_seqs)
        num = sum(float(np.nansum(np.minimum(b / seats, 1.0) * w)) for _, b, _, w in batches)
        den = sum(float(np.nansum(np.where(np.isfinite(b), w, 0.0))) for _, b, _, w in batches)
        factor = 1.0 + lat.prefill_interference * (num / den if den > 0 else 0.0)
        fit = None
        if hist is not None and prod is not None:
            fit = fit_prefill_scale(
                hist.edges_s,
                hist.cumulative,
                base=(lat.prefill_a_s, lat.prefill_b_s_per_token, lat.prefill_c_s_per_token2),
                prompt_median=prod.tokens.prompt_median,
                prompt_sigma=prod.tokens.prompt_sigma,
                factor=factor,
            )
        src = "increase(vllm:time_to_first_token_seconds_bucket) over the window"
        for f in ("prefill_a_s", "prefill_b_s_per_token", "prefill_c_s_per_token2"):
            if fit is None:
                self.rows.append(
                    _kept(
                        f"{pre}.{f}",
                        "s",
                        getattr(lat, f),
                        src,
                        "no TTFT histogram with observations inside its buckets",
                    )
                )
                continue
            update[f] = sig(getattr(lat, f) * fit.scale)
            self.rows.append(
                Fitted(
                    f"{pre}.{f}",
                    "s",
                    getattr(lat, f),
                    update[f],
                    True,
                    fit.rel_spread,
                    "log_spread",
                    fit.observations,
                    src,
                    f"{fit.edges_used} bucket edges; the base curve's shape scaled by "
                    f"{fit.scale:.3f} (one prompt distribution fixes the level, not a, b and c "
                    "apart); "
                    f"interference x{factor:.3f} removed",
                )
            )
        for f in ("prefill_interference", "cold_cache_penalty", "cold_cache_decay_s"):
            self.rows.append(
                _kept(
                    f"{pre}.{f}",
                    "",
                    getattr(lat, f),
                    "",
                    "needs a load step or a traffic shift, not steady series",
                )
            )
        kv_update = self._kv(m, regions, batches)
        new_lat = LatencySpec(**{**lat.model_dump(), **update})
        return m.model_copy(update={"latency": new_lat, **kv_update})

    def _kv(
        self, m: ModelSpec, regions: list[RegionSpec], batches: list[tuple[str, F64, F64, F64]]
    ) -> dict[str, int]:
        name = f"models.{m.name}.kv_bytes_per_token"
        src = "vllm:kv_cache_usage_perc ~ batch"
        kv = _by(self.obs.kv_usage, "model_name", "cell")
        prod = self._product_of(m)
        gpu = _gpu_of(m, regions)
        if prod is None or gpu is None:
            self.rows.append(
                _kept(
                    name,
                    "bytes",
                    float(m.kv_bytes_per_token),
                    src,
                    "no product or serving pool for this model",
                )
            )
            return {}
        running = _by(self.obs.running, "model_name", "cell")
        ready = _by(self.obs.replicas_available, "deployment", "cell")
        xs, ys = [], []
        for (model, cell), usage in kv.items():
            if model != m.name or (model, cell) not in running or (model, cell) not in ready:
                continue
            t, busy, rep = _aligned(running[(model, cell)], ready[(model, cell)])
            _tu, iu, it = np.intersect1d(usage.t_unix_s, t, return_indices=True)
            u = usage.values[iu]
            b = busy[it] / np.maximum(rep[it], 1.0)
            ok = (u < 0.99) & (rep[it] > 0)  # a full cache says nothing about bytes per token
            xs.append(b[ok])
            ys.append(u[ok])
        line = fit_line(np.concatenate(xs), np.concatenate(ys), through_origin=True) if xs else None
        if line is None or line.slope <= 0:
            self.rows.append(
                _kept(
                    name,
                    "bytes",
                    float(m.kv_bytes_per_token),
                    src,
                    "no KV usage series, or the batch never moved",
                )
            )
            return {}
        tokens = prod.tokens
        per_seq = tokens.prompt_median * math.exp(tokens.prompt_sigma**2 / 2.0)
        per_seq += tokens.output_mean / 2.0
        gmu = m.bundle.serving_config.gpu_memory_utilization
        usable_bytes = kv_capacity_tokens(m.model_copy(update={"kv_bytes_per_token": 1}), gpu, gmu)
        value = max(round(line.slope * usable_bytes / per_seq), 1)
        self.rows.append(
            Fitted(
                name,
                "bytes",
                float(m.kv_bytes_per_token),
                float(value),
                True,
                line.slope_stderr / line.slope,
                "rel_stderr",
                line.samples,
                src,
                "usage = batch x tokens per sequence x bytes per token / usable HBM",
            )
        )
        return {"kv_bytes_per_token": value}

    # -- faults and hydrate -----------------------------------------------------------------------
    def faults(self, regions: list[RegionSpec]) -> FaultsSpec:
        """Per-class rates from the XID codes GPUs took and the DBE counter.

        One XID code can come from several classes (a double-bit ECC error shows XID 48, a
        pending row remap XID 63, an NVLink flap XID 74, as on real GPUs): a class with its own
        counter (DBE) is counted there and taken off its code's total, and what remains of a
        code is split between the classes that show it in the base's proportions.
        """
        fs = self.base.faults
        nodes = sum(p.nodes for r in regions for c in r.cells for p in c.node_pools)
        node_days = nodes * self.obs.window_s / 86_400.0
        start, step = self.obs.start_unix_s, self.obs.step_s
        codes: dict[int, int] = {}
        for s in self.obs.xid:
            for v in count_events(s.t_unix_s, s.values, window_start_s=start, step_s=step):
                codes[int(v)] = codes.get(int(v), 0) + 1
        dbe = round(
            sum(
                counter_increase(s.t_unix_s, s.values, window_start_s=start, step_s=step)
                for s in self.obs.ecc_dbe
            )
        )
        if node_days <= 0:
            return fs
        code_of = [f.xid if f.kind == "xid" else KIND_XID.get(f.kind, 0) for f in fs.background]
        own: dict[int, int] = {}  # class index -> events from its own counter
        if self.obs.ecc_dbe:
            own.update({i: dbe for i, f in enumerate(fs.background) if f.kind == "ecc_dbe"})
        out: list[XidRateSpec] = []
        for i, f in enumerate(fs.background):
            label = f"faults.{f.kind}" + (f".xid{f.xid}" if f.kind == "xid" else "")
            code = code_of[i] or 0
            if i in own:
                r = poisson_rate(own[i], node_days)
                out.append(f.model_copy(update={"per_1000_node_days": sig(r.per_1000_node_days)}))
                self.rows.append(
                    Fitted(
                        label,
                        "per 1000 node-days",
                        f.per_1000_node_days,
                        sig(r.per_1000_node_days),
                        True,
                        None,
                        "poisson_95",
                        own[i],
                        "increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL)",
                        f"{own[i]} event(s) in {node_days:,.0f} node-days",
                        r.low,
                        r.high,
                    )
                )
                continue
            if code <= 0 or not self.obs.xid:
                why = (
                    "no per-event series in dcgm-exporter's default counters for this class"
                    if code <= 0
                    else "no DCGM_FI_DEV_XID_ERRORS series in the window (no XID at all, or "
                    "the exporter is not scraped)"
                )
                self.rows.append(_kept(label, "per 1000 node-days", f.per_1000_node_days, "", why))
                out.append(f)
                continue
            sharing = [j for j, c in enumerate(code_of) if c == code and j not in own]
            taken = sum(n for j, n in own.items() if code_of[j] == code)
            total = max(codes.get(code, 0) - taken, 0)
            weight = sum(fs.background[j].per_1000_node_days for j in sharing)
            share = f.per_1000_node_days / weight if weight > 0 else 1.0 / max(len(sharing), 1)
            r = poisson_rate(total, node_days)
            rate = sig(r.per_1000_node_days * share)
            note = f"{total} XID {code} event(s) in {node_days:,.0f} node-days"
            if len(sharing) > 1:
                kinds = ", ".join(
                    fs.background[j].kind if fs.background[j].kind != "xid" else "xid"
                    for j in sharing
                )
                note += f", shown by {len(sharing)} classes ({kinds}): split {share:.0%} here"
            if taken:
                note += f", less {taken} counted by their own counter"
            note += "; phantom XIDs of a bad exporter version count too"
            out.append(f.model_copy(update={"per_1000_node_days": rate}))
            self.rows.append(
                Fitted(
                    label,
                    "per 1000 node-days",
                    f.per_1000_node_days,
                    rate,
                    True,
                    None,
                    "poisson_95",
                    total,
                    "DCGM_FI_DEV_XID_ERRORS (a new code on a GPU is one event)",
                    note,
                    r.low * share,
                    r.high * share,
                )
            )
        for code in sorted(set(codes) - {c for c in code_of if c}):
            if code <= 0:
                continue
            r = poisson_rate(codes[code], node_days)
            rate = sig(r.per_1000_node_days)
            out.append(XidRateSpec(kind="xid", xid=code, per_1000_node_days=rate))
            self.rows.append(
                Fitted(
                    f"faults.xid.xid{code}",
                    "per 1000 node-days",
                    None,
                    rate,
                    True,
                    None,
                    "poisson_95",
                    codes[code],
                    "DCGM_FI_DEV_XID_ERRORS",
                    "a class the base does not list",
                    r.low,
                    r.high,
                )
            )
        return fs.model_copy(update={"background": out})

    def registries(self, regions: list[RegionSpec]) -> list[RegionSpec]:
        total = {
            _key(s, "region", "source"): float(s.values[-1])
            for s in self.obs.hydrate_bytes
            if s.values.size and np.isfinite(s.values[-1])
        }
        peak = {
            _key(s, "region", "source"): float(s.values[-1])
            for s in self.obs.hydrate_peak_bytes_per_s
            if s.values.size and np.isfinite(s.values[-1])
        }
        out = []
        for r in regions:
            reg = r.registry
            origin = total.get((r.name, "origin"), 0.0)
            p2p = total.get((r.name, "p2p"), 0.0)
            hname = f"regions.{r.name}.registry.p2p_max_hit_rate"
            bname = f"regions.{r.name}.registry.origin_gbytes_per_s"
            src = "increase(firedrill_hydrate_bytes_total) (firedrill's own: no real exporter)"
            update: dict[str, float] = {}
            if origin + p2p <= 0:
                note = "no hydrate traffic in the window"
                self.rows.append(_kept(hname, "fraction", reg.p2p_max_hit_rate, src, note))
                self.rows.append(_kept(bname, "GB/s", reg.origin_gbytes_per_s, src, note))
                out.append(r)
                continue
            hit = p2p / (origin + p2p)
            # the realised hit rate is a lower bound on the spec's asymptotic bound
            bound = max(reg.p2p_max_hit_rate, hit)
            update["p2p_max_hit_rate"] = bound
            self.rows.append(
                Fitted(
                    hname,
                    "fraction",
                    reg.p2p_max_hit_rate,
                    bound,
                    True,
                    None,
                    "none",
                    1,
                    src,
                    f"realised hit rate {hit:.3f} over {(origin + p2p) / 1e9:,.0f} GB: the "
                    "bound is raised to it if lower, never lowered",
                )
            )
            seen_gbps = peak.get((r.name, "origin"), 0.0) / 1e9
            cap = max(reg.origin_gbytes_per_s, seen_gbps)
            update["origin_gbytes_per_s"] = cap
            self.rows.append(
                Fitted(
                    bname,
                    "GB/s",
                    reg.origin_gbytes_per_s,
                    cap,
                    True,
                    None,
                    "none",
                    1,
                    'max rate(firedrill_hydrate_bytes_total{source="origin"})',
                    f"peak origin rate {seen_gbps:.2f} GB/s is a lower bound on the cap",
                )
            )
            out.append(r.model_copy(update={"registry": reg.model_copy(update=update)}))
        return out


def _gpu_of(m: ModelSpec, regions: list[RegionSpec]) -> str | None:
    for r in regions:
        for c in r.cells:
            if c.replicas.get(m.name, 0) <= 0:
                continue
            for p in c.node_pools:
                if p.role == "serving" and (not m.node_pools or p.name in m.node_pools):
                    return p.gpu
    return None


def calibrate_fleet(base: FleetSpec, obs: Observations) -> Calibration:
    """The base fleet with every parameter the observations fit replaced, and the report."""
    build = _Build(base, obs, [])
    regions = build.regions()
    products = build.products()
    models = build.models(regions)
    faults = build.faults(regions)
    regions = build.registries(regions)
    try:
        fleet = FleetSpec.model_validate(
            {
                **base.model_dump(),
                "regions": [r.model_dump() for r in regions],
                "products": [p.model_dump() for p in products],
                "models": [m.model_dump() for m in models],
                "faults": faults.model_dump(),
            }
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise CalibrationError(
            f"the fitted values do not make a valid fleet with this base ({where}: "
            f"{first['msg']}); the base's node pools may be smaller than the fleet the series saw"
        ) from exc
    return Calibration(fleet, tuple(build.rows), obs.start_unix_s, obs.end_unix_s, obs.step_s)
