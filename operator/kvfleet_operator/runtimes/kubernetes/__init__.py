"""The Kubernetes runtime's pure manifest builders: one InferencePool -> its child objects.

Nothing here does I/O. `build_children(pool, tokens=..., image=...)` returns every child
the operator owns for a pool, in apply order; each kind has its own module:

| module | builds |
|---|---|
| `secret.py` | the router admin token and the engine token Secrets |
| `configmap.py` | the router's bootstrap config (`router_desired.build_router_config`) |
| `network_policy.py` | the engines' ingress policy (router, operator, pool peers) |
| `service.py` | a headless Service per engine role, the router's Service |
| `pdb.py` | a PodDisruptionBudget per engine role and for the router |
| `deployment.py` | an engine Deployment per role, the router Deployment |

The pods inside the Deployments come from `engine_pod.py` and `router_pod.py`, over
`security.py` (the restricted securityContext) and `model_source.py` (volumes, mounts and
env per `model.source` scheme). `meta.py` holds names, labels, selectors and owner
references; `options.py` the build inputs that are not in the spec. `cli.py` is
`kvfleet operator` (`render`, `manifests`, and `run` in `run_cmd.py`).

The running half, over the API:

| module | what |
|---|---|
| `kube_client.py` | `KubeClient` over `kubernetes.aio`: server-side apply, merge patches, lists |
| `tokens.py`, `pool_children.py` | tokens read back or made once; apply every child of a pool |
| `pods.py` | pure: Deployments and Pods -> the loop's replicas |
| `replica_runtime.py` | the `ReplicaRuntime` port (Deployments, Pods, drain annotations) |
| `router_ports.py` | the `RouterControl` port over every router pod |
| `status_store.py` | the `StateStore` port: the pool's status and loop-state annotation |
| `event_sink.py` | the `EventSink` port: core/v1 Events on the pool |
| `pool_loop.py` | one pool's `ControlLoop` over those ports, as kopf's daemon runs it |
| `operator_config.py` | what `run` passes to every pool |
| `operator_manifests.py` | the operator's own RBAC and one-replica Deployment |
"""

from kvfleet_operator.runtimes.kubernetes.build.children import build_children
from kvfleet_operator.runtimes.kubernetes.build.errors import UnservableSpec
from kvfleet_operator.runtimes.kubernetes.build.options import (
    KVFLEET_IMAGE,
    VLLM_IMAGE,
    BuildOptions,
    Tokens,
)

__all__ = [
    "KVFLEET_IMAGE", "VLLM_IMAGE", "BuildOptions", "Tokens", "UnservableSpec", "build_children",
]
