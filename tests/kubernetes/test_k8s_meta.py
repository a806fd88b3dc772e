"""Owner references and the common labels on every child; tokens only in their Secrets;
the router's bootstrap config is one the router accepts."""

from __future__ import annotations

import base64
import json

import pytest
import yaml
from k8s_pools import TOKENS, UID, all_pools, by_kind, children
from kvfleet_operator.runtimes.kubernetes import build_children
from kvfleet_router.config import RouterConfig

POOLS = all_pools()
COMMON = ("app.kubernetes.io/name", "app.kubernetes.io/instance",
          "app.kubernetes.io/component", "app.kubernetes.io/part-of", "kvfleet.io/pool")
POOL_WIDE = {"Secret/engine-token", "NetworkPolicy/engines",  # serve every role
             "Deployment/lmcache", "Service/lmcache", "NetworkPolicy/lmcache"}  # LMCache


@pytest.mark.parametrize("name", sorted(POOLS))
def test_owner_reference_and_namespace_on_every_child(name):
    pool = POOLS[name]
    for obj in children(pool):
        md = obj["metadata"]
        assert md["namespace"] == pool.namespace
        assert md["ownerReferences"] == [{
            "apiVersion": "kvfleet.io/v1alpha1", "kind": "InferencePool", "name": pool.name,
            "uid": UID, "controller": True, "blockOwnerDeletion": True}], md["name"]


@pytest.mark.parametrize("name", sorted(POOLS))
def test_common_labels_on_every_child_and_pod(name):
    pool = POOLS[name]
    roles = set(pool.spec.topology.roles())
    for obj in children(pool):
        labels = obj["metadata"]["labels"]
        for key in COMMON:
            assert labels[key], (obj["metadata"]["name"], key)
        assert labels["app.kubernetes.io/part-of"] == "kvfleet"
        assert labels["kvfleet.io/pool"] == labels["app.kubernetes.io/instance"] == pool.name
        short = f"{obj['kind']}/{obj['metadata']['name'].removeprefix(pool.name + '-')}"
        if short in POOL_WIDE:
            assert "kvfleet.io/role" not in labels
        else:
            assert labels["kvfleet.io/role"] in roles | {"router"}, short
        if obj["kind"] == "Deployment":
            pod_labels = obj["spec"]["template"]["metadata"]["labels"]
            assert pod_labels == labels
            match = obj["spec"]["selector"]["matchLabels"]
            assert match.items() <= pod_labels.items()


def test_names_are_per_pool_and_unique():
    seen = set()
    for pool in POOLS.values():
        for obj in children(pool):
            key = (obj["metadata"]["namespace"], obj["kind"], obj["metadata"]["name"])
            assert key not in seen
            assert obj["metadata"]["name"].startswith(pool.name + "-")
            assert len(obj["metadata"]["name"]) <= 63
            seen.add(key)


def test_tokens_live_only_in_their_secrets():
    pool = POOLS["vllm-disaggregated"]
    objs = children(pool)
    secrets = {s["metadata"]["name"]: base64.b64decode(s["data"]["token"]).decode()
               for s in by_kind(objs, "Secret")}
    assert secrets == {"llama3-70b-pd-router-admin-token": TOKENS.admin,
                       "llama3-70b-pd-engine-token": TOKENS.engine}
    others = json.dumps([o for o in objs if o["kind"] != "Secret"])
    assert TOKENS.admin not in others and TOKENS.engine not in others
    assert "hidden" in repr(TOKENS) and TOKENS.admin not in repr(TOKENS)


def test_a_pool_without_uid_is_refused():
    pool = all_pools()["local-cpu"]
    pool.uid = None
    with pytest.raises(ValueError, match="uid"):
        build_children(pool, tokens=TOKENS)


@pytest.mark.parametrize("name", sorted(POOLS))
def test_router_bootstrap_config_is_accepted_by_the_router(name):
    pool = POOLS[name]
    [cm] = by_kind(children(pool), "ConfigMap")
    cfg = RouterConfig.from_dict(yaml.safe_load(cm["data"]["router.yaml"]))
    assert cfg.version == 0 and not cfg.endpoints
    assert cfg.policy.name == pool.spec.routing.policy


def test_apply_order_secrets_config_and_policy_before_pods():
    kinds = [o["kind"] for o in children(POOLS["vllm-disaggregated"])]
    first_deployment = kinds.index("Deployment")
    for kind in ("Secret", "ConfigMap", "NetworkPolicy", "Service", "PodDisruptionBudget"):
        assert max(i for i, k in enumerate(kinds) if k == kind) < first_deployment
    assert kinds[-1] == "Deployment"


def test_unservable_spec_becomes_degraded_invalid_spec_naming_the_field():
    from datetime import UTC, datetime

    from kvfleet_operator.api import PoolStatus, Reason
    from kvfleet_operator.decide.reconcile import invalid_spec_status
    from kvfleet_operator.runtimes.kubernetes import UnservableSpec

    pool = all_pools()["local-cpu"]
    pool.spec.model.source = "file:///m.gguf"
    with pytest.raises(UnservableSpec) as info:
        build_children(pool, tokens=TOKENS)
    status = invalid_spec_status(PoolStatus(), info.value, datetime.now(UTC))
    degraded = status.condition("Degraded")
    assert degraded is not None and degraded.status == "True"
    assert degraded.reason == Reason.INVALID_SPEC
    assert degraded.message.startswith("spec.model.source: file://")
