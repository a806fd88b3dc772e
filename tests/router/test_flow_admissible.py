"""Flow control's pure edges (flow/saturation.py, flow/tenants.py): which endpoints are
ready and free for a request, and a tenant's band, weight, engine priority and label."""

from __future__ import annotations

from kvfleet_router.config import FlowControlConfig, SaturationConfig, TenantConfig
from kvfleet_router.flow.saturation import admissible
from kvfleet_router.flow.tenants import (
    OTHER,
    SHEDDABLE,
    TenantLabels,
    engine_priority,
    request_band,
    tenant_share,
)
from policy_fixtures import ep


def test_only_ready_endpoints_of_the_role_count_and_excluded_ones_do_not():
    eps = [ep("a", kv=0.1), ep("b", kv=0.1), ep("dec", kv=0.1, role="decode"),
           ep("gone", kv=0.1, draining=True)]
    cfg = SaturationConfig()
    assert admissible(eps, "unified", 0.0, cfg) == (2, frozenset({"a", "b"}))
    assert admissible(eps, "unified", 0.0, cfg, exclude=frozenset({"a"})) == (
        1, frozenset({"b"}))
    assert admissible(eps, "unified", 0.0, cfg, allowed=frozenset({"b", "dec"})) == (
        1, frozenset({"b"}))


def test_without_seats_to_outrank_a_full_or_queueing_endpoint_is_not_free():
    full, queueing = ep("full", kv=0.99), ep("queueing", kv=0.1, waiting=1)
    ready, free = admissible([full, queueing, ep("ok", kv=0.1)], "unified", 0.0,
                             SaturationConfig(max_waiting=1))  # one waiting is the limit
    assert ready == 3 and free == frozenset({"ok"})


def test_a_tenant_not_configured_has_the_default_band_and_weight_one():
    cfg = FlowControlConfig(default_band="sheddable",
                            tenants={"gold": TenantConfig(band="critical", weight=3)})
    assert tenant_share(cfg, "gold") == (-1, 3.0)
    assert tenant_share(cfg, "anyone") == (SHEDDABLE, 1.0)


def test_a_priority_of_one_already_moves_a_request_down_never_up():
    assert request_band(0, 1) == SHEDDABLE and request_band(0, 0) == 0
    assert request_band(-1, -5) == -1  # a negative priority orders, it does not promote
    assert engine_priority(0, 1) == 1 and engine_priority(0, 0) == 0
    assert engine_priority(0, 3) == 3 and engine_priority(-1, -3) == -1


def test_configured_tenants_keep_their_label_past_the_cap():
    cfg = FlowControlConfig(tenants={"gold": TenantConfig()})
    labels = TenantLabels(max_labels=1)
    assert labels.label("first", cfg) == "first"
    assert labels.label("second", cfg) == OTHER  # the cap is reached
    assert labels.label("gold", cfg) == "gold"  # configured: always by name
    assert labels.label("first", cfg) == "first"  # a label once given is kept
