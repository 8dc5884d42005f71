"""Interrupted drills: ``kill -9`` mid-run leaves a remote twin injected; recovery reverts it.

The kill test runs the real processes: ``firedrill twin serve`` (small fleet, 60x clock, control
API on a free loopback port), a drill process that journals and injects an L5 region blackhole
(tests/drill/kill_driver.py), and ``firedrill gameday recover``. The other tests drive recovery
in-process against an embedded twin standing in for the remote world.
"""

from __future__ import annotations

import http.server
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from firedrill.adapters.journal_file import Journal, JournalFiles, pending, read
from firedrill.adapters.remote_twin import RemoteTwin, load_token
from firedrill.drill.recover import RevertWorld, recover
from firedrill.errors import OperationError, RemoteWorldError
from firedrill.model import operations as ops
from firedrill.model.journal import JournalHeader
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin

HERE = Path(__file__).resolve().parent
FLEET = HERE / "fleet-small.yaml"
DRIVER = HERE / "kill_driver.py"
TIMEOUT_S = 20.0  # upper bound on any single wait; a pass takes a few seconds
CONTROL = re.compile(r"control API on http://127\.0\.0\.1:(\d+)/v1/")
SHA = "cd" * 32


def wait_for(what: str, predicate: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.05)


def firedrill_command() -> list[str]:
    script = Path(sys.executable).parent / "firedrill"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from firedrill.cli import main; main()"]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "FIREDRILL_TWIN_TOKEN", "FIREDRILL_JOURNAL_DIR"):
        env.pop(name, None)
    return env


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
def served_twin(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``firedrill twin serve`` on a free loopback port: (its URL, its token file)."""
    log_path, token_file = tmp_path / "twin.log", tmp_path / "twin-token"
    args = ["twin", "serve", str(FLEET), "--port", "0", "--speed", "60", "--hours", "1"]
    args += ["--seed", "5", "--token-file", str(token_file)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*firedrill_command(), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_env(),
            cwd=tmp_path,
        )
    port: list[int] = []

    def listening() -> bool:
        found = CONTROL.search(log_path.read_text(errors="replace"))
        if found:
            port.append(int(found.group(1)))
            return True
        if process.poll() is not None:
            raise AssertionError(f"twin serve exited early:\n{log_path.read_text()}")
        return False

    try:
        wait_for("the 'control API on ...' line", listening)
        yield f"http://127.0.0.1:{port[0]}", token_file
    finally:
        _stop(process)


def test_a_drill_killed_mid_run_leaves_nothing_behind_after_recover(
    served_twin: tuple[str, Path], tmp_path: Path
) -> None:
    url, token_file = served_twin
    journals = tmp_path / "journal"
    world = RemoteTwin(url, load_token(token_file, environ={}))
    assert world.injected() == []
    drill = subprocess.Popen(
        [sys.executable, str(DRIVER), url, str(token_file), str(journals)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=_env(),
    )
    try:

        def all_applied() -> bool:
            if drill.poll() is not None:
                raise AssertionError(f"the drill exited early: {drill.stdout.read()!r}")  # type: ignore[union-attr]
            states = pending(journals, include_live=True)
            return bool(states) and sum(i.applied for i in states[0].intents) == 5

        wait_for("the journal to show 5 applied intents", all_applied)
        (state,) = pending(journals, include_live=True)
        assert state.live  # the running drill holds its journal
        wait_for("the sixth intent", lambda: len(read(state.path).intents) == 6)
        os.kill(drill.pid, signal.SIGKILL)
        assert drill.wait(timeout=10) == -signal.SIGKILL
    finally:
        _stop(drill)
        assert drill.stdout is not None
        drill.stdout.close()

    left = {(i["kind"], i["target"]) for i in world.injected()}
    node = world.node_views(cell="use1-a")[0].name
    assert left == {
        ("partition", "region-region us-east-1/us-west-2"),
        ("partition", "region-edge us-east-1/edge"),
        ("replication_paused", "us-east-1->us-west-2"),
        ("capacity_denied", "us-west-2"),
        ("dcgm", f"{node} gpu0 field230"),
    }
    (dead,) = pending(journals)  # unlocked now: the kernel dropped the dead drill's lock
    assert dead.path == state.path
    assert not dead.finished

    recovered = subprocess.run(
        [*firedrill_command(), "gameday", "recover", "--journal-dir", str(journals),
         "--target", url, "--token-file", str(token_file)],
        capture_output=True, text=True, env=_env(), timeout=60, check=False,
    )  # fmt: skip
    output = recovered.stdout + recovered.stderr
    assert recovered.returncode == 0, output
    assert "recovered" in output
    assert "Heal(kind=region-region, a=us-east-1, b=us-west-2)" in output
    assert "6 injection(s) reverted in 1 journal(s)" in output  # the unconfirmed one too

    assert world.injected() == []
    final = read(state.path)
    assert final.verdict == "recovered"
    assert final.unreverted == ()
    assert pending(journals, include_live=True) == []

    again = subprocess.run(
        [*firedrill_command(), "gameday", "recover", "--journal-dir", str(journals),
         "--target", url, "--token-file", str(token_file)],
        capture_output=True, text=True, env=_env(), timeout=60, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "nothing to recover" in again.stdout
    assert world.injected() == []


# --- in-process: the embedded twin stands in for the remote world ------------------------------


@pytest.fixture
def twin() -> Twin:
    return Twin(load_fleet(FLEET), 1, record=False)


def _drill(directory: Path, twin: Twin, operations: list[ops.Operation]) -> Journal:
    """Journal and apply ``operations`` the way the runner does; the journal is left open."""
    journal = Journal.create(
        directory, drill="l6-capacity", spec_sha256=SHA, seed=1, run_by="bob", target="http://w"
    )
    for op in operations:
        key = journal.intend(op, twin.inverse_of(op), twin.now_s())
        twin.apply(op)
        journal.applied(key, twin.now_s())
    return journal


BLACKHOLE: list[ops.Operation] = [
    ops.Partition("region-region", "us-east-1", "us-west-2"),
    ops.PauseReplication("us-east-1", "us-west-2"),
    ops.DenyCapacity("us-west-2"),
    ops.SetRouteWeights("llm-70b", (("use1-a", 0),)),
]


def _clean(twin: Twin) -> bool:
    return (
        not twin.partitions
        and not twin.replication_paused
        and not twin.capacity_denied
        and int(twin.weights[0, twin.cell_index["use1-a"]]) == 3
    )


def test_recovery_reverts_newest_first_and_finishes_the_journal(twin: Twin, tmp_path: Path) -> None:
    journal = _drill(tmp_path, twin, BLACKHOLE)
    journal.close()  # the drill died
    seen: list[JournalHeader] = []

    def world_for(header: JournalHeader) -> RevertWorld:
        seen.append(header)
        return twin

    report = recover(JournalFiles(tmp_path), world_for)
    assert report.ok
    assert report.reverted == 4
    assert [h.target for h in seen] == ["http://w"]
    (j,) = report.journals
    assert [type(i.inverse).__name__ for i in j.intents] == [
        "SetRouteWeights",
        "AllowCapacity",
        "ResumeReplication",
        "Heal",
    ]
    assert _clean(twin)
    assert read(journal.path).verdict == "recovered"
    assert recover(JournalFiles(tmp_path), world_for).journals == ()  # idempotent


def test_a_torn_journal_is_recovered(twin: Twin, tmp_path: Path) -> None:
    journal = _drill(tmp_path, twin, BLACKHOLE[:3])
    journal.close()
    with journal.path.open("ab") as f:  # killed in the middle of the next record
        f.write(b'{"kind": "intend", "key": 4, "op": {"op": "SetRouteWe')
    report = recover(JournalFiles(tmp_path), lambda _: twin)
    assert report.ok
    assert report.reverted == 3
    assert not twin.partitions
    assert not twin.replication_paused
    assert not twin.capacity_denied
    state = read(journal.path)
    assert state.verdict == "recovered"
    assert not state.torn_tail


def test_an_intent_never_applied_is_reverted_harmlessly(twin: Twin, tmp_path: Path) -> None:
    journal = _drill(tmp_path, twin, BLACKHOLE[:1])
    op = ops.DenyCapacity("us-east-1")
    journal.intend(op, twin.inverse_of(op), 0.0)  # died before applying it
    journal.close()
    report = recover(JournalFiles(tmp_path), lambda _: twin)
    assert [(type(i.op).__name__, i.outcome) for i in report.journals[0].intents] == [
        ("DenyCapacity", "reverted"),
        ("Partition", "reverted"),
    ]
    assert not twin.capacity_denied
    assert not twin.partitions


def test_an_embedded_twin_has_nothing_left_to_revert(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, drill="l1", spec_sha256=SHA, seed=1, run_by="bob")
    journal.intend(ops.DenyCapacity("us-west-2"), ops.AllowCapacity("us-west-2"), 0.0)
    journal.close()

    def no_world(_: JournalHeader) -> RevertWorld:
        raise AssertionError("an embedded journal needs no world")

    report = recover(JournalFiles(tmp_path), no_world)
    (j,) = report.journals
    assert j.finished
    assert j.intents == ()
    assert "died with the drill's process" in j.note
    assert read(journal.path).verdict == "recovered"


def test_a_running_drill_is_left_alone(twin: Twin, tmp_path: Path) -> None:
    journal = _drill(tmp_path, twin, BLACKHOLE[:2])
    report = recover(JournalFiles(tmp_path), lambda _: twin)
    assert report.journals == ()
    assert [s.path for s in report.live] == [journal.path]
    assert twin.partitions
    assert twin.replication_paused
    journal.close()


class _Refusing:
    """A world that refuses one inverse, or cannot be reached at all."""

    def __init__(self, twin: Twin, refuse: type, *, unreachable: bool = False) -> None:
        self.twin, self.refuse, self.unreachable, self.calls = twin, refuse, unreachable, 0

    def apply(self, op: ops.Operation) -> ops.Operation:
        self.calls += 1
        if self.unreachable:
            raise RemoteWorldError("cannot reach the twin at http://w: refused")
        if isinstance(op, self.refuse):
            raise OperationError("not now")
        return self.twin.apply(op)

    def now_s(self) -> float:
        return self.twin.now_s()


def test_a_refused_inverse_keeps_the_journal_open_for_the_next_try(
    twin: Twin, tmp_path: Path
) -> None:
    journal = _drill(tmp_path, twin, BLACKHOLE)
    journal.close()
    report = recover(JournalFiles(tmp_path), lambda _: _Refusing(twin, ops.AllowCapacity))
    (j,) = report.journals
    assert not report.ok
    assert not j.finished
    assert [i.outcome for i in j.intents] == ["reverted", "failed", "reverted", "reverted"]
    assert twin.capacity_denied
    assert not twin.partitions
    assert [type(i.op).__name__ for i in read(journal.path).unreverted] == ["DenyCapacity"]
    report = recover(JournalFiles(tmp_path), lambda _: twin)  # the next recovery finishes the job
    assert report.ok
    assert report.reverted == 1
    assert _clean(twin)


def test_an_unreachable_world_stops_at_the_first_failure(twin: Twin, tmp_path: Path) -> None:
    journal = _drill(tmp_path, twin, BLACKHOLE)
    journal.close()
    world = _Refusing(twin, ops.Noop, unreachable=True)
    report = recover(JournalFiles(tmp_path), lambda _: world)
    assert not report.ok
    assert world.calls == 1
    assert len(read(journal.path).unreverted) == 4


# --- the control token never goes where a journal says --------------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A stranger's server: records every request and its Authorization header."""

    seen: list[tuple[str, str | None]]

    def _record(self) -> None:
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        self.send_response(500)
        self.end_headers()

    do_GET = do_POST = _record

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def stranger() -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    seen: list[tuple[str, str | None]] = []
    handler = type("Stranger", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _planted(directory: Path, url: str) -> Path:
    """An unfinished journal whose header names ``url`` (anyone who can write the directory)."""
    journal = Journal.create(
        directory, drill="l6-capacity", spec_sha256=SHA, seed=1, run_by="mallory", target=url
    )
    journal.intend(ops.DenyCapacity("us-west-2"), ops.AllowCapacity("us-west-2"), 0.0)
    journal.close()
    return journal.path


def test_recover_never_sends_the_token_to_a_journals_url(
    stranger: tuple[str, list[tuple[str, str | None]]], tmp_path: Path
) -> None:
    url, seen = stranger
    journals = tmp_path / "journal"
    path = _planted(journals, url)
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    recovered = subprocess.run(
        [*firedrill_command(), "gameday", "recover", "--journal-dir", str(journals),
         "--token-file", str(token_file)],
        capture_output=True, text=True, env=_env(), timeout=60, check=False,
    )  # fmt: skip
    output = recovered.stdout + recovered.stderr
    assert seen == []  # not a single request, let alone one with the token
    assert recovered.returncode == 4, output
    assert "NOT recovered" in output
    assert f"recover --target {url}" in output  # says what to do if that twin is yours
    assert not read(path).finished  # nothing lost: the next, named recovery can still finish it


def test_gameday_run_does_not_recover_a_journal_naming_another_twin(
    stranger: tuple[str, list[tuple[str, str | None]]], tmp_path: Path
) -> None:
    url, seen = stranger
    journals = tmp_path / "journal"
    path = _planted(journals, url)
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    drill = HERE / "gameday-blackhole.yaml"
    ran = subprocess.run(
        [*firedrill_command(), "gameday", "run", str(drill), "--quiet", "--journal-dir",
         str(journals), "--token-file", str(token_file)],
        capture_output=True, text=True, env=_env(), timeout=120, check=False,
    )  # fmt: skip
    output = ran.stdout + ran.stderr
    assert seen == []
    assert ran.returncode == 5, output  # refused to start: leftovers not reverted
    assert f"recover --target {url}" in output
    assert not read(path).finished


def test_a_run_recovers_only_journals_naming_its_own_target(tmp_path: Path) -> None:
    from firedrill.drill.recover import same_target, target_for
    from firedrill.errors import JournalError

    header = read(_planted(tmp_path, "http://127.0.0.1:9/")).header
    assert target_for(header, "http://127.0.0.1:9") == "http://127.0.0.1:9"
    assert target_for(header, "HTTP://127.0.0.1:9/", must_match=True) == "HTTP://127.0.0.1:9/"
    with pytest.raises(JournalError, match="not this run's target"):
        target_for(header, "http://127.0.0.1:10", must_match=True)
    with pytest.raises(JournalError, match="sends the control token only to a twin you name"):
        target_for(header, None)
    assert same_target("http://localhost", "http://LOCALHOST:80/")
    assert not same_target("http://localhost", "https://localhost")
