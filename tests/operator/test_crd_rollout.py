"""spec.rollout and status.rollout in the CRD (issue 30): canary and blue-green pools pass the
apiserver's checks with the defaults the operator applies, the steps' growth rule holds at
every index, and status.rollout is exactly what api/status.py writes."""

from __future__ import annotations

import copy
import dataclasses
import datetime

import jsonschema
import pytest
from kvfleet_operator import api
from kvfleet_operator.api.spec import ROLLOUT_STRATEGIES
from kvfleet_operator.api.status import (
    ROLLOUT_PHASES,
    Analysis,
    MetricCheck,
    RolloutPhase,
    RolloutStatus,
)
from kvfleet_operator.api.validation import camel
from kvfleet_operator.tools.crd_validate import apply_defaults, strict_schema, validate_manifest
from pool_corpus import CRD, SCHEMA, bad_pool_cases

BASE, _ = bad_pool_cases()
SPEC = SCHEMA["properties"]["spec"]["properties"]["rollout"]
STATUS = SCHEMA["properties"]["status"]["properties"]["rollout"]


def pool_with(rollout):
    manifest = copy.deepcopy(BASE)
    manifest["spec"]["rollout"] = rollout
    return manifest


CANARY = {
    "strategy": "canary",
    "steps": [{"weight": 10, "durationSeconds": 120}, {"weight": 40}, {"weight": 90}],
    "analysis": {"minRequests": 50, "maxErrorRate": 0.01, "maxTtftP90Seconds": 2,
                 "maxItlP90Ratio": 1.2},
    "paused": True,
}
BLUE_GREEN = {
    "strategy": "blueGreen",
    "blueGreen": {"holdSeconds": 300},
    "analysis": {"query": {"promql": 'sum(rate(app_errors_total{pool="pool"}[1m]))',
                           "max": 0.5}},
}


@pytest.mark.parametrize("rollout", [CANARY, BLUE_GREEN, {"strategy": "rolling"}, {}],
                         ids=["canary", "blueGreen", "rolling", "empty"])
def test_rollout_pool_passes_the_crd_with_the_operators_defaults(rollout):
    manifest = pool_with(rollout)
    assert [str(v) for v in validate_manifest(manifest, CRD)] == []
    defaulted = apply_defaults(SCHEMA, manifest)["spec"]
    assert api.to_dict(api.parse_pool(manifest).spec) == defaulted


def test_defaults_are_the_contracts():
    rollout = apply_defaults(SCHEMA, pool_with({}))["spec"]["rollout"]
    assert rollout["strategy"] == "rolling" and rollout["paused"] is False
    assert rollout["steps"] == [{"weight": w, "durationSeconds": 60} for w in (5, 25, 50)]
    assert rollout["blueGreen"] == {"holdSeconds": 60}
    assert rollout["analysis"] == {"minRequests": 20, "maxErrorRate": 0.05,
                                   "maxErrorRateIncrease": 0.02, "maxTtftP90Ratio": 1.5,
                                   "maxItlP90Ratio": 1.5}
    # A step written without a duration gets 60 s from the CRD too.
    steps = apply_defaults(SCHEMA, pool_with(CANARY))["spec"]["rollout"]["steps"]
    assert [s["durationSeconds"] for s in steps] == [120, 60, 60]


def test_strategy_enum_is_the_specs():
    assert SPEC["properties"]["strategy"]["enum"] == list(ROLLOUT_STRATEGIES)
    assert STATUS["properties"]["strategy"]["enum"] == list(ROLLOUT_STRATEGIES)


@pytest.mark.parametrize("bad_index", range(1, 20))
def test_growth_rule_reaches_every_step_index(bad_index):
    # The CEL rule walks a literal list of indices (CEL has no range): a pool with the most
    # steps allowed, only step `bad_index` out of order, must still be refused.
    weights = list(range(1, 21))
    weights[bad_index] = weights[bad_index - 1]
    manifest = pool_with({"strategy": "canary", "steps": [{"weight": w} for w in weights]})
    violations = validate_manifest(manifest, CRD)
    assert [(v.layer, v.path) for v in violations] == [("cel", "spec.rollout.steps")]
    with pytest.raises(api.SpecError) as info:
        api.parse_pool(manifest)
    assert info.value.path == f"spec.rollout.steps[{bad_index}].weight"


def test_the_most_steps_growing_pass():
    steps = [{"weight": w} for w in range(80, 100)]  # 20 steps, up to 99
    assert validate_manifest(pool_with({"strategy": "canary", "steps": steps}), CRD) == []


def test_status_rollout_fields_are_the_status_types():
    for cls, node in ((RolloutStatus, STATUS),
                      (Analysis, STATUS["properties"]["lastAnalysis"]),
                      (MetricCheck, STATUS["properties"]["lastAnalysis"]["properties"][
                          "checks"]["items"])):
        assert set(node["properties"]) == {camel(f.name) for f in dataclasses.fields(cls)}, cls
    assert STATUS["properties"]["phase"]["enum"] == list(ROLLOUT_PHASES)


def _status(phase: str, analysis: Analysis | None) -> dict:
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    status = api.PoolStatus(observed_generation=2, mode="unified")
    status.set_condition(api.ConditionType.PROGRESSING, api.TRUE,
                         api.Reason.ROLLOUT_IN_PROGRESS, "step 2/3 at 25%", now)
    status.set_condition(api.ConditionType.DEGRADED, api.TRUE, api.Reason.ROLLBACK_SLO,
                         "errorRate 0.2 > limit 0.05", now)
    status.rollout = RolloutStatus(
        strategy="canary", phase=phase, stable_revision="0123456789",
        canary_revision="abcdef0123", step=2, num_steps=3, weight=25,
        step_started_at=api.rfc3339(now), message="step 2/3", last_analysis=analysis)
    return status.to_dict()


ANALYSIS = Analysis(
    time="2026-01-01T00:01:00Z", passed=False, message="errorRate 0.2 > limit 0.05",
    canary_requests=40, stable_requests=400,
    checks=[MetricCheck("errorRate", 0.2, 0.01, 0.03, False),
            MetricCheck("query", None, None, 1.0, False),  # the query returned nothing
            MetricCheck("ttftP90Seconds", 0.4, 0.3, 0.45, True)])


@pytest.mark.parametrize("phase", ROLLOUT_PHASES)
def test_status_with_a_rollout_fits_the_status_schema(phase):
    validator = jsonschema.Draft4Validator(
        strict_schema(SCHEMA["properties"]["status"]),
        format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER)
    for analysis in (ANALYSIS, None):
        written = _status(phase, analysis)
        validator.validate(written)
        assert api.parse_status(written).to_dict() == written  # and reads back the same


def test_status_schema_refuses_what_the_operator_never_writes():
    validator = jsonschema.Draft4Validator(strict_schema(SCHEMA["properties"]["status"]))
    written = _status(RolloutPhase.PROGRESSING, ANALYSIS)
    for key, value in (("phase", "Canarying"), ("weight", 101), ("strategy", "recreate"),
                       ("stepIndex", 1)):
        bad = copy.deepcopy(written)
        bad["rollout"][key] = value
        assert not validator.is_valid(bad), key


def test_printer_columns_show_the_rollout():
    columns = CRD["spec"]["versions"][0]["additionalPrinterColumns"]
    by_name = {c["name"]: c for c in columns}
    assert by_name["Rollout"]["jsonPath"] == ".status.rollout.phase"
    assert by_name["Step"]["jsonPath"] == ".status.rollout.step"
    assert by_name["Weight"]["jsonPath"] == ".status.rollout.weight"
    assert by_name["Step"]["type"] == by_name["Weight"]["type"] == "integer"
    names = [c["name"] for c in columns]
    # After the pool's shape, before Ready and Age (kubectl's usual last columns).
    assert names.index("Policy") < names.index("Rollout") < names.index("Ready")
    assert names[-2:] == ["Ready", "Age"]
