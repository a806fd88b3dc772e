"""exchange.py's decisions, without sockets: the outbox bound, staleness, the wire codec,
self-detection, relaying once, and what a batch may change."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import pytest
from kvfleet_router.config import RevisionsConfig, RouterConfig
from kvfleet_router.exchange import (
    Exchange,
    Outbox,
    PeerCounts,
    decode_chain,
    encode_chain,
    peer_in_flight,
    url_of,
)
from kvfleet_router.exchange_seed import fingerprint, hash_seed_for
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.revisions import RevisionSplit
from kvfleet_router.router_core import RouterCore


def core_with(*names: str, **exchange: Any) -> RouterCore:
    return RouterCore(RouterConfig.from_dict({
        "endpoints": [{"name": n, "url": f"http://127.0.0.1:{9000 + i}"}
                      for i, n in enumerate(names)],
        "exchange": {"enabled": True, **exchange}}))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_chains_round_trip_with_the_extreme_hash_values():
    chain = [-(2**63), -1, 0, 1, 2**63 - 1]
    assert decode_chain(encode_chain(chain)) == chain
    with pytest.raises(ValueError):
        decode_chain("AAAA")  # 3 bytes: not whole hashes


def test_the_outbox_keeps_exactly_max_blocks_dropping_the_oldest_chain_first():
    box = Outbox()
    box.add("e0", [1, 2, 3], max_blocks=6)
    box.add("e0", [4, 5, 6], max_blocks=6)
    assert box.num_blocks == 6 and box.num_dropped_blocks == 0  # at the bound: all kept
    box.add("e1", [7], max_blocks=6)
    assert box.num_dropped_blocks == 3 and box.num_blocks == 4
    records, _ = box.take()
    assert {k: [decode_chain(c) for c in v] for k, v in records.items()} == \
        {"e0": [[4, 5, 6]], "e1": [[7]]}
    assert box.num_blocks == 0 and not box.chains


def test_one_conversation_recorded_again_is_sent_once():
    box = Outbox()
    for _ in range(10):
        box.add("e0", [1, 2, 3], max_blocks=100)
    assert box.num_blocks == 3


def test_a_peers_in_flight_counts_until_stale_after_s_and_not_after():
    peers = {"p": PeerCounts(10.0, {"e0": 3.0}), "q": PeerCounts(9.0, {"e0": 1.0})}
    assert peer_in_flight(peers, 10.0, stale_after_s=1.0) == {"e0": 4.0}  # q exactly at it
    assert peer_in_flight(peers, 10.0 + 1e-9, 1.0) == {"e0": 3.0}  # q just past it
    assert peer_in_flight(peers, 11.0, 1.0) == {"e0": 3.0}
    assert peer_in_flight(peers, 11.0 + 1e-9, 1.0) == {}


def batch_from(x: Exchange, **over: Any) -> dict[str, Any]:
    body = {"id": "peer", "group": "other-pod", "fingerprint": fingerprint(),
            "block_bytes": x.core.approx.block_bytes, "relay": False, "records": {},
            "in_flight": {}, "sessions": {}}
    body.update(over)
    return body


def test_a_batch_records_known_endpoints_only_and_counts_the_peers_load():
    core = core_with("e0", "e1")
    clock = Clock()
    x = Exchange(core, "tok", clock=clock)
    hashes = core.approx.hash_text("p" * 640)
    x.apply_batch(batch_from(x, records={"e1": [encode_chain(hashes)],
                                         "gone": [encode_chain(hashes)]},
                             in_flight={"e0": 2, "e1": 5}))
    assert core.approx.match(hashes) == {"e1": len(hashes)}
    assert x.peers["peer"].group == "other-pod"  # siblings are told apart by it
    assert "gone" not in core.approx.endpoints()
    by = core.registry.by_name
    assert (by["e0"].peer_in_flight, by["e1"].peer_in_flight) == (2.0, 5.0)
    assert by["e1"].in_flight_total == 5.0 and by["e1"].num_in_flight == 0
    clock.now += x.cfg.stale_after_s + 0.001
    x.refresh_peer_load(clock.now)
    assert by["e1"].peer_in_flight == 0.0


def test_a_batch_hashed_with_another_seed_or_block_size_is_refused():
    x = Exchange(core_with("e0"), "tok")
    assert "PYTHONHASHSEED" in (x.check_batch(batch_from(x, fingerprint=fingerprint() + 1))
                                or "")
    assert "block_bytes" in (x.check_batch(batch_from(x, block_bytes=65)) or "")
    assert x.check_batch(batch_from(x)) is None


def test_a_recorded_decision_goes_to_the_outbox_only_while_the_exchange_is_on():
    core = core_with("e0", enabled=False)
    x = Exchange(core, "tok")
    routed = core.route(RequestInfo(prompt_text="q" * 640), "unified", 0.0)
    core.record(routed)
    assert not x.outbox.chains
    sibling = Exchange(core, "tok", siblings=["http://127.0.0.1:1"])  # workers: always on
    core.record(routed)
    assert sibling.outbox.num_blocks == len(routed.hashes) > 0


def test_sessions_placed_by_a_peer_are_adopted_unless_placed_here():
    core = core_with("e0")
    split = RevisionSplit()
    split.configure(RevisionsConfig(weights={"r1": 50, "r2": 50}))
    x = Exchange(core, "tok", split=split)
    mine = split.assign("mine")
    assert x.outbox.sessions == {"mine": mine}
    other = "r2" if mine == "r1" else "r1"
    x.apply_batch(batch_from(x, sessions={"mine": other, "theirs": "r2", "bogus": "r9"}))
    assert split.sessions["mine"] == mine and split.sessions["theirs"] == "r2"
    assert "bogus" not in split.sessions


def test_a_push_due_only_with_news_or_a_heartbeat():
    clock = Clock()
    x = Exchange(core_with("e0"), "tok", clock=clock)
    x.last_sent_in_flight, x.last_push_at = {"e0": 0.0}, clock.now
    assert not x.is_push_due({"e0": 0.0}, clock.now)
    assert x.is_push_due({"e0": 1.0}, clock.now)
    assert x.is_push_due({"e0": 0.0}, clock.now + x.cfg.stale_after_s / 3)
    assert not x.is_push_due({"e0": 0.0}, clock.now + x.cfg.stale_after_s / 3 - 0.001)


def test_peers_skip_siblings_and_addresses_that_turned_out_to_be_us():
    x = Exchange(core_with("e0", peers=["http://10.0.0.1:80", "http://10.0.0.2:80",
                                        "http://127.0.0.1:5"]),
                 "tok", siblings=["http://127.0.0.1:5"])
    x.self_urls.add("http://10.0.0.1:80")
    assert x.remote_peers() == ["http://10.0.0.2:80"]
    assert url_of("::1", 8080) == "http://[::1]:8080" and url_of("10.1.2.3", 1) == \
        "http://10.1.2.3:1"
    assert Exchange(core_with("e0", peers=["http://10.0.0.2:80"]), None).remote_peers() == []


def test_a_batch_from_another_pod_is_relayed_once_to_the_siblings():
    core = core_with("e0")
    x = Exchange(core, "tok", siblings=["http://127.0.0.1:1", "http://127.0.0.1:2"])
    sent: list[tuple[str, dict[str, Any]]] = []

    async def post(url: str, body: dict[str, Any]) -> None:
        sent.append((url, body))

    x.post = post  # type: ignore[method-assign]

    class Request:
        def __init__(self, body: dict[str, Any]) -> None:
            self.body = body

        async def read(self) -> bytes:
            import json
            return json.dumps(self.body).encode()

    async def go() -> None:
        await x.handle_push(Request(batch_from(x, relay=True)))  # type: ignore[arg-type]
        await x.handle_push(Request(batch_from(x, relay=False)))  # type: ignore[arg-type]
        await x.handle_push(Request(batch_from(x, relay=True,  # type: ignore[arg-type]
                                               group=x.group)))
        await asyncio.sleep(0)
        await asyncio.gather(*x._relays)

    asyncio.run(go())
    assert sorted(url for url, _ in sent) == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert all(body["relay"] is False for _, body in sent)


def test_the_hash_seed_follows_the_token_and_reexecs_into_it(tmp_path):
    assert hash_seed_for("a") == hash_seed_for("a") != hash_seed_for("b")
    assert 1 <= int(hash_seed_for("a")) <= 4294967295
    script = tmp_path / "probe.py"
    script.write_text("import sys\nfrom kvfleet_router import exchange_seed as s\n"
                      "s.RUN_ROUTER = 'from kvfleet_router.exchange_seed import fingerprint; "
                      "print(fingerprint())'\ns.ensure_hash_seed(sys.argv[1], [])\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    runs = [subprocess.run([sys.executable, str(script), tok], env=env, capture_output=True,
                           text=True, check=True).stdout for tok in ("t1", "t1", "t2")]
    assert runs[0] == runs[1] != runs[2] and runs[0].strip()
