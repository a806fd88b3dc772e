"""`kvfleet router --epp-*` flags: a bad one is one line and exit code 2; a port in use
is one line and exit code 1."""

from __future__ import annotations

import socket
import subprocess

import pytest
from helpers.procs import free_port, kvfleet_argv


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(kvfleet_argv("router", *argv), capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("argv, message", [
    (("--epp-port", "0"), "--epp-port 0 is out of range"),
    (("--epp-cert-file", "c.pem"), "--epp-cert-file needs --epp-port"),
    (("--epp-port", "9002", "--epp-cert-file", "c.pem"),
     "--epp-cert-file and --epp-key-file go together"),
    (("--epp-port", "9002", "--epp-insecure", "--epp-cert-file", "c", "--epp-key-file", "k"),
     "--epp-insecure and --epp-cert-file exclude each other"),
    (("--epp-port", "9002", "--epp-fallbacks", "9"), "--epp-fallbacks must be in [0, 8]"),
])
def test_bad_epp_flags_are_one_line_and_exit_2(argv, message):
    done = run(*argv)
    assert done.returncode == 2
    assert done.stderr.strip() == f"kvfleet router: {message}"


def test_an_epp_port_in_use_is_one_line_and_exit_1():
    pytest.importorskip("grpc", reason="the epp extra (grpcio) is not installed")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run("--port", str(free_port()), "--epp-port", str(port), "--epp-insecure")
    assert done.returncode == 1
    assert f"kvfleet router: cannot listen on 127.0.0.1:{port} (endpoint picker)" in \
        done.stderr.splitlines()
