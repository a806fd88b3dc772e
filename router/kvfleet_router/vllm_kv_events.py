"""vLLM's KV events (its ZMQ publisher, `--kv-events-config`) into the precise prefix index.

The wire (vllm/distributed/kv_events.py, vLLM 0.32): a PUB socket sends multipart frames
`[topic, seq (8 bytes, big-endian), payload]`, one per batch of events; `payload` is
msgpack of `[ts, [event, ...], data_parallel_rank]`, each event a map tagged by `type`:
`BlockStored` (block_hashes, parent_block_hash, token_ids, block_size, medium, ...),
`BlockRemoved` (block_hashes, medium), `AllBlocksCleared`. Block hashes are 64-bit ints
(`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`, the default) or sha256 bytes; both are read. A
ROUTER socket (`replay_endpoint`) answers `[b"", start_seq (8 bytes)]` with every buffered
batch from `start_seq` as `[b"", topic, seq, payload]`, then `[b"", b"", -1, b""]`.

How the index matches prompts to vLLM's blocks: vLLM hashes a block as
sha256(cbor((parent_hash, tokens, extra_keys))) with a random or PYTHONHASHSEED-seeded
root, which the router does not reproduce. It does not need to: BlockStored carries each
block's token ids, so `PreciseKVIndex` re-hashes them with the router's own chain
(`prefix_index.hash_tokens`) and keeps vLLM hash -> router hash for removals and parents.
A request whose prompt is token ids then matches by `hash_tokens(prompt, block_size)`.

Gaps: batches carry a sequence number. On (re)connect and whenever a batch is missing,
the follower asks the replay socket for everything after the last applied batch; if the
buffer no longer reaches back that far (or there is no replay socket, or vLLM restarted
and its sequence went back), the endpoint's index is reset and rebuilt from the new
events (a resync: it under-states the cache until prefixes are stored again, it never
claims blocks that may be gone).

Public API:
- `decode_batch(payload) -> list[KVEvent]` (pure; seq 0.. within the batch).
- `VllmFeed(index, endpoint)`: `apply(seq, payload) -> str` ("ok", "dup", "gap",
  "restart"), `reset()`, `last_seq`. Pure bookkeeping over `PreciseKVIndex`.
- `zmq_endpoints(url) -> (pub, replay)`: a replica's addresses from its HTTP URL (PUB on
  port+1, replay on port+2, as kvfleet's engine_args renders them).
- `async follow_vllm(name, url, index, ...)`: subscribe forever (needs `pyzmq`).
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import OrderedDict
from typing import Any
from urllib.parse import urlsplit

import msgpack
from kvfleet_engine.contract import KVEvent

from kvfleet_router.prefix_index import PreciseKVIndex

log = logging.getLogger(__name__)

END_SEQ = -1
PUB_OFFSET, REPLAY_OFFSET = 1, 2  # operator's engine_args.kv_events_endpoints
DEVICE_MEDIA = (None, "GPU")  # the engine's own KV cache (vLLM says GPU on CPU builds too)
NUM_RECENT = 4096  # batches remembered to tell a duplicate from a restarted engine


def _hash(h: Any) -> int:
    return int.from_bytes(h, "big") if isinstance(h, bytes | bytearray) else int(h)


def decode_batch(payload: bytes) -> list[KVEvent]:
    """One batch's events as contract KVEvents (seq numbered from 0 inside the batch).
    Events on an offload tier (medium CPU/STORAGE) are left out: only the engine's own
    cache serves prefix hits. Raises ValueError on a payload that is not a vLLM batch."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        raw_events = batch[1]
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError,
            TypeError, IndexError, KeyError) as exc:
        raise ValueError(f"not a vLLM KV event batch: {exc}") from None
    if not isinstance(raw_events, list):
        raise ValueError("not a vLLM KV event batch: events is not a list")
    out: list[KVEvent] = []
    for raw in raw_events:
        if not isinstance(raw, dict) or raw.get("medium") not in DEVICE_MEDIA:
            continue
        kind = raw.get("type")
        if kind == "BlockStored":
            parent = raw.get("parent_block_hash")
            out.append(KVEvent(
                seq=len(out), type="BlockStored",
                block_hashes=[_hash(h) for h in raw.get("block_hashes") or []],
                parent_block_hash=None if parent is None else _hash(parent),
                token_ids=[int(t) for t in raw.get("token_ids") or []],
                block_size=int(raw.get("block_size") or 0), medium="gpu"))
        elif kind == "BlockRemoved":
            out.append(KVEvent(seq=len(out), type="BlockRemoved",
                               block_hashes=[_hash(h) for h in raw.get("block_hashes") or []]))
        elif kind == "AllBlocksCleared":
            out.append(KVEvent(seq=len(out), type="AllBlocksCleared", block_hashes=[]))
    return out


class VllmFeed:
    """One vLLM endpoint's batches into the index, in order, with gaps made visible."""

    def __init__(self, index: PreciseKVIndex, endpoint: str) -> None:
        self.index = index
        self.endpoint = endpoint
        self.last_seq: int | None = None  # last batch applied
        self.num_resets = 0
        self.num_batches = 0
        self._recent: OrderedDict[int, int] = OrderedDict()  # seq -> crc32 of its payload

    def reset(self) -> None:
        self.index.reset(self.endpoint)
        self.num_resets += 1

    def check(self, seq: int, payload: bytes | None = None) -> str:
        """What applying batch `seq` now would be: ok, dup, gap or restart. An old seq is a
        duplicate (replay and live stream overlap) when its payload is the one applied
        under that seq; a different payload means vLLM restarted and counts from 0 again."""
        if self.last_seq is None or seq == self.last_seq + 1:
            return "ok"
        if seq <= self.last_seq:
            seen = self._recent.get(seq)
            if payload is not None and seen is not None and seen != zlib.crc32(payload):
                return "restart"
            return "dup"
        return "gap"

    def apply(self, seq: int, payload: bytes, *, force: bool = False) -> str:
        """Apply batch `seq`. A gap is applied only with `force` (after a reset: the
        caller could not replay); otherwise the caller replays first."""
        state = self.check(seq, payload)
        if state == "dup" or (state == "gap" and not force):
            return state
        if state == "restart":
            self.reset()  # the engine restarted: its old cache is gone
            self._recent.clear()
        events = decode_batch(payload)
        next_seq = self.index.last_seq.get(self.endpoint, -1) + 1
        for i, event in enumerate(events):
            event.seq = next_seq + i  # the index wants one sequence across batches
            self.index.apply(self.endpoint, event)
        self.last_seq = seq
        self.num_batches += 1
        self._recent[seq] = zlib.crc32(payload)
        while len(self._recent) > NUM_RECENT:
            self._recent.popitem(last=False)
        return state


def zmq_endpoints(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    if ":" in host:
        host = f"[{host}]"
    return f"tcp://{host}:{port + PUB_OFFSET}", f"tcp://{host}:{port + REPLAY_OFFSET}"


async def _replay(ctx: Any, replay_endpoint: str, start: int,
                  timeout_s: float) -> list[tuple[int, bytes]] | None:
    """Buffered batches from `start` on, or None when the replay socket does not answer."""
    import zmq

    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(replay_endpoint)
    try:
        await sock.send_multipart([b"", start.to_bytes(8, "big")])
        out: list[tuple[int, bytes]] = []
        while True:
            if not await sock.poll(int(timeout_s * 1000)):
                return None
            frames = await sock.recv_multipart()
            if len(frames) != 4:
                continue
            seq = int.from_bytes(frames[2], "big", signed=True)
            if seq == END_SEQ:
                return out
            out.append((seq, frames[3]))
    finally:
        sock.close()


async def catch_up(feed: VllmFeed, ctx: Any, replay_endpoint: str | None,
                   timeout_s: float = 2.0) -> None:
    """Replay what is missing after `feed.last_seq`; reset when it cannot be had."""
    start = 0 if feed.last_seq is None else feed.last_seq + 1
    batches = None if replay_endpoint is None else await _replay(ctx, replay_endpoint, start,
                                                                 timeout_s)
    if batches is None:
        if feed.last_seq is not None:
            feed.reset()  # cannot know what was missed: resync from what comes next
            feed.last_seq = None
        return
    if batches and batches[0][0] > start and feed.last_seq is not None:
        feed.reset()  # the buffer no longer reaches back to the gap
        feed.last_seq = None
    for seq, payload in batches:
        if feed.check(seq, payload) != "dup":
            feed.apply(seq, payload, force=True)


async def follow_vllm(name: str, url: str, index: PreciseKVIndex, *,
                      pub: str | None = None, replay: str | None = None,
                      feed: VllmFeed | None = None) -> None:
    """Subscribe to one vLLM replica's KV events forever (cancel to stop)."""
    import zmq
    import zmq.asyncio

    default_pub, default_replay = zmq_endpoints(url)
    pub, replay = pub or default_pub, replay or default_replay
    feed = feed or VllmFeed(index, name)
    ctx = zmq.asyncio.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub)
    try:
        await asyncio.sleep(0.2)  # let the subscription reach the publisher first
        await catch_up(feed, ctx, replay)
        while True:
            frames = await sub.recv_multipart()
            if len(frames) != 3:
                continue
            seq = int.from_bytes(frames[1], "big")
            try:
                state = feed.check(seq, frames[2])
                if state == "gap":
                    await catch_up(feed, ctx, replay)
                    state = feed.check(seq, frames[2])
                    if state == "gap":  # the replay could not close it: resync
                        feed.reset()
                        feed.last_seq = None
                if state != "dup":
                    feed.apply(seq, frames[2], force=True)
            except ValueError as exc:
                log.warning("kv events from %s: %s; resyncing", name, exc)
                feed.reset()
                feed.last_seq = None
    finally:
        sub.close()
