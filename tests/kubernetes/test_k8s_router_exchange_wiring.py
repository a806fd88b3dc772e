"""Issue 29's operator side: a pool whose router runs as several processes gets the router
exchange in its config (bootstrap ConfigMap and every push) through the headless Service
`<pool>-router-peers`; router workers follow `routing.workers` or the router's CPU request."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import kubernetes_validate
import pytest
import yaml
from k8s_pools import TOKENS, example, pool_from
from kvfleet_operator.api import SpecError, parse_pool
from kvfleet_operator.decide.reconcile import Observed, reconcile
from kvfleet_operator.decide.router_config import build_router_config, next_version
from kvfleet_operator.decide.router_process import (
    MAX_DERIVED_WORKERS,
    cpu_cores,
    router_processes,
    router_resources,
    router_workers,
)
from kvfleet_operator.loop.control_loop import ControlLoop
from kvfleet_operator.loop.ports import RouterView
from kvfleet_operator.runtimes.kubernetes import build_children
from kvfleet_operator.runtimes.kubernetes.build.configmap import ROUTER_CONFIG_KEY
from kvfleet_operator.runtimes.kubernetes.build.epp_pod import build_epp_deployment
from kvfleet_operator.runtimes.kubernetes.build.service import router_peers_dns
from kvfleet_operator.runtimes.local.spec_support import unhonoured_fields
from kvfleet_router.config import RouterConfig

WALL = datetime(2026, 1, 1, tzinfo=UTC)
PEERS = "peers-router-peers.inference.svc:8000"


def pool_with(routing: dict[str, Any] | None = None, name: str = "peers",
              namespace: str = "inference"):  # fmt: skip
    data = copy.deepcopy(example("local-cpu.yaml"))
    data["metadata"] = {"name": name, "namespace": namespace}
    data["spec"].setdefault("routing", {}).update(routing or {})
    return pool_from(data)


def children(pool) -> list[dict[str, Any]]:
    return build_children(pool, tokens=TOKENS)


def find(objs, kind: str, name: str) -> dict[str, Any] | None:
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(hits) <= 1
    return hits[0] if hits else None


def bootstrap_config(objs) -> dict[str, Any]:
    cm = find(objs, "ConfigMap", "peers-router-config")
    assert cm is not None
    config: dict[str, Any] = yaml.safe_load(cm["data"][ROUTER_CONFIG_KEY])
    return config


def router_container(objs) -> dict[str, Any]:
    deployment = find(objs, "Deployment", "peers-router")
    assert deployment is not None
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def workers_flag(args: list[str]) -> int | None:
    return int(args[args.index("--workers") + 1]) if "--workers" in args else None


# --- replicas that route as one ------------------------------------------------------------


def test_two_replicas_exchange_through_the_headless_service():
    pool = pool_with({"replicas": 2})
    objs = children(pool)
    config = bootstrap_config(objs)
    assert config["exchange"] == {"enabled": True, "peers_dns": PEERS}
    parsed = RouterConfig.from_dict(config).exchange  # the router takes it as it is
    assert parsed.enabled and parsed.peers_dns == PEERS

    svc = find(objs, "Service", "peers-router-peers")
    assert svc is not None and svc["metadata"]["namespace"] == "inference"
    spec = svc["spec"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    # Every router pod of this pool (router replicas and gateway pickers), nothing else.
    assert spec["selector"] == {"kvfleet.io/pool": "peers", "app.kubernetes.io/component": "router"}
    assert spec["ports"] == [{"name": "http", "port": 8000, "targetPort": "http",
                              "protocol": "TCP"}]  # fmt: skip
    # The name the config resolves is this Service's, in its namespace, on its port.
    host, port = PEERS.rsplit(":", 1)
    assert host.split(".")[:2] == [svc["metadata"]["name"], svc["metadata"]["namespace"]]
    assert int(port) == spec["ports"][0]["port"]
    # The router pods carry the selected labels, and serve the port by that name.
    router = find(objs, "Deployment", "peers-router")
    assert router is not None
    labels = router["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"].items() <= labels.items()
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in \
        router_container(objs)["ports"]  # fmt: skip
    # The Service is owned by the pool, as every child (deleted with it).
    assert svc["metadata"]["ownerReferences"][0]["uid"] == pool.uid


@pytest.mark.parametrize("version", ["1.30.0", "1.33.0"])
def test_the_peers_service_and_a_workers_router_validate(version):
    pool = pool_with({"replicas": 3, "resources": {"requests": {"cpu": "4"},
                                                   "limits": {"cpu": 6, "memory": "3Gi"}}})
    objs = children(pool)
    for obj in (find(objs, "Service", "peers-router-peers"),
                find(objs, "Deployment", "peers-router")):  # fmt: skip
        assert obj is not None
        kubernetes_validate.validate(obj, version, strict=True)


def test_one_router_process_has_no_exchange_but_keeps_the_service():
    objs = children(pool_with({"replicas": 1}))
    assert "exchange" not in bootstrap_config(objs)
    assert workers_flag(router_container(objs)["args"]) is None
    # Kept with the router Deployment: a later `replicas: 2` then only changes the config.
    assert find(objs, "Service", "peers-router-peers") is not None


def test_one_replica_with_workers_exchanges_too():
    objs = children(pool_with({"replicas": 1, "workers": 2}))
    assert bootstrap_config(objs)["exchange"] == {"enabled": True, "peers_dns": PEERS}
    assert workers_flag(router_container(objs)["args"]) == 2


def test_gateway_pickers_count_as_router_processes_and_run_one_worker():
    pool = pool_with({"replicas": 1, "workers": 4, "gateway": {"kind": "gie"}})
    assert router_processes(pool.spec) == 1 * 4 + 1
    objs = children(pool)
    assert bootstrap_config(objs)["exchange"]["enabled"] is True
    (picker,) = build_epp_deployment(pool, "img")["spec"]["template"]["spec"]["containers"]
    assert "--epp-port" in picker["args"] and workers_flag(picker["args"]) is None
    assert workers_flag(router_container(objs)["args"]) == 4


def test_sidecar_routers_do_not_exchange_and_have_no_peers_service():
    pool = pool_with({"replicas": 2, "placement": "sidecar"})
    objs = children(pool)
    assert "exchange" not in bootstrap_config(objs)
    assert find(objs, "Service", "peers-router-peers") is None


def test_without_a_peers_name_no_exchange():
    # A local fleet (`kvfleet up`) passes no peers name: one router process, whose workers
    # exchange among themselves whatever the config says.
    pool = pool_with({"replicas": 4, "workers": 2})
    assert "exchange" not in build_router_config(pool.spec, [], 1)
    assert build_router_config(pool.spec, [], 1, peers_dns=PEERS)["exchange"]["enabled"]


def test_peers_dns_names_the_pools_namespace():
    assert router_peers_dns(pool_with(name="a", namespace="team-x")) == \
        "a-router-peers.team-x.svc:8000"  # fmt: skip


def test_reconcile_pushes_the_exchange_and_a_scale_out_moves_the_version():
    one = reconcile(pool_with({"replicas": 1}), Observed(), now=0.0, wall=WALL,
                    router_peers_dns=PEERS)  # fmt: skip
    assert "exchange" not in one.router_config
    two = reconcile(pool_with({"replicas": 2}), Observed(), now=1.0, wall=WALL,
                    previous_router_config=one.router_config, router_peers_dns=PEERS)
    assert two.router_config["exchange"] == {"enabled": True, "peers_dns": PEERS}
    # A new version, so the loop pushes it to the routers that already run.
    assert two.is_router_config_changed
    assert two.router_config["version"] == next_version(one.router_config, two.router_config)
    assert two.router_config["version"] == one.router_config["version"] + 1


class _Runtime:
    async def supervise(self) -> None: ...
    def replicas(self) -> list[Any]: return []
    async def create(self, spec: Any, plan: Any) -> None: ...
    async def mark_draining(self, name: str) -> None: ...
    async def mark_ready(self, name: str) -> None: ...
    async def delete(self, name: str, grace_s: float) -> None: ...


class _Routers:
    def __init__(self) -> None:
        self.pushed: list[dict[str, Any]] = []

    async def push(self, config: dict[str, Any]) -> None:
        self.pushed.append(config)

    async def view(self) -> RouterView | None:
        return RouterView(version=self.pushed[-1]["version"] if self.pushed else 0)

    async def num_held(self) -> int:
        return 0

    async def perf_models(self) -> dict[str, Any]:
        return {}


class _Metrics:
    async def sample(self, replicas: Any, now: float) -> dict[str, Any]:
        return {}


class _Store:
    def load(self) -> None:
        return None

    async def save(self, status: Any, loop: Any, view: dict[str, Any]) -> None: ...


class _Events:
    def emit(self, event: Any) -> None: ...


async def test_the_control_loop_pushes_what_its_runtime_names():
    routers = _Routers()
    loop = ControlLoop(pool_with({"replicas": 2}), runtime=_Runtime(), router=routers,
                       metrics=_Metrics(), store=_Store(), events=_Events(),
                       clock=lambda: 1000.0, router_peers_dns=PEERS)  # fmt: skip
    await loop.tick()
    assert routers.pushed and routers.pushed[-1]["exchange"]["peers_dns"] == PEERS


# --- workers from the router's CPU ----------------------------------------------------------


@pytest.mark.parametrize("resources,expected", [
    (None, 1),  # the default request, 500m
    ({"requests": {"cpu": "1999m"}}, 1),
    ({"requests": {"cpu": "1.999"}}, 1),
    ({"requests": {"cpu": "2"}}, 2),
    ({"requests": {"cpu": 2}}, 2),
    ({"requests": {"cpu": "2000m"}}, 2),
    ({"requests": {"cpu": "3.5"}}, 3),
    ({"requests": {"cpu": "8"}}, 8),
    ({"requests": {"cpu": "9"}}, MAX_DERIVED_WORKERS),
    ({"requests": {"cpu": "64"}}, MAX_DERIVED_WORKERS),
    ({"requests": {"cpu": "100m"}}, 1),
    ({"limits": {"cpu": "3"}}, 3),  # Kubernetes requests what the limit says
    ({"requests": {"cpu": "1"}, "limits": {"cpu": "4"}}, 1),  # the request, not the limit
    ({"requests": {"memory": "1Gi"}}, 1),  # cpu keeps its default
])
def test_workers_follow_the_cpu_request(resources, expected):
    routing: dict[str, Any] = {"resources": resources} if resources else {}
    pool = pool_with(routing)
    assert router_workers(pool.spec) == expected
    args = router_container(children(pool))["args"]
    assert workers_flag(args) == (expected if expected > 1 else None)
    assert MAX_DERIVED_WORKERS == 8


def test_explicit_workers_win_over_the_cpu_request():
    assert router_workers(pool_with({"workers": 12}).spec) == 12  # past the derived cap
    assert router_workers(pool_with({"workers": 1, "resources": {
        "requests": {"cpu": "4"}}}).spec) == 1  # fmt: skip
    assert workers_flag(router_container(children(pool_with({"workers": 1})))["args"]) is None


@pytest.mark.parametrize("workers", [0, 65, "2", 2.0, True])
def test_workers_out_of_range_or_not_an_integer_is_refused(workers):
    data = copy.deepcopy(example("local-cpu.yaml"))
    data["spec"].setdefault("routing", {})["workers"] = workers
    with pytest.raises(SpecError, match="workers"):
        parse_pool(data)


def test_the_router_container_resources_merge_per_resource():
    default = router_container(children(pool_with()))["resources"]
    assert default == {"requests": {"cpu": "500m", "memory": "512Mi"},
                       "limits": {"memory": "2Gi"}}  # fmt: skip
    cpu = router_resources(pool_with({"resources": {"requests": {"cpu": "2"}}}).spec)
    assert cpu == {"requests": {"cpu": "2", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}
    # A pool's own memory limit takes no default memory request (512Mi > 256Mi is invalid).
    small = router_resources(pool_with({"resources": {"limits": {"memory": "256Mi"}}}).spec)
    assert small == {"requests": {"cpu": "500m"}, "limits": {"memory": "256Mi"}}
    # The sidecar router takes them too.
    sidecar = pool_with({"placement": "sidecar", "resources": {"requests": {"cpu": "2"}}})
    engine = next(o for o in children(sidecar) if o["kind"] == "Deployment")
    (router,) = engine["spec"]["template"]["spec"]["initContainers"]
    assert router["resources"]["requests"]["cpu"] == "2" and workers_flag(router["args"]) == 2


@pytest.mark.parametrize("text,cores", [
    ("1999m", Fraction(1999, 1000)), ("2", Fraction(2)), ("1.5", Fraction(3, 2)),
    (".5", Fraction(1, 2)), ("2e0", Fraction(2)), ("3E1", Fraction(30)), ("1k", Fraction(1000)),
    ("500000u", Fraction(1, 2)), ("1Ki", Fraction(1024)), (4, Fraction(4)),
])
def test_cpu_quantities_are_exact(text, cores):
    assert cpu_cores(text) == cores


def test_a_bad_quantity_is_an_error():
    with pytest.raises(ValueError, match="quantity"):
        cpu_cores("two")


def test_a_local_fleet_names_the_router_settings_it_ignores():
    # `kvfleet up` runs processes with no resources: it says so. It honours routing.workers
    # (`kvfleet router --workers N`), so that one is not named.
    lines = unhonoured_fields(pool_with({"workers": 4, "resources": {
        "requests": {"cpu": "4"}}}).spec)  # fmt: skip
    named = " ".join(lines)
    assert "routing.workers" not in named and "routing.resources" in named, lines
    assert not [ln for ln in unhonoured_fields(pool_with({"workers": 1}).spec)
                if "routing." in ln]  # fmt: skip
