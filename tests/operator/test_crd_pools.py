"""Pools against the CRD: examples pass schema + CEL, bad pools fail there and in api.py,
and the CRD's defaults and ranges agree with the pydantic models' JSON Schema field by
field."""

from __future__ import annotations

import copy

import pytest
from kvfleet_operator import api
from kvfleet_operator.api.errors import UnservableSpecError
from kvfleet_operator.api.validation import json_schema
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


MODEL = json_schema(api.PoolSpec)
NULL = {"type": "null"}


def _model_node(node, defs):
    """A model schema node with `$ref` followed and Optional's `anyOf: [X, null]` taken off."""
    while True:
        if "$ref" in node:
            rest = {k: v for k, v in node.items() if k != "$ref"}
            node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **rest}
        elif NULL in node.get("anyOf", ()):
            (inner,) = [n for n in node["anyOf"] if n != NULL]
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            node = {**rest, **inner}
        else:
            return node


def _bounds(node, *, pydantic):
    """(minimum, is exclusive, maximum): pydantic writes JSON Schema 2020-12's numeric
    exclusiveMinimum, the CRD OpenAPI v3.0's boolean one."""
    if pydantic and "exclusiveMinimum" in node:
        return node["exclusiveMinimum"], True, node.get("maximum")
    return node.get("minimum"), bool(node.get("exclusiveMinimum")), node.get("maximum")


def _interval(low, is_open, high):
    low, high = (int(x) if float(x).is_integer() else x for x in (low, high))
    return f"{'(' if is_open else '['}{low}, {high}]"


def disagreements(model, crd, defs=None, path="spec", parent_crd=None):
    """Where the pydantic model's JSON Schema and the CRD's openAPIV3Schema differ: types,
    scalar defaults, enums, patterns, lengths, counts, ranges and required fields, field by
    field, and fields only one side has."""
    defs = model["$defs"] if defs is None else defs
    model = _model_node(model, defs)
    out = []

    def differ(what, mine, theirs):
        if mine != theirs:
            out.append(f"{path}: {what}: model {mine!r}, CRD {theirs!r}")

    differ("type", model.get("type"), crd.get("type"))
    differ("anyOf", model.get("anyOf"), crd.get("anyOf"))  # int-or-string quantities
    differ("x-kubernetes-int-or-string", model.get("x-kubernetes-int-or-string"),
           crd.get("x-kubernetes-int-or-string"))
    if not isinstance(crd.get("default"), dict | list):  # objects' {} defaults: factories
        differ("default", model.get("default"), crd.get("default"))
    for key in ("enum", "pattern", "maxLength", "minLength", "maxItems", "maxProperties"):
        differ(key, model.get(key), crd.get(key))
    mine, theirs = _bounds(model, pydantic=True), _bounds(crd, pydantic=False)
    if theirs == (None, False, None) and mine != theirs:
        # A range the CRD checks with a CEL rule on the parent: the rule must state it.
        key = path.rsplit(".", 1)[-1]
        rules = [r for r in (parent_crd or {}).get("x-kubernetes-validations", [])
                 if r.get("fieldPath") == f".{key}"]
        if not any(_interval(*mine) in r["message"] for r in rules):
            out.append(f"{path}: range {_interval(*mine)} is in no CEL rule of the CRD")
    else:
        differ("range", mine, theirs)
    if "properties" in model or "properties" in crd:
        props, crd_props = model.get("properties", {}), crd.get("properties", {})
        differ("required", sorted(model.get("required", [])), sorted(crd.get("required", [])))
        for key in sorted(set(props) | set(crd_props)):
            if key not in props or key not in crd_props:
                out.append(f"{path}.{key}: only in the {'CRD' if key in crd_props else 'model'}")
            else:
                out += disagreements(props[key], crd_props[key], defs, f"{path}.{key}", crd)
    for key, suffix in (("items", "[]"), ("additionalProperties", ".*")):
        if isinstance(model.get(key), dict) or isinstance(crd.get(key), dict):
            out += disagreements(model.get(key) or {}, crd.get(key) or {}, defs, path + suffix)
    return out


def test_every_spec_field_agrees_with_the_crd():
    spec_node = SCHEMA["properties"]["spec"]
    assert disagreements(MODEL, spec_node) == []

    def count(node):  # a real check, not two empty trees
        node = _model_node(node, MODEL["$defs"])
        props = node.get("properties") or {}
        return len(props) + sum(count(p.get("items", p)) for p in props.values())
    assert count(MODEL) >= 80


@pytest.mark.parametrize("change, where", [
    (("EngineSpec", "blockSize", "maximum", 512), "spec.engine.blockSize: range"),
    (("ReplicasSpec", "min", "default", 2), "spec.topology.unified.replicas.min: default"),
    (("TargetsSpec", "kvCacheUsage", "maximum", 2), "spec.autoscaling.targets.kvCacheUsage"),
    (("EngineSpec", "kind", "enum", ["vllm"]), "spec.engine.kind: enum"),
])  # fmt: skip
def test_a_model_that_drifts_from_the_crd_is_caught(change, where):
    """The comparison above is not vacuous: one bound, default or enum changed in the model's
    schema is reported, at that field."""
    cls, key, rule, value = change
    model = copy.deepcopy(MODEL)
    model["$defs"][cls]["properties"][key][rule] = value
    found = disagreements(model, SCHEMA["properties"]["spec"])
    assert any(d.startswith(where) for d in found), found


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
