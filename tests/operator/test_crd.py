"""The InferencePool CRD itself: a valid CustomResourceDefinition, structural, documented."""

from __future__ import annotations

import copy

import celpy
import jsonschema
import kubernetes_validate
import pytest
from kvfleet_operator import api
from pool_corpus import CRD, SCHEMA, walk


@pytest.mark.parametrize("version", ["1.30", "1.33", "1.37"])
def test_crd_is_a_valid_customresourcedefinition(version):
    assert kubernetes_validate.validate(CRD, version, strict=True)


def test_kubernetes_validate_catches_a_broken_crd():
    # Guards the test above: the validator really looks inside the CRD.
    broken = copy.deepcopy(CRD)
    broken["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "requried"
    ] = ["model"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.37", strict=True)


def test_names():
    spec = CRD["spec"]
    assert CRD["metadata"]["name"] == api.CRD_NAME == "inferencepools.kvfleet.io"
    assert spec["group"] == api.GROUP and spec["scope"] == "Namespaced"
    names = spec["names"]
    assert names["kind"] == api.KIND and names["plural"] == api.PLURAL
    assert names["shortNames"] == ["kvpool"]  # never infpool: the Gateway API owns that
    assert names["categories"] == ["kvfleet"]
    (version,) = spec["versions"]
    assert version["name"] == api.VERSION and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}


def test_printer_columns():
    columns = {c["name"]: c["jsonPath"] for c in CRD["spec"]["versions"][0][
        "additionalPrinterColumns"]}
    assert columns["Mode"] == ".status.mode"
    for role in api.ROLES:
        assert columns[role.capitalize()] == f".status.roles.{role}.readyOfDesired"
    assert columns["Policy"] == ".spec.routing.policy"
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_every_field_has_a_description():
    missing = [
        path for path, node in walk(SCHEMA)
        if path and path != "metadata" and not node.get("description")
    ]
    assert missing == []


def test_schema_is_structural():
    for path, node in walk(SCHEMA):
        if node.get("x-kubernetes-int-or-string"):
            assert [arm["type"] for arm in node["anyOf"]] == ["integer", "string"], path
            continue
        assert node.get("type") in {"object", "array", "string", "integer", "number",
                                    "boolean"}, path
        assert not ("properties" in node and "additionalProperties" in node), path
        if node["type"] == "array":
            assert "items" in node, path


def test_defaults_satisfy_their_own_schema():
    for path, node in walk(SCHEMA):
        if "default" in node:
            assert jsonschema.Draft4Validator(node).is_valid(node["default"]), path


def test_every_cel_rule_compiles_and_carries_a_message():
    env = celpy.Environment()
    rules = [r for _, node in walk(SCHEMA) for r in node.get("x-kubernetes-validations", [])]
    assert len(rules) >= 15
    for rule in rules:
        env.compile(rule["rule"])
        assert rule["message"]
        assert "oldSelf" not in rule["rule"]  # no transition rules: create and update agree


def test_cel_iterated_collections_are_bounded():
    # The apiserver rejects CEL whose cost it cannot bound; every map or list under a rule
    # that looks inside it carries maxProperties / maxItems.
    for path, node in walk(SCHEMA):
        if path.startswith("status"):
            continue
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
            assert "maxProperties" in node, path


def test_status_schema_matches_the_status_types():
    now = api.rfc3339(__import__("datetime").datetime(2026, 1, 1))
    status = api.PoolStatus(observed_generation=3, mode="unified", router_config_version=7)
    status.roles["unified"] = api.RoleStatus(
        desired_replicas=2, replicas=2, ready_replicas=1,
        last_scale_decision=api.ScaleDecision(
            time=now, from_replicas=1, to_replicas=2, reason=api.Reason.SCALING_UP,
            signals={"waitingPerReplica": 5.0},
        ),
    )
    import datetime

    for type_ in api.CONDITION_TYPES:
        status.set_condition(type_, api.TRUE, api.REASONS_BY_TYPE[type_][0], "m",
                             datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
    from kvfleet_operator.tools.crd_validate import strict_schema

    jsonschema.Draft4Validator(
        strict_schema(SCHEMA["properties"]["status"]),
        format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER,
    ).validate(status.to_dict())
    assert status.to_dict()["roles"]["unified"]["readyOfDesired"] == "1/2"


def test_cel_field_paths_point_at_real_fields():
    # The apiserver rejects a rule whose fieldPath names no field of the node's schema.
    for path, node in walk(SCHEMA):
        for rule in node.get("x-kubernetes-validations", []):
            target = node
            for part in rule.get("fieldPath", "").split(".")[1:]:
                assert part in target.get("properties", {}), (path, rule["fieldPath"])
                target = target["properties"][part]
