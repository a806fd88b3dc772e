"""`routing.placement: sidecar`: a router in every engine pod, in front of its engine, the
pool's Service on the sidecars, no router Deployment; the default stays `deployment`."""

from __future__ import annotations

import pytest
from k8s_pools import all_pools, by_kind, children, deployment
from kvfleet_operator.runtimes.kubernetes.build.router_pod import router_args

POOLS = all_pools()
SIDECAR = ["vllm-sidecar", "builtin-pd-sidecar"]


def test_placement_defaults_to_deployment():
    for name in ("vllm-unified", "vllm-disaggregated", "local-cpu", "local-sim"):
        assert POOLS[name].spec.routing.placement == "deployment"
        objs = children(POOLS[name])
        assert deployment(objs, f"{POOLS[name].name}-router")


@pytest.mark.parametrize("name", SIDECAR)
def test_no_router_deployment_or_pdb_and_the_service_targets_the_sidecars(name):
    pool = POOLS[name]
    objs = children(pool)
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert ("Deployment", f"{pool.name}-router") not in names
    assert ("PodDisruptionBudget", f"{pool.name}-router") not in names
    [svc] = [s for s in by_kind(objs, "Service") if s["metadata"]["name"] == f"{pool.name}-router"]
    assert svc["spec"]["selector"] == {"kvfleet.io/pool": pool.name,
                                       "app.kubernetes.io/component": "engine"}
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http",
                                     "protocol": "TCP"}]


@pytest.mark.parametrize("name", SIDECAR)
def test_every_engine_pod_carries_its_router_in_front(name):
    pool = POOLS[name]
    objs = children(pool)
    for role in pool.spec.topology.roles():
        pod = deployment(objs, f"{pool.name}-{role}")["spec"]["template"]["spec"]
        [router] = pod["initContainers"]
        assert router["restartPolicy"] == "Always"  # native sidecar: up first, down last
        assert router["command"] == ["kvfleet", "router"] and router["args"] == router_args()
        assert router["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
        [engine] = pod["containers"]
        assert engine["ports"][0] == {"name": "engine", "containerPort": 8001,
                                      "protocol": "TCP"}
        assert engine["readinessProbe"]["httpGet"]["port"] == "engine"
        volumes = {v["name"] for v in pod["volumes"]}
        for mount in router["volumeMounts"] + engine["volumeMounts"]:
            assert mount["name"] in volumes
        assert {"router-config", "admin-token"} <= volumes
        assert pod["terminationGracePeriodSeconds"] > (
            pool.spec.autoscaling.drain_timeout_seconds + 30)


@pytest.mark.parametrize("name", SIDECAR)
def test_headless_services_name_both_ports(name):
    pool = POOLS[name]
    for svc in by_kind(children(pool), "Service"):
        if svc["metadata"]["name"] != f"{pool.name}-router":
            assert [p["name"] for p in svc["spec"]["ports"]][:2] == ["engine", "http"]
