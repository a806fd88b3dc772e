"""Apply every child of a pool (level-based: the same call for create, update and resume).

The engine Deployments keep the `replicas` they have: the control loop owns that count, so
a spec change never resets a scale decision; a role without a Deployment yet starts where
`reconcile.initial_replicas` says (the last desired count in status, so a restart does not
jump). Children are applied in `build_children`'s order, one server-side apply each.
"""

from __future__ import annotations

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.children import build_children
from kvfleet_operator.runtimes.kubernetes.build.options import BuildOptions, Tokens
from kvfleet_operator.runtimes.kubernetes.ports.kube_client import KubeClient, object_path
from kvfleet_operator.runtimes.kubernetes.ports.tokens import ensure_tokens


async def deployment_replicas(client: KubeClient, pool: InferencePool) -> dict[str, int]:
    """`spec.replicas` of each engine Deployment that exists."""
    out: dict[str, int] = {}
    for role in pool.spec.topology.roles():
        path = object_path("apps/v1", "Deployment", pool.namespace, meta.engine_name(pool, role))
        found = await client.get(path)
        replicas = ((found or {}).get("spec") or {}).get("replicas")
        if isinstance(replicas, int) and not isinstance(replicas, bool) and replicas >= 0:
            out[role] = replicas
    return out


async def apply_pool(
    client: KubeClient, pool: InferencePool, *, image: str, options: BuildOptions
) -> Tokens:
    """Apply all children; returns the pool's tokens (as now in its Secrets). Raises
    `ApiError` on the first failure (the caller retries the whole, idempotent pass) and
    `UnservableSpec` for a spec this runtime cannot run, before anything is written."""
    tokens = await ensure_tokens(client, pool)
    replicas = await deployment_replicas(client, pool)
    children = build_children(pool, tokens=tokens, image=image, replicas=replicas,
                              options=options)  # fmt: skip
    for child in children:
        await client.apply(child)
    return tokens
