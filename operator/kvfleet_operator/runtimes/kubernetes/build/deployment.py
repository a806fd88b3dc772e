"""Deployments: one per engine role (or, for canary and blue-green pools, one per engine
role and revision), and the router's (`routing.replicas`).

The operator owns `replicas` (the control loop's desired count; `reconcile.initial_replicas`
when none is given), so these children never live in Git and GitOps has nothing to fight
over. Rollouts add one new pod before removing an old one (maxSurge 1, maxUnavailable 0);
engine pods carry `kvfleet.io/template-hash` so the operator knows which pods are being
replaced, and a readiness gate (`engine_pod.ROUTED_GATE`) so that the ReplicaSet removes an
old pod only after the operator drained it in every router (see `replica_runtime`).

`spec.rollout.strategy: rolling` (the default): one engine Deployment per role,
`<pool>-<role>`, that rolls natively as above. canary and blueGreen: one per role and
revision, `<pool>-<role>-<revision>` (`build_revision_deployment`), built from that
revision's spec, selecting only its own pods (`kvfleet.io/revision` and
`kvfleet.io/deployment`); the control loop creates and scales each, and the runtime deletes
one once it is down to zero with no pods left.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.decide.rollout import revision_of
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.engine_pod import (
    GRACE_MARGIN_S,
    STARTUP_BUDGET_S,
    engine_pod_template,
)
from kvfleet_operator.runtimes.kubernetes.build.options import BuildOptions
from kvfleet_operator.runtimes.kubernetes.build.router_pod import router_pod_template
from kvfleet_operator.runtimes.kubernetes.ports.pods import TEMPLATE_HASH

ROLLING = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
REVISION_HISTORY = 3


def template_hash(template: dict[str, Any]) -> str:
    """A digest of the pod template (before this annotation is added): a pod whose
    annotation differs from its Deployment's is an old one, being rolled."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]


def _deployment(
    metadata: dict[str, Any], replicas: int, match: dict[str, str], template: dict[str, Any],
    progress_deadline_s: int,
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": match},
            "strategy": ROLLING,
            "revisionHistoryLimit": REVISION_HISTORY,
            "progressDeadlineSeconds": progress_deadline_s,
            "template": template,
        },
    }


def build_engine_deployment(
    pool: InferencePool, role: str, replicas: int, image: str, options: BuildOptions
) -> dict[str, Any]:
    """The rolling Deployment of one role, `<pool>-<role>`."""
    metadata = meta.object_meta(pool, meta.engine_name(pool, role), meta.engine_app(pool),
                                meta.ENGINE, role)
    metadata["labels"][meta.REVISION_LABEL] = revision_of(pool.spec)
    template = engine_pod_template(pool, role, image, options)
    template["metadata"]["annotations"][TEMPLATE_HASH] = template_hash(template)
    deadline = STARTUP_BUDGET_S[pool.spec.engine.kind] + GRACE_MARGIN_S * 10
    return _deployment(metadata, replicas, meta.selector(pool, meta.ENGINE, role), template,
                       deadline)


def build_revision_deployment(
    pool: InferencePool, role: str, replicas: int, image: str, options: BuildOptions
) -> dict[str, Any]:
    """The Deployment of one role at the revision of `pool.spec` (a canary or blue-green
    pool's), `<pool>-<role>-<revision>`; its selector picks its own pods only."""
    revision = revision_of(pool.spec)
    name = meta.revision_deployment_name(pool, role, revision)
    own = {meta.REVISION_LABEL: revision, meta.DEPLOYMENT_LABEL: name}
    metadata = meta.object_meta(pool, name, meta.engine_app(pool), meta.ENGINE, role)
    metadata["labels"].update(own)
    template = engine_pod_template(pool, role, image, options)
    template["metadata"]["labels"].update(own)
    template["metadata"]["annotations"][TEMPLATE_HASH] = template_hash(template)
    deadline = STARTUP_BUDGET_S[pool.spec.engine.kind] + GRACE_MARGIN_S * 10
    return _deployment(metadata, replicas, {**meta.selector(pool, meta.ENGINE, role), **own},
                       template, deadline)


def build_router_deployment(pool: InferencePool, image: str) -> dict[str, Any]:
    metadata = meta.object_meta(pool, meta.router_name(pool), meta.ROUTER_APP, meta.ROUTER,
                                meta.ROUTER)
    return _deployment(metadata, pool.spec.routing.replicas,
                       meta.selector(pool, meta.ROUTER, meta.ROUTER),
                       router_pod_template(pool, image), 600)
