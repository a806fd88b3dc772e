"""A peer's export of cached blocks does not wait for the engine's step to end.

On a CPU replica one prefill step lasts seconds; an export queued behind it made every
peer fetch wait half a step on average. The export now reads under the engine thread's
bookkeeping lock while the forward pass computes. A simulated replica whose profile makes
one prefill step last seconds shows it: the export answers while that step still runs.
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


async def test_an_export_answers_while_a_long_step_computes(procs, tmp_path):
    engine = start_engine(procs, "--runner", "simulated", "--profile", slow_profile(tmp_path),
                          "--served-model-name", "sim", "--num-blocks", "256",
                          "--max-model-len", "1024", env={contract.ENGINE_TOKEN_ENV: TOKEN})
    cached = [7] * 32  # two blocks, cached by a short first request (0.3 s of prefill)
    long_prompt = [(i * 31) % 250 + 1 for i in range(300)]
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
