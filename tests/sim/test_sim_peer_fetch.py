"""The simulator's peer prefix fetch (`routing.kvSharing`, sim/kvfleet_sim/peer_fetch.py):
the router core's own hint, the peer engine's real export and the target engine's real
install, with the fetch's time in between. Round-robin routing sends a prompt's second
turn to the replica that lacks its prefix, so the hint decides what happens."""

from pathlib import Path

import pytest
import yaml
from kvfleet_engine.contract import peer_prefix as pp
from kvfleet_operator.api import parse_pool
from kvfleet_sim.fleet import FleetSim, SimResult, SimSettings
from kvfleet_sim.peer_fetch import PeerStats
from kvfleet_sim.report import summarize
from kvfleet_sim.scalers import SCALERS
from kvfleet_sim.trace import TraceRequest

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "sim" / "pools" / "h100-llama3-8b-16.yaml"
BLOCK = 512  # tokens per trace hash id
SHARED = (1, 2, 3, 4)  # a 2,048-token prefix: 128 KV blocks of 16 tokens


def pool(sharing: bool = True, replicas: int = 2, num_blocks: int | None = None):
    m = yaml.safe_load(POOL.read_text())
    spec = m["spec"]
    spec["topology"]["unified"]["replicas"] = {"min": replicas, "max": replicas}
    spec["engine"]["maxModelLen"] = 32768
    if num_blocks:
        spec["engine"].update(numBlocks=num_blocks, maxModelLen=4096)
    spec["routing"].update(policy="round-robin", prefixMode="precise",
                           kvSharing={"enabled": sharing})
    return parse_pool(m)


def turn(t: float, *ids: int, out: int = 4) -> TraceRequest:
    return TraceRequest(t, BLOCK * len(ids), out, ids)


def replay(trace: list[TraceRequest], sharing: bool = True, num_blocks: int | None = None,
           **settings: float) -> tuple[FleetSim, SimResult]:
    p = pool(sharing, num_blocks=num_blocks)
    sim = FleetSim(p, SCALERS["fixed-max"](p.spec), SimSettings(**settings))  # type: ignore[arg-type]
    return sim, sim.run(trace)


def ttft(result: SimResult, rid: str) -> float:
    f = next(f for f in result.finished if f.request_id == rid)
    assert not f.is_aborted
    return f.first_token - f.arrival


def stats(sim: FleetSim) -> PeerStats:
    assert sim.fetches is not None
    return sim.fetches.stats


def test_the_second_turn_takes_its_prefix_from_the_peer_and_its_ttft_drops():
    trace = [turn(1.0, *SHARED, 10), turn(3.0, *SHARED, 11)]
    sim, result = replay(trace)
    s = stats(sim)
    assert s.hints["attached"] == 1 and s.outcomes == {pp.OUTCOME_HIT: 1}, s
    assert s.num_blocks == 128 and s.num_tokens == 128 * 16
    assert s.num_bytes == 128 * 16 * sim.fetches.link.bytes_per_token  # type: ignore[union-attr]
    # The fetched blocks are the target engine's prefix hits: every request reused them.
    q1 = next(f for f in result.finished if f.request_id == "q1")
    target = sim.runtime.by_name[q1.replica].engine.kv_cache
    assert target.prefix_cache_hits == 128 * 16
    # The second turn waited for the fetch (latency plus bytes over the link) ...
    fetch_s = sim.fetches.link.seconds(128 * 16)  # type: ignore[union-attr]
    assert s.fetch_seconds == pytest.approx(fetch_s)
    assert ttft(result, "q1") > fetch_s
    # ... and still beat recomputing 2,048 tokens, the same replay without kvSharing.
    plain, base = replay(trace, sharing=False)
    assert plain.fetches is None
    assert ttft(result, "q1") < ttft(base, "q1")
    summary = summarize("x", result, 2.0, 0.05)
    assert summary.peer is not None and summary.peer["prefix_tokens_fetched"] == 2048
    assert summary.peer["prefix_tokens_local"] == 0
    assert summarize("x", base, 2.0, 0.05).to_dict().keys() == summary.to_dict().keys() - {"peer"}


# A shared prefix (q0, q1: q1 is hinted to fetch it), then a second prefix (q2, q3) whose
# second turn shows what the router now thinks of the link to q1's replica.
TWO_PREFIXES = [turn(1.0, *SHARED, 10), turn(3.0, *SHARED, 11),
                turn(10.0, 21, 22, 23, 24, 30), turn(12.0, 21, 22, 23, 24, 31)]


def replica_of(result, request_id: str) -> str:
    return next(f.replica for f in result.finished if f.request_id == request_id)


def test_a_slow_link_is_measured_by_the_router_and_the_next_hint_is_refused():
    """0.3 GB/s: the first fetch (268 MB, 0.89 s, under the hint's 1.016 s limit) is
    hinted on the router's 1 GB/s prior; the router scrapes the bandwidth it achieved and
    recomputes the next prefix on that replica instead (0.89 s x margin 1.5 > 1.016 s)."""
    trace = TWO_PREFIXES
    sim, result = replay(trace, peer_bytes_per_s=0.3e9)
    s = stats(sim)
    assert s.outcomes == {pp.OUTCOME_HIT: 1}, s
    assert s.hints["attached"] == 1 and s.hints["recompute-cheaper"] == 1, s.hints
    assert ttft(result, "q1") > 0.88  # it really waited for the slow fetch
    target = replica_of(result, "q1")
    assert replica_of(result, "q3") == target
    bandwidth = sim.router.endpoints[target].peer_measure.bandwidth.value
    assert bandwidth is not None and 0.27e9 < bandwidth < 0.3e9


def test_a_fetch_slower_than_the_hints_timeout_falls_back_to_recompute():
    """The hint's `timeout_s` is the router's recompute estimate for the 127 blocks it
    saves (2,032 tokens at the 0.5 ms/token prior: 1.016 s), shorter than the engine's 5 s."""
    trace = [turn(1.0, *SHARED, 10), turn(3.0, *SHARED, 11)]
    sim, result = replay(trace, peer_bytes_per_s=0.01e9)  # 27 s for 268 MB
    s = stats(sim)
    assert s.outcomes == {pp.OUTCOME_TIMEOUT: 1} and s.num_blocks == 0 and s.num_bytes == 0
    assert 1.016 < ttft(result, "q1") < 1.6  # the hint's limit, then the prompt computed
    assert not any(f.is_aborted for f in result.finished)


def test_a_link_too_slow_for_any_fetch_is_learned_from_the_timeout():
    """0.1 GB/s: the first fetch (268 MB) times out at the hint's limit, so no fetch ever
    completes; its bytes asked over its wait (about 0.26 GB/s) bound the link from above, the
    router's estimate drops from the 1 GB/s prior to that bound, and the next prefix on
    that replica is recomputed instead of hinted into another timeout."""
    trace = TWO_PREFIXES
    sim, result = replay(trace, peer_bytes_per_s=0.1e9)
    s = stats(sim)
    assert s.outcomes == {pp.OUTCOME_TIMEOUT: 1}, s
    assert s.hints["attached"] == 1 and s.hints["recompute-cheaper"] == 1, s.hints
    target = replica_of(result, "q1")
    assert replica_of(result, "q3") == target
    assert sim.fetches is not None
    mine = sim.fetches.totals[target]
    asked = 128 * 16 * sim.fetches.link.bytes_per_token
    assert mine.timeout_bytes == asked and mine.fetch_bytes == 0
    assert 1.0 < mine.timeout_seconds < 1.1  # the hint's limit
    bandwidth = sim.router.endpoints[target].peer_measure.bandwidth.value
    assert bandwidth == pytest.approx(asked / mine.timeout_seconds)  # above the true 0.1
    assert 0.1e9 < bandwidth < 0.3e9  # GB/s (a bound), far under the 1 GB/s prior
    assert not any(f.is_aborted for f in result.finished)


def test_a_peer_slower_to_answer_than_the_hints_timeout_is_given_up_at_the_timeout():
    """Whatever the peer would have answered (here: it evicted the blocks meanwhile), the
    fetch ends at the hint's limit as a timeout."""
    trace = [turn(1.0, *SHARED, 10), turn(3.0, *SHARED, 11),
             turn(3.5, *range(40, 48), out=2)]
    sim, result = replay(trace, num_blocks=300, peer_latency_s=3.0)
    assert stats(sim).outcomes == {pp.OUTCOME_TIMEOUT: 1}
    assert sim.fetches is not None
    assert all(t.export_bytes == 0 for t in sim.fetches.totals.values())  # never answered
    assert 1.016 < ttft(result, "q1") < 1.6  # not the 3 s latency


def test_blocks_the_peer_evicted_before_its_export_are_recomputed():
    """A 0.9 s peer latency (under the hint's 1.016 s limit); meanwhile the peer serves a
    long prompt that evicts the shared prefix from its small cache, so its export finds
    none of the blocks."""
    trace = [turn(1.0, *SHARED, 10), turn(3.0, *SHARED, 11),
             turn(3.5, *range(40, 48), out=2)]
    sim, result = replay(trace, num_blocks=300, peer_latency_s=0.9)
    s = stats(sim)
    assert s.hints["attached"] == 1, s.hints
    assert s.outcomes.keys() <= {pp.OUTCOME_MISS, pp.OUTCOME_PARTIAL} and s.outcomes, s
    assert s.num_blocks < 128
    assert not any(f.is_aborted for f in result.finished)
    assert len(result.finished) == 3
    # the peer answered after the latency; the prompt then computed what it did not get
    assert ttft(result, "q1") > 0.9


def test_the_fetched_and_local_counts_are_measured_after_warm_up():
    trace = [turn(1.0, *SHARED, 10), turn(3.0, *SHARED, 11), turn(8.0, 50, 51)]
    sim, result = replay(trace, measure_from_s=5.0)
    assert stats(sim).num_tokens == 2048
    assert result.peer is not None and result.peer.num_tokens == 0
    assert result.peer.hints == {"no-peer": 1} and not result.peer.outcomes
