"""In-process evaluation of the cause and guardrail alerts, on the twin's simulated clock.

The burn-rate pages say that users hurt; the cause tickets (``rules.cause_group``) say why: a GPU's
XID, a double-bit ECC error, a node NotReady, a deep queue. The guardrails
(``rules.guardrail_group``) page when auto-remediation itself runs away. A drill on the twin must
raise the same tickets and guardrail pages a real fleet would, at the same evaluation, so
``CauseEvaluator`` computes what the generated rules ask Prometheus 2.x to compute: the same alert
names, the same label sets (the expression's output labels plus the rule's static labels), the same
``for:`` holds. ``tests/detect/test_causes.py`` holds it to that with ``promtool test rules``.

PromQL as mirrored here:

* a range selector takes the samples in [t - range, t], both ends included;
* ``increase``/``rate`` are ``promql.prom_increase`` (Prometheus 2.x extrapolation) over the first
  and last samples, with the value before each counter drop added back as a reset;
* ``changes`` counts consecutive samples in the range whose values differ (NaN equals NaN);
* a comparison without ``bool`` filters and keeps the labels; ``sum``/``max`` keep the ``by``
  labels (``sum`` adds in the series' label order, as Prometheus does); ``and``/``or`` and
  vector/vector division match on every label but the metric name; ``label_replace`` copies
  ``Hostname`` to ``node`` (and ``region`` to ``cell="region:<r>"``) when the source is non-empty;
* ``histogram_quantile`` is ``promql.bucket_quantiles``, and an alert's ``for:`` is
  ``promql.AlertState`` (pending from the first evaluation that returns its labels, firing once
  returned at every evaluation for ``for:``, resolved at the first that does not return it).

Incremental: a family read by a range function keeps one row per evaluation over the longest
range its rules read (1 h for XIDs and ECC, the flapping window for quarantines, 5 m for the
rest) and one column per series that exists. Node and GPU families have series only for the few
GPUs and nodes that ever left their default, so a quiet fleet costs a handful of empty reads.

Where this differs from a Prometheus server:

* **Absent node/GPU series are at their default.** dcgm-exporter publishes every field of every
  GPU from its start (XID 0, ECC and PCIe counters 0), and a remediation controller publishes its
  per-node quarantine counter at 0; the twin stores such a series only once it leaves its
  default. Read by a range function (``changes``, ``increase``, ``rate``), a series that first
  appears after the evaluator's first evaluation is taken to have been 0 at every earlier one,
  so an XID that appears is a change and a first quarantine is an increase of 1, as on a real
  fleet. Pass ``absent_is_zero=False`` to read the series exactly as they come. The promtool
  test exports them the same way (0 from the first scrape).
* **Instant selectors see only this evaluation's samples.** Prometheus also returns a series'
  sample from up to 5 m back unless a staleness marker ended it; the twin writes every series at
  every scrape and never drops one, so the two agree there.
* **One evaluation per scrape time.** A call that finds no scrape newer than the last evaluation
  returns nothing (Prometheus evaluates a group once per interval).
* Prometheus rejects an alert whose expression returns two samples with the same label set; the
  rules here cannot produce one, and no check is made.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from firedrill.detect.promql import (
    AlertEvent,
    AlertState,
    bucket_quantiles,
    fdiv,
    prom_increase,
)
from firedrill.detect.rules import APP_XIDS, FATAL_XIDS, cause_group, guardrail_group
from firedrill.detect.slo import SloSpec, duration_s
from firedrill.model.series import Labels
from firedrill.ports import Signals

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

# Series the cause and guardrail rules read.
TTFT_BUCKET = "vllm:time_to_first_token_seconds_bucket"
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"
XID = "DCGM_FI_DEV_XID_ERRORS"
ECC_DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
ROW_REMAP = "DCGM_FI_DEV_ROW_REMAP_PENDING"
PCIE_REPLAY = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
POWER_VIOLATION = "DCGM_FI_DEV_POWER_VIOLATION"
REGISTRY_ERRORS = "firedrill_registry_errors_total"
NODE_CONDITION = "kube_node_status_condition"
NODE_TAINT = "kube_node_spec_taint"
QUARANTINES = "gpu_quarantine_actions_total"
CELL_NODES = "firedrill_cell_nodes"
QUARANTINE_KEY = "gpu.corp/quarantine"

# Node/GPU families read by range functions whose series are 0 until they first appear.
ZERO_UNTIL_SEEN = frozenset({XID, ECC_DBE, PCIE_REPLAY, POWER_VIOLATION, QUARANTINES})

_NOT_READY = {"condition": "Ready", "status": "false"}
_POOL = frozenset({"cell", "region", "model_name"})
_POOL_LE = _POOL | {"le"}
_CELL = frozenset({"cell", "region"})
_CELL_NODE = _CELL | {"node"}
_REGION_CODE = frozenset({"region", "code"})
_FATAL = frozenset(float(x) for x in FATAL_XIDS)
_APP = frozenset(float(x) for x in APP_XIDS)
_NVLINK = frozenset({74.0})
_MS = 1000

Samples = dict[Labels, float]  # an instant vector: labels (no metric name) -> value


def _ms(seconds: float) -> int:
    return round(seconds * _MS)


def _as_written(x: float) -> float:
    """A threshold as the rule text carries it (``rules._fmt``: 10 significant digits)."""
    return float(f"{x:.10g}")


def _project(labels: Labels, by: frozenset[str]) -> Labels:
    return tuple((k, v) for k, v in labels if k in by)


def _with(labels: Labels, key: str, value: str) -> Labels:
    return tuple(sorted({**dict(labels), key: value}.items()))


def _copy_label(labels: Labels, dst: str, src: str, prefix: str = "") -> Labels:
    """``label_replace(v, dst, "<prefix>$1", src, "(.+)")``: only a non-empty source matches."""
    value = dict(labels).get(src, "")
    return _with(labels, dst, prefix + value) if value else labels


def _sum_by(labels: Sequence[Labels], values: Iterable[float], by: frozenset[str]) -> Samples:
    """``sum by (...)``, adding in label order as Prometheus walks its sorted series."""
    out: Samples = {}
    for lab, v in sorted(zip(labels, values, strict=True)):
        key = _project(lab, by)
        out[key] = out[key] + v if key in out else v
    return out


def _max_by(labels: Sequence[Labels], values: Iterable[float], by: frozenset[str]) -> Samples:
    """``max by (...)``: a NaN is replaced by any later value, as Prometheus does."""
    out: Samples = {}
    for lab, v in sorted(zip(labels, values, strict=True)):
        key = _project(lab, by)
        if key not in out or out[key] < v or math.isnan(out[key]):
            out[key] = v
    return out


def _divide(a: Samples, b: Samples) -> Samples:
    """Vector / vector, one-to-one on all labels."""
    return {key: fdiv(num, b[key]) for key, num in a.items() if key in b}


@dataclass(frozen=True)
class _Histograms:
    """Where each ``sum by (pool, le)`` group goes in a [pools, bounds] matrix."""

    keys: int  # groups this layout was made for
    pools: list[Labels]
    bounds: F64  # sorted distinct upper bounds
    pool_of: I64  # per group
    bound_of: I64  # per group; -1 without a numeric ``le`` (histogram_quantile skips it)

    @classmethod
    def of(cls, keys: Sequence[Labels]) -> _Histograms:
        parsed: list[float | None] = []
        for lab in keys:
            try:
                parsed.append(float(dict(lab).get("le", "")))
            except ValueError:
                parsed.append(None)
        bounds = np.array(sorted({b for b in parsed if b is not None}), dtype=np.float64)
        pools: dict[Labels, int] = {}
        pool_of = [pools.setdefault(_project(lab, _POOL), len(pools)) for lab in keys]
        bound_of = [-1 if b is None else int(np.searchsorted(bounds, b)) for b in parsed]
        return cls(
            len(keys),
            list(pools),
            bounds,
            np.array(pool_of, dtype=np.int64),
            np.array(bound_of, dtype=np.int64),
        )


@dataclass(frozen=True)
class _Span:
    """What range functions need of each series with a sample in [now - range, now]."""

    cols: I64  # the window's columns
    n: I64  # samples in the range
    first: F64
    last: F64
    t_first_ms: I64
    t_last_ms: I64
    resets: F64  # the value before each counter drop, summed
    changes: I64


class _Window:
    """One family's samples at each evaluation of the last ``keep_ms``: rows are evaluations,
    columns series; old rows are dropped when the buffer fills, so memory follows the range."""

    def __init__(self, keep_ms: int, *, zero_until_seen: bool) -> None:
        self.keep_ms = keep_ms
        self.zero_until_seen = zero_until_seen
        self.labels: list[Labels] = []
        self._column: dict[Labels, int] = {}
        self._seen: list[Labels] = []
        self._seen_cols: I64 = np.zeros(0, dtype=np.int64)
        self.t_ms: I64 = np.zeros(64, dtype=np.int64)
        self.values: F64 = np.zeros((64, 0))
        self.present: B = np.zeros((64, 0), dtype=bool)
        self.n = 0
        self._groups: dict[frozenset[str], tuple[list[Labels], I64, I64]] = {}

    def groups(self, by: frozenset[str]) -> tuple[list[Labels], I64, I64]:
        """``sum by``'s groups: their labels, each column's group, each column's label rank."""
        hit = self._groups.get(by)
        if hit is None or hit[1].size != len(self.labels):
            keys: dict[Labels, int] = {}
            group = [keys.setdefault(_project(lab, by), len(keys)) for lab in self.labels]
            rank = np.empty(len(self.labels), dtype=np.int64)
            rank[sorted(range(len(self.labels)), key=self.labels.__getitem__)] = np.arange(
                len(self.labels)
            )
            hit = (list(keys), np.array(group, dtype=np.int64), rank)
            self._groups[by] = hit
        return hit

    def sum_by(self, cols: I64, values: F64, by: frozenset[str]) -> tuple[list[Labels], F64, B]:
        """``sum by (...)`` of values at ``cols``: every group's labels, sum, and whether any
        column fell in it. Sums add in label order, as Prometheus walks its sorted series."""
        keys, group, rank = self.groups(by)
        sums = np.zeros(len(keys))
        hit = np.zeros(len(keys), dtype=bool)
        if cols.size:
            order = np.argsort(rank[cols], kind="stable")
            np.add.at(sums, group[cols][order], values[order])
            hit[group[cols]] = True
        return keys, sums, hit

    def _columns_of(self, labels: Sequence[Labels]) -> I64:
        listed = list(labels)
        if listed == self._seen:  # the same series as last time: the usual case
            return self._seen_cols
        new = [lab for lab in dict.fromkeys(listed) if lab not in self._column]
        if new:
            first = len(self.labels)
            for lab in new:
                self._column[lab] = len(self.labels)
                self.labels.append(lab)
            rows = self.t_ms.size
            grown_v = np.zeros((rows, len(self.labels)))
            grown_p = np.zeros((rows, len(self.labels)), dtype=bool)
            grown_v[:, :first] = self.values
            grown_p[:, :first] = self.present
            # Earlier evaluations saw the series at its default, or not at all.
            grown_p[: self.n, first:] = self.zero_until_seen
            self.values, self.present = grown_v, grown_p
        self._seen = listed
        self._seen_cols = np.array([self._column[lab] for lab in listed], dtype=np.int64)
        return self._seen_cols

    def append(self, t_ms: int, labels: Sequence[Labels], values: F64) -> None:
        cols = self._columns_of(labels)
        if self.n == self.t_ms.size:
            self._make_room(t_ms)
        k = self.n
        self.t_ms[k] = t_ms
        self.present[k] = False
        self.present[k, cols] = True
        self.values[k, cols] = values
        self.n += 1

    def _make_room(self, t_ms: int) -> None:
        keep = int(np.searchsorted(self.t_ms[: self.n], t_ms - self.keep_ms, side="left"))
        if keep > 0:
            live = self.n - keep
            self.t_ms[:live] = self.t_ms[keep : self.n]
            self.values[:live] = self.values[keep : self.n]
            self.present[:live] = self.present[keep : self.n]
            self.n = live
        if self.n == self.t_ms.size:
            rows = 2 * self.t_ms.size
            t_new = np.zeros(rows, dtype=np.int64)
            v_new = np.zeros((rows, len(self.labels)))
            p_new = np.zeros((rows, len(self.labels)), dtype=bool)
            t_new[: self.n] = self.t_ms[: self.n]
            v_new[: self.n] = self.values[: self.n]
            p_new[: self.n] = self.present[: self.n]
            self.t_ms, self.values, self.present = t_new, v_new, p_new

    def latest(self) -> tuple[I64, F64]:
        """Columns with a sample at the latest evaluation, and those samples."""
        if self.n == 0 or not self.labels:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        cols = np.flatnonzero(self.present[self.n - 1]).astype(np.int64)
        out: F64 = self.values[self.n - 1, cols]
        return cols, out

    def span(self, range_ms: int) -> _Span | None:
        """Per series with a sample in [now - range, now]: what range functions read."""
        if self.n == 0 or not self.labels:
            return None
        k0 = int(np.searchsorted(self.t_ms[: self.n], self.t_ms[self.n - 1] - range_ms, "left"))
        present = self.present[k0 : self.n]
        cols = np.flatnonzero(present.any(axis=0)).astype(np.int64)
        if cols.size == 0:
            return None
        p = present[:, cols]
        v = self.values[k0 : self.n][:, cols]
        t = self.t_ms[k0 : self.n]
        rows = np.arange(p.shape[0])[:, None]
        upto = np.maximum.accumulate(np.where(p, rows, -1), axis=0)  # last sample at or before
        before = np.vstack([np.full((1, cols.size), -1), upto[:-1]])  # last sample before
        pair = p & (before >= 0)
        prev = np.take_along_axis(v, np.maximum(before, 0), axis=0)
        with np.errstate(invalid="ignore"):
            resets = np.where(pair & (v < prev), prev, 0.0).sum(axis=0)
            changed = pair & (v != prev) & ~(np.isnan(v) & np.isnan(prev))
        first_row = p.argmax(axis=0)
        last_row = upto[-1]
        idx = np.arange(cols.size)
        return _Span(
            cols=cols,
            n=p.sum(axis=0).astype(np.int64),
            first=v[first_row, idx],
            last=v[last_row, idx],
            t_first_ms=t[first_row],
            t_last_ms=t[last_row],
            resets=resets,
            changes=changed.sum(axis=0).astype(np.int64),
        )


@dataclass
class _Rule:
    expr: Callable[[], Samples]
    state: AlertState  # its alerts' ``for:`` state

    @property
    def alertname(self) -> str:
        return self.state.alertname


_READS: tuple[tuple[str, Mapping[str, str]], ...] = (
    (TTFT_BUCKET, {}),
    (WAITING, {}),
    (RUNNING, {}),
    (KV_USAGE, {}),
    (PREEMPTIONS, {}),
    (XID, {}),
    (ECC_DBE, {}),
    (ROW_REMAP, {}),
    (PCIE_REPLAY, {}),
    (GPU_TEMP, {}),
    (POWER_VIOLATION, {}),
    (REGISTRY_ERRORS, {}),
    (NODE_CONDITION, _NOT_READY),
    (NODE_TAINT, {"key": QUARANTINE_KEY}),
    (QUARANTINES, {}),
    (CELL_NODES, {}),
)


class CauseEvaluator:
    """Evaluates every cause and guardrail alert at each call of ``evaluate``."""

    def __init__(self, spec: SloSpec, signals: Signals, *, absent_is_zero: bool = True) -> None:
        self.spec = spec
        self.signals = signals
        self.events: list[AlertEvent] = []
        self.evaluations = 0
        self._now_ms = -1
        self._instant: dict[str, tuple[Sequence[Labels], F64]] = {}
        self._histograms: _Histograms | None = None
        c, g = spec.causes, spec.guardrails
        self._flapping_ms = _ms(duration_s(g.flapping_window))
        ranges_ms = {
            TTFT_BUCKET: _ms(300),
            PREEMPTIONS: _ms(300),
            XID: _ms(3600),
            ECC_DBE: _ms(3600),
            PCIE_REPLAY: _ms(300),
            POWER_VIOLATION: _ms(300),
            REGISTRY_ERRORS: _ms(300),
            QUARANTINES: max(_ms(3600), self._flapping_ms),
        }
        self._windows = {
            name: _Window(keep, zero_until_seen=absent_is_zero and name in ZERO_UNTIL_SEEN)
            for name, keep in ranges_ms.items()
        }
        exprs: dict[str, Callable[[], Samples]] = {
            "PodTTFTHigh": lambda: self._pod_ttft_high(_as_written(c.pod_ttft_p99_s)),
            "VllmQueueDeep": lambda: self._queue_deep(_as_written(c.queue_to_running_ratio)),
            "KVCacheHigh": lambda: self._above(
                _max_by(*self._read(KV_USAGE), _POOL), _as_written(c.kv_usage)
            ),
            "VllmPreemptions": lambda: self._above(
                self._sum(PREEMPTIONS, self._rate(PREEMPTIONS, 300), _POOL), 0.0
            ),
            "DCGMXidFatal": lambda: self._xid(_FATAL, 900, 1),
            "DCGMXidNVLink": lambda: self._xid(_NVLINK, 900, 1),
            "DCGMXidAppRepeated": lambda: self._xid(_APP, 3600, 2),
            "DCGMEccDbe": lambda: self._per_gpu(
                self._labelled(ECC_DBE, self._increase(ECC_DBE, 3600)), 0.0
            ),
            "DCGMRowRemapPending": lambda: self._per_gpu(self._read(ROW_REMAP), 0.0),
            "DCGMPcieReplayStorm": lambda: self._per_gpu(
                self._labelled(PCIE_REPLAY, self._increase(PCIE_REPLAY, 300)),
                _as_written(c.pcie_replays_per_5m),
            ),
            "GPUThermalViolation": lambda: self._thermal(_as_written(c.gpu_temp_c)),
            "HydrateOrigin5xx": self._hydrate_origin_5xx,
            "NodeNotReady": self._node_not_ready,
            "QuarantineRateAnomalous": lambda: self._above(
                self._sum(QUARANTINES, self._increase(QUARANTINES, 3600), _CELL),
                float(g.quarantines_per_cell_hour),
            ),
            "NodeRemediationFlapping": lambda: {
                k: v
                for k, v in self._sum(
                    QUARANTINES, self._increase(QUARANTINES, self._flapping_ms / _MS), _CELL_NODE
                ).items()
                if v >= 2
            },
            "QuarantinedFractionHigh": lambda: self._above(
                _divide(
                    _sum_by(*self._read(NODE_TAINT), _CELL), _sum_by(*self._read(CELL_NODES), _CELL)
                ),
                _as_written(g.quarantined_fraction),
            ),
        }
        rule_dicts = [r for grp in (cause_group(spec), guardrail_group(spec)) for r in grp["rules"]]
        names = [str(r["alert"]) for r in rule_dicts]
        if sorted(names) != sorted(exprs):
            raise ValueError(
                f"the cause evaluator mirrors {sorted(exprs)} but the rules define {sorted(names)}"
            )
        self.rules = [
            _Rule(
                expr=exprs[name],
                state=AlertState(
                    alertname=name,
                    for_ms=_ms(duration_s(str(r.get("for", "0s")))),
                    static={str(k): str(v) for k, v in r.get("labels", {}).items()},
                ),
            )
            for name, r in zip(names, rule_dicts, strict=True)
        ]

    @property
    def started(self) -> bool:
        return self.evaluations > 0

    # -- reading -----------------------------------------------------------------------------

    def evaluate(self) -> list[AlertEvent]:
        """Read the latest samples and evaluate every rule; return the state changes."""
        reads: dict[str, tuple[Sequence[Labels], F64]] = {}
        t_s = 0.0
        for i, (name, matchers) in enumerate(_READS):
            t, labels, values = self.signals.instant(name, matchers)
            if i == 0:
                t_s = t
            reads[name] = (labels, np.asarray(values, dtype=np.float64))
        now_ms = _ms(t_s)
        if now_ms <= self._now_ms:
            return []
        self._now_ms = now_ms
        self._instant = reads
        for name, window in self._windows.items():
            window.append(now_ms, *reads[name])
        self.evaluations += 1
        out: list[AlertEvent] = []
        for rule in self.rules:
            out += self._step(rule, rule.expr(), t_s)
        self.events.extend(out)
        return out

    def _read(self, name: str) -> tuple[list[Labels], list[float]]:
        labels, values = self._instant[name]
        return list(labels), values.tolist()

    def _increase(self, name: str, range_s: float) -> tuple[I64, F64]:
        """``increase(name[range])``: the window's columns with two samples or more in the
        range, and their increases."""
        window = self._windows[name]
        span = window.span(_ms(range_s))
        if span is None:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        ok = (span.n >= 2) & (span.t_last_ms > span.t_first_ms)
        end_s = self._now_ms / _MS
        start_s = (self._now_ms - _ms(range_s)) / _MS
        inc = np.full(span.cols.size, np.nan)
        for t_last in np.unique(span.t_last_ms[ok]):
            m = ok & (span.t_last_ms == t_last)
            inc[m] = prom_increase(
                span.first[m],
                span.last[m] + span.resets[m],
                span.t_first_ms[m] / _MS,
                float(t_last) / _MS,
                span.n[m],
                start_s,
                end_s,
            )
        out: F64 = inc[ok]
        return span.cols[ok], out

    def _rate(self, name: str, range_s: float) -> tuple[I64, F64]:
        cols, inc = self._increase(name, range_s)
        out: F64 = inc / range_s
        return cols, out

    def _labelled(self, name: str, found: tuple[I64, F64]) -> tuple[list[Labels], list[float]]:
        labels = self._windows[name].labels
        return [labels[c] for c in found[0].tolist()], found[1].tolist()

    def _sum(self, name: str, found: tuple[I64, F64], by: frozenset[str]) -> Samples:
        """``sum by (...)`` of a range function's result over one family."""
        keys, sums, hit = self._windows[name].sum_by(*found, by)
        return {keys[i]: float(sums[i]) for i in np.flatnonzero(hit).tolist()}

    # -- expressions -------------------------------------------------------------------------

    @staticmethod
    def _above(samples: Samples, threshold: float) -> Samples:
        return {k: v for k, v in samples.items() if v > threshold}

    @staticmethod
    def _per_gpu(read: tuple[list[Labels], list[float]], threshold: float) -> Samples:
        """``label_replace(expr > threshold, "node", "$1", "Hostname", "(.+)")``."""
        return {
            _copy_label(lab, "node", "Hostname"): v
            for lab, v in zip(*read, strict=True)
            if v > threshold
        }

    def _pod_ttft_high(self, threshold_s: float) -> Samples:
        """``histogram_quantile(0.99, sum by (pool, le) (rate(bucket[5m]))) > threshold``."""
        window = self._windows[TTFT_BUCKET]
        keys, sums, hit = window.sum_by(*self._rate(TTFT_BUCKET, 300), _POOL_LE)
        if not hit.any():
            return {}
        if self._histograms is None or self._histograms.keys != len(keys):
            self._histograms = _Histograms.of(keys)
        h = self._histograms
        valid = hit & (h.bound_of >= 0)
        counts = np.zeros((len(h.pools), h.bounds.size))
        present = np.zeros((len(h.pools), h.bounds.size), dtype=bool)
        # Sums with the same pool and bound ("1" and "1.0") coalesce, as Prometheus does.
        np.add.at(counts, (h.pool_of[valid], h.bound_of[valid]), sums[valid])
        present[h.pool_of[valid], h.bound_of[valid]] = True
        q = bucket_quantiles(0.99, h.bounds, counts, present)
        return {
            h.pools[i]: float(q[i])
            for i in np.flatnonzero(present.any(axis=1) & (q > threshold_s)).tolist()
        }

    def _queue_deep(self, ratio: float) -> Samples:
        waiting = _sum_by(*self._read(WAITING), _POOL)
        running = _sum_by(*self._read(RUNNING), _POOL)
        return self._above(_divide(waiting, running), ratio)

    def _xid(self, xids: frozenset[float], range_s: float, min_changes: int) -> Samples:
        """``label_replace((XID == x or ...) and changes(XID[range]) >= n, "node", ...)``."""
        window = self._windows[XID]
        cols, values = window.latest()
        hits = [(c, v) for c, v in zip(cols.tolist(), values.tolist(), strict=True) if v in xids]
        if not hits:
            return {}
        span = window.span(_ms(range_s))
        if span is None:
            return {}
        changes = dict(zip(span.cols.tolist(), span.changes.tolist(), strict=True))
        return {
            _copy_label(window.labels[c], "node", "Hostname"): v
            for c, v in hits
            if changes.get(c, 0) >= min_changes
        }

    def _thermal(self, temp_c: float) -> Samples:
        """``(TEMP > t) or (rate(POWER_VIOLATION[5m]) > 0)``: where both hold, the temperature."""
        hot = {lab: v for lab, v in zip(*self._read(GPU_TEMP), strict=True) if v > temp_c}
        for lab, v in zip(
            *self._labelled(POWER_VIOLATION, self._rate(POWER_VIOLATION, 300)), strict=True
        ):
            if v > 0 and lab not in hot:
                hot[lab] = v
        return {_copy_label(lab, "node", "Hostname"): v for lab, v in hot.items()}

    def _hydrate_origin_5xx(self) -> Samples:
        rates = self._rate(REGISTRY_ERRORS, 300)
        errors = self._above(self._sum(REGISTRY_ERRORS, rates, _REGION_CODE), 0.0)
        return {_copy_label(lab, "cell", "region", "region:"): v for lab, v in errors.items()}

    def _node_not_ready(self) -> Samples:
        labels, values = self._read(NODE_CONDITION)
        return {lab: v for lab, v in zip(labels, values, strict=True) if v == 1.0}

    # -- alert state -------------------------------------------------------------------------

    def _step(self, rule: _Rule, samples: Samples, t_s: float) -> list[AlertEvent]:
        return rule.state.step(samples, now_ms=self._now_ms, t_s=t_s)

    def firing(self) -> list[AlertEvent]:
        """Every alert firing now: when it fired, its labels, its latest value."""
        return [e for r in self.rules for e in r.state.firing()]

    def pending(self) -> list[AlertEvent]:
        """Every alert waiting out its ``for:``: since when, its labels, its latest value."""
        return [e for r in self.rules for e in r.state.pending()]
