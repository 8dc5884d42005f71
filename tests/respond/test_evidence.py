"""Evidence bundles: the window's records as JSON lines with a sha256 manifest, written once and
read-only, verified later; a changed, missing or extra file is named."""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from firedrill.adapters.evidence import load_key, verify_dir, write_bundle
from firedrill.model import operations as ops
from firedrill.model.sandbox import CompensationRecord, EgressRecord, ToolCallRecord
from firedrill.respond.evidence import (
    MANIFEST,
    RECORD_FILES,
    SUMS,
    EvidenceBundle,
    EvidenceError,
    build_bundle,
    sign_bundle,
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
    assert problems == [
        f"{out} is writable (0755): preserved evidence is read-only (0555)",
        "egress-proxy.jsonl is writable: preserved evidence is read-only",
    ]


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


# --- hardening: shapes, links, modes, a non-empty --out, signatures ------------------------------

KEY = b"k" * 32


def _rewritten(files: dict[str, bytes], name: str, data: bytes) -> dict[str, bytes]:
    """A full rewrite: ``name`` changed and SHA256SUMS recomputed to match, as an attacker would."""
    out = dict(files, **{name: data})
    out[SUMS] = "".join(
        f"{hashlib.sha256(v).hexdigest()}  {k}\n"
        for k, v in out.items()
        if k not in (SUMS,) and not k.endswith(".hmac")
    ).encode()
    return out


@pytest.mark.parametrize(
    ("manifest", "problem"),
    [
        (b"[]", "expected an object"),
        (b'"text"', "expected an object"),
        (b"{not json", "is not JSON"),
        (b'{"format": "firedrill-evidence/1", "files": []}', "'files' is not an object"),
        (b'{"format": "firedrill-evidence/1", "files": {"toolgw.jsonl": "x"}}', "has no sha256"),
        (b'{"format": "firedrill-evidence/1", "files": {"toolgw.jsonl": [1]}}', "has no sha256"),
        (b'{"files": {}}', "format is not"),
    ],
)
def test_a_manifest_of_the_wrong_shape_is_named_not_a_crash(
    manifest: bytes, problem: str, tmp_path: Path
) -> None:
    files = _rewritten(files_of(bundle()), MANIFEST, manifest)
    problems = verify(files)
    assert any(problem in p for p in problems), problems
    out = tmp_path / "ev"
    out.mkdir()
    for name, data in files.items():
        (out / name).write_bytes(data)
        (out / name).chmod(0o444)
    out.chmod(0o555)
    done = subprocess.run(
        [*_firedrill(), "audit", "evidence", str(out)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert problem in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def _firedrill() -> list[str]:
    script = Path(sys.executable).parent / "firedrill"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from firedrill.cli import main; main()"]


def _written(tmp_path: Path, b: EvidenceBundle | None = None) -> Path:
    out = tmp_path / "INC-0001"
    write_bundle(b or bundle(), out)
    assert verify_dir(out) == []
    return out


def test_a_file_replaced_by_a_link_to_an_identical_copy_is_named(tmp_path: Path) -> None:
    out = _written(tmp_path)
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes((out / "toolgw.jsonl").read_bytes())
    copy.chmod(0o444)
    out.chmod(0o755)
    (out / "toolgw.jsonl").unlink()
    (out / "toolgw.jsonl").symlink_to(copy)
    out.chmod(0o555)
    problems = verify_dir(out)
    assert "toolgw.jsonl is a symbolic link: preserved evidence holds the files themselves" in (
        problems
    )


def test_a_hard_linked_file_is_named(tmp_path: Path) -> None:
    out = _written(tmp_path)
    os.link(out / "levers.jsonl", tmp_path / "elsewhere")
    assert any("levers.jsonl has 2 hard links" in p for p in verify_dir(out))


def test_a_writable_evidence_directory_is_named(tmp_path: Path) -> None:
    out = _written(tmp_path)
    out.chmod(0o755)
    (problem,) = verify_dir(out)
    assert "is writable (0755)" in problem


def test_an_evidence_directory_that_is_a_link_is_named(tmp_path: Path) -> None:
    out = _written(tmp_path)
    link = tmp_path / "INC-link"
    link.symlink_to(out)
    (problem,) = verify_dir(link)
    assert "is a symbolic link" in problem


@pytest.mark.parametrize("empty_target", [True, False])
def test_a_planted_link_at_the_incident_directory_is_refused(
    tmp_path: Path, empty_target: bool
) -> None:
    target = tmp_path / "attacker"
    if empty_target:
        target.mkdir()
    planted = tmp_path / "out" / "INC-0001"
    planted.parent.mkdir()
    planted.symlink_to(target)
    with pytest.raises(EvidenceError, match="symbolic link"):
        write_bundle(bundle(), planted)
    assert planted.is_symlink()
    assert not target.exists() or list(target.iterdir()) == []


def test_export_refuses_a_non_empty_out_before_running(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    scenario = FLEET_YAML.parent / "scenarios" / "egress-exfil-acme.yaml"
    done = subprocess.run(
        [*_firedrill(), "export", "evidence", str(scenario), "--out", str(out), "--quiet"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 4, done.stdout + done.stderr
    assert "already holds files" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_signed_bundle_detects_a_full_rewrite(tmp_path: Path) -> None:
    key_file = tmp_path / "evidence.key"
    key_file.write_bytes(KEY + b"\n")
    key_file.chmod(0o600)
    signed = sign_bundle(bundle(), KEY)
    assert verify(files_of(signed), key=KEY) == []
    out = _written(tmp_path, signed)
    assert verify_dir(out, key=load_key(key_file)) == []
    # rewrite a record and every hash that covers it: only the signature can tell
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    forged = _rewritten(files, "egress-proxy.jsonl", b"{}\n")
    manifest = json.loads(forged[MANIFEST])
    manifest["files"]["egress-proxy.jsonl"]["sha256"] = hashlib.sha256(b"{}\n").hexdigest()
    forged = _rewritten(forged, MANIFEST, json.dumps(manifest).encode())
    assert verify(forged) == []  # hashes alone cannot see a full rewrite
    (problem,) = verify(forged, key=KEY)
    assert "does not match SHA256SUMS" in problem
    (other,) = verify(files_of(signed), key=b"z" * 32)
    assert "another key" in other
    (unsigned,) = verify(files_of(bundle()), key=KEY)
    assert "not signed" in unsigned
    with pytest.raises(EvidenceError, match="at least 32 bytes"):
        sign_bundle(bundle(), b"short")
    key_file.chmod(0o666)
    with pytest.raises(EvidenceError, match="written by others"):
        load_key(key_file)
