"""`kvfleet up` on simulated engines, prefill 1-3 / decode 1-6: a load step of long prompts
scales both roles out, they drain back down while traffic continues, no request fails and
nothing is left behind."""

import asyncio
import signal
import urllib.error
import urllib.request

import pytest
from e2e_loadgen import run_load

pytestmark = pytest.mark.slow

MODEL = "llama3-8b"


def _desired(state, role):
    return state.get("desired", {}).get(role, 0)


async def _watch(fleet, stop, seen):
    while not stop.is_set():
        state = fleet.state()
        for role in ("prefill", "decode"):
            seen[role] = max(seen[role], _desired(state, role))
        await asyncio.sleep(0.2)


def test_prefill_and_decode_scale_out_and_drain_back_without_a_failed_request(start_fleet):
    fleet = start_fleet("sim-pd.yaml")
    fleet.wait_ready("prefill", 1)
    fleet.wait_ready("decode", 1)

    def is_back_to_one(state):
        return all(_desired(state, r) == 1 and len(fleet.replicas(state, r)) == 1
                   for r in ("prefill", "decode"))

    async def scenario():
        stop, seen = asyncio.Event(), {"prefill": 1, "decode": 1}
        watcher = asyncio.create_task(_watch(fleet, stop, seen))
        # Long prompts (2,000 byte tokens) go through a separate prefill replica.
        burst = await run_load(fleet.endpoint, MODEL, concurrency=24, duration_s=8,
                               max_tokens=48, prompt_chars=2000)
        trickle = asyncio.create_task(run_load(fleet.endpoint, MODEL, concurrency=2,
                                               duration_s=12, max_tokens=48, prompt_chars=2000))
        await asyncio.to_thread(fleet.wait_for, "scale-down to 1 + 1", is_back_to_one, 45)
        light = await trickle
        stop.set()
        await watcher
        return seen, burst, light

    seen, burst, light = asyncio.run(scenario())

    print(f"\npd: max desired {seen}; {burst.num_ok + light.num_ok} requests ok, "
          f"{burst.num_failed + light.num_failed} failed")
    assert seen["decode"] >= 2 and seen["prefill"] >= 2, seen
    events = fleet.events()
    for role in ("prefill", "decode"):
        drained = {e.split()[1].rstrip(":") for e in events if e.startswith(f"drain {role}-")}
        stopped = {e.split()[1] for e in events if e.startswith(f"stopped {role}-")}
        assert drained and drained <= stopped, events
    assert burst.num_ok > 0 and light.num_ok > 0
    assert burst.num_failed == 0, burst.errors
    assert light.num_failed == 0, light.errors
    # KV transfer and KV events sit behind the fleet's engine token: a stranger gets 401.
    replica = fleet.replicas(fleet.state(), "prefill")[0]
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{replica['address']}/v1/kv_events", timeout=10)
    assert refused.value.code == 401
    assert fleet.stop(signal.SIGINT) == 0
    assert fleet.leftovers() == []
