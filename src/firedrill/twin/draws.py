"""Random draws over the twin's pool arrays, bit for bit what numpy's array calls draw.

``Generator.binomial`` and ``Generator.poisson`` on arrays pay about 5 µs of argument checks
and broadcasting before the first draw, whatever the array's size; called with Python scalars
they cost under 0.5 µs. The twin draws over its pools a dozen times per step, and on a small
fleet, or in a step where most pools have nothing to draw, that fixed cost was most of the step.
Both calls run the same C sampler on the same bit generator, element after element in order,
and neither consumes anything from the stream for an element whose count or probability
(binomial) or rate (poisson) is 0; so drawing only the non-zero elements, one scalar call each,
gives exactly the numbers (and leaves exactly the generator state) the array call would. With
more than a few elements to draw the array call is faster, and is kept.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

SCALAR_MAX = 6  # up to this many elements to draw, scalar calls beat the array call


def binomial(rng: np.random.Generator, n: I64, p: F64 | float) -> I64:
    """``rng.binomial(n, p)`` for a 1-D ``n`` and a ``p`` of the same shape (or a float).

    A probability outside [0, 1] raises, as the array call does, for the elements drawn.
    """
    todo = np.count_nonzero(n)
    if todo > SCALAR_MAX:
        out: I64 = rng.binomial(n, p)
        return out
    res = np.zeros(n.shape, dtype=np.int64)
    if todo:
        draw = rng.binomial
        if isinstance(p, float):
            for i in n.nonzero()[0].tolist():
                res[i] = draw(int(n[i]), p)
        else:
            for i in n.nonzero()[0].tolist():
                res[i] = draw(int(n[i]), float(p[i]))
    return res


def poisson(rng: np.random.Generator, lam: F64) -> I64:
    """``rng.poisson(lam)`` for a 1-D ``lam``."""
    todo = np.count_nonzero(lam)
    if todo > SCALAR_MAX:
        out: I64 = rng.poisson(lam)
        return out
    res = np.zeros(lam.shape, dtype=np.int64)
    if todo:
        draw = rng.poisson
        for i in lam.nonzero()[0].tolist():
            res[i] = draw(float(lam[i]))
    return res
