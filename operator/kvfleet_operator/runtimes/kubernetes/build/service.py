"""Services: a headless one per engine role (stable per-pod DNS; the router is programmed
with pod IPs by the operator, not through it), the router's, the pool's endpoint, and the
routers' headless `<pool>-router-peers`, through which router replicas find each other.

`<pool>-router-peers` selects every router pod of the pool (the router Deployment's and,
with `routing.gateway`, the endpoint pickers': both route the same engines) and publishes
them before they are ready, so a starting router warms from the others and is found by
them at once. The router config names it in `exchange.peers_dns`
(`decide.router_config.router_exchange`) when the pool runs more than one router process.
It exists with the router Deployment whatever the count: it costs no cluster IP, a change
of `routing.replicas` then only changes the config, and the operator deletes no child it
stops wanting (a Service made only for replicas > 1 would outlive a scale back to 1)."""

from __future__ import annotations

from typing import Any

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.decide.engine_args import NIXL_SIDE_CHANNEL_PORT
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.placement import (
    ROUTER_PORT,
    engine_port,
    engine_port_name,
    is_sidecar,
)


def _port(name: str, port: int) -> dict[str, Any]:
    return {"name": name, "port": port, "targetPort": name, "protocol": "TCP"}


def build_engine_service(pool: InferencePool, role: str) -> dict[str, Any]:
    ports = [_port(engine_port_name(pool), engine_port(pool))]
    if is_sidecar(pool):
        ports.append(_port("http", ROUTER_PORT))
    if pool.spec.engine.kind == "vllm" and role in ("prefill", "decode"):
        ports.append(_port("nixl", NIXL_SIDE_CHANNEL_PORT))
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta.object_meta(pool, meta.engine_name(pool, role), meta.engine_app(pool),
                                     meta.ENGINE, role),
        "spec": {"clusterIP": "None", "selector": meta.selector(pool, meta.ENGINE, role),
                 "ports": ports, "publishNotReadyAddresses": False},
    }


def build_router_service(pool: InferencePool) -> dict[str, Any]:
    """In front of the router pods, or with `placement: sidecar` of every engine pod's
    router sidecar (port `http` of each)."""
    if is_sidecar(pool):
        selector = meta.selector(pool, meta.ENGINE)
    else:
        selector = meta.selector(pool, meta.ROUTER, meta.ROUTER)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta.object_meta(pool, meta.router_name(pool), meta.ROUTER_APP,
                                     meta.ROUTER, meta.ROUTER),
        "spec": {"type": "ClusterIP", "selector": selector,
                 "ports": [_port("http", ROUTER_PORT)]},
    }


def router_peers_dns(pool: InferencePool) -> str:
    """`exchange.peers_dns`: every router pod's address, by the headless Service's name (the
    pod's resolver search path completes `<svc>.<ns>.svc` in any cluster domain)."""
    return f"{meta.router_peers_name(pool)}.{pool.namespace}.svc:{ROUTER_PORT}"


def build_router_peers_service(pool: InferencePool) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta.object_meta(pool, meta.router_peers_name(pool), meta.ROUTER_APP,
                                     meta.ROUTER, meta.ROUTER),
        "spec": {"clusterIP": "None", "selector": meta.selector(pool, meta.ROUTER),
                 "ports": [_port("http", ROUTER_PORT)], "publishNotReadyAddresses": True},
    }
