"""The one registry of runbooks: which runbook the responder runs for each symptom kind.

A literal, read top to bottom, instead of registration by import side effect: what runs for a
symptom does not depend on which module happened to be imported last. The caller hands it to
the ``Responder``; a test holds that every symptom kind has exactly one entry here.

``kv_oom`` is ``kv_oom_runbook``: a KV-cache bundle change before onset is reverted first, then
the serving runbook's levers follow (it includes them), so it is the serving runbook's superset.

``training_stall`` is ``node_layer_runbook``: the steps on the JobSet itself (suspend, quarantine
the node that hangs, resume off it) are the training-hang runbook of ``remediate.training``,
which the remediation side runs; what the responder adds is the cause-driven lever, a driver
rollout under the gang rolled back.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from firedrill.respond.inference import kv_oom_runbook, pd_imbalance_runbook
from firedrill.respond.release import quality_symptom_runbook
from firedrill.respond.responder import Runbook, node_layer_runbook, serving_runbook
from firedrill.respond.security import security_runbook
from firedrill.respond.suspects import SymptomKind

__all__ = ["RUNBOOKS"]

RUNBOOKS: Mapping[SymptomKind, Runbook] = MappingProxyType(
    {
        "ttft": serving_runbook,
        "availability": serving_runbook,
        "kv_oom": kv_oom_runbook,
        "quality": quality_symptom_runbook,
        "xid": node_layer_runbook,
        "egress": security_runbook,
        "pd_imbalance": pd_imbalance_runbook,
        "training_stall": node_layer_runbook,
    }
)
