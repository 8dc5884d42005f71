"""``AlertmanagerClient``: the alerts Alertmanager holds and the silences set on them (API v2).

During an incident the responder needs two things from Alertmanager besides its webhooks: the
alerts firing now (what a lever's verification waits on, or a restart catches up with) and
silences (a cell being drained pages nobody while it drains; a silence names who set it and why,
and ends by itself). Errors map as in ``adapters/prometheus.py``: ``SignalsUnavailable`` when
Alertmanager is down, times out or answers 5xx (after retries with back-off), ``BadQueryError``
when it refuses the request (4xx), both chained from httpx's exception.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import httpx

from firedrill.errors import BadQueryError, SignalsUnavailable
from firedrill.model.series import Labels, label_value

__all__ = ["AlertmanagerClient", "AmAlert", "Silence"]

DEFAULT_TIMEOUT_S: Final = 10.0


@dataclass(frozen=True)
class AmAlert:
    """An alert as Alertmanager holds it."""

    fingerprint: str
    labels: Labels
    starts_at: datetime
    state: str  # active | suppressed | unprocessed
    silenced_by: tuple[str, ...]
    inhibited_by: tuple[str, ...]

    def label(self, key: str) -> str:
        return label_value(self.labels, key)


@dataclass(frozen=True)
class Silence:
    """A silence: equality matchers, who set it and why, and its window."""

    id: str
    matchers: tuple[tuple[str, str], ...]
    created_by: str
    comment: str
    starts_at: datetime
    ends_at: datetime
    state: str  # active | pending | expired


def _time(raw: object) -> datetime:
    if not isinstance(raw, str):
        raise ValueError(f"a time is an RFC 3339 string, got {raw!r}")
    return datetime.fromisoformat(raw.replace("Z", "+00:00"))


class AlertmanagerClient:
    """Alertmanager's API v2 at ``url``."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = 3,
        backoff_s: float = 0.2,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        parts = httpx.URL(url)
        if parts.scheme not in ("http", "https") or not parts.host:
            raise BadQueryError(f"an Alertmanager URL is http(s)://HOST:PORT, got {url!r}", url=url)
        if retries < 1:
            raise ValueError("retries >= 1")
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        self._sleep = sleep
        self._client = httpx.Client(
            base_url=self.url, timeout=httpx.Timeout(timeout_s), transport=transport
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> AlertmanagerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self, method: str, path: str, *, params: Any = None, json: object = None
    ) -> httpx.Response:
        delay = self.backoff_s
        for attempt in range(1, self.retries + 1):
            last = attempt == self.retries
            try:
                response = self._client.request(method, path, params=params, json=json)
            except httpx.TransportError as exc:  # timeouts included
                if last:
                    raise SignalsUnavailable(
                        f"cannot reach Alertmanager at {self.url} ({type(exc).__name__}: {exc}) "
                        f"after {attempt} attempt(s)",
                        url=self.url,
                    ) from exc
            else:
                status = response.status_code
                if status < 400:
                    return response
                if status != 429 and status < 500:
                    raise BadQueryError(
                        f"Alertmanager refused {method} {path} ({status}): "
                        f"{response.text[:200].strip()}",
                        url=self.url,
                        status=status,
                    )
                if last:
                    raise SignalsUnavailable(
                        f"Alertmanager at {self.url} answered {status} to {method} {path} after "
                        f"{attempt} attempt(s)",
                        url=self.url,
                        status=status,
                    )
            self._sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def _json(self, response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError as exc:
            raise BadQueryError(
                f"Alertmanager did not answer JSON: {response.text[:120]!r}", url=self.url
            ) from exc

    def alerts(
        self, matchers: Mapping[str, str] | None = None, *, active_only: bool = True
    ) -> list[AmAlert]:
        """Alerts whose labels equal ``matchers`` (silenced and inhibited ones too, unless
        ``active_only``)."""
        params: list[tuple[str, str]] = [
            ("filter", f'{k}="{v}"') for k, v in sorted((matchers or {}).items())
        ]
        if active_only:
            params += [("silenced", "false"), ("inhibited", "false")]
        body = self._json(self._call("GET", "/api/v2/alerts", params=params))
        try:
            return [
                AmAlert(
                    fingerprint=str(a["fingerprint"]),
                    labels=tuple(sorted((str(k), str(v)) for k, v in a["labels"].items())),
                    starts_at=_time(a["startsAt"]),
                    state=str(a["status"]["state"]),
                    silenced_by=tuple(a["status"].get("silencedBy") or ()),
                    inhibited_by=tuple(a["status"].get("inhibitedBy") or ()),
                )
                for a in body
            ]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadQueryError(f"unexpected alert list: {exc}", url=self.url) from exc

    def silence(
        self,
        matchers: Mapping[str, str],
        *,
        created_by: str,
        comment: str,
        duration_s: float,
        starts_at: datetime | None = None,
    ) -> str:
        """Silence alerts whose labels equal ``matchers`` for ``duration_s``; the silence's id."""
        if not matchers:
            raise BadQueryError("a silence needs at least one matcher", url=self.url)
        if not created_by.strip() or not comment.strip():
            raise BadQueryError("a silence names who set it and why", url=self.url)
        if not 0 < duration_s <= 7 * 86400:
            raise BadQueryError("a silence lasts more than 0 s and at most 7 days", url=self.url)
        start = starts_at or datetime.now(UTC)
        end = datetime.fromtimestamp(start.timestamp() + duration_s, UTC)
        body = {
            "matchers": [
                {"name": k, "value": v, "isRegex": False, "isEqual": True}
                for k, v in sorted(matchers.items())
            ],
            "startsAt": start.isoformat(),
            "endsAt": end.isoformat(),
            "createdBy": created_by.strip(),
            "comment": comment.strip(),
        }
        answer = self._json(self._call("POST", "/api/v2/silences", json=body))
        if not isinstance(answer, dict) or not isinstance(answer.get("silenceID"), str):
            raise BadQueryError(f"unexpected answer to a silence: {answer!r}", url=self.url)
        return str(answer["silenceID"])

    def silences(self) -> list[Silence]:
        """Every silence Alertmanager holds (expired ones until it forgets them)."""
        body = self._json(self._call("GET", "/api/v2/silences"))
        try:
            return [
                Silence(
                    id=str(s["id"]),
                    matchers=tuple((str(m["name"]), str(m["value"])) for m in s["matchers"]),
                    created_by=str(s["createdBy"]),
                    comment=str(s["comment"]),
                    starts_at=_time(s["startsAt"]),
                    ends_at=_time(s["endsAt"]),
                    state=str(s["status"]["state"]),
                )
                for s in body
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise BadQueryError(f"unexpected silence list: {exc}", url=self.url) from exc

    def expire(self, silence_id: str) -> None:
        """End a silence now."""
        self._call("DELETE", f"/api/v2/silence/{silence_id}")

    def ready(self) -> bool:
        """Whether Alertmanager answers its readiness probe."""
        try:
            return self._client.get("/-/ready").status_code == 200
        except httpx.TransportError:
            return False


def firing_labels(alerts: Sequence[AmAlert]) -> list[Labels]:
    """The label sets of alerts that are active (neither silenced nor inhibited)."""
    return [a.labels for a in alerts if a.state == "active"]
