"""The operator's own manifests: valid, one replica with Recreate (kopf has no leader
election), restricted pod security, RBAC without `*` that covers every call the operator
makes against kmock, and docs/operator.md's RBAC table equal to `RBAC_RULES`."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
from k8s_pools import ROOT
from kvfleet_operator.runtimes.kubernetes.build.operator_manifests import (
    RBAC_RULES,
    build_operator_manifests,
)
from pod_security import violations
from test_k8s_validate import VERSIONS

MANIFESTS = build_operator_manifests()


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_validates(version):
    for obj in MANIFESTS:
        kubernetes_validate.validate(obj, version, strict=True)


def test_exactly_one_operator_and_never_two_during_a_rollout():
    deployment = next(o for o in MANIFESTS if o["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["operator", "run"] and "--liveness" in args
    assert violations(deployment["spec"]["template"]["spec"]) == {}


def test_rbac_names_every_verb_and_no_wildcard():
    role = next(o for o in MANIFESTS if o["kind"] == "ClusterRole")
    for rule in role["rules"]:
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key]
    assert len({(g, r) for g, r, _, _ in RBAC_RULES}) == len(RBAC_RULES)


def test_the_docs_table_is_the_rules():
    text = (ROOT / "docs" / "operator.md").read_text().split("## RBAC")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `([^`]*)` \| `([^`]+)` \| ([^|]+) \|", text, re.M)
    documented = {(g.strip('"'), r): tuple(v.strip(" `") for v in verbs.split(","))
                  for g, r, verbs in rows}
    assert documented == {(g, r): v for g, r, v, _ in RBAC_RULES}


def test_the_manifests_command_prints_them(capsys):
    import yaml
    from kvfleet_operator.cli.operator_cmd import main

    assert main(["manifests", "-n", "ops"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert docs == build_operator_manifests("ops")
