"""The ``Signals`` port: series and instant vectors under the real exporters' names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from firedrill.model.series import Labels, Series


class Signals(Protocol):
    def series_names(self) -> Sequence[str]: ...

    def query(
        self,
        name: str,
        matchers: Mapping[str, str] | None = None,
        *,
        start_s: float,
        end_s: float,
    ) -> Sequence[Series]:
        """Series with this name whose labels equal ``matchers``, sampled in [start, end]."""
        ...

    def instant(
        self, name: str, matchers: Mapping[str, str] | None = None
    ) -> tuple[float, Sequence[Labels], npt.NDArray[np.float64]]:
        """The latest sample of each matching series: (time, labels, values). Cheap to repeat."""
        ...
