"""Apply every child of a pool (level-based: the same call for create, update and resume).

The engine Deployments keep the `replicas` they have: the control loop owns that count, so
a spec change never resets a scale decision; a role without a Deployment yet starts where
`reconcile.initial_replicas` says (the last desired count in status, so a restart does not
jump). Children are applied in `build_children`'s order, one server-side apply each.

Canary and blue-green pools (`meta.is_per_revision`): their engine Deployments (one per role
and revision) are the control loop's to create, scale and remove, from each revision's own
spec; applying the pool's current template here would replace the stable revision's pods,
so they are left out. Nothing here deletes an engine Deployment either: a rolling pool's
`<pool>-<role>` switched to canary keeps serving until the loop has drained its pods (the
runtime removes it once it is down to zero with none left). A pool switched back to rolling
whose `<pool>-<role>` is gone starts it at the pool's last desired count (status), and the
runtime drains each pod of the revision Deployments as one of its pods turns up, as in any
rollout (`replica_runtime`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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


def is_engine_deployment(child: Mapping[str, Any]) -> bool:
    labels = (child.get("metadata") or {}).get("labels") or {}
    return child.get("kind") == "Deployment" and labels.get(meta.COMPONENT_LABEL) == meta.ENGINE


async def apply_pool(
    client: KubeClient, pool: InferencePool, *, image: str, options: BuildOptions
) -> Tokens:
    """Apply all children; returns the pool's tokens (as now in its Secrets). Raises
    `ApiError` on the first failure (the caller retries the whole, idempotent pass) and
    `UnservableSpec` for a spec this runtime cannot run, before anything is written."""
    tokens = await ensure_tokens(client, pool)
    per_revision = meta.is_per_revision(pool)
    replicas = {} if per_revision else await deployment_replicas(client, pool)
    children = build_children(pool, tokens=tokens, image=image, replicas=replicas,
                              options=options)  # fmt: skip
    for child in children:
        if per_revision and is_engine_deployment(child):
            continue  # the control loop's, per revision
        await client.apply(child)
    return tokens
