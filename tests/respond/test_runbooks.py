"""The runbook registry: one literal, every symptom kind with exactly one runbook."""

from __future__ import annotations

import ast
import inspect

import pytest

from firedrill.respond import runbooks
from firedrill.respond.inference import kv_oom_runbook
from firedrill.respond.runbooks import RUNBOOKS
from firedrill.respond.suspects import SYMPTOM_KINDS


def _literal_keys() -> list[str]:
    """The keys of the ``RUNBOOKS`` dict literal, as written (a repeated key shows twice)."""
    tree = ast.parse(inspect.getsource(runbooks))
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and node.keys:
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if set(keys) & set(SYMPTOM_KINDS):
                return [str(k) for k in keys]
    raise AssertionError("no runbook literal in firedrill.respond.runbooks")


def test_every_symptom_kind_has_exactly_one_runbook() -> None:
    keys = _literal_keys()
    assert sorted(keys) == sorted(SYMPTOM_KINDS), "each symptom kind once, no other key"
    assert set(RUNBOOKS) == set(SYMPTOM_KINDS)
    assert all(callable(fn) for fn in RUNBOOKS.values())


def test_kv_pressure_runs_the_bundle_aware_runbook() -> None:
    assert RUNBOOKS["kv_oom"] is kv_oom_runbook


def test_the_registry_cannot_be_changed_at_run_time() -> None:
    with pytest.raises(TypeError):
        RUNBOOKS["quality"] = kv_oom_runbook  # type: ignore[index]
