"""/metrics read with prometheus_client's parser: every contract name is there and moves
under load; /v1/kv_events streams NDJSON with consecutive sequence numbers."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from engine_fixtures import start_engine
from kvfleet_engine import contract
from kvfleet_engine.contract import KVEvent
from prometheus_client.parser import text_string_to_metric_families

GAUGES = [contract.NUM_REQUESTS_RUNNING, contract.NUM_REQUESTS_WAITING,
          contract.KV_CACHE_USAGE_PERC, contract.NUM_WAITING_PROMPT_TOKENS]
COUNTERS = [contract.PREFIX_CACHE_QUERIES, contract.PREFIX_CACHE_HITS, contract.NUM_PREEMPTIONS,
            contract.PROMPT_TOKENS, contract.GENERATION_TOKENS]
HISTOGRAMS = [contract.TIME_TO_FIRST_TOKEN, contract.INTER_TOKEN_LATENCY,
              contract.E2E_REQUEST_LATENCY, contract.REQUEST_QUEUE_TIME]
NUM_BLOCKS, BLOCK_SIZE = 40, 16
SHARED = "shared system prompt " * 4  # 84 bytes: five full blocks to hit in the prefix cache


@pytest.fixture(scope="module")
def engine(procs):
    # a small KV cache so that concurrent long requests force preemptions
    return start_engine(procs, "--model", "tiny-random", "--num-blocks", str(NUM_BLOCKS),
                        "--block-size", str(BLOCK_SIZE), "--max-model-len", "320",
                        "--max-num-seqs", "8")


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, dict]:
    """family name -> {sample name + sorted labels: value}, via prometheus_client.parser."""
    async with session.get(url + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = {
            (s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples
        }
    return out


def value(metrics: dict[str, dict], family: str, sample: str, **labels: str) -> float:
    labels.setdefault("model_name", "tiny-random")
    return metrics[family][(sample, tuple(sorted(labels.items())))]


def counter(metrics: dict[str, dict], name: str) -> float:
    return value(metrics, name, name + "_total")


def hist_count(metrics: dict[str, dict], name: str) -> float:
    return value(metrics, name, name + "_count")


async def test_every_contract_metric_is_present_and_moves_under_load(engine):
    url = engine.url
    async with aiohttp.ClientSession() as session:
        before = await scrape(session, url)
        for name in GAUGES + COUNTERS + HISTOGRAMS:
            assert name in before, f"{name} missing from /metrics"
        cache_info = value(before, contract.CACHE_CONFIG_INFO, contract.CACHE_CONFIG_INFO,
                           block_size=str(BLOCK_SIZE), num_gpu_blocks=str(NUM_BLOCKS))
        assert cache_info == 1
        assert value(before, contract.ROLE_INFO, contract.ROLE_INFO, role="unified") == 1
        assert value(before, contract.DRAINING, contract.DRAINING) == 0
        assert value(before, contract.KV_CACHE_USAGE_PERC, contract.KV_CACHE_USAGE_PERC) == 0

        peaks = {name: 0.0 for name in GAUGES}
        is_loading = True

        async def watch() -> None:
            while is_loading:
                now = await scrape(session, url)
                for name in GAUGES:
                    peaks[name] = max(peaks[name], value(now, name, name))
                await asyncio.sleep(0.01)

        async def one(i: int) -> None:
            body = {"model": "tiny-random", "prompt": f"{SHARED} request {i}", "max_tokens": 200,
                    "temperature": 0, "ignore_eos": True}
            async with session.post(url + "/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()

        watcher = asyncio.create_task(watch())
        await one(-1)  # warms the prefix cache with the shared blocks
        await asyncio.gather(*(one(i) for i in range(8)))
        is_loading = False
        await watcher
        after = await scrape(session, url)

    num_requests = 9
    for name in (contract.PROMPT_TOKENS, contract.GENERATION_TOKENS,
                 contract.PREFIX_CACHE_QUERIES, contract.PREFIX_CACHE_HITS,
                 contract.NUM_PREEMPTIONS):
        assert counter(after, name) > counter(before, name), f"{name} did not move"
    assert counter(after, contract.GENERATION_TOKENS) - counter(
        before, contract.GENERATION_TOKENS) == num_requests * 200
    for name in (contract.TIME_TO_FIRST_TOKEN, contract.E2E_REQUEST_LATENCY,
                 contract.REQUEST_QUEUE_TIME, contract.REQUEST_TIME_PER_OUTPUT_TOKEN):
        assert hist_count(after, name) - hist_count(before, name) == num_requests, name
    assert hist_count(after, contract.INTER_TOKEN_LATENCY) - hist_count(
        before, contract.INTER_TOKEN_LATENCY) == num_requests * 199

    def hist_sum(metrics: dict[str, dict], name: str) -> float:
        return value(metrics, name, name + "_sum")

    # each request's mean time per output token is its gaps' sum over its 199 gaps
    gaps = hist_sum(after, contract.INTER_TOKEN_LATENCY) - hist_sum(
        before, contract.INTER_TOKEN_LATENCY)
    means = hist_sum(after, contract.REQUEST_TIME_PER_OUTPUT_TOKEN) - hist_sum(
        before, contract.REQUEST_TIME_PER_OUTPUT_TOKEN)
    assert means * 199 == pytest.approx(gaps, rel=1e-6) and means > 0
    assert peaks[contract.NUM_REQUESTS_RUNNING] >= 1
    assert peaks[contract.NUM_REQUESTS_WAITING] >= 1  # 8 x 15 blocks > 39: some must wait
    assert 0 < peaks[contract.KV_CACHE_USAGE_PERC] <= 1
    assert peaks[contract.NUM_WAITING_PROMPT_TOKENS] >= 1
    assert value(after, contract.KV_CACHE_USAGE_PERC, contract.KV_CACHE_USAGE_PERC) == 0
    assert value(after, contract.NUM_REQUESTS_RUNNING, contract.NUM_REQUESTS_RUNNING) == 0


async def test_kv_events_stream_ndjson_with_consecutive_seq(engine):
    url = engine.url
    prompt = "kv events " * 8  # 80 bytes: five full blocks
    async with aiohttp.ClientSession() as session:
        events_resp = await session.get(url + "/v1/kv_events")
        assert events_resp.status == 200
        assert events_resp.headers["Content-Type"].startswith("application/x-ndjson")
        body = {"model": "tiny-random", "prompt": prompt, "max_tokens": 2, "temperature": 0}
        async with session.post(url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
        events: list[KVEvent] = []
        while not any(e.type == "BlockStored" and e.token_ids[:BLOCK_SIZE] == list(
                prompt.encode()[:BLOCK_SIZE]) for e in events):
            line = await asyncio.wait_for(events_resp.content.readline(), 10)
            events.append(KVEvent.from_dict(json.loads(line)))
        events_resp.close()
        seqs = [e.seq for e in events]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        stored = [e for e in events if e.type == "BlockStored"]
        assert all(e.block_hashes and e.block_size == BLOCK_SIZE for e in stored)
        # resuming after a seq replays only what came later
        last = seqs[-1]
        resumed = await session.get(url + f"/v1/kv_events?since={last - 1}")
        line = await asyncio.wait_for(resumed.content.readline(), 10)
        resumed.close()
        assert json.loads(line)["seq"] == last


@pytest.mark.parametrize("flag, is_hit_expected", [
    ("--enable-prefix-caching", True), ("--no-enable-prefix-caching", False),
])
async def test_prefix_caching_flag(procs, flag, is_hit_expected):
    engine = start_engine(procs, "--runner", "simulated", "--profile", "cpu-tiny", flag,
                          "--served-model-name", "cpu-tiny", "alias")
    body = {"model": "alias", "prompt": "the same prompt, twice over " * 3, "max_tokens": 2}
    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            async with session.post(engine.url + "/v1/completions", json=body) as resp:
                assert resp.status == 200
        metrics = await scrape(session, engine.url)
    hits = value(metrics, contract.PREFIX_CACHE_HITS, contract.PREFIX_CACHE_HITS + "_total",
                 model_name="cpu-tiny")
    assert (hits > 0) is is_hit_expected
