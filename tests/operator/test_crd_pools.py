"""Pools against the CRD: examples pass schema + CEL, bad pools fail there and in api.py,
and the CRD's defaults and ranges agree with the Python types field by field."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from kvfleet_operator import api
from kvfleet_operator.api.errors import UnservableSpecError
from kvfleet_operator.api.fields import QUANTITY_PATTERN, camel, field_rule
from kvfleet_operator.tools.crd_validate import apply_defaults, cel_violations, validate_manifest
from pool_corpus import (
    CRD,
    EXAMPLES,
    SCHEMA,
    bad_pool_cases,
    build_case,
    cel_messages,
    load_yaml,
)

BASE, CASES = bad_pool_cases()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_passes_schema_and_cel(path):
    assert [str(v) for v in validate_manifest(load_yaml(path), CRD)] == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_defaults_match_python(path):
    manifest = load_yaml(path)
    defaulted = apply_defaults(SCHEMA, manifest)["spec"]
    assert api.to_dict(api.parse_pool(manifest).spec) == defaulted


def test_minimal_pool_defaults_match_python():
    manifest = {
        "apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "m"},
        "spec": {"model": {"name": "x", "source": "hf://org/x"}, "topology": {"unified": {}}},
    }
    defaulted = apply_defaults(SCHEMA, manifest)["spec"]
    parsed = api.to_dict(api.parse_pool(manifest).spec)
    assert parsed == defaulted
    # A real check, not two empty dicts: the CRD filled in the engine and autoscaling.
    assert defaulted["engine"]["blockSize"] == 16
    assert defaulted["autoscaling"]["scaleDown"]["stabilizationWindowSeconds"] == 300


def _pairs(cls, node, path):
    """(path, dataclass field, schema node) for every field, recursing into nested specs."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = camel(f.name)
        sub = node["properties"][key]
        yield f"{path}.{key}", f, sub, node
        inner = hints[f.name]
        options = [a for a in typing.get_args(inner) if a is not type(None)] or [inner]
        target = options[0]
        if typing.get_origin(target) is list:
            (target,) = typing.get_args(target)
            sub = sub["items"]
        if dataclasses.is_dataclass(target):
            yield from _pairs(target, sub, f"{path}.{key}")


def test_every_spec_field_agrees_with_the_crd():
    spec_node = SCHEMA["properties"]["spec"]
    seen = 0
    for path, f, node, parent in _pairs(api.PoolSpec, spec_node, "spec"):
        seen += 1
        rule = field_rule(f)
        if "default" in node and not isinstance(node["default"], dict | list):
            assert f.default == node["default"], path
        elif not isinstance(node.get("default"), dict | list):
            assert f.default is None or f.default is dataclasses.MISSING, path
        assert tuple(node.get("enum", ())) == (rule.enum or ()), path
        assert node.get("pattern") == rule.pattern, path
        assert node.get("maxLength") == rule.max_length, path
        assert node.get("minLength") == rule.min_length, path
        assert node.get("maxItems", node.get("maxProperties")) == rule.max_items, path
        inner = node.get("items") or node.get("additionalProperties")
        if rule.items is not None:  # rules on list items / map values
            assert inner.get("maxLength") == rule.items.max_length, path
            assert bool(inner.get("x-kubernetes-int-or-string")) == rule.items.is_quantity, path
            if rule.items.is_quantity:
                assert inner["pattern"] == QUANTITY_PATTERN, path
        assert (camel(f.name) in parent.get("required", ())) == rule.is_required, path
        if rule.by_cel:  # the range lives in a CEL rule on the parent, not in the schema
            assert "minimum" not in node and "maximum" not in node, path
            assert any(camel(f.name) in r["rule"] for r in parent["x-kubernetes-validations"])
        else:
            assert node.get("minimum") == rule.minimum, path
            assert node.get("maximum") == rule.maximum, path
            assert bool(node.get("exclusiveMinimum")) == rule.exclusive_minimum, path
    # And no CRD field lacks a Python twin.
    def count(node):
        props = node.get("properties") or {}
        return len(props) + sum(count(p.get("items", p)) for p in props.values())
    assert seen == count(spec_node)


def test_corpus_is_big_enough_and_ids_unique():
    ids = [c["id"] for c in CASES]
    assert len(ids) >= 40 and len(set(ids)) == len(ids)
    assert {c["layer"] for c in CASES} == {"schema", "cel", "operator"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_bad_pool_rejected_by_crd(case):
    violations = validate_manifest(build_case(BASE, case), CRD)
    if case["layer"] == "operator":  # beyond what the apiserver can know: parse_pool's job
        assert violations == [], [str(v) for v in violations]
        with pytest.raises(UnservableSpecError):
            api.parse_pool(build_case(BASE, case))
        return
    assert violations, "the CRD accepted it"
    assert {v.layer for v in violations} == {case["layer"]}, [str(v) for v in violations]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_bad_pool_rejected_by_api_naming_the_field(case):
    with pytest.raises(api.SpecError) as info:
        api.parse_pool(build_case(BASE, case))
    assert info.value.path == case["path"]
    assert case["error"] in info.value.message
    assert str(info.value).startswith(case["path"])


def test_base_of_the_corpus_is_valid():
    assert validate_manifest(BASE, CRD) == []
    api.parse_pool(BASE)


def test_every_cel_rule_is_exercised_by_the_corpus():
    fired = set()
    for case in CASES:
        manifest = build_case(BASE, case)
        if isinstance(manifest, dict):
            fired |= {v.message for v in cel_violations(SCHEMA, apply_defaults(SCHEMA, manifest))}
    assert cel_messages() - fired == set()
