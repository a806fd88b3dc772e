"""State dir: the admin token is private and fresh, state writes are atomic, status reads them."""

import os
import stat

from kvfleet_operator.cli import status_cmd
from kvfleet_operator.runtimes.local.state_dir import StateDir, default_state_dir


def test_admin_token_is_0600_and_new_per_fleet(tmp_path):
    sd = StateDir(tmp_path / "pool")
    sd.create()
    first = sd.new_admin_token()
    assert stat.S_IMODE(os.stat(sd.token_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(sd.path).st_mode) == 0o700
    assert sd.read_admin_token() == first and len(first) >= 32
    assert sd.new_admin_token() != first


def test_state_roundtrip_and_garbage(tmp_path):
    sd = StateDir(tmp_path)
    assert sd.read_state() is None
    sd.write_state({"pool": "p", "replicas": []})
    assert sd.read_state() == {"pool": "p", "replicas": []}
    sd.state_file.write_text("{not json")
    assert sd.read_state() is None


def test_default_state_dir_is_under_dot_kvfleet(tmp_path):
    assert default_state_dir("demo", tmp_path) == tmp_path / ".kvfleet" / "demo"


def _state(pid):
    return {
        "pool": "demo",
        "pid": pid,
        "endpoint": "http://127.0.0.1:1234/v1",
        "updated_at": 0,
        "desired": {"unified": 2},
        "router": {"config_version": 3},
        "signals": {"unified": {"num_waiting": 4, "kv_usage_mean": 0.5}},
        "replicas": [
            {"name": "router", "role": "router", "state": "ready",
             "address": "http://127.0.0.1:1234", "num_restarts": 0},
            {"name": "unified-0", "role": "unified", "state": "ready",
             "address": "http://127.0.0.1:1235", "num_restarts": 2, "last_exit_code": -9},
            {"name": "unified-1", "role": "unified", "state": "starting",
             "address": "http://127.0.0.1:1236", "num_restarts": 0},
        ],
        "events": [{"time": "10:00:00", "message": "scale unified 1 -> 2: waiting"}],
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "ReplicasNotReady"},
                {"type": "Degraded", "status": "False", "reason": "AsExpected"},
            ],
            "roles": {"unified": {"lastScaleDecision": {
                "time": "2026-01-01T10:00:00Z", "message": "scale up 1->2: waiting 5.0 / 2"}}},
        },
    }


def test_status_shows_replicas_signals_and_events(tmp_path, capsys, monkeypatch):
    sd = StateDir(tmp_path / ".kvfleet" / "demo")
    sd.create()
    sd.write_state(_state(os.getpid()))
    monkeypatch.chdir(tmp_path)
    assert status_cmd.main([]) == 0
    out = capsys.readouterr().out
    assert "running, pid" in out
    assert "unified 1/2 (1 not ready) [waiting 4, kv 0.50]" in out
    assert "unified-0" in out and "-9" in out
    assert "scale unified 1 -> 2" in out
    assert "Ready=False (ReplicasNotReady), Degraded=False (AsExpected)" in out
    assert "last unified decision at 2026-01-01T10:00:00Z: scale up 1->2" in out


def test_status_of_a_stopped_fleet(tmp_path, capsys):
    sd = StateDir(tmp_path)
    sd.write_state(_state(2**22 + 12345))
    assert status_cmd.main(["--state-dir", str(tmp_path)]) == 0
    assert "up        stopped" in capsys.readouterr().out


def test_status_without_fleet_is_one_line_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert status_cmd.main([]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no local fleet" in err[0]
    assert status_cmd.main(["--state-dir", str(tmp_path / "nope")]) == 1
    assert "no fleet state" in capsys.readouterr().err


def test_status_finds_a_running_fleet_from_any_directory(tmp_path, capsys, monkeypatch):
    from kvfleet_operator.runtimes.local import fleet_registry
    sd = StateDir(tmp_path / "somewhere" / "demo")
    sd.create()
    sd.write_state({**_state(os.getpid()), "state_dir": str(sd.path)})
    fleet_registry.register("demo", sd.path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert status_cmd.main([]) == 0
    assert f"state     {sd.path}" in capsys.readouterr().out
    assert status_cmd.main(["demo"]) == 0
    assert status_cmd.main(["other"]) == 1
    assert "no local fleet named 'other'" in capsys.readouterr().err


def test_a_stopped_fleet_says_stopped_and_not_ready(tmp_path, capsys):
    sd = StateDir(tmp_path)
    state = _state(os.getpid())
    state["status"]["conditions"][0] = {"type": "Ready", "status": "True",
                                        "reason": "AllReplicasReady"}  # fmt: skip
    sd.write_state({**state, "pid": 2**22 + 12345})  # its `up` is gone (killed)
    assert status_cmd.main(["--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "stopped (its `kvfleet up` is gone)" in out
    status_line = next(line for line in out.splitlines() if line.startswith("status"))
    assert status_line.startswith("status    stopped; when it last ran: Ready=True")
    assert "unified-0" not in out  # its replicas died with it
    assert "(not serving)" in out


def test_draining_replicas_are_shown_as_draining(tmp_path, capsys):
    sd = StateDir(tmp_path)
    state = _state(os.getpid())
    state["replicas"][2]["state"] = "draining"
    state["desired"] = {"unified": 1}
    sd.write_state(state)
    assert status_cmd.main(["--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "unified 1/1 (1 draining) [" in out and "not ready" not in out
