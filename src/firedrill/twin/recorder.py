"""In-memory series store: what the twin exports, under the real exporters' names.

Two kinds of storage, because a fleet has two kinds of series:

* **dense** families (per pool or per region, a few thousand series): one float per scrape per
  series in a preallocated column array, so recording is one vectorised row write;
* **sparse** node/GPU series (tens of thousands that are almost always at their default): recorded
  as change points only and materialised onto the scrape grid when queried or exported. A node
  series that never left its default is not stored (so ``DCGM_FI_DEV_XID_ERRORS`` has series only
  for GPUs that reported an XID), which is what every PromQL rule here reads anyway (``> 0``).

A day of a 10,000-node fleet is some 22,000 dense columns over 5,761 scrapes, so how a dense row
is kept decides the run's memory. Scrapes land in a float64 block of ``BLOCK_SCRAPES`` rows; a
full block moves into the family's column array as float32 offsets from the block's first row
when every value comes back bit for bit (counters: a block's increase is small even when the
count is past 2**24; gauges that float32 holds), and the family turns float64 for good the first
time one does not. Reads always return float64, so what a query sees is exactly what was
written; the long array is allocated, not touched, so memory grows with the run instead of being
committed for the whole hint up front. A store may also be told to keep only some families
(``restrict``): an export that names its families then does not pay to record the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from firedrill.model.series import Labels, Series

F64 = npt.NDArray[np.float64]
Rows = npt.NDArray[np.float32] | npt.NDArray[np.float64]

# Series the twin writes under its own names as change points only (``set_sparse``): they exist in
# a run once something changes, so an export may name them before they do. (The real exporters'
# sparse families, DCGM's and kube-state-metrics', are in ``firedrill.model.exporters``.)
TWIN_SPARSE_NAMES = (
    "firedrill_admission_mode_info",
    "firedrill_admission_requests_total",
    "firedrill_bundle_digest_info",
    "firedrill_ready_gate_refusals_total",
    "firedrill_weights_digest_info",
    "gpu_quarantine_actions_total",
)

# Scrapes per staging block: 16 minutes at a 15 s scrape interval; a block of the 10K fleet's
# dense families is about 11 MB.
BLOCK_SCRAPES = 64


@dataclass
class _Family:
    name: str
    labels: list[Labels]
    # [capacity, series]: scrapes [0, committed) of the store. While the family is float32, a
    # committed value is ``rows[k] + bases[k // BLOCK_SCRAPES]`` (float64 addition), which
    # reproduced every value of its block bit for bit when the block was committed.
    rows: Rows
    bases: F64  # [capacity blocks, series]: each block's first row (0 where not finite)
    stage: F64  # [BLOCK_SCRAPES, series]: scrapes [committed, committed + BLOCK_SCRAPES)

    @property
    def narrow(self) -> bool:
        return self.rows.dtype == np.float32

    def column(self, lo: int, hi: int, i: int, committed: int) -> F64:
        """Scrapes [lo, hi) of column ``i`` as a new float64 array."""
        if hi <= committed:
            return self._committed(lo, hi, i)
        if lo >= committed:
            return self.stage[lo - committed : hi - committed, i].copy()
        return np.concatenate([self._committed(lo, committed, i), self.stage[: hi - committed, i]])

    def _committed(self, lo: int, hi: int, i: int) -> F64:
        out = self.rows[lo:hi, i].astype(np.float64)
        if self.narrow:
            out += self.bases[np.arange(lo, hi) // BLOCK_SCRAPES, i]
        return out

    def commit(self, lo: int) -> None:
        """Move the full staging block into scrapes [lo, lo + BLOCK_SCRAPES)."""
        block = self.stage
        hi = lo + BLOCK_SCRAPES
        if self.narrow:
            base = block[0].copy()
            base[~np.isfinite(base)] = 0.0
            target = self.rows[lo:hi]
            with np.errstate(over="ignore", invalid="ignore"):
                np.subtract(block, base, out=target, casting="same_kind")
            back = target.astype(np.float64)
            back += base
            if bool(np.equal(back.view(np.int64), block.view(np.int64)).all()) or bool(
                np.array_equal(back, block, equal_nan=True) and _same_zero_signs(back, block)
            ):  # bit for bit, or equal up to NaN payloads
                self.bases[lo // BLOCK_SCRAPES] = base
                block.fill(np.nan)
                return
            self.widen(lo)
        self.rows[lo:hi] = block
        block.fill(np.nan)

    def widen(self, committed: int) -> None:
        """Turn float64 for good (a value that float32 does not keep exactly)."""
        if not self.narrow:
            return
        wide = np.empty(self.rows.shape, dtype=np.float64)
        wide[:committed] = self.rows[:committed]
        wide[:committed] += np.repeat(self.bases[: committed // BLOCK_SCRAPES], BLOCK_SCRAPES, 0)
        self.rows = wide


@dataclass
class _Sparse:
    t_s: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


def _same_zero_signs(a: F64, b: F64) -> bool:
    return bool(np.array_equal(np.signbit(a) & (a == 0), np.signbit(b) & (b == 0)))


def _rows(capacity: int, width: int) -> Rows:
    # np.empty: pages are committed as blocks move in, not for the whole capacity at once
    return np.empty((capacity, width), dtype=np.float32)


def _bases(capacity: int, width: int) -> F64:
    return np.zeros((-(-capacity // BLOCK_SCRAPES), width))


def _stage(width: int) -> F64:
    return np.full((BLOCK_SCRAPES, width), np.nan)


class SeriesStore:
    """Implements the ``Signals`` port over the twin's recorded scrapes."""

    def __init__(self, scrape_interval_s: float, capacity: int) -> None:
        self.interval_s = scrape_interval_s
        self.capacity = max(capacity, 1)
        self.families: dict[str, _Family] = {}
        self.sparse: dict[str, dict[Labels, _Sparse]] = {}
        self.times: list[float] = []
        self.committed = 0  # scrapes moved from the staging blocks into the column arrays
        self._by_name: dict[str, list[str]] = {}
        self._keep: Callable[[str], bool] | None = None
        self._dropped: set[str] = set()
        self._selections: dict[
            tuple[str, tuple[tuple[str, str], ...]], list[tuple[str, list[Labels], list[int]]]
        ] = {}

    # -- what is kept ---------------------------------------------------------------------------
    def restrict(self, keep: Callable[[str], bool]) -> None:
        """Keep only the series whose name ``keep`` accepts, from now on; drop the others."""
        self._keep = keep
        for key in [k for k, fam in self.families.items() if not keep(fam.name)]:
            fam = self.families.pop(key)
            self._by_name[fam.name].remove(key)
            if not self._by_name[fam.name]:
                del self._by_name[fam.name]
            self._dropped.add(key)
        for name in [n for n in self.sparse if not keep(n)]:
            del self.sparse[name]
        self._selections = {}

    # -- writing ------------------------------------------------------------------------------
    def family(self, key: str, labels: list[Labels]) -> None:
        """Register a dense family; ``key`` is the series name, or 'name|variant' when one name
        is written in parts (e.g. one part per status code)."""
        name = key.split("|", 1)[0]
        if self._keep is not None and not self._keep(name):
            self._dropped.add(key)
            return
        rows = _rows(self.capacity, len(labels))
        rows[: self.committed] = np.nan  # a family registered mid-run did not exist before
        bases = _bases(self.capacity, len(labels))
        self.families[key] = _Family(name, labels, rows, bases, _stage(len(labels)))
        self._by_name.setdefault(name, []).append(key)
        # a family registered mid-run (a new digest's counters) joins cached selections of its name
        self._selections = {k: v for k, v in self._selections.items() if k[0] != name}

    def fill(self, key: str, value: float, *, until_k: int) -> None:
        """Set every scrape before ``until_k`` of a family registered mid-run to ``value``."""
        fam = self.families.get(key)
        if fam is None:
            return
        done = min(until_k, self.committed)
        if fam.narrow and (
            done < self.committed
            or float(np.float32(value)) != value
            or math.copysign(1, value) < 0
        ):
            fam.widen(self.committed)
        fam.rows[:done] = value
        fam.bases[: done // BLOCK_SCRAPES] = 0.0
        if until_k > self.committed:
            fam.stage[: until_k - self.committed] = value

    def begin_scrape(self, t_s: float) -> int:
        k = len(self.times)
        if k - self.committed >= BLOCK_SCRAPES:
            self._commit()
        self.times.append(t_s)
        return k

    def write(self, name: str, k: int, values: F64) -> None:
        fam = self.families.get(name)
        if fam is not None:
            fam.stage[k - self.committed, :] = values
        elif name not in self._dropped:
            raise KeyError(name)

    def set_sparse(self, name: str, labels: Labels, t_s: float, value: float) -> None:
        if self._keep is not None and not self._keep(name):
            return
        log = self.sparse.setdefault(name, {}).setdefault(labels, _Sparse())
        if log.values and log.values[-1] == value:
            return
        if log.t_s and log.t_s[-1] == t_s:
            log.values[-1] = value
            return
        log.t_s.append(t_s)
        log.values.append(value)

    def _commit(self) -> None:
        """Move the full staging block of every family into its column array."""
        lo, hi = self.committed, self.committed + BLOCK_SCRAPES
        if hi > self.capacity:
            self._grow(hi)
        for fam in self.families.values():
            fam.commit(lo)
        self.committed = hi

    def _grow(self, at_least: int) -> None:
        while self.capacity < at_least:
            self.capacity *= 2
        for fam in self.families.values():
            rows = np.empty((self.capacity, fam.rows.shape[1]), dtype=fam.rows.dtype)
            rows[: self.committed] = fam.rows[: self.committed]
            fam.rows = rows
            bases = _bases(self.capacity, fam.rows.shape[1])
            bases[: fam.bases.shape[0]] = fam.bases
            fam.bases = bases

    # -- reading (the Signals port) -------------------------------------------------------------
    def series_names(self) -> Sequence[str]:
        return sorted(set(self._by_name) | set(self.sparse))

    def query(
        self,
        name: str,
        matchers: Mapping[str, str] | None = None,
        *,
        start_s: float,
        end_s: float,
    ) -> Sequence[Series]:
        want = tuple((matchers or {}).items())
        times = np.asarray(self.times)
        lo = int(np.searchsorted(times, start_s, side="left"))
        hi = int(np.searchsorted(times, end_s, side="right"))
        window = times[lo:hi]
        out: list[Series] = []
        for key in self._by_name.get(name, []):
            fam = self.families[key]
            for i, labels in enumerate(fam.labels):
                if _matches(labels, want):
                    values = fam.column(lo, hi, i, self.committed)
                    out.append(Series(name, labels, window, values))
        for labels, log in self.sparse.get(name, {}).items():
            if not _matches(labels, want):
                continue
            # a sparse series has no samples before its first change point (it did not exist)
            present = window[window >= log.t_s[0]] if log.t_s else window[:0]
            idx = np.searchsorted(np.asarray(log.t_s), present, side="right") - 1
            vals = np.asarray(log.values)[idx]
            out.append(Series(name, labels, present, vals.astype(np.float64)))
        return out

    def instant(
        self, name: str, matchers: Mapping[str, str] | None = None
    ) -> tuple[float, Sequence[Labels], F64]:
        """Latest value of each matching series; dense selections are resolved once and cached."""
        t = self.times[-1] if self.times else 0.0
        k = len(self.times) - 1
        key = (name, tuple(sorted((matchers or {}).items())))
        sel = self._selections.get(key)
        if sel is None:
            parts: list[tuple[str, list[Labels], list[int]]] = []
            for fkey in self._by_name.get(name, []):
                fam = self.families[fkey]
                idx = [i for i, lab in enumerate(fam.labels) if _matches(lab, key[1])]
                if idx:
                    parts.append((fkey, [fam.labels[i] for i in idx], idx))
            sel = parts
            self._selections[key] = sel
        labels = [lab for _, labs, _ in sel for lab in labs]
        if k >= 0 and sel:
            row = k - self.committed  # the latest scrape is always in the staging block
            values = np.concatenate([self.families[f].stage[row, idx] for f, _, idx in sel])
        else:
            values = np.zeros(0)
        sparse = self.sparse.get(name)
        if sparse:
            extra_l: list[Labels] = []
            extra_v: list[float] = []
            for lab, log in sparse.items():
                if _matches(lab, key[1]) and log.t_s and log.t_s[0] <= t:
                    i = int(np.searchsorted(np.asarray(log.t_s), t, side="right")) - 1
                    extra_l.append(lab)
                    extra_v.append(log.values[i])
            if extra_l:
                return t, [*labels, *extra_l], np.concatenate([values, np.asarray(extra_v)])
        return t, labels, values

    def stored(self, names: Sequence[str], *, start_s: float, end_s: float) -> list[StoredSeries]:
        """The series of ``names`` over the window, in ``query``'s order, each read when asked:
        an export holds one at a time instead of a copy of every column."""
        times = np.asarray(self.times)
        lo = int(np.searchsorted(times, start_s, side="left"))
        hi = int(np.searchsorted(times, end_s, side="right"))
        window = times[lo:hi]  # one array for every dense series: the exporter reuses its text
        committed = self.committed
        out: list[StoredSeries] = []

        def dense(fam: _Family, i: int) -> Callable[[], tuple[F64, F64]]:
            return lambda: (window, fam.column(lo, hi, i, committed))

        def sparse(log: _Sparse) -> Callable[[], tuple[F64, F64]]:
            def read() -> tuple[F64, F64]:
                present = window[window >= log.t_s[0]] if log.t_s else window[:0]
                idx = np.searchsorted(np.asarray(log.t_s), present, side="right") - 1
                return present, np.asarray(log.values, dtype=np.float64)[idx]

            return read

        for name in names:
            for key in self._by_name.get(name, []):
                fam = self.families[key]
                out.extend(
                    StoredSeries(name, lab, dense(fam, i)) for i, lab in enumerate(fam.labels)
                )
            for lab, log in self.sparse.get(name, {}).items():
                out.append(StoredSeries(name, lab, sparse(log)))
        return out

    def latest(self, name: str, matchers: Mapping[str, str] | None = None) -> Sequence[Series]:
        """Each matching series' value at the last scrape."""
        if not self.times:
            return []
        t = self.times[-1]
        return self.query(name, matchers, start_s=t, end_s=t)


@dataclass(frozen=True)
class StoredSeries:
    """One recorded series of an export: its samples are read from the store only when the
    exporter asks (``firedrill.twin.exposition.SeriesSource``)."""

    name: str
    labels: Labels
    read: Callable[[], tuple[F64, F64]]

    def label(self, key: str) -> str:
        for k, v in self.labels:
            if k == key:
                return v
        return ""

    def samples(self) -> tuple[F64, F64]:
        return self.read()


def _matches(labels: Labels, want: tuple[tuple[str, str], ...]) -> bool:
    d = dict(labels)
    return all(d.get(k, "") == v for k, v in want)
