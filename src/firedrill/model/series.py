"""Time series values shared by the twin, detection and the exporters."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Labels = tuple[tuple[str, str], ...]


def labels_of(**kv: str) -> Labels:
    """Canonical label tuple (sorted by name)."""
    return tuple(sorted(kv.items()))


def label_value(labels: Labels, key: str) -> str:
    """The value of label ``key``, or "" when the series has none (as PromQL reads a missing
    label)."""
    return next((v for k, v in labels if k == key), "")


@dataclass(frozen=True)
class Series:
    """One series over a window: sample times (s since the run's start) and values."""

    name: str
    labels: Labels
    t_s: npt.NDArray[np.float64]
    values: npt.NDArray[np.float64]

    def label(self, key: str) -> str:
        for k, v in self.labels:
            if k == key:
                return v
        return ""
