"""The router: `kvfleet router` from kvfleet's image, its bootstrap config from the pool's
ConfigMap, the admin token from a Secret file, the engine token in env (for engines' KV
events), and the client API keys (`routing.flowControl.apiKeysSecretRef`) from the pool's
own Secret, mounted read-only as the router's `--api-keys-file` (a mounted Secret changes
in place, and the router re-reads the file when it does). Its resources are
`routing.resources` over kvfleet's defaults, and it runs `--workers N` router processes
(`routing.workers`, else one per whole core of its CPU request, up to 8:
`decide.router_process`); the flag is left out at 1, and the endpoint picker runs one
(its gRPC port takes no second process). `router_pod_template` is the
router Deployment's pod (spread over nodes where it can be); `router_container` and
`router_volumes` are also the sidecar of `placement: sidecar` engine pods and the GIE
endpoint picker's."""

from __future__ import annotations

from typing import Any

from kvfleet_engine.contract import ENGINE_TOKEN_ENV

from kvfleet_operator.api.flow_control import SecretKeyRef
from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.decide.router_process import router_resources, router_workers
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
API_KEYS_DIR = "/var/run/secrets/kvfleet/api-keys"
API_KEYS_FILE = "keys.yaml"  # the Secret's key, mounted under this name
ROUTER_SHUTDOWN_S = 30  # the router's own graceful shutdown (kvfleet_router.cli)
PRESTOP_SLEEP_S = 5  # the Service drops the pod from its endpoints before SIGTERM
ROUTER_GRACE_S = PRESTOP_SLEEP_S + ROUTER_SHUTDOWN_S + 10


def api_keys_ref(pool: InferencePool) -> SecretKeyRef | None:
    fc = pool.spec.routing.flow_control
    return fc.api_keys_secret_ref if fc is not None else None


def router_args(pool: InferencePool | None = None, *, workers: bool = True) -> list[str]:
    """`workers=False`: one process whatever the pool says (the endpoint picker)."""
    keys = ["--api-keys-file", f"{API_KEYS_DIR}/{API_KEYS_FILE}"] \
        if pool is not None and api_keys_ref(pool) is not None else []  # fmt: skip
    n = router_workers(pool.spec) if pool is not None and workers else 1
    return ["--host", "0.0.0.0", "--port", str(ROUTER_PORT),
            "--config", f"{CONFIG_DIR}/{ROUTER_CONFIG_KEY}",
            "--admin-token-file", f"{ADMIN_TOKEN_DIR}/{TOKEN_KEY}",
            *keys, *(["--workers", str(n)] if n > 1 else []), "--log-level", "info"]


def router_volumes(pool: InferencePool) -> list[dict[str, Any]]:
    """The config, token and API-keys volumes (the scratch emptyDirs come with the pod)."""
    volumes: list[dict[str, Any]] = [
        {"name": "router-config", "configMap": {"name": meta.router_config_name(pool)}},
        # 0440: readable through fsGroup by the non-root user, by nobody else.
        {"name": "admin-token", "secret": {"secretName": meta.admin_secret_name(pool),
                                           "defaultMode": 0o440}},
    ]
    if (ref := api_keys_ref(pool)) is not None:  # the user's Secret: only its one key
        volumes.append({"name": "api-keys", "secret": {
            "secretName": ref.name, "defaultMode": 0o440,
            "items": [{"key": ref.key, "path": API_KEYS_FILE}]}})
    return volumes


def router_container(pool: InferencePool, image: str, *, workers: bool = True) -> dict[str, Any]:
    _, scratch = scratch_volumes()
    mounts = scratch + [
        {"name": "router-config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "admin-token", "mountPath": ADMIN_TOKEN_DIR, "readOnly": True},
    ]
    if api_keys_ref(pool) is not None:  # no subPath: the file follows Secret updates
        mounts.append({"name": "api-keys", "mountPath": API_KEYS_DIR, "readOnly": True})
    probe = {"httpGet": {"path": "/health", "port": "http"}, "timeoutSeconds": 5}
    return {
        "name": "router",
        "image": image,
        "command": ["kvfleet", "router"],
        "args": router_args(pool, workers=workers),
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
        "env": cache_env() + [{"name": ENGINE_TOKEN_ENV, "valueFrom": {"secretKeyRef": {
            "name": meta.engine_secret_name(pool), "key": TOKEN_KEY}}}],
        "resources": router_resources(pool.spec),
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
