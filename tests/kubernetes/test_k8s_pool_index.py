"""The loops read their Deployments and Pods from kopf's indexes (`ports/pool_index.py`),
see their own writes before the index does (read-your-writes), and sleep until kopf wakes
them for a spec change (`pool_loop.run_pool`); the API client's session settings."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
from cluster_index import live, snapshot
from kmock_shim import api
from kubernetes.aio import client as kclient
from kvfleet_operator.api import parse_pool
from kvfleet_operator.runtimes.kubernetes import pool_loop
from kvfleet_operator.runtimes.kubernetes.build.options import BuildOptions
from kvfleet_operator.runtimes.kubernetes.operator_config import OperatorConfig
from kvfleet_operator.runtimes.kubernetes.ports import pool_index
from kvfleet_operator.runtimes.kubernetes.ports.kube_client import KubeClient
from kvfleet_operator.runtimes.kubernetes.ports.pods import DRAINING_ANNOTATION, role_replicas
from kvfleet_operator.runtimes.kubernetes.ports.pool_children import apply_pool
from kvfleet_operator.runtimes.kubernetes.ports.pool_index import (
    MAX_LAG_S,
    OwnWrites,
    PoolIndexes,
    is_behind,
    slim_deployment,
    slim_pod,
)
from test_k8s_loop_ports import (
    DEPLOYMENT,
    PODS,
    FakeClock,
    FakeRouters,
    Kubelet,
    SteeredScaler,  # fmt: skip
    make_loop,
    replicas,
)
from test_k8s_operator_kmock import NAME, NS, POOL_PATH, POOLS, pool_manifest

# --- what the index holds, and own writes over it ------------------------------------------


def test_slim_copies_keep_what_the_replicas_are_made_of():
    pod = {"metadata": {"name": "p", "namespace": NS, "resourceVersion": "7",
                        "labels": {"kvfleet.io/role": "unified"}, "managedFields": [{}] * 9,
                        "annotations": {DRAINING_ANNOTATION: "2026-01-01T00:00:00Z"}},
           "spec": {"containers": [{"name": "engine", "args": ["x"] * 50}],
                    "readinessGates": [{"conditionType": "kvfleet.io/routed"}]},
           "status": {"phase": "Running", "podIP": "10.0.0.1",
                      "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip
    slim = slim_pod(pod)
    assert "managedFields" not in slim["metadata"] and "containers" not in slim["spec"]
    assert role_replicas("unified", "d", 1, [slim], 8000, 0.0) == \
        role_replicas("unified", "d", 1, [pod], 8000, 0.0)  # fmt: skip
    deployment = {"metadata": {"name": "d", "resourceVersion": "3"},
                  "spec": {"replicas": 2, "selector": {}, "template": {
                      "metadata": {"annotations": {"kvfleet.io/template-hash": "h"}},
                      "spec": {"containers": [{}]}}}}  # fmt: skip
    assert slim_deployment(deployment) == {
        "metadata": {"name": "d", "resourceVersion": "3"},
        "spec": {"replicas": 2, "template": {"metadata": {"annotations": {
            "kvfleet.io/template-hash": "h"}}}}}  # fmt: skip


def test_the_index_is_behind_our_write_until_it_shows_that_version_or_a_later_one():
    assert is_behind("5", written="7", before="5")  # still the version we replaced
    assert is_behind("6", written="7", before="5")  # someone else's write, before ours
    assert not is_behind("7", written="7", before="5")  # ours arrived
    assert not is_behind("9", written="7", before="5")  # and more since
    assert is_behind("a", written="c", before="a")  # opaque versions: only equality
    assert not is_behind("b", written="c", before="a")
    assert not is_behind(None, written="7", before="5")


def obj(name: str, rv: str, replicas: int) -> dict:
    return {"metadata": {"name": name, "resourceVersion": rv}, "spec": {"replicas": replicas}}


def test_own_writes_stand_in_until_the_index_catches_up():
    now = [0.0]
    own = OwnWrites(clock=lambda: now[0])
    before = obj("d", "5", 2)
    own.remember("Deployment", obj("d", "7", 3), before, slim_deployment)
    assert own.view("Deployment", [before]) == [slim_deployment(obj("d", "7", 3))]
    assert own.view("Pod", [obj("d", "5", 2)]) == [obj("d", "5", 2)]  # per kind
    assert own.view("Deployment", [obj("d", "7", 3)]) == [obj("d", "7", 3)]
    assert len(own) == 0  # confirmed: forgotten
    own.remember("Deployment", obj("d", "9", 4), obj("d", "7", 3), slim_deployment)
    assert own.view("Deployment", [obj("d", "10", 1)]) == [obj("d", "10", 1)]  # newer wins
    # A create the index has not shown yet is there; one that never shows goes in the end.
    own.remember("Deployment", obj("new", "11", 1), None, slim_deployment)
    assert [o["metadata"]["name"] for o in own.view("Deployment", [])] == ["new"]
    now[0] += MAX_LAG_S
    assert own.view("Deployment", []) == [] and len(own) == 0
    # A pod we wrote that left the index (deleted) is not brought back.
    own.remember("Pod", obj("p", "12", 0), obj("p", "8", 0), slim_pod)
    assert own.view("Pod", []) == [] and len(own) == 0
    assert own.remember("Pod", None, None, slim_pod) is None  # no object in the answer


# --- the replica runtime over the index ------------------------------------------------------


def pool_gets(cluster) -> int:
    return len([r for r in cluster.sent("GET") if "/pods" in r.url.path
                or "/deployments" in r.url.path])  # fmt: skip


async def started(cluster, client, indexes_of):
    await api(cluster, "POST", POOL_PATH, pool_manifest())
    pool = parse_pool(cluster.obj(POOLS, NS, NAME))
    await apply_pool(client, pool, image="img", options=BuildOptions())
    clock, routers = FakeClock(), FakeRouters(2)
    scaler = SteeredScaler({"unified": 2})
    kubelet = Kubelet(cluster, clock)
    await kubelet.sync()
    loop, events = await make_loop(cluster, client, clock, routers, scaler, indexes_of(cluster))
    return loop, events, kubelet, scaler, clock


async def test_the_index_answers_the_replica_runtime_without_an_api_call(cluster, client):
    loop, events, *_ = await started(cluster, client, live)
    before = pool_gets(cluster)
    for _ in range(3):
        await loop.tick()
    assert pool_gets(cluster) == before == 1  # apply_pool's GET of the Deployment only
    assert sorted(r.name for r in loop.runtime.replicas()) == [f"{DEPLOYMENT}-abc1",
                                                                f"{DEPLOYMENT}-abc2"]
    # Another pool's objects in the index are not this pool's replicas.
    other = snapshot(cluster)
    theirs = {("elsewhere", NAME): other.pods.get((NS, NAME))}
    loop.runtime.indexes = PoolIndexes(deployments=other.deployments, pods=theirs)
    await loop.runtime.supervise()
    assert all(r.is_placeholder for r in loop.runtime.replicas())
    await events.aclose()


def deployment_applies(cluster) -> list[int]:
    return [json.loads(r.body)["spec"]["replicas"]
            for r in cluster.sent("PATCH", f"/deployments/{DEPLOYMENT}")]


def drained(cluster) -> list[str]:
    return [p["metadata"]["name"] for p in cluster.objs(PODS, NS)
            if DRAINING_ANNOTATION in (p["metadata"].get("annotations") or {})]


async def test_a_loop_never_acts_twice_on_an_index_from_before_its_write(cluster, client):
    loop, events, kubelet, scaler, clock = await started(cluster, client, snapshot)
    interval = loop.pool.spec.autoscaling.interval_seconds
    setup = len(deployment_applies(cluster))  # apply_pool's (PATCH, 404, POST, PATCH here)
    await loop.tick()
    scaler.desired = {"unified": 3}  # scale up; the index never hears of it
    clock.t += interval
    await loop.tick()
    for _ in range(3):
        clock.t += 1
        await loop.tick()
    assert deployment_applies(cluster)[setup:] == [3]  # one scale-up
    assert replicas(cluster) == 3 and loop.runtime.counts[DEPLOYMENT] == 3
    assert len(loop.runtime.replicas()) == 3  # the third a placeholder, from our own write

    await kubelet.sync()
    loop.runtime.indexes = snapshot(cluster)  # the index caught up: own writes forgotten
    await loop.tick()
    assert len(loop.runtime.own) == 0
    scaler.desired = {"unified": 2}  # scale down; again the index hears nothing more
    clock.t += interval
    for _ in range(6):
        await loop.tick()
        clock.t += 1
    assert len(drained(cluster)) == 1  # one victim drained, not one per stale tick
    assert deployment_applies(cluster)[setup:] == [3, 2]
    states = {r.name: r.state for r in loop.runtime.replicas()}
    assert states[drained(cluster)[0]] == "stopping"
    await events.aclose()


# --- waking the loop: no polling -----------------------------------------------------------


class Built:
    """Stands in for ControlLoop: records each loop built, runs until told to stop."""

    loops: list[Built] = []

    def __init__(self, pool, **_) -> None:
        self.pool = pool
        self.stopped = False
        self.num_held = 0
        Built.loops.append(self)

    async def run(self, stop, after_tick) -> None:
        await stop.wait()
        self.stopped = True


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.fixture
def pool_body() -> dict:
    body = copy.deepcopy(pool_manifest())
    body["metadata"].update(namespace=NS, uid="u-1", generation=1)
    return body


async def test_a_spec_change_reaches_the_loop_when_kopf_wakes_it_not_by_polling(
        monkeypatch, pool_body):  # fmt: skip
    monkeypatch.setattr(pool_loop, "ControlLoop", Built)
    Built.loops = []
    client = KubeClient(kclient.Configuration(host="http://127.0.0.1:9"))  # never called
    stopped, wakeup = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(pool_loop.run_pool(
        pool_body, client, OperatorConfig(max_tick_s=0.2), stopped, PoolIndexes({}, {}),
        wakeup, applied_tokens={(NS, NAME): "admin-token"}))  # fmt: skip
    try:
        await settle()
        assert len(Built.loops) == 1
        pool_body["spec"]["routing"] = {"policy": "least-request"}  # kopf's live body moves
        pool_body["metadata"]["generation"] = 2
        await asyncio.sleep(1.5)  # longer than any poll ever was: nobody looks
        assert len(Built.loops) == 1 and not Built.loops[0].stopped
        wakeup.set()  # the update handler, after its reconcile
        await settle()
        assert len(Built.loops) == 2 and Built.loops[0].stopped
        assert Built.loops[1].pool.generation == 2  # status.observedGeneration follows
        wakeup.set()  # a retried reconcile of the same spec: the loop keeps running
        await settle()
        assert len(Built.loops) == 2 and not Built.loops[1].stopped
        stopped.set()  # kopf stops the daemon (the pool is going)
        await asyncio.wait_for(task, 2)
        assert Built.loops[1].stopped
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()


async def test_a_loop_waits_for_its_tokens_until_the_reconcile_wakes_it(monkeypatch, pool_body):
    monkeypatch.setattr(pool_loop, "ControlLoop", Built)
    Built.loops = []

    async def no_secret(*_):
        return None

    monkeypatch.setattr(pool_loop, "read_token", no_secret)
    client = KubeClient(kclient.Configuration(host="http://127.0.0.1:9"))
    stopped, wakeup, applied = asyncio.Event(), asyncio.Event(), {}
    task = asyncio.create_task(pool_loop.run_pool(
        pool_body, client, OperatorConfig(max_tick_s=60.0), stopped, PoolIndexes({}, {}),
        wakeup, applied_tokens=applied))  # fmt: skip
    try:
        await settle()
        assert Built.loops == []
        applied[(NS, NAME)] = "admin-token"  # the create handler applied the pool
        wakeup.set()
        await settle()
        assert len(Built.loops) == 1  # at once, not after max_tick_s
        stopped.set()
        await asyncio.wait_for(task, 2)
        assert (NS, NAME) not in applied
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()


def test_nothing_is_left_of_the_list_cache():
    from kvfleet_operator.runtimes.kubernetes.ports import kube_client

    assert not hasattr(kube_client.KubeClient, "list")
    assert not hasattr(pool_loop, "POLL_S")
    assert pool_index.POD_SELECTOR == "app.kubernetes.io/part-of=kvfleet,kvfleet.io/pool"
    assert pool_index.DEPLOYMENT_SELECTOR == \
        "app.kubernetes.io/part-of=kvfleet,kvfleet.io/pool,app.kubernetes.io/component=engine"


# --- the API client's session --------------------------------------------------------------


def test_the_api_session_reads_proxy_settings_only_where_the_environment_has_them():
    from kvfleet_operator.runtimes.kubernetes.ports.kube_client import session_kwargs

    assert session_kwargs({}) == {"trust_env": False}  # no netrc/proxy lookups per request
    assert session_kwargs({"HTTPS_PROXY": "http://proxy:3128"}) == {}  # aiohttp honours it
    assert session_kwargs({"NETRC": "/etc/netrc"}) == {}


def test_the_client_applies_that_choice_to_its_session(monkeypatch):
    from kubernetes.aio import client as kclient
    from kvfleet_operator.runtimes.kubernetes.ports.kube_client import PROXY_ENV, KubeClient

    for name in PROXY_ENV:
        monkeypatch.delenv(name, raising=False)
    configuration = kclient.Configuration(host="http://127.0.0.1:1")
    KubeClient(configuration)
    assert configuration.client_session_kwargs == {"trust_env": False}
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    configuration = kclient.Configuration(host="http://127.0.0.1:1")
    KubeClient(configuration)
    extra = getattr(configuration, "client_session_kwargs", None) or {}
    assert extra.get("trust_env", True) is True  # aiohttp's default: it reads the proxy
