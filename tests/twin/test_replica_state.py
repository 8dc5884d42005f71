"""Replica states are a ``ReplicaState`` enum whose values index the per-pool state counts, and
the operation dispatch refuses what is no Operation with the twin's own error."""

from __future__ import annotations

import pytest

from firedrill.errors import OperationError
from firedrill.model import operations as ops
from firedrill.twin import engine
from firedrill.twin.engine import Twin
from firedrill.twin.replica import LIVE, STATE_NAMES, ReplicaState
from tests.twin.fleets import fleet, model


@pytest.fixture
def twin() -> Twin:
    return Twin(fleet(regions={"r": (1, 4, 2, 0.0)}, m=model()), seed=3)


def test_every_state_has_its_column_and_name(twin: Twin) -> None:
    assert [s.value for s in ReplicaState] == list(range(len(STATE_NAMES)))
    assert twin.state_counts.shape[1] == len(ReplicaState)
    assert set(LIVE) == set(ReplicaState) - {ReplicaState.DRAINING, ReplicaState.GONE}


def test_the_engine_names_are_the_enum_members() -> None:
    for state in ReplicaState:
        assert getattr(engine, state.name) is state


def test_replicas_carry_enum_members_and_the_log_their_values(twin: Twin) -> None:
    assert twin.replicas
    assert all(r.state is ReplicaState.READY for r in twin.replicas)
    counts = twin.state_counts.sum(axis=0)
    assert counts[ReplicaState.READY] == len(twin.replicas)
    pod = twin.replicas[0].pod
    twin.apply(ops.KillPod(pod))
    assert twin.replicas[0].state is ReplicaState.EJECTED
    frm, to = twin.replica_log[-1][2:4]
    assert (frm, to) == (ReplicaState.READY, ReplicaState.EJECTED)
    assert type(to) is int  # the log holds values; ReplicaState(to) is the state
    assert ReplicaState(to) is ReplicaState.EJECTED
    assert int(ReplicaState.EJECTED) == 6  # an IntEnum: code that compares with ints keeps working


def test_what_is_no_operation_is_refused_with_an_operation_error(twin: Twin) -> None:
    with pytest.raises(OperationError, match="unsupported operation"):
        twin.inverse_of("cordon everything")  # type: ignore[arg-type]
    with pytest.raises(OperationError, match="unsupported operation"):
        twin.apply(object())  # type: ignore[arg-type]
    assert twin.journal == []
