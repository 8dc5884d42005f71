"""In-memory series store: what the twin exports, under the real exporters' names.

Two kinds of storage, because a fleet has two kinds of series:

* **dense** families (per pool or per region, a few thousand series): one float per scrape per
  series in a preallocated column array, so recording is one vectorised row write;
* **sparse** node/GPU series (tens of thousands that are almost always at their default): recorded
  as change points only and materialised onto the scrape grid when queried or exported. A node
  series that never left its default is not stored (so ``DCGM_FI_DEV_XID_ERRORS`` has series only
  for GPUs that reported an XID), which is what every PromQL rule here reads anyway (``> 0``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from firedrill.model.series import Labels, Series

F64 = npt.NDArray[np.float64]


@dataclass
class _Family:
    name: str
    labels: list[Labels]
    rows: F64  # [scrapes, series]


@dataclass
class _Sparse:
    t_s: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


class SeriesStore:
    """Implements the ``Signals`` port over the twin's recorded scrapes."""

    def __init__(self, scrape_interval_s: float, capacity: int) -> None:
        self.interval_s = scrape_interval_s
        self.capacity = max(capacity, 1)
        self.families: dict[str, _Family] = {}
        self.sparse: dict[str, dict[Labels, _Sparse]] = {}
        self.times: list[float] = []
        self._by_name: dict[str, list[str]] = {}
        self._selections: dict[
            tuple[str, tuple[tuple[str, str], ...]], list[tuple[str, list[Labels], list[int]]]
        ] = {}

    # -- writing ------------------------------------------------------------------------------
    def family(self, key: str, labels: list[Labels]) -> None:
        """Register a dense family; ``key`` is the series name, or 'name|variant' when one name
        is written in parts (e.g. one part per status code)."""
        name = key.split("|", 1)[0]
        self.families[key] = _Family(name, labels, np.full((self.capacity, len(labels)), np.nan))
        self._by_name.setdefault(name, []).append(key)
        # a family registered mid-run (a new digest's counters) joins cached selections of its name
        self._selections = {k: v for k, v in self._selections.items() if k[0] != name}

    def begin_scrape(self, t_s: float) -> int:
        k = len(self.times)
        if k >= self.capacity:
            self._grow()
        self.times.append(t_s)
        return k

    def write(self, name: str, k: int, values: F64) -> None:
        self.families[name].rows[k, :] = values

    def set_sparse(self, name: str, labels: Labels, t_s: float, value: float) -> None:
        log = self.sparse.setdefault(name, {}).setdefault(labels, _Sparse())
        if log.values and log.values[-1] == value:
            return
        if log.t_s and log.t_s[-1] == t_s:
            log.values[-1] = value
            return
        log.t_s.append(t_s)
        log.values.append(value)

    def _grow(self) -> None:
        self.capacity *= 2
        for fam in self.families.values():
            rows = np.full((self.capacity, fam.rows.shape[1]), np.nan)
            rows[: fam.rows.shape[0]] = fam.rows
            fam.rows = rows

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
                    out.append(Series(name, labels, window, fam.rows[lo:hi, i].copy()))
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
            values = np.concatenate([self.families[f].rows[k, idx] for f, _, idx in sel])
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

    def latest(self, name: str, matchers: Mapping[str, str] | None = None) -> Sequence[Series]:
        """Each matching series' value at the last scrape."""
        if not self.times:
            return []
        t = self.times[-1]
        return self.query(name, matchers, start_s=t, end_s=t)


def _matches(labels: Labels, want: tuple[tuple[str, str], ...]) -> bool:
    d = dict(labels)
    return all(d.get(k, "") == v for k, v in want)
