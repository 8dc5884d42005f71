"""Leader election on a ``coordination.k8s.io/v1`` Lease, so only one controller replica acts.

The rules are client-go's leaderelection, with the adapter's optimistic concurrency: read the
Lease; create it if there is none; renew it while we hold it; take it over only once the
holder's ``renewTime + leaseDurationSeconds`` has passed, counting ``leaseTransitions``. Every
write carries the ``resourceVersion`` it read, so two candidates racing for an expired Lease
cannot both win: the loser gets a 409 and stays a follower. A replica that cannot renew in time
(the apiserver unreachable) stops acting: ``is_leader`` turns false as soon as its own lease
would have expired, whatever the apiserver says later. Time is injected (a wall clock in a pod).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx2
from lightkube import ApiError
from lightkube.resources.coordination_v1 import Lease
from lightkube.types import PatchType

from firedrill.adapters.kubernetes.client import Connection

__all__ = ["LeaderElector", "LeaseConfig"]


def _micro(t: datetime) -> str:
    """A MicroTime: RFC 3339 with microseconds, UTC (``t`` is timezone-aware)."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str = "firedrill-system"
    name: str = "firedrill-controller"
    duration_s: int = 15  # leaseDurationSeconds (client-go's default)
    renew_deadline_s: float = 10.0  # stop acting if not renewed within this (client-go: 10 s)


class LeaderElector:
    """Acquire or renew the Lease for ``identity``; say whether we lead right now."""

    def __init__(
        self,
        conn: Connection,
        identity: str,
        now: Callable[[], datetime],
        config: LeaseConfig | None = None,
    ) -> None:
        self.conn = conn
        self.identity = identity
        self.now = now
        self.config = config or LeaseConfig()
        self.renewed_at: datetime | None = None
        self.transitions_seen = 0
        self.last_error = ""

    @property
    def is_leader(self) -> bool:
        """We hold the Lease and renewed it within the renew deadline."""
        if self.renewed_at is None:
            return False
        return self.now() - self.renewed_at < timedelta(seconds=self.config.renew_deadline_s)

    def step(self) -> bool:
        """One election round: acquire or renew if we may; True if we lead afterwards."""
        c = self.config
        api: Any = self.conn.client
        now = self.now()
        try:
            try:
                lease = api.get(Lease, c.name, namespace=c.namespace).to_dict()
            except ApiError as exc:
                if exc.status.code != 404:
                    raise
                body = Lease.from_dict(
                    {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": c.name, "namespace": c.namespace},
                        "spec": self._spec(now, acquire=True, transitions=0),
                    }
                )
                api.create(body, namespace=c.namespace)
                self.renewed_at = now
                self.last_error = ""
                return True
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity")
            renew = _parse(spec.get("renewTime"))
            duration = int(spec.get("leaseDurationSeconds") or c.duration_s)
            transitions = int(spec.get("leaseTransitions") or 0)
            self.transitions_seen = transitions
            expired = renew is None or now >= renew + timedelta(seconds=duration)
            if holder != self.identity and holder and not expired:
                self.renewed_at = None  # someone else leads
                self.last_error = ""
                return False
            take_over = holder != self.identity
            body_spec = self._spec(
                now, acquire=take_over, transitions=transitions + (1 if take_over else 0)
            )
            if not take_over:
                body_spec["acquireTime"] = spec.get("acquireTime") or body_spec["renewTime"]
            api.patch(
                Lease,
                c.name,
                {"metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                 "spec": body_spec},
                namespace=c.namespace,
                patch_type=PatchType.MERGE,
            )  # fmt: skip
            self.renewed_at = now
            self.last_error = ""
            return True
        except ApiError as exc:
            # 409: another candidate moved first; anything else: we could not renew. Either
            # way we are a follower until a later round succeeds (is_leader lapses on its own).
            self.last_error = f"{exc.status.code} {exc.status.reason}"
            if exc.status.code == 409:
                self.renewed_at = None
            return self.is_leader
        except httpx2.TransportError as exc:
            self.last_error = f"unreachable: {exc}"
            return self.is_leader

    def release(self) -> None:
        """Give the Lease up on shutdown so a standby takes over at once."""
        if self.renewed_at is None:
            return
        api: Any = self.conn.client
        c = self.config
        try:
            api.patch(
                Lease,
                c.name,
                {"spec": {"holderIdentity": None, "renewTime": None}},
                namespace=c.namespace,
                patch_type=PatchType.MERGE,
            )
        except (ApiError, httpx2.TransportError) as exc:
            self.last_error = f"release: {exc}"
        self.renewed_at = None

    def _spec(self, now: datetime, *, acquire: bool, transitions: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.config.duration_s,
            "renewTime": _micro(now),
            "leaseTransitions": transitions,
        }
        if acquire:
            out["acquireTime"] = _micro(now)
        return out
