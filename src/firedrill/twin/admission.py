"""Admission and the ready-gate, per region: the security floor a drill must prove holds.

Every replica the twin creates asks admission first, in its own region:

1. the **ready-gate** refuses a digest that has not landed in the region's registry (replication
   paused or cut): the region keeps serving its last attested digest, and the refusal is counted
   in ``firedrill_ready_gate_refusals_total`` until the digest lands;
2. the **admission policy** (Kyverno-style, per region: ``Enforce`` by default) denies a digest
   that is not signed and attested. ``Audit`` admits it and records the violation; ``Ignore``
   (a failurePolicy that lets deploys through when the webhook is down) admits everything. Both
   exist so a drill can prove they were never used: a drill refuses them up front;
3. a signed digest the region has not verified before needs its signature/TUF mirror; with the
   mirror out of reach (``twin/deps.py``) admission fails closed (``signature_unverifiable``).

Every decision is counted by region, digest, decision and reason in
``firedrill_admission_requests_total``; the region's mode, and the weights and CatalogBundle
digest each region serves, are exported as info series (1 for the current value).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from firedrill.errors import OperationError, UnknownTargetError
from firedrill.model import operations as ops
from firedrill.model.changes import ChangeStream
from firedrill.model.series import Labels, labels_of
from firedrill.model.spec import CatalogBundleSpec, ModelSpec
from firedrill.twin.deps import Dependencies
from firedrill.twin.recorder import SeriesStore
from firedrill.twin.replica import DigestInfo

I64 = npt.NDArray[np.int64]


class AdmissionTwin(Protocol):
    """What admission and the ready-gate read and write of the twin.

    They read the digests, where each has landed and what each region serves; a mode change
    marks every pool for reconcile, is noted in the change log and recorded as a series.
    """

    @property
    def t(self) -> float: ...
    @property
    def record(self) -> bool: ...
    @property
    def store(self) -> SeriesStore: ...
    @property
    def models(self) -> Sequence[ModelSpec]: ...
    @property
    def region_names(self) -> Sequence[str]: ...
    @property
    def region_index(self) -> Mapping[str, int]: ...
    @property
    def digests(self) -> Sequence[DigestInfo]: ...
    @property
    def available(self) -> set[tuple[int, int]]: ...
    @property
    def region_digest(self) -> I64: ...
    @property
    def pool_region(self) -> I64: ...
    @property
    def pool_dirty(self) -> npt.NDArray[np.bool_]: ...
    @property
    def bundle(self) -> Sequence[CatalogBundleSpec]: ...
    def note_change(
        self,
        stream: ChangeStream,
        cell: int,
        subject: str,
        before: str,
        after: str,
        detail: str = "",
    ) -> None: ...


ADMISSION_MODES: tuple[ops.AdmissionMode, ...] = ("Enforce", "Audit", "Ignore")


class Admission:
    def __init__(self, twin: AdmissionTwin, deps: Dependencies) -> None:
        self.twin = twin
        self.deps = deps  # a cut signature mirror leaves new digests unverifiable
        nr = len(twin.region_names)
        self.modes: list[ops.AdmissionMode] = ["Enforce"] * nr
        # digests published at start were verified before the run began
        self.verified: set[tuple[int, int]] = set(twin.available)
        self.decisions: dict[tuple[int, int, str, str], int] = {}
        self.gate_refusals: dict[tuple[int, int], int] = {}
        self._weights_seen: npt.NDArray[np.int64] | None = None
        self._bundle_seen: list[str] = []

    # -- the decision -----------------------------------------------------------------------------
    def admit(self, digest: int, region: int) -> bool:
        """May a replica of ``digest`` be created in ``region``? Counts the decision."""
        tw = self.twin
        if region >= 0 and (region, digest) not in tw.available:
            key = (region, digest)  # the ready-gate
            self.gate_refusals[key] = self.gate_refusals.get(key, 0) + 1
            self._record_gate(region, digest)
            return False
        info = tw.digests[digest]
        mode = self.modes[region] if region >= 0 else "Enforce"
        reason = "verified"
        if not info.signed:
            reason = "unsigned"
        elif not info.attested:
            reason = "unattested"
        elif (
            region >= 0
            and (region, digest) not in self.verified
            and mode != "Ignore"
            and self.deps.declared
            and self.deps.signature_unverifiable(region)
        ):
            reason = "signature_unverifiable"
        ok = reason == "verified" or mode in ("Audit", "Ignore")
        if ok and reason == "verified" and region >= 0:
            self.verified.add((region, digest))
        self._count(region, digest, "admit" if ok else "deny", reason)
        return ok

    def landed(self, digest: int, pool: int) -> bool:
        """Whether ``digest`` has landed in the pool's region; the ready-gate counts a refusal."""
        region = int(self.twin.pool_region[pool])
        if (region, digest) in self.twin.available:
            return True
        self.gate_refusals[(region, digest)] = self.gate_refusals.get((region, digest), 0) + 1
        self._record_gate(region, digest)
        return False

    # -- the operation ----------------------------------------------------------------------------
    def inverse(self, op: ops.Operation) -> ops.Operation:
        if not isinstance(op, ops.SetAdmission):
            raise OperationError(f"not an admission operation: {op!r}")
        if op.region not in self.twin.region_index:
            raise UnknownTargetError("region", op.region)
        if op.mode not in ADMISSION_MODES:
            raise OperationError(f"admission mode must be one of {ADMISSION_MODES}: {op.mode!r}")
        return ops.SetAdmission(op.region, self.modes[self.twin.region_index[op.region]])

    def apply(self, op: ops.Operation) -> None:
        if not isinstance(op, ops.SetAdmission):
            raise OperationError(f"not an admission operation: {op!r}")
        ri = self.twin.region_index[op.region]
        before = self.modes[ri]
        self.modes[ri] = op.mode
        if before != op.mode:
            tw = self.twin
            tw.pool_dirty[:] = True  # denied digests get another chance
            tw.note_change("network_policy", -1, f"admission:{op.region}", before, op.mode)
            if tw.record:
                region = tw.region_names[ri]
                tw.store.set_sparse(
                    "firedrill_admission_mode_info", labels_of(region=region, mode=before), tw.t, 0
                )
                tw.store.set_sparse(
                    "firedrill_admission_mode_info", labels_of(region=region, mode=op.mode), tw.t, 1
                )

    def state(self) -> tuple[str, ...]:
        return tuple(self.modes)

    # -- series -----------------------------------------------------------------------------------
    def register_series(self, store: SeriesStore) -> None:
        tw = self.twin
        for r, mode in zip(tw.region_names, self.modes, strict=True):
            labels = labels_of(region=r, mode=mode)
            store.set_sparse("firedrill_admission_mode_info", labels, tw.t, 1.0)
        self.scrape(store)

    def scrape(self, store: SeriesStore) -> None:
        """Info series for the weights and bundle digests each region serves, on change."""
        tw = self.twin
        seen = self._weights_seen
        now = tw.region_digest
        if seen is None or not np.array_equal(seen, now):
            for mi, ri in np.argwhere(seen != now) if seen is not None else np.argwhere(now >= 0):
                if seen is not None:
                    store.set_sparse(
                        "firedrill_weights_digest_info",
                        self._weights_labels(int(mi), int(ri), int(seen[mi, ri])),
                        tw.t,
                        0.0,
                    )
                store.set_sparse(
                    "firedrill_weights_digest_info",
                    self._weights_labels(int(mi), int(ri), int(now[mi, ri])),
                    tw.t,
                    1.0,
                )
            self._weights_seen = now.copy()
        bundles = [b.digest for b in tw.bundle]
        if bundles != self._bundle_seen:
            for mi, digest in enumerate(bundles):
                old = self._bundle_seen[mi] if self._bundle_seen else None
                if old == digest:
                    continue
                for r in tw.region_names:
                    name = tw.models[mi].name
                    if old is not None:
                        store.set_sparse(
                            "firedrill_bundle_digest_info",
                            labels_of(model_name=name, region=r, digest=old),
                            tw.t,
                            0.0,
                        )
                    store.set_sparse(
                        "firedrill_bundle_digest_info",
                        labels_of(model_name=name, region=r, digest=digest),
                        tw.t,
                        1.0,
                    )
            self._bundle_seen = bundles

    def _weights_labels(self, mi: int, ri: int, d: int) -> Labels:
        tw = self.twin
        info = tw.digests[d]
        return labels_of(
            model_name=tw.models[mi].name,
            region=tw.region_names[ri],
            digest=info.digest,
            signed=str(info.signed).lower(),
            attested=str(info.attested).lower(),
        )

    def _count(self, region: int, digest: int, decision: str, reason: str) -> None:
        key = (region, digest, decision, reason)
        n = self.decisions.get(key, 0) + 1
        self.decisions[key] = n
        tw = self.twin
        if tw.record:
            info = tw.digests[digest]
            tw.store.set_sparse(
                "firedrill_admission_requests_total",
                labels_of(
                    region=tw.region_names[region] if region >= 0 else "*",
                    model_name=tw.models[info.model].name,
                    digest=info.digest,
                    decision=decision,
                    reason=reason,
                ),
                tw.t,
                float(n),
            )

    def _record_gate(self, region: int, digest: int) -> None:
        tw = self.twin
        if tw.record:
            info = tw.digests[digest]
            tw.store.set_sparse(
                "firedrill_ready_gate_refusals_total",
                labels_of(
                    region=tw.region_names[region],
                    model_name=tw.models[info.model].name,
                    digest=info.digest,
                ),
                tw.t,
                float(self.gate_refusals[(region, digest)]),
            )
