"""`kvfleet router --stop-delay-s S`: after SIGTERM the router answers /health with 503 and
keeps serving for S seconds before it closes its port, so a balancer's health check takes
it out before a connection can land on a closed port."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.error
import urllib.request

from helpers.procs import kvfleet_argv
from router_fixtures import endpoints_cfg, http_json, start_fake, write_config


def health_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_stopping_router_fails_health_and_still_serves_for_the_delay(procs, tmp_path):
    backend = start_fake(procs, "b0")
    cfg = write_config(tmp_path / "r.json", {"endpoints": endpoints_cfg([backend])})
    router = procs.start(kvfleet_argv("router", "--config", str(cfg), "--host", "127.0.0.1",
                                      "--port", "{port}", "--stop-delay-s", "1.5"),
                         timeout_s=30)
    assert health_status(router.url) == 200
    stopped_at = time.monotonic()
    router.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    assert health_status(router.url) == 503
    status, body = http_json(router.url + "/v1/completions",
                             {"model": "fake", "prompt": "still here", "max_tokens": 2})
    assert status == 200, body
    assert router.proc.wait(timeout=30) == 0
    assert time.monotonic() - stopped_at >= 1.5


def test_without_a_delay_the_port_closes_at_once(procs, tmp_path):
    backend = start_fake(procs, "b0")
    cfg = write_config(tmp_path / "r.json", {"endpoints": endpoints_cfg([backend])})
    router = procs.start(kvfleet_argv("router", "--config", str(cfg), "--host", "127.0.0.1",
                                      "--port", "{port}"), timeout_s=30)
    stopped_at = time.monotonic()
    router.proc.send_signal(signal.SIGTERM)
    assert router.proc.wait(timeout=30) == 0
    assert time.monotonic() - stopped_at < 1.5


def test_a_bad_stop_delay_is_one_line_and_exit_2(tmp_path):
    for value in ("-1", "301", "nan"):
        proc = subprocess.run(kvfleet_argv("router", "--stop-delay-s", value),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().count("\n") == 0 and "--stop-delay-s" in proc.stderr
