"""The Gateway API Inference Extension side of a pool (`routing.gateway: {kind: gie}`).

`build_gie_inference_pool`: an `inference.networking.k8s.io/v1` InferencePool of the
pool's name, selecting its engine pods (`selector.matchLabels`), on the engine port
(`targetPorts`), whose `endpointPickerRef` is kvfleet's picker Service (epp_pod.py) with
the spec's `failureMode`. A gateway (Istio, kgateway, Envoy Gateway, GKE) with an
HTTPRoute whose backendRef is this InferencePool asks the picker for every request.

`build_gateway_network_policy`: the gateway proxies to engine pods itself, and the picker
probes and scrapes them, so their port opens to any source (the gateway's namespace is
the cluster's business; narrow it with a policy of your own, see docs/gateway.md).
NetworkPolicies add up: the engines' own policy stays as it is.

`gateway_children` is what build_children appends: nothing unless the spec asks. With
`placement: sidecar` it refuses (UnservableSpec): the operator programs sidecar routers
through the engine pods, so a picker Deployment beside them would never get a config.
"""

from __future__ import annotations

from typing import Any

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.epp_pod import (
    EPP_PORT,
    build_epp_deployment,
    build_epp_pdb,
    build_epp_service,
    epp_name,
)
from kvfleet_operator.runtimes.kubernetes.build.errors import UnservableSpec
from kvfleet_operator.runtimes.kubernetes.build.placement import engine_port, is_sidecar

GIE_GROUP = "inference.networking.k8s.io"
GIE_API_VERSION = f"{GIE_GROUP}/v1"
GIE_KIND = "InferencePool"


def gateway_network_policy_name(pool: InferencePool) -> str:
    return f"{pool.name}-gateway"


def build_gie_inference_pool(pool: InferencePool) -> dict[str, Any]:
    gateway = pool.spec.routing.gateway
    assert gateway is not None, "only for pools with routing.gateway"
    return {
        "apiVersion": GIE_API_VERSION,
        "kind": GIE_KIND,
        "metadata": meta.object_meta(pool, pool.name, meta.engine_app(pool), meta.ENGINE, None),
        "spec": {
            "selector": {"matchLabels": meta.selector(pool, meta.ENGINE)},
            "targetPorts": [{"number": engine_port(pool)}],
            "endpointPickerRef": {
                "group": "", "kind": "Service", "name": epp_name(pool),
                "port": {"number": EPP_PORT}, "failureMode": gateway.failure_mode},
        },
    }


def build_gateway_network_policy(pool: InferencePool) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta.object_meta(pool, gateway_network_policy_name(pool),
                                     meta.engine_app(pool), meta.ENGINE, None),
        "spec": {
            "podSelector": {"matchLabels": meta.selector(pool, meta.ENGINE)},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": engine_port(pool)}]}],
        },
    }


def gateway_children(pool: InferencePool, image: str) -> list[dict[str, Any]]:
    """In apply order: the engines' reach, the picker, then the InferencePool naming it."""
    if pool.spec.routing.gateway is None:
        return []
    if is_sidecar(pool):
        raise UnservableSpec("spec.routing.gateway", "needs routing.placement: deployment "
                             "(sidecar routers are programmed through the engine pods, "
                             "which the endpoint picker is not)")
    return [build_gateway_network_policy(pool), build_epp_service(pool), build_epp_pdb(pool),
            build_epp_deployment(pool, image), build_gie_inference_pool(pool)]
