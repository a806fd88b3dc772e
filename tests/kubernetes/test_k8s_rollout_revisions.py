"""The Kubernetes runtime's side of canary and blue-green rollouts (issue 30), without the loop:
the builders (every engine pod labelled with its revision; one Deployment per role and
revision for canary/blueGreen pools) and `KubeReplicaRuntime` against kmock, with a test
kubelet that plays each Deployment's ReplicaSet (pods with the template's labels, the lowest
deletion cost removed first).
"""

from __future__ import annotations

import copy
import json

import kubernetes_validate
import pytest
from cluster_index import live
from kmock_shim import api
from kvfleet_operator.api import parse_pool
from kvfleet_operator.decide.reconcile import RolePlan
from kvfleet_operator.decide.rollout import revision_of
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.children import build_children
from kvfleet_operator.runtimes.kubernetes.build.deployment import (
    build_engine_deployment,
    build_revision_deployment,
)
from kvfleet_operator.runtimes.kubernetes.build.options import BuildOptions, Tokens
from kvfleet_operator.runtimes.kubernetes.pool_loop import promote_revision
from kvfleet_operator.runtimes.kubernetes.ports.event_sink import KubeEventSink
from kvfleet_operator.runtimes.kubernetes.ports.pods import DELETION_COST, pod_owner
from kvfleet_operator.runtimes.kubernetes.ports.pool_children import apply_pool
from kvfleet_operator.runtimes.kubernetes.ports.replica_runtime import KubeReplicaRuntime
from test_k8s_operator_kmock import NAME, NS, POOL_PATH, POOLS, pool_manifest

DEPLOYMENTS = "apps/v1/deployments"
PODS = "v1/pods"
TOKENS = Tokens(admin="a", engine="e")
CANARY = {"strategy": "canary"}


def built(manifest: dict):
    """A pool as the API server would hand it over (with a uid, for owner references)."""
    manifest = copy.deepcopy(manifest)
    manifest["metadata"]["uid"] = "0f6c-uid"
    return parse_pool(manifest)


def canary_manifest(**engine_changes) -> dict:
    data = pool_manifest(rollout=dict(CANARY))
    data["spec"]["engine"].update(engine_changes)
    return data


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# --- builders -----------------------------------------------------------------------------


def test_every_engine_pod_carries_its_revision_and_rolling_keeps_one_deployment_per_role():
    pool = built(pool_manifest())
    rev = revision_of(pool.spec)
    deployment = build_engine_deployment(pool, "unified", 2, "img", BuildOptions())
    assert deployment["metadata"]["name"] == f"{NAME}-unified"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels[meta.REVISION_LABEL] == rev and meta.DEPLOYMENT_LABEL not in labels
    assert deployment["metadata"]["labels"][meta.REVISION_LABEL] == rev
    # The rolling Deployment's selector is immutable: it must not name a revision.
    assert deployment["spec"]["selector"]["matchLabels"] == meta.selector(pool, meta.ENGINE,
                                                                          "unified")
    changed = built(pool_manifest())
    changed.spec.engine.max_num_seqs = 64
    other = build_engine_deployment(changed, "unified", 2, "img", BuildOptions())
    assert other["spec"]["template"]["metadata"]["labels"][meta.REVISION_LABEL] != rev


def test_a_canary_pool_builds_one_deployment_per_role_and_revision():
    pool = built(canary_manifest())
    rev = revision_of(pool.spec)
    children = build_children(pool, tokens=TOKENS, image="img", options=BuildOptions())
    engines = [c for c in children if c["kind"] == "Deployment"
               and c["metadata"]["labels"][meta.COMPONENT_LABEL] == meta.ENGINE]
    assert [d["metadata"]["name"] for d in engines] == [f"{NAME}-unified-{rev}"]
    (deployment,) = engines
    own = {meta.REVISION_LABEL: rev, meta.DEPLOYMENT_LABEL: f"{NAME}-unified-{rev}"}
    selector = deployment["spec"]["selector"]["matchLabels"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert matches(own, selector) and matches(selector, pod_labels)
    assert matches(own, deployment["metadata"]["labels"])
    for version in ("1.33",):
        kubernetes_validate.validate(deployment, version, strict=True)
    # A second revision's pods fall outside the first's selector, and the other way round.
    pool_b = built(canary_manifest(maxNumSeqs=64))
    b = build_revision_deployment(pool_b, "unified", 1, "img", BuildOptions())
    assert b["metadata"]["name"] == f"{NAME}-unified-{revision_of(pool_b.spec)}"
    b_labels = b["spec"]["template"]["metadata"]["labels"]
    assert not matches(selector, b_labels)
    assert not matches(b["spec"]["selector"]["matchLabels"], pod_labels)
    # The pool-wide children still pick the pods of both revisions.
    for child in children:
        spec = child.get("spec") or {}
        found = spec.get("selector") if child["kind"] == "Service" else \
            (spec.get("selector") or {}).get("matchLabels") or \
            (spec.get("podSelector") or {}).get("matchLabels")  # fmt: skip
        if child["kind"] in ("Service", "PodDisruptionBudget", "NetworkPolicy") and found and \
                found.get(meta.COMPONENT_LABEL) == meta.ENGINE:  # fmt: skip
            assert matches(found, pod_labels) and matches(found, b_labels), child["kind"]


def test_the_longest_names_fit():
    manifest = canary_manifest()
    manifest["metadata"]["name"] = "p" * 40
    manifest["spec"]["topology"] = {
        "prefill": {"replicas": {"min": 1, "max": 1}, "gpus": 1},
        "decode": {"replicas": {"min": 1, "max": 1}, "gpus": 1}}
    pool = built(manifest)
    deployment = build_revision_deployment(pool, "prefill", 1, "img", BuildOptions())
    name = deployment["metadata"]["name"]
    assert len(name) == 40 + len("-prefill-") + 10 <= 63  # also a label value
    assert deployment["metadata"]["labels"][meta.DEPLOYMENT_LABEL] == name
    kubernetes_validate.validate(deployment, "1.33", strict=True)


def test_the_promote_annotation_reaches_the_loop_as_a_revision():
    assert promote_revision({"metadata": {}}) is None
    assert promote_revision({"metadata": {"annotations": {"kvfleet.io/rollout-promote": ""}}}) \
        is None
    body = {"metadata": {"annotations": {"kvfleet.io/rollout-promote": " 0123456789 "}}}
    assert promote_revision(body) == "0123456789"
    assert KubeReplicaRuntime.handles_rolling is True


# --- the runtime against kmock --------------------------------------------------------------


class RevisionKubelet:
    """Each engine Deployment's ReplicaSet: pods with its template's labels (a pod with a
    `kvfleet.io/deployment` label is that Deployment's, else the role's rolling one's), the
    lowest deletion cost removed first; pods are Ready with an IP."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.num_created = 0
        self.removed: list[str] = []

    async def sync(self) -> None:
        for deployment in self.cluster.objs(DEPLOYMENTS, NS):
            labels = deployment["metadata"].get("labels") or {}
            if labels.get(meta.COMPONENT_LABEL) != meta.ENGINE:
                continue
            name = deployment["metadata"]["name"]
            rolling = f"{NAME}-{labels[meta.ROLE_LABEL]}"
            want = deployment["spec"]["replicas"]
            template = deployment["spec"]["template"]["metadata"]
            pods = [p for p in self.cluster.objs(PODS, NS) if pod_owner(p, rolling) == name]
            while len(pods) > want:
                victim = min(pods, key=lambda p: int(
                    (p["metadata"].get("annotations") or {}).get(DELETION_COST, "0")))
                await api(self.cluster, "DELETE",
                          f"/api/v1/namespaces/{NS}/pods/{victim['metadata']['name']}")
                self.removed.append(victim["metadata"]["name"])
                pods.remove(victim)
            while len(pods) < want:
                self.num_created += 1
                pod = {"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": f"{name}-x{self.num_created}", "namespace": NS,
                                    "labels": dict(template["labels"]),
                                    "annotations": dict(template.get("annotations") or {})},
                       "status": {"phase": "Running", "podIP": f"10.0.2.{self.num_created}",
                                  "startTime": "2026-01-01T00:00:00Z",
                                  "conditions": [{"type": "Ready", "status": "True"}],
                                  "containerStatuses": [{"name": "engine", "restartCount": 0,
                                                         "state": {"running": {}}}]}}
                await api(self.cluster, "POST", f"/api/v1/namespaces/{NS}/pods", pod)
                pods.append(pod)


def plan(revision: str) -> RolePlan:
    return RolePlan(role="unified", num_desired=1, command=[], args=[], env={},
                    revision=revision)


def runtime_for(cluster, client) -> KubeReplicaRuntime:
    pool = parse_pool(cluster.obj(POOLS, NS, NAME))
    return KubeReplicaRuntime(client, pool, image="img", options=BuildOptions(),
                              events=KubeEventSink(client, pool), indexes=live(cluster))


def engine_deployments(cluster) -> dict[str, int]:
    return {d["metadata"]["name"]: d["spec"]["replicas"] for d in cluster.objs(DEPLOYMENTS, NS)
            if d["metadata"]["labels"][meta.COMPONENT_LABEL] == meta.ENGINE}


async def test_canary_replicas_live_in_their_revisions_deployments(cluster, client):
    await api(cluster, "POST", POOL_PATH, canary_manifest())
    stable = parse_pool(cluster.obj(POOLS, NS, NAME))
    await apply_pool(client, stable, image="img", options=BuildOptions())
    assert engine_deployments(cluster) == {}  # the loop's to make, per revision
    kubelet = RevisionKubelet(cluster)
    runtime = runtime_for(cluster, client)
    rev_a = revision_of(stable.spec)
    new = parse_pool(canary_manifest(maxNumSeqs=64))
    rev_b = revision_of(new.spec)
    a, b = f"{NAME}-unified-{rev_a}", f"{NAME}-unified-{rev_b}"

    await runtime.supervise()
    await runtime.create(stable.spec, plan(rev_a))
    await runtime.create(stable.spec, plan(rev_a))
    await runtime.supervise()  # before the kubelet: two placeholders of revision A
    assert sorted((r.state, r.revision, r.deployment) for r in runtime.replicas()) == \
        [("starting", rev_a, a)] * 2
    await runtime.create(new.spec, plan(rev_b))
    assert engine_deployments(cluster) == {a: 2, b: 1}
    applied = cluster.obj(DEPLOYMENTS, NS, b)
    assert "64" in applied["spec"]["template"]["spec"]["containers"][0]["args"]  # B's spec
    assert "64" not in cluster.obj(DEPLOYMENTS, NS, a)["spec"]["template"]["spec"][
        "containers"][0]["args"]  # fmt: skip
    await kubelet.sync()
    await runtime.supervise()
    by_revision = {}
    for r in runtime.replicas():
        assert r.state == "ready" and r.deployment == f"{NAME}-unified-{r.revision}"
        by_revision[r.revision] = by_revision.get(r.revision, 0) + 1
    assert by_revision == {rev_a: 2, rev_b: 1}

    # A canary replica goes: its own Deployment's count goes down, and once its pod is gone
    # the Deployment is deleted; revision A's stays.
    (victim,) = [r.name for r in runtime.replicas() if r.revision == rev_b]
    await runtime.delete(victim, 30.0)
    assert engine_deployments(cluster) == {a: 2, b: 0}
    await runtime.supervise()
    assert cluster.obj(DEPLOYMENTS, NS, b) is not None  # its pod is still there
    await kubelet.sync()
    assert kubelet.removed == [victim]
    await runtime.supervise()
    assert engine_deployments(cluster) == {a: 2}
    await runtime.supervise()  # the index may still show it: no second delete, no error
    # The same revision again: its Deployment is made anew.
    await runtime.create(new.spec, plan(rev_b))
    assert engine_deployments(cluster) == {a: 2, b: 1}
    # A victim of revision A lowers A's count, not B's.
    await kubelet.sync()
    await runtime.supervise()
    victim = next(r.name for r in runtime.replicas() if r.revision == rev_a)
    await runtime.delete(victim, 30.0)
    assert engine_deployments(cluster) == {a: 1, b: 1}


async def test_a_plan_whose_spec_is_another_revision_starts_nothing(cluster, client):
    await api(cluster, "POST", POOL_PATH, canary_manifest())
    pool = parse_pool(cluster.obj(POOLS, NS, NAME))
    await apply_pool(client, pool, image="img", options=BuildOptions())
    runtime = runtime_for(cluster, client)
    await runtime.supervise()
    await runtime.create(pool.spec, plan("0000000000"))
    assert engine_deployments(cluster) == {}
    await runtime.events.aclose()
    posted = [json.loads(r.body) for r in cluster.sent("POST", "/events")]
    assert any(e["type"] == "Warning" and "revision 0000000000" in e["message"]
               for e in posted), posted


async def test_a_rolling_pool_switched_to_canary_keeps_its_deployment_until_drained(
        cluster, client):  # fmt: skip
    await api(cluster, "POST", POOL_PATH, pool_manifest())
    rolling = parse_pool(cluster.obj(POOLS, NS, NAME))
    await apply_pool(client, rolling, image="img", options=BuildOptions())
    kubelet = RevisionKubelet(cluster)
    await kubelet.sync()
    old = f"{NAME}-unified"
    template = copy.deepcopy(cluster.obj(DEPLOYMENTS, NS, old)["spec"]["template"])
    assert engine_deployments(cluster) == {old: 2}
    # The user switches to canary and changes the engine in the same edit.
    await api(cluster, "PATCH", f"{POOL_PATH}/{NAME}", {"spec": {
        "rollout": CANARY, "engine": {"maxNumSeqs": 64}}}, "application/merge-patch+json")
    switched = parse_pool(cluster.obj(POOLS, NS, NAME))
    await apply_pool(client, switched, image="img", options=BuildOptions())
    assert cluster.obj(DEPLOYMENTS, NS, old)["spec"]["template"] == template  # untouched
    runtime = runtime_for(cluster, client)
    await runtime.supervise()
    rev_old = revision_of(rolling.spec)
    assert sorted((r.revision, r.deployment, r.state) for r in runtime.replicas()) == \
        [(rev_old, old, "ready")] * 2
    rev_new = revision_of(switched.spec)
    await runtime.create(switched.spec, plan(rev_new))
    await kubelet.sync()
    await runtime.supervise()
    assert engine_deployments(cluster) == {old: 2, f"{NAME}-unified-{rev_new}": 1}
    for name in [r.name for r in runtime.replicas() if r.deployment == old]:
        await runtime.delete(name, 30.0)
        await runtime.supervise()
        assert cluster.obj(DEPLOYMENTS, NS, old) is not None  # its pods are still there
    assert engine_deployments(cluster)[old] == 0
    await kubelet.sync()
    await runtime.supervise()
    assert engine_deployments(cluster) == {f"{NAME}-unified-{rev_new}": 1}


async def test_a_rolling_pool_keeps_its_deployment_at_zero(cluster, client):
    """Scale to zero under rolling is not the end of a revision: `<pool>-<role>` stays."""
    await api(cluster, "POST", POOL_PATH, pool_manifest())
    pool = parse_pool(cluster.obj(POOLS, NS, NAME))
    await apply_pool(client, pool, image="img", options=BuildOptions())
    kubelet = RevisionKubelet(cluster)
    await kubelet.sync()
    runtime = runtime_for(cluster, client)
    await runtime.supervise()
    for name in [r.name for r in runtime.replicas()]:
        await runtime.delete(name, 30.0)
    await kubelet.sync()
    await runtime.supervise()
    await runtime.supervise()
    assert engine_deployments(cluster) == {f"{NAME}-unified": 0}


@pytest.mark.parametrize("strategy", ["rolling", "canary"])
async def test_a_pool_switched_back_to_rolling_drains_each_revision_pod_first(
        cluster, client, strategy):  # fmt: skip
    """canary -> rolling: `<pool>-<role>` is made at the pool's size; each of its new pods
    waits on its readiness gate until one revision pod is drained (a runtime-reported
    victim); that victim's own Deployment goes down, and is deleted once empty. (With
    `strategy` still canary, nothing is replaced: the control check.)"""
    await api(cluster, "POST", POOL_PATH, canary_manifest())
    pool = parse_pool(cluster.obj(POOLS, NS, NAME))
    await apply_pool(client, pool, image="img", options=BuildOptions())
    kubelet = RevisionKubelet(cluster)
    runtime = runtime_for(cluster, client)
    rev = revision_of(pool.spec)
    await runtime.supervise()
    for _ in range(2):
        await runtime.create(pool.spec, plan(rev))
    await kubelet.sync()
    canary_deployment = f"{NAME}-unified-{rev}"
    await api(cluster, "PATCH", f"{POOL_PATH}/{NAME}", {"spec": {"rollout": {
        "strategy": strategy}}}, "application/merge-patch+json")
    switched = parse_pool(cluster.obj(POOLS, NS, NAME))
    switched.status.roles = {}
    await apply_pool(client, switched, image="img", options=BuildOptions())
    if strategy == "canary":
        assert engine_deployments(cluster) == {canary_deployment: 2}
        return
    rolling = f"{NAME}-unified"
    assert engine_deployments(cluster) == {canary_deployment: 2, rolling: 2}
    await kubelet.sync()
    # The new pods' containers are ready, their `kvfleet.io/routed` gate closed.
    for pod in cluster.objs(PODS, NS):
        if pod_owner(pod, rolling) == rolling:
            path = f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}"
            await api(cluster, "PATCH", path, {"spec": {"readinessGates": [
                {"conditionType": "kvfleet.io/routed"}]}}, "application/merge-patch+json")
            await api(cluster, "PATCH", path + "/status", {"status": {"conditions": [
                {"type": "ContainersReady", "status": "True"},
                {"type": "Ready", "status": "False"}]}}, "application/merge-patch+json")
    runtime = runtime_for(cluster, client)
    await runtime.supervise()
    states = {r.name: (r.deployment, r.state, r.is_replaced) for r in runtime.replicas()}
    victims = [n for n, (d, s, replaced) in states.items() if replaced]
    assert len(victims) == 2 and all(states[n][:2] == (canary_deployment, "draining")
                                     for n in victims), states
    assert sorted(s for d, s, _ in states.values() if d == rolling) == ["ready", "ready"]
    await runtime.delete(victims[0], 30.0)  # drained: one gate opens, its Deployment shrinks
    assert engine_deployments(cluster)[canary_deployment] == 1
    opened = [p["metadata"]["name"] for p in cluster.objs(PODS, NS)
              if any(c.get("type") == "kvfleet.io/routed" and c.get("status") == "True"
                     for c in (p.get("status") or {}).get("conditions") or [])]
    assert len(opened) == 1 and pod_owner(cluster.obj(PODS, NS, opened[0]), rolling) == rolling
    await runtime.delete(victims[1], 30.0)
    await kubelet.sync()
    await runtime.supervise()
    assert engine_deployments(cluster) == {rolling: 2}
