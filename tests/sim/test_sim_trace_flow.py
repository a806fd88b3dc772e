"""kvfleet_sim.trace: a Mooncake row's flow-control fields (`tenant`, `priority`): read when
present, defaulted when absent, kept by rate copies; bad ones get one-line errors."""

import json

import pytest
from kvfleet_sim.trace import TraceError, TraceRequest, load_mooncake, multiply_rate


def row(**extra):
    return json.dumps({"timestamp": 0, "input_length": 10, "output_length": 2,
                       "hash_ids": [1], **extra})


def test_tenant_and_priority_are_read_and_defaulted(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([row(tenant="acme", priority=-2), row(), row(priority=3)]) + "\n")
    reqs = load_mooncake(path)
    assert [(r.tenant, r.priority) for r in reqs] == [("acme", -2), ("default", 0),
                                                      ("default", 3)]
    doubled = multiply_rate(reqs[:1], 2.0)
    assert [(r.tenant, r.priority) for r in doubled] == [("acme", -2), ("acme", -2)]


@pytest.mark.parametrize("extra,match", [
    ({"tenant": 7}, ":1: tenant must be a string of 1..128 characters, got 7"),
    ({"tenant": ""}, ":1: tenant must be a string"),
    ({"tenant": "x" * 129}, ":1: tenant must be a string"),
    ({"priority": "high"}, ":1: priority must be an integer, got 'high'"),
    ({"priority": 1.5}, ":1: priority must be an integer"),
    ({"priority": True}, ":1: priority must be an integer"),
])
def test_bad_flow_fields_get_one_line_errors(tmp_path, extra, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(row(**extra) + "\n")
    with pytest.raises(TraceError, match=match) as err:
        load_mooncake(path)
    assert "\n" not in str(err.value)


def test_trace_request_checks_its_fields():
    with pytest.raises(TraceError, match="tenant"):
        TraceRequest(0.0, 10, 1, tenant=None)  # type: ignore[arg-type]
    with pytest.raises(TraceError, match="priority"):
        TraceRequest(0.0, 10, 1, priority="1")  # type: ignore[arg-type]
