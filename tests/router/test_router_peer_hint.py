"""kv_sharing: the pure peer-hint decision, the measurements it uses, and the routing core
and dispatcher that attach the hint (no I/O; the real-process test is
test_router_peer_fetch_engines.py)."""

from __future__ import annotations

import json
import random

import pytest
from kvfleet_engine.contract import KVEvent, parse_peer_prefix
from kvfleet_engine.core.prefix_share import chained_hashes
from kvfleet_router.config import ConfigError, RouterConfig
from kvfleet_router.dispatch import Dispatcher
from kvfleet_router.metrics import RouterMetrics
from kvfleet_router.peer_hint import (
    ATTACHED,
    NO_PEER,
    NOT_ELIGIBLE,
    RECOMPUTE_CHEAPER,
    HintInputs,
    PeerCandidate,
    decide_peer_hint,
)
from kvfleet_router.peer_measure import PeerMeasure, PeerTotals
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import RouterCore
from kvfleet_router.signals import parse_metrics
from kvfleet_router.wait_queue import WaitQueue

BS = 16
MB = 1 << 20


def inputs(**kw):
    base = dict(num_local_blocks=0, num_usable_blocks=64, block_size=BS,
                peers=[PeerCandidate("a", "http://10.0.0.1:8000", 32)],
                bandwidth_bytes_per_s=1e9, bytes_per_block=MB, latency_s=0.0,
                prefill_tokens_per_s=10_000.0, margin=1.0, min_gain_blocks=2)
    base.update(kw)
    return HintInputs(**base)


def test_attaches_when_fetching_beats_recomputing():
    # 32 blocks: fetch 32 MiB at 1 GB/s = 33.6 ms; recompute 512 tokens at 10k/s = 51.2 ms
    d = decide_peer_hint(inputs())
    assert d.reason == ATTACHED and d.peer.name == "a" and d.num_blocks == 32
    assert d.estimate.fetch_s == pytest.approx(32 * MB / 1e9, rel=1e-6)
    assert d.estimate.recompute_s == pytest.approx(512 / 10_000)


def test_the_margin_is_applied():
    """fetch 33.6 ms < recompute 51.2 ms, but not by 1.6x: this fails if margin is ignored."""
    assert decide_peer_hint(inputs(margin=1.0)).reason == ATTACHED
    assert decide_peer_hint(inputs(margin=1.5)).reason == ATTACHED  # 50.3 ms < 51.2 ms
    assert decide_peer_hint(inputs(margin=1.6)).reason == RECOMPUTE_CHEAPER


def test_slow_bandwidth_or_fast_prefill_recomputes():
    assert decide_peer_hint(inputs(bandwidth_bytes_per_s=1e8)).reason == RECOMPUTE_CHEAPER
    assert decide_peer_hint(inputs(prefill_tokens_per_s=1e6)).reason == RECOMPUTE_CHEAPER
    assert decide_peer_hint(inputs(latency_s=1.0)).reason == RECOMPUTE_CHEAPER


def test_the_whole_run_from_the_root_is_charged_to_the_blocks_saved():
    # The chosen endpoint holds 24 of the 32: 8 blocks saved (12.8 ms of prefill) for
    # 32 blocks moved (33.6 ms): recompute. With nothing local the same peer wins.
    assert decide_peer_hint(inputs(num_local_blocks=24)).reason == RECOMPUTE_CHEAPER
    d = decide_peer_hint(inputs(num_local_blocks=24, bandwidth_bytes_per_s=1e10))
    assert d.reason == ATTACHED and d.estimate.fetch_s == pytest.approx(32 * MB / 1e10, 1e-3)


def test_no_peer_when_the_gain_is_too_small_or_nobody_holds_more():
    assert decide_peer_hint(inputs(peers=[])).reason == NO_PEER
    assert decide_peer_hint(inputs(num_local_blocks=31)).reason == NO_PEER  # gain 1 < 2
    fast = 1e12
    assert decide_peer_hint(inputs(num_local_blocks=31, bandwidth_bytes_per_s=fast)).reason \
        == NO_PEER
    assert decide_peer_hint(inputs(num_local_blocks=30, bandwidth_bytes_per_s=fast)).reason \
        == ATTACHED
    assert decide_peer_hint(inputs(num_local_blocks=40)).reason == NO_PEER


def test_the_best_peer_wins_and_the_hint_stops_at_the_usable_blocks():
    peers = [PeerCandidate("a", "http://a:1", 8), PeerCandidate("b", "http://b:1", 40),
             PeerCandidate("c", "http://c:1", 40)]
    d = decide_peer_hint(inputs(peers=peers, num_usable_blocks=20, bandwidth_bytes_per_s=1e10))
    assert d.peer.name == "b" and d.num_blocks == 20  # the last token is always computed


def test_the_peers_measured_block_size_is_preferred():
    heavy = [PeerCandidate("a", "http://a:1", 32, bytes_per_block=4 * MB)]
    assert decide_peer_hint(inputs(peers=heavy)).reason == RECOMPUTE_CHEAPER


# --- measurements ---


def test_bandwidth_from_scrape_deltas_and_block_size_from_exports():
    m = PeerMeasure()
    m.observe(PeerTotals(fetch_bytes=0, fetch_blocks=0, fetch_seconds=0.0))
    assert m.bandwidth.value is None and m.bytes_per_block is None
    m.observe(PeerTotals(fetch_bytes=4e6, fetch_blocks=4, fetch_seconds=0.004,
                         export_bytes=3e6, export_blocks=3))
    assert m.bandwidth.value == pytest.approx(1e9) and m.bytes_per_block == 1e6
    m.observe(PeerTotals(fetch_bytes=1e6, fetch_blocks=1, fetch_seconds=0.5))  # restarted
    assert m.bandwidth.num_samples == 1
    m.observe(PeerTotals(fetch_bytes=1e6, fetch_blocks=1, fetch_seconds=0.5))  # no fetch
    assert m.bandwidth.num_samples == 1


def test_block_size_falls_back_to_the_importing_side():
    m = PeerMeasure()
    m.observe(PeerTotals(fetch_bytes=8e6, fetch_blocks=4, fetch_seconds=0.1))
    assert m.bytes_per_block == 2e6


def test_timed_out_fetches_lower_the_bandwidth_to_their_bound():
    """Every fetch timed out: no completed-fetch delta, yet 100 MB asked in 1 s of waiting
    proves the link is at most 0.1 GB/s, and the estimate (unknown, then above) follows."""
    m = PeerMeasure()
    m.observe(PeerTotals(fetch_bytes=0, fetch_seconds=0.0, timeout_bytes=0,
                         timeout_seconds=0.0))
    m.observe(PeerTotals(fetch_bytes=0, fetch_seconds=0.0, timeout_bytes=1e8,
                         timeout_seconds=1.0))
    assert m.bandwidth.value == pytest.approx(1e8)  # unknown: the bound is the estimate
    m.bandwidth.value = 1e9  # e.g. an earlier fast link
    m.observe(PeerTotals(fetch_bytes=0, fetch_seconds=0.0, timeout_bytes=2e8,
                         timeout_seconds=2.0))
    assert m.bandwidth.value == pytest.approx(0.8e9 + 0.2e8)  # lowered by the EWMA
    m.observe(PeerTotals(fetch_bytes=0, fetch_seconds=0.0, timeout_bytes=1e8,
                         timeout_seconds=1.0))  # counters went down: a new baseline
    assert m.bandwidth.num_samples == 2


def test_a_timeout_bound_above_the_estimate_teaches_nothing():
    m = PeerMeasure()
    m.observe(PeerTotals(fetch_bytes=0, fetch_seconds=0.0, timeout_bytes=0,
                         timeout_seconds=0.0))
    m.observe(PeerTotals(fetch_bytes=1e8, fetch_seconds=1.0, timeout_bytes=0,
                         timeout_seconds=0.0))
    assert m.bandwidth.value == pytest.approx(1e8)
    # a 10 GB-asked, 1 s timeout only says "at most 10 GB/s": already known
    m.observe(PeerTotals(fetch_bytes=1e8, fetch_seconds=1.0, timeout_bytes=1e10,
                         timeout_seconds=1.0))
    assert m.bandwidth.value == pytest.approx(1e8) and m.bandwidth.num_samples == 1
    m.observe(PeerTotals(fetch_bytes=1e8, fetch_seconds=1.0))  # not exposed: nothing
    assert m.bandwidth.num_samples == 1


def test_the_scrape_carries_the_peer_counters():
    text = "\n".join([
        'vllm:num_requests_running{model_name="m"} 0',
        'kvfleet:peer_fetch_bytes_total{model_name="m"} 2048',
        'kvfleet:peer_fetch_blocks_total{model_name="m"} 2',
        'kvfleet:peer_fetch_seconds_bucket{model_name="m",le="+Inf"} 1',
        'kvfleet:peer_fetch_seconds_sum{model_name="m"} 0.25',
        'kvfleet:peer_export_bytes_total{model_name="m"} 0',
        'kvfleet:peer_export_blocks_total{model_name="m"} 0',
        'kvfleet:peer_fetch_timeout_bytes_asked_total{model_name="m"} 4096',
        'kvfleet:peer_fetch_timeout_seconds_total{model_name="m"} 0.5', ""])
    s = parse_metrics(text, now=1.0)
    assert s.peer == PeerTotals(fetch_bytes=2048, fetch_blocks=2, fetch_seconds=0.25,
                                export_bytes=0, export_blocks=0, timeout_bytes=4096,
                                timeout_seconds=0.5)
    assert parse_metrics('vllm:num_requests_running{model_name="m"} 0\n', 1.0).peer is None


# --- the routing core over a precise index ---

TOKENS = [(7 * i + 3) % 250 for i in range(16 * 8 + 5)]  # 8 full blocks + 5 tokens


def sharing_core(states=("active", "active"), engines=("builtin", "builtin"), **kv):
    eps = [{"name": f"e{i}", "url": f"http://127.0.0.1:{9000 + i}", "prefix_mode": "precise",
            "engine": engine, "state": state}
           for i, (state, engine) in enumerate(zip(states, engines, strict=True))]
    cfg = RouterConfig.from_dict({"endpoints": eps, "policy": {"name": "prefix-cache"},
                                  "kv_sharing": {"enabled": True, **kv}})
    return RouterCore(cfg, rng=random.Random(0))


def store(core, endpoint, tokens, num_blocks):
    hashes = chained_hashes(tokens, BS, num_blocks)
    core.precise.apply(endpoint, KVEvent(seq=0, type="BlockStored", block_hashes=hashes,
                                         token_ids=tokens[:num_blocks * BS], block_size=BS))
    return hashes


def route_to(core, name, tokens=TOKENS):
    allowed = frozenset({name})
    return core.route(RequestInfo(prompt_token_ids=list(tokens)), "unified", 1.0,
                      allowed=allowed)


def test_a_draining_peer_hands_its_prefix_to_the_chosen_endpoint():
    core = sharing_core(states=("draining", "active"))
    hashes = store(core, "e0", TOKENS, 8)
    store(core, "e1", [999] * BS, 1)  # e1's block size becomes known
    routed = core.route(RequestInfo(prompt_token_ids=list(TOKENS)), "unified", 1.0)
    assert routed.decision.endpoint.name == "e1"  # e0 drains: no new requests
    decision, hint = core.peer_hint(routed)
    assert decision.reason == ATTACHED and decision.num_blocks == 8
    peer = parse_peer_prefix(hint)
    assert peer.url == "http://127.0.0.1:9000" and list(peer.block_hashes) == hashes
    # the fetch may take as long as recomputing would (8 blocks at the 0.5 ms/token prior:
    # 64 ms), and never less than MIN_FETCH_TIMEOUT_S
    assert decision.estimate.recompute_s == pytest.approx(0.064) and peer.timeout_s == 0.1
    assert routed.num_hinted_blocks == 8


def test_a_new_replica_takes_hints_once_its_block_size_is_scraped():
    core = sharing_core()
    store(core, "e0", TOKENS, 8)
    e1 = core.registry.by_name["e1"]  # has stored nothing: its KV events name no block size
    assert core.peer_hint(route_to(core, "e1"))[0].reason == NOT_ELIGIBLE
    e1.apply_scrape(parse_metrics('vllm:num_requests_running{model_name="m"} 0\n'
                                  'vllm:cache_config_info{block_size="16",num_gpu_blocks="9"} 1\n',
                                  now=1.0))
    assert core.peer_hint(route_to(core, "e1"))[0].reason == ATTACHED


def test_only_builtin_precise_endpoints_give_or_take_hints():
    core = sharing_core(engines=("vllm", "builtin"))
    store(core, "e0", TOKENS, 8)
    store(core, "e1", [999] * BS, 1)
    assert core.peer_hint(route_to(core, "e1"))[0].reason == NO_PEER  # the vLLM peer
    core = sharing_core(engines=("builtin", "vllm"))
    store(core, "e0", TOKENS, 8)
    store(core, "e1", [999] * BS, 1)
    assert core.peer_hint(route_to(core, "e1"))[0].reason == NOT_ELIGIBLE
    routed = core.route(RequestInfo(prompt_text="text has no token blocks"), "unified", 1.0)
    assert core.peer_hint(routed)[0].reason == NOT_ELIGIBLE


def test_a_removed_or_ejected_peer_is_not_named():
    core = sharing_core()
    store(core, "e0", TOKENS, 8)
    store(core, "e1", [999] * BS, 1)
    core.registry.by_name["e0"].is_probe_healthy = False
    assert core.peer_hint(route_to(core, "e1"))[0].reason == NO_PEER
    core.registry.by_name["e0"].is_probe_healthy = True
    assert core.peer_hint(route_to(core, "e1"))[0].reason == ATTACHED
    core.apply(RouterConfig.from_dict({**core.cfg.to_dict(), "endpoints": [
        e for e in core.cfg.to_dict()["endpoints"] if e["name"] == "e1"]}))
    assert core.peer_hint(route_to(core, "e1"))[0].reason == NO_PEER


def test_the_chosen_endpoints_own_prefix_counts():
    core = sharing_core()
    store(core, "e0", TOKENS, 8)
    store(core, "e1", TOKENS, 7)
    assert core.peer_hint(route_to(core, "e1"))[0].reason == NO_PEER  # 1 more block only


def test_a_slow_measured_prefill_rate_and_the_margin_steer_the_decision():
    # Priors: 1 GB/s, 128 KiB/token -> 2 MiB/block; 8 blocks = 16.8 ms + 2 ms latency
    # against 128 tokens at the SLO prior 0.5 ms/token = 64 ms: fetch, up to margin ~3.4.
    core = sharing_core(margin=3.0)
    store(core, "e0", TOKENS, 8)
    store(core, "e1", [999] * BS, 1)
    assert core.peer_hint(route_to(core, "e1"))[0].reason == ATTACHED
    core = sharing_core(margin=4.0)
    store(core, "e0", TOKENS, 8)
    store(core, "e1", [999] * BS, 1)
    assert core.peer_hint(route_to(core, "e1"))[0].reason == RECOMPUTE_CHEAPER
    core.registry.by_name["e1"].prefill_s_per_token.add(0.01)  # measured: 100 tokens/s
    decision, hint = core.peer_hint(route_to(core, "e1"))
    assert decision.reason == ATTACHED
    assert parse_peer_prefix(hint).timeout_s == pytest.approx(128 * 0.01)  # its recompute


# --- the prefix scorer's peer credit ---


def cache_aware_core(sharing, num_in_flight=(1, 0), **kv):
    eps = [{"name": f"e{i}", "url": f"http://127.0.0.1:{9000 + i}", "prefix_mode": "precise",
            "engine": "builtin", "capacity": 8} for i in range(2)]
    cfg = RouterConfig.from_dict({"endpoints": eps, "policy": {"name": "cache-aware"},
                                  "kv_sharing": {"enabled": sharing, **kv}})
    core = RouterCore(cfg, rng=random.Random(0))
    store(core, "e0", TOKENS, 8)
    store(core, "e1", [999] * BS, 1)
    for name, n in zip(("e0", "e1"), num_in_flight, strict=True):
        core.registry.by_name[name].num_in_flight = n
    return core


def test_a_fetchable_prefix_is_credited_to_the_cold_endpoint():
    # Priors: fetching 8 blocks takes 18.8 ms against 64 ms of recompute: worth 8 * 0.71.
    core = cache_aware_core(sharing=True)
    routed = core.route(RequestInfo(prompt_token_ids=list(TOKENS)), "unified", 1.0)
    assert routed.ctx.peer_credit["e1"] == pytest.approx((1 - 18.777 / 64) * 8 / 8, abs=1e-3)
    assert "e0" not in routed.ctx.peer_credit  # its own copy is the longest
    assert routed.ctx.prefix_fraction == {"e0": 1.0, "e1": 0.0}  # the hit estimate is unchanged
    # e0 holds the whole prefix but runs 1 request more: with the credit, e1 wins
    # (queue 4 x 7/8 + prefix 1 = 4.5 against 4 + 0.71).
    assert routed.decision.endpoint.name == "e1"
    assert core.peer_hint(routed)[0].reason == ATTACHED


def test_without_sharing_or_when_recompute_is_cheaper_the_warm_endpoint_keeps_it():
    for core in (cache_aware_core(sharing=False), cache_aware_core(sharing=True, margin=4.0)):
        routed = core.route(RequestInfo(prompt_token_ids=list(TOKENS)), "unified", 1.0)
        assert routed.ctx.peer_credit == {}
        assert routed.decision.endpoint.name == "e0"


def test_a_policy_without_the_prefix_scorer_computes_no_credit():
    core = cache_aware_core(sharing=True)
    routed = core.route(RequestInfo(prompt_token_ids=list(TOKENS)), "unified", 1.0,
                        policy_name="least-request")
    assert routed.ctx.peer_credit == {}
    assert core.peer_hint(routed)[0].reason in (ATTACHED, NO_PEER)  # the hint still runs


def test_a_peer_that_cannot_serve_earns_no_credit():
    core = cache_aware_core(sharing=True)
    core.registry.by_name["e0"].is_probe_healthy = False
    routed = core.route(RequestInfo(prompt_token_ids=list(TOKENS)), "unified", 1.0)
    assert routed.ctx.peer_credit == {}


# --- the dispatcher ---


def dispatcher(core):
    metrics = RouterMetrics(lambda: core, lambda: 0)
    return Dispatcher(core, WaitQueue(8), metrics, forwarder=None, feedback=None), metrics


def counter(metrics, reason):
    return metrics.registry.get_sample_value("kvfleet_router_peer_hints_total",
                                             {"reason": reason})


def test_the_dispatcher_attaches_the_hint_to_the_forwarded_body():
    core = sharing_core()
    store(core, "e0", TOKENS, 8)
    store(core, "e1", [999] * BS, 1)
    d, metrics = dispatcher(core)
    body = {"model": "m", "prompt": TOKENS, "max_tokens": 4}
    raw = json.dumps(body).encode()
    info = RequestInfo(prompt_token_ids=list(TOKENS), body=body)
    out = json.loads(d.with_peer_hint(raw, info, route_to(core, "e1"), "unified"))
    assert out["kv_transfer_params"]["peer_prefix"]["url"] == "http://127.0.0.1:9000"
    assert {k: v for k, v in out.items() if k != "kv_transfer_params"} == body
    assert counter(metrics, ATTACHED) == 1
    assert metrics.registry.get_sample_value("kvfleet_router_peer_hint_blocks_total") == 8
    assert d.with_peer_hint(raw, info, route_to(core, "e0"), "unified") == raw  # holds it
    assert counter(metrics, NO_PEER) == 1
    assert d.with_peer_hint(raw, info, route_to(core, "e1"), "decode") == raw  # P/D leg


def test_nothing_is_attached_or_counted_when_sharing_is_off():
    core = sharing_core(enabled=False)
    store(core, "e0", TOKENS, 8)
    store(core, "e1", [999] * BS, 1)
    d, metrics = dispatcher(core)
    info = RequestInfo(prompt_token_ids=list(TOKENS), body={"prompt": TOKENS})
    assert d.with_peer_hint(b"raw", info, route_to(core, "e1"), "unified") == b"raw"
    assert sum(counter(metrics, r) for r in (ATTACHED, NO_PEER, NOT_ELIGIBLE)) == 0


def test_kv_sharing_config_is_checked():
    cfg = RouterConfig.from_dict({"kv_sharing": {"enabled": True, "margin": 2}})
    assert cfg.kv_sharing.margin == 2.0 and cfg.kv_sharing.min_gain_blocks == 2
    with pytest.raises(ConfigError, match=r"kv_sharing.margin: must be a finite number in"):
        RouterConfig.from_dict({"kv_sharing": {"margin": 0.5}})
    with pytest.raises(ConfigError, match=r"kv_sharing.bandwidth_bytes_per_s"):
        RouterConfig.from_dict({"kv_sharing": {"bandwidth_bytes_per_s": 0}})
    with pytest.raises(ConfigError, match=r"endpoints\[0\].engine: must be one of"):
        RouterConfig.from_dict({"endpoints": [{"name": "a", "url": "http://a:1",
                                               "engine": "sglang"}]})
