"""The chart's RBAC is exactly operator_manifests.RBAC_RULES (what the operator is tested to
call against kmock), split so that no Secret is readable cluster-wide:

- watching every namespace: a ClusterRole with every rule but Secrets, bound cluster-wide,
  and a Role with the Secrets rule in each of `rbac.secretNamespaces` (default: the release
  namespace);
- watching some namespaces: a Role with the pools' rules and Secrets in each, and a
  ClusterRole with only the cluster-scoped reads kopf needs (CRDs, namespaces).

No `*` verb, resource or apiGroup anywhere; no kopf peering objects (kvfleet runs kopf
standalone)."""

from __future__ import annotations

import pytest
from chart_render import NAMESPACE, VALUE_SETS, manifests, of_kind
from kvfleet_operator.runtimes.kubernetes.build.operator_manifests import RBAC_RULES

READ_VERBS = {"get", "list", "watch"}
WATCHED = ["inference", "staging"]
RBAC_SETS = {
    **VALUE_SETS,
    "watch-some": {"operator": {"watchNamespaces": WATCHED}},
    "secrets-in": {"rbac": {"secretNamespaces": ["inference", "team-a"]}},
}


def _rules(role: dict) -> list[tuple[str, str, tuple[str, ...]]]:
    out = []
    for rule in role["rules"]:
        assert len(rule["apiGroups"]) == 1 and len(rule["resources"]) == 1, rule
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        out.append((rule["apiGroups"][0], rule["resources"][0], tuple(rule["verbs"])))
    return out


def _expected() -> list[tuple[str, str, tuple[str, ...]]]:
    return [(group, resource, verbs) for group, resource, verbs, _ in RBAC_RULES]


def _granted(objs: list[dict]) -> dict[str, list[tuple[str, str, tuple[str, ...]]]]:
    """Where each rule is granted: "cluster", or the Role's namespace."""
    where: dict[str, list] = {}
    for role in of_kind(objs, "ClusterRole"):
        where.setdefault("cluster", []).extend(_rules(role))
    for role in of_kind(objs, "Role"):
        where.setdefault(role["metadata"]["namespace"], []).extend(_rules(role))
    return where


@pytest.mark.parametrize("name", sorted(RBAC_SETS))
def test_each_namespace_gets_exactly_the_operators_rules(name):
    """Per namespace the operator can act in, cluster-wide rules plus that namespace's Role
    are RBAC_RULES: no rule more, none less, the same verbs in the same order."""
    granted = _granted(manifests(RBAC_SETS[name]))
    namespaces = [ns for ns in granted if ns != "cluster"]
    assert namespaces
    for ns in namespaces:
        assert sorted(granted["cluster"] + granted[ns]) == sorted(_expected()), (
            f"{ns}: the chart's rules differ from operator_manifests.RBAC_RULES; change "
            "charts/kvfleet/templates/_rbac.tpl (cluster-scoped, namespaced or Secrets)"
        )


@pytest.mark.parametrize("name", sorted(RBAC_SETS))
def test_no_wildcards_and_no_cluster_wide_secret_reads(name):
    objs = manifests(RBAC_SETS[name])
    for role in of_kind(objs, "ClusterRole") + of_kind(objs, "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert not any("*" in item for item in rule[field]), (role["metadata"], rule)
    for group, resource, verbs in _granted(objs)["cluster"]:
        assert not (group == "" and resource == "secrets" and READ_VERBS & set(verbs))
    # ...and nothing binds a ClusterRole inside a namespace either (a RoleBinding to a
    # ClusterRole would grant its rules there).
    for binding in of_kind(objs, "RoleBinding"):
        assert binding["roleRef"]["kind"] == "Role"


@pytest.mark.parametrize("name", sorted(RBAC_SETS))
def test_every_role_is_bound_to_the_operators_service_account(name):
    objs = manifests(RBAC_SETS[name])
    deployment = of_kind(objs, "Deployment")[0]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    roles = {(r["kind"], r["metadata"].get("namespace"), r["metadata"]["name"])
             for r in of_kind(objs, "ClusterRole") + of_kind(objs, "Role")}  # fmt: skip
    bound = set()
    for binding in of_kind(objs, "ClusterRoleBinding") + of_kind(objs, "RoleBinding"):
        assert binding["subjects"] == subject
        ref = binding["roleRef"]
        bound.add((ref["kind"], binding["metadata"].get("namespace"), ref["name"]))
    assert bound == roles


def test_watching_some_namespaces_keeps_everything_namespaced_in_roles():
    granted = _granted(manifests({"operator": {"watchNamespaces": WATCHED}}))
    assert sorted(granted) == sorted(["cluster", *WATCHED])
    assert {r for _, r, _ in granted["cluster"]} == {"customresourcedefinitions", "namespaces"}


def test_watching_every_namespace_reads_secrets_only_where_listed():
    granted = _granted(manifests())
    assert sorted(granted) == ["cluster", NAMESPACE]
    assert granted[NAMESPACE] == [("", "secrets", ("get", "create", "patch"))]
    granted = _granted(manifests({"rbac": {"secretNamespaces": ["inference", "team-a"]}}))
    assert sorted(granted) == ["cluster", "inference", "team-a"]


def test_no_peering_permissions():
    for name, values in RBAC_SETS.items():
        groups = {g for _, rules in _granted(manifests(values)).items() for g, _, _ in rules}
        assert "kopf.dev" not in groups and "zalando.org" not in groups, name


def test_rbac_can_be_left_to_someone_else():
    objs = manifests({"rbac": {"create": False}})
    kinds = {o["kind"] for o in objs}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
