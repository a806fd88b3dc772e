"""The kopf operator against kmock 0.8, in-process, with `kopf.operator()` as a task.

kmock merges patches as plain dicts, so these tests assert what kvfleet *sends* (content
type, field manager, force, exactly the builders' fields), not server-side-apply semantics.
"""

from __future__ import annotations

import base64
import copy
import json
import time

from k8s_pools import example
from kmock_shim import Operator, api, eventually, operator_running
from kvfleet_operator.api import parse_pool
from kvfleet_operator.runtimes.kubernetes import Tokens, build_children
from kvfleet_operator.runtimes.kubernetes.build.operator_manifests import RBAC_RULES
from kvfleet_operator.runtimes.kubernetes.ports.status_store import LOOP_STATE_ANNOTATION

POOLS = "kvfleet.io/v1alpha1/inferencepools"
NS = "inference"
NAME = "llama3-8b"
POOL_PATH = f"/apis/kvfleet.io/v1alpha1/namespaces/{NS}/inferencepools"
KINDS = {
    "v1/secrets": 2, "v1/configmaps": 1, "networking.k8s.io/v1/networkpolicies": 1,
    "v1/services": 3, "policy/v1/poddisruptionbudgets": 2, "apps/v1/deployments": 2,
}
DEPLOYMENTS = "apps/v1/deployments"


def pool_manifest(**spec_changes) -> dict:
    data = copy.deepcopy(example("vllm-unified.yaml"))
    data["spec"].update(spec_changes)
    return data


def all_there(cluster) -> bool:
    return all(len(cluster.objs(kind, NS)) == n for kind, n in KINDS.items())


def tokens_in(cluster) -> Tokens:
    def read(name):
        return base64.b64decode(cluster.obj("v1/secrets", NS, name)["data"]["token"]).decode()

    return Tokens(admin=read(f"{NAME}-router-admin-token"), engine=read(f"{NAME}-engine-token"))


def pool(cluster) -> dict:
    return cluster.obj(POOLS, NS, NAME)


def status_patches(cluster) -> list[dict]:
    return [json.loads(r.body) for r in cluster.sent("PATCH", f"/inferencepools/{NAME}/status")]


async def test_a_new_pool_gets_every_child_with_an_owner_reference(cluster, caplog):
    async with operator_running(str(cluster.url)):
        await api(cluster, "POST", POOL_PATH, pool_manifest())
        await eventually(lambda: all_there(cluster), what="all children")
        uid = pool(cluster)["metadata"]["uid"]
        for kind in KINDS:
            for obj in cluster.objs(kind, NS):
                assert obj["metadata"]["ownerReferences"] == [{
                    "apiVersion": "kvfleet.io/v1alpha1", "kind": "InferencePool", "name": NAME,
                    "uid": uid, "controller": True, "blockOwnerDeletion": True}], kind
        # What was sent: server-side apply, kvfleet's field manager, only the builders' fields.
        tokens = tokens_in(cluster)
        expected = {(c["kind"], c["metadata"]["name"]): c
                    for c in build_children(parse_pool(pool(cluster)), tokens=tokens)}
        applies = [r for r in cluster.sent("PATCH") if "inferencepools" not in r.url.path]
        assert {(json.loads(r.body)["kind"], json.loads(r.body)["metadata"]["name"])
                for r in applies} == set(expected)
        for request in applies:
            assert request.headers["Content-Type"] == "application/apply-patch+yaml"
            assert request.params == {"fieldManager": "kvfleet", "force": "true"}
            sent = json.loads(request.body)
            assert sent == expected[sent["kind"], sent["metadata"]["name"]]
            assert "status" not in sent
        # Tokens live only in their Secrets: not in the pool, not in the logs.
        await eventually(lambda: status_patches(cluster), what="a status write")
        # kopf keeps its progress in kvfleet.io/ annotations and writes nothing into status.
        assert not [r for r in cluster.sent("PATCH", "/status")
                    if r.headers.get("User-Agent", "").startswith("kopf")]
        assert "kopf" not in pool(cluster)["status"]
        assert {k.split("/")[0] for k in pool(cluster)["metadata"]["annotations"]} == {"kvfleet.io"}
        text = json.dumps(pool(cluster)) + caplog.text
        assert tokens.admin not in text and tokens.engine not in text
        assert not any(tokens.admin in r.text for r in cluster.sent("POST", "/events"))


async def test_a_spec_update_patches_the_children_and_keeps_replicas_and_tokens(cluster):
    async with operator_running(str(cluster.url)):
        await api(cluster, "POST", POOL_PATH, pool_manifest())
        await eventually(lambda: all_there(cluster), what="all children")
        tokens = tokens_in(cluster)
        # The loop runs for generation 1; only kopf's update handler tells it of the change.
        await eventually(lambda: pool(cluster).get("status", {}).get("observedGeneration") == 1,
                         what="observedGeneration 1")
        # The autoscaler moved the Deployment to 3 meanwhile (as the control loop would).
        await api(cluster, "PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}-unified",
                  {"spec": {"replicas": 3}}, "application/merge-patch+json")
        engine = pool(cluster)["spec"]["engine"]
        await api(cluster, "PATCH", f"{POOL_PATH}/{NAME}",
                  {"spec": {"engine": {**engine, "maxNumSeqs": 64},
                            "routing": {"policy": "least-request"}}},
                  "application/merge-patch+json")

        def patched():
            deployment = cluster.obj(DEPLOYMENTS, NS, f"{NAME}-unified")
            args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            return "64" in args and args[args.index("64") - 1] == "--max-num-seqs"

        await eventually(patched, what="the Deployment's new args")
        config = cluster.obj("v1/configmaps", NS, f"{NAME}-router-config")
        assert "least-request" in json.dumps(config["data"])
        assert cluster.obj(DEPLOYMENTS, NS, f"{NAME}-unified")["spec"]["replicas"] == 3
        assert tokens_in(cluster) == tokens
        assert all_there(cluster)
        # kstatus: status describes the new generation once the loop has seen it.
        assert pool(cluster)["metadata"]["generation"] == 2
        await eventually(lambda: pool(cluster).get("status", {}).get("observedGeneration") == 2,
                         what="observedGeneration 2")
        assert all(c["observedGeneration"] == 2 for c in pool(cluster)["status"]["conditions"])


async def test_a_bad_spec_gives_degraded_naming_the_field_without_a_retry_storm(cluster):
    async with operator_running(str(cluster.url)):
        bad = pool_manifest()
        bad["spec"]["model"]["source"] = "file:///models/llama.gguf"  # the CRD allows it
        await api(cluster, "POST", POOL_PATH, bad)

        def degraded():
            conditions = {c["type"]: c for c in
                          (pool(cluster).get("status") or {}).get("conditions") or []}
            return conditions.get("Degraded")

        condition = await eventually(degraded, what="Degraded")
        assert condition["status"] == "True" and condition["reason"] == "InvalidSpec"
        assert "spec.model.source" in condition["message"]
        ready = next(c for c in pool(cluster)["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
        before = len(cluster.sent("PATCH"))
        time.sleep(0)  # let the retry machinery show itself, if there were one
        import asyncio

        await asyncio.sleep(2.0)
        assert len(cluster.sent("PATCH", "/status")) == 1
        assert len(cluster.sent("PATCH")) - before <= 1  # kopf's own bookkeeping at most
        invalid_events = [r for r in cluster.sent("POST", "/events")
                          if json.loads(r.body)["reason"] == "InvalidSpec"]
        assert len(invalid_events) == 1
        assert not cluster.objs(DEPLOYMENTS, NS)
        # Fixing the spec recovers: the children appear, Degraded clears.
        await api(cluster, "PATCH", f"{POOL_PATH}/{NAME}",
                  {"spec": {"model": {**bad["spec"]["model"],
                                      "source": "hf://meta-llama/Meta-Llama-3-8B-Instruct"}}},
                  "application/merge-patch+json")
        await eventually(lambda: all_there(cluster), what="children after the fix")
        await eventually(lambda: degraded()["reason"] != "InvalidSpec", what="Degraded cleared")


def events_with(cluster, reason: str) -> list[dict]:
    posted = [json.loads(r.body) for r in cluster.sent("POST", "/events")]
    return [e for e in posted if e["reason"] == reason]


async def test_a_running_pool_made_invalid_stays_degraded(cluster):
    async with operator_running(str(cluster.url)):
        await api(cluster, "POST", POOL_PATH, pool_manifest())
        await eventually(lambda: status_patches(cluster), what="the loop running")
        model = pool(cluster)["spec"]["model"]
        await api(cluster, "PATCH", f"{POOL_PATH}/{NAME}",
                  {"spec": {"model": {**model, "source": "file:///m.gguf"}}},
                  "application/merge-patch+json")

        def reason() -> str:
            conditions = pool(cluster)["status"]["conditions"]
            return next(c["reason"] for c in conditions if c["type"] == "Degraded")

        await eventually(lambda: reason() == "InvalidSpec", what="InvalidSpec")
        import asyncio

        await asyncio.sleep(3.0)  # the old spec's loop has stopped; nothing overwrites it
        assert reason() == "InvalidSpec"
        assert pool(cluster)["status"]["observedGeneration"] == 2


async def test_a_409_on_create_counts_as_success(cluster):
    # Someone created the ConfigMap meanwhile: the write lands, the answer is 409.
    cluster.fail("POST", r"/configmaps$", 409, persist=True)
    async with operator_running(str(cluster.url)):
        await api(cluster, "POST", POOL_PATH, pool_manifest())
        await eventually(lambda: all_there(cluster), what="all children")
        assert cluster._faults[0].times == 0
        assert not events_with(cluster, "ApplyFailed")  # one pass, no retry needed
        assert len(cluster.sent("POST", "/secrets")) == 2


async def test_injected_500s_are_retried_and_converge(cluster):
    cluster.fail("POST", r"/deployments$", 500)
    cluster.fail("PATCH", r"/services/", 500)
    async with operator_running(str(cluster.url)):
        await api(cluster, "POST", POOL_PATH, pool_manifest())
        await eventually(lambda: all_there(cluster), what="all children despite the errors")
        assert all(f.times == 0 for f in cluster._faults)
        assert len(events_with(cluster, "ApplyFailed")) == 2  # each failure said, then retried
        names = [json.loads(r.body)["metadata"]["name"] for r in cluster.sent("POST", "/secrets")]
        assert len(names) == len(set(names)) == 2  # retried passes re-apply, never re-create


async def test_a_restart_mid_reconcile_makes_no_duplicates_and_keeps_the_history(cluster):
    now = time.time()
    seeded = {"desired": {"unified": 3},
              "history": {"recommendations": {"unified": [[now - 5, 3]]},
                          "last_scale_up": {"unified": now - 5},
                          "decisions": [{"time": now - 5, "role": "unified", "to": 3}]},
              "drain_started": {}, "router_config": None, "limited": {}}
    manifest = pool_manifest()
    manifest["metadata"]["annotations"] = {LOOP_STATE_ANNOTATION: json.dumps(seeded)}
    manifest["status"] = {"roles": {"unified": {"desiredReplicas": 3}}}
    cluster.fail("POST", r"/deployments$", 500, times=10_000)  # stuck half-way
    first = await Operator(str(cluster.url)).start()
    await api(cluster, "POST", POOL_PATH, manifest)
    await eventually(lambda: len(cluster.objs("v1/services", NS)) == 3, what="half the children")
    tokens = tokens_in(cluster)
    await first.kill()
    cluster._faults.clear()
    second = await Operator(str(cluster.url)).start()
    try:
        await eventually(lambda: all_there(cluster), what="all children after the restart")
        for kind, n in KINDS.items():
            names = [o["metadata"]["name"] for o in cluster.objs(kind, NS)]
            assert len(names) == len(set(names)) == n, kind
        assert tokens_in(cluster) == tokens
        assert cluster.obj(DEPLOYMENTS, NS, f"{NAME}-unified")["spec"]["replicas"] == 3

        def saved_state():
            raw = pool(cluster)["metadata"]["annotations"].get(LOOP_STATE_ANNOTATION)
            state = json.loads(raw)
            return state if state != seeded else None

        await eventually(lambda: status_patches(cluster), what="the loop's first save")
        state = json.loads(pool(cluster)["metadata"]["annotations"][LOOP_STATE_ANNOTATION])
        assert state["history"]["last_scale_up"] == {"unified": now - 5}
        assert state["history"]["decisions"][0] == seeded["history"]["decisions"][0]
        assert state["desired"] == {"unified": 3}
        roles = pool(cluster)["status"]["roles"]
        assert roles["unified"]["desiredReplicas"] == 3
    finally:
        await second.stop()


def count_ticks(monkeypatch) -> list[str]:
    """The pools whose loop ticked, once per tick (the operator runs in this process)."""
    from kvfleet_operator.loop.control_loop import ControlLoop

    ticks: list[str] = []
    tick = ControlLoop.tick

    async def counted(self):
        ticks.append(self.pool.name)
        return await tick(self)

    monkeypatch.setattr(ControlLoop, "tick", counted)
    return ticks


async def test_deleting_the_pool_stops_its_control_loop(cluster, monkeypatch):
    ticks = count_ticks(monkeypatch)
    async with operator_running(str(cluster.url)):
        await api(cluster, "POST", POOL_PATH, pool_manifest())
        await eventually(lambda: status_patches(cluster), what="the loop running")
        started = len(ticks)
        await eventually(lambda: len(ticks) > started + 1, what="the loop ticking")
        assert "kvfleet.io/finalizer" in pool(cluster)["metadata"]["finalizers"]
        await api(cluster, "DELETE", f"{POOL_PATH}/{NAME}")
        await eventually(lambda: pool(cluster) is None, what="the pool gone")
        # Every call the operator made over the pool's life is one its RBAC grants.
        granted = {(g, r, v) for g, r, verbs, _ in RBAC_RULES for v in verbs}
        assert cluster.operator_calls() - granted == set()
        import asyncio

        await asyncio.sleep(0.5)
        settled = len(ticks)
        await asyncio.sleep(1.5)  # five ticks' worth
        assert len(ticks) == settled

