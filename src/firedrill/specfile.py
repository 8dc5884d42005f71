"""Spec files on disk: YAML in, validated Pydantic models out, or a `SpecError` that says where.

A person edits these files, so an error must point at the line to fix. PyYAML's plain loaders
forget where each value came from, and Pydantic reports a path (`loc`) into the data, not into the
file. So the file is composed into PyYAML's node tree first (every node keeps its line), checked
for duplicate keys there (PyYAML would silently keep the last one), constructed into plain data,
and validated; each Pydantic `loc` is then walked down the node tree to find its line.

Errors raised by a model validator carry no `loc` beyond the model they sit on. For those the
line is a best effort: the quoted names in the message (``product 'chat' serves unknown model
'llm-x'``) are looked up in the node tree, and the rarest one found is taken as the culprit.

Limits, because a spec may come from anyone who can open a pull request: a spec is a regular
file (a FIFO would block the reader forever, ``/dev/zero`` would never end) of at most
``MAX_SPEC_BYTES``, nested at most ``MAX_DEPTH`` deep (PyYAML composes recursively, so a
20,000-deep flow list would be a ``RecursionError``), and its aliases expand to at most
``MAX_NODES`` nodes (a "billion laughs" document is small on disk and enormous in memory). Each
limit is a `SpecError` naming the file (and the line, where there is one).

This is the only module that reads spec files; the model (`firedrill.model.spec`) stays pure.
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from yaml.reader import ReaderError

from firedrill.errors import SpecError
from firedrill.model.spec import FleetSpec

M = TypeVar("M", bound=BaseModel)

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

_Loc = tuple[int | str, ...]
_MERGE_TAG = "tag:yaml.org,2002:merge"
_QUOTED_RE = re.compile(r"'([^']+)'")
# Model-validator error types: their loc stops at the model, so the message is searched.
_VALIDATOR_ERROR_TYPES = frozenset({"value_error", "assertion_error"})
_MAX_INPUT_CHARS = 40

MAX_SPEC_BYTES = 256 * 1024  # 12x the largest example (the 10,000-node fleet, 21 KB)
MAX_DEPTH = 64  # nesting levels of mappings and sequences; the examples use at most 8
MAX_NODES = 200_000  # nodes once aliases are expanded
MAX_NUMBER = 1e15  # magnitude of any number in a spec; the models bound most fields tighter


def load_spec(path: str | Path, model: type[M]) -> M:
    """Read, parse and validate one spec file; any problem becomes a `SpecError`."""
    file = str(path)
    text = _read_text(Path(path), file)
    root, data = _parse(text, file)
    try:  # the context tells validators the data came from a file (see scenario.spec)
        loaded = model.model_validate(data, context={"file": file})
    except ValidationError as exc:
        raise _validation_error(exc, root, file) from exc
    _check_numbers(loaded, root, file)
    return loaded


def load_fleet(path: str | Path) -> FleetSpec:
    """Read and validate a fleet spec."""
    return load_spec(path, FleetSpec)


def spec_sha256(path: str | Path) -> str:
    """SHA-256 (hex) of the file's raw bytes: the digest every report records."""
    return hashlib.sha256(_read_bytes(Path(path), str(path))).hexdigest()


def json_schema(model: type[BaseModel], *, title: str | None = None) -> dict[str, Any]:
    """The model's JSON Schema (draft 2020-12), for editors and reviewers of spec files."""
    schema = model.model_json_schema()
    body = {k: v for k, v in schema.items() if k not in ("$schema", "title")}
    return {"$schema": JSON_SCHEMA_DIALECT, "title": title or model.__name__, **body}


# --- reading and parsing -------------------------------------------------------------------------


def _read_bytes(path: Path, file: str) -> bytes:
    """The file's bytes: a regular file of at most ``MAX_SPEC_BYTES``, else a `SpecError`."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below anyway.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as exc:
        raise SpecError("no such file", file=file, line=None, field=None) from exc
    except OSError as exc:
        raise SpecError(_cannot_read(exc), file=file, line=None, field=None) from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            what = _FILE_KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
            raise SpecError(
                f"a spec must be a regular file, this is {what}", file=file, line=None, field=None
            )
        if info.st_size > MAX_SPEC_BYTES:
            raise SpecError(_too_big(info.st_size), file=file, line=None, field=None)
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_SPEC_BYTES:  # the file may grow after fstat: read at most one more
            chunk = os.read(fd, MAX_SPEC_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_SPEC_BYTES:
            raise SpecError(_too_big(size), file=file, line=None, field=None)
        return b"".join(chunks)
    except OSError as exc:
        raise SpecError(_cannot_read(exc), file=file, line=None, field=None) from exc
    finally:
        os.close(fd)


_FILE_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _cannot_read(exc: OSError) -> str:
    if exc.errno == errno.EISDIR:
        return "a spec must be a regular file, this is a directory"
    return f"cannot read: {exc.strerror or type(exc).__name__}"


def _too_big(size: int) -> str:
    return f"a spec is at most {MAX_SPEC_BYTES // 1024} KiB, this file has {size:,} bytes or more"


def _read_text(path: Path, file: str) -> str:
    raw = _read_bytes(path, file)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SpecError("not valid UTF-8", file=file, line=line, field=None) from exc


def _parse(text: str, file: str) -> tuple[yaml.Node, Any]:
    """Compose the node tree, reject duplicate keys, then construct plain data from the tree."""
    try:
        loader = _BoundedLoader(text, file)  # checks for unprintable characters already
        try:
            root = loader.get_single_node()
            if root is None:
                raise SpecError("the file holds no document", file=file, line=None, field=None)
            _check_expanded_size(root, file)
            _check_duplicate_keys(root, (), file, set())
            return root, loader.construct_document(root)
        finally:
            loader.dispose()
    except ValueError as exc:  # a well-formed scalar with an impossible value, e.g. a date
        raise SpecError(f"invalid YAML value: {exc}", file=file, line=None, field=None) from exc
    except yaml.MarkedYAMLError as exc:
        raise SpecError(
            f"invalid YAML: {_yaml_reason(exc)}", file=file, line=_yaml_line(exc), field=None
        ) from exc
    except ReaderError as exc:
        line = text[: int(exc.position)].count("\n") + 1
        raise SpecError(f"invalid YAML: {exc.reason}", file=file, line=line, field=None) from exc
    except yaml.YAMLError as exc:
        raise SpecError(f"invalid YAML: {exc}", file=file, line=None, field=None) from exc


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing documents nested deeper than ``MAX_DEPTH``.

    The composer recurses once per level, so the depth is checked as each node is composed:
    the refusal comes before Python's recursion limit, with the line where the limit is crossed.
    """

    def __init__(self, text: str, file: str) -> None:
        super().__init__(text)
        self._file = file
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise SpecError(
                    f"nested more than {MAX_DEPTH} levels deep",
                    file=self._file,
                    line=None if mark is None else int(mark.line) + 1,
                    field=None,
                )
            node: yaml.Node | None = super().compose_node(parent, index)
            return node
        finally:
            self._depth -= 1


def _check_expanded_size(root: yaml.Node, file: str) -> None:
    """Refuse a document whose aliases expand past ``MAX_NODES`` (counted without expanding)."""
    sizes: dict[int, int] = {}
    order: list[yaml.Node] = []
    stack: list[yaml.Node] = [root]
    seen: set[int] = set()
    while stack:  # iterative post-order over the node graph (aliases share nodes)
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        order.append(node)
        stack.extend(_children(node))
    for node in reversed(order):
        total = 1 + sum(sizes.get(id(child), 1) for child in _children(node))
        sizes[id(node)] = min(total, MAX_NODES + 1)
    if sizes[id(root)] > MAX_NODES:
        raise SpecError(
            f"aliases expand to more than {MAX_NODES:,} values", file=file, line=None, field=None
        )


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _yaml_line(exc: yaml.MarkedYAMLError) -> int | None:
    mark = exc.problem_mark or exc.context_mark
    return None if mark is None else int(mark.line) + 1


def _yaml_reason(exc: yaml.MarkedYAMLError) -> str:
    """PyYAML's problem, with the construct it was inside and where that starts."""
    problem = exc.problem or exc.context or "malformed"
    if exc.problem and exc.context:
        if exc.context_mark is not None and exc.context_mark != exc.problem_mark:
            return f"{problem} ({exc.context}, which starts on line {exc.context_mark.line + 1})"
        return f"{problem} ({exc.context})"
    return problem


def _check_duplicate_keys(node: yaml.Node, path: _Loc, file: str, seen: set[int]) -> None:
    if id(node) in seen:  # an alias to a node already checked (or a recursive anchor)
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first_line: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != _MERGE_TAG:
                here = (key.tag, key.value)
                if here in first_line:
                    raise SpecError(
                        f"duplicate key '{key.value}' (first on line {first_line[here]})",
                        file=file,
                        line=_line(key),
                        field=_format_field((*path, key.value)),
                    )
                first_line[here] = _line(key)
                _check_duplicate_keys(value, (*path, key.value), file, seen)
            else:
                _check_duplicate_keys(value, path, file, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicate_keys(item, (*path, i), file, seen)


# --- numbers every spec must hold to -------------------------------------------------------------


def _check_numbers(model: BaseModel, root: yaml.Node | None, file: str, prefix: str = "") -> None:
    """Every number in a validated spec is finite and within ``MAX_NUMBER``; else a `SpecError`.

    Models bound the fields they know; this catches the rest (free-form ``args`` and
    ``overrides``, a field without bounds, a string Pydantic coerced to ``inf``), so that no
    value reaches a run that no run could use.
    """
    found: list[SpecError] = []
    for loc, value in _numbers(model, ()):
        if isinstance(value, float) and not math.isfinite(value):
            reason = f"must be a finite number (got {value!r})"
        elif abs(value) > MAX_NUMBER:
            shown = f"{value:.3g}" if isinstance(value, float) else f"{len(str(abs(value)))} digits"
            reason = f"must be within -{MAX_NUMBER:g}..{MAX_NUMBER:g} (got {shown})"
        else:
            continue
        line, path = None, loc
        if root is not None:
            _, line, path = _locate(root, loc, missing=False)
        field = _format_field(path)
        if prefix:
            field = f"{prefix}.{field}" if field else prefix
        found.append(SpecError(reason, file=file, line=line, field=field))
    if found:
        first = found[0]
        raise SpecError(first.reason, file=file, line=first.line, field=first.field, errors=found)


def _numbers(value: object, loc: _Loc) -> Iterator[tuple[_Loc, int | float]]:
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield loc, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _numbers(getattr(value, name), (*loc, name))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, (*loc, str(key)))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _numbers(item, (*loc, i))


# --- from Pydantic's loc to a line ---------------------------------------------------------------


def _validation_error(exc: ValidationError, root: yaml.Node, file: str) -> SpecError:
    # Report in file order: the first error a reader meets is the first one to fix.
    ranked = sorted((_one_error(err, root, file) for err in exc.errors()), key=lambda r: r[0])
    found = [error for _, error in ranked]
    first = found[0]
    return SpecError(first.reason, file=file, line=first.line, field=first.field, errors=found)


def _one_error(err: ErrorDetails, root: yaml.Node, file: str) -> tuple[tuple[int, bool], SpecError]:
    """The error as a `SpecError`, and when a reader would notice it (line, then missing last)."""
    loc: _Loc = tuple(err["loc"])
    missing = err["type"] == "missing"
    node, line, path = _locate(root, loc, missing=missing)
    # A missing field shows only where its mapping ends, so a typo'd key inside the mapping
    # (an unknown field and a missing one, both from the same slip) is reported first.
    noticed = int(node.end_mark.line) + 1 if missing else line
    if err["type"] in _VALIDATOR_ERROR_TYPES and not isinstance(node, yaml.ScalarNode):
        hit = _culprit(node, err["msg"])
        if hit is not None:
            line, sub = hit
            noticed, path = line, (*path, *sub)
    error = SpecError(_reason(err), file=file, line=line, field=_format_field(path))
    return (noticed, missing), error


def _locate(root: yaml.Node, loc: _Loc, *, missing: bool) -> tuple[yaml.Node, int, _Loc]:
    """Walk `loc` down the tree: the deepest node reached, its line and the path that names it.

    A part that does not resolve is skipped (a union member's tag, a dict key's ``[key]``),
    except the name of a missing field: it stays in the path, and the line is the mapping's.
    """
    node, line = root, _line(root)
    path: _Loc = ()
    for part in loc:
        child = _child(node, part)
        if child is not None:
            line, node = child
            path = (*path, part)
    if missing and loc and _child(node, loc[-1]) is None:
        path = (*path, loc[-1])
    return node, line, path


def _child(node: yaml.Node, part: int | str) -> tuple[int, yaml.Node] | None:
    """The line that introduces `part` under `node` (the key's line in a mapping) and its value."""
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int):
        if 0 <= part < len(node.value):
            item: yaml.Node = node.value[part]
            return _line(item), item
    elif isinstance(node, yaml.MappingNode) and isinstance(part, str):
        for key, value in _pairs(node):
            if isinstance(key, yaml.ScalarNode) and key.value == part:
                return _line(key), value
    return None


def _pairs(node: yaml.MappingNode) -> Iterator[tuple[yaml.Node, yaml.Node]]:
    """A mapping's own pairs, then those it merges in with ``<<`` (own keys win, so come first)."""
    merged: list[yaml.Node] = []
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode) and key.tag == _MERGE_TAG:
            merged.extend(value.value if isinstance(value, yaml.SequenceNode) else [value])
        else:
            yield key, value
    for source in merged:
        if isinstance(source, yaml.MappingNode):
            yield from _pairs(source)


def _culprit(node: yaml.Node, message: str) -> tuple[int, _Loc] | None:
    """Best-effort line and sub-path for a model validator's message, searched under `node`.

    Of the names quoted in the message, the one with the fewest occurrences wins (an unknown
    name usually occurs once, a region name everywhere), later names winning ties (messages end
    with the offending name); its last occurrence is taken (a name declared twice is wrong the
    second time). With no quoted name, a key of `node` named in the message (or its singular:
    "tenant shares" names ``tenants``) is taken.
    """
    best: list[tuple[int, _Loc]] = []
    for name in reversed(_QUOTED_RE.findall(message)):
        hits = list(_occurrences(node, name, (), set()))
        if hits and (not best or len(hits) < len(best)):
            best = hits
    if best:
        return max(best, key=lambda hit: hit[0])
    if isinstance(node, yaml.MappingNode):
        for key, _value in _pairs(node):
            if isinstance(key, yaml.ScalarNode):
                words = {key.value, key.value.removesuffix("s")}
                if any(re.search(rf"\b{re.escape(w)}\b", message) for w in words if w):
                    return _line(key), (key.value,)
    return None


def _occurrences(
    node: yaml.Node, name: str, path: _Loc, seen: set[int]
) -> Iterator[tuple[int, _Loc]]:
    """Every scalar key or value equal to `name` under `node`, with its line and path."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.ScalarNode):
        if node.value == name:
            yield _line(node), path
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _occurrences(item, name, (*path, i), seen)
    elif isinstance(node, yaml.MappingNode):
        for key, value in _pairs(node):
            if not isinstance(key, yaml.ScalarNode):
                continue
            if key.value == name:
                yield _line(key), (*path, key.value)
            yield from _occurrences(value, name, (*path, key.value), seen)


def _reason(err: ErrorDetails) -> str:
    kind = err["type"]
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown field (a typo?)"
    msg = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    given = err.get("input")
    if kind not in _VALIDATOR_ERROR_TYPES and isinstance(given, str | int | float | bool):
        shown = repr(given)
        if len(shown) > _MAX_INPUT_CHARS:
            shown = shown[: _MAX_INPUT_CHARS - 3] + "..."
        msg = f"{msg} (got {shown})"
    return msg


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1  # PyYAML counts from 0, editors from 1


def _format_field(path: _Loc) -> str | None:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def load_scenario(path: str | Path) -> tuple[Any, FleetSpec, Any, Any]:
    """A scenario and what it names (fleet, SLO, policy), paths relative to the scenario file.

    ``fleet_overrides`` and ``policy_overrides`` are merged (deeply) into the loaded specs, so a
    scenario can say "this policy, but with DBE ECC unmapped" in three lines.
    """
    from firedrill.detect.slo import SloSpec
    from firedrill.remediate.policy import PolicySpec
    from firedrill.scenario.spec import ScenarioSpec

    path = Path(path)
    scenario = load_spec(path, ScenarioSpec)
    base = path.parent
    fleet = load_fleet(base / scenario.fleet)
    if scenario.fleet_overrides:
        fleet = _override(fleet, scenario.fleet_overrides, str(path), "fleet_overrides")
    slo = load_spec(base / scenario.slo, SloSpec)
    policy = (
        load_spec(base / scenario.policy, PolicySpec)
        if scenario.policy is not None
        else PolicySpec()
    )
    if scenario.policy_overrides:
        policy = _override(policy, scenario.policy_overrides, str(path), "policy_overrides")
    return scenario, fleet, slo, policy


def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = (
            _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        )
    return out


def _override(model: M, overrides: dict[str, Any], file: str, field: str) -> M:
    try:
        merged = type(model).model_validate(_deep_merge(model.model_dump(), overrides))
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise SpecError(first["msg"], file=file, line=None, field=f"{field}.{loc}") from exc
    _check_numbers(merged, None, file, prefix=field)
    return merged


def load_drill(path: str | Path) -> Any:
    """A game-day drill (``firedrill.drill.spec.LoadedDrill``), validated against its fleet.

    The fleet, SLO and policy paths are relative to the drill file; ``fleet_overrides`` and
    ``policy_overrides`` are merged into them. Every refusal of ``drill.validate`` is a
    `SpecError` naming the drill's file, line and field (all of them in ``errors``).
    """
    from firedrill.detect.slo import SloSpec
    from firedrill.drill.spec import DrillSpec, LoadedDrill
    from firedrill.drill.validate import validate
    from firedrill.remediate.policy import PolicySpec

    path = Path(path)
    file = str(path)
    root, data = _parse(_read_text(path, file), file)
    try:
        spec = DrillSpec.model_validate(data, context={"file": file})
    except ValidationError as exc:
        raise _validation_error(exc, root, file) from exc
    _check_numbers(spec, root, file)
    base = path.parent
    fleet = load_fleet(base / spec.fleet)
    if spec.fleet_overrides:
        fleet = _override(fleet, spec.fleet_overrides, file, "fleet_overrides")
    slo = load_spec(base / spec.slo, SloSpec)
    policy = load_spec(base / spec.policy, PolicySpec) if spec.policy else PolicySpec()
    if spec.policy_overrides:
        policy = _override(policy, spec.policy_overrides, file, "policy_overrides")
    problems = validate(spec, fleet, slo)
    if problems:
        found = []
        for p in problems:
            _, line, _ = _locate(root, p.loc, missing=True)
            found.append(SpecError(p.reason, file=file, line=line, field=p.field or None))
        first = found[0]
        raise SpecError(first.reason, file=file, line=first.line, field=first.field, errors=found)
    return LoadedDrill(spec, fleet, slo, policy, file, spec_sha256(path))
