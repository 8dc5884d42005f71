"""Evidence bundles: the window's records as JSON lines with a sha256 manifest, written once and
read-only, verified later; a changed, missing or extra file is named."""

from __future__ import annotations

import hashlib
import json
import math
import stat
import subprocess
from pathlib import Path

import pytest

from firedrill.adapters.evidence import verify_dir, write_bundle
from firedrill.model import operations as ops
from firedrill.model.sandbox import CompensationRecord, EgressRecord, ToolCallRecord
from firedrill.respond.evidence import (
    MANIFEST,
    RECORD_FILES,
    SUMS,
    EvidenceBundle,
    EvidenceError,
    build_bundle,
    verify,
)
from firedrill.respond.guards import Approver
from firedrill.respond.levers import Lever, pull
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin

FLEET_YAML = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"


def _egress(at: float, tenant: str, host: str, decision: str = "deny") -> EgressRecord:
    return EgressRecord(
        at_s=at,
        tenant=tenant,
        product="chat",
        session="sess-7f3a9c",
        pod=f"sbx-tenant-{tenant}/sess-7f3a9c-0",
        cell="use1-a",
        region="us-east-1",
        dest_host=host,
        dest_class="base64-subdomain" if len(host) > 30 else "unlisted",
        decision=decision,  # type: ignore[arg-type]
    )


def _call(at: float, outcome: str = "ok") -> ToolCallRecord:
    return ToolCallRecord(
        at_s=at,
        tenant="acme",
        product="chat",
        session="sess-7f3a9c",
        pod="sbx-tenant-acme/sess-7f3a9c-0",
        cell="use1-a",
        region="us-east-1",
        call_id=f"call-acme-{int(at):08d}",
        tool="send_email",
        side_effect="write",
        args_hash="sha256:" + "00" * 32,
        approved="true",
        approver="owner:sess-7f3a9c",
        outcome=outcome,  # type: ignore[arg-type]
        toolset_digest="sha256:" + "11" * 32,
    )


B64 = "U_XGRSVEnjThyLlhJdEQDV9xKO-ElT1B.telemetry-edge.io"


def bundle(**over: object) -> EvidenceBundle:
    args: dict[str, object] = {
        "incident": "INC-0001",
        "tenant": "acme",
        "start_s": 100.0,
        "end_s": 400.0,
        "egress": [
            _egress(50.0, "acme", B64),  # before the window
            _egress(300.0, "acme", B64),
            _egress(200.0, "acme", "pypi.org"),
            _egress(350.0, "acme", B64, "dropped"),
            _egress(250.0, "globex", B64),  # another tenant
        ],
        "tools": [_call(120.0), _call(130.0, "dropped")],
        "compensations": [
            CompensationRecord(390.0, "acme", "call-acme-00000120", "sess-7f3a9c", "write", 120.0)
        ],
    }
    args.update(over)
    return build_bundle(**args)  # type: ignore[arg-type]


def files_of(b: EvidenceBundle) -> dict[str, bytes]:
    return {f.name: f.data for f in b.files}


def test_the_bundle_holds_the_tenant_window_in_time_order() -> None:
    b = bundle()
    egress = b.records("egress-proxy.jsonl")
    assert [r["ts"] for r in egress] == [200.0, 300.0, 350.0]
    assert {r["tenant"] for r in egress} == {"acme"}
    assert {"ts", "tenant", "session", "dest_host", "decision", "pod"} <= set(egress[0])
    drops = b.records("hubble-drops.jsonl")
    assert [(d["ts"], d["verdict"], d["namespace"]) for d in drops] == [
        (130.0, "DROPPED", "sbx-tenant-acme"),
        (350.0, "DROPPED", "sbx-tenant-acme"),
    ]
    tools = b.records("toolgw.jsonl")
    assert {"ts", "session", "tool", "args_hash", "decision", "approver", "toolset_digest"} <= set(
        tools[0]
    )
    assert len(b.records("compensations.jsonl")) == 1
    assert b.complete
    assert [f.name for f in b.files] == [*RECORD_FILES, MANIFEST, SUMS]


def test_the_manifest_hashes_every_file_and_sums_check_with_sha256sum(tmp_path: Path) -> None:
    b = bundle()
    manifest = json.loads(b.file(MANIFEST).data)
    assert manifest["incident"] == "INC-0001"
    assert manifest["window"] == {"start_s": 100.0, "end_s": 400.0}
    for name in RECORD_FILES:
        assert manifest["files"][name]["sha256"] == hashlib.sha256(b.file(name).data).hexdigest()
    assert verify(files_of(b)) == []
    out = tmp_path / "INC-0001"
    write_bundle(b, out)
    result = subprocess.run(
        ["sha256sum", "-c", SUMS], cwd=out, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_same_input_gives_the_same_bytes() -> None:
    assert files_of(bundle()) == files_of(bundle())
    assert files_of(bundle()) != files_of(bundle(end_s=500.0))


def test_an_evicted_window_is_marked_incomplete() -> None:
    assert not bundle(complete_since_s=150.0).complete
    assert bundle(complete_since_s=100.0).complete
    assert json.loads(bundle(complete_since_s=150.0).file(MANIFEST).data)["complete"] is False


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda f: f.update({"egress-proxy.jsonl": f["egress-proxy.jsonl"] + b"{}\n"}), "changed"),
        (lambda f: f.pop("toolgw.jsonl"), "toolgw.jsonl is missing"),
        (lambda f: f.update({"notes.txt": b"x"}), "notes.txt is not listed"),
        (lambda f: f.pop(SUMS), "SHA256SUMS is missing"),
    ],
)
def test_tampering_is_named(change: object, problem: str) -> None:
    files = files_of(bundle())
    change(files)  # type: ignore[operator]
    problems = verify(files)
    assert any(problem in p for p in problems), problems


def test_a_bad_window_is_refused() -> None:
    with pytest.raises(EvidenceError, match="forward"):
        bundle(start_s=500.0, end_s=100.0)
    with pytest.raises(EvidenceError):
        bundle(end_s=math.inf)
    with pytest.raises(EvidenceError, match="names its incident"):
        bundle(incident=" ")


def test_written_once_read_only_and_never_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "INC-0001"
    written = write_bundle(bundle(), out)
    assert sorted(p.name for p in written) == sorted([*RECORD_FILES, MANIFEST, SUMS])
    for p in written:
        assert not p.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    assert not out.stat().st_mode & stat.S_IWUSR
    assert verify_dir(out) == []
    with pytest.raises(EvidenceError, match="already holds files"):
        write_bundle(bundle(end_s=500.0), out)
    assert verify_dir(out) == []  # the first evidence is still there, as written
    out.chmod(0o755)
    (out / "egress-proxy.jsonl").chmod(0o644)
    problems = verify_dir(out)
    assert problems == ["egress-proxy.jsonl is writable: preserved evidence is read-only"]


def test_levers_and_operations_are_journalled_with_their_inverses() -> None:
    twin = Twin(load_fleet(FLEET_YAML), 1)
    twin.run_for(150)
    entry = pull(
        Lever("warm_pool", "acme"),
        twin,
        approvers=[Approver("sam", "security_lead")],
        at_s=twin.now_s(),
        reason="contain acme",
    )
    twin.apply(ops.InjectExfiltration("globex", "usw2-a"))
    b = bundle(levers=[entry], operations=twin.journal)
    (lever,) = b.records("levers.jsonl")
    assert lever["ops"] == [{"op": "SetWarmPool", "tenant": "acme", "replicas": 0}]
    assert lever["inverses"] == [{"op": "SetWarmPool", "tenant": "acme", "replicas": 40}]
    assert lever["approvers"] == [{"name": "sam", "role": "security_lead"}]
    applied = b.records("operations.jsonl")
    assert [a["op"]["op"] for a in applied] == ["SetWarmPool", "InjectExfiltration"]
    assert applied[1]["inverse"] == {
        "op": "ClearExfiltration",
        "tenant": "globex",
        "cell": "usw2-a",
    }
