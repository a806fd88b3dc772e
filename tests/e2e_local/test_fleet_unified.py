"""`kvfleet up` on simulated engines, unified 1-6: scale up on a load step, scale down through
drain while traffic continues, zero failed requests, nothing left behind."""

import asyncio
import signal
import time

import pytest
from e2e_fleet import POOLS
from e2e_loadgen import run_load
from kvfleet_operator.api import load_pool

pytestmark = pytest.mark.slow

POOL = "sim-unified.yaml"
MODEL = "llama3-8b"


def _desired(state):
    return state.get("desired", {}).get("unified", 0)


async def _watch(fleet, stop, seen):
    """Record the largest desired count and when the first scale-up showed, while load runs."""
    while not stop.is_set():
        num = _desired(fleet.state())
        if num > seen["max"]:
            seen["max"] = num
            seen.setdefault("first_up_at", time.monotonic())
        await asyncio.sleep(0.2)


def test_load_step_scales_up_then_drains_down_without_a_failed_request(start_fleet):
    spec = load_pool(POOLS / POOL).spec
    fleet = start_fleet(POOL)
    fleet.wait_ready("unified", 1)

    async def scenario():
        stop, seen = asyncio.Event(), {"max": 1}
        watcher = asyncio.create_task(_watch(fleet, stop, seen))
        started = time.monotonic()
        burst = await run_load(fleet.endpoint, MODEL, concurrency=24, duration_s=8, max_tokens=48)
        # Light traffic keeps flowing while the fleet shrinks, so drains happen under load.
        trickle = asyncio.create_task(
            run_load(fleet.endpoint, MODEL, concurrency=3, duration_s=12, max_tokens=256))
        await asyncio.to_thread(
            fleet.wait_for, "scale-down to 1 replica",
            lambda s: _desired(s) == 1 and len(fleet.replicas(s, "unified")) == 1, 40)
        light = await trickle
        stop.set()
        await watcher
        return started, seen, burst, light

    started, seen, burst, light = asyncio.run(scenario())

    # (1) Scale-up within the configured windows: panic window + two decision intervals,
    # plus slack for a shared 2-core machine.
    a = spec.autoscaling
    bound_s = a.panic.window_seconds + 2 * a.interval_seconds + 5
    up_after_s = seen.get("first_up_at", float("inf")) - started
    drains = [e for e in fleet.events() if e.startswith("stop unified-")]
    print(f"\nunified: first scale-up {up_after_s:.1f}s after the load step (bound {bound_s}s); "
          f"max desired {seen['max']}; {burst.num_ok + light.num_ok} requests ok, "
          f"{burst.num_failed + light.num_failed} failed; drains: {drains}")
    assert seen["max"] >= 3, f"the burst did not scale the fleet out (max desired {seen['max']})"
    assert up_after_s <= bound_s
    # (2) Down through drain: victims were marked draining in the router, then stopped.
    events = fleet.events()
    drained = {e.split()[1].rstrip(":") for e in events if e.startswith("drain unified-")}
    stopped = {e.split()[1] for e in events if e.startswith("stopped unified-")}
    assert len(drained) >= 2 and drained <= stopped, events
    assert all("exit 0" in e for e in events if e.startswith("stopped unified-"))
    # (3) Not one failed request across the whole run.
    assert burst.num_ok > 0 and light.num_ok > 0
    assert burst.num_failed == 0, burst.errors
    assert light.num_failed == 0, light.errors
    # (4) A clean exit, and no process left.
    assert fleet.stop(signal.SIGINT) == 0
    assert fleet.leftovers() == []
    assert "stopped; no process left" in fleet.output()
