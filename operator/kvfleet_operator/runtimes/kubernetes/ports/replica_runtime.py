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
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.api.status import rfc3339
from kvfleet_operator.decide.reconcile import RolePlan
from kvfleet_operator.decide.rollout import revision_of
from kvfleet_operator.loop import events as ev
from kvfleet_operator.loop.ports import EventSink
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.deployment import (
    build_engine_deployment,
    build_revision_deployment,
)
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
    pod_owner,
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
    version_of,
)


class KubeReplicaRuntime:
    # Under `rollout.strategy: rolling` each Deployment's own rollout replaces the replicas
    # of an old revision (drained first, above): the loop must not replace them itself.
    handles_rolling = True

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
        self.counts: dict[str, int | None] = {}  # per Deployment name: spec.replicas (None: none)
        self._deployments: dict[str, dict[str, Any]] = {}
        self._replicas: list[KubeReplica] = []
        self._pods: dict[str, dict[str, Any]] = {}
        self.router_urls: list[str] = []
        self._reported: set[str] = set()
        self._seen: set[str] = set()  # roles whose Deployment this runtime has seen
        self._waiting: dict[str, list[str]] = {}  # per Deployment, new pods behind their gate
        self._deleted: dict[str, str | None] = {}  # Deployments we deleted: their last version

    # --- observing ------------------------------------------------------------------------

    async def supervise(self) -> None:
        pool = self.pool
        indexed_deployments, indexed_pods = self.indexes.read(pool.namespace, pool.name)
        deployments = self._not_deleted(self.own.view("Deployment", indexed_deployments))
        all_pods = self.own.view("Pod", indexed_pods)
        by_name = self._deployments = {d["metadata"]["name"]: d for d in deployments}
        pods = [p for p in all_pods if is_engine(p)]
        now = self.clock()
        self._pods = {p["metadata"]["name"]: p for p in pods}
        roles = list(pool.spec.topology.roles())
        # Roles the spec no longer has (a topology change) stay observed, so the loop drains
        # their replicas away and their Deployments go down to zero.
        roles += sorted({_labels(d).get(meta.ROLE_LABEL, "")
                         for d in deployments} - set(roles) - {""})  # fmt: skip
        if meta.is_per_revision(pool):
            replicas = await self._observe_revisions(roles, by_name, now)
        else:
            replicas = await self._observe_rolling(roles, by_name, now)
        self._replicas = replicas
        if is_sidecar(pool):
            self.router_urls = router_urls(pods, ROUTER_PORT)
        else:
            routers = [p for p in all_pods if (p["metadata"].get("labels") or {})
                       .get(meta.COMPONENT_LABEL) == meta.ROUTER]  # fmt: skip
            self.router_urls = router_urls(routers, ROUTER_PORT)
        await self._check_victims(now)
        await self._remove_empty(by_name)

    def _role_pods(self, role: str) -> list[str]:
        return [n for n, p in self._pods.items() if _labels(p).get(meta.ROLE_LABEL) == role]

    def _count_of(self, name: str, found: dict[str, Any] | None) -> int | None:
        count = (found.get("spec") or {}).get("replicas") if found else None
        self.counts[name] = count if isinstance(count, int) else None
        return self.counts[name]

    async def _observe_rolling(self, roles: list[str], by_name: dict[str, dict[str, Any]],
                               now: float) -> list[KubeReplica]:  # fmt: skip
        """One Deployment per role, rolled natively. Pods of per-revision Deployments (the
        pool was canary or blueGreen before) are that role's outdated pods: each new pod
        drains one of them before its gate opens, as in any rollout."""
        replicas: list[KubeReplica] = []
        for name, other in by_name.items():  # per-revision ones: their counts, for `delete`
            if _labels(other).get(meta.DEPLOYMENT_LABEL):
                self._count_of(name, other)
        for role in roles:
            name = meta.engine_name(self.pool, role)
            found = by_name.get(name)
            count = self._count_of(name, found)
            if found:
                self._seen.add(role)
            names = self._role_pods(role)
            await self._roll(name, found, [self._pods[n] for n in names])
            mine = [self._pods[n] for n in names]  # as `_roll` left them (its writes)
            replicas += role_replicas(role, name, count, mine, engine_port(self.pool), now,
                                      _labels(found).get(meta.REVISION_LABEL, ""))  # fmt: skip
        return replicas

    async def _observe_revisions(self, roles: list[str], by_name: dict[str, dict[str, Any]],
                                 now: float) -> list[KubeReplica]:  # fmt: skip
        """Canary and blueGreen: each engine Deployment (one per role and revision, and a
        role's rolling `<pool>-<role>` left from before the switch) with its own pods."""
        replicas: list[KubeReplica] = []
        for role in roles:
            rolling = meta.engine_name(self.pool, role)
            owned: dict[str, list[str]] = {}
            for n in self._role_pods(role):
                owned.setdefault(pod_owner(self._pods[n], rolling), []).append(n)
            names = {n for n, d in by_name.items() if _labels(d).get(meta.ROLE_LABEL) == role}
            for name in sorted(names | set(owned)):
                found = by_name.get(name)
                count = self._count_of(name, found)
                pod_names = owned.get(name, [])
                await self._roll(name, found, [self._pods[n] for n in pod_names])
                mine = [self._pods[n] for n in pod_names]
                replicas += role_replicas(role, name, count, mine, engine_port(self.pool), now,
                                          _labels(found).get(meta.REVISION_LABEL, ""))
        return replicas

    def _not_deleted(self, deployments: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Without the Deployments we deleted that the index still shows."""
        shown = {d["metadata"]["name"]: version_of(d) for d in deployments}
        for name, version in list(self._deleted.items()):
            if shown.get(name) != version:
                del self._deleted[name]  # gone from the index, or made again since
        return [d for d in deployments if d["metadata"]["name"] not in self._deleted]

    async def _remove_empty(self, by_name: dict[str, dict[str, Any]]) -> None:
        """A revision's Deployment down to zero with no pod left is deleted (so a finished
        rollout leaves only the new revision's); in a canary or blueGreen pool, so is a
        role's rolling `<pool>-<role>` once drained. A rolling pool's own `<pool>-<role>`
        stays, at zero (scale to zero; a dropped role)."""
        is_per_revision = meta.is_per_revision(self.pool)
        owners = {r.deployment for r in self._replicas if not r.is_placeholder}
        for name, found in by_name.items():
            if not (is_per_revision or _labels(found).get(meta.DEPLOYMENT_LABEL)):
                continue
            if self.counts.get(name) != 0 or name in owners:
                continue
            path = object_path("apps/v1", "Deployment", self.pool.namespace, name)
            try:
                await self.client.request("DELETE", path)
            except ApiError as exc:
                if exc.status != 404:
                    raise
            self._deleted[name] = version_of(found)
            self.own.forget("Deployment", name)
            self.counts[name] = None
            revision = _labels(found).get(meta.REVISION_LABEL) or "?"
            self._say(ev.EventReason.REPLICA_STOPPING,
                      f"delete Deployment {name}: revision {revision} has no replica left")

    async def _roll(self, deployment_name: str, deployment: dict[str, Any] | None,
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
        self._waiting[deployment_name] = [n for n in step.waiting if n not in step.to_open]

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
        self.counts[name] = count

    async def _scale(self, name: str, count: int) -> None:
        """Only the count of Deployment `name` (an older revision's template is not
        rebuilt: its spec is the loop's, not ours)."""
        count = max(0, count)
        path = object_path("apps/v1", "Deployment", self.pool.namespace, name)
        answer = await self.client.merge_patch(path, {"spec": {"replicas": count}})
        self.own.remember("Deployment", answer, self._deployments.get(name), slim_deployment)
        self.counts[name] = count

    async def create(self, spec: PoolSpec, plan: RolePlan) -> None:
        """One more replica. Rolling: of the role's Deployment; one not made yet is the
        reconcile handler's to make, one that went away (deleted by hand) is applied again,
        with the replicas asked for. Canary and blueGreen: of the Deployment of
        (`plan.role`, the revision of `spec`), applied whole from `spec` (made if new)."""
        if meta.is_per_revision(self.pool):
            await self._create_revision(spec, plan)
            return
        if plan.role not in self._seen:
            return
        count = (self.counts.get(meta.engine_name(self.pool, plan.role)) or 0) + 1
        await self._apply_count(plan.role, count)
        self._say(ev.EventReason.REPLICA_STARTED,
                  f"scale {meta.engine_name(self.pool, plan.role)} to {count}")

    async def _create_revision(self, spec: PoolSpec, plan: RolePlan) -> None:
        revision = revision_of(spec)
        if plan.revision and plan.revision != revision:
            # No spec for the revision asked for: starting the wrong template would mix
            # revisions under one name, so start none and say why (the tick goes on).
            self._say(ev.EventReason.REPLICA_STARTED, f"not starting a {plan.role} replica of "
                      f"revision {plan.revision}: the spec given is revision {revision}",
                      is_warning=True)
            return
        pool = replace(self.pool, spec=spec)  # that revision's template, the pool's identity
        name = meta.revision_deployment_name(self.pool, plan.role, revision)
        count = (self.counts.get(name) or 0) + 1
        answer = await self.client.apply(build_revision_deployment(
            pool, plan.role, count, self.image, self.options))  # fmt: skip
        self.own.remember("Deployment", answer, self._deployments.get(name), slim_deployment)
        self.counts[name] = count
        self._say(ev.EventReason.REPLICA_STARTED, f"scale {name} to {count}")

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
        rolling = meta.engine_name(self.pool, replica.role)
        owner = replica.deployment or rolling
        count = self.counts.get(owner)
        if replica.is_replaced:  # drained: its replacement may turn Ready, the Deployment
            await self._annotate(name, {STOPPING_ANNOTATION: _stamp(self.clock()),  # removes it
                                        DELETION_COST: VICTIM_COST})  # fmt: skip
            # The gate waiting on it: in its own Deployment (a native rollout), or in the
            # role's rolling one (a per-revision pod replaced after a switch to rolling).
            is_native = owner in self._waiting or meta.is_per_revision(self.pool)
            waiting = self._waiting.get(owner if is_native else rolling) or []
            if waiting:
                await self._open_gate(waiting.pop(0))
            if owner != rolling and not meta.is_per_revision(self.pool) and count:
                await self._scale(owner, count - 1)  # no Deployment rollout removes it
            self._set_state(name, "stopping")
            return
        if not replica.is_placeholder:
            await self._annotate(name, {STOPPING_ANNOTATION: _stamp(self.clock()),
                                        DELETION_COST: VICTIM_COST})  # fmt: skip
        if count and owner == rolling and not meta.is_per_revision(self.pool):
            await self._apply_count(replica.role, count - 1)
        elif count:
            await self._scale(owner, count - 1)
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


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def _stamp(now: float) -> str:
    return rfc3339(datetime.fromtimestamp(now, UTC))
