"""The engines' NetworkPolicy: a pool's engine pods accept traffic only from

- the pool's router pods (the OpenAI API and KV events, on the engine port; with
  `routing.prefixMode: precise` on vLLM also its ZMQ KV-event PUB and replay ports, +1 and +2),
- the operator's pods (health and `/metrics` scrapes, on the engine port),
- their own pool's engine pods, on any port (P/D KV transfer: kvfleet's HTTP pull, or
  vLLM's NIXL side channel and its UCX transports on ports of their own; with `placement:
  sidecar`, also the sidecars routing to their peers' engines).

With `placement: sidecar` the router sidecars are the pool's front door, so anyone may
reach their port (8000); the engines behind them (8001) stay closed as above.

NetworkPolicies add up: a Prometheus that scrapes engines needs one more policy of its own.
"""

from __future__ import annotations

from typing import Any

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.decide.engine_args import is_precise_routing, kv_events_endpoints
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.options import BuildOptions
from kvfleet_operator.runtimes.kubernetes.build.placement import (
    ROUTER_PORT,
    engine_port,
    is_sidecar,
)

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def build_network_policy(pool: InferencePool, options: BuildOptions) -> dict[str, Any]:
    engines = meta.selector(pool, meta.ENGINE)
    port = engine_port(pool)
    engine_ports = [{"protocol": "TCP", "port": port}]
    router_ports = list(engine_ports)
    if pool.spec.engine.kind == "vllm" and is_precise_routing(pool.spec):
        router_ports += [{"protocol": "TCP", "port": p} for p in kv_events_endpoints(port)]
    operator_peer = {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: options.operator_namespace}},
        "podSelector": {"matchLabels": dict(options.operator_pod_labels)},
    }
    if is_sidecar(pool):  # anyone may reach the router sidecars: they are the pool's front
        front: dict[str, Any] = {"ports": [{"protocol": "TCP", "port": ROUTER_PORT}]}
    else:
        routers = meta.selector(pool, meta.ROUTER, meta.ROUTER)
        front = {"from": [{"podSelector": {"matchLabels": routers}}], "ports": router_ports}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta.object_meta(pool, meta.network_policy_name(pool), meta.engine_app(pool),
                                     meta.ENGINE, None),
        "spec": {
            "podSelector": {"matchLabels": engines},
            "policyTypes": ["Ingress"],
            "ingress": [front, {"from": [operator_peer], "ports": engine_ports},
                        {"from": [{"podSelector": {"matchLabels": dict(engines)}}]}],
        },
    }
