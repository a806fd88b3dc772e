"""helm-python-sdk lints the chart with no error or warning, and every object it renders,
for the default values and for each example values file (charts/kvfleet/ci/), validates
against the Kubernetes 1.30 and 1.33 strict OpenAPI schemas (kubernetes-validate; unknown
fields are errors). The Prometheus Operator kinds have no schema there: test_chart_observability
checks their shape against the Services and pods they select."""

from __future__ import annotations

import helm_python as helm
import kubernetes_validate
import pytest
from chart_render import CHART, EXAMPLE_VALUES, NAMESPACE, VALUE_SETS, crd_documents, manifests

VERSIONS = ("1.30.0", "1.33.0")
WARNING = 2  # helm lint severities: 1 info, 2 warning, 3 error
PROMETHEUS_OPERATOR = "monitoring.coreos.com/v1"


def test_there_are_example_values_files():
    assert len(EXAMPLE_VALUES) >= 3


@pytest.mark.parametrize("kube_version", [f"v{v}" for v in VERSIONS])
@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_lint_has_no_error_or_warning(name, kube_version):
    report = helm.lint(CHART, VALUE_SETS[name], namespace=NAMESPACE, strict=True,
                       kube_version=kube_version)  # fmt: skip
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= WARNING] == []


def test_lint_reports_a_broken_value():
    report = helm.lint(CHART, {"metrics": {"port": "9090x"}}, namespace=NAMESPACE)
    assert report["errors"] and any(m["severity"] > WARNING for m in report["messages"])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_rendered_object_validates(name, version):
    objs = manifests(VALUE_SETS[name])
    assert {"ClusterRole", "ClusterRoleBinding", "Deployment"} <= {o["kind"] for o in objs}
    for obj in objs:
        if obj["apiVersion"] == PROMETHEUS_OPERATOR:
            continue
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_crds_validate(version):
    docs = crd_documents()
    assert [d["kind"] for d in docs] == ["CustomResourceDefinition"]
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_a_broken_object_is_caught():
    deployment = next(o for o in manifests() if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"]["readOnlyRootFS"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)
