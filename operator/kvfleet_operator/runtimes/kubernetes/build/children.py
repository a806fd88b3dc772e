"""`build_children`: every object the operator owns for one pool, in apply order (Secrets
and the ConfigMap before the pods that mount them; the NetworkPolicy before any engine;
with `routing.kvSharing` on vLLM, the LMCache server before the engines that dial it,
lmcache_server.py; with `routing.gateway`, the GIE InferencePool and kvfleet's picker
last, gie_pool.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.decide.reconcile import initial_replicas
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.configmap import build_router_configmap
from kvfleet_operator.runtimes.kubernetes.build.deployment import (
    build_engine_deployment,
    build_revision_deployment,
    build_router_deployment,
)
from kvfleet_operator.runtimes.kubernetes.build.errors import UnservableSpec
from kvfleet_operator.runtimes.kubernetes.build.gie_pool import gateway_children
from kvfleet_operator.runtimes.kubernetes.build.lmcache_server import lmcache_children
from kvfleet_operator.runtimes.kubernetes.build.network_policy import build_network_policy
from kvfleet_operator.runtimes.kubernetes.build.options import KVFLEET_IMAGE, BuildOptions, Tokens
from kvfleet_operator.runtimes.kubernetes.build.pdb import build_engine_pdb, build_router_pdb
from kvfleet_operator.runtimes.kubernetes.build.placement import is_sidecar
from kvfleet_operator.runtimes.kubernetes.build.secret import (
    build_admin_token_secret,
    build_engine_token_secret,
)
from kvfleet_operator.runtimes.kubernetes.build.service import (
    build_engine_service,
    build_router_peers_service,
    build_router_service,
)


def build_children(
    pool: InferencePool,
    *,
    tokens: Tokens,
    image: str = KVFLEET_IMAGE,
    replicas: Mapping[str, int] | None = None,
    options: BuildOptions | None = None,
) -> list[dict[str, Any]]:
    """`replicas` per engine role: the control loop's desired counts (default: where the
    pool starts, `reconcile.initial_replicas`). Raises `UnservableSpec` for a spec this
    runtime cannot run."""
    options = options or BuildOptions()
    roles = list(pool.spec.topology.roles())
    counts = dict(initial_replicas(pool.spec, pool.status))
    counts.update(replicas or {})
    for role in counts:
        if role not in roles:
            raise UnservableSpec("spec.topology", f"replicas given for {role!r}, which this "
                                 f"pool does not run (roles: {', '.join(roles)})")
    children = [
        build_admin_token_secret(pool, tokens.admin),
        build_engine_token_secret(pool, tokens.engine),
        build_router_configmap(pool),
        build_network_policy(pool, options),
    ]
    for role in roles:
        children += [build_engine_service(pool, role), build_engine_pdb(pool, role)]
    children.append(build_router_service(pool))
    if not is_sidecar(pool):  # the routers' PDB, and their peers' DNS name (the exchange)
        children += [build_router_pdb(pool), build_router_peers_service(pool)]
    children += lmcache_children(pool)  # routing.kvSharing on vLLM: the LMCache server
    # canary / blueGreen: what the pool would run from scratch, one Deployment per role at
    # the spec's revision (the control loop, not the reconcile handler, applies these).
    engine = build_revision_deployment if meta.is_per_revision(pool) else build_engine_deployment
    children += [engine(pool, role, counts[role], image, options) for role in roles]
    if not is_sidecar(pool):  # else every engine pod carries its router
        children.append(build_router_deployment(pool, image))
    children += gateway_children(pool, image)  # routing.gateway: GIE pool + endpoint picker
    return children
