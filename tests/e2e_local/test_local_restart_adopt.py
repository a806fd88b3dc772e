"""What a restarted `kvfleet up` takes back (`LocalRuntime.adopt`, `procs.adopt`), process by
process: only the very process that was recorded (a reused pid is not ours), a dead replica
that was serving is restarted, a dead one that was leaving is forgotten, and new replicas
never reuse an adopted name."""

import signal
import subprocess
from pathlib import Path

from kvfleet_operator.api import load_pool
from kvfleet_operator.runtimes.local import procs
from kvfleet_operator.runtimes.local.replicas import (
    CRASHED,
    DRAINING,
    LocalRuntime,
    leftover_records,
    running_records,
)
from kvfleet_operator.runtimes.local.state_dir import StateDir

POOL = Path(__file__).parent / "pools" / "sim-restart-one.yaml"


class Events:
    def __init__(self) -> None:
        self.messages: list[str] = []

    def emit(self, event) -> None:
        self.messages.append(event.message)


def _sleeper(tmp_path: Path, name: str) -> subprocess.Popen:
    return procs.spawn(["sleep", "60"], tmp_path / f"{name}.log", outlive_parent=True)


def _dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def test_only_the_recorded_process_is_adopted(tmp_path):
    proc = _sleeper(tmp_path, "a")
    try:
        ticks = procs.start_ticks(proc.pid)
        assert ticks is not None
        adopted = procs.adopt(proc.pid, ticks)
        assert adopted is not None and adopted.poll() is None
        assert procs.adopt(proc.pid, ticks + 1) is None  # the pid, reused by another process
        assert procs.adopt(_dead_pid(), ticks) is None
        assert procs.adopt("123", ticks) is None and procs.adopt(proc.pid, None) is None
        proc.send_signal(signal.SIGKILL)
        assert adopted.wait(timeout=5) == procs.EXIT_UNKNOWN  # not our child: status unknown
    finally:
        procs.stop([proc], grace_s=1)


def test_adopt_keeps_the_living_restarts_the_dead_and_forgets_the_leaving(tmp_path):
    pool = load_pool(POOL)
    live, leaving = _sleeper(tmp_path, "live"), _sleeper(tmp_path, "leaving")
    stale = _sleeper(tmp_path, "stale")
    dead = _dead_pid()
    try:
        ticks, other = procs.start_ticks(live.pid), procs.start_ticks(leaving.pid)
        assert ticks is not None and other is not None
        records = [
            {"name": "router", "role": "router", "port": 40001, "pid": dead, "start_ticks": 1,
             "state": "ready", "num_restarts": 0},
            {"name": "unified-3", "role": "unified", "port": 40003, "pid": live.pid,
             "start_ticks": ticks, "state": "draining", "num_restarts": 2, "started_at": 5.0},
            {"name": "unified-1", "role": "unified", "port": 40004, "pid": dead,
             "start_ticks": ticks, "state": "ready", "num_restarts": 1},
            {"name": "unified-2", "role": "unified", "port": 40005, "pid": dead,
             "start_ticks": ticks, "state": "stopping"},
            {"name": "unified-5", "role": "unified", "port": 40006, "pid": leaving.pid,
             "start_ticks": other + 1000, "state": "draining"},  # its pid runs another process
            {"name": "prefill-0", "role": "prefill", "port": 40007, "pid": live.pid,
             "start_ticks": ticks, "state": "ready"},  # the pool has no such role any more
            {"name": "unified-7", "role": "unified", "port": 40008, "pid": stale.pid,
             "start_ticks": procs.start_ticks(stale.pid), "state": "ready"},  # not an engine
            {"name": "junk"},
        ]
        state = {"pool": pool.name, "is_stopped": False, "replicas": records}
        assert leftover_records({**state, "is_stopped": True}, pool.name) == []
        assert leftover_records(state, "another-pool") == []
        assert [r["name"] for r in running_records(leftover_records(state, pool.name))] == [
            "unified-3", "prefill-0", "unified-7"]

        events = Events()
        runtime = LocalRuntime(StateDir(tmp_path / "state"), events=events, clock=lambda: 100.0)
        router = runtime.adopt(records, pool.spec, lambda p: ["kvfleet", "router", str(p)])
        assert router is not None and router.state == CRASHED and router.restart_at == 100.0
        assert router.port == 40001 and router.is_port_fixed  # the endpoint users were given
        kept = runtime.children["unified-3"]
        assert (kept.pid, kept.state, kept.num_restarts, kept.started_at) == (
            live.pid, DRAINING, 2, 5.0)
        restarted = runtime.children["unified-1"]
        assert (restarted.state, restarted.restart_at, restarted.num_restarts) == (
            CRASHED, 100.0, 1)
        assert "40004" in restarted.argv_for(40004)  # the engine command, from the spec
        # A process whose command line is not what the pool asks for now (the pool was
        # edited while no loop ran; here a `sleep`) is adopted draining: the loop replaces it.
        assert runtime.children["unified-7"].state == DRAINING
        assert set(runtime.children) == {"router", "unified-3", "unified-1", "unified-7"}
        assert runtime._next_index["unified"] == 8  # a new replica never takes a kept name
        assert any(m.startswith("adopt unified-3") for m in events.messages)
    finally:
        procs.stop([live, leaving, stale], grace_s=1)


def test_a_router_whose_settings_changed_is_restarted_on_its_port(tmp_path):
    pool = load_pool(POOL)
    old = _sleeper(tmp_path, "old-router")
    try:
        records = [{"name": "router", "role": "router", "port": 40011, "pid": old.pid,
                    "start_ticks": procs.start_ticks(old.pid), "state": "ready"}]
        runtime = LocalRuntime(StateDir(tmp_path / "state"), events=Events(),
                               clock=lambda: 50.0)  # fmt: skip
        router = runtime.adopt(records, pool.spec, lambda p: ["kvfleet", "router", str(p)])
        assert router is not None and router.proc is None  # the old one is stopped
        assert (router.state, router.restart_at, router.port) == (CRASHED, 50.0, 40011)
        assert old.poll() is not None
    finally:
        procs.stop([old], grace_s=1)


async def test_a_spawned_child_is_recorded_before_any_tick_saves(tmp_path):
    # Killed right after a spawn, before the loop's save: the successor still finds it.
    pool = load_pool(POOL)
    state_dir = StateDir(tmp_path / "state")
    state_dir.create()
    first = LocalRuntime(state_dir, events=Events())
    child = first.add_replica("unified", lambda port: ["sleep", "60"])
    try:
        records = leftover_records(None, pool.name, state_dir.read_children())
        assert [(r["name"], r["pid"], r["port"]) for r in records] == [
            (child.name, child.pid, child.port)]
        second = LocalRuntime(state_dir, events=Events())
        second.adopt(records, pool.spec, lambda p: ["kvfleet", "router", str(p)])
        assert second.children[child.name].pid == child.pid  # adopted, not started again
        await first.shutdown(grace_s=1)  # a clean stop leaves nothing to adopt
        assert state_dir.read_children() == []
    finally:
        if child.proc is not None and child.proc.poll() is None:
            procs.stop([child.proc], grace_s=1)
