"""LocalRuntime supervision with real, tiny child processes (no engines): readiness by
/health, crash -> backoff -> restart on the same port, a stuck starter is killed, stop()."""

import asyncio
import sys

from kvfleet_operator.loop.events import EventReason
from kvfleet_operator.runtimes.local.backoff import Backoff
from kvfleet_operator.runtimes.local.replicas import LocalRuntime
from kvfleet_operator.runtimes.local.state_dir import StateDir

HEALTH_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _health_server(port):
    return [sys.executable, "-c", HEALTH_SERVER, str(port)]


class Recorder:
    def __init__(self):
        self.events = []

    def emit(self, event):
        self.events.append(event)

    def messages(self):
        return [e.message for e in self.events]


async def _until(runtime, predicate, timeout_s=20.0):
    for _ in range(int(timeout_s / 0.05)):
        await runtime.supervise()
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return False


def test_ready_on_health_then_crash_restarts_on_the_same_port(tmp_path):
    recorder = Recorder()

    async def scenario():
        sd = StateDir(tmp_path)
        sd.create()
        backoff = Backoff(base_s=0.2, max_s=1.0)
        async with LocalRuntime(sd, backoff=backoff, events=recorder) as rt:
            child = rt.add_replica("unified", _health_server)
            assert child.state == "starting"
            assert await rt.wait_ready(child.name, 20)
            port, pid = child.port, child.pid
            child.proc.kill()
            assert await _until(rt, lambda: child.state == "failed")
            assert child.last_exit_code == -9 and child.restart_at is not None
            assert await _until(rt, lambda: child.state == "ready")
            assert child.num_restarts == 1 and child.port == port and child.pid != pid
            status = rt.status()[0]
            assert status["num_restarts"] == 1 and status["last_exit_code"] == -9
            await rt.delete(child.name, grace_s=30.0)
            assert await _until(rt, lambda: child.name not in rt.children)
        return port

    asyncio.run(scenario())
    events = recorder.messages()
    assert any("exited with -9; restart in 0.2s" in e for e in events), events
    assert any(e.startswith("stopped unified-0") for e in events), events
    crashed = [e for e in recorder.events if e.reason == EventReason.REPLICA_CRASHED]
    assert crashed and crashed[0].type == "Warning"


def test_a_deleted_replica_that_ignores_sigterm_is_killed_after_its_grace(tmp_path):
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"

    async def scenario():
        sd = StateDir(tmp_path)
        sd.create()
        async with LocalRuntime(sd) as rt:
            child = rt.add_replica("unified", lambda port: [sys.executable, "-c", stubborn])
            await asyncio.sleep(0.5)  # let it install its handler
            await rt.delete(child.name, grace_s=0.5)
            assert await _until(rt, lambda: child.name not in rt.children, timeout_s=10)
            return child.last_exit_code

    assert asyncio.run(scenario()) == -9


def test_crash_loop_backs_off_exponentially(tmp_path):
    delays = []

    async def scenario():
        sd = StateDir(tmp_path)
        sd.create()
        async with LocalRuntime(sd, backoff=Backoff(base_s=0.1, max_s=0.4)) as rt:
            child = rt.add_replica("unified", lambda port: [sys.executable, "-c", "exit(3)"])
            while len(delays) < 4:
                await rt.supervise()
                if child.state == "failed" and (not delays or delays[-1][0] != child.num_restarts):
                    delays.append((child.num_restarts, round(child.restart_at - rt.clock(), 1)))
                await asyncio.sleep(0.02)
            assert child.last_exit_code == 3

    asyncio.run(scenario())
    assert [d for _, d in delays] == [0.1, 0.2, 0.4, 0.4]


def test_a_starter_that_never_gets_healthy_is_killed_and_retried(tmp_path):
    recorder = Recorder()

    async def scenario():
        sd = StateDir(tmp_path)
        sd.create()
        async with LocalRuntime(sd, backoff=Backoff(base_s=5.0), startup_timeout_s=0.5,
                                events=recorder) as rt:
            child = rt.add_replica("unified", lambda port: ["sleep", "60"])
            assert await _until(rt, lambda: child.state == "failed", timeout_s=10)
            assert child.last_exit_code == -9

    asyncio.run(scenario())
    assert "unified-0 not healthy after 0.5s; killing it" in recorder.messages()


def test_shutdown_stops_everything(tmp_path):
    async def scenario():
        sd = StateDir(tmp_path)
        sd.create()
        rt = LocalRuntime(sd)
        async with rt:
            procs = [rt.add_replica("decode", lambda port: ["sleep", "60"]).proc for _ in range(3)]
        return procs

    procs = asyncio.run(scenario())
    assert all(p.returncode is not None for p in procs)
