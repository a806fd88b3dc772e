"""values.schema.json rejects wrong types (Helm refuses to render, naming the key), the
templates `fail` or `require` what must be set, and docs/install.md's values table is the
one tools/gen_values_table.py generates from values.yaml's `# --` comments."""

from __future__ import annotations

import importlib.util
import json

import helm_python as helm
import pytest
import yaml
from chart_render import CHART, ROOT, VALUE_SETS, manifests, render_raw

WRONG = {
    "port is a string": ({"metrics": {"port": "9090"}}, "/metrics/port"),
    "port out of range": ({"metrics": {"port": 70000}}, "/metrics/port"),
    "namespaces is a string": (
        {"operator": {"watchNamespaces": "inference"}},
        "/operator/watchNamespaces",
    ),
    "namespace is not a DNS label": (
        {"operator": {"watchNamespaces": ["Inference_1"]}},
        "/operator/watchNamespaces/0",
    ),
    "verbose is a string": ({"operator": {"verbose": "yes"}}, "/operator/verbose"),
    "tick is zero": ({"operator": {"maxTickSeconds": 0}}, "/operator/maxTickSeconds"),
    "unknown pull policy": ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    "digest without sha256": ({"image": {"digest": "abc"}}, "/image/digest"),
    "replicas is not a value": ({"operator": {"replicas": 2}}, "/operator"),
    "a typo at the top": ({"serviceMonitor": {"enabled": True}}, "serviceMonitor"),
    "enabled is a string": ({"prometheusRule": {"enabled": "true"}}, "/prometheusRule/enabled"),
    "interval is a number": ({"podMonitor": {"interval": 30}}, "/podMonitor/interval"),
    "labels are a list": ({"prometheusRule": {"labels": ["a"]}}, "/prometheusRule/labels"),
}

MUST_SET = {
    "no image": ({"image": {"repository": None}}, "image.repository is required"),
    "no service account name": (
        {"serviceAccount": {"create": False}},
        "serviceAccount.name is required",
    ),
    "secret namespaces while watching some": (
        {"operator": {"watchNamespaces": ["a"]}, "rbac": {"secretNamespaces": ["b"]}},
        "rbac.secretNamespaces is for operator.watchNamespaces: [] only",
    ),
    "a service monitor without metrics": (
        {"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}},
        "metrics.serviceMonitor.enabled needs metrics.enabled",
    ),
}


def _load_generator():
    spec = importlib.util.spec_from_file_location(
        "gen_values_table", ROOT / "tools" / "gen_values_table.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_values_set_meets_the_schema(name):
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(VALUE_SETS[name])


@pytest.mark.parametrize("case", sorted(WRONG))
def test_a_wrong_type_fails_the_render(case):
    values, where = WRONG[case]
    with pytest.raises(helm.HelmValuesError) as err:
        render_raw(values)
    assert where in str(err.value)


@pytest.mark.parametrize("case", sorted(MUST_SET))
def test_what_must_be_set_fails_the_render_with_a_reason(case):
    values, message = MUST_SET[case]
    with pytest.raises(helm.HelmError) as err:
        render_raw(values)
    assert message in str(err.value)


def test_any_release_namespace_is_where_the_operator_says_it_runs():
    from chart_render import manifests

    objs = manifests(namespace="platform-ops")
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    assert deployment["metadata"]["namespace"] == "platform-ops"
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--operator-namespace") + 1] == "platform-ops"


def test_the_schema_knows_every_value_and_nothing_else():
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(s, v, path):
        assert s.get("additionalProperties") is False or path, path
        props = s.get("properties", {})
        assert set(v) <= set(props), (path, set(v) - set(props))
        for key, value in v.items():
            if isinstance(value, dict) and props[key].get("properties"):
                walk(props[key], value, f"{path}.{key}")
                if key != "resources":  # resources may also have `claims`
                    assert set(props[key]["properties"]) == set(value), f"{path}.{key}"

    walk(schema, values, "")
    assert set(schema["properties"]) - set(values) == {"global"}


def test_the_defaults_render():
    assert manifests()


def test_docs_install_md_has_the_generated_values_table():
    gen = _load_generator()
    doc = (ROOT / "docs" / "install.md").read_text()
    generated = gen.table((CHART / "values.yaml").read_text())
    assert gen.with_table(doc, generated) == doc, (
        "docs/install.md's values table is stale: python tools/gen_values_table.py --write"
    )
    keys = gen.documented_keys((CHART / "values.yaml").read_text())
    assert generated.count("\n") - 2 == len(keys)


def test_an_undocumented_value_is_refused():
    gen = _load_generator()
    text = (CHART / "values.yaml").read_text() + "\nsneaky: true\n"
    with pytest.raises(SystemExit, match="sneaky"):
        gen.table(text)
