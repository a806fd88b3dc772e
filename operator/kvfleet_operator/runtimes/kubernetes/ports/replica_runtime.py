"""The loop's `ReplicaRuntime` port over Deployments and Pods.

- `supervise()` reads the pool's engine Deployments and Pods (and router pods) from kopf's
  indexes (`pool_index.PoolIndexes`, fed by its watches: no API call) once per tick;
  `replicas()` answers from that (`pods.role_replicas`). Each write's answer stands in for
  the indexed object until the index shows it (`pool_index.OwnWrites`), so the loop always
  sees its own last change and never acts twice on a view from before it.
- `create` applies the role's Deployment (the full manifest from `build_engine_deployment`,
  server-side apply) with one more replica; the ReplicaSet starts the pod. A Deployment
  that went away is applied again (one not made yet is the reconcile handler's).
- `mark_draining` annotates the pod `kvfleet.io/draining` and gives it a low
  `controller.kubernetes.io/pod-deletion-cost`; `mark_ready` takes both off.
- `delete` marks the victim `kvfleet.io/stopping` with the lowest deletion cost, then applies
  the Deployment with one replica fewer, so the ReplicaSet removes that pod (the kubelet
  then gives it `terminationGracePeriodSeconds`, which the builders set above the drain
  timeout). A placeholder (a replica the ReplicaSet has not created yet) only lowers the
  count. A victim still there, not terminating, `grace_s` after it was marked means the
  ReplicaSet removed another pod: that is reported as a warning event and the victim, which
  the routers no longer use, is deleted.
- Rollouts (`pods.rollout_step`): a new pod whose containers are ready waits behind its
  `kvfleet.io/routed` readiness gate; `supervise` gives it an outdated pod as its victim
  (`kvfleet.io/replaced`, reported `draining`), so the loop pushes that pod as draining to
  every router and waits for its drain exactly as for a scale-down. `delete` of a victim
  does not lower `replicas`: it marks the victim `kvfleet.io/stopping` with the lowest
  deletion cost and opens one waiting gate; the new pod turns Ready and only then does the
  Deployment scale the old ReplicaSet down, removing the drained victim. With nothing
  outdated (a scale-up) gates open as soon as the containers are ready.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.api.status import rfc3339
from kvfleet_operator.decide.reconcile import RolePlan
from kvfleet_operator.loop import events as ev
from kvfleet_operator.loop.ports import EventSink
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.deployment import build_engine_deployment
from kvfleet_operator.runtimes.kubernetes.build.options import BuildOptions
from kvfleet_operator.runtimes.kubernetes.build.placement import (
    ROUTER_PORT,
    engine_port,
    is_sidecar,
)
from kvfleet_operator.runtimes.kubernetes.ports.kube_client import (
    ApiError,
    KubeClient,
    object_path,
)
from kvfleet_operator.runtimes.kubernetes.ports.pods import (
    DELETION_COST,
    DRAINING_ANNOTATION,
    DRAINING_COST,
    REPLACED_ANNOTATION,
    ROUTED_GATE,
    STOPPING_ANNOTATION,
    TEMPLATE_HASH,
    VICTIM_COST,
    KubeReplica,
    parse_time,
    role_replicas,
    rollout_step,
    router_urls,
)
from kvfleet_operator.runtimes.kubernetes.ports.pool_index import (
    OwnWrites,
    PoolIndexes,
    is_engine,
    slim_deployment,
    slim_pod,
)


class KubeReplicaRuntime:
    def __init__(
        self, client: KubeClient, pool: InferencePool, *, image: str, options: BuildOptions,
        events: EventSink, indexes: PoolIndexes, clock: Callable[[], float] = time.time,
        own_writes: OwnWrites | None = None,
    ) -> None:  # fmt: skip
        self.client = client
        self.pool = pool
        self.image = image
        self.options = options
        self.events = events
        self.indexes = indexes
        self.clock = clock
        # A rebuilt runtime (a spec change) passes the last one's on, so it sees its writes.
        self.own = own_writes if own_writes is not None else OwnWrites()
        self.counts: dict[str, int | None] = {}  # each Deployment's spec.replicas (None: none)
        self._deployments: dict[str, dict[str, Any]] = {}
        self._replicas: list[KubeReplica] = []
        self._pods: dict[str, dict[str, Any]] = {}
        self.router_urls: list[str] = []
        self._reported: set[str] = set()
        self._seen: set[str] = set()  # roles whose Deployment this runtime has seen
        self._waiting: dict[str, list[str]] = {}  # per role, new pods behind their gate

    # --- observing ------------------------------------------------------------------------

    async def supervise(self) -> None:
        pool = self.pool
        indexed_deployments, indexed_pods = self.indexes.read(pool.namespace, pool.name)
        deployments = self.own.view("Deployment", indexed_deployments)
        all_pods = self.own.view("Pod", indexed_pods)
        by_name = self._deployments = {d["metadata"]["name"]: d for d in deployments}
        pods = [p for p in all_pods if is_engine(p)]
        now = self.clock()
        self._pods = {p["metadata"]["name"]: p for p in pods}
        replicas: list[KubeReplica] = []
        roles = list(pool.spec.topology.roles())
        # Roles the spec no longer has (a topology change) stay observed, so the loop drains
        # their replicas away and their Deployments go down to zero.
        roles += sorted({(d["metadata"].get("labels") or {}).get(meta.ROLE_LABEL, "")
                         for d in deployments} - set(roles) - {""})  # fmt: skip
        for role in roles:
            name = meta.engine_name(pool, role)
            found = by_name.get(name)
            count = (found.get("spec") or {}).get("replicas") if found else None
            self.counts[role] = count if isinstance(count, int) else None
            if found:
                self._seen.add(role)
            names = [n for n, p in self._pods.items()
                     if (p["metadata"].get("labels") or {}).get(meta.ROLE_LABEL) == role]
            await self._roll(role, found, [self._pods[n] for n in names])
            mine = [self._pods[n] for n in names]  # as `_roll` left them (its writes)
            replicas += role_replicas(role, name, self.counts[role], mine, engine_port(pool), now)
        self._replicas = replicas
        if is_sidecar(pool):
            self.router_urls = router_urls(pods, ROUTER_PORT)
        else:
            routers = [p for p in all_pods if (p["metadata"].get("labels") or {})
                       .get(meta.COMPONENT_LABEL) == meta.ROUTER]  # fmt: skip
            self.router_urls = router_urls(routers, ROUTER_PORT)
        await self._check_victims(now)

    async def _roll(self, role: str, deployment: dict[str, Any] | None,
                    pods: list[dict[str, Any]]) -> None:  # fmt: skip
        template = ((deployment or {}).get("spec") or {}).get("template") or {}
        current = ((template.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_HASH)
        step = rollout_step(pods, current)
        for name in step.new_victims:
            annotations: dict[str, str | None] = {REPLACED_ANNOTATION: _stamp(self.clock()),
                                                  DELETION_COST: DRAINING_COST}  # fmt: skip
            await self._annotate(name, annotations)
            self._say(ev.EventReason.REPLICA_DRAINING,
                      f"rollout: drain {name} before the Deployment replaces it")
        for name in step.to_open:
            await self._open_gate(name)
        self._waiting[role] = [n for n in step.waiting if n not in step.to_open]

    async def _open_gate(self, name: str) -> None:
        """The pod is routed (and whatever it replaces drained): let it turn Ready."""
        path = object_path("v1", "Pod", self.pool.namespace, name) + "/status"
        condition = {"type": ROUTED_GATE, "status": "True",
                     "lastTransitionTime": _stamp(self.clock())}  # fmt: skip
        answer = await self.client.strategic_patch(path, {"status": {"conditions": [condition]}})
        self._wrote_pod(name, answer)

    def _wrote_pod(self, name: str, answer: Any) -> bool:
        """Our write's answer is the pod from now on, here and until the index shows it."""
        written = self.own.remember("Pod", answer, self._pods.get(name), slim_pod)
        if written is not None and name in self._pods:
            self._pods[name] = written
        return written is not None

    def replicas(self) -> list[KubeReplica]:
        return list(self._replicas)

    def routers(self) -> list[str]:
        """Base URLs of the router pods seen by the last `supervise`."""
        return list(self.router_urls)

    # --- changing -------------------------------------------------------------------------

    async def _apply_count(self, role: str, count: int) -> None:
        count = max(0, count)
        name = meta.engine_name(self.pool, role)
        if role in self.pool.spec.topology.roles():
            answer = await self.client.apply(build_engine_deployment(
                self.pool, role, count, self.image, self.options))  # fmt: skip
        else:  # a role the spec dropped: nothing to build it from; only its count goes down
            path = object_path("apps/v1", "Deployment", self.pool.namespace, name)
            answer = await self.client.merge_patch(path, {"spec": {"replicas": count}})
        self.own.remember("Deployment", answer, self._deployments.get(name), slim_deployment)
        self.counts[role] = count

    async def create(self, spec: PoolSpec, plan: RolePlan) -> None:
        """One more replica. A Deployment not made yet is the reconcile handler's to make;
        one that went away (deleted by hand) is applied again, with the replicas asked for."""
        if plan.role not in self._seen:
            return
        count = (self.counts.get(plan.role) or 0) + 1
        await self._apply_count(plan.role, count)
        self._say(ev.EventReason.REPLICA_STARTED,
                  f"scale {meta.engine_name(self.pool, plan.role)} to {count}")

    async def _annotate(self, name: str, annotations: dict[str, str | None]) -> None:
        path = object_path("v1", "Pod", self.pool.namespace, name)
        answer = await self.client.merge_patch(path, {"metadata": {"annotations": annotations}})
        if not self._wrote_pod(name, answer) and name in self._pods:  # no object in the answer
            pod = self._pods[name]
            merged = {**(pod["metadata"].get("annotations") or {}), **annotations}
            self._pods[name] = {**pod, "metadata": {**pod["metadata"], "annotations": {
                k: v for k, v in merged.items() if v is not None}}}

    async def mark_draining(self, name: str) -> None:
        await self._annotate(name, {DRAINING_ANNOTATION: _stamp(self.clock()),
                                    DELETION_COST: DRAINING_COST})  # fmt: skip
        self._set_state(name, "draining")

    async def mark_ready(self, name: str) -> None:
        await self._annotate(name, {DRAINING_ANNOTATION: None, REPLACED_ANNOTATION: None,
                                    DELETION_COST: None})  # fmt: skip
        self._set_state(name, "ready")

    async def delete(self, name: str, grace_s: float) -> None:
        replica = next((r for r in self._replicas if r.name == name), None)
        if replica is None:
            return
        count = self.counts.get(replica.role)
        if replica.is_replaced:  # drained: its replacement may turn Ready, the Deployment
            await self._annotate(name, {STOPPING_ANNOTATION: _stamp(self.clock()),  # removes it
                                        DELETION_COST: VICTIM_COST})  # fmt: skip
            waiting = self._waiting.get(replica.role) or []
            if waiting:
                await self._open_gate(waiting.pop(0))
            self._set_state(name, "stopping")
            return
        if not replica.is_placeholder:
            await self._annotate(name, {STOPPING_ANNOTATION: _stamp(self.clock()),
                                        DELETION_COST: VICTIM_COST})  # fmt: skip
        if count:
            await self._apply_count(replica.role, count - 1)
        self._set_state(name, "stopping")

    def _set_state(self, name: str, state: str) -> None:
        for replica in self._replicas:
            if replica.name == name:
                replica.state = state

    async def _check_victims(self, now: float) -> None:
        grace = self.pool.spec.autoscaling.drain_timeout_seconds + 60.0
        for name, pod in self._pods.items():
            metadata = pod["metadata"]
            marked = (metadata.get("annotations") or {}).get(STOPPING_ANNOTATION)
            if not marked or metadata.get("deletionTimestamp"):
                continue
            if now - parse_time(marked) < grace:
                continue
            if name not in self._reported:
                self._say(ev.EventReason.REPLICA_STOPPING,
                          f"the ReplicaSet kept victim {name}; deleting it", is_warning=True)
                self._reported.add(name)
            try:
                await self.client.request("DELETE", object_path("v1", "Pod",
                                          self.pool.namespace, name))  # fmt: skip
            except ApiError as exc:
                if exc.status != 404:
                    raise

    def _say(self, reason: str, message: str, is_warning: bool = False) -> None:
        self.events.emit(ev.warning(reason, message) if is_warning else ev.normal(reason, message))


def _stamp(now: float) -> str:
    return rfc3339(datetime.fromtimestamp(now, UTC))
