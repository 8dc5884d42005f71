"""The ``twin run`` use case: run a fleet for some hours and summarise it per cell.

Pure: takes a spec, a seed and a duration, returns the twin and a summary dict. The caller (CLI)
measures wall time and writes files; the summary therefore is byte-identical for the same spec
and seed, which ``tests/twin/test_determinism.py`` pins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from firedrill.model.spec import FleetSpec
from firedrill.twin.engine import Twin
from firedrill.twin.exposition import exporter_series_names, select_families
from firedrill.twin.recorder import TWIN_SPARSE_NAMES
from firedrill.twin.serving import quantile_from_hist

ProgressFn = Callable[[float], None]


def run_twin(
    spec: FleetSpec,
    *,
    seed: int,
    hours: float,
    record: bool = True,
    progress: ProgressFn | None = None,
    progress_every_s: float = 600.0,
    advance: Callable[[Twin, float], None] | None = None,
    prepare: Callable[[Twin], None] | None = None,
) -> Twin:
    """Run the twin for ``hours`` simulated hours; report progress (simulated seconds done).

    ``advance(twin, seconds)`` replaces ``twin.run_for`` when a caller drives something on the
    same clock (detection evaluates after every scrape). ``prepare(twin)`` sees the twin built
    and before its first step: it may check what the twin will record and narrow it
    (``twin.store.restrict``), or raise to run nothing.
    """
    twin = Twin(spec, seed, record=record, hours_hint=hours)
    if prepare is not None:
        prepare(twin)
    step = advance or (lambda tw, s: tw.run_for(s))
    total = hours * 3600.0
    done = 0.0
    while done < total - 1e-9:
        chunk = min(progress_every_s, total - done)
        step(twin, chunk)
        done += chunk
        if progress is not None:
            progress(done)
    twin.flush_ttft()
    return twin


def choose_families(twin: Twin, patterns: Sequence[str]) -> set[str]:
    """The families ``patterns`` select (``select_families``) among what this twin records now
    and what it writes only once something happens (a GPU's first XID, a node's first taint)."""
    known = exporter_series_names() | set(TWIN_SPARSE_NAMES)
    return select_families(twin.series_names(), patterns, known=known)


def _r(x: float, digits: int = 6) -> float | None:
    if x != x:  # NaN
        return None
    return float(f"{x:.{digits}g}")


def summarize(twin: Twin, *, spec_sha256: str) -> dict[str, Any]:
    """The run's summary: per cell and per model-in-cell, plus fleet-wide fault events."""
    twin.flush_ttft()
    nc = len(twin.cell_names)
    samples = max(twin.samples, 1)
    cells: dict[str, Any] = {}
    for ci, cname in enumerate(twin.cell_names):
        pools = [mi * nc + ci for mi in range(len(twin.models))]
        hist = twin.ttft_hist[pools].sum(axis=0)
        admitted = int(twin.admitted_total[pools].sum())
        cap_w = twin.ready_sum[pools] * twin.max_rps_per_replica[pools]
        util = float(np.sum(twin.util_sum[pools] / samples * cap_w) / max(cap_w.sum(), 1e-12))
        kv_w = twin.ready_sum[pools]
        kv = float(np.sum(twin.kv_usage_sum[pools] / samples * kv_w) / max(kv_w.sum(), 1e-12))
        models: dict[str, Any] = {}
        for mi, m in enumerate(twin.models):
            p = mi * nc + ci
            if twin.desired[p] == 0 and twin.requests[p] == 0 and twin.ready_sum[p] == 0:
                continue
            models[m.name] = {
                "requests": int(twin.requests[p]),
                "errors": int(twin.errors[p]),
                "ttft_p50_s": _r(quantile_from_hist(twin.ttft_hist[p], twin.edges, 0.5)),
                "ttft_p99_s": _r(quantile_from_hist(twin.ttft_hist[p], twin.edges, 0.99)),
                "mean_queue_wait_s": _r(
                    float(twin.queue_wait_sum[p]) / max(int(twin.admitted_total[p]), 1)
                ),
                "utilization": _r(float(twin.util_sum[p]) / samples),
                "kv_usage_mean": _r(float(twin.kv_usage_sum[p]) / samples),
                "ready_replicas_mean": _r(float(twin.ready_sum[p]) / samples),
                "preemptions": int(twin.preemptions[p]),
            }
        cells[cname] = {
            "region": twin.region_names[twin.cell_region[ci]],
            "requests": int(twin.requests[pools].sum()),
            "errors": int(twin.errors[pools].sum()),
            "ttft_p50_s": _r(quantile_from_hist(hist, twin.edges, 0.5)),
            "ttft_p99_s": _r(quantile_from_hist(hist, twin.edges, 0.99)),
            "mean_queue_wait_s": _r(float(twin.queue_wait_sum[pools].sum()) / max(admitted, 1)),
            "utilization": _r(util),
            "kv_usage_mean": _r(kv),
            "ready_replicas_mean": _r(float(twin.ready_sum[pools].sum()) / samples),
            "models": models,
        }
    by_class: dict[str, int] = {}
    remediable = 0
    phantom = 0
    for ev in twin.fault_log:
        if ev.phantom:
            phantom += 1
            continue
        by_class[ev.label] = by_class.get(ev.label, 0) + 1
        remediable += int(ev.remediable)
    regions: dict[str, Any] = {}
    for ri, rname in enumerate(twin.region_names):
        rs = twin.supply.regions[ri]
        regions[rname] = {
            "origin_bytes": _r(rs.origin_gb * 1e9),
            "p2p_bytes": _r(rs.p2p_gb * 1e9),
            "origin_503": _r(rs.errors_503),
            "origin_429": _r(rs.errors_429),
        }
    return {
        "fleet": twin.spec.name,
        "seed": twin.seed,
        "spec_sha256": spec_sha256,
        "sim_seconds": _r(twin.t),
        "dt_s": twin.dt,
        "nodes": len(twin.nodes),
        "gpus": int(sum(n.gpus for n in twin.nodes)),
        "cells": cells,
        "regions": regions,
        "gpu_fault_events": dict(sorted(by_class.items())),
        "gpu_fault_events_remediable": remediable,
        "gpu_fault_events_phantom": phantom,
        "admission": dict(twin.admission),
        "capacity_errors": twin.capacity_errors,
        "changes": len(twin.changes_log),
    }
