"""Crash handling: a SIGKILLed replica under load is restarted; the router ejects it, then
readmits it; only requests already streaming on it may fail, and they fail cleanly.
A SIGKILLed `kvfleet up` takes every child with it."""

import asyncio
import os
import signal
import time

import pytest
from e2e_loadgen import run_load

pytestmark = pytest.mark.slow

MODEL = "llama3-8b"
VICTIM = "unified-0"


def _endpoint(view, name):
    return next(e for e in view["endpoints"] if e["name"] == name)


async def _watch_router(fleet, name, timeout_s):
    """(saw the router eject `name`, saw it readmitted afterwards)."""
    is_ejected = False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ep = _endpoint(await asyncio.to_thread(fleet.router_view), name)
        except StopIteration:
            ep = {"is_healthy": False}  # not listed at all counts as out of rotation
        if not ep["is_healthy"]:
            is_ejected = True
        elif is_ejected:
            return True, True
        await asyncio.sleep(0.05)
    return is_ejected, False


def test_sigkilled_replica_restarts_and_is_readmitted_under_load(start_fleet):
    fleet = start_fleet("sim-crash.yaml")
    state = fleet.wait_ready("unified", 2)
    victim = next(r for r in state["replicas"] if r["name"] == VICTIM)

    async def scenario():
        load = asyncio.create_task(
            run_load(fleet.endpoint, MODEL, concurrency=8, duration_s=10, max_tokens=128))
        await asyncio.sleep(3)
        view = await asyncio.to_thread(fleet.router_view)
        num_in_flight = _endpoint(view, VICTIM)["num_in_flight"]
        os.kill(victim["pid"], signal.SIGKILL)
        ejected, readmitted = await _watch_router(fleet, VICTIM, timeout_s=30)
        return num_in_flight, ejected, readmitted, await load

    num_in_flight, ejected, readmitted, result = asyncio.run(scenario())

    assert ejected and readmitted, (ejected, readmitted)
    state = fleet.wait_ready("unified", 2)
    restarted = next(r for r in state["replicas"] if r["name"] == VICTIM)
    assert restarted["num_restarts"] == 1 and restarted["last_exit_code"] == -signal.SIGKILL
    assert restarted["pid"] != victim["pid"]
    assert any(e.startswith(f"restart {VICTIM}") for e in fleet.events())
    # Only the streams that were on the victim may break, each with a clean error event;
    # nothing gets a non-2xx answer, because the router retries before the first byte.
    assert result.num_ok > 0
    assert result.num_http_errors == 0, result.errors
    assert result.num_broken <= num_in_flight, (num_in_flight, result.errors)
    assert set(result.error_types) <= {"APIError"}, result.errors
    assert fleet.stop(signal.SIGTERM) == 0
    assert fleet.leftovers() == []


def test_sigkilled_up_leaves_no_child(start_fleet):
    fleet = start_fleet("sim-crash.yaml")
    state = fleet.wait_ready("unified", 2)
    pids = [r["pid"] for r in state["replicas"]]
    assert len(pids) == 3 and all(pids)  # the router and two engines
    fleet.proc.kill()
    fleet.proc.wait()
    assert fleet.leftovers() == []
