"""The engines' NetworkPolicy, evaluated the way the network plugin would: it selects
exactly its pool's engine pods, and lets in exactly the pool's routers and the operator on
the engine port, and the pool's own engine pods (P/D KV transfer) on any port."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from k8s_pools import TOKENS, all_pools, by_kind, children
from kvfleet_operator.runtimes.kubernetes import BuildOptions, build_children
from kvfleet_operator.runtimes.kubernetes.build.options import OPERATOR_NAMESPACE

NS = "inference"


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    labels: tuple[tuple[str, str], ...]

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)


def matches(selector: dict, labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels is evaluated here"
    return selector.get("matchLabels", {}).items() <= labels.items()


def peer_admits(peer: dict, policy_ns: str, pod: Pod) -> bool:
    ns_sel, pod_sel = peer.get("namespaceSelector"), peer.get("podSelector")
    assert "ipBlock" not in peer
    if ns_sel is None:
        in_ns = pod.namespace == policy_ns
    else:
        in_ns = matches(ns_sel, {"kubernetes.io/metadata.name": pod.namespace})
    return in_ns and (pod_sel is None or matches(pod_sel, pod.label_map))


def admitted(policy: dict, pod: Pod) -> set[str]:
    """The ports (or "*") a source pod may reach on the selected pods."""
    ns = policy["metadata"]["namespace"]
    out: set[str] = set()
    for rule in policy["spec"]["ingress"]:
        peers = rule.get("from")  # no `from`: every source
        if peers is None or any(peer_admits(p, ns, pod) for p in peers):
            ports = rule.get("ports")
            out |= {f"{p['protocol']}/{p['port']}" for p in ports} if ports else {"*"}
    return {"*"} if "*" in out else out


def _pools():
    pools = all_pools()
    for pool in pools.values():
        pool.namespace = NS  # every pool in one namespace: neighbours must stay out
    return pools


POOLS = _pools()
PODS = [
    Pod(d["metadata"]["name"], NS, tuple(d["spec"]["template"]["metadata"]["labels"].items()))
    for pool in POOLS.values() for d in by_kind(children(pool), "Deployment")
] + [
    Pod("operator", OPERATOR_NAMESPACE, (("app.kubernetes.io/name", "kvfleet-operator"),)),
    Pod("other-in-operator-ns", OPERATOR_NAMESPACE, (("app", "grafana"),)),
    Pod("operator-lookalike", NS, (("app.kubernetes.io/name", "kvfleet-operator"),)),
    Pod("client", NS, (("app", "client"),)),
]


def engines_policy(objs: list[dict]) -> list[dict]:
    return [p for p in by_kind(objs, "NetworkPolicy") if p["metadata"]["name"].endswith("-engines")]


def test_only_the_pools_engines_reach_its_lmcache_server():
    pool = POOLS["vllm-lmcache"]
    [policy] = [p for p in by_kind(children(pool), "NetworkPolicy")
                if p["metadata"]["name"].endswith("-lmcache")]
    selected = {p.name for p in PODS if matches(policy["spec"]["podSelector"], p.label_map)}
    assert selected == {f"{pool.name}-lmcache"}
    allowed = {p.name: ports for p in PODS if (ports := admitted(policy, p))}
    assert allowed == {f"{pool.name}-unified": {"TCP/65432"}}


@pytest.mark.parametrize("name", sorted(POOLS))
def test_selects_exactly_the_pools_engine_pods(name):
    pool = POOLS[name]
    [policy] = engines_policy(children(pool))
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    selected = {p.name for p in PODS if matches(policy["spec"]["podSelector"], p.label_map)}
    assert selected == {f"{pool.name}-{role}" for role in pool.spec.topology.roles()}


@pytest.mark.parametrize("name", sorted(POOLS))
def test_admits_exactly_router_operator_and_peers(name):
    pool = POOLS[name]
    [policy] = engines_policy(children(pool))
    allowed = {p.name: ports for p in PODS if (ports := admitted(policy, p))}
    engines = {f"{pool.name}-{role}": {"*"} for role in pool.spec.topology.roles()}
    if pool.spec.routing.placement == "sidecar":  # the router sidecars' port is open to all
        others = {p.name: {"TCP/8000"} for p in PODS if p.name not in engines}
        assert allowed == {**others, "operator": {"TCP/8000", "TCP/8001"}, **engines}
    else:
        assert allowed == {f"{pool.name}-router": {"TCP/8000"}, "operator": {"TCP/8000"},
                           **engines}


def test_operator_location_is_configurable():
    pool = POOLS["local-cpu"]
    options = BuildOptions(operator_namespace="ops", operator_pod_labels={"app": "kvf"})
    [policy] = by_kind(build_children(pool, tokens=TOKENS, options=options), "NetworkPolicy")
    assert admitted(policy, Pod("op", "ops", (("app", "kvf"),))) == {"TCP/8000"}
    assert admitted(policy, Pod("operator", OPERATOR_NAMESPACE,
                                (("app.kubernetes.io/name", "kvfleet-operator"),))) == set()


def test_render_admits_the_operator_from_the_namespace_it_is_told(tmp_path):
    import subprocess
    import sys

    import yaml
    from k8s_pools import ROOT

    done = subprocess.run([sys.executable, "-m", "kvfleet_operator.cli.main", "operator", "render",
                           str(ROOT / "examples" / "vllm-unified.yaml"), "--without-secrets",
                           "--operator-namespace", "platform-ops"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (policy,) = [d for d in yaml.safe_load_all(done.stdout)
                 if d and d["kind"] == "NetworkPolicy" and "engine" in d["metadata"]["name"]]
    sources = [s for rule in policy["spec"]["ingress"] for s in rule.get("from") or []]
    namespaces = [s["namespaceSelector"]["matchLabels"] for s in sources
                  if "namespaceSelector" in s]  # fmt: skip
    assert {"kubernetes.io/metadata.name": "platform-ops"} in namespaces, namespaces
