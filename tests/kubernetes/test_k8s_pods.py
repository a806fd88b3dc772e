"""Pure: pods and a Deployment's replicas -> the loop's replicas; the status merge patch."""

from __future__ import annotations

import pytest
from kvfleet_operator.runtimes.kubernetes.ports.pods import pod_replica, role_replicas, router_urls
from kvfleet_operator.runtimes.kubernetes.ports.status_store import merge_diff


def pod(name="p", ip="10.0.0.1", ready=True, phase="Running", annotations=None, waiting=None,
        deleting=False, restarts=0, start="2026-01-01T00:00:00Z"):  # fmt: skip
    engine = {"name": "engine", "restartCount": restarts,
              "state": {"waiting": waiting} if waiting else {"running": {}},
              "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}
    meta = {"name": name, "annotations": annotations or {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    return {"metadata": meta,
            "status": {"phase": phase, "podIP": ip, "startTime": start,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [engine]}}


@pytest.mark.parametrize("kwargs, state", [
    ({}, "ready"),
    ({"ready": False}, "starting"),
    ({"ip": ""}, "starting"),
    ({"annotations": {"kvfleet.io/draining": "t"}}, "draining"),
    ({"annotations": {"kvfleet.io/draining": "t"}, "ip": ""}, "stopping"),
    ({"annotations": {"kvfleet.io/stopping": "t"}}, "stopping"),
    ({"deleting": True}, "stopping"),
    ({"phase": "Failed", "ready": False}, "stopping"),  # evicted: replaced, not restarted
    ({"waiting": {"reason": "CrashLoopBackOff"}, "ready": False, "restarts": 3}, "failed"),
    ({"waiting": {"reason": "ContainerCreating"}, "ready": False}, "starting"),
])  # fmt: skip
def test_a_pod_is_in_one_phase(kwargs, state):
    replica = pod_replica(pod(**kwargs), "decode", 8000)
    assert replica.state == state
    assert replica.role == "decode"


def test_a_crashing_engine_says_why_and_counts_restarts():
    replica = pod_replica(pod(waiting={"reason": "CrashLoopBackOff"}, ready=False, restarts=3),
                          "unified", 8000)
    assert replica.last_error == "CrashLoopBackOff: exit 1 (Error)"
    assert replica.num_restarts == 3
    assert replica.address == "http://10.0.0.1:8000"
    assert replica.started_at == 1767225600.0


def test_missing_pods_are_starting_placeholders_and_a_surge_pod_is_not_counted():
    pods = [pod("a"), pod("b", ready=False, start="2026-01-01T00:05:00Z")]
    ahead = role_replicas("unified", "p-unified", 4, pods, 8000, now=5.0)
    assert [(r.name, r.state) for r in ahead] == [
        ("a", "ready"), ("b", "starting"), ("p-unified-pending-0", "starting"),
        ("p-unified-pending-1", "starting")]
    assert ahead[-1].is_placeholder and not ahead[0].is_placeholder
    surge = role_replicas("unified", "p-unified", 1, pods, 8000, now=5.0)
    assert [(r.name, r.state) for r in surge] == [("a", "ready"), ("b", "stopping")]
    assert [r.name for r in role_replicas("unified", "p-unified", None, pods, 8000, 5.0)] == [
        "a", "b"]  # no Deployment yet: what is there, no placeholders


def test_router_urls_are_running_pods_by_ip():
    pods = [pod("r1", ip="10.0.0.2"), pod("r2", ip="10.0.0.1"), pod("r3", phase="Pending"),
            pod("r4", deleting=True), pod("r5", ip="")]
    assert router_urls(pods, 8000) == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]


def test_merge_diff_sends_lists_whole_and_nulls_for_what_went_away():
    old = {"a": 1, "roles": {"x": {"n": 1}, "y": {"n": 2}}, "conditions": [{"t": 1}, {"t": 2}],
           "gone": "z"}
    new = {"a": 1, "roles": {"x": {"n": 3}}, "conditions": [{"t": 1}, {"t": 3}]}
    assert merge_diff(old, new) == {"roles": {"x": {"n": 3}, "y": None},
                                    "conditions": [{"t": 1}, {"t": 3}], "gone": None}
    assert merge_diff(new, new) == {}
