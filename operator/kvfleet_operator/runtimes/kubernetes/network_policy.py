"""The engines' NetworkPolicy: a pool's engine pods accept traffic only from

- the pool's router pods (the OpenAI API and KV events, on the engine port),
- the operator's pods (health and `/metrics` scrapes, on the engine port),
- their own pool's engine pods, on any port (P/D KV transfer: kvfleet's HTTP pull, or
  vLLM's NIXL side channel and its UCX transports on ports of their own).

NetworkPolicies add up: a Prometheus that scrapes engines needs one more policy of its own.
"""

from __future__ import annotations

from typing import Any

from kvfleet_operator.api.pool import InferencePool

from . import meta
from .engine_pod import ENGINE_PORT
from .options import BuildOptions

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def build_network_policy(pool: InferencePool, options: BuildOptions) -> dict[str, Any]:
    engines = meta.selector(pool, meta.ENGINE)
    engine_port = [{"protocol": "TCP", "port": ENGINE_PORT}]
    operator_peer = {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: options.operator_namespace}},
        "podSelector": {"matchLabels": dict(options.operator_pod_labels)},
    }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta.object_meta(pool, meta.network_policy_name(pool), meta.engine_app(pool),
                                     meta.ENGINE, None),
        "spec": {
            "podSelector": {"matchLabels": engines},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": meta.selector(
                    pool, meta.ROUTER, meta.ROUTER)}}], "ports": engine_port},
                {"from": [operator_peer], "ports": engine_port},
                {"from": [{"podSelector": {"matchLabels": dict(engines)}}]},
            ],
        },
    }
