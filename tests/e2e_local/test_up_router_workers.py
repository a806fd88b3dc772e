"""`kvfleet up` honours `routing.workers`: its router is a supervisor of N worker processes on
one port, answers requests through any of them, and leaves none behind when it stops."""

import json
import signal
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _children_args(pid: int) -> list[list[str]]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                out.append(Path(f"/proc/{child}/cmdline").read_bytes().decode().split("\0"))
            except OSError:
                pass
    return out


def _router_pid(fleet) -> int:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().decode().split("\0")
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if "--workers" in args and "--worker-index" not in args and \
                fleet.marker.encode() in env:
            return int(entry.name)
    raise AssertionError("no router supervisor among the fleet's processes")


def test_up_runs_the_router_as_the_pools_workers(start_fleet):
    fleet = start_fleet("sim-workers.yaml")
    fleet.wait_ready("unified", 1, timeout_s=90)
    supervisor = _router_pid(fleet)
    args = _children_args(supervisor)
    assert sorted(a[a.index("--worker-index") + 1] for a in args if "--worker-index" in a) \
        == ["0", "1"], args
    deadline = time.monotonic() + 30
    while True:  # the endpoint is announced once the router can serve
        try:
            endpoint = fleet.endpoint
            break
        except KeyError:
            assert time.monotonic() < deadline, fleet.output()[-2000:]
            time.sleep(0.2)
    for i in range(6):  # a new connection each: the kernel spreads them over the workers
        body = json.dumps({"model": "llama3-8b", "prompt": f"hello {i} " * 20,
                           "max_tokens": 2}).encode()
        req = urllib.request.Request(f"{endpoint}/completions", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert json.loads(resp.read())["usage"]["completion_tokens"] == 2
    assert "routing.workers" not in fleet.output()  # not named as ignored
    assert fleet.stop(signal.SIGINT) == 0
    assert fleet.leftovers() == []
