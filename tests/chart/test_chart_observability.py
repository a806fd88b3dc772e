"""The chart's PrometheusRule and Grafana dashboard ConfigMap carry exactly
observability/'s rules and dashboard (the chart reads copies in charts/kvfleet/files/, kept
identical here), and the monitors select what they mean to: the ServiceMonitor the
operator's metrics Service, the PodMonitor every pool's engine and router pods as the
operator's builders make them."""

from __future__ import annotations

import json

import pytest
import yaml
from chart_render import CHART, ROOT, VALUE_SETS, manifests, of_kind, one, pool_children

COPIES = {
    "kvfleet-alerts.yaml": ROOT / "observability" / "prometheus" / "kvfleet-alerts.yaml",
    "kvfleet-dashboard.json": ROOT / "observability" / "grafana" / "kvfleet-dashboard.json",
}
ALL_ON = VALUE_SETS["observability-values"]


@pytest.mark.parametrize("name", sorted(COPIES))
def test_the_charts_copies_are_identical(name):
    assert (CHART / "files" / name).read_bytes() == COPIES[name].read_bytes(), (
        f"charts/kvfleet/files/{name} differs from {COPIES[name].relative_to(ROOT)}: copy it"
    )


def test_everything_optional_is_off_by_default():
    kinds = {o["kind"] for o in manifests()}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"}


def test_the_prometheus_rule_is_the_rule_file():
    rule = one(manifests(ALL_ON), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == yaml.safe_load(COPIES["kvfleet-alerts.yaml"].read_text())
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # Prometheus, not Helm, fills in the alerts' templates.
    assert "{{ $labels.pool }}" in json.dumps(rule["spec"])


def test_the_dashboard_configmap_is_the_dashboard_for_the_sidecar():
    cm = one(manifests(ALL_ON), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    assert cm["data"] == {"kvfleet-dashboard.json": COPIES["kvfleet-dashboard.json"].read_text()}
    default = one(manifests({"grafanaDashboard": {"enabled": True}}), "ConfigMap")
    assert default["metadata"]["namespace"] == "kvfleet-system"
    assert default["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_the_service_monitor_scrapes_the_metrics_service():
    objs = manifests(ALL_ON)
    monitor, service = one(objs, "ServiceMonitor"), one(objs, "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    namespace = service["metadata"]["namespace"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [namespace]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True  # the control plane's own `pool` label wins


def _selects(selector: dict, labels: dict) -> bool:
    if not selector["matchLabels"].items() <= labels.items():
        return False
    return all(e["operator"] == "Exists" and e["key"] in labels
               for e in selector.get("matchExpressions", []))  # fmt: skip


def test_the_pod_monitor_scrapes_every_pools_engines_and_routers():
    monitor = one(manifests(ALL_ON), "PodMonitor")
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"any": True}
    ports = {e["port"] for e in spec["podMetricsEndpoints"]}
    seen = set()
    for name, objs in pool_children().items():
        for deployment in of_kind(objs, "Deployment"):
            template = deployment["spec"]["template"]
            assert _selects(spec["selector"], template["metadata"]["labels"]), name
            pod = template["spec"]
            containers = pod["containers"] + pod.get("initContainers", [])
            served = {p["name"] for c in containers for p in c.get("ports", [])}
            assert "http" in served, (name, deployment["metadata"]["name"])
            seen |= served & ports
    assert seen == ports == {"http", "engine"}
    for endpoint in spec["podMetricsEndpoints"]:
        pool = next(r for r in endpoint["relabelings"] if r["targetLabel"] == "pool")
        # NS/NAME, as the operator's own series label pools, so the alerts can join them.
        assert pool["sourceLabels"] == [
            "__meta_kubernetes_namespace",
            "__meta_kubernetes_pod_label_kvfleet_io_pool",
        ]
        assert pool["separator"] == "/"


def test_the_pod_monitor_follows_the_watched_namespaces():
    monitor = one(manifests(VALUE_SETS["namespaced-values"]), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["inference", "staging"]}
    assert of_kind(manifests(VALUE_SETS["namespaced-values"]), "PrometheusRule") == []
