"""What a break-glass grant may be for, and which resource a path names, decided one way.

Break-glass is the escape hatch, so what it opens must be narrow and named: a scope is one entry
of an allowlist, never a wildcard, a list, a group or a cluster role. Two forms are allowed:

* ``RESOURCE:VERB``: one Kubernetes resource the runbooks touch (``nodes``, ``pods``,
  ``rollouts`` …) and one verb (``get``, ``patch``, ``evict`` …), e.g. ``nodes:patch``;
* ``LEVER:TARGET``: one lever kind of the catalogue on one named target, e.g.
  ``digest_rollback:llm-70b`` (the responder asks for these).

Anything else is refused, and the cluster-admin-like ones (``*``, ``*/*``, ``cluster-admin`` in
any spelling, any ``system:`` group such as ``system:masters``, lists such as
``system:masters,view``) are refused with a reason that says so.

Weight buckets are kept out of a grant unless it asked for them (``is_weight_path``). A path is
normalised before it is matched (percent-decoding, Unicode NFKC, case, backslashes, ``.`` and
``..`` segments, leading slashes), so ``/models/x``, ``./models/x``, ``Models/x`` and
``nodes/../models/x`` are all the weights they name; a path that climbs above its root
(``../x``) is treated as weights too, since what it reaches cannot be told.
"""

from __future__ import annotations

import posixpath
import re
import unicodedata
from typing import Final

__all__ = [
    "LEVER_SCOPES",
    "SCOPE_RESOURCES",
    "SCOPE_VERBS",
    "WEIGHT_SEGMENTS",
    "is_weight_path",
    "normalise_path",
    "scope_refusal",
]

# Kubernetes resources the runbooks act on (plural, lower case, as RBAC names them).
SCOPE_RESOURCES: Final = frozenset(
    {
        "nodes",
        "pods",
        "pods/eviction",
        "rollouts",
        "deployments",
        "jobsets",
        "workloads",
        "clusterqueues",
        "httproutes",
        "scaledobjects",
        "catalogbundles",
        "configmaps",
    }
)
SCOPE_VERBS: Final = frozenset({"get", "list", "watch", "patch", "update", "create", "evict"})
# The lever kinds of respond/levers.py's catalogue (a test keeps the two the same).
LEVER_SCOPES: Final = frozenset(
    {
        "kill_switch",
        "warm_pool",
        "content_block",
        "promotion_freeze",
        "compensation",
        "pod_quarantine",
        "bundle_revert",
        "route_weight",
        "cell_drain",
        "cell_quarantine",
        "scaler_pause",
        "pd_rebalance",
        "rollout_abort",
        "digest_rollback",
        "queue_hold",
        "jobset_suspend",
        "node_quarantine",
        "driver_rollback",
    }
)
WEIGHT_SEGMENTS: Final = frozenset({"models"})  # a path through one of these reaches weights
_ADMIN_WORDS: Final = ("clusteradmin", "cluster-admin", "cluster_admin", "system:")
_TARGET: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,252}")


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold().strip()


def scope_refusal(scope: str) -> str | None:
    """Why ``scope`` is not a break-glass scope, or ``None`` when the allowlist has it."""
    raw = unicodedata.normalize("NFKC", scope).strip()
    folded = raw.casefold()
    if not folded:
        return "a request needs a scope"
    if "*" in folded or "," in folded or any(w in folded.replace(" ", "") for w in _ADMIN_WORDS):
        return (
            f"{scope!r} is never a break-glass scope (cluster-admin by another name): ask for "
            "the verbs the incident needs, one resource and verb or one lever and target"
        )
    head, sep, tail = raw.partition(":")
    head = head.casefold()
    if not sep or not tail:
        return (
            f"{scope!r} is not a break-glass scope: use RESOURCE:VERB (e.g. nodes:patch) or "
            "LEVER:TARGET (e.g. digest_rollback:llm-70b)"
        )
    if head in SCOPE_RESOURCES:
        if tail.casefold() not in SCOPE_VERBS:
            verbs = ", ".join(sorted(SCOPE_VERBS))
            return f"{scope!r}: {tail!r} is not a break-glass verb ({verbs})"
        return None
    if head in LEVER_SCOPES:
        if not _TARGET.fullmatch(tail) or ".." in tail.split("/"):
            return f"{scope!r}: {tail!r} is not one named target"
        return None
    return (
        f"{scope!r} is not a break-glass scope: {head!r} is neither a resource the runbooks act "
        "on nor a lever"
    )


_PERCENT = re.compile(r"(?:%[0-9A-Fa-f]{2})+")


def _percent_decoded(text: str) -> str:
    """``%XX`` runs decoded as UTF-8 (invalid bytes become U+FFFD), the rest left as it is."""
    return _PERCENT.sub(
        lambda m: bytes.fromhex(m.group(0).replace("%", "")).decode("utf-8", "replace"), text
    )


def normalise_path(resource: str) -> str:
    """A resource path in one canonical form: decoded, NFKC, case-folded, ``.``/``..`` resolved."""
    text = resource
    for _ in range(3):  # doubly encoded paths (%252e) decode too
        decoded = _percent_decoded(text)
        if decoded == text:
            break
        text = decoded
    text = _fold(text).replace("\\", "/")
    text = re.sub(r"^[a-z][a-z0-9+.-]*://", "", text).lstrip("/")  # s3://bucket/models/x
    normal = posixpath.normpath(text) if text else ""
    return "" if normal == "." else normal


def is_weight_path(resource: str) -> bool:
    """Whether ``resource`` reaches a weight bucket (or cannot be told not to)."""
    path = normalise_path(resource)
    segments = [s for s in path.split("/") if s]
    if not segments or ".." in segments:
        return True  # climbs above its root, or names nothing: assume the worst
    return any(s in WEIGHT_SEGMENTS for s in segments)
