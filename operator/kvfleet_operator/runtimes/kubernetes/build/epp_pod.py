"""kvfleet's endpoint picker for `routing.gateway: {kind: gie}`: `kvfleet router
--epp-port 9002`, the router with its ext_proc front, as a Deployment and a Service.

The picker pods are router pods in all but role: they carry `app.kubernetes.io/component:
router` (so the operator finds them with the pool's routers and pushes them the same
versioned config through the same admin API) and `kvfleet.io/role: epp` (so the router
Service, which selects role `router`, never sends them HTTP traffic, and the picker
Service selects only them). TLS on the ext_proc port with a self-signed certificate, as
GIE's reference picker; kubelet's probes use the router's HTTP `/health` (gRPC probes
cannot speak TLS).
"""

from __future__ import annotations

from typing import Any

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.deployment import REVISION_HISTORY, ROLLING
from kvfleet_operator.runtimes.kubernetes.build.placement import ROUTER_PORT
from kvfleet_operator.runtimes.kubernetes.build.router_pod import (
    router_container,
    router_pod_template,
)

EPP = "epp"  # the picker pods' kvfleet.io/role
EPP_APP = "kvfleet-epp"
EPP_PORT = 9002  # GIE's conventional ext_proc port
EPP_PORT_NAME = "grpc-ext-proc"


def epp_name(pool: InferencePool) -> str:
    return f"{pool.name}-epp"


def epp_selector(pool: InferencePool) -> dict[str, str]:
    return meta.selector(pool, meta.ROUTER, EPP)


def epp_container(pool: InferencePool, image: str) -> dict[str, Any]:
    container = router_container(pool, image, workers=False)  # gRPC serves from one process
    container["name"] = EPP
    container["args"] = [*container["args"], "--epp-port", str(EPP_PORT)]
    container["ports"] = [*container["ports"], {"name": EPP_PORT_NAME,
                                                "containerPort": EPP_PORT, "protocol": "TCP"}]
    return container


def epp_pod_template(pool: InferencePool, image: str) -> dict[str, Any]:
    template = router_pod_template(pool, image)
    template["metadata"]["labels"] = meta.labels(pool, EPP_APP, meta.ROUTER, EPP)
    spec = template["spec"]
    spec["containers"] = [epp_container(pool, image)]
    anti = spec["affinity"]["podAntiAffinity"]
    for term in anti["preferredDuringSchedulingIgnoredDuringExecution"]:  # spread pickers
        term["podAffinityTerm"]["labelSelector"] = {"matchLabels": epp_selector(pool)}
    return template


def _meta(pool: InferencePool) -> dict[str, Any]:
    return meta.object_meta(pool, epp_name(pool), EPP_APP, meta.ROUTER, EPP)


def build_epp_deployment(pool: InferencePool, image: str) -> dict[str, Any]:
    """`routing.replicas` pickers; each keeps its own view, as each router does."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(pool),
        "spec": {
            "replicas": pool.spec.routing.replicas,
            "selector": {"matchLabels": epp_selector(pool)},
            "strategy": ROLLING,
            "revisionHistoryLimit": REVISION_HISTORY,
            "progressDeadlineSeconds": 600,
            "template": epp_pod_template(pool, image),
        },
    }


def build_epp_service(pool: InferencePool) -> dict[str, Any]:
    """What the GIE InferencePool's endpointPickerRef names: ext_proc on 9002 (and the
    router's HTTP port, for /metrics)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(pool),
        "spec": {"type": "ClusterIP", "selector": epp_selector(pool), "ports": [
            {"name": EPP_PORT_NAME, "port": EPP_PORT, "targetPort": EPP_PORT_NAME,
             "protocol": "TCP"},
            {"name": "http", "port": ROUTER_PORT, "targetPort": "http", "protocol": "TCP"}]},
    }


def build_epp_pdb(pool: InferencePool) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(pool),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": epp_selector(pool)},
                     "unhealthyPodEvictionPolicy": "AlwaysAllow"}}
