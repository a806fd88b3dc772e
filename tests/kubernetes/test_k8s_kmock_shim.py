"""The shim's own promises where the operator tests lean on them (kvfleet_bench.kmock_shim)."""

from __future__ import annotations

import asyncio

from kmock._internal import references, rendering
from kmock_shim import api

MAPS = "/api/v1/namespaces/{}/configmaps"


async def test_a_watch_sees_a_write_that_lands_while_it_streams_its_snapshot(cluster):
    """kmock marked its event bus only after streaming the snapshot, so this write reached
    no watcher: kopf, which patches a pool as soon as it lists it, then waited forever."""
    await api(cluster, "POST", MAPS.format("ns"), {"metadata": {"name": "a"}})
    watch = cluster._serve_watch(rendering.Request(resource=references.resource("v1/configmaps"),
                                                   namespace="ns"))  # fmt: skip
    assert await anext(watch) == b""
    first = await anext(watch)
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "a")
    await api(cluster, "POST", MAPS.format("other"), {"metadata": {"name": "elsewhere"}})
    await api(cluster, "PATCH", MAPS.format("ns") + "/a", {"data": {"x": "1"}},
              content_type="application/merge-patch+json")  # fmt: skip
    event = await asyncio.wait_for(anext(watch), 5)
    assert (event["type"], event["object"]["metadata"]["name"]) == ("MODIFIED", "a")
    assert event["object"]["data"] == {"x": "1"}  # and nothing from the other namespace
    await watch.aclose()
