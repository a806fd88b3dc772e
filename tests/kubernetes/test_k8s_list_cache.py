"""The pools' loops share one list per collection (`KubeClient.list(max_age_s=...)`), and a
loop that wrote lists afresh, so it always sees its own change."""

from __future__ import annotations

from kmock_shim import api
from kvfleet_operator.api import parse_pool
from kvfleet_operator.runtimes.kubernetes.build.options import BuildOptions
from kvfleet_operator.runtimes.kubernetes.ports.event_sink import KubeEventSink
from kvfleet_operator.runtimes.kubernetes.ports.pool_children import apply_pool
from kvfleet_operator.runtimes.kubernetes.ports.replica_runtime import KubeReplicaRuntime
from test_k8s_loop_ports import DEPLOYMENT, Kubelet
from test_k8s_operator_kmock import NAME, NS, POOL_PATH, POOLS, pool_manifest


def pod_lists(cluster) -> int:
    return len([r for r in cluster.sent("GET", f"/namespaces/{NS}/pods") if not r.name])


async def test_loops_share_lists_and_see_their_own_writes(cluster, client):
    await api(cluster, "POST", POOL_PATH, pool_manifest())
    pool = parse_pool(cluster.obj(POOLS, NS, NAME))
    await apply_pool(client, pool, image="img", options=BuildOptions())
    await Kubelet(cluster, None).sync()
    events = KubeEventSink(client, pool)
    one, two = (KubeReplicaRuntime(client, pool, image="img", options=BuildOptions(),
                                   events=events, list_max_age_s=60.0) for _ in range(2))
    await one.supervise()  # a fresh runtime lists for itself (it may have written before)
    await two.supervise()
    await one.supervise()  # the first shared list
    before = pod_lists(cluster)
    await one.supervise()
    await two.supervise()
    assert pod_lists(cluster) == before  # both answered from one shared list
    assert len(one.replicas()) == 2
    victim = f"{DEPLOYMENT}-abc1"
    await one.mark_draining(victim)
    await one.supervise()  # it wrote: it lists afresh and sees its own annotation
    assert pod_lists(cluster) > before
    assert {r.name: r.state for r in one.replicas()}[victim] == "draining"
    await events.aclose()


def test_a_shared_list_answers_each_pool_with_its_own_objects_only():
    from kvfleet_operator.runtimes.kubernetes.ports.kube_client import _Cached

    def item(pool: str | None, role: str) -> dict:
        labels = {"kvfleet.io/role": role, **({"kvfleet.io/pool": pool} if pool else {})}
        return {"metadata": {"name": f"{pool}-{role}", "labels": labels}}

    cached = _Cached([item("a", "prefill"), item("a", "decode"), item("b", "decode"),
                      item(None, "decode")], t=0.0)  # fmt: skip
    names = lambda labels: sorted(i["metadata"]["name"] for i in cached.matching(labels))  # noqa: E731
    assert names({"kvfleet.io/pool": "a"}) == ["a-decode", "a-prefill"]
    assert names({"kvfleet.io/pool": "a", "kvfleet.io/role": "decode"}) == ["a-decode"]
    assert names({"kvfleet.io/pool": "c"}) == []
    assert names({"kvfleet.io/role": "decode"}) == ["None-decode", "a-decode", "b-decode"]


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
