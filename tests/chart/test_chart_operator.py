"""The chart's operator is `kvfleet operator manifests`' operator (operator_manifests.py):
one replica, strategy Recreate (kopf has no leader election; kvfleet runs it standalone),
the same command, probe, ports, security contexts and scratch volume, and pods the engines'
NetworkPolicy admits (OPERATOR_POD_LABELS in OPERATOR_NAMESPACE). Its args are what
`kvfleet operator run`'s own parser accepts, for every values set."""

from __future__ import annotations

import argparse
import tomllib

import pytest
import yaml
from chart_render import CHART, NAMESPACE, ROOT, VALUE_SETS, manifests, one, render_raw
from kvfleet_operator.runtimes.kubernetes.build.operator_manifests import build_operator_manifests
from kvfleet_operator.runtimes.kubernetes.build.options import (
    KVFLEET_IMAGE,
    OPERATOR_NAMESPACE,
    OPERATOR_POD_LABELS,
)
from kvfleet_operator.runtimes.kubernetes.run_cmd import add_run_parser, config_from


def _builder_deployment() -> dict:
    return next(o for o in build_operator_manifests() if o["kind"] == "Deployment")


def _container(deployment: dict) -> dict:
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _parse_run(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_run_parser(parser.add_subparsers(dest="command"))
    assert args[0] == "operator"
    return parser.parse_args(args[1:])


def test_the_chart_installs_where_the_network_policy_expects_the_operator():
    assert NAMESPACE == OPERATOR_NAMESPACE


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_one_replica_recreate(name):
    spec = one(manifests(VALUE_SETS[name]), "Deployment")["spec"]
    builder = _builder_deployment()["spec"]
    assert spec["replicas"] == builder["replicas"] == 1
    assert spec["strategy"] == builder["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_pods_carry_the_labels_the_engines_network_policy_admits(name):
    deployment = one(manifests(VALUE_SETS[name]), "Deployment")
    assert deployment["metadata"]["namespace"] == OPERATOR_NAMESPACE
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert OPERATOR_POD_LABELS.items() <= labels.items()
    assert OPERATOR_POD_LABELS.items() <= deployment["spec"]["selector"]["matchLabels"].items()


def test_the_pod_matches_the_builders():
    chart = one(manifests(), "Deployment")["spec"]["template"]["spec"]
    builder = _builder_deployment()["spec"]["template"]["spec"]
    assert chart["securityContext"] == builder["securityContext"]
    assert chart["volumes"] == builder["volumes"]
    ours, theirs = chart["containers"][0], builder["containers"][0]
    for key in ("name", "command", "securityContext", "volumeMounts", "ports"):
        assert ours[key] == theirs[key], key
    probe = dict(theirs["livenessProbe"], httpGet={"path": "/healthz", "port": "liveness"})
    assert ours["livenessProbe"] == probe
    assert ours["resources"]["requests"] == theirs["resources"]["requests"]
    assert ours["resources"]["limits"]["memory"] == theirs["resources"]["limits"]["memory"]


def test_default_args_are_the_builders_plus_image_and_tick():
    ours = _container(one(manifests(), "Deployment"))["args"]
    theirs = _container(_builder_deployment())["args"]
    assert ours == theirs + ["--image", KVFLEET_IMAGE, "--max-tick", "5"]


def test_the_default_image_is_the_releases():
    """appVersion is the package's version, and the default image the builders' own."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
    assert _container(one(manifests(), "Deployment"))["image"] == KVFLEET_IMAGE


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_args_parse_with_the_operators_own_parser(name):
    values = VALUE_SETS[name] or {}
    container = _container(one(manifests(values), "Deployment"))
    args = _parse_run(container["args"])
    config = config_from(args)
    operator = values.get("operator", {})
    watched = operator.get("watchNamespaces", [])
    assert args.all_namespaces is (not watched)
    assert (args.namespace or []) == watched
    assert config.prometheus_url == (operator.get("prometheusUrl") or None)
    assert config.options.hf_token_secret == (operator.get("hfTokenSecret") or None)
    assert config.max_tick_s == float(operator.get("maxTickSeconds", 5))
    assert args.liveness == "http://0.0.0.0:8080/healthz"
    metrics = values.get("metrics", {}).get("enabled", True)
    assert config.metrics_port == (9090 if metrics else None)
    assert config.image == operator.get("workloadImage", container["image"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == ({"liveness": 8080, "metrics": 9090} if metrics else {"liveness": 8080})


def test_the_image_is_pinned_by_digest_when_given():
    digest = "sha256:" + "ab" * 32
    container = _container(one(manifests({"image": {"digest": digest}}), "Deployment"))
    assert container["image"] == f"{KVFLEET_IMAGE.rsplit(':', 1)[0]}@{digest}"
    assert _parse_run(container["args"]).image == container["image"]
    container = _container(one(manifests({"image": {"tag": "0.2.0"}}), "Deployment"))
    assert container["image"] == "ghcr.io/kvfleet/kvfleet:0.2.0"


def test_the_metrics_service_and_network_policy_select_the_operator_pod():
    objs = manifests()
    deployment = one(objs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = one(objs, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    policy = one(objs, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]
    closed = one(manifests({"metrics": {"enabled": False}}), "NetworkPolicy")
    assert closed["spec"]["ingress"] == []


def test_notes_give_the_first_commands():
    notes = render_raw()["kvfleet/templates/NOTES.txt"]
    for command in ("kubectl -n kvfleet-system rollout status deployment/kvfleet-operator",
                    "kubectl get crd inferencepools.kvfleet.io",
                    "kubectl wait --for=condition=Ready inferencepools.kvfleet.io/",
                    "kubectl apply --server-side -f charts/kvfleet/crds/",
                    "rbac.secretNamespaces"):  # fmt: skip
        assert command in notes, command
    namespaced = render_raw({"operator": {"watchNamespaces": ["a", "b"]}})
    assert "watching the namespaces a, b" in namespaced["kvfleet/templates/NOTES.txt"]
