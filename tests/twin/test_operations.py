"""Operations on the twin: each one undoes cleanly, validates before it acts, and does what it says.

The demo fleet (examples/fleet.yaml) is the subject: node ``gpu-use1-a-h100-serve-0000`` hosts
llm-70b replica ``r000000`` on all eight GPUs (TP=8), so faults on it have a known victim.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firedrill.errors import OperationError, UnknownTargetError
from firedrill.model import operations as ops
from firedrill.model.spec import FleetSpec
from firedrill.specfile import load_fleet
from firedrill.twin.engine import READY, Twin
from firedrill.twin.faults import FaultEvent
from tests.twin import sandbox_ops

FLEET_YAML = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"
SEED = 7
_DEMO = load_fleet(FLEET_YAML)
OLD_70B, OLD_8B = (
    next(m.weights.digest for m in _DEMO.models if m.name == n) for n in ("llm-70b", "llm-8b")
)

SERVE = "gpu-use1-a-h100-serve-0000"  # llm-70b replica r000000, GPUs 0-7
SERVE_8B = "gpu-use1-a-h100-serve-8b-0000"  # eight llm-8b replicas, one per GPU
TRAIN = "gpu-use1-c-h100-train-0000"
NEW_70B = "sha256:" + "70" * 32
NEW_8B = "sha256:" + "08" * 32
BUNDLE = "sha256:" + "bb" * 32
PHANTOM_EXPORTER = "3.3.9-3.6.1"
MODELS = ("llm-70b", "llm-8b")
CELLS = ("use1-a", "use1-b", "use1-c", "usw2-a", "usw2-b", "euw1-a", "euw1-b")
REGIONS = ("us-east-1", "us-west-2", "eu-west-1")
CELL_REGION = {
    c: REGIONS[0 if c.startswith("use1") else 1 if c.startswith("usw2") else 2] for c in CELLS
}

PartitionKind = Literal["cell-registry", "region-region", "region-edge"]


@pytest.fixture(scope="module")
def spec() -> FleetSpec:
    return load_fleet(FLEET_YAML)


@pytest.fixture
def twin(spec: FleetSpec) -> Twin:
    return Twin(spec, seed=SEED, record=True)


def observable(twin: Twin) -> dict[str, object]:
    """Everything an operation may change, as plain values (replica lifecycles left out)."""
    return {
        "nodes": list(twin.node_views()),
        "cells": [
            (c.name, c.quarantined, c.route_weights, tuple(r.desired for r in c.replicas))
            for c in twin.cells()
        ],
        "weights": twin.weights.tolist(),
        "scaler_paused": twin.scaler_paused.tolist(),
        "flags": dict(twin.flags),
        "partitions": set(twin.partitions),
        "replication_paused": set(twin.replication_paused),
        "capacity_denied": set(twin.capacity_denied),
        "region_digest": twin.region_digest.tolist(),
        "rollout": list(twin.rollout),
        "bundle": list(twin.bundle),
        "seats": (twin.seats_per_replica.tolist(), twin.kv_seats_per_replica.tolist()),
        "quarantined_pods": set(twin.quarantined_pods),
        # a gauge reset to 0 reads the same as one never set
        "dcgm": {k: v for k, v in twin.dcgm.items() if v != 0.0},
        "link_down": [n.name for n in twin.nodes if n.link_down],
        "slowdown": {r.pod: r.slowdown for r in twin.replicas if r.slowdown != 1.0},
        "slow_sum": twin.slow_sum.tolist(),
        "bad_exporter_nodes": twin.faults.bad_nodes.tolist(),
        "weights_quality": dict(twin.golden.overrides),
        "request_shape": (twin.shape.prompt_mu.tolist(), twin.shape.output_mean.tolist()),
        "sandbox": twin.sandbox.observable(),
        "recovery": twin.recovery.state(),
    }


def pool(twin: Twin, model: str, cell: str) -> int:
    return twin.model_index[model] * len(twin.cell_names) + twin.cell_index[cell]


def region_digest(twin: Twin, model: str, region: str) -> str:
    d = int(twin.region_digest[twin.model_index[model], twin.region_index[region]])
    return twin.digests[d].digest


def replica_on(twin: Twin, node: str, gpu: int = 0) -> int:
    n = twin.nodes[twin.node_index[node]]
    return next(r for r in sorted(n.replicas) if gpu in twin.replicas[r].gpus)


# -- 1. every operation is undone by the inverse it returns -----------------------------------

REGISTER_70B = (  # NEW_70B known to the twin, every region still serving the old digest
    ops.PromoteDigest("llm-70b", "us-east-1", NEW_70B),
    ops.RestoreDigest("llm-70b", "us-east-1", OLD_70B),
)

ROUND_TRIPS: list[tuple[str, tuple[ops.Operation, ...], ops.Operation]] = [
    ("cordon", (), ops.Cordon(SERVE)),
    ("uncordon", (ops.Cordon(SERVE),), ops.Uncordon(SERVE)),
    ("taint", (), ops.Taint(SERVE, "nvidia.com/gpu.health", "bad", "NoExecute")),
    (
        "taint-overwrite",
        (ops.Taint(SERVE, "team", "a", "PreferNoSchedule"),),
        ops.Taint(SERVE, "team", "b", "NoSchedule"),
    ),
    ("untaint", (ops.Taint(SERVE, "team", "a", "NoSchedule"),), ops.Untaint(SERVE, "team")),
    ("label", (), ops.Label(SERVE, "ir.corp/suspect", "true")),
    ("label-remove", (ops.Label(SERVE, "team", "x"),), ops.Label(SERVE, "team", None)),
    ("drain", (), ops.Drain(SERVE)),
    (
        "route-weights",
        (),
        ops.SetRouteWeights("llm-70b", (("use1-a", 0), ("usw2-a", 200), ("use1-a", 3))),
    ),
    ("quarantine-cell", (), ops.QuarantineCell("use1-b")),
    ("unquarantine-cell", (ops.QuarantineCell("use1-b"),), ops.UnquarantineCell("use1-b")),
    ("pause-scaler", (), ops.PauseScaler("llm-8b", "euw1-a", 10)),
    (
        "pause-scaler-repin",
        (ops.PauseScaler("llm-8b", "euw1-a", 10),),
        ops.PauseScaler("llm-8b", "euw1-a", 20),
    ),
    (
        "unpause-scaler",
        (ops.PauseScaler("llm-8b", "euw1-a", 10),),
        ops.UnpauseScaler("llm-8b", "euw1-a"),
    ),
    ("set-replicas", (), ops.SetReplicas("llm-70b", "use1-a", 40)),
    (
        "start-rollout-after-promote",  # us-east-1 on the new digest, the others not yet
        (ops.PromoteDigest("llm-70b", "us-east-1", NEW_70B),),
        ops.StartRollout("llm-70b", NEW_70B, 10),
    ),
    ("start-rollout", REGISTER_70B, ops.StartRollout("llm-70b", NEW_70B, 10)),
    (
        "start-rollout-over-canary",
        (*REGISTER_70B, ops.StartRollout("llm-70b", NEW_70B, 10)),
        ops.StartRollout("llm-70b", NEW_70B, 25),
    ),
    (
        "abort-rollout",
        (
            ops.PromoteDigest("llm-70b", "us-east-1", NEW_70B),
            ops.StartRollout("llm-70b", NEW_70B, 10),
        ),
        ops.AbortRollout("llm-70b"),
    ),
    (
        "promote-rollout",
        (*REGISTER_70B, ops.StartRollout("llm-70b", NEW_70B, 10)),
        ops.PromoteRollout("llm-70b"),
    ),
    (
        "restore-rollout",
        (*REGISTER_70B, ops.StartRollout("llm-70b", NEW_70B, 10)),
        ops.RestoreRollout("llm-70b", OLD_70B, None, 0),
    ),
    ("set-flag", (), ops.SetFlag("toolgw.browse", "off")),
    ("unset-flag", (ops.SetFlag("toolgw.browse", "off"),), ops.SetFlag("toolgw.browse", None)),
    ("quarantine-pod", (), ops.QuarantinePod("r000003")),
    ("unquarantine-pod", (ops.QuarantinePod("r000003"),), ops.UnquarantinePod("r000003")),
    ("promote-digest", (), ops.PromoteDigest("llm-70b", "us-east-1", NEW_70B)),
    ("promote-digest-leaf", (), ops.PromoteDigest("llm-8b", "eu-west-1", NEW_8B)),
    (
        "restore-digest",
        (ops.PromoteDigest("llm-8b", "eu-west-1", NEW_8B),),
        ops.RestoreDigest("llm-8b", "eu-west-1", OLD_8B),
    ),
    ("pause-replication", (), ops.PauseReplication("us-east-1", "us-west-2")),
    (
        "resume-replication",
        (ops.PauseReplication("us-east-1", "us-west-2"),),
        ops.ResumeReplication("us-east-1", "us-west-2"),
    ),
    ("partition-cell-registry", (), ops.Partition("cell-registry", "use1-a", "us-east-1")),
    ("partition-region-region", (), ops.Partition("region-region", "us-east-1", "eu-west-1")),
    ("partition-region-edge", (), ops.Partition("region-edge", "us-west-2", "edge")),
    (
        "heal-cell-registry",
        (ops.Partition("cell-registry", "use1-a", "us-east-1"),),
        ops.Heal("cell-registry", "use1-a", "us-east-1"),
    ),
    (
        "heal-region-region",
        (ops.Partition("region-region", "us-east-1", "eu-west-1"),),
        ops.Heal("region-region", "us-east-1", "eu-west-1"),
    ),
    (
        "heal-region-edge",
        (ops.Partition("region-edge", "us-west-2", "edge"),),
        ops.Heal("region-edge", "us-west-2", "edge"),
    ),
    ("deny-capacity", (), ops.DenyCapacity("us-west-2")),
    ("allow-capacity", (ops.DenyCapacity("us-west-2"),), ops.AllowCapacity("us-west-2")),
    ("dcgm-xid", (), ops.InjectDcgmField(SERVE, 3, 230, 79.0)),
    ("dcgm-ecc-dbe", (), ops.InjectDcgmField(SERVE, 3, 319, 2.0)),
    ("dcgm-pcie-replay", (), ops.InjectDcgmField(SERVE, 3, 202, 5000.0)),
    (
        "dcgm-overwrite",
        (ops.InjectDcgmField(SERVE, 3, 230, 13.0),),
        ops.InjectDcgmField(SERVE, 3, 230, 79.0),
    ),
    (
        "dcgm-clear",
        (ops.InjectDcgmField(SERVE, 3, 230, 79.0),),
        ops.ClearDcgmField(SERVE, 3, 230),
    ),
    ("clear-link-flap", (ops.InjectLinkFlap(SERVE),), ops.ClearLinkFlap(SERVE)),
    ("thermal", (), ops.InjectThermal(SERVE_8B, 2, 3.0)),
    ("clear-thermal", (ops.InjectThermal(SERVE_8B, 2, 3.0),), ops.ClearThermal(SERVE_8B, 2)),
    ("serving-config", (), ops.SetServingConfig("llm-70b", BUNDLE, 2048, 0.85)),
    ("node-version", (), ops.SetNodeVersion(SERVE, "dcgm_exporter", PHANTOM_EXPORTER)),
    ("node-version-driver", (), ops.SetNodeVersion(TRAIN, "driver", "560.35.03")),
    # quality and request shape (the prefill/decode split: tests/twin/test_disagg.py)
    ("weights-quality", (), ops.SetWeightsQuality("llm-70b", NEW_70B, 0.5)),
    (
        "weights-quality-clear",
        (ops.SetWeightsQuality("llm-70b", OLD_70B, 0.5),),
        ops.SetWeightsQuality("llm-70b", OLD_70B, None),
    ),
    ("request-shape", (), ops.SetRequestShape("llm-8b", 2000.0, 400.0)),
    *sandbox_ops.ROUND_TRIPS,  # agent sandboxes: injections, warm pools, freezes, blocks
    # recovery: competing pullers, recycling, admission mode, region weight, mirroring
    ("start-pullers", (), ops.StartPullers("eval-sweep", "us-west-2", 24, 140.0, "eval")),
    (
        "restart-pullers",
        (ops.StartPullers("eval-sweep", "us-west-2", 24, 140.0, "eval"),),
        ops.StartPullers("eval-sweep", "us-west-2", 8, 16.0, "batch", critical=True),
    ),
    (
        "stop-pullers",
        (ops.StartPullers("eval-sweep", "us-west-2", 24, 140.0, "eval"),),
        ops.StopPullers("eval-sweep"),
    ),
    ("freeze-pullers", (), ops.FreezePullers("us-west-2", True)),
    (
        "thaw-pullers",
        (ops.FreezePullers("us-west-2", True),),
        ops.FreezePullers("us-west-2", False),
    ),
    ("recycle-pool", (), ops.RecyclePool("use1-a", "llm-70b", 30.0, 10.0)),
    ("recycle-node-pool", (), ops.RecyclePool("use1-b", "h100-serve-8b", 50.0, 25.0)),
    (
        "stop-recycle",
        (ops.RecyclePool("use1-a", "llm-70b", 30.0, 10.0),),
        ops.StopRecycle("use1-a", "llm-70b"),
    ),
    ("admission-audit", (), ops.SetAdmission("eu-west-1", "Audit")),
    ("region-weight", (), ops.SetRegionWeight("llm-70b", "us-east-1", 10)),
    ("mirror-traffic", (), ops.MirrorTraffic("llm-70b", "us-east-1", 100)),
]


@pytest.mark.parametrize(("setup", "op"), [pytest.param(s, o, id=i) for i, s, o in ROUND_TRIPS])
def test_inverse_restores_the_state_before(
    twin: Twin, setup: tuple[ops.Operation, ...], op: ops.Operation
) -> None:
    for s in setup:
        twin.apply(s)
    before = observable(twin)
    journal_n = len(twin.journal)

    inverse = twin.apply(op)
    assert not isinstance(inverse, ops.Noop)
    assert observable(twin) != before, "the operation changed nothing; the case proves nothing"
    undo = twin.apply(inverse)

    assert observable(twin) == before
    assert twin.journal[journal_n:] == [
        ops.Applied(op=op, inverse=inverse, at_s=twin.now_s()),
        ops.Applied(op=inverse, inverse=undo, at_s=twin.now_s()),
    ]


def test_link_flap_inverse_restores_the_link_and_keeps_the_xid(twin: Twin) -> None:
    """DCGM's XID gauge holds the last XID seen; clearing the flap does not rewrite history."""
    ni = twin.node_index[SERVE]
    before = observable(twin)
    inverse = twin.apply(ops.InjectLinkFlap(SERVE))
    assert inverse == ops.ClearLinkFlap(SERVE)
    assert observable(twin)["link_down"] == [SERVE]

    twin.apply(inverse)

    after = observable(twin)
    assert after.pop("dcgm") == {(ni, 0, 230): 74.0}
    assert before.pop("dcgm") == {}
    assert after == before


def test_drain_cannot_bring_evicted_replicas_back_but_uncordons(twin: Twin) -> None:
    rid = replica_on(twin, SERVE)
    inverse = twin.apply(ops.Drain(SERVE))
    assert inverse == ops.Uncordon(SERVE)
    assert twin.replicas[rid].state != READY
    twin.apply(inverse)
    assert not twin.node(SERVE).cordoned
    assert twin.replicas[rid].state != READY


def test_inverse_of_an_op_that_changes_nothing_is_a_noop(twin: Twin) -> None:
    for op in (
        ops.Uncordon(SERVE),
        ops.Untaint(SERVE, "absent"),
        ops.UnquarantineCell("use1-a"),
        ops.UnpauseScaler("llm-70b", "use1-a"),
        ops.UnquarantinePod("r000001"),
        ops.ResumeReplication("us-east-1", "eu-west-1"),
        ops.Heal("region-region", "us-east-1", "us-west-2"),
        ops.AllowCapacity("eu-west-1"),
        ops.AbortRollout("llm-70b"),
        ops.ClearLinkFlap(SERVE),
        ops.ClearThermal(SERVE, 0),
    ):
        before = observable(twin)
        assert isinstance(twin.apply(op), ops.Noop), op
        assert observable(twin) == before


def test_inverse_of_previews_without_applying(twin: Twin) -> None:
    before = observable(twin)
    assert twin.inverse_of(ops.Cordon(SERVE)) == ops.Uncordon(SERVE)
    assert twin.inverse_of(ops.SetReplicas("llm-8b", "usw2-b", 3)) == ops.SetReplicas(
        "llm-8b", "usw2-b", 128
    )
    assert observable(twin) == before
    assert twin.journal == []


# -- 2. validate, then act ---------------------------------------------------------------------

UNKNOWN_TARGETS: list[ops.Operation] = [
    ops.Cordon("gpu-nowhere-0000"),
    ops.Uncordon("gpu-nowhere-0000"),
    ops.Taint("gpu-nowhere-0000", "k", "v"),
    ops.Untaint("gpu-nowhere-0000", "k"),
    ops.Label("gpu-nowhere-0000", "k", "v"),
    ops.Drain("gpu-nowhere-0000"),
    ops.SetRouteWeights("llm-1t", (("use1-a", 1),)),
    ops.SetRouteWeights("llm-70b", (("use1-a", 1), ("mars-a", 1))),
    ops.QuarantineCell("mars-a"),
    ops.UnquarantineCell("mars-a"),
    ops.PauseScaler("llm-1t", "use1-a", 1),
    ops.PauseScaler("llm-70b", "mars-a", 1),
    ops.UnpauseScaler("llm-70b", "mars-a"),
    ops.SetReplicas("llm-1t", "use1-a", 1),
    ops.SetReplicas("llm-70b", "mars-a", 1),
    ops.StartRollout("llm-1t", NEW_70B, 10),
    ops.StartRollout("llm-70b", "sha256:" + "00" * 32, 10),
    ops.AbortRollout("llm-1t"),
    ops.PromoteRollout("llm-1t"),
    ops.RestoreRollout("llm-1t", NEW_70B, None, 0),
    ops.RestoreRollout("llm-70b", OLD_70B, "sha256:" + "00" * 32, 10),
    ops.QuarantinePod("r999999"),
    ops.QuarantinePod("pod-1"),
    ops.QuarantinePod("r"),
    ops.UnquarantinePod("r999999"),
    ops.PromoteDigest("llm-1t", "us-east-1", NEW_70B),
    ops.PromoteDigest("llm-70b", "mars-1", NEW_70B),
    ops.RestoreDigest("llm-70b", "us-east-1", "sha256:" + "00" * 32),
    ops.RestoreDigest("llm-70b", "mars-1", NEW_70B),
    ops.PauseReplication("us-east-1", "mars-1"),
    ops.ResumeReplication("mars-1", "us-west-2"),
    ops.Partition("cell-registry", "mars-a", "us-east-1"),
    ops.Partition("cell-registry", "use1-a", "mars-1"),
    ops.Partition("region-region", "us-east-1", "mars-1"),
    ops.Partition("region-edge", "mars-1", "edge"),
    ops.Heal("region-region", "mars-1", "us-east-1"),
    ops.DenyCapacity("mars-1"),
    ops.AllowCapacity("mars-1"),
    ops.InjectDcgmField("gpu-nowhere-0000", 0, 230, 79.0),
    ops.InjectDcgmField(SERVE, 8, 230, 79.0),
    ops.InjectDcgmField(SERVE, -1, 230, 79.0),
    ops.InjectDcgmField(SERVE, 0, 9999, 1.0),
    ops.ClearDcgmField(SERVE, 0, 9999),
    ops.InjectLinkFlap("gpu-nowhere-0000"),
    ops.ClearLinkFlap("gpu-nowhere-0000"),
    ops.InjectThermal("gpu-nowhere-0000", 0),
    ops.InjectThermal(SERVE, 8),
    ops.ClearThermal(SERVE, 8),
    ops.SetServingConfig("llm-1t", BUNDLE, 256, 0.9),
    ops.SetNodeVersion("gpu-nowhere-0000", "driver", "1"),
    *sandbox_ops.UNKNOWN_TARGETS,
    ops.StartPullers("eval", "mars-1", 4, 10.0),
    ops.FreezePullers("mars-1", True),
    ops.RecyclePool("mars-a", "llm-70b", 30.0),
    ops.RecyclePool("use1-a", "llm-1t", 30.0),
    ops.RecyclePool("use1-a", "h100-train", 30.0),  # a node pool of use1-c, not of use1-a
    ops.StopRecycle("mars-a", "llm-70b"),
    ops.SetAdmission("mars-1", "Enforce"),
    ops.SetRegionWeight("llm-1t", "us-east-1", 10),
    ops.SetRegionWeight("llm-70b", "mars-1", 10),
    ops.MirrorTraffic("llm-70b", "mars-1", 100),
]


@pytest.mark.parametrize("op", UNKNOWN_TARGETS, ids=repr)
def test_unknown_target_is_refused_and_changes_nothing(twin: Twin, op: ops.Operation) -> None:
    before = observable(twin)
    changes_n = len(twin.changes_log)
    with pytest.raises(UnknownTargetError):
        twin.apply(op)
    assert observable(twin) == before
    assert twin.journal == []
    assert len(twin.changes_log) == changes_n


INVALID_VALUES: list[ops.Operation] = [
    ops.SetReplicas("llm-70b", "use1-a", -1),
    ops.PauseScaler("llm-70b", "use1-a", -1),
    ops.SetRouteWeights("llm-70b", (("use1-a", -1),)),
    ops.SetRouteWeights("llm-70b", (("use1-a", 10), ("use1-b", -1))),
    ops.StartRollout("llm-70b", OLD_70B, 150),
    ops.StartRollout("llm-70b", OLD_70B, -5),
    ops.PromoteRollout("llm-70b"),  # no rollout to promote
    ops.RestoreRollout("llm-70b", OLD_70B, OLD_70B, 150),
    ops.InjectThermal(SERVE, 0, 0.5),
    ops.SetServingConfig("llm-70b", BUNDLE, 256, 1.5),
    ops.SetServingConfig("llm-70b", BUNDLE, 0, 0.9),
    ops.SetServingConfig("llm-70b", BUNDLE, 5000, 0.9),
    *sandbox_ops.INVALID_VALUES,
    ops.StartPullers("eval", "us-west-2", 0, 10.0),
    ops.StartPullers("eval", "us-west-2", 4, 0.0),
    ops.StartPullers("eval", "us-west-2", 100_000, 10.0),
    ops.RecyclePool("use1-a", "llm-70b", 0.0),
    ops.RecyclePool("use1-a", "llm-70b", 30.0, 150.0),
    ops.SetRegionWeight("llm-70b", "us-east-1", 101),
    ops.MirrorTraffic("llm-70b", "us-east-1", -1),
]


@pytest.mark.parametrize("op", INVALID_VALUES, ids=repr)
def test_invalid_value_is_an_operation_error_and_changes_nothing(
    twin: Twin, op: ops.Operation
) -> None:
    before = observable(twin)
    changes_n = len(twin.changes_log)
    with pytest.raises(OperationError):
        twin.apply(op)
    assert observable(twin) == before
    assert twin.journal == []
    assert len(twin.changes_log) == changes_n


# -- 3. what the operations do ----------------------------------------------------------------


def test_drain_moves_the_pool_to_other_nodes(twin: Twin) -> None:
    p = pool(twin, "llm-70b", "use1-a")
    twin.apply(ops.PauseScaler("llm-70b", "use1-a", 56))  # so that only the drain moves replicas
    ni = twin.node_index[SERVE]
    evicted = set(twin.nodes[ni].replicas)
    assert evicted
    ready_before = int(twin.ready[p])
    first_new = len(twin.replicas)

    twin.apply(ops.Drain(SERVE))

    assert twin.node(SERVE).cordoned
    assert all(twin.replicas[r].state != READY for r in evicted)
    assert int(twin.ready[p]) == ready_before - len(evicted)

    twin.run_for(600)

    assert twin.nodes[ni].replicas == set()
    assert not any(r.node == ni for r in twin.replicas)
    ready = [twin.replicas[r] for r in twin.pool_replicas[p] if twin.replicas[r].state == READY]
    assert len(ready) == int(twin.ready[p]) == 56
    replacements = [r for r in ready if r.id >= first_new]
    assert len(replacements) == len(evicted)
    digest = twin.digest_index[OLD_70B]
    for r in replacements:  # the weights reached the new node, pulled or already cached
        assert r.node != ni
        assert digest in twin.nodes[r.node].cache


def test_link_flap_takes_the_whole_tp8_replica_out(twin: Twin) -> None:
    p = pool(twin, "llm-70b", "use1-a")
    rid = replica_on(twin, SERVE)
    assert twin.models[twin.replicas[rid].model].tp == 8
    assert twin.replicas[rid].state == READY
    # pin the scaler: a scale-in would rightly remove the broken replica first
    twin.apply(ops.PauseScaler("llm-70b", "use1-a", int(twin.desired[p])))
    ready_before = int(twin.ready[p])

    twin.apply(ops.InjectLinkFlap(SERVE))

    assert twin.replicas[rid].state != READY
    assert int(twin.ready[p]) == ready_before - 1
    twin.run_for(120)  # restarts keep failing while the link is down
    assert twin.replicas[rid].state != READY

    twin.apply(ops.ClearLinkFlap(SERVE))
    twin.run_for(120)
    assert twin.replicas[rid].state == READY


def test_quarantined_cell_gets_no_traffic_and_its_neighbours_take_it(spec: FleetSpec) -> None:
    twin, control = Twin(spec, seed=SEED), Twin(spec, seed=SEED)
    twin.apply(ops.QuarantineCell("use1-a"))
    twin.run_for(60)
    control.run_for(60)
    for m in MODELS:
        assert twin.lam[pool(twin, m, "use1-a")] == 0.0
        for c in ("use1-b", "use1-c"):
            assert twin.lam[pool(twin, m, c)] > 1.3 * control.lam[pool(control, m, c)]
        for c in ("usw2-a", "euw1-b"):  # locality first: other regions are not involved
            assert twin.lam[pool(twin, m, c)] < 1.1 * control.lam[pool(control, m, c)]


def test_zero_route_weights_spill_a_region_to_the_others(spec: FleetSpec) -> None:
    twin, control = Twin(spec, seed=SEED), Twin(spec, seed=SEED)
    east = [c for c in CELLS if CELL_REGION[c] == "us-east-1"]
    twin.apply(ops.SetRouteWeights("llm-70b", tuple((c, 0) for c in east)))
    twin.run_for(300)
    control.run_for(300)
    for c in CELLS:
        p = pool(twin, "llm-70b", c)
        if c in east:
            assert twin.lam[p] == 0.0
        else:
            assert twin.lam[p] > 1.3 * control.lam[p]
    assert int(twin.errors.sum()) == 0
    # llm-8b is routed as before
    p8 = [pool(twin, "llm-8b", c) for c in east]
    assert np.all(twin.lam[p8] > 0)


def test_injected_xid_is_signal_only(twin: Twin) -> None:
    rid = replica_on(twin, SERVE, gpu=3)
    twin.apply(ops.InjectDcgmField(SERVE, 3, 230, 79.0))
    twin.run_for(60)

    series = twin.query(
        "DCGM_FI_DEV_XID_ERRORS", {"Hostname": SERVE}, start_s=0.0, end_s=twin.now_s()
    )
    assert len(series) == 1
    s = series[0]
    assert dict(s.labels) == {
        "Hostname": SERVE,
        "gpu": "3",
        "cell": "use1-a",
        "region": "us-east-1",
    }
    assert s.values[-1] == 79.0
    assert twin.replicas[rid].state == READY
    assert 3 not in twin.nodes[twin.node_index[SERVE]].failed_gpus
    assert twin.fault_log[-1].phantom


def test_real_xid79_takes_the_replica_out_for_good(twin: Twin) -> None:
    ni = twin.node_index[SERVE]
    rid = replica_on(twin, SERVE, gpu=5)
    twin._fault(FaultEvent(twin.now_s(), ni, 5, "xid", 79))
    assert twin.replicas[rid].state != READY
    for _ in range(10):
        twin.run_for(60)
        assert twin.replicas[rid].state != READY
    assert 5 in twin.nodes[ni].failed_gpus
    assert not twin.fault_log[-1].phantom


def test_unsigned_digest_is_never_admitted(spec: FleetSpec) -> None:
    twin, control = Twin(spec, seed=SEED), Twin(spec, seed=SEED)
    denied = twin.admission["denied"]
    twin.apply(ops.PromoteDigest("llm-70b", "us-east-1", NEW_70B, signed=False))
    d = twin.digest_index[NEW_70B]
    for _ in range(5):
        twin.run_for(60)
        control.run_for(60)
        assert not any(r.digest == d for r in twin.replicas)
    assert twin.admission["denied"] > denied
    assert np.array_equal(twin.ready, control.ready)


def test_paused_replication_holds_the_digest_back(twin: Twin) -> None:
    old = OLD_70B
    lag_s = next(r.replication_lag_s for r in twin.spec.regions if r.name == "us-west-2")
    twin.apply(ops.PauseReplication("us-east-1", "us-west-2"))
    twin.apply(ops.PromoteDigest("llm-70b", "us-east-1", NEW_70B))
    twin.run_for(lag_s + 60)

    assert region_digest(twin, "llm-70b", "us-east-1") == NEW_70B
    assert region_digest(twin, "llm-70b", "eu-west-1") == NEW_70B
    assert region_digest(twin, "llm-70b", "us-west-2") == old

    since = twin.now_s()
    twin.apply(ops.ResumeReplication("us-east-1", "us-west-2"))
    twin.run_for(lag_s + 60)

    assert region_digest(twin, "llm-70b", "us-west-2") == NEW_70B
    landed = [c for c in twin.changes(since_s=since) if c.region == "us-west-2"]
    assert {(c.stream, c.cell, c.before, c.after) for c in landed} == {
        ("weights", c, old, NEW_70B) for c in ("usw2-a", "usw2-b")
    }


def test_bigger_batches_than_the_kv_cache_holds_preempt(spec: FleetSpec) -> None:
    """At the demo's load a replica runs ~40 sequences, far below its KV cache's ~1,400 seats;
    pinning use1-a to one replica puts the cell's whole load on it."""
    twin, control = Twin(spec, seed=SEED), Twin(spec, seed=SEED)
    p = pool(twin, "llm-70b", "use1-a")
    assert twin.kv_seats_per_replica[p] > twin.seats_per_replica[p]
    for t in (twin, control):
        t.apply(ops.PauseScaler("llm-70b", "use1-a", 1))
    twin.apply(ops.SetServingConfig("llm-70b", BUNDLE, 2048, 0.9))
    assert twin.kv_seats_per_replica[p] < twin.seats_per_replica[p] == 2048
    twin.run_for(300)
    control.run_for(300)
    assert control.preemptions[p] == 0
    assert twin.preemptions[p] > 0


def test_bad_exporter_version_brings_phantom_xids(spec: FleetSpec) -> None:
    faults = spec.faults.model_copy(update={"phantom_xid_per_node_hour": 360.0})
    twin = Twin(spec.model_copy(update={"faults": faults}), seed=SEED)
    twin.run_for(60)
    assert not any(ev.phantom for ev in twin.fault_log)

    ni = twin.node_index[SERVE]
    rid = replica_on(twin, SERVE)
    twin.apply(ops.SetNodeVersion(SERVE, "dcgm_exporter", PHANTOM_EXPORTER))
    twin.run_for(120)  # ~12 expected at 0.1/s

    phantoms = [ev for ev in twin.fault_log if ev.phantom]
    assert len(phantoms) >= 3
    assert {ev.node for ev in phantoms} == {ni}
    assert {ev.xid for ev in phantoms} == {spec.faults.phantom_xid}
    assert not any(ev.remediable for ev in phantoms)
    assert twin.replicas[rid].state == READY  # the GPU is healthy; only the gauge lies
    assert twin.nodes[ni].failed_gpus == set()
    xids = twin.query(
        "DCGM_FI_DEV_XID_ERRORS", {"Hostname": SERVE}, start_s=0.0, end_s=twin.now_s()
    )
    scraped = [s.values[-1] for s in xids if not np.isnan(s.values[-1])]  # set before a scrape
    assert scraped
    assert set(scraped) == {spec.faults.phantom_xid}
    assert {v for (n, _, f), v in twin.dcgm.items() if n == ni and f == 230} == {79.0}


# what changed: stream and cells of the events an operation appends
EAST = ("use1-a", "use1-b", "use1-c")
CHANGE_CASES: list[tuple[str, tuple[ops.Operation, ...], ops.Operation, str, set[str]]] = [
    ("promote-digest", (), ops.PromoteDigest("llm-70b", "us-east-1", NEW_70B), "weights", {*EAST}),
    (
        "restore-digest",
        (ops.PromoteDigest("llm-70b", "us-east-1", NEW_70B),),
        ops.RestoreDigest("llm-70b", "us-east-1", OLD_70B),
        "weights",
        {*EAST},
    ),
    ("start-rollout", REGISTER_70B, ops.StartRollout("llm-70b", NEW_70B, 10), "weights", {*CELLS}),
    (
        "abort-rollout",
        (*REGISTER_70B, ops.StartRollout("llm-70b", NEW_70B, 10)),
        ops.AbortRollout("llm-70b"),
        "weights",
        {*CELLS},
    ),
    (
        "promote-rollout",
        (*REGISTER_70B, ops.StartRollout("llm-70b", NEW_70B, 10)),
        ops.PromoteRollout("llm-70b"),
        "weights",
        {*CELLS},
    ),
    (
        "restore-rollout",
        (*REGISTER_70B, ops.StartRollout("llm-70b", NEW_70B, 10)),
        ops.RestoreRollout("llm-70b", OLD_70B, None, 0),
        "weights",
        {*CELLS},
    ),
    (
        "serving-config",
        (),
        ops.SetServingConfig("llm-8b", BUNDLE, 512, 0.9),
        "bundle",
        {*CELLS},
    ),
    (
        "node-version",
        (),
        ops.SetNodeVersion(SERVE, "driver", "560.35.03"),
        "node_layer",
        {"use1-a"},
    ),
    ("set-flag", (), ops.SetFlag("toolgw.browse", "off"), "network_policy", {"*"}),
    (
        "partition",
        (),
        ops.Partition("region-region", "us-east-1", "eu-west-1"),
        "network_policy",
        {"*"},
    ),
    (
        "heal",
        (ops.Partition("region-edge", "us-west-2", "edge"),),
        ops.Heal("region-edge", "us-west-2", "edge"),
        "network_policy",
        {"*"},
    ),
]


@pytest.mark.parametrize(
    ("setup", "op", "stream", "cells"), [pytest.param(*c[1:], id=c[0]) for c in CHANGE_CASES]
)
def test_visible_change_appends_a_change_event(
    twin: Twin,
    setup: tuple[ops.Operation, ...],
    op: ops.Operation,
    stream: str,
    cells: set[str],
) -> None:
    for s in setup:
        twin.apply(s)
    twin.run_for(5)
    since = twin.now_s()
    n = len(twin.changes_log)
    twin.apply(op)
    new = twin.changes(since_s=since)
    assert len(new) == len(twin.changes_log) - n > 0
    assert {c.stream for c in new} == {stream}
    assert {c.cell for c in new} == cells
    assert all(c.at_s == since for c in new)
    assert all(c.before != c.after for c in new)


def test_changes_filter_by_cell_keeps_fleet_wide_events(twin: Twin) -> None:
    twin.apply(ops.SetFlag("toolgw.browse", "off"))
    twin.apply(ops.SetNodeVersion(SERVE, "kernel", "6.8.0-1020"))
    twin.apply(ops.SetNodeVersion("gpu-euw1-a-h100-serve-0000", "kernel", "6.8.0-1020"))
    assert {c.cell for c in twin.changes(since_s=0.0, cell="use1-a")} == {"*", "use1-a"}
    with pytest.raises(UnknownTargetError):
        twin.changes(since_s=0.0, cell="mars-a")


# -- 4. any sequence of levers is undone by its inverses in reverse order ---------------------

NODES = (SERVE, "gpu-use1-a-h100-serve-8b-0003", "gpu-usw2-b-h100-serve-0007", TRAIN)
_node = st.sampled_from(NODES)
_key = st.sampled_from(("ir.corp/quarantine", "nvidia.com/gpu.health", "team"))
_value = st.sampled_from(("true", "false", "a"))
_effect = st.sampled_from(("NoSchedule", "PreferNoSchedule", "NoExecute"))
_model = st.sampled_from(MODELS)
_cell = st.sampled_from(CELLS)
_region = st.sampled_from(REGIONS)
_cut: st.SearchStrategy[tuple[PartitionKind, str, str]] = st.one_of(
    _cell.map(lambda c: ("cell-registry", c, CELL_REGION[c])),
    st.tuples(st.just("region-region"), _region, _region),
    _region.map(lambda r: ("region-edge", r, "edge")),
)
LEVERS: st.SearchStrategy[ops.Operation] = st.one_of(
    st.builds(ops.Cordon, _node),
    st.builds(ops.Uncordon, _node),
    st.builds(ops.Taint, _node, _key, _value, _effect),
    st.builds(ops.Untaint, _node, _key, _effect),
    st.builds(ops.Label, _node, _key, st.none() | _value),
    st.builds(
        ops.SetRouteWeights,
        _model,
        st.lists(st.tuples(_cell, st.integers(0, 300)), min_size=1, max_size=4).map(tuple),
    ),
    st.builds(ops.QuarantineCell, _cell),
    st.builds(ops.UnquarantineCell, _cell),
    st.builds(ops.PauseScaler, _model, _cell, st.integers(0, 80)),
    st.builds(ops.UnpauseScaler, _model, _cell),
    st.builds(ops.SetFlag, st.sampled_from(("toolgw.browse", "toolgw.code")), st.none() | _value),
    _cut.map(lambda k: ops.Partition(*k)),
    _cut.map(lambda k: ops.Heal(*k)),
    st.builds(ops.DenyCapacity, _region),
    st.builds(ops.AllowCapacity, _region),
    st.builds(
        lambda md, q: ops.SetWeightsQuality(md[0], md[1], q),
        st.sampled_from([("llm-70b", OLD_70B), ("llm-70b", NEW_70B), ("llm-8b", OLD_8B)]),
        st.none() | st.sampled_from([0.5, 0.97]),
    ),
    st.builds(
        ops.SetRequestShape, _model, st.sampled_from([300.0, 2000.0]), st.sampled_from([80.0])
    ),
    sandbox_ops.LEVERS,
    st.builds(
        ops.StartPullers,
        st.sampled_from(("eval-sweep", "batch-embed")),
        _region,
        st.integers(1, 30),
        st.sampled_from((16.0, 140.0)),
        st.sampled_from(("batch", "eval", "scale_out")),
        st.booleans(),
    ),
    st.builds(ops.StopPullers, st.sampled_from(("eval-sweep", "batch-embed"))),
    st.builds(ops.FreezePullers, _region, st.booleans()),
    st.builds(
        ops.RecyclePool,
        _cell,
        st.sampled_from((*MODELS, "h100-serve")),
        st.sampled_from((10.0, 30.0, 100.0)),
        st.sampled_from((10.0, 25.0)),
    ),
    st.builds(ops.StopRecycle, _cell, st.sampled_from((*MODELS, "h100-serve"))),
    st.builds(ops.SetAdmission, _region, st.sampled_from(("Enforce", "Audit", "Ignore"))),
    st.builds(ops.SetRegionWeight, _model, _region, st.sampled_from((0, 10, 40, 100))),
    st.builds(ops.MirrorTraffic, _model, _region, st.sampled_from((0, 50, 100))),
)


@settings(max_examples=40, deadline=None)
@given(levers=st.lists(LEVERS, max_size=8))
def test_inverses_in_reverse_order_restore_the_fleet(
    spec: FleetSpec, levers: list[ops.Operation]
) -> None:
    twin = Twin(spec, seed=SEED, record=True)
    before = observable(twin)
    cells_before = list(twin.cells())

    inverses = [twin.apply(op) for op in levers]
    assert [a.inverse for a in twin.journal] == inverses
    for inverse in reversed(inverses):
        twin.apply(inverse)

    assert observable(twin) == before
    assert list(twin.cells()) == cells_before
    assert len(twin.journal) == 2 * len(levers)
