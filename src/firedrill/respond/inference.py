"""Inference SLO runbooks: KV pressure and preemption storms, prefill/decode imbalance.

* **KV OOMs and preemptions** (``KVCacheHigh``, ``VllmPreemptions``). Reference 000: "a
  max_num_seqs or gpu_memory_utilization change [in the CatalogBundle] causes KV OOMs". When a
  bundle change precedes the symptom, the model owner's first lever is moving the bundle label
  back (``bundle_revert``, planned in ``firedrill.respond.bundle``) to the serving config the
  change replaced, read from the change itself, whichever bundle change ranks highest; the
  serving runbook's levers follow.
* **Prefill/decode imbalance** (``PrefillDecodeImbalance``: one role saturated, the other idle).
  The split is rebalanced toward what the offered load needs (``pd_rebalance``): each role's
  replicas needed at saturation throughput (``firedrill_pd_replicas_needed``), averaged over the
  last five minutes, give the share of prefill replicas that loads both roles alike. Autoscalers
  fight the responder during incidents (reference 000), and a scaler that sees a saturated pool
  scales it out whole, adding replicas in the wrong split: the cell's scaler is paused first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from firedrill.model.series import Series
from firedrill.ports import Signals
from firedrill.respond.bundle import bundle_revert
from firedrill.respond.bundle import parse_serving_config as parse_serving_config
from firedrill.respond.levers import Lever, ModelsParams, SplitParams
from firedrill.respond.responder import (
    Candidate,
    RunbookContext,
    lever_key,
    serving_runbook,
)
from firedrill.respond.suspects import Suspect, Symptom

SHARE = "firedrill_pd_prefill_share"
NEEDED = "firedrill_pd_replicas_needed"
WINDOW_S = 300.0  # averaging window of the load each role needs
MIN_SHIFT = 0.05  # a split closer than this to the balanced one is left alone
SHARE_RANGE = (0.1, 0.9)  # never leave a role with less than a tenth of the pool


def bundle_candidates(suspects: Sequence[Suspect]) -> list[Candidate]:
    """A CatalogBundle change before onset: move the label back to the config it replaced."""
    found = bundle_revert(suspects)
    return [] if found is None else [Candidate(*found)]


def _mean(series: Sequence[Series]) -> dict[str, float]:
    """Mean of each series over its window, by model."""
    out: dict[str, float] = {}
    for s in series:
        vals = s.values[np.isfinite(s.values)]
        if vals.size:
            out[dict(s.labels).get("model_name", "")] = float(vals.mean())
    return out


def balanced_share(need_prefill: float, need_decode: float) -> float:
    """The prefill share that loads both roles alike, within ``SHARE_RANGE``, to 0.05."""
    total = need_prefill + need_decode
    if total <= 0:
        return 0.5
    share = round(20.0 * need_prefill / total) / 20.0
    return min(max(share, SHARE_RANGE[0]), SHARE_RANGE[1])


def pd_runbook(
    symptom: Symptom, signals: Signals, *, at_s: float, window_s: float = WINDOW_S
) -> list[Candidate]:
    """Pause the cell's scaler, then move the split of each unbalanced disaggregated model."""
    where = {"cell": symptom.cell}
    start = at_s - window_s
    shares = _mean(signals.query(SHARE, where, start_s=start, end_s=at_s))
    need_p = _mean(signals.query(NEEDED, {**where, "role": "prefill"}, start_s=start, end_s=at_s))
    need_d = _mean(signals.query(NEEDED, {**where, "role": "decode"}, start_s=start, end_s=at_s))
    out: list[Candidate] = []
    for model in sorted(shares):
        if model not in need_p or model not in need_d:
            continue
        now = shares[model]
        target = balanced_share(need_p[model], need_d[model])
        if abs(target - now) < MIN_SHIFT:
            continue
        hot = "prefill" if target > now else "decode"
        out.append(
            Candidate(
                Lever("scaler_pause", symptom.cell, ModelsParams((model,))),
                f"{model} in {symptom.cell}: pin the scaler before the split moves; it sees a "
                f"saturated pool and scales it out whole, in the wrong split",
                prerequisite=True,
            )
        )
        out.append(
            Candidate(
                Lever("pd_rebalance", symptom.cell, SplitParams(model, target)),
                f"{model} in {symptom.cell}: {hot} saturated; the offered load needs "
                f"{need_p[model]:.1f} prefill and {need_d[model]:.1f} decode replicas, so "
                f"prefill {now:.0%} -> {target:.0%} of the pool",
            )
        )
    return out


def pd_imbalance_runbook(ctx: RunbookContext) -> list[Candidate]:
    """Prefill/decode imbalance: rebalance the pools (nothing without the signals)."""
    if ctx.signals is None:
        return []
    return pd_runbook(ctx.symptom, ctx.signals, at_s=ctx.at_s)


def kv_oom_runbook(ctx: RunbookContext) -> list[Candidate]:
    """A bundle change before onset: revert it first; then the serving runbook's levers."""
    out = bundle_candidates(ctx.causes)
    seen = {lever_key(c.request) for c in out}
    out += [c for c in serving_runbook(ctx) if lever_key(c.request) not in seen]
    return out
