"""The router: `kvfleet router` from kvfleet's image, its bootstrap config from the pool's
ConfigMap, the admin token from a Secret file, the engine token in env (for engines' KV
events). `router_pod_template` is the router Deployment's pod (spread over nodes where it
can be); `router_container` and `router_volumes` are also the sidecar of `placement:
sidecar` engine pods."""

from __future__ import annotations

from typing import Any

from kvfleet_engine.contract import ENGINE_TOKEN_ENV

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.configmap import ROUTER_CONFIG_KEY
from kvfleet_operator.runtimes.kubernetes.build.placement import ROUTER_PORT
from kvfleet_operator.runtimes.kubernetes.build.secret import TOKEN_KEY
from kvfleet_operator.runtimes.kubernetes.build.security import (
    cache_env,
    container_security_context,
    pod_security_context,
    scratch_volumes,
)

CONFIG_DIR = "/etc/kvfleet/router"
ADMIN_TOKEN_DIR = "/var/run/secrets/kvfleet/admin"
ROUTER_SHUTDOWN_S = 30  # the router's own graceful shutdown (kvfleet_router.cli)
PRESTOP_SLEEP_S = 5  # the Service drops the pod from its endpoints before SIGTERM
ROUTER_GRACE_S = PRESTOP_SLEEP_S + ROUTER_SHUTDOWN_S + 10
ROUTER_RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"},
                    "limits": {"memory": "2Gi"}}


def router_args() -> list[str]:
    return ["--host", "0.0.0.0", "--port", str(ROUTER_PORT),
            "--config", f"{CONFIG_DIR}/{ROUTER_CONFIG_KEY}",
            "--admin-token-file", f"{ADMIN_TOKEN_DIR}/{TOKEN_KEY}",
            "--log-level", "info"]


def router_volumes(pool: InferencePool) -> list[dict[str, Any]]:
    """The config and token volumes (the scratch emptyDirs come with the pod)."""
    return [
        {"name": "router-config", "configMap": {"name": meta.router_config_name(pool)}},
        # 0440: readable through fsGroup by the non-root user, by nobody else.
        {"name": "admin-token", "secret": {"secretName": meta.admin_secret_name(pool),
                                           "defaultMode": 0o440}},
    ]


def router_container(pool: InferencePool, image: str) -> dict[str, Any]:
    _, scratch = scratch_volumes()
    mounts = scratch + [
        {"name": "router-config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "admin-token", "mountPath": ADMIN_TOKEN_DIR, "readOnly": True},
    ]
    probe = {"httpGet": {"path": "/health", "port": "http"}, "timeoutSeconds": 5}
    return {
        "name": "router",
        "image": image,
        "command": ["kvfleet", "router"],
        "args": router_args(),
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
        "env": cache_env() + [{"name": ENGINE_TOKEN_ENV, "valueFrom": {"secretKeyRef": {
            "name": meta.engine_secret_name(pool), "key": TOKEN_KEY}}}],
        "resources": ROUTER_RESOURCES,
        "volumeMounts": mounts,
        "securityContext": container_security_context(),
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 6},
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_S)]}}},
    }


def router_pod_template(pool: InferencePool, image: str) -> dict[str, Any]:
    volumes, _ = scratch_volumes()
    spread = {"weight": 100, "podAffinityTerm": {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": meta.selector(pool, meta.ROUTER, meta.ROUTER)}}}
    return {
        "metadata": {"labels": meta.labels(pool, meta.ROUTER_APP, meta.ROUTER, meta.ROUTER)},
        "spec": {
            "containers": [router_container(pool, image)],
            "volumes": volumes + router_volumes(pool),
            "securityContext": pod_security_context(),
            "terminationGracePeriodSeconds": ROUTER_GRACE_S,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "affinity": {"podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [spread]}},
        },
    }
