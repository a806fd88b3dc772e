"""routing.kvSharing on a vLLM pool: LMCache's connector and env in every engine, and an
LMCache server (Deployment, Service, NetworkPolicy) as a child of the pool; nothing of it
elsewhere. Every object validates against the Kubernetes schemas (checkov scans them in
tests/chart/test_chart_checkov_lmcache.py)."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
from k8s_pools import UID, all_pools, by_kind, children, deployment, engine_container
from kvfleet_operator.runtimes.kubernetes.build.meta import COMPONENT_LABEL, POOL_LABEL

POOLS = all_pools()
POOL = POOLS["vllm-lmcache"]
NAME = "shared-kv-lmcache"
URL = "lm://shared-kv-lmcache.inference.svc:65432"


def env_of(container):
    return {e["name"]: e.get("value") for e in container["env"]}


def test_the_engines_run_lmcaches_connector_against_the_pools_server():
    objs = children(POOL)
    c = engine_container(objs, "shared-kv-unified")
    args = c["args"]
    at = args.index("--kv-transfer-config")
    assert json.loads(args[at + 1]) == {"kv_connector": "LMCacheConnectorV1",
                                        "kv_role": "kv_both"}
    assert args[-1] == "--disable-uvicorn-access-log"  # the user's args stay last
    env = env_of(c)
    assert env["LMCACHE_REMOTE_URL"] == URL and env["LMCACHE_REMOTE_SERDE"] == "naive"
    assert env["LMCACHE_CHUNK_SIZE"] == "256" and env["PYTHONHASHSEED"] == "0"
    assert c["image"] == "lmcache/vllm-openai:v0.3.11"


def test_the_lmcache_server_is_a_locked_down_child_of_the_pool():
    objs = children(POOL)
    dep = deployment(objs, NAME)
    assert dep["spec"]["replicas"] == 1
    pod = dep["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert c["command"] == ["lmcache_server"] and c["args"] == ["0.0.0.0", "65432", "cpu"]
    assert c["image"] == POOL.spec.engine.image
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and sc["runAsNonRoot"] and not sc["privileged"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and pod["securityContext"]["runAsNonRoot"]
    assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"]
    assert pod["automountServiceAccountToken"] is False
    for obj in objs:
        if obj["metadata"]["name"] == NAME:
            assert obj["metadata"]["ownerReferences"][0]["uid"] == UID
            assert obj["metadata"]["labels"][POOL_LABEL] == "shared-kv"
    [svc] = [s for s in by_kind(objs, "Service") if s["metadata"]["name"] == NAME]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["port"] == 65432
    assert dep["spec"]["selector"]["matchLabels"][COMPONENT_LABEL] == "kv-cache"


def test_only_the_pools_engines_reach_the_server():
    objs = children(POOL)
    [policy] = [p for p in by_kind(objs, "NetworkPolicy") if p["metadata"]["name"] == NAME]
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == {POOL_LABEL: "shared-kv",
                                                 COMPONENT_LABEL: "kv-cache"}
    [rule] = spec["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {POOL_LABEL: "shared-kv",
                                                             COMPONENT_LABEL: "engine"}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 65432}]
    names = [(o["kind"], o["metadata"]["name"]) for o in objs]  # the store before engines
    assert names.index(("Deployment", NAME)) < names.index(("Deployment", "shared-kv-unified"))


@pytest.mark.parametrize("version", ["1.30.0", "1.33.0"])
def test_every_lmcache_child_validates(version):
    for obj in children(POOL):
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("name", sorted(set(POOLS) - {"vllm-lmcache"}))
def test_pools_without_kv_sharing_on_vllm_have_no_lmcache(name):
    objs = children(POOLS[name])
    assert not any("lmcache" in o["metadata"]["name"] for o in objs)
    for dep in by_kind(objs, "Deployment"):
        for c in dep["spec"]["template"]["spec"]["containers"]:
            assert "LMCACHE_REMOTE_URL" not in env_of(c)
            assert "LMCacheConnectorV1" not in " ".join(c.get("args", []))
