"""Evidence of a security incident: the audit records of its window, hashed into a manifest.

"Preserve sessions and gateway + proxy audit" (reference 000): before anyone cleans up, the
incident's records are exported as they were. A bundle holds, for one tenant and one window,

* ``egress-proxy.jsonl``: every egress-proxy decision (the fields ``jq`` reads in the reference:
  ``ts``, ``tenant``, ``session``, ``dest_host``, ``decision`` ...);
* ``toolgw.jsonl``: every tool-gateway decision with its approval binding (``ts``, ``session``,
  ``tool``, ``args_hash``, ``decision``, ``approver``, ``toolset_digest`` ...);
* ``hubble-drops.jsonl``: the flows the quarantine policy dropped (verdict ``DROPPED``);
* ``levers.jsonl``: the incident's lever journal, refusals included (who, why, when, the inverse);
* ``operations.jsonl``: every operation applied to the fleet in the window, with its inverse;
* ``compensations.jsonl``: the compensations that ran;
* ``manifest.json``: the incident, the window, whether the audit log still held all of it, and
  each file's sha256, size and record count; ``SHA256SUMS`` lists every file, the manifest too,
  in ``sha256sum -c`` format.

Everything here is pure: the bytes are built from values (JSON with sorted keys, one record a
line, so the same run gives the same bytes), and ``verify`` checks a set of files against their
manifest. Writing them once and read-only is the adapter's job (``firedrill.adapters.evidence``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, is_dataclass
from typing import Any, Final

from firedrill.errors import FiredrillError
from firedrill.model import operations as ops
from firedrill.model.sandbox import (
    CompensationRecord,
    EgressRecord,
    ToolCallRecord,
    sandbox_namespace,
)
from firedrill.respond.levers import LeverJournalEntry

FORMAT: Final = "firedrill-evidence/1"
MANIFEST: Final = "manifest.json"
SUMS: Final = "SHA256SUMS"
RECORD_FILES: Final = (
    "egress-proxy.jsonl",
    "toolgw.jsonl",
    "hubble-drops.jsonl",
    "levers.jsonl",
    "operations.jsonl",
    "compensations.jsonl",
)


class EvidenceError(FiredrillError):
    """Evidence cannot be exported or does not verify: a file exists, is missing or changed."""


@dataclass(frozen=True)
class EvidenceFile:
    name: str
    data: bytes
    records: int

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass(frozen=True)
class EvidenceBundle:
    """The files of one incident's evidence, the manifest and the checksum list last."""

    incident: str
    tenant: str
    start_s: float
    end_s: float
    complete: bool  # the audit log still held every record of the window
    files: tuple[EvidenceFile, ...]

    def file(self, name: str) -> EvidenceFile:
        for f in self.files:
            if f.name == name:
                return f
        raise KeyError(name)

    def records(self, name: str) -> list[dict[str, Any]]:
        """A JSON-lines file's records, parsed."""
        return [json.loads(line) for line in self.file(name).data.decode().splitlines()]


def _json(value: Mapping[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _lines(rows: Sequence[Mapping[str, Any]]) -> bytes:
    return "".join(_json(r) + "\n" for r in rows).encode()


def _plain(value: Any) -> Any:
    """A dataclass (an operation, a guard result) as JSON values, operations named by type."""
    if is_dataclass(value) and not isinstance(value, type):
        out = {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
        if isinstance(value, _OPERATION_TYPES):
            out = {"op": type(value).__name__, **out}
        return out
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


_OPERATION_TYPES: Final = tuple(
    cls
    for cls in vars(ops).values()
    if isinstance(cls, type) and is_dataclass(cls) and cls is not ops.Applied
)


def _egress(r: EgressRecord) -> dict[str, Any]:
    return {
        "ts": r.at_s,
        "tenant": r.tenant,
        "product": r.product,
        "session": r.session,
        "pod": r.pod,
        "cell": r.cell,
        "region": r.region,
        "dest_host": r.dest_host,
        "dest_class": r.dest_class,
        "decision": r.decision,
    }


def _tool(r: ToolCallRecord) -> dict[str, Any]:
    return {
        "ts": r.at_s,
        "tenant": r.tenant,
        "product": r.product,
        "session": r.session,
        "pod": r.pod,
        "cell": r.cell,
        "region": r.region,
        "call_id": r.call_id,
        "tool": r.tool,
        "side_effect": r.side_effect,
        "args_hash": r.args_hash,
        "approved": r.approved,
        "approver": r.approver,
        "decision": r.outcome,
        "toolset_digest": r.toolset_digest,
        "content_hash": r.content_hash,
    }


def _drop(ts: float, tenant: str, pod: str, destination: str) -> dict[str, Any]:
    return {
        "ts": ts,
        "namespace": sandbox_namespace(tenant),
        "pod": pod,
        "verdict": "DROPPED",
        "drop_reason": "POLICY_DENIED",
        "destination": destination,
    }


def build_bundle(
    *,
    incident: str,
    tenant: str,
    start_s: float,
    end_s: float,
    egress: Sequence[EgressRecord],
    tools: Sequence[ToolCallRecord],
    levers: Sequence[LeverJournalEntry] = (),
    operations: Sequence[ops.Applied] = (),
    compensations: Sequence[CompensationRecord] = (),
    complete_since_s: float = -math.inf,
    notes: Mapping[str, str] | None = None,
) -> EvidenceBundle:
    """The evidence of one tenant over [start_s, end_s]; records outside it are left out.

    ``complete_since_s`` is the time from which the audit log still holds every record (a
    bounded log drops its oldest); a window that starts before it is marked incomplete.
    """
    if not (math.isfinite(start_s) and math.isfinite(end_s) and start_s <= end_s):
        raise EvidenceError(f"an evidence window runs forward: [{start_s}, {end_s}]")
    if not incident.strip() or not tenant.strip():
        raise EvidenceError("evidence names its incident and its tenant")

    def inside(at_s: float) -> bool:
        return start_s <= at_s <= end_s

    eg = sorted((r for r in egress if r.tenant == tenant and inside(r.at_s)), key=_by_time)
    tl = sorted((r for r in tools if r.tenant == tenant and inside(r.at_s)), key=_by_time)
    drops = sorted(
        [_drop(r.at_s, tenant, r.pod, r.dest_host) for r in eg if r.decision == "dropped"]
        + [_drop(r.at_s, tenant, r.pod, f"toolgw:{r.tool}") for r in tl if r.outcome == "dropped"],
        key=lambda d: (d["ts"], d["pod"], d["destination"]),
    )
    lever_rows = [_plain(e) for e in levers]
    op_rows = [
        {"at_s": a.at_s, "op": _plain(a.op), "inverse": _plain(a.inverse), "notes": list(a.notes)}
        for a in operations
        if inside(a.at_s)
    ]
    comp_rows = [asdict(c) for c in compensations if c.tenant == tenant and inside(c.at_s)]
    rows: dict[str, list[dict[str, Any]]] = {
        "egress-proxy.jsonl": [_egress(r) for r in eg],
        "toolgw.jsonl": [_tool(r) for r in tl],
        "hubble-drops.jsonl": drops,
        "levers.jsonl": lever_rows,
        "operations.jsonl": op_rows,
        "compensations.jsonl": comp_rows,
    }
    files = [EvidenceFile(name, _lines(rows[name]), len(rows[name])) for name in RECORD_FILES]
    complete = complete_since_s <= start_s
    manifest = {
        "format": FORMAT,
        "incident": incident,
        "tenant": tenant,
        "window": {"start_s": start_s, "end_s": end_s},
        "complete": complete,
        "complete_since_s": None if math.isinf(complete_since_s) else complete_since_s,
        "notes": dict(sorted((notes or {}).items())),
        "files": {
            f.name: {"sha256": f.sha256, "bytes": len(f.data), "records": f.records} for f in files
        },
    }
    files.append(
        EvidenceFile(MANIFEST, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode(), 1)
    )
    sums = "".join(f"{f.sha256}  {f.name}\n" for f in files).encode()
    files.append(EvidenceFile(SUMS, sums, len(files)))
    return EvidenceBundle(incident, tenant, start_s, end_s, complete, tuple(files))


def _by_time(r: EgressRecord | ToolCallRecord) -> float:
    return r.at_s


def verify(files: Mapping[str, bytes]) -> list[str]:
    """Problems with a set of evidence files: missing, extra or changed; empty when it verifies."""
    problems: list[str] = []
    if SUMS not in files:
        return [f"{SUMS} is missing"]
    listed: dict[str, str] = {}
    for n, line in enumerate(files[SUMS].decode(errors="replace").splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64:
            problems.append(f"{SUMS} line {n} is not '<sha256>  <file>'")
            continue
        listed[name] = digest
    for name in sorted(set(files) - set(listed) - {SUMS}):
        problems.append(f"{name} is not listed in {SUMS}")
    for name, digest in sorted(listed.items()):
        data = files.get(name)
        if data is None:
            problems.append(f"{name} is missing")
        elif hashlib.sha256(data).hexdigest() != digest:
            problems.append(f"{name} changed: its sha256 is not the one recorded")
    if MANIFEST in files and MANIFEST in listed:
        try:
            manifest = json.loads(files[MANIFEST])
            recorded = manifest["files"]
        except (ValueError, KeyError, TypeError):
            return [*problems, f"{MANIFEST} is not an evidence manifest"]
        for name, meta in sorted(recorded.items()):
            data = files.get(name)
            if data is not None and hashlib.sha256(data).hexdigest() != meta.get("sha256"):
                problems.append(f"{name} does not match {MANIFEST}")
    elif MANIFEST not in files:
        problems.append(f"{MANIFEST} is missing")
    return problems
