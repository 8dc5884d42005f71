"""Read-only views of a model's release state: its weights rollout, as Argo Rollouts reports it.

The reference's triage starts with ``kubectl argo rollouts get rollout llm-70b``: which digest is
stable, which is the canary and at what step. Incident command reads it to tell a bad canary
(abort the rollout) from bad stable weights (roll the digest back).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RolloutView:
    """A model's weights rollout: the stable digest per region and the canary, if one runs."""

    model: str
    stable: tuple[tuple[str, str], ...]  # (region, digest)
    canary_digest: str | None
    canary_percent: int  # the rollout step: share of each pool's replicas on the canary

    def stable_in(self, region: str) -> str | None:
        """The stable digest of a region (None for a region the model is unknown in)."""
        return dict(self.stable).get(region)

    @property
    def running(self) -> bool:
        """Whether a canary is running (a step above 0%)."""
        return self.canary_digest is not None and self.canary_percent > 0


@dataclass(frozen=True)
class DigestRecord:
    """A weights digest the fleet published for a model, with its signature and attestation."""

    model: str
    digest: str
    signed: bool
    attested: bool

    @property
    def trusted(self) -> bool:
        """Signed and attested: what admission admits and a rollback may target."""
        return self.signed and self.attested


@dataclass(frozen=True)
class ServingDigest:
    """Live replicas of one model in one region that run one digest.

    ``held`` says whether the region's registry holds those weights (a replica that has to
    hydrate again can), which replication pauses and cuts decide.
    """

    model: str
    region: str
    digest: str
    replicas: int
    signed: bool
    attested: bool
    held: bool
