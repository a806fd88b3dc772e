"""A killed control loop (issue 31, item 3), with real processes: SIGKILL `kvfleet up` and
serving goes on (its router and engines outlive it); the next `up` on the same state dir
adopts them (no duplicate, no restart), carries a drain's deadline on from when the drain
started (not from the restart), and never sends the router an older config version."""

import subprocess
import sys
import threading
import time

import openai
from e2e_fleet import Fleet

MODEL = "llama3-8b"
DRAIN_TIMEOUT_S = 12.0  # sim-restart-*.yaml
STREAM_TOKENS = 4000  # ~27 s on one simulated H100 replica: it outlasts every drain here


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _pids(state: dict) -> dict[str, int]:
    return {r["name"]: r["pid"] for r in state["replicas"]}


def _kill(fleet: Fleet) -> None:
    fleet.proc.kill()
    fleet.proc.wait()


def _successor(fleet: Fleet, pool: str) -> Fleet:
    """Another `up` on the same state dir, leaving the killed one's children running."""
    fleet.successor = Fleet(pool, fleet.tmp_path, fleet.num_start + 1)
    return fleet.successor


def _stream(endpoint: str, out: list[str]) -> None:
    client = openai.OpenAI(base_url=endpoint, api_key="unused", max_retries=0, timeout=90)
    try:
        for chunk in client.completions.create(model=MODEL, prompt="tell me everything",
                                               max_tokens=STREAM_TOKENS, stream=True,
                                               extra_body={"ignore_eos": True}):  # fmt: skip
            out.append(chunk.choices[0].text if chunk.choices else "")
    except openai.OpenAIError:
        pass  # the drained victim is stopped at its timeout, its stream cut: expected here
    finally:
        client.close()


def test_a_killed_up_leaves_serving_and_its_successor_adopts_without_duplicates(start_fleet):
    fleet = start_fleet("sim-restart-two.yaml")
    state = fleet.wait_ready("unified", 2)
    pids = _pids(state)
    version = state["router"]["config_version"]
    _kill(fleet)
    assert all(_alive(pid) for pid in pids.values()), pids  # nothing died with it
    status = subprocess.run([sys.executable, "-m", "kvfleet_operator.cli.main", "status",
                             "--state-dir", str(fleet.state_dir)],
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    assert "3 processes it started still serve" in status.stdout, status.stdout
    assert "(serving, without a control loop)" in status.stdout

    client = openai.OpenAI(base_url=fleet.endpoint, api_key="unused", max_retries=0, timeout=30)
    for _ in range(4):  # both engines, through the router, while no loop runs
        reply = client.completions.create(model=MODEL, prompt="still there?", max_tokens=4)
        assert reply.choices[0].finish_reason in ("stop", "length")
    client.close()

    second = _successor(fleet, "sim-restart-two.yaml")
    state = second.wait_for("the children adopted",
                            lambda s: s.get("pid") == second.proc.pid and s.get("is_serving"), 30)
    assert _pids(state) == pids  # the same processes: adopted, none started, none restarted
    assert all(r["num_restarts"] == 0 for r in state["replicas"])
    assert sum("adopt " in line for line in second.events()) == 3
    assert state["router"]["config_version"] >= version
    assert second.router_view()["version"] == state["router"]["config_version"]
    time.sleep(2)  # a few more ticks: still nothing started
    assert _pids(second.state()) == pids
    assert second.stop() == 0
    assert second.leftovers() == [] and fleet.leftovers() == []


def test_a_drain_deadline_survives_a_killed_up(start_fleet):
    fleet = start_fleet("sim-restart-two.yaml")
    state = fleet.wait_ready("unified", 2)
    pids = _pids(state)
    streams: list[list[str]] = [[], []]
    threads = [threading.Thread(target=_stream, args=(fleet.endpoint, out), daemon=True)
               for out in streams]  # fmt: skip
    for t in threads:
        t.start()
    fleet.wait_for("a stream on each replica", lambda s: all(
        e["num_in_flight"] >= 1 for e in s["router"]["endpoints"].values()), 20)
    _kill(fleet)

    # The pool now wants one replica: the successor adopts both and drains one, busy.
    second = _successor(fleet, "sim-restart-one.yaml")
    state = second.wait_for("a drain under way", lambda s: s.get("pid") == second.proc.pid
                            and s.get("loop", {}).get("drain_started"), 30)
    ((victim, started),) = state["loop"]["drain_started"].items()
    version = state["router"]["config_version"]
    assert _pids(state) == pids
    time.sleep(1.0)
    assert _pids(second.state()) == pids  # still draining: its stream is in flight
    _kill(second)  # mid-drain
    assert _alive(pids[victim]) and _alive(pids["router"])
    time.sleep(max(0.0, started + 5.0 - time.time()))  # the loop stays dead a while

    third = _successor(second, "sim-restart-one.yaml")
    state = third.wait_for("adopted", lambda s: s.get("pid") == third.proc.pid, 30)
    assert state["loop"]["drain_started"].get(victim, started) == started  # not restarted
    assert state["router"]["config_version"] >= version  # never backwards
    def is_stopping(s: dict) -> bool:  # the loop let go of it (the engine may still finish)
        return all(r["state"] == "stopping" for r in s["replicas"] if r["name"] == victim)

    gone = third.wait_for(f"{victim} stopping", is_stopping, 30)
    stopped_after = time.time() - started
    # From the drain's own start: DRAIN_TIMEOUT_S plus a tick or two. A timer restarted
    # with the third loop would run to at least started + 5 + DRAIN_TIMEOUT_S + start-up.
    assert DRAIN_TIMEOUT_S - 1.0 <= stopped_after < DRAIN_TIMEOUT_S + 4.0, stopped_after
    assert [line for line in third.events() if "drain timeout" in line]
    survivor = next(n for n in pids if n not in ("router", victim))
    time.sleep(1.0)
    now = _pids(third.state())  # the victim may still be finishing its stream, or gone
    assert set(now) <= set(pids) and all(now[n] == pids[n] for n in now), (now, pids)
    assert _pids(gone)[survivor] == pids[survivor]  # adopted throughout, never duplicated
    assert third.router_view()["version"] >= version
    assert third.stop() == 0
    for t in threads:
        t.join(timeout=60)
    assert streams[0] or streams[1]  # the survivor's stream got its tokens
    assert third.leftovers() == [] and second.leftovers() == [] and fleet.leftovers() == []
