"""Hypothesis profiles of the fuzz suite: a short one for ``make test``, a long one for nightly.

``FIREDRILL_FUZZ=long`` (``make fuzz``) selects the long profile; anything else, the CI one.
Each test applies ``FUZZ`` itself (``@FUZZ``), so the choice never leaks into the settings of
other property tests in the same session.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = {
    "deadline": None,  # a twin step on 2 shared cores is slow now and then; not a bug
    "suppress_health_check": (HealthCheck.too_slow, HealthCheck.function_scoped_fixture),
    "derandomize": False,
}
settings.register_profile("firedrill-ci", max_examples=25, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("firedrill-long", max_examples=2_000, **_COMMON)  # type: ignore[arg-type]

PROFILE = "firedrill-long" if os.environ.get("FIREDRILL_FUZZ") == "long" else "firedrill-ci"
FUZZ = settings(settings.get_profile(PROFILE))
# for properties whose examples take milliseconds (no twin stepping): many more of them
FUZZ_CHEAP = settings(FUZZ, max_examples=FUZZ.max_examples * 12)
