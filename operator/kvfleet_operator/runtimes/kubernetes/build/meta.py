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
# The engine template a pod runs (`decide.rollout.revision_of` of the spec it was built from).
REVISION_LABEL = "kvfleet.io/revision"
# Canary and blue-green pools run one engine Deployment per (role, revision); its pods carry
# its name here, so the runtime knows which Deployment owns each pod (pods of the rolling
# Deployment `<pool>-<role>` carry none).
DEPLOYMENT_LABEL = "kvfleet.io/deployment"
PER_REVISION_STRATEGIES = ("canary", "blueGreen")
COMPONENT_LABEL = "app.kubernetes.io/component"
ROUTER_APP = "kvfleet-router"


def engine_app(pool: InferencePool) -> str:
    """`app.kubernetes.io/name` of the engine pods: the program they run."""
    return "vllm" if pool.spec.engine.kind == "vllm" else "kvfleet-engine"


def engine_name(pool: InferencePool, role: str) -> str:
    return f"{pool.name}-{role}"  # Deployment, headless Service and PDB of one role


def revision_deployment_name(pool: InferencePool, role: str, revision: str) -> str:
    """A canary or blue-green pool's Deployment of one role at one revision. At most
    40 (pool) + 1 + 7 (role) + 1 + 10 (revision) = 59 characters: a label value (<= 63),
    and its pods' names (the ReplicaSet's hash and 5 random characters added) are cut by
    the API server's generateName as for any Deployment."""
    return f"{pool.name}-{role}-{revision}"


def is_per_revision(pool: InferencePool) -> bool:
    """Does this pool run one engine Deployment per (role, revision) (`spec.rollout.strategy`
    canary or blueGreen), rather than one per role that rolls natively (rolling)?"""
    return pool.spec.rollout.strategy in PER_REVISION_STRATEGIES


def router_name(pool: InferencePool) -> str:
    return f"{pool.name}-router"


def router_peers_name(pool: InferencePool) -> str:
    """The routers' headless Service: how router replicas find each other (the exchange)."""
    return f"{pool.name}-router-peers"  # <= 40 + 13 characters: a DNS label


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
