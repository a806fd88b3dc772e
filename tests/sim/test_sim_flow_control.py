"""The simulator's router runs the router's own flow control (kvfleet_router.flow): fair
shares between tenants, the queue's TTL, bands; on the live flow bench's pool
(sim/pools/flow-bench.yaml: one engine of 4 sequences, 20 ms steps) in virtual time."""

import random
from pathlib import Path

import pytest
import yaml
from kvfleet_operator.api.pool import parse_pool
from kvfleet_sim.fleet import FleetSim, SimSettings
from kvfleet_sim.report import percentile
from kvfleet_sim.scalers import SCALERS
from kvfleet_sim.trace import TraceRequest

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "sim" / "pools" / "flow-bench.yaml"
PROFILE = str(ROOT / "sim" / "pools" / "profiles" / "flow-bench.json")


def run(trace, **flow):
    manifest = yaml.safe_load(POOL.read_text())
    manifest["spec"]["routing"]["flowControl"].update(flow)
    pool = parse_pool(manifest)
    sim = FleetSim(pool, SCALERS["fixed-max"](pool.spec),
                   SimSettings(startup_s=0.0, replica_profiles=(PROFILE,)))
    return sim, sim.run(trace)


def poisson(tenant, rate, end, seed, start=0.0, priority=0):
    rng, t, out = random.Random(seed), start, []
    while (t := t + rng.expovariate(rate)) < end:
        out.append(TraceRequest(t, 256, 16, tenant=tenant, priority=priority))
    return out


def by_tenant(result, tenant, since=0.0):
    return [f for f in result.finished
            if result.tenants.get(f.request_id, "default") == tenant and f.arrival >= since]


def ttft_p90(finished):
    return percentile([f.first_token - f.arrival for f in finished if not f.is_aborted], 90)


def test_a_quiet_tenant_keeps_its_latency_beside_a_flood():
    """B sends 10x A's rate, past the pool's capacity: A's TTFT p90 stays near its figure
    alone and A loses nothing; B gets what is left and is refused the rest (TTL)."""
    a = poisson("A", 1.5, 30.0, seed=1)
    _, alone = run(a)
    _, flood = run(sorted(a + poisson("B", 15.0, 30.0, seed=2), key=lambda r: r.t))
    a_alone, a_flood = by_tenant(alone, "A", 5.0), by_tenant(flood, "A", 5.0)
    assert not any(f.is_aborted for f in a_flood)
    assert ttft_p90(a_flood) <= 1.5 * ttft_p90(a_alone)
    b = by_tenant(flood, "B", 5.0)
    assert flood.refusals.get("saturated", 0) > 0 and sum(not f.is_aborted for f in b) > 100


def test_backlogged_tenants_share_served_tokens_by_weight():
    """Two tenants each sending far past capacity, weights 1 and 3: served tokens 1:3."""
    trace = sorted(poisson("light", 20.0, 40.0, seed=3) + poisson("heavy", 20.0, 40.0, seed=4),
                   key=lambda r: r.t)
    _, result = run(trace, tenants=[{"name": "light", "weight": 1}, {"name": "heavy",
                                                                      "weight": 3}])
    served = {t: sum(f.num_output_tokens + 256 for f in by_tenant(result, t, 5.0)
                     if not f.is_aborted and f.finished < 40.0) for t in ("light", "heavy")}
    share = served["heavy"] / (served["light"] + served["heavy"])
    assert share == pytest.approx(0.75, abs=0.05)


def test_a_request_queued_past_its_ttl_is_refused_and_counted_as_failed():
    """One tenant at three times the capacity: what waits past queueTtlSeconds is refused
    (saturated) and counted; no served request waited longer than the TTL."""
    trace = poisson("default", 30.0, 20.0, seed=5)
    _, result = run(trace, queueTtlSeconds=1.0)
    assert len(result.finished) == len(trace)
    refused = [f for f in result.finished if f.is_aborted]
    assert result.refusals == {"saturated": len(refused)} and len(refused) > len(trace) / 3
    assert all(f.first_token - f.arrival == pytest.approx(1.0) for f in refused)
    served = [f for f in result.finished if not f.is_aborted]
    # a served request left the queue within its TTL, then ran: 4 seqs in 20-40 ms steps
    assert max(f.first_token - f.arrival for f in served) < 1.0 + 1.0


def test_a_full_queue_refuses_at_once():
    trace = [TraceRequest(0.001 * i, 256, 16) for i in range(40)]
    _, result = run(trace, maxQueued=10)
    # 8 in flight (the operator's cap: twice the batch), 10 queued, the rest refused
    assert result.refusals == {"queue-full": 22}


def test_a_critical_tenant_passes_a_sheddable_flood():
    crit = poisson("crit", 1.5, 30.0, seed=6)
    flow = {"tenants": [{"name": "crit", "band": "critical"},
                        {"name": "shed", "band": "sheddable"}]}
    _, alone = run(crit, **flow)
    _, flood = run(sorted(crit + poisson("shed", 15.0, 30.0, seed=7), key=lambda r: r.t), **flow)
    c_alone, c_flood = by_tenant(alone, "crit", 5.0), by_tenant(flood, "crit", 5.0)
    assert not any(f.is_aborted for f in c_flood)
    assert ttft_p90(c_flood) <= 1.5 * ttft_p90(c_alone)


def test_the_report_gives_per_tenant_figures_only_with_several_tenants():
    from kvfleet_sim.cli import format_tenant_table
    from kvfleet_sim.report import summarize

    trace = sorted(poisson("A", 1.5, 20.0, seed=8) + poisson("B", 15.0, 20.0, seed=9),
                   key=lambda r: r.t)
    _, result = run(trace, queueTtlSeconds=1.0)
    s = summarize("two", result, ttft_slo_s=1.0, itl_slo_s=0.05)
    a, b = s.tenants["A"], s.tenants["B"]
    assert a["num_requests"] + b["num_requests"] == len(trace) == s.num_requests
    assert b["num_refused"] == s.refusals["saturated"] == s.num_failed > 0
    assert a["num_served"] == a["num_requests"] and a["num_failed"] == 0
    assert a["served_tokens"] == a["num_served"] * (256 + 16)
    assert a["ttft_p50_s"] <= a["ttft_p90_s"] <= a["ttft_p99_s"] < b["ttft_p90_s"]
    assert "| two | B |" in format_tenant_table([s]) and "tenants" in s.to_dict()
    _, alone = run(poisson("A", 1.5, 20.0, seed=8))
    one = summarize("one", alone, ttft_slo_s=1.0, itl_slo_s=0.05)
    assert one.tenants is None and "tenants" not in one.to_dict() and one.refusals is None


def scaled_to_zero(ttl):
    manifest = yaml.safe_load((ROOT / "examples" / "local-sim.yaml").read_text())
    manifest["spec"]["topology"]["unified"]["replicas"]["min"] = 0
    manifest["spec"]["autoscaling"]["scaleToZero"] = {"enabled": True, "idleSeconds": 5}
    if ttl is not None:
        manifest["spec"]["routing"]["flowControl"] = {"queueTtlSeconds": ttl}
    return parse_pool(manifest)


@pytest.mark.parametrize("ttl,refused", [(None, 0), (1.0, 4)])
def test_the_waiting_room_holds_a_request_while_a_replica_starts(ttl, refused):
    """Scaled to zero, the next requests wait for the replica (3 s to start) in the waiting
    room: the cold-start hold (60 s) serves them all; a queue TTL of 1 s refuses them with
    503 no-endpoint (none was ready)."""
    pool = scaled_to_zero(ttl)
    trace = [TraceRequest(0.5, 200, 10)] + [TraceRequest(60 + t / 4, 200, 10) for t in range(4)]
    result = FleetSim(pool, SCALERS["kvfleet"](pool.spec), SimSettings(startup_s=3.0)).run(trace)
    assert len(result.finished) == len(trace)
    assert result.refusals == ({"no-endpoint": refused} if refused else {})
    late = [f for f in result.finished if f.arrival >= 60 and not f.is_aborted]
    assert len(late) == 4 - refused


@pytest.mark.parametrize("limit, reason", [("rpm", "quota-requests"), ("tpm", "quota-tokens")])
def test_a_tenant_over_its_quota_is_held_to_it_over_a_minute(limit, reason):
    """The HTTP front's quota gate (quota.py) runs before flow control: a tenant sending
    twice its limit for a minute from a cold bucket is served its limit plus the bucket's
    burst (quotas.burst_s, 2 s of it), within 5%; the rest is refused with the reason."""
    per_minute = 60 if limit == "rpm" else 60 * (256 + 16)  # a request a second either way
    trace = [TraceRequest(i * 0.5, 256, 16, tenant="q") for i in range(120)]  # 2 a second
    _, result = run(trace, tenants=[{"name": "q", "quotas": {limit: per_minute}}])
    served = [f for f in result.finished if not f.is_aborted]
    expected = 60 * (1 + 2.0 / 60)
    assert abs(len(served) - expected) <= 0.05 * expected, len(served)
    assert result.refusals == {reason: len(trace) - len(served)}
    unlimited = run(trace)[1]
    assert not unlimited.refusals and len(trace) > 1.5 * expected  # the limit did it
