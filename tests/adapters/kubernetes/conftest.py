"""Fixtures: the real schemas, and a replaying apiserver with a ``KubernetesFleet`` on it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from firedrill.adapters.kubernetes.client import connect, replay_config
from firedrill.adapters.kubernetes.fleet import KubernetesFleet, RetryPolicy
from firedrill.adapters.kubernetes.schemas import SchemaValidator, crd_directory
from tests.adapters.kubernetes.apiserver import FakeApiServer

ROOT = Path(__file__).resolve().parents[3]
# Kinds no upstream schema is available for here (KEDA's CRD is not among the references):
# their bodies are reported as not checked, never as valid.
UNCHECKED_KINDS = frozenset({"ScaledObject"})


@pytest.fixture(scope="session")
def validator() -> SchemaValidator:
    crds = crd_directory(ROOT, os.environ)
    if crds is None:
        pytest.skip("upstream CRDs not found: set FIREDRILL_CRD_DIR to shared/reference/crds")
    return SchemaValidator(crds)


@dataclass
class Cluster:
    server: FakeApiServer
    fleet: KubernetesFleet
    slept: list[float] = field(default_factory=list)
    unchecked: set[str] = field(default_factory=set)

    def writes(self) -> list[tuple[str, str]]:
        return [(c.method, c.path) for c in self.fleet.transport.calls if c.method != "GET"]


def make_cluster(validator: SchemaValidator, *, dry_run: bool = False) -> Cluster:
    unchecked: set[str] = set()

    def check(obj: dict[str, object]) -> list[str]:
        if obj.get("kind") in UNCHECKED_KINDS:
            unchecked.add(str(obj["kind"]))
            return []
        return validator.problems(obj)

    server = FakeApiServer(validate=check)
    conn = connect(replay_config(), transport=server.transport())
    slept: list[float] = []
    fleet = KubernetesFleet(
        conn.client,
        conn.transport,
        dry_run=dry_run,
        sleep=slept.append,
        retry=RetryPolicy(attempts=3, backoff_s=0.5),
    )
    return Cluster(server, fleet, slept, unchecked)


@pytest.fixture
def cluster(validator: SchemaValidator) -> Iterator[Cluster]:
    c = make_cluster(validator)
    yield c
    assert c.server.violations == [], c.server.violations  # every body fit its schema
