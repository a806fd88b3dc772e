"""kvfleet_operator.api: parse_pool never tracebacks, agrees with the CRD, and status helpers."""

from __future__ import annotations

import copy
import datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvfleet_operator import api
from kvfleet_operator.tools.crd_validate import validate_manifest
from pool_corpus import CRD, EXAMPLES, load_yaml

T0 = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
MANIFESTS = [load_yaml(p) for p in EXAMPLES]


def pool(**spec_overrides):
    spec = {"model": {"name": "m", "source": "hf://org/m"}, "topology": {"unified": {}}}
    spec.update(spec_overrides)
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "p"},
            "spec": spec}


@pytest.mark.parametrize(
    "manifest, path, fragment",
    [
        (None, "", "must be an object, got null"),
        (42, "", "must be an object, got integer"),
        ({}, "apiVersion", "must be kvfleet.io/v1alpha1"),
        ({**pool(), "apiVersion": "inference.networking.k8s.io/v1"}, "apiVersion", "got"),
        ({**pool(), "kind": "Deployment"}, "kind", "must be InferencePool"),
        ({**pool(), "metadata": None}, "metadata", "must be an object"),
        ({**pool(), "metadata": {}}, "metadata.name", "required"),
        ({**pool(), "metadata": {"name": "p", "namespace": 3}}, "metadata.namespace", "string"),
        ({**pool(), "metadata": {"name": "p", "labels": {"a": 1}}}, "metadata.labels", "strings"),
        ({**pool(), "spec": None}, "spec", "must be an object, got null"),
        (pool(model={"name": "m", "source": "hf://x", "extra": 1}), "spec.model.extra",
         "unknown field (known fields: name, servedModelName, source)"),
        (pool(engine={"max_num_seqs": 8}), "spec.engine.max_num_seqs", "unknown field"),
        (pool(topology={"prefill": {"replicas": {"min": -1}}, "decode": {}}),
         "spec.topology.prefill.replicas.min", "must be an integer in [0, 1000], got -1"),
        (pool(topology={"unified": {"replicas": []}}), "spec.topology.unified.replicas",
         "must be an object, got array"),
        (pool(routing={"weights": {"prefix": float("inf")}}), "spec.routing.weights.prefix",
         "must be a finite number in [0, 100], got inf"),
        (pool(topology={"unified": {"nodeSelector": {1: "a"}}}),
         "spec.topology.unified.nodeSelector", "keys must be strings, got integer"),
    ],
)
def test_junk_is_a_spec_error_naming_the_field(manifest, path, fragment):
    with pytest.raises(api.SpecError) as info:
        api.parse_pool(manifest)
    assert info.value.path == path and fragment in info.value.message
    assert str(info.value) == (f"{path}: {info.value.message}" if path else info.value.message)


def test_parse_fills_identity_and_defaults():
    p = api.parse_pool({**pool(), "metadata": {"name": "p", "namespace": "ml", "generation": 4,
                                                "uid": "u-1", "labels": {"team": "a"}}})
    assert (p.name, p.namespace, p.generation, p.uid, p.labels) == ("p", "ml", 4, "u-1",
                                                                    {"team": "a"})
    assert p.spec.engine.kind == "vllm" and p.spec.routing.policy == "cache-aware"
    assert p.spec.model.api_name == "m"
    assert p.to_dict()["spec"]["topology"] == {"unified": {"replicas": {"min": 1, "max": 1},
                                                           "gpus": 0}}


def test_dataclasses_check_themselves_when_built_in_code():
    with pytest.raises(api.SpecError, match=r"^min: must be <= max \(3 > 2\)$"):
        api.ReplicasSpec(min=3, max=2)
    with pytest.raises(api.SpecError, match="power of two"):
        api.EngineSpec(block_size=24)
    topo = api.TopologySpec(prefill=api.RoleSpec(), decode=api.RoleSpec())
    assert topo.is_disaggregated and list(topo.roles()) == ["prefill", "decode"]


def test_load_pool_reports_file_problems(tmp_path):
    with pytest.raises(api.SpecError, match="cannot read"):
        api.load_pool(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed\n")
    with pytest.raises(api.SpecError, match="not valid YAML"):
        api.load_pool(bad)
    two = tmp_path / "two.yaml"
    two.write_text(EXAMPLES[0].read_text() + "\n---\n" + EXAMPLES[1].read_text())
    with pytest.raises(api.SpecError, match="expected exactly one InferencePool, found 2"):
        api.load_pool(two)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    with pytest.raises(api.SpecError, match="found 0"):
        api.load_pool(empty)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 70000) | st.text(max_size=6)
    | st.floats(-2, 2, allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk=json_values)
def test_any_json_is_parsed_or_a_spec_error(junk):
    for manifest in (junk, {**pool(), "spec": junk}):
        try:
            api.parse_pool(manifest)
        except api.SpecError:
            pass


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, (*prefix, i))


@st.composite
def mutated_pools(draw):
    manifest = copy.deepcopy(draw(st.sampled_from(MANIFESTS)))
    paths = [p for p in _paths(manifest["spec"]) if p]
    path = draw(st.sampled_from(paths))
    node = manifest["spec"]
    for part in path[:-1]:
        node = node[part]
    if isinstance(node, dict) and draw(st.booleans()):
        del node[path[-1]]
    else:
        node[path[-1]] = draw(json_values)
    return manifest


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifest=mutated_pools())
def test_api_and_crd_agree_on_mutated_examples(manifest):
    """Differential check: the Python parser accepts exactly what the CRD accepts, except
    pools it knows can never run (UnservableSpecError: things the apiserver cannot know)."""
    from kvfleet_operator.api.errors import UnservableSpecError

    crd_says = [str(v) for v in validate_manifest(manifest, CRD)]
    try:
        api.parse_pool(manifest)
        api_says = None
    except UnservableSpecError as exc:
        assert not crd_says, (crd_says, str(exc))  # only ever beyond the CRD, never instead
        return
    except api.SpecError as exc:
        api_says = str(exc)
    assert (not crd_says) == (api_says is None), (crd_says, api_says)


def test_set_condition_moves_transition_time_only_on_flips():
    status = api.PoolStatus(observed_generation=2)
    status.set_condition(api.ConditionType.READY, api.FALSE, api.Reason.REPLICAS_NOT_READY,
                         "0/1 ready", T0)
    later = T0 + datetime.timedelta(seconds=30)
    same = status.set_condition(api.ConditionType.READY, api.FALSE,
                                api.Reason.REPLICAS_NOT_READY, "still 0/1", later)
    assert same.last_transition_time == "2026-01-01T12:00:00Z" and same.message == "still 0/1"
    flipped = status.set_condition(api.ConditionType.READY, api.TRUE,
                                   api.Reason.ALL_REPLICAS_READY, "1/1 ready", later)
    assert flipped.last_transition_time == "2026-01-01T12:00:30Z"
    assert flipped.observed_generation == 2 and flipped.is_true
    status.set_condition(api.ConditionType.DEGRADED, api.FALSE, api.Reason.AS_EXPECTED, "", T0)
    assert [c.type for c in status.conditions] == ["Ready", "Degraded"]
    assert len(status.conditions) == 2


def test_every_reason_is_camel_case_and_assigned():
    import re

    names = {v for k, v in vars(api.Reason).items() if k.isupper()}
    listed = {r for reasons in api.REASONS_BY_TYPE.values() for r in reasons}
    assert names == listed
    assert all(re.fullmatch(r"[A-Z][A-Za-z]+", n) for n in names)
    assert set(api.REASONS_BY_TYPE) == set(api.CONDITION_TYPES)


def test_status_round_trip_and_junk_tolerance():
    status = api.PoolStatus(observed_generation=5, mode="disaggregated", router_config_version=9,
                            endpoint="http://127.0.0.1:8080")
    status.roles["decode"] = api.RoleStatus(
        desired_replicas=4, replicas=3, ready_replicas=3, draining_replicas=1,
        last_scale_decision=api.ScaleDecision(
            time=api.rfc3339(T0), from_replicas=3, to_replicas=4, reason="ScalingUp",
            message="kv usage 0.93 > 0.85", signals={"kvCacheUsage": 0.93}),
    )
    status.set_condition(api.ConditionType.PROGRESSING, api.TRUE, api.Reason.SCALING_UP, "", T0)
    data = status.to_dict()
    assert data["roles"]["decode"]["readyOfDesired"] == "3/4"
    again = api.parse_status(data)
    assert again == status
    junk = {"observedGeneration": "x", "conditions": [1, {"type": 3}, {"type": "Ready"}],
            "roles": {"unified": "no", "decode": {"lastScaleDecision": {"signals": {"a": "b"}}}}}
    parsed = api.parse_status(junk)
    assert parsed.observed_generation == 0
    assert [c.type for c in parsed.conditions] == ["Ready"]
    assert parsed.conditions[0].status == api.UNKNOWN
    assert list(parsed.roles) == ["decode"]
    assert api.parse_status(None) == api.PoolStatus()
