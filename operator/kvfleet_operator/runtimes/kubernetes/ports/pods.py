"""Pure: a pool's engine Deployments and Pods -> the control loop's replicas.

A replica is an engine pod; its phase comes from what the cluster says, and from the two
annotations kvfleet puts on pods it is taking away:

| pod | phase |
|---|---|
| terminating, annotated `kvfleet.io/stopping`, or phase `Failed`/`Succeeded` | `stopping` |
| annotated `kvfleet.io/draining` or `kvfleet.io/replaced` (and has an IP) | `draining` |
| the engine container waiting in an error state (CrashLoopBackOff, image pull, ...) | `failed` |
| containers ready (`ContainersReady`, else `Ready`), with a pod IP | `ready` |
| anything else | `starting` |

(A `Failed` pod, e.g. evicted, is gone for good: the ReplicaSet replaces it.)

Per role, the Deployment's `spec.replicas` is the truth about how many replicas there are:
when it is ahead of the pods (the ReplicaSet has not created them yet), the missing ones
show as `starting` placeholders named `<deployment>-pending-N`, so the loop does not ask
again; when pods outnumber it (a rollout's surge pod), the surplus, not-ready first, shows
as `stopping`, so the loop does not scale down a rollout.

Rollouts (`rollout_step`): a pod whose `kvfleet.io/template-hash` differs from its
Deployment's template is outdated. Each new pod whose containers are ready but whose
`kvfleet.io/routed` readiness gate is still closed gets one outdated pod as its victim
(annotated `kvfleet.io/replaced`, shown as `draining`, not counted against `spec.replicas`:
it is the old ReplicaSet's, which the Deployment has not scaled down yet). The gate opens
(the new pod turns Ready, the Deployment may remove an old one) only when a victim's drain
is over, or at once when nothing is outdated (a plain scale-up).

Each replica carries its pod's `kvfleet.io/revision` and the Deployment that owns it
(`pod_owner`): a canary or blue-green pool has one engine Deployment per (role, revision),
and its pods name theirs in `kvfleet.io/deployment`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kvfleet_operator.runtimes.kubernetes.build.meta import DEPLOYMENT_LABEL, REVISION_LABEL

DRAINING_ANNOTATION = "kvfleet.io/draining"
STOPPING_ANNOTATION = "kvfleet.io/stopping"
REPLACED_ANNOTATION = "kvfleet.io/replaced"  # a rollout victim: drained before it may go
TEMPLATE_HASH = "kvfleet.io/template-hash"
ROUTED_GATE = "kvfleet.io/routed"
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
    is_replaced: bool = False  # a rollout victim (its replacement waits on its drain)
    revision: str = ""  # its `kvfleet.io/revision` label ("": a pod from before revisions)
    deployment: str = ""  # the engine Deployment that owns it (whose count it is part of)

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


def _condition(pod: Mapping[str, Any], kind: str) -> str | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status"))
    return None


def _is_ready(pod: Mapping[str, Any]) -> bool:
    """Serving: its containers are ready. (`Ready` also waits on kvfleet's own readiness
    gate, which opens only once the routers use the pod.)"""
    containers = _condition(pod, "ContainersReady")
    return (containers if containers is not None else _condition(pod, "Ready")) == "True"


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def _is_going(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp")
                or STOPPING_ANNOTATION in _annotations(pod)
                or (pod.get("status") or {}).get("phase") in TERMINAL)  # fmt: skip


def is_gate_closed(pod: Mapping[str, Any]) -> bool:
    gates = [g.get("conditionType") for g in (pod.get("spec") or {}).get("readinessGates") or []]
    return ROUTED_GATE in gates and _condition(pod, ROUTED_GATE) != "True"


@dataclass(slots=True)
class RolloutStep:
    waiting: list[str]  # new pods, containers ready, readiness gate still closed
    to_open: list[str]  # gates to open now: nothing outdated is left to drain first
    new_victims: list[str]  # outdated pods to drain now, one per waiting pod without one


def rollout_step(pods: Sequence[Mapping[str, Any]], template_hash: str | None) -> RolloutStep:
    """One role's pods and its Deployment's template hash -> what the rollout does next.
    (A victim's end of drain opens one waiting gate: `KubeReplicaRuntime.delete`.)"""
    alive = [p for p in pods if not _is_going(p)]
    waiting = sorted(str(p["metadata"]["name"]) for p in alive
                     if is_gate_closed(p) and _is_ready(p))  # fmt: skip
    outdated = [p for p in alive if template_hash is not None
                and _annotations(p).get(TEMPLATE_HASH) != template_hash]  # fmt: skip
    if not outdated:
        return RolloutStep(waiting=waiting, to_open=waiting, new_victims=[])
    num_victims = sum(REPLACED_ANNOTATION in _annotations(p) for p in outdated)
    spare = sorted((p for p in outdated if REPLACED_ANNOTATION not in _annotations(p)),
                   key=lambda p: (_is_ready(p), int(_annotations(p).get(DELETION_COST, 0)),
                                  str(p["metadata"]["name"])))  # fmt: skip
    num_new = max(0, len(waiting) - num_victims)
    return RolloutStep(waiting=waiting, to_open=[],
                       new_victims=[str(p["metadata"]["name"]) for p in spare[:num_new]])


def pod_owner(pod: Mapping[str, Any], rolling_name: str) -> str:
    """The engine Deployment a pod belongs to: the one its `kvfleet.io/deployment` label
    names (a canary or blue-green pool's per-revision one), else the role's rolling one."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return str(labels.get(DEPLOYMENT_LABEL) or rolling_name)


def pod_replica(pod: Mapping[str, Any], role: str, port: int, deployment: str = "") -> KubeReplica:
    """`deployment`: the role's rolling Deployment (the owner of pods that name none)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    annotations = meta.get("annotations") or {}
    ip = str(status.get("podIP") or "")
    engine = _engine_status(pod)
    failure = _failure(pod)
    is_replaced = REPLACED_ANNOTATION in annotations
    if _is_going(pod):
        state = "stopping"
    elif DRAINING_ANNOTATION in annotations or is_replaced:
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
        is_replaced=is_replaced and state == "draining",
        revision=str((meta.get("labels") or {}).get(REVISION_LABEL) or ""),
        deployment=pod_owner(pod, deployment),
    )


_KEEP_ORDER = {"ready": 0, "draining": 0, "failed": 1, "starting": 2}


def role_replicas(
    role: str, deployment: str, num_replicas: int | None, pods: Sequence[Mapping[str, Any]],
    port: int, now: float, revision: str = "",
) -> list[KubeReplica]:  # fmt: skip
    """One role's replicas; `num_replicas` is the Deployment's `spec.replicas` (None: no
    Deployment yet, so no placeholders); `revision`, the one its placeholders run."""
    replicas = [pod_replica(p, role, port, deployment) for p in pods]
    alive = [r for r in replicas if r.state != "stopping" and not r.is_replaced]
    if num_replicas is None:
        return replicas
    alive.sort(key=lambda r: (_KEEP_ORDER.get(r.state, 3), r.started_at, r.name))
    for surplus in alive[num_replicas:]:
        surplus.state = "stopping"
    missing = max(0, num_replicas - len(alive))
    replicas += [KubeReplica(f"{deployment}{PENDING}{i}", role, "starting", "", now,
                             revision=revision, deployment=deployment)
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
