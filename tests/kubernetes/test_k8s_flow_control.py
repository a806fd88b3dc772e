"""`routing.flowControl.apiKeysSecretRef`: every router the pool runs (the router
Deployment, the sidecars, the GIE endpoint picker) mounts the user's Secret read-only and
reads it as `--api-keys-file`; pools without it mount nothing and pass no flag. The
children still validate against Kubernetes' schemas (test_k8s_validate.py covers the
`builtin-flow-keys` variant)."""

from __future__ import annotations

import copy

import pytest
from k8s_pools import FLOW_CONTROL, all_pools, children, deployment, example, pool_from
from kvfleet_operator.runtimes.kubernetes.build.router_pod import API_KEYS_DIR, API_KEYS_FILE

POOLS = all_pools()
KEYS_FLAG = ["--api-keys-file", f"{API_KEYS_DIR}/{API_KEYS_FILE}"]


def _routers(objs):
    """(pod spec, router container) of every pod that runs a router."""
    for o in objs:
        if o["kind"] != "Deployment":
            continue
        pod = o["spec"]["template"]["spec"]
        for c in pod["containers"] + pod.get("initContainers", []):
            if c.get("command") == ["kvfleet", "router"]:
                yield pod, c


def _with_flow(placement=None, gateway=False):
    m = copy.deepcopy(example("vllm-unified.yaml"))
    m["spec"].setdefault("routing", {})["flowControl"] = copy.deepcopy(FLOW_CONTROL)
    if placement:
        m["spec"]["routing"]["placement"] = placement
    if gateway:
        m["spec"]["routing"]["gateway"] = {}
    return pool_from(m)


def _assert_mounted(pod, router):
    [vol] = [v for v in pod["volumes"] if v["name"] == "api-keys"]
    assert vol["secret"] == {"secretName": "team-keys", "defaultMode": 0o440,
                             "items": [{"key": "keys.yaml", "path": API_KEYS_FILE}]}
    [mount] = [m for m in router["volumeMounts"] if m["name"] == "api-keys"]
    assert mount == {"name": "api-keys", "mountPath": API_KEYS_DIR, "readOnly": True}
    assert "subPath" not in mount  # a subPath mount would never see the Secret change
    i = router["args"].index("--api-keys-file")
    assert router["args"][i:i + 2] == KEYS_FLAG


def test_the_router_deployment_mounts_the_keys_secret_and_reads_it():
    pool = POOLS["builtin-flow-keys"]
    objs = children(pool)
    [(pod, router)] = list(_routers([deployment(objs, f"{pool.name}-router")]))
    _assert_mounted(pod, router)


@pytest.mark.parametrize("placement, gateway, num_routers", [
    ("sidecar", False, 1), (None, True, 2)])
def test_sidecars_and_the_endpoint_picker_mount_it_too(placement, gateway, num_routers):
    routers = list(_routers(children(_with_flow(placement, gateway))))
    assert len(routers) == num_routers
    for pod, router in routers:
        _assert_mounted(pod, router)


@pytest.mark.parametrize("name", ["local-cpu", "vllm-unified", "vllm-sidecar"])
def test_pools_without_keys_mount_nothing(name):
    for pod, router in _routers(children(POOLS[name])):
        assert "--api-keys-file" not in router["args"]
        assert all(v["name"] != "api-keys" for v in pod["volumes"])
