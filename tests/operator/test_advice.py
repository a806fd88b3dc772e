"""Warnings for settings that are valid but odd, and for fields a local fleet ignores."""

from kvfleet_operator.api import parse_pool
from kvfleet_operator.api.advice import odd_settings
from kvfleet_operator.runtimes.local.spec_support import unhonoured_fields


def _spec(autoscaling=None, engine=None, topology=None, routing=None):
    spec = {
        "model": {"name": "m", "source": "builtin://tiny-random"},
        "engine": {"kind": "builtin", **(engine or {})},
        "topology": topology or {"unified": {"replicas": {"min": 1, "max": 2}}},
    }
    if autoscaling:
        spec["autoscaling"] = autoscaling
    if routing:
        spec["routing"] = routing
    return parse_pool({"apiVersion": "kvfleet.io/v1alpha1", "kind": "InferencePool",
                       "metadata": {"name": "p"}, "spec": spec}).spec  # fmt: skip


def test_a_stabilization_window_thousands_of_drain_timeouts_long_is_odd():
    odd = odd_settings(_spec({"drainTimeoutSeconds": 1,
                              "scaleDown": {"stabilizationWindowSeconds": 3600}}))  # fmt: skip
    assert len(odd) == 1 and "stabilizationWindowSeconds (3600)" in odd[0]
    assert odd_settings(_spec()) == []  # the defaults are not odd


def test_a_gateway_is_named_as_something_a_local_fleet_ignores():
    lines = unhonoured_fields(_spec(routing={"gateway": {"kind": "gie"}}))
    assert len(lines) == 1 and "routing.gateway (gie)" in lines[0], lines


def test_fields_a_local_fleet_cannot_honour_are_named():
    role = {"replicas": {"min": 1, "max": 2}, "nodeSelector": {"gpu": "h100"},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "resources": {"limits": {"memory": "8Gi"}}}  # fmt: skip
    lines = unhonoured_fields(_spec(engine={"image": "ghcr.io/x/y:1"}, topology={"unified": role},
                                    routing={"replicas": 3, "placement": "sidecar"}))
    named = " ".join(lines)
    for field in ("engine.image", "routing.replicas (3)", "routing.placement (sidecar)",
                  "topology.unified.resources", "topology.unified.nodeSelector",
                  "topology.unified.tolerations"):
        assert field in named, lines
    assert unhonoured_fields(_spec()) == []
