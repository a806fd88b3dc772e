"""Names, labels, selectors and owner references shared by every child of a pool."""

from __future__ import annotations

from typing import Any

from kvfleet_operator.api.pool import API_VERSION, KIND, InferencePool

ENGINE = "engine"
ROUTER = "router"
PART_OF = "kvfleet"
MANAGED_BY = "kvfleet"
POOL_LABEL = "kvfleet.io/pool"
ROLE_LABEL = "kvfleet.io/role"
COMPONENT_LABEL = "app.kubernetes.io/component"
ROUTER_APP = "kvfleet-router"


def engine_app(pool: InferencePool) -> str:
    """`app.kubernetes.io/name` of the engine pods: the program they run."""
    return "vllm" if pool.spec.engine.kind == "vllm" else "kvfleet-engine"


def engine_name(pool: InferencePool, role: str) -> str:
    return f"{pool.name}-{role}"  # Deployment, headless Service and PDB of one role


def router_name(pool: InferencePool) -> str:
    return f"{pool.name}-router"


def router_config_name(pool: InferencePool) -> str:
    return f"{pool.name}-router-config"


def admin_secret_name(pool: InferencePool) -> str:
    return f"{pool.name}-router-admin-token"


def engine_secret_name(pool: InferencePool) -> str:
    return f"{pool.name}-engine-token"


def network_policy_name(pool: InferencePool) -> str:
    return f"{pool.name}-engines"


def selector(pool: InferencePool, component: str, role: str | None = None) -> dict[str, str]:
    """The labels that pick a pool's pods: all its engines, one role's, or its routers."""
    out = {POOL_LABEL: pool.name, COMPONENT_LABEL: component}
    if role is not None:
        out[ROLE_LABEL] = role
    return out


def labels(pool: InferencePool, app: str, component: str, role: str | None) -> dict[str, str]:
    """The common labels. `kvfleet.io/role` is set on children of one role (an engine role,
    or `router`) and left off the pool-wide engine children (engine token, NetworkPolicy)."""
    out = {
        "app.kubernetes.io/name": app,
        "app.kubernetes.io/instance": pool.name,
        COMPONENT_LABEL: component,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        POOL_LABEL: pool.name,
    }
    if role is not None:
        out[ROLE_LABEL] = role
    return out


def owner_reference(pool: InferencePool) -> dict[str, Any]:
    if not pool.uid:
        raise ValueError(f"pool {pool.name} has no uid: owner references need one")
    return {"apiVersion": API_VERSION, "kind": KIND, "name": pool.name, "uid": pool.uid,
            "controller": True, "blockOwnerDeletion": True}


def object_meta(
    pool: InferencePool, name: str, app: str, component: str, role: str | None
) -> dict[str, Any]:
    return {"name": name, "namespace": pool.namespace,
            "labels": labels(pool, app, component, role),
            "ownerReferences": [owner_reference(pool)]}
