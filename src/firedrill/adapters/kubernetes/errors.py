"""Apiserver answers mapped onto firedrill's error tree, each with a clear outcome.

    RemoteWorldError (firedrill.errors)
    └── KubernetesError          the apiserver refused a request or could not be reached
        ├── outcome "conflict"      409: the object changed under us (retried on a fresh read)
        ├── outcome "forbidden"     403: RBAC does not allow it (never retried)
        ├── outcome "throttled"     429: API priority and fairness, or a PodDisruptionBudget
        ├── outcome "invalid"       422/400: the body does not fit the schema
        ├── outcome "gone"          410: a watch's resourceVersion is too old (relist)
        ├── outcome "server_error"  5xx
        └── outcome "unreachable"   no answer at all (status None)

A target that does not exist (404) is an ``UnknownTargetError``, as on the twin. Being a
``RemoteWorldError`` is what lets ``gameday recover`` tell "try again later" (unreachable) from
"the world refused this inverse".
"""

from __future__ import annotations

from typing import Literal

from firedrill.errors import RemoteWorldError

__all__ = ["KubernetesError", "Outcome", "outcome_for"]

Outcome = Literal[
    "conflict", "forbidden", "throttled", "invalid", "gone", "server_error", "unreachable", "other"
]


def outcome_for(status: int | None) -> Outcome:
    if status is None or status == 0:
        return "unreachable"
    if status == 409:
        return "conflict"
    if status in (401, 403):
        return "forbidden"
    if status == 429:
        return "throttled"
    if status in (400, 422):
        return "invalid"
    if status == 410:
        return "gone"
    if status >= 500:
        return "server_error"
    return "other"


class KubernetesError(RemoteWorldError):
    """The apiserver refused a request (``status``) or could not be reached (``status`` None)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None,
        reason: str = "",
        method: str = "",
        path: str = "",
        retry_after_s: float | None = None,
    ) -> None:
        self.reason = reason
        self.method = method
        self.path = path
        self.retry_after_s = retry_after_s
        self.outcome: Outcome = outcome_for(status)
        where = f"{method} {path}: " if method else ""
        code = f"{status} {reason}".strip() if status else "unreachable"
        super().__init__(f"{where}{code}: {message}", status=status)
