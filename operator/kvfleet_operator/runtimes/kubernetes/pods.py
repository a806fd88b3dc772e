"""Pure: a pool's engine Deployments and Pods -> the control loop's replicas.

A replica is an engine pod; its phase comes from what the cluster says, and from the two
annotations kvfleet puts on pods it is taking away:

| pod | phase |
|---|---|
| terminating, annotated `kvfleet.io/stopping`, or phase `Failed`/`Succeeded` | `stopping` |
| annotated `kvfleet.io/draining` (and has an IP) | `draining` |
| the engine container waiting in an error state (CrashLoopBackOff, image pull, ...) | `failed` |
| `Ready` condition true, with a pod IP | `ready` |
| anything else | `starting` |

(A `Failed` pod, e.g. evicted, is gone for good: the ReplicaSet replaces it.)

Per role, the Deployment's `spec.replicas` is the truth about how many replicas there are:
when it is ahead of the pods (the ReplicaSet has not created them yet), the missing ones
show as `starting` placeholders named `<deployment>-pending-N`, so the loop does not ask
again; when pods outnumber it (a rollout's surge pod), the surplus, not-ready first, shows
as `stopping`, so the loop does not scale down a rollout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

DRAINING_ANNOTATION = "kvfleet.io/draining"
STOPPING_ANNOTATION = "kvfleet.io/stopping"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
DRAINING_COST = "-1000"  # the ReplicaSet prefers these when it scales down
VICTIM_COST = "-2147483647"  # the one(s) being removed now: lowest of all
ENGINE_CONTAINER = "engine"
PENDING = "-pending-"
TERMINAL = ("Failed", "Succeeded")  # e.g. evicted: gone for good, the ReplicaSet replaces it
ERROR_WAITING = {"CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "CreateContainerError",
                 "CreateContainerConfigError", "InvalidImageName", "RunContainerError"}


@dataclass(slots=True)
class KubeReplica:
    name: str
    role: str
    state: str
    address: str
    started_at: float
    num_restarts: int = 0
    last_error: str = ""
    pod_ip: str = ""

    @property
    def is_placeholder(self) -> bool:
        return not self.pod_ip and PENDING in self.name


def parse_time(value: Any) -> float:
    if not isinstance(value, str) or not value:
        return 0.0
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _engine_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == ENGINE_CONTAINER:
            return status  # type: ignore[no-any-return]
    return {}


def _failure(pod: Mapping[str, Any]) -> str | None:
    """Why the engine is failing (it is being restarted in place), or None."""
    engine = _engine_status(pod)
    waiting = (engine.get("state") or {}).get("waiting") or {}
    if waiting.get("reason") in ERROR_WAITING:
        last = ((engine.get("lastState") or {}).get("terminated") or {})
        detail = waiting.get("message") or (
            f"exit {last.get('exitCode')}" + (f" ({last['reason']})" if last.get("reason") else "")
            if last else "")
        return f"{waiting['reason']}" + (f": {detail}" if detail else "")
    return None


def _is_ready(pod: Mapping[str, Any]) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def pod_replica(pod: Mapping[str, Any], role: str, port: int) -> KubeReplica:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    annotations = meta.get("annotations") or {}
    ip = str(status.get("podIP") or "")
    engine = _engine_status(pod)
    failure = _failure(pod)
    if meta.get("deletionTimestamp") or STOPPING_ANNOTATION in annotations \
            or status.get("phase") in TERMINAL:  # fmt: skip
        state = "stopping"
    elif DRAINING_ANNOTATION in annotations:
        state = "draining" if ip else "stopping"
    elif failure is not None:
        state = "failed"
    elif _is_ready(pod) and ip:
        state = "ready"
    else:
        state = "starting"
    return KubeReplica(
        name=str(meta.get("name") or ""),
        role=role,
        state=state,
        address=f"http://{ip}:{port}" if ip else "",
        started_at=parse_time(status.get("startTime") or meta.get("creationTimestamp")),
        num_restarts=int(engine.get("restartCount") or 0),
        last_error=failure or "",
        pod_ip=ip,
    )


_KEEP_ORDER = {"ready": 0, "draining": 0, "failed": 1, "starting": 2}


def role_replicas(
    role: str, deployment: str, num_replicas: int | None, pods: Sequence[Mapping[str, Any]],
    port: int, now: float,
) -> list[KubeReplica]:  # fmt: skip
    """One role's replicas; `num_replicas` is the Deployment's `spec.replicas` (None: no
    Deployment yet, so no placeholders)."""
    replicas = [pod_replica(p, role, port) for p in pods]
    alive = [r for r in replicas if r.state != "stopping"]
    if num_replicas is None:
        return replicas
    alive.sort(key=lambda r: (_KEEP_ORDER.get(r.state, 3), r.started_at, r.name))
    for surplus in alive[num_replicas:]:
        surplus.state = "stopping"
    missing = max(0, num_replicas - len(alive))
    replicas += [KubeReplica(f"{deployment}{PENDING}{i}", role, "starting", "", now)
                 for i in range(missing)]  # fmt: skip
    return replicas


def router_urls(pods: Sequence[Mapping[str, Any]], port: int) -> list[str]:
    """Every running router pod (or, with sidecars, every running engine pod), by IP."""
    out = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp") or status.get("phase") != "Running":
            continue
        if status.get("podIP"):
            out.append(f"http://{status['podIP']}:{port}")
    return sorted(out)
