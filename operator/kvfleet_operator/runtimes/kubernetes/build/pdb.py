"""PodDisruptionBudgets: node drains evict at most one pod of a role at a time. The
operator's own scale-down lowers `replicas` after draining; it never goes through
evictions, so these budgets never block it. Pods that are not ready (still loading a
model) may always be evicted, so a stuck pod never blocks a node drain."""

from __future__ import annotations

from typing import Any

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.runtimes.kubernetes.build import meta


def _pdb(metadata: dict[str, Any], match: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": metadata,
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": match},
                     "unhealthyPodEvictionPolicy": "AlwaysAllow"}}


def build_engine_pdb(pool: InferencePool, role: str) -> dict[str, Any]:
    metadata = meta.object_meta(pool, meta.engine_name(pool, role), meta.engine_app(pool),
                                meta.ENGINE, role)
    return _pdb(metadata, meta.selector(pool, meta.ENGINE, role))


def build_router_pdb(pool: InferencePool) -> dict[str, Any]:
    metadata = meta.object_meta(pool, meta.router_name(pool), meta.ROUTER_APP, meta.ROUTER,
                                meta.ROUTER)
    return _pdb(metadata, meta.selector(pool, meta.ROUTER, meta.ROUTER))
