"""A drill process for the kill test: journals and injects an L5 blackhole, then waits to be killed.

Usage: python kill_driver.py URL TOKEN_FILE JOURNAL_DIR

Injects, through the twin's control API and the journal exactly as the drill runner does (the
inverse recorded and fsync'd before each operation is applied): a region blackhole (us-east-1 cut
from us-west-2 and from the edge), replication us-east-1 -> us-west-2 paused, capacity denied in
the survivor, and a DCGM XID field on one node. Then it records one more intent without applying
it (a crash between the two), prints ``injected`` and sleeps until it is killed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from firedrill.adapters.journal_file import Journal
from firedrill.adapters.remote_twin import RemoteTwin, load_token
from firedrill.model import operations as ops


def main(url: str, token_file: str, journal_dir: str) -> None:
    world = RemoteTwin(url, load_token(Path(token_file)))
    journal = Journal.create(
        journal_dir,
        drill="l5-region-blackhole-llm-70b",
        spec_sha256="0" * 64,
        seed=7,
        run_by="alice",
        target=url,
    )
    node = world.node_views(cell="use1-a")[0].name
    for op in (
        ops.Partition("region-region", "us-east-1", "us-west-2"),
        ops.Partition("region-edge", "us-east-1", "edge"),
        ops.PauseReplication("us-east-1", "us-west-2"),
        ops.DenyCapacity("us-west-2"),
        ops.InjectDcgmField(node, 0, 230, 79.0),  # XID 79: fell off the bus
    ):
        key = journal.intend(op, world.inverse_of(op), world.now_s())
        world.apply(op)
        journal.applied(key, world.now_s())
    unapplied = ops.QuarantineCell("usw2-a")
    journal.intend(unapplied, world.inverse_of(unapplied), world.now_s())
    print("injected", flush=True)
    time.sleep(600)  # seconds; the test kills this process long before


if __name__ == "__main__":
    main(*sys.argv[1:4])
