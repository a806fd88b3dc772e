"""The Kubernetes runtime: the control loop's ports over the Kubernetes API, driven by kopf.

- `build/`: pure manifest builders (one InferencePool -> its child objects; no I/O).
- `ports/`: the ports over the API:

| module | what |
|---|---|
| `kube_client.py` | `KubeClient` over `kubernetes.aio`: server-side apply, merge patches, lists |
| `tokens.py`, `pool_children.py` | tokens read back or made once; apply every child of a pool |
| `pods.py` | pure: Deployments and Pods -> the loop's replicas |
| `replica_runtime.py` | the `ReplicaRuntime` port (Deployments, Pods, drain annotations) |
| `router_ports.py` | the `RouterControl` port over every router pod |
| `status_store.py` | the `StateStore` port: the pool's status and loop-state annotation |
| `event_sink.py` | the `EventSink` port: core/v1 Events on the pool |

- Beside them: `pool_loop.py` (one pool's `ControlLoop` over those ports, as kopf's daemon
  runs it), `handlers.py` (the kopf wiring), `run_cmd.py` (`kvfleet operator run`),
  `operator_config.py` (what `run` passes to every pool), `operator_metrics.py`.
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
