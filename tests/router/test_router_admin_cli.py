"""Admin API auth and versioning, and the CLI's one-line errors, on real processes."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.request

from helpers.procs import kvfleet_argv
from router_fixtures import (
    ADMIN_TOKEN,
    admin_headers,
    endpoints_cfg,
    http_json,
    start_fake,
    start_router,
)


def stream_in_background(router_url: str, results: list[bytes]) -> threading.Thread:
    """One 15-token stream through the router on a thread; its bytes land in `results`."""

    def stream() -> None:
        req = urllib.request.Request(router_url + "/v1/completions", method="POST",
                                     data=b'{"prompt": "x", "max_tokens": 15, "stream": true}')
        with urllib.request.urlopen(req, timeout=30) as resp:
            results.append(resp.read())

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(0.5)  # the stream is under way (the fake sends a token every 100 ms)
    return t

def test_admin_requires_the_bearer_token(procs, tmp_path):
    router = start_router(procs, tmp_path, {"version": 3})
    url = router.url + "/admin/config"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN_TOKEN},
                    {"Authorization": f"Basic {ADMIN_TOKEN}"}):
        for method, body in (("GET", None), ("PUT", {"version": 9})):
            status, err = http_json(url, body, method=method, headers=headers)
            assert status == 401 and err["error"]["type"] == "authentication_error"
    assert http_json(router.url + "/admin/anything", headers={})[0] == 401
    status, got = http_json(url, headers=admin_headers())
    assert status == 200 and got["version"] == 3 and got["endpoints"] == []


def test_admin_versioning_validation_and_atomic_replace(procs, tmp_path):
    backends = [start_fake(procs, f"b{i}") for i in range(2)]
    router = start_router(procs, tmp_path, {"version": 1, "endpoints": endpoints_cfg(backends)})
    url, auth = router.url + "/admin/config", admin_headers()
    status, err = http_json(url, {"version": 2, "endpoints": [{"name": "x", "url": "nope"}]},
                            method="PUT", headers=auth)
    assert status == 400 and err["error"]["param"] == "endpoints[0].url"
    assert http_json(url, {"version": 1, "policy": {"name": "random"}}, method="PUT",
                     headers=auth)[0] == 409
    status, err = http_json(url, {"version": 0}, method="PUT", headers=auth)
    assert status == 409 and err["error"]["code"] == "stale_version"
    current = http_json(url, headers=auth)[1]["config"]
    assert http_json(url, current, method="PUT", headers=auth) == (
        200, {"version": 1, "applied": False})  # an identical re-push is a no-op
    new = {"version": 5, "endpoints": endpoints_cfg(backends[1:]), "policy": {"name": "random"}}
    assert http_json(url, new, method="POST", headers=auth)[1]["applied"] is True
    got = http_json(url, headers=auth)[1]
    assert got["version"] == 5 and [e["name"] for e in got["endpoints"]] == ["b0"]
    assert got["config"]["policy"]["name"] == "random"
    req = urllib.request.Request(url, data=b"{not json", method="PUT", headers=auth)
    try:
        urllib.request.urlopen(req)
    except urllib.error.HTTPError as exc:
        assert exc.code == 400
    metrics = urllib.request.urlopen(router.url + "/metrics").read().decode()
    assert "kvfleet_router_config_version 5.0" in metrics


def test_get_reports_in_flight_and_removed_endpoints_until_drained(procs, tmp_path):
    slow = start_fake(procs, "slow", "--token-delay-ms", "100")
    router = start_router(procs, tmp_path, {"version": 1, "endpoints": endpoints_cfg([slow])})
    url, auth = router.url + "/admin/config", admin_headers()
    results: list[bytes] = []
    t = stream_in_background(router.url, results)
    assert http_json(url, headers=auth)[1]["endpoints"][0]["num_in_flight"] == 1
    assert http_json(url, {"version": 2, "endpoints": []}, method="PUT", headers=auth)[0] == 200
    [gone] = http_json(url, headers=auth)[1]["endpoints"]
    assert gone["state"] == "removed" and gone["num_in_flight"] == 1
    t.join(30)
    assert results and results[0].count(b"slow:") == 15 and results[0].endswith(b"[DONE]\n\n")
    assert http_json(url, headers=auth)[1]["endpoints"] == []


def test_router_without_a_token_refuses_all_admin_calls(procs, tmp_path):
    cfg = tmp_path / "r.yaml"
    cfg.write_text("version: 1\n")
    router = procs.start(kvfleet_argv("router", "--config", str(cfg), "--port", "{port}"),
                         env={"KVFLEET_ADMIN_TOKEN": ""}, timeout_s=30)
    assert http_json(router.url + "/admin/config", headers={"Authorization": "Bearer "})[0] == 401


def test_env_token_works(procs, tmp_path):
    router = procs.start(kvfleet_argv("router", "--port", "{port}"),
                         env={"KVFLEET_ADMIN_TOKEN": "envtok"}, timeout_s=30)
    status, got = http_json(router.url + "/admin/config",
                            headers={"Authorization": "Bearer envtok"})
    assert status == 200 and got["version"] == 0


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvfleet_operator.cli.main", "router", *args],
                          capture_output=True, text=True, timeout=60)


def test_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("endpoints:\n  - {name: a, url: 'http://127.0.0.1:1', role: boss}\n")
    empty_token = tmp_path / "empty"
    empty_token.write_text("\n")
    cases = [
        (("--config", str(bad)), "endpoints[0].role"),
        (("--config", str(tmp_path / "missing.yaml")), "cannot read"),
        (("--admin-token-file", str(tmp_path / "none")), "admin token"),
        (("--admin-token-file", str(empty_token)), "empty"),
        (("--port", "70000"), "out of range"),
        (("--frobnicate",), "unrecognized"),
    ]
    for args, needle in cases:
        proc = run_cli(*args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_cli_port_in_use_is_one_line(procs, tmp_path):
    backend = start_fake(procs, "b0")
    proc = run_cli("--port", str(backend.port))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("kvfleet router:")]
    assert len(errors) == 1 and "cannot listen" in errors[0]


def test_sigterm_lets_running_streams_finish_then_exits_zero(procs, tmp_path):
    import signal

    slow = start_fake(procs, "slow", "--token-delay-ms", "100")
    router = start_router(procs, tmp_path, {"endpoints": endpoints_cfg([slow])})
    results: list[bytes] = []
    t = stream_in_background(router.url, results)
    router.signal(signal.SIGTERM)
    t.join(30)
    assert results and results[0].count(b"slow:") == 15 and results[0].endswith(b"[DONE]\n\n")
    assert router.wait(30) == 0


def test_a_standalone_router_says_where_it_listens(procs, tmp_path):
    backend = start_fake(procs, "b0")
    router = start_router(procs, tmp_path, {"endpoints": endpoints_cfg([backend])})
    line = next(ln for ln in router.log_text().splitlines() if "listening on" in ln)
    assert f"kvfleet router listening on http://127.0.0.1:{router.port}" in line
    assert "1 endpoint(s)" in line and "admin API behind a bearer token" in line
