"""Bearer tokens mapped to people and roles, from a tokens file; nobody is anonymous.

The file (YAML) lists one entry per token, by the SHA-256 of the token so the file itself grants
nothing if it leaks::

    tokens:
      - sha256: 3f1c...e9   # printf %s "$TOKEN" | sha256sum
        person: Alice
        roles: [capacity_lead, incident_commander]
      - sha256: 9a0b...41
        person: alertmanager
        roles: [webhook]          # may only POST alerts

Roles are the incident roles levers are decided by (``incident_commander``, ``ops_lead``,
``comms_lead``, ``scribe``, ``model_owner``, ``capacity_lead``, ``security_lead``) and three
service roles: ``webhook`` (POST alerts only), ``viewer`` (read only) and ``metrics`` (scrape
``/metrics``). Any incident role can read. Two entries naming the same person (compared
case-folded and stripped) are refused: one person, one identity.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from firedrill.app.serve import ROLES, canonical
from firedrill.errors import SpecError

SERVICE_ROLES: Final = ("webhook", "viewer", "metrics")
INCIDENT_ROLES: Final = frozenset(ROLES)


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    person: str = Field(min_length=1, max_length=200)
    roles: list[str] = Field(min_length=1)


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: list[_Entry] = Field(min_length=1)


@dataclass(frozen=True)
class Principal:
    """Who a request comes from."""

    person: str
    roles: frozenset[str]

    @property
    def can_read(self) -> bool:
        return bool(self.roles & (INCIDENT_ROLES | {"viewer"}))

    @property
    def can_decide(self) -> bool:
        return bool(self.roles & INCIDENT_ROLES)


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class Tokens:
    """The tokens file, loaded once; ``who(token)`` answers in constant time per entry."""

    def __init__(self, entries: dict[str, Principal]) -> None:
        self._by_hash = entries

    @classmethod
    def load(cls, path: Path) -> Tokens:
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise SpecError(
                f"cannot read the tokens file: {exc}", file=str(path), line=None, field=None
            ) from exc
        try:
            parsed = _File.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise SpecError(first["msg"], file=str(path), line=None, field=where) from exc
        return cls.from_entries(
            [(e.sha256, e.person, e.roles) for e in parsed.tokens], source=str(path)
        )

    @classmethod
    def from_entries(
        cls, entries: list[tuple[str, str, list[str]]], *, source: str = "tokens"
    ) -> Tokens:
        known = INCIDENT_ROLES | set(SERVICE_ROLES)
        people: set[str] = set()
        out: dict[str, Principal] = {}
        for i, (digest, person, roles) in enumerate(entries):
            field = f"tokens.{i}"
            bad = sorted(set(roles) - known)
            if bad:
                raise SpecError(
                    f"unknown role(s) {', '.join(bad)}",
                    file=source,
                    line=None,
                    field=f"{field}.roles",
                )
            who = canonical(person)
            if not who:
                raise SpecError("empty person", file=source, line=None, field=f"{field}.person")
            if who in people:
                raise SpecError(
                    f"{person!r} has two tokens: one person, one identity",
                    file=source,
                    line=None,
                    field=f"{field}.person",
                )
            if digest in out:
                raise SpecError(
                    "the same token twice", file=source, line=None, field=f"{field}.sha256"
                )
            people.add(who)
            out[digest] = Principal(person.strip(), frozenset(roles))
        return cls(out)

    def who(self, token: str) -> Principal | None:
        digest = token_sha256(token)
        found: Principal | None = None
        for known, principal in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                found = principal
        return found
