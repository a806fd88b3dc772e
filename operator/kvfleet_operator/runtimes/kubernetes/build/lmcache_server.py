"""The LMCache server of a vLLM pool with `routing.kvSharing` (operator/lmcache.py): one
more child of the pool, built only for such pools.

- Deployment `<pool>-lmcache`: one pod running `lmcache_server 0.0.0.0 65432 cpu` (a KV
  store in CPU memory) from the engines' own image (it carries LMCache), non-root with a
  read-only root filesystem (scratch emptyDirs for /tmp and the cache home), CPU and
  memory requests, a memory limit, TCP probes on its port, no service-account token.
- Service `<pool>-lmcache` (ClusterIP, port 65432): the engines' `LMCACHE_REMOTE_URL`
  (`lmcache_remote_url`).
- NetworkPolicy `<pool>-lmcache`: only the pool's engine pods reach it, on that port.

Its pods carry `app.kubernetes.io/component: kv-cache`, so no engine or router selector
ever picks them. The stored KV lives in the pod's memory: a restart empties it (the
engines then recompute, as without sharing).
"""

from __future__ import annotations

from typing import Any

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.decide.lmcache import (
    LMCACHE_PORT,
    is_lmcache,
    lmcache_server_args,
    lmcache_url,
)
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.security import (
    cache_env,
    container_security_context,
    pod_security_context,
    scratch_volumes,
)

KV_CACHE = "kv-cache"  # the component label of the LMCache pods
LMCACHE_APP = "lmcache"
PORT_NAME = "lmcache"
REVISION_HISTORY = 3  # as the other Deployments (deployment.py)
RESOURCES = {"requests": {"cpu": "2", "memory": "16Gi"}, "limits": {"memory": "20Gi"}}


def lmcache_name(pool: InferencePool) -> str:
    return f"{pool.name}-lmcache"


def lmcache_remote_url(pool: InferencePool) -> str | None:
    """What the engines' LMCACHE_REMOTE_URL names, or None for a pool without LMCache."""
    if not is_lmcache(pool.spec):
        return None
    return lmcache_url(f"{lmcache_name(pool)}.{pool.namespace}.svc")


def _selector(pool: InferencePool) -> dict[str, str]:
    return meta.selector(pool, KV_CACHE)


def _meta(pool: InferencePool) -> dict[str, Any]:
    return meta.object_meta(pool, lmcache_name(pool), LMCACHE_APP, KV_CACHE, None)


def _probe(period_s: int, failures: int) -> dict[str, Any]:
    return {"tcpSocket": {"port": PORT_NAME}, "periodSeconds": period_s,
            "timeoutSeconds": 5, "failureThreshold": failures}


def lmcache_container(pool: InferencePool) -> dict[str, Any]:
    _, mounts = scratch_volumes()
    return {
        "name": LMCACHE_APP,
        "image": pool.spec.engine.image,  # required with kvSharing on vLLM (spec.py)
        "command": ["lmcache_server"],
        "args": lmcache_server_args(LMCACHE_PORT),
        "ports": [{"name": PORT_NAME, "containerPort": LMCACHE_PORT, "protocol": "TCP"}],
        "env": [*cache_env(), {"name": "PYTHONHASHSEED", "value": "0"}],
        "resources": RESOURCES,
        "volumeMounts": mounts,
        "securityContext": container_security_context(),
        "startupProbe": _probe(5, 60),
        "readinessProbe": _probe(5, 2),
        "livenessProbe": _probe(10, 6),
    }


def build_lmcache_deployment(pool: InferencePool) -> dict[str, Any]:
    volumes, _ = scratch_volumes()
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(pool),
        "spec": {
            "replicas": 1,  # one store: every engine must see the same chunks
            "selector": {"matchLabels": _selector(pool)},
            "strategy": {"type": "Recreate"},
            "revisionHistoryLimit": REVISION_HISTORY,
            "template": {
                "metadata": {"labels": meta.labels(pool, LMCACHE_APP, KV_CACHE, None)},
                "spec": {
                    "containers": [lmcache_container(pool)],
                    "volumes": volumes,
                    "securityContext": pod_security_context(),
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                },
            },
        },
    }


def build_lmcache_service(pool: InferencePool) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(pool),
        "spec": {"type": "ClusterIP", "selector": _selector(pool),
                 "ports": [{"name": PORT_NAME, "port": LMCACHE_PORT, "targetPort": PORT_NAME,
                            "protocol": "TCP"}]},
    }


def build_lmcache_network_policy(pool: InferencePool) -> dict[str, Any]:
    engines = meta.selector(pool, meta.ENGINE)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(pool),
        "spec": {
            "podSelector": {"matchLabels": _selector(pool)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": engines}}],
                         "ports": [{"protocol": "TCP", "port": LMCACHE_PORT}]}],
        },
    }


def lmcache_children(pool: InferencePool) -> list[dict[str, Any]]:
    """In apply order (the store before the engines that dial it); none without LMCache."""
    if not is_lmcache(pool.spec):
        return []
    return [build_lmcache_network_policy(pool), build_lmcache_service(pool),
            build_lmcache_deployment(pool)]
