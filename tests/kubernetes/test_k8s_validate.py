"""Every child of every example pool (and of the variants) validates against the
Kubernetes 1.30 and 1.33 OpenAPI schemas (kubernetes-validate's strict schemas, which
also reject unknown fields)."""

from __future__ import annotations

import kubernetes_validate
import pytest
from k8s_pools import EXAMPLES, all_pools, children

VERSIONS = ("1.30.0", "1.33.0")
POOLS = all_pools()


def test_the_examples_are_all_covered():
    assert {p.stem for p in EXAMPLES} <= set(POOLS)
    assert len(EXAMPLES) >= 4


def test_the_schemas_asked_for_are_installed():
    installed = kubernetes_validate.utils.all_versions()
    for version in VERSIONS:
        assert version in installed


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", sorted(POOLS))
def test_every_child_validates(name, version):
    objs = children(POOLS[name])
    kinds = {o["kind"] for o in objs}
    assert kinds == {"Secret", "ConfigMap", "NetworkPolicy", "Service", "PodDisruptionBudget",
                     "Deployment"}
    for obj in objs:
        kubernetes_validate.validate(obj, version, strict=True)


def test_a_broken_manifest_is_caught():
    obj = children(POOLS["vllm-unified"])[-1]
    obj["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFS"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, VERSIONS[0], strict=True)
