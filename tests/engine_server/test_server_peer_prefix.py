"""Peer prefix fetch between live engine processes (tiny random Llama), over real HTTP.

A peer computes a prompt; another replica, told by a `kv_transfer_params.peer_prefix`
hint that the peer holds its first blocks, fetches them from the peer's
/v1/kv_cache/export and must answer exactly what computing the prompt gives. Every way
the hint can go wrong falls back to computing (a 200 with the same tokens), is counted
in `kvfleet:peer_fetch_total{outcome}`, and leaves other requests alone.
"""

from __future__ import annotations

import asyncio
import json
import random

import aiohttp
import pytest
from engine_fixtures import TINY, start_engine
from kvfleet_engine import contract
from kvfleet_engine.contract import peer_prefix as pp
from kvfleet_engine.core.kv_transfer import unpack_frame
from kvfleet_engine.core.prefix_share import chained_hashes
from peer_prefix_helpers import AUTH, TOKEN, body, complete, counter, hint, outcome, samples

MODEL = "tiny-random"
BLOCK_BYTES = 2 * 2 * 16 * 2 * 32 * 4  # layers x K/V x tokens x kv heads x head dim x fp32
TOKEN_ENV = {contract.ENGINE_TOKEN_ENV: TOKEN}


def prompt_of(seed: int, num_tokens: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(num_tokens)]


@pytest.fixture(scope="module")
def fleet(procs):
    peer = start_engine(procs, *TINY, env=TOKEN_ENV)
    importer = start_engine(procs, *TINY, "--peer-fetch-timeout", "2", env=TOKEN_ENV)
    stranger = start_engine(procs, *TINY, "--peer-fetch-timeout", "2")  # has no token
    small = start_engine(procs, "--model", MODEL, "--num-blocks", "40", "--max-model-len", "256",
                         "--kv-export-max-bytes", str(3 * BLOCK_BYTES), env=TOKEN_ENV)
    return peer, importer, stranger, small


async def warm(session, peer_url: str, prompt: list[int]) -> str:
    """The peer computes the prompt (so it caches it); its text is the reference."""
    status, out = await complete(session, peer_url, body(MODEL, prompt))
    assert status == 200, out
    return out["choices"][0]["text"]


async def hinted(session, url: str, prompt: list[int], params: dict, **extra) -> dict:
    status, out = await complete(session, url, body(MODEL, prompt,
                                                    kv_transfer_params=params, **extra))
    assert status == 200, out
    return out


async def test_fetched_blocks_give_exactly_the_computed_tokens(fleet):
    peer, importer, _, _ = fleet
    async with aiohttp.ClientSession() as session:
        before, peer_before = await samples(session, importer.url), await samples(session,
                                                                                  peer.url)
        num_blocks = 0
        for seed, length in ((1, 33), (2, 48), (3, 200), (4, 17)):
            prompt = prompt_of(seed, length)
            want = await warm(session, peer.url, prompt)
            usable = (length - 1) // 16
            got = await hinted(session, importer.url, prompt, hint(peer.url, prompt, usable))
            assert got["choices"][0]["text"] == want, length
            assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == usable * 16
            num_blocks += usable
        after, peer_after = await samples(session, importer.url), await samples(session, peer.url)
    assert outcome(after, MODEL, "hit") - outcome(before, MODEL, "hit") == 4
    for family, want in ((pp.PEER_FETCH_BLOCKS, num_blocks),
                         (pp.PEER_FETCH_TOKENS, num_blocks * 16),
                         (pp.PEER_FETCH_BYTES, num_blocks * BLOCK_BYTES)):
        assert counter(after, MODEL, family) - counter(before, MODEL, family) == want, family
    assert (counter(peer_after, MODEL, pp.PEER_EXPORT_BLOCKS)
            - counter(peer_before, MODEL, pp.PEER_EXPORT_BLOCKS)) == num_blocks
    seconds = f'{pp.PEER_FETCH_SECONDS}_count{{{contract.MODEL_LABEL}="{MODEL}"}}'
    assert after[seconds] - before[seconds] == 4


async def test_a_hint_longer_than_the_peer_holds_uses_the_part_it_has(fleet):
    peer, importer, stranger, _ = fleet
    prompt = prompt_of(10, 100)
    async with aiohttp.ClientSession() as session:
        await warm(session, peer.url, prompt[:50])  # the peer caches 3 blocks of 6
        status, want = await complete(session, stranger.url, body(MODEL, prompt))
        before = await samples(session, importer.url)
        got = await hinted(session, importer.url, prompt, hint(peer.url, prompt, 6),
                           stream=False)
        after = await samples(session, importer.url)
    assert status == 200 and got["choices"][0]["text"] == want["choices"][0]["text"]
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == 3 * 16
    assert outcome(after, MODEL, "partial") - outcome(before, MODEL, "partial") == 1


async def test_streaming_request_with_a_hint(fleet):
    peer, importer, _, _ = fleet
    prompt = prompt_of(11, 70)
    async with aiohttp.ClientSession() as session:
        want = await warm(session, peer.url, prompt)
        payload = body(MODEL, prompt, stream=True, kv_transfer_params=hint(peer.url, prompt, 4))
        text = ""
        async with session.post(importer.url + "/v1/completions", json=payload) as resp:
            assert resp.status == 200
            async for raw in resp.content:
                line = raw.decode().strip()
                if line.startswith("data: {"):
                    text += json.loads(line[6:])["choices"][0]["text"]
    assert text == want


async def test_evicted_blocks_fall_back_and_still_match(fleet):
    _, importer, _, small = fleet
    prompt = prompt_of(20, 81)  # 5 usable blocks; the small peer exports at most 3
    async with aiohttp.ClientSession() as session:
        want = await warm(session, small.url, prompt)
        before = await samples(session, importer.url)
        for i in range(8):  # 8 x 6 blocks through 39: every block of `prompt` is reused
            await warm(session, small.url, prompt_of(100 + i, 81))
        got = await hinted(session, importer.url, prompt, hint(small.url, prompt, 5))
        after = await samples(session, importer.url)
    assert got["choices"][0]["text"] == want
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert outcome(after, MODEL, "miss") - outcome(before, MODEL, "miss") == 1


async def test_export_is_cut_to_its_size_limit(fleet):
    _, importer, _, small = fleet
    prompt = prompt_of(21, 81)
    async with aiohttp.ClientSession() as session:
        want = await warm(session, small.url, prompt)
        before = await samples(session, importer.url)
        got = await hinted(session, importer.url, prompt, hint(small.url, prompt, 5))
        after = await samples(session, importer.url)
    assert got["choices"][0]["text"] == want
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == 3 * 16
    assert outcome(after, MODEL, "partial") - outcome(before, MODEL, "partial") == 1


async def test_eviction_racing_the_fetch_never_changes_the_answer(fleet):
    _, importer, _, small = fleet
    async with aiohttp.ClientSession() as session:
        for round_ in range(3):
            prompt = prompt_of(30 + round_, 81)
            want = await warm(session, small.url, prompt)
            flood = [complete(session, small.url, body(MODEL, prompt_of(200 + 10 * round_ + i,
                                                                        81)))
                     for i in range(8)]
            results = await asyncio.gather(
                hinted(session, importer.url, prompt, hint(small.url, prompt, 5)), *flood)
            assert results[0]["choices"][0]["text"] == want
            assert all(status == 200 for status, _ in results[1:])


async def _fake_peer(answer: bytes | None) -> asyncio.Server:
    """A host that is no engine: it answers `answer` raw, or never answers (None)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            if answer is None:
                await asyncio.sleep(30)
            else:
                writer.write(answer)
                await writer.drain()
        finally:
            writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


def _http(status: str, payload: bytes) -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode() + payload


async def test_every_bad_hint_falls_back_is_counted_and_spares_other_requests(fleet):
    peer, importer, stranger, _ = fleet
    stall = await _fake_peer(None)
    garbage = await _fake_peer(_http("200 OK", b"not a KV frame"))
    missing = await _fake_peer(_http("404 Not Found", b"no such route"))
    closed = await _fake_peer(b"")
    closed_port = closed.sockets[0].getsockname()[1]
    closed.close()
    await closed.wait_closed()

    def url_of(server: asyncio.Server) -> str:
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    prompt = prompt_of(40, 90)
    hashes = chained_hashes(prompt, 16, 5)
    cases = [  # (replica asked, hint, expected outcome)
        (importer, pp.peer_prefix_hint("http://no-such-peer.invalid:8000", hashes),
         ("unreachable", "timeout")),
        (importer, pp.peer_prefix_hint(f"http://127.0.0.1:{closed_port}", hashes),
         ("unreachable",)),
        (importer, pp.peer_prefix_hint(peer.url, [h ^ 1 for h in hashes]), ("mismatch",)),
        (stranger, pp.peer_prefix_hint(peer.url, hashes), ("unauthorized",)),
        (importer, pp.peer_prefix_hint(url_of(stall), hashes), ("timeout",)),
        (importer, pp.peer_prefix_hint(url_of(garbage), hashes), ("error",)),
        (importer, pp.peer_prefix_hint(url_of(missing), hashes), ("error",)),
    ]
    try:
        async with aiohttp.ClientSession() as session:
            want = await warm(session, peer.url, prompt)
            before = {e.url: await samples(session, e.url) for e in (importer, stranger)}
            finished: list[str] = []

            async def bad(i: int, engine, params, _):
                out = await hinted(session, engine.url, prompt, params)
                finished.append(f"bad{i}")
                return out

            async def good():
                await asyncio.sleep(0.3)  # while the stalled fetch waits
                other = prompt_of(41, 40)
                status, want_other = await complete(session, peer.url, body(MODEL, other))
                got = await hinted(session, importer.url, other, {})
                finished.append("good")
                assert got["choices"][0]["text"] == want_other["choices"][0]["text"]

            results = await asyncio.gather(*(bad(i, *case) for i, case in enumerate(cases)),
                                           good())
            after = {e.url: await samples(session, e.url) for e in (importer, stranger)}
    finally:
        for server in (stall, garbage, missing):
            server.close()
    for out in results[:-1]:
        assert out["choices"][0]["text"] == want
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] in (0, 5 * 16)
    assert finished.index("good") < finished.index("bad4")  # the stalled one came last
    for engine, _, outcomes in cases:
        delta = sum(outcome(after[engine.url], MODEL, o) - outcome(before[engine.url], MODEL, o)
                    for o in outcomes)
        assert delta >= 1, outcomes
    total = sum(outcome(after[e.url], MODEL, o) - outcome(before[e.url], MODEL, o)
                for e in (importer, stranger) for o in pp.OUTCOMES)
    assert total == len(cases)


@pytest.mark.parametrize("bad, message", [
    ("not an object", "must be an object"),
    ({"url": "ftp://x", "block_hashes": [1]}, "http(s)"),
    ({"url": "http://x:1/some/path", "block_hashes": [1]}, "base URL"),
    ({"url": "http://x:1", "block_hashes": []}, "non-empty"),
    ({"url": "http://x:1", "block_hashes": [-1]}, "integers"),
    ({"url": "http://x:1", "block_hashes": ["1"]}, "integers"),
    ({"block_hashes": [1]}, "URL"),
])
async def test_a_malformed_hint_is_a_400_naming_the_field_and_counted(fleet, bad, message):
    _, importer, _, _ = fleet
    async with aiohttp.ClientSession() as session:
        before = await samples(session, importer.url)
        status, err = await complete(session, importer.url, body(
            MODEL, prompt_of(50, 40), kv_transfer_params={"peer_prefix": bad}))
        after = await samples(session, importer.url)
    assert status == 400
    assert err["error"]["code"] == "invalid_peer_prefix"
    assert err["error"]["param"] == "kv_transfer_params.peer_prefix"
    assert message in err["error"]["message"]
    assert outcome(after, MODEL, "invalid") - outcome(before, MODEL, "invalid") == 1


async def test_export_endpoint_needs_the_token_and_checks_its_body(fleet):
    peer, _, _, _ = fleet
    prompt = prompt_of(60, 49)
    url = peer.url + pp.EXPORT_PATH
    hashes = chained_hashes(prompt, 16, 3)
    async with aiohttp.ClientSession() as session:
        await warm(session, peer.url, prompt)
        async with session.post(url, json={"block_hashes": hashes}) as resp:
            assert resp.status == 401
            assert (await resp.json())["error"]["type"] == "authentication_error"
        for bad in ({}, {"block_hashes": "x"}, {"block_hashes": [2**63]}, [1]):
            async with session.post(url, json=bad, headers=AUTH) as resp:
                assert resp.status == 400, bad
        async with session.post(url, json={"block_hashes": [hashes[1], hashes[2]]},
                                headers=AUTH) as resp:  # not chained from the root
            assert resp.status == 200
            header, payload = unpack_frame(await resp.read())
            assert (header.num_blocks, payload) == (0, b"")
        async with session.post(url, json={"block_hashes": hashes}, headers=AUTH) as resp:
            header, payload = unpack_frame(await resp.read())
    assert header.block_hashes == hashes and header.token_ids == prompt[:48]
    assert header.model == MODEL and len(payload) == 3 * BLOCK_BYTES


async def _hinted_at_a_stalled_peer(importer_url: str, seed: int):
    """A 90-token prompt hinted at a peer that never answers (5 blocks, `timeout_s` 0.3):
    the importer's metrics before and after, the answer, and the seconds it took."""
    stall = await _fake_peer(None)
    url = f"http://127.0.0.1:{stall.sockets[0].getsockname()[1]}"
    prompt = prompt_of(seed, 90)
    params = pp.peer_prefix_hint(url, chained_hashes(prompt, 16, 5), timeout_s=0.3)
    try:
        async with aiohttp.ClientSession() as session:
            before = await samples(session, importer_url)
            started = asyncio.get_running_loop().time()
            out = await hinted(session, importer_url, prompt, params)
            took = asyncio.get_running_loop().time() - started
            after = await samples(session, importer_url)
    finally:
        stall.close()
    return before, after, out, took


async def test_the_hints_shorter_timeout_gives_up_a_stalled_fetch_early(fleet):
    """The importer's own limit is 2 s; a hint's `timeout_s` of 0.3 s is obeyed."""
    _, importer, _, _ = fleet
    before, after, out, took = await _hinted_at_a_stalled_peer(importer.url, seed=43)
    assert out["usage"]["prompt_tokens"] == 90
    assert outcome(after, MODEL, "timeout") - outcome(before, MODEL, "timeout") == 1
    assert took < 1.5  # not the engine's 2 s


async def test_a_timed_out_fetch_counts_the_bytes_it_asked_for_and_its_wait(fleet):
    """Against a stalled peer no byte arrives, yet the fetch proves the link is at most
    (blocks asked x block bytes) / seconds waited fast: both counters say so."""
    _, importer, _, _ = fleet
    before, after, _, _ = await _hinted_at_a_stalled_peer(importer.url, seed=44)

    def delta(family: str) -> float:
        return counter(after, MODEL, family) - counter(before, MODEL, family)

    assert outcome(after, MODEL, "timeout") - outcome(before, MODEL, "timeout") == 1
    assert delta(pp.PEER_FETCH_TIMEOUT_BYTES) == 5 * BLOCK_BYTES
    # The hint's 0.3 s, as the engine's clock saw it: aiohttp's timer may fire a fraction of
    # a millisecond before a monotonic reading taken just before it was armed (0.29969 s
    # was seen under load), so the floor allows 10 ms.
    assert 0.29 <= delta(pp.PEER_FETCH_TIMEOUT_SECONDS) < 1.5
    assert delta(pp.PEER_FETCH_BYTES) == 0
