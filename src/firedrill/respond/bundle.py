"""A CatalogBundle change as a cause: the serving config it replaced, and the lever back to it.

Reference 000: "a max_num_seqs or gpu_memory_utilization change [in the CatalogBundle] causes KV
OOMs", and the bundle label is second in the rollback order (after a kill switch), ahead of
route weights and drains. What a bad bundle shows first depends on the fleet: KV and preemption
tickets, or the availability and TTFT burn their storm causes, whichever fires first. So every
runbook that weighs the change streams (the serving runbook and the KV runbook) turns a bundle
change before onset into the same lever: move the label back (``bundle_revert``) to the serving
config the change replaced, read from the change itself. It is the cheapest reversible lever and
cannot make things worse: it restores a config the fleet served on before.

Kept apart from the runbooks so both can use it without importing each other.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from firedrill.respond.levers import Lever, ServingConfigParams
from firedrill.respond.suspects import Suspect

# How a CatalogBundle's serving config reads in a bundle change event.
_BUNDLE_TEXT = re.compile(
    r"^(?P<digest>sha256:[0-9a-f]{12,64}) seqs=(?P<seqs>[0-9]+) gmu=(?P<gmu>[0-9.]+)$"
)


def parse_serving_config(text: str) -> ServingConfigParams | None:
    """A bundle change's before/after text (``<digest> seqs=<n> gmu=<x>``) as lever params."""
    m = _BUNDLE_TEXT.match(text.strip())
    if m is None:
        return None
    return ServingConfigParams(m["digest"], int(m["seqs"]), float(m["gmu"]))


def bundle_revert(suspects: Iterable[Suspect]) -> tuple[Lever, str] | None:
    """The first bundle change before onset as a revert to the config it replaced, and why."""
    for s in suspects:
        if not s.before_onset or s.stream != "bundle":
            continue
        before = parse_serving_config(s.change.before)
        after = parse_serving_config(s.change.after)
        if before is None or after is None or before == after:
            continue
        reason = (
            f"CatalogBundle of {s.change.subject} changed {s.change.after} before onset "
            f"(max_num_seqs {after.max_num_seqs}, gpu_memory_utilization "
            f"{after.gpu_memory_utilization:g}): move the label back to {before.bundle_digest}"
            f" (max_num_seqs {before.max_num_seqs}, gpu_memory_utilization "
            f"{before.gpu_memory_utilization:g})"
        )
        return Lever("bundle_revert", s.change.subject, before), reason
    return None
