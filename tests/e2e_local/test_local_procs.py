"""Process supervision basics: children die with their parent, stop() reaps everything."""

import os
import signal
import subprocess
import sys
import time

import pytest
from kvfleet_operator.runtimes.local import procs
from kvfleet_operator.runtimes.local.backoff import Backoff

PARENT = """
import sys, pathlib
from kvfleet_operator.runtimes.local import procs
child = procs.spawn(["sleep", "60"], pathlib.Path(sys.argv[1]))
print(child.pid, flush=True)
sys.stdin.read()
"""


def _wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not procs.is_pid_alive(pid) or _is_zombie(pid):
            return True
        time.sleep(0.05)
    return False


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_child_dies_when_parent_is_sigkilled(tmp_path):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "child.log")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        child_pid = int(parent.stdout.readline())
        assert procs.is_pid_alive(child_pid)
        parent.kill()
        parent.wait()
        assert _wait_gone(child_pid), "child outlived its SIGKILLed parent"
    finally:
        parent.kill()


def test_stop_escalates_to_sigkill_and_reaps(tmp_path):
    stubborn = procs.spawn(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
         "print('up', flush=True); time.sleep(60)"],
        tmp_path / "stubborn.log",
    )
    polite = procs.spawn(["sleep", "60"], tmp_path / "polite.log")
    deadline = time.monotonic() + 10
    while b"up" not in (tmp_path / "stubborn.log").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    procs.stop([stubborn, polite], grace_s=0.5)
    assert time.monotonic() - started < 5
    assert polite.returncode == -signal.SIGTERM
    assert stubborn.returncode == -signal.SIGKILL


def test_children_lead_their_own_session(tmp_path):
    child = procs.spawn(["sleep", "60"], tmp_path / "c.log")
    try:
        assert os.getpgid(child.pid) == child.pid != os.getpgid(0)
    finally:
        procs.stop([child], grace_s=1)


def test_free_port_is_bindable_and_below_the_ephemeral_range():
    import socket

    for _ in range(20):
        port = procs.free_port()
        assert procs.PORT_FLOOR <= port < procs.ephemeral_floor()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_free_port_passes_over_a_port_someone_holds(monkeypatch):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        picks = iter([taken, taken + 1 if taken < 65535 else taken - 1])
        monkeypatch.setattr(procs._pick, "randrange", lambda *_: next(picks))
        assert procs.free_port() != taken


def test_free_port_asks_the_kernel_where_the_range_below_is_too_small(monkeypatch):
    monkeypatch.setattr(procs, "ephemeral_floor", lambda: procs.PORT_FLOOR + 10)
    monkeypatch.setattr(procs._pick, "randrange", lambda *_: pytest.fail("picked at random"))
    assert procs.free_port() >= procs.PORT_FLOOR + 10  # the kernel's bind(0) range


def test_backoff_doubles_caps_and_resets():
    backoff = Backoff(base_s=0.5, max_s=4.0, reset_after_s=60)
    assert [backoff.delay(n) for n in (1, 2, 3, 4, 5, 9)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.recent_crashes(3, uptime_s=1.0) == 4
    assert backoff.recent_crashes(3, uptime_s=61.0) == 1


def test_backoff_rejects_bad_config():
    import pytest

    with pytest.raises(ValueError):
        Backoff(base_s=0)
    with pytest.raises(ValueError):
        Backoff(base_s=2, max_s=1)
