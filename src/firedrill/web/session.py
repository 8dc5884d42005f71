"""Browser sessions: the bearer token typed once into a login form, then an opaque cookie.

Why server-side sessions rather than a signed cookie: the cookie carries a random id and nothing
else, so it reveals nothing, needs no signing key to manage, and a logout (or a restart) really
ends it. The session remembers the person and roles the token mapped to at login and a CSRF
token; every form post and every htmx request must send that CSRF token back (hidden field
``csrf`` or header ``X-CSRF-Token``), compared in constant time. The cookie is ``HttpOnly``
(scripts cannot read it), ``SameSite=Strict`` (other sites' pages cannot send it) and ``Secure``
when served over HTTPS.

Sessions expire ``ttl_s`` wall seconds after login (wall time: a session is a browser's, not the
fleet's); the oldest are dropped beyond ``max_sessions``.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from firedrill.web.auth import Principal

COOKIE: Final = "firedrill_session"
CSRF_FIELD: Final = "csrf"
CSRF_HEADER: Final = "x-csrf-token"


@dataclass(frozen=True)
class Session:
    """One logged-in browser."""

    id: str
    principal: Principal
    csrf: str
    expires_at: float  # wall seconds (time.time)

    def csrf_ok(self, offered: str | None) -> bool:
        return offered is not None and hmac.compare_digest(offered.encode(), self.csrf.encode())


class Sessions:
    """In-memory session table of one ``firedrill serve`` process."""

    def __init__(
        self,
        *,
        ttl_s: float = 12 * 3600.0,
        max_sessions: int = 10_000,
        time_fn: Callable[[], float] = time.time,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._time = time_fn
        self._lock = threading.Lock()
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    def open(self, principal: Principal) -> Session:
        session = Session(
            id=secrets.token_urlsafe(32),
            principal=principal,
            csrf=secrets.token_urlsafe(32),
            expires_at=self._time() + self.ttl_s,
        )
        with self._lock:
            self._by_id[session.id] = session
            while len(self._by_id) > self.max_sessions:
                self._by_id.popitem(last=False)
        return session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        with self._lock:
            found = self._by_id.get(session_id)
            if found is None:
                return None
            if found.expires_at <= self._time():
                del self._by_id[session_id]
                return None
            return found

    def close(self, session_id: str | None) -> None:
        if session_id:
            with self._lock:
                self._by_id.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._by_id)
