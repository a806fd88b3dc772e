"""KV reads for other replicas do not wait for the engine's step to end: a peer's export
of cached blocks, and a decoder's pull of a finished prefill's held blocks.

On a CPU replica one prefill step lasts seconds; a read queued behind it made every peer
fetch and every P/D hand-off wait half a step on average. Both now read under the engine
thread's bookkeeping lock while the forward pass computes. A simulated replica whose
profile makes one prefill step last seconds shows it: the read answers while that step
still runs.
"""

from __future__ import annotations

import asyncio
import json
from importlib import resources

import aiohttp
from engine_fixtures import start_engine
from kvfleet_engine import contract
from kvfleet_engine.contract import peer_prefix as pp
from kvfleet_engine.core.kv_transfer import unpack_frame
from kvfleet_engine.core.prefix_share import chained_hashes
from peer_prefix_helpers import AUTH, TOKEN, body, complete

PREFILL_S_PER_TOKEN = 0.01  # a 300-token prompt: one 3 s prefill step


def slow_profile(tmp_path) -> str:
    src = resources.files("kvfleet_engine.runners") / "profiles" / "cpu-tiny.json"
    profile = json.loads(src.read_text())
    profile.update(name="slow-prefill", prefill_s_per_token=PREFILL_S_PER_TOKEN)
    path = tmp_path / "slow-prefill.json"
    path.write_text(json.dumps(profile))
    return str(path)


LONG_PROMPT = [(i * 31) % 250 + 1 for i in range(300)]


def slow_engine(procs, tmp_path, *extra: str):
    return start_engine(procs, "--runner", "simulated", "--profile", slow_profile(tmp_path),
                        "--served-model-name", "sim", "--num-blocks", "256",
                        "--max-model-len", "1024", *extra,
                        env={contract.ENGINE_TOKEN_ENV: TOKEN})


async def test_an_export_answers_while_a_long_step_computes(procs, tmp_path):
    engine = slow_engine(procs, tmp_path)
    cached = [7] * 32  # two blocks, cached by a short first request (0.3 s of prefill)
    long_prompt = LONG_PROMPT
    async with aiohttp.ClientSession() as session:
        status, _ = await complete(session, engine.url, body("sim", cached, max_tokens=1))
        assert status == 200
        long_request = asyncio.create_task(
            complete(session, engine.url, body("sim", long_prompt, max_tokens=1)))
        await asyncio.sleep(0.5)  # the long prompt's one prefill step has begun
        async with session.post(engine.url + pp.EXPORT_PATH, headers=AUTH,
                                json={"block_hashes": chained_hashes(cached, 16, 2)}) as resp:
            assert resp.status == 200
            header, _ = unpack_frame(await resp.read())
        still_computing = not long_request.done()
        status, _ = await long_request
    assert header.num_blocks == 2 and header.token_ids == cached
    assert still_computing, "the export waited for the step to end"
    assert status == 200


async def test_a_held_prefill_is_pulled_while_a_long_step_computes(procs, tmp_path):
    engine = slow_engine(procs, tmp_path, "--role", "prefill")
    pd = {contract.KV_TRANSFER_PARAMS: {"do_remote_decode": True}}
    async with aiohttp.ClientSession() as session:
        status, out = await complete(session, engine.url, body("sim", [7] * 40, **pd))
        assert status == 200, out
        handle = out[contract.KV_TRANSFER_PARAMS][contract.REMOTE_HANDLE]
        long_request = asyncio.create_task(
            complete(session, engine.url, body("sim", LONG_PROMPT, **pd)))
        await asyncio.sleep(0.5)  # the long prompt's one prefill step has begun
        async with session.get(f"{engine.url}/v1/kv_transfer/{handle}", headers=AUTH) as resp:
            assert resp.status == 200
            header, _ = unpack_frame(await resp.read())
        still_computing = not long_request.done()
        status, _ = await long_request
    assert header.num_blocks == 3 and header.token_ids == [7] * 40
    assert still_computing, "the pull waited for the step to end"
    assert status == 200
