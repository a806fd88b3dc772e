"""`spec.routing.flowControl` is the router's flow control: the pool's tenants, bands,
weights, quotas, queue bounds and TTL reach the router config every runtime pushes
(reconcile -> build_router_config), and the router's own flow and quota code reads them as
the pool said. `kvfleet up` takes the API keys as a file; a pool naming a keys Secret never
runs open locally."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kvfleet_operator import api
from kvfleet_operator.cli import up
from kvfleet_operator.decide.reconcile import Observed, ObservedReplica, reconcile
from kvfleet_operator.decide.router_config import COLD_START_HOLD_S
from kvfleet_operator.tools.crd_validate import apply_defaults, validate_manifest
from kvfleet_router.config import RouterConfig
from kvfleet_router.flow.fair_queue import FairQueue, Ticket
from kvfleet_router.flow.service import AttainedService
from kvfleet_router.flow.tenants import tenant_share
from kvfleet_router.quota import QuotaBook
from pool_corpus import CRD, SCHEMA

WALL = datetime(2026, 1, 1, tzinfo=UTC)
FLOW = {
    "tenantHeader": "x-team",
    "defaultBand": "sheddable",
    "defaultQuotas": {"rpm": 60},
    "tenants": [
        {"name": "chat", "band": "critical", "weight": 4, "quotas": {"tpm": 100000}},
        {"name": "batch", "band": 5, "weight": 0.5},
        {"name": "team-a"},
    ],
    "maxQueued": 400,
    "maxQueuedPerBand": {"sheddable": 50, "5": 20},
    "queueTtlSeconds": 12.5,
    "apiKeysSecretRef": {"name": "team-keys"},
}


def manifest(flow=None, engine=None, autoscaling=None, topology=None):
    spec = {"model": {"name": "m", "source": "hf://org/m"},
            "engine": engine or {"kind": "vllm"},
            "topology": topology or {"unified": {"replicas": {"min": 1, "max": 4}}}}
    if flow is not None:
        spec["routing"] = {"flowControl": flow}
    if autoscaling:
        spec["autoscaling"] = autoscaling
    return {"apiVersion": "kvfleet.io/v1alpha1", "kind": "InferencePool",
            "metadata": {"name": "p"}, "spec": spec}


def pushed(m) -> RouterConfig:
    """The config the router takes for this pool, as every runtime pushes it."""
    reps = [ObservedReplica(name="u1", role="unified", phase="ready", url="http://h:1")]
    config = reconcile(api.parse_pool(m), Observed(reps), now=0.0, wall=WALL).router_config
    return RouterConfig.from_dict(config)


def test_the_crd_and_the_parser_agree_on_a_full_flow_control():
    m = manifest(FLOW)
    assert [str(v) for v in validate_manifest(m, CRD)] == []
    assert api.to_dict(api.parse_pool(m).spec) == apply_defaults(SCHEMA, m)["spec"]


def test_the_pools_tenants_bands_and_weights_are_the_routers():
    cfg = pushed(manifest(FLOW))
    fc = cfg.flow_control
    assert fc.tenant_header == "x-team"
    assert tenant_share(fc, "chat") == (-1, 4.0)
    assert tenant_share(fc, "batch") == (5, 0.5)
    assert tenant_share(fc, "team-a") == (0, 1.0)  # listed without a band: standard
    assert tenant_share(fc, "stranger") == (1, 1.0)  # defaultBand: sheddable
    assert (fc.band_bound(1), fc.band_bound(5), fc.band_bound(0)) == (50, 20, None)
    assert (cfg.queue.max_size, cfg.queue.timeout_s) == (400, 12.5)


def test_the_router_serves_the_pools_critical_tenant_first():
    """The pushed config drives the router's own fair queue: chat (critical) before the
    sheddable stranger and band-5 batch, queued earlier."""
    fc = pushed(manifest(FLOW)).flow_control
    q = FairQueue(10, AttainedService(fc.service_window_s), fc.band_bound)
    for i, tenant in enumerate(["stranger", "batch", "chat"]):
        band, weight = tenant_share(fc, tenant)
        q.push(Ticket(tenant=tenant, band=band, weight=weight, seq=i), 0.0)
    assert q.head(0.0).tenant == "chat"


def test_the_pools_quotas_are_the_routers():
    cfg = pushed(manifest(FLOW))
    book = QuotaBook(cfg.quotas)
    assert (book.limits("chat").rpm, book.limits("chat").tpm) == (0, 100000)
    assert (book.limits("stranger").rpm, book.limits("stranger").tpm) == (60, 0)
    # the default's 60 RPM (2 s of burst: 2 requests) holds for an unlisted tenant
    assert [book.admit("stranger", 1, 0.0).is_admitted for _ in range(3)] == [True, True, False]
    assert book.admit("chat", 1, 0.0).is_admitted  # listed: its own quotas, no RPM


def test_no_flow_control_leaves_the_routers_defaults():
    cfg = pushed(manifest())
    assert cfg.flow_control == RouterConfig().flow_control
    assert not cfg.quotas.is_enabled and cfg.queue == RouterConfig().queue
    assert not pushed(manifest({"tenants": [{"name": "a"}]})).quotas.is_enabled


@pytest.mark.parametrize("ttl, expected", [(None, COLD_START_HOLD_S), (3, 3.0)])
def test_the_pools_ttl_wins_over_the_cold_start_hold(ttl, expected):
    flow = {} if ttl is None else {"queueTtlSeconds": ttl}
    m = manifest(flow, autoscaling={"scaleToZero": {"enabled": True}},
                 topology={"unified": {"replicas": {"min": 0, "max": 2}}})
    assert pushed(m).queue.timeout_s == expected


@pytest.mark.parametrize("args, forwarded", [
    ([], False), (["--scheduling-policy", "priority"], True),
    (["--scheduling-policy=priority"], True), (["--scheduling-policy", "fcfs"], False)])
def test_vllm_gets_a_priority_only_when_it_schedules_by_priority(args, forwarded):
    cfg = pushed(manifest({"tenants": [{"name": "chat", "band": "critical"}]},
                          engine={"kind": "vllm", "args": args}))
    assert [e.engine for e in cfg.endpoints] == ["vllm"]
    assert cfg.flow_control.forward_priority_to_vllm is forwarded


def test_builtin_engines_take_the_priority():
    m = manifest({"tenants": [{"name": "chat", "band": "critical"}]},
                 engine={"kind": "builtin"})
    m["spec"]["model"]["source"] = "builtin://tiny-random"
    cfg = pushed(m)
    assert cfg.flow_control.forward_priority and cfg.endpoints[0].engine != "vllm"


def test_up_refuses_a_keys_secret_without_a_keys_file(tmp_path):
    pool = api.parse_pool(manifest(FLOW))
    with pytest.raises(up.UpError, match="apiKeysSecretRef names Secret team-keys .* "
                       "--api-keys-file FILE"):
        up._check_api_keys(pool, None)
    with pytest.raises(up.UpError, match="not a readable file"):
        up._check_api_keys(pool, tmp_path / "missing.yaml")
    keys = tmp_path / "keys.yaml"
    keys.write_text("sk-kvfleet-0123456789abcdef: chat\n")
    up._check_api_keys(pool, keys)
    up._check_api_keys(api.parse_pool(manifest()), None)  # no Secret named: nothing needed
