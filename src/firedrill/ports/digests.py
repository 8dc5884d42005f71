"""The ``Digests`` port: the weights digests a fleet published and the ones its replicas run.

Rollback targets must be previously published, signed and attested digests (a rollback is a
deploy and goes through admission), and a drill's security floor asks whether any replica was
admitted with a digest that is not, and whether the survivors still serve attested weights their
registry holds while replication is paused. The twin answers from its digest table; a real fleet
from the registry, the signature/attestation verifier and the pods' image digests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from firedrill.model.release import DigestRecord, ServingDigest


class Digests(Protocol):
    def published(self, model: str) -> Sequence[DigestRecord]:
        """Every digest published for ``model``, oldest first (unknown model:
        ``UnknownTargetError``)."""
        ...

    def digest_record(self, digest: str) -> DigestRecord | None:
        """The published digest ``digest`` (of any model), or None if it was never published."""
        ...

    def serving_digests(self, region: str) -> Sequence[ServingDigest]:
        """What the live replicas of ``region`` run, per model and digest."""
        ...

    def unsigned_replicas_admitted(self) -> int:
        """Replicas started, since the run began, with a digest not both signed and attested."""
        ...
