"""Every spec loader, fed mutated example specs: a clean refusal or a usable spec, never a crash.

A mutation replaces one value of a shipped example (anywhere in its tree) with something a slip
or a hostile hand could write, or deletes it; the mutant is loaded with the loader its kind
uses and then used the way the commands use it first. Anything but success or a
``FiredrillError`` fails the property. ``benchmarks/spec_fuzz.py`` runs the same idea at scale.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from firedrill.errors import FiredrillError
from tests.fuzz.profiles import FUZZ

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _use_fleet(path: Path) -> None:
    from firedrill.specfile import load_fleet
    from firedrill.twin.engine import Twin

    Twin(load_fleet(path), 0, hours_hint=0.1).run_for(15.0)


def _use_slo(path: Path) -> None:
    from firedrill.detect.alertmanager import alertmanager_yaml
    from firedrill.detect.rules import generate
    from firedrill.detect.slo import SloSpec
    from firedrill.specfile import load_spec

    slo = load_spec(path, SloSpec)
    generate(slo).rule_file()
    alertmanager_yaml(slo.routing)


def _use_policy(path: Path) -> None:
    from firedrill.export.nhc import node_health_check
    from firedrill.remediate.policy import PolicySpec
    from firedrill.specfile import load_spec

    node_health_check(load_spec(path, PolicySpec), name="gpu-nodes")


def _use_scenario(path: Path) -> None:
    from firedrill.scenario.run import expand
    from firedrill.specfile import load_scenario
    from firedrill.twin.world import embedded_world

    spec, fleet, _, _ = load_scenario(path)
    world = embedded_world(fleet, spec.seed, 0.1)
    for entry in sorted(spec.timeline, key=lambda e: e.at_s):
        for op in expand(entry, world):
            world.apply(op)
        world.advance(1.0)


def _use_drill(path: Path) -> None:
    from firedrill.adapters.worlds import EMBEDDED
    from firedrill.drill.run import plan
    from firedrill.specfile import load_drill

    loaded = load_drill(path)
    plan(loaded.spec, loaded.fleet, make_world=EMBEDDED)


SPECS: dict[str, Callable[[Path], None]] = {
    "fleet.yaml": _use_fleet,
    "fleet-pd.yaml": _use_fleet,
    "fleet-train.yaml": _use_fleet,
    "slo.yaml": _use_slo,
    "policy.yaml": _use_policy,
    "scenarios/phantom-xid-canary.yaml": _use_scenario,
    "scenarios/exporter-upgrade-storm.yaml": _use_scenario,
    "scenarios/egress-exfil-acme.yaml": _use_scenario,
    "scenarios/ttft-after-neighbour-drain.yaml": _use_scenario,
    "drills/l5-region-blackhole.yaml": _use_drill,
    "drills/l2-gpu-faults.yaml": _use_drill,
}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers().map(lambda i: i * 10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["[/x]", "a[b]c", "9" * 400 + "s", "-5m", "sha256:" + "0" * 64, "use1-zz"]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(data: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [here]
    if isinstance(data, dict):
        for key, value in data.items():
            out.extend(_paths(value, (*here, key)))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out.extend(_paths(value, (*here, i)))
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("spec-fuzz") / "examples"
    shutil.copytree(EXAMPLES, root)
    return root


@settings(FUZZ, max_examples=FUZZ.max_examples * 3)
@given(data=st.data())
def test_a_mutated_example_is_refused_or_used(workdir: Path, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(SPECS)), label="spec")
    path = workdir / name
    original = (EXAMPLES / name).read_text()
    tree = yaml.safe_load(original)
    where = data.draw(st.sampled_from([p for p in _paths(tree) if p]), label="where")
    parent = tree
    for part in where[:-1]:
        parent = parent[part]
    if data.draw(st.booleans(), label="delete") and isinstance(parent, dict):
        del parent[where[-1]]
    else:
        parent[where[-1]] = data.draw(values, label="value")
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    try:
        SPECS[name](path)
    except FiredrillError:
        pass  # a clean refusal: exit 4 with file, line and field
    finally:
        path.write_text(original)
