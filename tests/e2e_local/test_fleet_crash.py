"""Crash handling: a SIGKILLed replica under load is restarted; the router ejects it, then
readmits it; only requests already streaming on it may fail, and they fail cleanly.
A SIGKILLed `kvfleet up` leaves its children serving (test_up_restart.py: the next `up`
adopts them)."""

import asyncio
import os
import signal
import subprocess
import sys
import time

import openai
import pytest
from e2e_fleet import POOLS
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
    # A restart delay longer than the router's probe interval (2 s), so the router must
    # notice the dead replica whichever way traffic happens to fall.
    fleet = start_fleet("sim-crash.yaml", "--restart-backoff", "3")
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

    print(f"\ncrash: {num_in_flight} in flight on {VICTIM} at SIGKILL; {result.num_ok} ok, "
          f"{result.num_broken} broken ({', '.join(result.error_types) or 'none'}), "
          f"{result.num_http_errors} non-2xx")
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


def test_sigkilled_up_leaves_no_child_and_a_restart_resumes(start_fleet):
    fleet = start_fleet("sim-crash.yaml")
    state = fleet.wait_ready("unified", 2)
    pids = [r["pid"] for r in state["replicas"]]
    assert len(pids) == 3 and all(pids)  # the router and two engines
    # `kvfleet status` from another terminal sees the same fleet.
    status = subprocess.run(
        [sys.executable, "-m", "kvfleet_operator.cli.main", "status", "--state-dir",
         str(fleet.state_dir)], capture_output=True, text=True, timeout=30)
    assert status.returncode == 0 and "running, pid" in status.stdout
    assert "unified 2/2" in status.stdout and "unified-1" in status.stdout
    # A second `up` on the same state dir is refused with one line.
    second = subprocess.run(
        [sys.executable, "-m", "kvfleet_operator.cli.main", "up", str(POOLS / "sim-crash.yaml"),
         "--state-dir", str(fleet.state_dir)], capture_output=True, text=True, timeout=30)
    assert second.returncode == 2 and "already running" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1

    fleet.wait_for("a first autoscaler decision",
                   lambda s: s.get("autoscaler_history", {}).get("decisions"), 30)
    fleet.proc.kill()
    fleet.proc.wait()
    assert sorted(fleet.leftovers(wait_s=0)) == sorted(pids)  # they outlive it, serving

    # A new `up` on the same state dir carries the autoscaler history on.
    before = fleet.state()["autoscaler_history"]["decisions"]
    restarted = fleet.restart()
    restarted.wait_ready("unified", 2)
    after = restarted.wait_for(
        "a decision after the restart",
        lambda s: len(s["autoscaler_history"]["decisions"]) > len(before), 30)
    decisions = after["autoscaler_history"]["decisions"]
    assert decisions[0]["t"] <= before[-1]["t"] < decisions[-1]["t"]
    assert restarted.stop() == 0
    assert restarted.leftovers() == []


def test_sigkilled_router_restarts_on_its_port_and_gets_its_config_back(start_fleet):
    fleet = start_fleet("sim-crash.yaml")
    state = fleet.wait_ready("unified", 2)
    router = next(r for r in state["replicas"] if r["name"] == "router")
    version = fleet.router_view()["version"]
    os.kill(router["pid"], signal.SIGKILL)

    def is_back(s):
        r = next(r for r in s["replicas"] if r["name"] == "router")
        return r["num_restarts"] == 1 and r["state"] == "ready" and r["pid"] != router["pid"]

    fleet.wait_for("the router restarted", is_back, 30)
    view = fleet.wait_for("the config re-pushed", lambda s: s["router"]["config_version"]
                          and _router_version(fleet) == version, 30)
    assert view["endpoint"] == state["endpoint"]  # the address users were given still works
    assert {e["name"] for e in fleet.router_view()["endpoints"]} == {"unified-0", "unified-1"}
    client = openai.OpenAI(base_url=fleet.endpoint, api_key="unused", max_retries=0, timeout=60)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "still there?"}], max_tokens=8)
    client.close()
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert fleet.stop() == 0
    assert fleet.leftovers() == []
    # The admin token is private to the fleet and never shown anywhere.
    token_file = fleet.state_dir / "admin-token"
    token = token_file.read_text().strip()
    assert token_file.stat().st_mode & 0o777 == 0o600
    shown = [fleet.output(), (fleet.state_dir / "state.json").read_text()]
    shown += [p.read_text(errors="replace") for p in (fleet.state_dir / "logs").iterdir()]
    assert not any(token in text for text in shown)


def _router_version(fleet):
    try:
        return fleet.router_view()["version"]
    except OSError:
        return None
