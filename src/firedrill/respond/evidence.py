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

A sha256 list only shows a file changed if the list itself was not rewritten to match. Someone
who can rewrite every file can rewrite the list too, so a bundle can also be signed:
``SHA256SUMS.hmac`` holds an HMAC-SHA256 of ``SHA256SUMS`` under a key the exporter and the
auditor share and the people with write access to the evidence store do not (``sign_bundle``;
``verify(files, key=...)`` checks it, and a signature made with another key is named as such by
its key id). The key never appears in the bundle: the key id is a hash of it.

Everything here is pure: the bytes are built from values (JSON with sorted keys, one record a
line, so the same run gives the same bytes), and ``verify`` checks a set of files against their
manifest. Writing them once and read-only is the adapter's job (``firedrill.adapters.evidence``).
"""

from __future__ import annotations

import hashlib
import hmac
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
SIGNATURE: Final = "SHA256SUMS.hmac"  # HMAC-SHA256 of SHA256SUMS; not listed in it
SIGNATURE_ALG: Final = "hmac-sha256"
MIN_KEY_BYTES: Final = 32
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


def key_id(key: bytes) -> str:
    """A short name of a signing key that reveals nothing of it."""
    return hashlib.sha256(b"firedrill-evidence-key\0" + key).hexdigest()[:16]


def _mac(sums: bytes, key: bytes) -> str:
    return hmac.new(key, sums, hashlib.sha256).hexdigest()


def sign_bundle(bundle: EvidenceBundle, key: bytes) -> EvidenceBundle:
    """The bundle with ``SHA256SUMS.hmac``: an HMAC-SHA256 of its ``SHA256SUMS`` under ``key``."""
    if len(key) < MIN_KEY_BYTES:
        raise EvidenceError(f"an evidence key has at least {MIN_KEY_BYTES} bytes, got {len(key)}")
    if any(f.name == SIGNATURE for f in bundle.files):
        raise EvidenceError("the bundle is already signed")
    sums = bundle.file(SUMS).data
    body = {"alg": SIGNATURE_ALG, "key_id": key_id(key), "signs": SUMS, "mac": _mac(sums, key)}
    data = (json.dumps(body, indent=2, sort_keys=True) + "\n").encode()
    signature = EvidenceFile(SIGNATURE, data, 1)
    return EvidenceBundle(
        bundle.incident,
        bundle.tenant,
        bundle.start_s,
        bundle.end_s,
        bundle.complete,
        (*bundle.files, signature),
    )


def check_signature(files: Mapping[str, bytes], key: bytes) -> list[str]:
    """Problems with the bundle's signature under ``key``; empty when it verifies."""
    raw = files.get(SIGNATURE)
    if raw is None:
        return [f"{SIGNATURE} is missing: the evidence is not signed"]
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict) or not all(
        isinstance(body.get(k), str) for k in ("alg", "key_id", "mac")
    ):
        return [f"{SIGNATURE} is not an evidence signature"]
    if body["alg"] != SIGNATURE_ALG:
        return [f"{SIGNATURE}: unknown algorithm {body['alg']!r} (expected {SIGNATURE_ALG})"]
    if body["key_id"] != key_id(key):
        return [
            f"{SIGNATURE} was made with another key (key id {body['key_id']}, this key is "
            f"{key_id(key)})"
        ]
    sums = files.get(SUMS)
    if sums is None or not hmac.compare_digest(body["mac"], _mac(sums, key)):
        return [f"{SIGNATURE} does not match {SUMS}: the evidence was rewritten after signing"]
    return []


def signature_key_id(files: Mapping[str, bytes]) -> str | None:
    """The key id a bundle says it was signed with (``None``: unsigned or unreadable)."""
    try:
        body = json.loads(files[SIGNATURE])
    except (KeyError, ValueError):
        return None
    value = body.get("key_id") if isinstance(body, dict) else None
    return value if isinstance(value, str) else None


def verify(files: Mapping[str, bytes], *, key: bytes | None = None) -> list[str]:
    """Problems with a set of evidence files: missing, extra or changed, a manifest of the wrong
    shape, and with ``key`` a missing or wrong signature; empty when it verifies."""
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
    for name in sorted(set(files) - set(listed) - {SUMS, SIGNATURE}):
        problems.append(f"{name} is not listed in {SUMS}")
    for name, digest in sorted(listed.items()):
        data = files.get(name)
        if data is None:
            problems.append(f"{name} is missing")
        elif hashlib.sha256(data).hexdigest() != digest:
            problems.append(f"{name} changed: its sha256 is not the one recorded")
    if MANIFEST in files and MANIFEST in listed:
        problems += _check_manifest(files)
    elif MANIFEST not in files:
        problems.append(f"{MANIFEST} is missing")
    if key is not None:
        problems += check_signature(files, key)
    return problems


def _check_manifest(files: Mapping[str, bytes]) -> list[str]:
    """The manifest's shape and its per-file sha256s; a wrong shape is named, never a crash."""
    try:
        manifest = json.loads(files[MANIFEST])
    except ValueError as exc:
        return [f"{MANIFEST} is not JSON: {exc}"]
    if not isinstance(manifest, dict):
        return [f"{MANIFEST} is not an evidence manifest: expected an object"]
    if manifest.get("format") != FORMAT:
        return [f"{MANIFEST} is not an evidence manifest: format is not {FORMAT!r}"]
    recorded = manifest.get("files")
    if not isinstance(recorded, dict):
        return [f"{MANIFEST} is not an evidence manifest: 'files' is not an object"]
    problems: list[str] = []
    for name, meta in sorted(recorded.items(), key=lambda kv: str(kv[0])):
        if not isinstance(meta, dict) or not isinstance(meta.get("sha256"), str):
            problems.append(f"{MANIFEST}: files.{name} has no sha256")
            continue
        data = files.get(name)
        if data is None:
            problems.append(f"{name} is in {MANIFEST} but missing")
        elif hashlib.sha256(data).hexdigest() != meta["sha256"]:
            problems.append(f"{name} does not match {MANIFEST}")
    return problems
