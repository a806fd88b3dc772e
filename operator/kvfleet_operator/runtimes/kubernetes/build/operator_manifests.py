"""The operator's own manifests: ServiceAccount, RBAC (least privilege, no `*`), and a
single-replica Deployment with `strategy: Recreate`.

kopf has no leader election. kvfleet runs it standalone and relies on there being exactly
one operator pod: `replicas: 1` and `Recreate` (the old pod is gone before a new one starts,
so a rollout never has two operators acting). A crashed pod is replaced by the Deployment;
the pools' loop state lives on the pools, so the new one carries on.

`RBAC_RULES` is the one list of what the operator may do; `docs/operator.md`'s table is
checked against it.
"""

from __future__ import annotations

from typing import Any

from kvfleet_operator.runtimes.kubernetes.build.options import (
    KVFLEET_IMAGE,
    OPERATOR_NAMESPACE,
    OPERATOR_POD_LABELS,
)
from kvfleet_operator.runtimes.kubernetes.build.security import (
    container_security_context,
    pod_security_context,
)

NAME = "kvfleet-operator"
LIVENESS_PORT = 8080
METRICS_PORT = 9090

# (apiGroup, resource, verbs, why)
RBAC_RULES: list[tuple[str, str, tuple[str, ...], str]] = [
    ("kvfleet.io", "inferencepools", ("get", "list", "watch", "patch"),
     "watch pools; kopf's finalizer and progress annotations, the loop-state annotation"),
    ("kvfleet.io", "inferencepools/status", ("patch",), "conditions, replicas, decisions"),
    ("", "secrets", ("get", "create", "patch"), "read back and apply the two token Secrets"),
    ("", "configmaps", ("create", "patch"), "apply the router's bootstrap config"),
    ("", "services", ("create", "patch"), "apply the engine and router Services"),
    ("apps", "deployments", ("get", "list", "watch", "create", "patch"),
     "apply engine and router Deployments; read and set engine replicas"),
    ("policy", "poddisruptionbudgets", ("create", "patch"), "apply the PDBs"),
    ("networking.k8s.io", "networkpolicies", ("create", "patch"), "apply the engines' policy"),
    ("inference.networking.k8s.io", "inferencepools", ("create", "patch"),
     "apply the GIE InferencePool of a pool with routing.gateway"),
    ("", "pods", ("list", "watch", "patch", "delete"),
     "observe replicas; drain and deletion-cost annotations; remove a victim the "
     "ReplicaSet kept"),
    ("", "pods/status", ("patch",),
     "open the `kvfleet.io/routed` readiness gate once a pod is routed (and, in a rollout, "
     "the pod it replaces drained)"),
    ("", "events", ("create",), "Events on the pools (kvfleet's and kopf's)"),
    ("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch"),
     "kopf notices the InferencePool CRD appear or change"),
    ("", "namespaces", ("list", "watch"), "kopf, when watching several namespaces"),
]


def _rules() -> list[dict[str, Any]]:
    return [{"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}
            for group, resource, verbs, _ in RBAC_RULES]  # fmt: skip


def _labels() -> dict[str, str]:
    return {**OPERATOR_POD_LABELS, "app.kubernetes.io/part-of": "kvfleet",
            "app.kubernetes.io/component": "operator"}  # fmt: skip


def build_operator_manifests(
    namespace: str = OPERATOR_NAMESPACE, image: str = KVFLEET_IMAGE
) -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole, ClusterRoleBinding and the Deployment, in apply order."""
    meta = {"name": NAME, "namespace": namespace, "labels": _labels()}
    cluster_meta = {"name": NAME, "labels": _labels()}
    probe = {"httpGet": {"path": "/healthz", "port": LIVENESS_PORT},
             "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6}  # fmt: skip
    container = {
        "name": "operator",
        "image": image,
        "command": ["kvfleet"],
        "args": ["operator", "run", "--all-namespaces",
                 "--liveness", f"http://0.0.0.0:{LIVENESS_PORT}/healthz",
                 "--metrics-port", str(METRICS_PORT), "--operator-namespace", namespace],
        "ports": [{"name": "liveness", "containerPort": LIVENESS_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "livenessProbe": probe,
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                      "limits": {"memory": "512Mi"}},
        "securityContext": container_security_context(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }  # fmt: skip
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": cluster_meta, "rules": _rules()},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": cluster_meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": NAME},
         "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}]},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
         "spec": {
             "replicas": 1,  # exactly one: kopf has no leader election
             "strategy": {"type": "Recreate"},  # never two at once, not even in a rollout
             "selector": {"matchLabels": dict(OPERATOR_POD_LABELS)},
             "template": {
                 "metadata": {"labels": _labels()},
                 "spec": {"serviceAccountName": NAME,
                          "securityContext": pod_security_context(),
                          "containers": [container],
                          "volumes": [{"name": "tmp", "emptyDir": {}}]},
             }}},
    ]  # fmt: skip
