"""`kvfleet router --workers N` (workers.py) as real processes: one supervisor, N workers on
one port.

Each worker also serves on its private loopback port, which the supervisor logs at INFO
("worker i: pid P, private URL"); the tests reach a given worker there. Fake backends name
themselves in their answers, so where a request went is read from its text.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from helpers.procs import ProcessGroup, ServerProcess, http_status, kvfleet_argv
from kvfleet_router.exchange import decode_chain
from router_fixtures import (
    ADMIN_TOKEN,
    admin_headers,
    endpoints_cfg,
    http_json,
    sse_post,
    sse_text,
    start_fake,
    start_router,
    write_config,
)

WORKER_LINE = re.compile(r"worker (\d+): pid (\d+), private (http://\S+)")
RESTART_LINE = re.compile(r"worker (\d+) restarted: pid (\d+)")


def start_workers(procs: ProcessGroup, tmp_path: Path, cfg: dict[str, Any],
                  n: int = 2) -> ServerProcess:
    cfg_path = write_config(tmp_path / f"router-{len(procs.processes)}.json", cfg)
    token = tmp_path / "admin-token"
    token.write_text(ADMIN_TOKEN + "\n")
    return procs.start(kvfleet_argv("router", "--config", str(cfg_path), "--port", "{port}",
                                    "--admin-token-file", str(token), "--workers", str(n),
                                    "--log-level", "info"), timeout_s=60)


def workers_of(router: ServerProcess, n: int = 2) -> list[tuple[int, str]]:
    """(pid, private URL) of each worker, by index, as the supervisor logged them at start;
    waits for the pod's listening line (the supervisor saw every worker up: a worker that
    dies before that fails the pod's start, not restarted)."""
    found: dict[int, tuple[int, str]] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        log = router.log_text()
        found = {int(m[1]): (int(m[2]), m[3]) for m in WORKER_LINE.finditer(log)}
        if len(found) == n and "kvfleet router listening on" in log:
            assert all(http_status(url + "/health") == 200 for _, url in found.values())
            return [found[i] for i in range(n)]
        time.sleep(0.1)
    raise AssertionError(f"workers not up: {found}\n{router.log_text()}")


def is_gone(pid: int) -> bool:
    """No such process, or a zombie nobody reaped yet (it serves nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_for(what: str, check: Any, timeout_s: float = 20) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def routed(url: str) -> float:
    """kvfleet_router_requests_total summed over endpoints, as this worker counts it."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("kvfleet_router_requests_total{"))


def served_by(url: str, text: str) -> str:
    status, body = http_json(url + "/v1/completions",
                             {"model": "fake", "prompt": text, "max_tokens": 4})
    assert status == 200, body
    return str(body["choices"][0]["text"].split(":", 1)[0].strip())


def config_version(url: str) -> int:
    status, body = http_json(url + "/admin/config", headers=admin_headers())
    assert status == 200, body
    return int(body["version"])


def index_of(url: str) -> dict[str, set[int]]:
    """A worker's approximate prefix index: block hashes per endpoint (its snapshot)."""
    status, snap = http_json(url + "/admin/exchange/snapshot", headers=admin_headers())
    assert status == 200, snap
    return {name: set(decode_chain(text)) for name, text in snap["index"].items()}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(kvfleet_argv("router", *args), capture_output=True, text=True,
                          timeout=60)


# --- the pod: one port, N processes ---

def test_two_workers_share_the_port_and_the_pod_says_so_once(procs, tmp_path):
    backend = start_fake(procs, "b0")
    router = start_workers(procs, tmp_path, {"endpoints": endpoints_cfg([backend])})
    workers = workers_of(router)
    assert len({pid for pid, _ in workers} | {router.pid}) == 3
    num_requests = 40
    for i in range(num_requests):  # urllib: a new connection each, as new clients come
        assert served_by(router.url, f"hello {i}") == "b0"
    per_worker = [routed(url) for _, url in workers]
    # the kernel hashes each connection to one worker: 40 never all land on one (2^-39)
    assert sum(per_worker) == num_requests and all(n > 0 for n in per_worker), per_worker
    lines = [ln for ln in router.log_text().splitlines() if "listening on" in ln]
    assert len(lines) == 1 and f"http://127.0.0.1:{router.port} (2 workers, " in lines[0]


def test_a_config_push_reaches_every_worker(procs, tmp_path):
    b0, b1 = start_fake(procs, "b0"), start_fake(procs, "b1")
    router = start_workers(procs, tmp_path, {"version": 1, "endpoints": endpoints_cfg([b0])})
    workers = workers_of(router)
    pushed = {"version": 2, "endpoints": endpoints_cfg([b0, b1])}
    status, body = http_json(router.url + "/admin/config", pushed, method="PUT",
                             headers=admin_headers())
    assert status == 200 and body["version"] == 2, body
    # the worker that took the push relayed it before answering: every one has it now
    assert [config_version(url) for _, url in workers] == [2, 2]
    # an unauthenticated push goes nowhere
    status, _ = http_json(router.url + "/admin/config", {"version": 3}, method="PUT")
    assert status == 401 and [config_version(url) for _, url in workers] == [2, 2]


def test_sigterm_drains_every_worker_then_exits_zero(procs, tmp_path):
    slow = start_fake(procs, "slow", "--token-delay-ms", "100", "--num-tokens", "15")
    router = start_workers(procs, tmp_path, {"endpoints": endpoints_cfg([slow])})
    pids = [pid for pid, _ in workers_of(router)]
    events: list[Any] = []
    started = threading.Event()

    def stream() -> None:
        events.extend(sse_post(router.url, "/v1/completions",
                               {"model": "fake", "prompt": "x", "max_tokens": 15,
                                "stream": True}, on_event=lambda n: started.set()))

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    assert started.wait(10)
    router.signal(signal.SIGTERM)
    t.join(30)
    # the stream that was running when the pod was told to stop finished whole
    assert sse_text(events, is_chat=False).count("slow:") == 15 and events[-1] == "[DONE]"
    assert router.wait(40) == 0
    assert all(is_gone(pid) for pid in pids)


def test_a_repeated_stop_signal_does_not_kill_the_exit(procs, tmp_path):
    """Ctrl-C reaches the workers and their supervisor, which forwards it: a worker gets
    two. The second, arriving while it shuts down, must not turn exit 0 into death by
    signal (it did, in the last milliseconds, once the loop's handlers were gone)."""
    router = start_router(procs, tmp_path, {})
    router.signal(signal.SIGINT)
    time.sleep(0.01)
    router.signal(signal.SIGINT)
    assert router.wait(30) == 0


def test_a_dead_worker_is_restarted_and_catches_up_on_config_and_prefixes(procs, tmp_path):
    backend = start_fake(procs, "b0")
    router = start_workers(procs, tmp_path, {"version": 1, "endpoints": endpoints_cfg([backend])})
    (pid0, url0), (_, url1) = workers_of(router)
    # worker 1 alone gets version 5 (the relay header: it does not pass it on), as if
    # worker 0 had been down during the operator's push
    status, body = http_json(url1 + "/admin/config",
                             {"version": 5, "endpoints": endpoints_cfg([backend])},
                             method="PUT", headers={**admin_headers(), "X-Kvfleet-Relayed": "1"})
    assert status == 200 and config_version(url0) == 1, body
    assert served_by(url1, "a conversation " * 20) == "b0"
    recorded = index_of(url1)["b0"]
    os.kill(pid0, signal.SIGKILL)
    new = wait_for("the restart", lambda: RESTART_LINE.search(router.log_text()))
    assert new[1] == "0" and int(new[2]) != pid0
    assert f"worker 0 (pid {pid0}) exited with signal SIGKILL" in router.log_text()
    wait_for("worker 0 back", lambda: http_status(url0 + "/health") == 200)
    assert config_version(url0) == 5  # took its sibling's newer config before serving
    # and warmed its prefix index from its sibling's snapshot (exchange.warm)
    wait_for("worker 0 to warm", lambda: recorded <= index_of(url0).get("b0", set()),
             timeout_s=10)
    assert served_by(router.url, "still serving") == "b0"
    assert router.is_running()


def test_workers_stop_when_the_supervisor_is_killed(procs, tmp_path):
    router = start_workers(procs, tmp_path, {})
    pids = [pid for pid, _ in workers_of(router)]
    os.kill(router.pid, signal.SIGKILL)  # the supervisor alone, not its process group
    router.wait(10)
    wait_for("orphaned workers to exit", lambda: all(is_gone(pid) for pid in pids))


# --- the exchange between workers ---

def test_a_prompt_placed_by_one_worker_is_placed_alike_by_the_other(procs, tmp_path):
    backends = [start_fake(procs, f"b{i}") for i in range(2)]
    # exchange.enabled stays false: a pod's workers exchange whatever the config says
    router = start_workers(procs, tmp_path, {"endpoints": endpoints_cfg(backends)})
    (_, url_a), (_, url_b) = workers_of(router)
    # ties are broken at random, so both get some: all 24 on one backend has odds 2^-23
    # (with 8, odds 2^-7, it failed a clean-clone CI run of 603f965)
    prompts = [f"conversation {i:03d}: " + f"turn text {i} " * 40 for i in range(24)]
    placed = [served_by(url_a, p) for p in prompts]
    assert set(placed) == {"b0", "b1"}

    recorded = index_of(url_a)
    assert set(recorded) == {"b0", "b1"}

    def b_knows_them() -> bool:
        known = index_of(url_b)
        return all(blocks <= known.get(name, set()) for name, blocks in recorded.items())

    wait_for("worker B to hear of A's prefixes", b_knows_them, timeout_s=10)
    # without the exchange B would break each tie anew: all 24 alike has odds 2^-24
    assert [served_by(url_b, p) for p in prompts] == placed


def test_without_a_token_workers_route_alone_and_say_so(procs):
    router = procs.start(kvfleet_argv("router", "--port", "{port}", "--workers", "2",
                                      "--log-level", "info"),
                         env={"KVFLEET_ADMIN_TOKEN": ""}, timeout_s=60)
    workers = workers_of(router)
    assert "no admin token configured: /admin answers 401; the workers cannot share state" \
        in router.log_text()
    time.sleep(0.5)  # five push intervals: pushes without the token would all be refused
    for _, url in workers:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert 'kvfleet_router_exchange_pushes_total{outcome="error"} 0.0' in text
        assert 'kvfleet_router_exchange_pushes_total{outcome="refused"} 0.0' in text


# --- flags ---

@pytest.mark.parametrize(("args", "needle"), [
    (("--workers", "0"), "--workers 0: must be 1..64"),
    (("--workers", "65"), "--workers 65: must be 1..64"),
    (("--workers", "two"), "invalid int value"),
    (("--workers", "2", "--epp-port", "9002", "--epp-insecure"), "--workers 1"),
    (("--exchange-listen", "nowhere"), "expected host:port"),
    (("--worker-index", "-1"), "--worker-index -1: must be 0..63"),
])
def test_bad_worker_flags_are_one_line_and_exit_2(args, needle):
    proc = run_cli(*args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr


def test_no_so_reuseport_is_one_line_and_exit_2(monkeypatch, capsys):
    from kvfleet_router import cli

    monkeypatch.setattr(sys, "platform", "darwin")
    assert cli.main(["--workers", "2", "--port", "1"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "SO_REUSEPORT" in lines[0] and "darwin" in lines[0]


def test_a_taken_port_is_one_line_and_exit_1(procs):
    backend = start_fake(procs, "b0")
    proc = run_cli("--workers", "2", "--port", str(backend.port))
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("kvfleet router:")]
    assert proc.returncode == 1 and len(errors) == 1 and "cannot listen" in errors[0]
    assert "Traceback" not in proc.stderr


def test_the_group_variable_is_the_one_the_exchange_reads():
    from kvfleet_router import exchange, workers

    assert workers.GROUP_ENV == exchange.GROUP_ENV


# --- the supervisor's restart schedule, without processes ---

class _DeadOnCue:
    """A stand-in for a worker's Popen: running until the test says it exited."""
    pids = iter(range(10_000, 20_000))

    def __init__(self, argv: list[str], **_: Any) -> None:
        self.pid = next(self.pids)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


def test_restarts_back_off_on_quick_deaths_and_reset_after_a_long_life(monkeypatch):
    from kvfleet_router import workers

    monkeypatch.setattr(workers.subprocess, "Popen", _DeadOnCue)
    now = [1000.0]
    sup = workers.Supervisor(["router"], 1, clock=lambda: now[0])
    w = sup.workers[0]
    w.start(sup.env, now[0])

    def die_after(lived_s: float) -> float:
        """Let the worker live `lived_s`, die; the delay before the supervisor restarts it."""
        now[0] += lived_s
        first = w.proc
        first.returncode = 1  # type: ignore[union-attr]
        sup._tend()
        delay = w.restart_at - now[0]  # type: ignore[operator]
        now[0] += delay - 0.01
        sup._tend()
        assert w.proc is first  # not yet
        now[0] += 0.01
        sup._tend()
        assert w.proc is not first and w.proc.poll() is None  # type: ignore[union-attr]
        return round(delay, 3)

    assert [die_after(1.0) for _ in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    # a long life forgives: that death and the next quick one count as firsts again
    assert [die_after(workers.RESTART_RESET_AFTER_S), die_after(1.0), die_after(1.0)] == \
        [0.5, 0.5, 1]
