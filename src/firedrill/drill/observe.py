"""What a drill watches, every evaluation step, through the ``Signals`` port.

The runner, its stop conditions and its hypothesis all ask the same few questions — a region's
TTFT p99 over a window, its error ratio, its highest KV-cache usage, its ready replicas, how fast
its nodes pull weights — so one observer reads the series once per step (cheap ``instant``
reads), keeps the running counters per region, and answers every question from that history.

Windows are differences of cumulative counters between two evaluation steps, which is what a
Prometheus ``increase`` over the same window gives up to its extrapolation (a ratio or a
quantile is unaffected by it). A region with no requests in a window has no TTFT p99 (NaN).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from firedrill.detect.promql import bucket_quantile
from firedrill.model.series import Labels
from firedrill.ports import Signals

F64 = npt.NDArray[np.float64]

TTFT_BUCKETS = "vllm:time_to_first_token_seconds_bucket"
REQUESTS = "http_requests_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
READY = "firedrill_replicas_ready"
DESIRED = "firedrill_replicas_desired"
OFFERED = "firedrill_offered_requests_per_second"
HYDRATE_BYTES = "firedrill_hydrate_bytes_total"
PULLS_ACTIVE = "firedrill_hydrate_pulls_active"
NODE_GBPS_PEAK = "firedrill_hydrate_node_gbps_max"
REGISTRY_ERRORS = "firedrill_registry_errors_total"


@dataclass
class _Grouping:
    """Maps the samples of one instant read onto (region[, le]) slots; rebuilt if labels change."""

    labels: Sequence[Labels] = ()
    region: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    le: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    mask: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=bool))


@dataclass(frozen=True)
class Sample:
    """One evaluation step's readings, per region (in ``Observer.regions`` order)."""

    t_s: float
    buckets: F64  # [regions, len(les)] cumulative TTFT bucket counts
    ok: F64  # cumulative 2xx
    bad: F64  # cumulative 5xx
    kv_max: F64
    ready: F64
    desired: F64
    offered: F64
    hydrate_gb: F64  # cumulative GB pulled (origin + peers)
    p2p_gb: F64
    pulls: F64  # serving pulls active now
    node_gbps_peak: F64  # highest GB/s one pulling node reached since the previous scrape
    registry_errors: F64  # cumulative 503 + 429


class Observer:
    """Reads one model's serving series every step and answers windowed questions per region."""

    def __init__(self, signals: Signals, model: str, regions: Sequence[str]) -> None:
        self.signals = signals
        self.model = model
        self.regions = list(regions)
        self._ri = {r: i for i, r in enumerate(self.regions)}
        self.les: list[float] = []
        self.samples: list[Sample] = []
        self.times: list[float] = []
        self._groups: dict[str, _Grouping] = {}

    # -- reading ----------------------------------------------------------------------------------
    def _group(
        self, name: str, labels: Sequence[Labels], *, by_le: bool, where: str = ""
    ) -> _Grouping:
        g = self._groups.get(name)
        if g is not None and _same(g.labels, labels):
            return g
        regions = []
        les = []
        for lab in labels:
            d = dict(lab)
            regions.append(self._ri.get(d.get("region", ""), -1))
            if by_le:
                le = d.get("le", "+Inf")
                bound = math.inf if le == "+Inf" else float(le)
                if bound not in self.les:
                    self.les.append(bound)
                    self.les.sort()
                les.append(bound)
        key, _, want = where.partition("=")
        g = _Grouping(
            mask=np.array([bool(where) and dict(lab).get(key) == want for lab in labels], bool),
            labels=list(labels),
            region=np.array(regions, dtype=np.int64),
            le=np.array([self.les.index(b) for b in les], dtype=np.int64)
            if by_le
            else np.zeros(0, dtype=np.int64),
        )
        self._groups[name] = g
        return g

    def _per_region(
        self, name: str, matchers: dict[str, str], *, reduce: str = "sum", where: str = ""
    ) -> F64 | tuple[F64, F64]:
        """Per-region sums (or maxima) of a selection; with ``where`` ("label=value"), also
        the sums of the samples matching it."""
        _, labels, values = self.signals.instant(name, matchers)
        g = self._group(
            name + repr(sorted(matchers.items())) + where, labels, by_le=False, where=where
        )
        out = np.zeros(len(self.regions))
        vals = np.nan_to_num(np.asarray(values, dtype=np.float64))
        keep = g.region >= 0
        if reduce == "sum":
            np.add.at(out, g.region[keep], vals[keep])
        else:
            np.maximum.at(out, g.region[keep], vals[keep])
        if not where:
            return out
        part = np.zeros(len(self.regions))
        sel = keep & g.mask
        np.add.at(part, g.region[sel], vals[sel])
        return out, part

    def sample(self, t_s: float) -> Sample:
        """Read the latest values; call once per evaluation step, after the world advanced."""
        m = {"model_name": self.model}
        _, labels, values = self.signals.instant(TTFT_BUCKETS, m)
        g = self._group(TTFT_BUCKETS, labels, by_le=True)
        buckets = np.zeros((len(self.regions), max(len(self.les), 1)))
        vals = np.nan_to_num(np.asarray(values, dtype=np.float64))
        keep = g.region >= 0
        if len(labels):
            np.add.at(buckets, (g.region[keep], g.le[keep]), vals[keep])
        requests, bad = self._split(REQUESTS, m, "status=5xx")
        hydrate, p2p = self._split(HYDRATE_BYTES, {}, "source=p2p")
        s = Sample(
            t_s=t_s,
            buckets=buckets,
            ok=requests - bad,
            bad=bad,
            kv_max=self._sum(KV_USAGE, m, reduce="max"),
            ready=self._sum(READY, m),
            desired=self._sum(DESIRED, m),
            offered=self._sum(OFFERED, m),
            hydrate_gb=hydrate / 1e9,
            p2p_gb=p2p / 1e9,
            pulls=self._sum(PULLS_ACTIVE, {}),
            node_gbps_peak=self._sum(NODE_GBPS_PEAK, {}, reduce="max"),
            registry_errors=self._sum(REGISTRY_ERRORS, {}),
        )
        self.samples.append(s)
        self.times.append(t_s)
        return s

    def _sum(self, name: str, matchers: dict[str, str], *, reduce: str = "sum") -> F64:
        out = self._per_region(name, matchers, reduce=reduce)
        assert not isinstance(out, tuple)
        return out

    def _split(self, name: str, matchers: dict[str, str], where: str) -> tuple[F64, F64]:
        out = self._per_region(name, matchers, where=where)
        assert isinstance(out, tuple)
        return out

    # -- windows ----------------------------------------------------------------------------------
    def _at(self, t_s: float) -> int:
        """Index of the last sample at or before ``t_s`` (0 if none)."""
        return max(bisect.bisect_right(self.times, t_s + 1e-9) - 1, 0)

    def _pair(self, window_s: float, end_s: float | None) -> tuple[Sample, Sample] | None:
        if len(self.samples) < 2:
            return None
        j = len(self.samples) - 1 if end_s is None else self._at(end_s)
        i = self._at(self.times[j] - window_s)
        if i >= j:
            return None
        return self.samples[i], self.samples[j]

    def ttft_p99(
        self, region: str, window_s: float, *, end_s: float | None = None, q: float = 0.99
    ) -> float:
        """TTFT quantile in a region over the window ending at ``end_s`` (NaN: no requests)."""
        pair = self._pair(window_s, end_s)
        if pair is None:
            return math.nan
        a, b = pair
        ri = self._ri[region]
        n = min(a.buckets.shape[1], b.buckets.shape[1], len(self.les))
        inc = b.buckets[ri, :n] - a.buckets[ri, :n]
        if n == 0 or inc[-1] <= 0:
            return math.nan
        return bucket_quantile(q, list(zip(self.les[:n], inc.tolist(), strict=True)))

    def error_ratio(
        self, region: str | None, window_s: float, *, end_s: float | None = None
    ) -> float:
        """5xx / all requests over the window, in one region or all (NaN: no requests)."""
        pair = self._pair(window_s, end_s)
        if pair is None:
            return math.nan
        a, b = pair
        sel = slice(None) if region is None else self._ri[region]
        bad = float(np.sum(b.bad[sel] - a.bad[sel]))
        ok = float(np.sum(b.ok[sel] - a.ok[sel]))
        total = bad + ok
        return bad / total if total > 0 else math.nan

    def requests(self, region: str, window_s: float, *, end_s: float | None = None) -> float:
        pair = self._pair(window_s, end_s)
        if pair is None:
            return 0.0
        a, b = pair
        ri = self._ri[region]
        return float(b.bad[ri] - a.bad[ri] + b.ok[ri] - a.ok[ri])

    def gbps_per_node(self, region: str, index: int) -> float:
        """GB/s per pulling node between sample ``index - 1`` and ``index``.

        A 140 GB pull over a 50 GB/s NIC lasts a few seconds, shorter than an evaluation step,
        so pulls active *at* the two samples usually read zero: the twin's per-interval peak
        (``firedrill_hydrate_node_gbps_max``) is used where the world exports it, and the
        bytes pulled over the nodes pulling at either end otherwise.
        """
        if index <= 0 or index >= len(self.samples):
            return 0.0
        a, b = self.samples[index - 1], self.samples[index]
        ri = self._ri[region]
        if b.node_gbps_peak[ri] > 0:
            return float(b.node_gbps_peak[ri])
        dt = b.t_s - a.t_s
        pulls = max(float(b.pulls[ri]), float(a.pulls[ri]))
        if dt <= 0 or pulls <= 0:
            return 0.0
        return float(b.hydrate_gb[ri] - a.hydrate_gb[ri]) / dt / pulls

    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def region_index(self, region: str) -> int:
        return self._ri[region]


def _same(a: Sequence[Labels], b: Sequence[Labels]) -> bool:
    """Cheap check that an instant read returned the same series as last time."""
    return len(a) == len(b) and (not a or (a[0] == b[0] and a[-1] == b[-1]))
