"""Mutation fuzz of the example specs: load each mutant and use it once; count the crashes.

A spec a person edits reaches the loaders in every shape a typo, a paste or a hostile hand can
give it. The contract is that a bad spec is refused with a ``FiredrillError`` (exit 4 naming file,
line and field) and a good one runs; anything else (a traceback, a MemoryError, a hang) is a
crash. This script takes every example spec, mutates one value at a time (NaN, infinities, huge
and negative numbers, 400-digit integers, wrong types, brackets, deleted and duplicated entries),
loads the mutant with the loader its kind uses, then uses what loaded the way the commands do
first (a fleet builds a twin and steps it, a scenario applies its timeline, a drill plans, an SLO
generates its rules, a policy its NodeHealthCheck), and counts what escaped.

    python benchmarks/spec_fuzz.py                     # 14,000 mutants, seed 0
    python benchmarks/spec_fuzz.py --mutants 2000 --seed 3 --show 5

Prints one line per crash signature (kind, exception, where) with its count and an example
mutation, then the totals. Exit status: 0 when nothing crashed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
USE_TIMEOUT_S = 60  # a mutant that takes longer than this to load and use counts as a hang

Path_ = tuple[Any, ...]


def _kind(rel: Path) -> str:
    if rel.parts[0] == "scenarios":
        return "scenario"
    if rel.parts[0] == "drills":
        return "drill"
    name = rel.name
    for kind in ("fleet", "slo", "policy"):
        if name.startswith(kind):
            return kind
    return "other"


def _paths(data: Any, here: Path_ = ()) -> list[Path_]:
    out: list[Path_] = [here]
    if isinstance(data, dict):
        for key, value in data.items():
            out.extend(_paths(value, (*here, key)))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out.extend(_paths(value, (*here, i)))
    return out


def _get(data: Any, path: Path_) -> Any:
    for part in path:
        data = data[part]
    return data


_SCALARS: tuple[object, ...] = (
    math.nan,
    math.inf,
    -math.inf,
    -1,
    -1.5,
    0,
    0.0,
    1e12,
    1e20,
    1e300,
    -(10**30),
    int("9" * 400),
    2**63,
    "",
    "[bold]x[/]",
    "a[b]c",
    "x" * 5000,
    "9" * 400 + "s",
    "-5m",
    None,
    True,
    "sha256:" + "0" * 64,
)


def _mutant_value(rng: random.Random, old: Any) -> Any:
    roll = rng.random()
    if roll < 0.55:
        return rng.choice(_SCALARS)
    if roll < 0.65:
        return [old] if rng.random() < 0.5 else [old, old]
    if roll < 0.75:
        return {"x": old}
    if roll < 0.85 and isinstance(old, int | float) and not isinstance(old, bool):
        return old * rng.choice((-1, 10**6, 10**12)) if old else rng.choice((-1, 10**9))
    if roll < 0.92:
        return [] if rng.random() < 0.5 else {}
    return rng.choice(("unknown", "use1-zz", "H900", "Ignore", "99"))


def mutate(rng: random.Random, data: Any) -> tuple[Any, str]:
    """One mutation of a parsed spec (in place) and a short description of it."""
    paths = [p for p in _paths(data) if p]
    path = rng.choice(paths)
    parent = _get(data, path[:-1])
    last = path[-1]
    where = ".".join(str(p) for p in path)
    roll = rng.random()
    if roll < 0.1:  # delete the entry
        if isinstance(parent, dict):
            del parent[last]
        else:
            parent.pop(last)
        return data, f"del {where}"
    if roll < 0.15 and isinstance(parent, list):  # duplicate a list item
        parent.append(parent[last])
        return data, f"dup {where}"
    if roll < 0.2 and isinstance(parent, dict):  # an unknown key next to it
        parent["zz_" + str(last)] = parent[last]
        return data, f"extra {where}"
    new = _mutant_value(rng, parent[last])
    parent[last] = new
    shown = repr(new)
    return data, f"{where} = {shown[:40]}"


# --- first use of each kind ---------------------------------------------------------------------


def _use_fleet(path: Path) -> None:
    from firedrill.specfile import load_fleet
    from firedrill.twin.engine import Twin

    fleet = load_fleet(path)
    twin = Twin(fleet, 0)
    twin.run_for(30.0)


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

    policy = load_spec(path, PolicySpec)
    node_health_check(policy, name="gpu-nodes")


def _use_scenario(path: Path) -> None:
    from firedrill.scenario.run import expand
    from firedrill.specfile import load_scenario
    from firedrill.twin.engine import Twin

    spec, fleet, _slo, _policy = load_scenario(path)
    twin = Twin(fleet, spec.seed, hours_hint=min(spec.duration_s, 3600.0) / 3600.0)
    for entry in sorted(spec.timeline, key=lambda e: e.at_s):
        for op in expand(entry, twin):
            twin.apply(op)
        twin.advance(1.0)


def _use_drill(path: Path) -> None:
    from firedrill.drill.run import plan
    from firedrill.specfile import load_drill
    from firedrill.twin.engine import Twin

    loaded = load_drill(path)
    plan(loaded.spec, loaded.fleet)
    Twin(loaded.fleet, loaded.spec.seed).run_for(15.0)


USES: dict[str, Callable[[Path], None]] = {
    "fleet": _use_fleet,
    "slo": _use_slo,
    "policy": _use_policy,
    "scenario": _use_scenario,
    "drill": _use_drill,
}


class _Hang(BaseException):
    pass


def _alarm(_signum: int, _frame: FrameType | None) -> None:
    raise _Hang


@dataclass
class Crash:
    count: int
    example: str


def _signature(kind: str, exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/firedrill/" in f.filename] or frames
    where = ""
    if ours:
        last = ours[-1]
        where = f"{Path(last.filename).name}:{last.lineno} {last.name}"
    return f"{kind:8} {type(exc).__name__:18} {where}"


def run(
    mutants: int, seed: int, report_every: int = 0, skip: int = 0
) -> tuple[Counter[str], dict[str, Crash], int]:
    from firedrill.errors import FiredrillError

    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="spec-fuzz-") as tmp:
        work = Path(tmp) / "examples"
        shutil.copytree(EXAMPLES, work)
        files = sorted(p for p in work.rglob("*.yaml") if _kind(p.relative_to(work)) in USES)
        originals = {p: p.read_text() for p in files}
        parsed = {p: yaml.safe_load(t) for p, t in originals.items()}
        outcomes: Counter[str] = Counter()
        crashes: dict[str, Crash] = {}
        signal.signal(signal.SIGALRM, _alarm)
        for i in range(mutants):
            path = files[i % len(files)]
            kind = _kind(path.relative_to(work))
            data, what = mutate(rng, _copy(parsed[path]))
            if i < skip:  # the same sequence of mutants, the first ones not used (to resume)
                continue
            try:
                path.write_text(yaml.safe_dump(data, sort_keys=False))
            except (yaml.YAMLError, RecursionError):
                outcomes["unwritable"] += 1
                continue
            signal.alarm(USE_TIMEOUT_S)
            try:
                USES[kind](path)
                outcomes["ran"] += 1
            except FiredrillError:
                outcomes["refused"] += 1
            except (Exception, _Hang) as exc:  # noqa: BLE001 - counting every escape is the point
                outcomes["crashed"] += 1
                sig = _signature(kind, exc)
                example = f"{path.relative_to(work)}: {what}: {str(exc)[:100]!r}"
                crashes.setdefault(sig, Crash(0, example)).count += 1
            finally:
                signal.alarm(0)
                path.write_text(originals[path])
            if report_every and (i + 1) % report_every == 0:  # partial counts survive a kill
                print(
                    f"after {i + 1} mutants: {outcomes['crashed']} crashed, "
                    f"{outcomes['refused']} refused, {outcomes['ran']} ran",
                    file=sys.stderr,
                    flush=True,
                )
        return outcomes, crashes, len(files)


def _copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_copy(v) for v in data]
    return data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", type=int, default=14_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=50, help="crash signatures to list")
    ap.add_argument("--report-every", type=int, default=0, help="print running counts (stderr)")
    ap.add_argument("--skip", type=int, default=0, help="generate but do not use the first N")
    args = ap.parse_args()
    wall0 = time.perf_counter()
    outcomes, crashes, n_files = run(args.mutants, args.seed, args.report_every, args.skip)
    wall = time.perf_counter() - wall0
    for sig, crash in sorted(crashes.items(), key=lambda kv: -kv[1].count)[: args.show]:
        print(f"{crash.count:6d}  {sig}\n        e.g. {crash.example}")
    print(
        f"{args.mutants} mutants of {n_files} example specs (seed {args.seed}): "
        f"{outcomes['ran']} ran, {outcomes['refused']} refused cleanly, "
        f"{outcomes['crashed']} crashed ({len(crashes)} distinct), "
        f"{outcomes['unwritable']} not writable as YAML; {wall:.0f} s wall"
    )
    return 1 if outcomes["crashed"] else 0


if __name__ == "__main__":
    sys.exit(main())
