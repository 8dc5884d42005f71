"""Assembling the calibrated fleet: what each observation changes, and what it leaves alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from firedrill.calibrate.fleet import Calibration, Observations, Sampled, calibrate_fleet
from firedrill.errors import CalibrationError
from firedrill.model.series import labels_of
from firedrill.specfile import load_fleet

BASE = load_fleet(Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml")
STEP_S = 60.0
DAYS = 2.0
TIMES_S = np.arange(0.0, DAYS * 86_400.0 + 1, STEP_S)


def _gpu(code: float, born_s: float, host: str) -> Sampled:
    """An XID gauge of one GPU, born with ``code`` at ``born_s``."""
    values = np.where(born_s <= TIMES_S, code, np.nan)
    return Sampled(labels_of(Hostname=host, gpu="0"), TIMES_S.copy(), values)


def _observe(**kw: tuple[Sampled, ...]) -> Calibration:
    empty: tuple[Sampled, ...] = ()
    fields = dict.fromkeys(
        (
            "replicas_desired", "replicas_available", "nodes", "request_rate", "running",
            "tpot_sum_rate", "tpot_count_rate", "kv_usage", "xid", "ecc_dbe", "hydrate_bytes",
            "hydrate_peak_bytes_per_s",
        ),
        empty,
    )  # fmt: skip
    fields.update(kw)
    obs = Observations(
        start_unix_s=0.0,
        end_unix_s=float(TIMES_S[-1]),
        step_s=STEP_S,
        nodes_source="test",
        ttft=(),
        **fields,
    )
    return calibrate_fleet(BASE, obs)


def _rows(c: Calibration) -> dict[str, tuple[float | None, int, str]]:
    return {p.parameter: (p.value, p.samples, p.note) for p in c.parameters}


def test_nothing_observed_keeps_the_base_and_says_why_for_every_field() -> None:
    c = _observe()
    assert c.fleet == BASE
    assert not c.fitted
    assert all(p.note for p in c.not_fitted)


def test_an_xid_code_two_classes_show_is_split_by_the_base_shares() -> None:
    nodes = sum(p.nodes for r in BASE.regions for c in r.cells for p in c.node_pools)
    node_days = nodes * DAYS
    xid = tuple(_gpu(74.0, 3600.0 * (i + 1), f"n{i}") for i in range(3))
    c = _observe(xid=xid)
    rows = _rows(c)
    flap = next(f for f in BASE.faults.background if f.kind == "link_flap")
    x74 = next(f for f in BASE.faults.background if f.xid == 74 and f.kind == "xid")
    share = x74.per_1000_node_days / (x74.per_1000_node_days + flap.per_1000_node_days)
    value, samples, note = rows["faults.xid.xid74"]
    assert value == pytest.approx(3 / node_days * 1000 * share, rel=1e-3)
    assert samples == 3
    assert "split" in note
    assert rows["faults.link_flap"][0] == pytest.approx(
        3 / node_days * 1000 * (1 - share), rel=1e-3
    )
    # a code no class of the base shows was never seen: its rate is fitted as zero
    assert rows["faults.xid.xid79"][0] == 0.0
    # a class with no XID and no counter of its own keeps the base's rate
    thermal = next(p for p in c.parameters if p.parameter == "faults.thermal")
    assert not thermal.fitted
    assert "no per-event series" in thermal.note


def test_a_double_bit_error_is_counted_once_not_as_an_xid_48_too() -> None:
    xid = (_gpu(48.0, 7200.0, "a"), _gpu(48.0, 9000.0, "b"))
    dbe = (
        Sampled(
            labels_of(Hostname="a", gpu="0"),
            TIMES_S.copy(),
            np.where(TIMES_S >= 7200.0, 1.0, np.nan),
        ),
    )
    rows = _rows(_observe(xid=xid, ecc_dbe=dbe))
    assert rows["faults.ecc_dbe"][1] == 1
    assert rows["faults.xid.xid48"][1] == 1  # two XID 48s, one of them the DBE's


def test_an_unknown_code_is_added_as_a_class() -> None:
    c = _observe(xid=(_gpu(140.0, 3600.0, "a"),))
    added = [f for f in c.fleet.faults.background if f.kind == "xid" and f.xid == 140]
    assert len(added) == 1
    assert added[0].per_1000_node_days > 0


def test_replicas_the_base_cannot_hold_are_a_clear_error_not_a_crash() -> None:
    labels = labels_of(deployment="llm-70b", cell="use1-a", region="us-east-1")
    desired = (Sampled(labels, TIMES_S.copy(), np.full(TIMES_S.shape, 1000.0)),)
    with pytest.raises(CalibrationError, match="node pools may be smaller"):
        _observe(replicas_desired=desired)


def test_replicas_come_from_the_busiest_moment_of_the_window() -> None:
    labels = labels_of(deployment="llm-70b", cell="use1-a", region="us-east-1")
    values = np.where(TIMES_S < 3600.0, 50.0, 40.0)  # scaled in after the first hour
    c = _observe(replicas_desired=(Sampled(labels, TIMES_S.copy(), values),))
    cell = next(cl for r in c.fleet.regions for cl in r.cells if cl.name == "use1-a")
    assert cell.replicas["llm-70b"] == 50
    assert cell.replicas["llm-8b"] == 128  # not observed: the base's count, and said so
    kept = next(p for p in c.parameters if p.parameter == "cells.use1-a.replicas.llm-8b")
    assert not kept.fitted
