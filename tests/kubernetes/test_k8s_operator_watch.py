"""kopf's watches feed the loops (`@kopf.index` over the pools' Deployments and Pods): with
the operator running against kmock, a pool's replicas reach its status with no list call
per tick, and kopf asks the API server for kvfleet's pool children only."""

from __future__ import annotations

import asyncio

from kmock_shim import api, eventually, operator_running
from kvfleet_operator.runtimes.kubernetes.ports.pool_index import DEPLOYMENT_SELECTOR, POD_SELECTOR
from test_k8s_loop_ports import DEPLOYMENT, Kubelet
from test_k8s_operator_kmock import NAME, NS, POOL_PATH, POOLS, count_ticks, pool_manifest


def reads(cluster, plural: str) -> list:
    """GETs of `plural` collections (lists and watches) the operator sent."""
    return [r for r in cluster.sent("GET", f"/{plural}") if not r.name
            and "aiohttp" not in r.headers.get("User-Agent", "")]  # fmt: skip


def ready(cluster) -> int | None:
    status = (cluster.obj(POOLS, NS, NAME) or {}).get("status") or {}
    return ((status.get("roles") or {}).get("unified") or {}).get("readyReplicas")


async def test_the_loop_reads_its_replicas_from_kopfs_index_not_by_listing(cluster, monkeypatch):
    ticks = count_ticks(monkeypatch)
    async with operator_running(str(cluster.url)):
        await api(cluster, "POST", POOL_PATH, pool_manifest())
        await eventually(lambda: cluster.obj("apps/v1/deployments", NS, DEPLOYMENT),
                         what="the engine Deployment")  # fmt: skip
        await Kubelet(cluster, None).sync()  # two ready pods, as the ReplicaSet would make
        await eventually(lambda: ready(cluster) == 2, what="2 ready replicas in status")
        before = {p: len(reads(cluster, p)) for p in ("pods", "deployments")}
        seen = len(ticks)
        await eventually(lambda: len(ticks) > seen + 3, what="more ticks")
        await asyncio.sleep(0.1)
        assert {p: len(reads(cluster, p)) for p in ("pods", "deployments")} == before
        # kopf's one list and its watch per kind, with kvfleet's selector for the API server
        # (kmock ignores it on watches; the index's label filter holds it there).
        for plural, selector in (("pods", POD_SELECTOR), ("deployments", DEPLOYMENT_SELECTOR)):
            sent = reads(cluster, plural)
            assert sent and all(r.params.get("labelSelector") == selector for r in sent)
            assert len([r for r in sent if r.params.get("watch") != "true"]) == 1
        # A pod leaving shows in status through the watch alone.
        pod = f"{DEPLOYMENT}-abc1"
        await api(cluster, "DELETE", f"/api/v1/namespaces/{NS}/pods/{pod}")
        await eventually(lambda: ready(cluster) == 1, what="1 ready replica in status")
