"""Cache-aware routing is really simulated: every request goes through the router's
RouterCore, whose approximate index is recorded at each decision and whose precise index is
fed from each simulated engine's own KV events, on a slice of the Mooncake trace."""

import dataclasses
import functools
from pathlib import Path

import pytest
import yaml
from kvfleet_operator.api import parse_pool
from kvfleet_router.config_store import StaleVersion
from kvfleet_sim.fleet import FleetSim, SimSettings
from kvfleet_sim.ports import SimRouter, drive
from kvfleet_sim.report import summarize
from kvfleet_sim.scalers import SCALERS
from kvfleet_sim.trace import load_mooncake

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
POOL = ROOT / "sim" / "pools" / "h100-llama3-8b-16.yaml"
needs_trace = pytest.mark.skipif(not TRACE.exists(), reason="shared traces not present")

WARMUP_S, MEASURE_S, COMPRESS = 150.0, 90.0, 2.0  # of trace time, from trace second 450


def pool(policy: str, replicas: int = 8):
    m = yaml.safe_load(POOL.read_text())
    m["spec"]["topology"]["unified"]["replicas"] = {"min": replicas, "max": replicas}
    m["spec"]["engine"]["maxModelLen"] = 32768
    m["spec"]["routing"]["policy"] = policy
    return parse_pool(m)


@functools.cache
def mooncake_slice():
    """About 800 requests with their real prompts and prefix sharing; outputs capped at 32
    tokens so the slice replays in seconds (prefix reuse is a property of the prompts)."""
    trace = load_mooncake(TRACE, 450 - WARMUP_S, WARMUP_S + MEASURE_S, COMPRESS)
    return [dataclasses.replace(r, num_output_tokens=min(r.num_output_tokens, 32)) for r in trace]


@functools.cache
def replay(policy: str, prefix_mode: str = "approximate"):
    p = pool(policy)
    start = WARMUP_S / COMPRESS
    sim = FleetSim(p, SCALERS["fixed-max"](p.spec),
                   SimSettings(prefix_mode=prefix_mode, measure_from_s=start))
    result = sim.run(mooncake_slice())
    return sim, summarize(policy, result, 2.0, 0.05, start, start + MEASURE_S / COMPRESS)


@needs_trace
def test_cache_aware_beats_round_robin_on_hit_rate_with_the_approximate_index():
    _, aware = replay("cache-aware")
    _, rr = replay("round-robin")
    assert aware.num_requests == rr.num_requests > 200
    # Round-robin still hits the trace's common first block; cache-aware also finds turns.
    assert aware.prefix_hit_rate > 1.3 * rr.prefix_hit_rate, (aware, rr)
    assert aware.prefix_hit_rate - rr.prefix_hit_rate > 0.02, (aware, rr)
    assert aware.router_hit_estimate > 1.3 * rr.router_hit_estimate


@needs_trace
def test_precise_index_mirrors_every_engine_cache_and_finds_hits():
    sim, precise = replay("cache-aware", "precise")
    core = sim.router.core
    num_filled = 0
    for name, replica in sim.runtime.by_name.items():
        assert sim.router.endpoints[name].prefix_mode == "precise"
        # Every BlockStored/BlockRemoved reached the router: the same number of blocks.
        assert core.precise.num_blocks(name) == replica.engine.kv_cache.pool.num_cached_blocks
        num_filled += core.precise.num_blocks(name) > 0
    # Not a vacuous match: most engines cached blocks (under this light load affinity may
    # leave one idle: every Mooncake prompt shares its first block).
    assert num_filled >= len(sim.runtime.by_name) - 2, num_filled
    # Routing on exact knowledge finds the turns round-robin misses. (It no longer beats the
    # approximate index: at 65,536 blocks per endpoint that one forgets nothing the engines
    # still cache, and on this slice it finds a little more, since it also steers new
    # prompts to where their first blocks were sent.)
    _, rr = replay("round-robin")
    assert precise.prefix_hit_rate > rr.prefix_hit_rate + 0.02, (precise, rr)


def test_pushes_go_through_the_config_store():
    router = SimRouter(seed=0)

    def cfg(version, names, policy="cache-aware"):
        return {"version": version, "policy": {"name": policy},
                "endpoints": [{"name": n, "url": f"http://sim.{n}:8000"} for n in names]}

    drive(router.push(cfg(1, ["a", "b"])))
    assert router.endpoints is router.core.registry.by_name and set(router.endpoints) == {"a", "b"}
    drive(router.push(cfg(1, ["a", "b"])))  # an identical re-push is a no-op
    with pytest.raises(StaleVersion):
        drive(router.push(cfg(1, ["a"])))  # same version, other content: refused
    router.endpoints["b"].num_in_flight = 1
    drive(router.push(cfg(2, ["a"], policy="round-robin")))
    assert router.core.cfg.policy.name == "round-robin"
    view = drive(router.view())
    assert view is not None and view.version == 2
    assert view.endpoints["b"].state == "removed" and view.endpoints["b"].num_in_flight == 1


def test_prefix_mode_override_reaches_the_registry():
    router = SimRouter(seed=0, prefix_mode="precise")
    drive(router.push({"version": 1, "endpoints": [{"name": "a", "url": "http://sim.a:8000"}]}))
    assert router.endpoints["a"].prefix_mode == "precise"


@pytest.mark.parametrize("policy", ["latency", "ucb", "slo"])
def test_adaptive_policies_learn_from_every_finished_exchange(policy):
    """The sim reports each finished exchange to the router's HealthFeedback, as the
    dispatcher does, so the latency/UCB/SLO scorers are not stuck on their priors."""
    from kvfleet_sim.trace import TraceRequest

    p = pool(policy, replicas=4)
    trace = [TraceRequest(i * 0.05, 500 + 10 * (i % 7), 16) for i in range(200)]
    sim = FleetSim(p, SCALERS["fixed-max"](p.spec), SimSettings())
    result = sim.run(trace)
    eps = list(sim.router.endpoints.values())
    assert sum(e.num_ucb_pulls for e in eps) == len(result.finished) == 200
    served = [e for e in eps if e.name in {f.replica for f in result.finished}]
    assert served and all(e.ttft.num_samples == e.num_ucb_pulls > 0 for e in served)
    assert all(e.decode_s_per_token.value and e.prefill_s_per_token.value for e in served)
