"""Services: a headless one per engine role (stable per-pod DNS; the router is programmed
with pod IPs by the operator, not through it) and the router's, the pool's endpoint."""

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
