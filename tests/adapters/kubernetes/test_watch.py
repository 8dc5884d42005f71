"""Informers: list, then watch with resourceVersion and bookmarks; relist on 410 Gone; changes."""

from __future__ import annotations

import copy

from lightkube.resources.core_v1 import Node

from firedrill.adapters.kubernetes import conventions as cv
from firedrill.adapters.kubernetes.watch import Informer, change_events
from firedrill.model.changes import ChangeEvent
from tests.adapters.kubernetes.cluster import deployment, seed_small
from tests.adapters.kubernetes.conftest import Cluster

DRIVER = f"{cv.ANNOTATION_VERSION_PREFIX}driver"


def test_watch_resumes_from_bookmarks_and_relists_after_410(cluster: Cluster) -> None:
    server = cluster.server
    seed_small(server)
    changes: list[ChangeEvent] = []
    informer = Informer(
        cluster.fleet.client,
        Node,
        on_change=lambda old, new: changes.extend(change_events(old, new, 42.0)),
    )
    steps: list[str] = []
    listed_at = server.rv

    def stop() -> bool:
        # Called after every event the informer handles: drives the cluster between streams.
        if informer.lists == 1 and not steps:
            steps.append("upgrade")
            n = copy.deepcopy(server.get("", "nodes", "gpu-0"))
            n["metadata"]["annotations"][DRIVER] = "560.35.03"
            server._store("", "nodes", "", n, "MODIFIED")
        elif informer.events == 1 and steps == ["upgrade"]:
            steps.append("delete+compact")
            del server.objects[("", "nodes", "", "gpu-2")]
            server.rv += 1
            server.compact()  # the DELETED event is gone with the compaction
        return informer.lists == 2 and informer.bookmarks >= 3

    informer.run(stop)
    assert steps == ["upgrade", "delete+compact"]
    assert informer.lists == 2  # the 410 made it list again
    assert sorted(informer.items) == ["gpu-0", "gpu-1"]  # the deletion it never saw is gone
    assert informer.items["gpu-0"]["metadata"]["annotations"][DRIVER] == "560.35.03"
    watches = [c for c in cluster.fleet.transport.calls if c.watch]
    assert all(("allowWatchBookmarks", "true") in c.query for c in watches)
    versions = [dict(c.query)["resourceVersion"] for c in watches]
    # the first watch starts at the list's version; the reconnect resumes from the version the
    # last event and bookmark carried (116), which was compacted away: 410, relist, and the next
    # watch starts at the relist's version
    assert versions[:3] == [str(listed_at), str(listed_at + 1), str(listed_at + 2)]
    assert [int(v) for v in versions] == sorted(int(v) for v in versions)
    assert informer.resource_version == str(server.rv)
    assert changes == [
        ChangeEvent(42.0, "node_layer", "us-east-1", "use1-a", "gpu-0", "550.90.07", "560.35.03",
                    "driver")
    ]  # fmt: skip
    # the fleet reads nodes from the cache once it is attached
    cluster.fleet.node_cache = informer.values
    before = len(cluster.fleet.transport.calls)
    assert [v.name for v in cluster.fleet.node_views(cell="use1-a")] == ["gpu-0", "gpu-1"]
    assert len(cluster.fleet.transport.calls) == before


def test_workload_generations_with_the_change_annotation_are_change_events() -> None:
    old = deployment("llm-70b", "use1-a", 3, image="vllm/vllm-openai:v0.6.3")
    new = copy.deepcopy(old)
    new["metadata"]["generation"] = 2
    new["spec"]["template"]["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v0.6.4"
    old["metadata"]["generation"] = 1
    (ev,) = change_events(old, new, 10.0)
    assert (ev.stream, ev.cell, ev.before, ev.after) == (
        "serving_image",
        "use1-a",
        "vllm/vllm-openai:v0.6.3",
        "vllm/vllm-openai:v0.6.4",
    )
    # a status-only update (same generation) is not a change; nor a first sighting
    same = copy.deepcopy(new)
    same["status"]["readyReplicas"] = 1
    assert change_events(new, same, 11.0) == []
    assert change_events(None, new, 11.0) == []
    typo = copy.deepcopy(new)
    typo["metadata"]["annotations"][cv.ANNOTATION_CHANGE_STREAM] = "images"
    typo["metadata"]["generation"] = 3
    assert change_events(new, typo, 12.0) == []
