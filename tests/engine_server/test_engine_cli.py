"""`kvfleet engine` flags: bad ones end with one line on stderr and a non-zero exit."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest
from engine_fixtures import ENGINE_ENV, engine_argv
from kvfleet_engine import cli


@pytest.mark.parametrize("argv, fragment", [
    (["--runner", "gpu"], "invalid choice"),
    (["--role", "both"], "invalid choice"),
    (["--port", "abc"], "invalid int value"),
    (["--frobnicate"], "unrecognized arguments"),
    (["--model", "tiny-random", "--port", "70000"], "--port"),
    (["--runner", "torch"], "--model is required"),
    (["--model", "no-such-model"], "unknown model"),
    (["--model", "tiny-random", "--num-blocks", "1"], "--num-blocks"),
    (["--model", "tiny-random", "--max-num-seqs", "0"], "--max-num-seqs"),
    (["--model", "tiny-random", "--num-blocks", "8", "--max-model-len", "4096"], "max_model_len"),
    (["--model", "tiny-random", "--drain-timeout", "-1"], "--drain-timeout"),
    (["--model", "tiny-random", "--kv-handle-ttl", "0"], "--kv-handle-ttl"),
    (["--model", "tiny-random", "--profile", "cpu-tiny"], "--profile only applies"),
    (["--runner", "simulated"], "needs --profile"),
    (["--runner", "simulated", "--profile", "no-such-profile"], "unknown cost profile"),
    (["--model", "tiny-random", "--dtype", "int3"], "unknown dtype"),
    (["--model", "tiny-random", "--body-read-timeout", "0"], "--body-read-timeout"),
    (["--model", "tiny-random", "--body-read-timeout", "nan"], "--body-read-timeout"),
    (["--model", "tiny-random", "--body-read-timeout", "inf"], "--body-read-timeout"),
    (["--model", "tiny-random", "--max-uploads-per-client", "0"], "--max-uploads-per-client"),
])
def test_bad_flags_are_one_line_errors(capsys, argv, fragment):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvfleet engine: ")
    assert fragment in err[0]


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    assert "--drain-timeout" in capsys.readouterr().out


def test_taken_port_is_a_one_line_error_without_traceback():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        argv = [a.replace("{port}", str(port))
                for a in engine_argv("--runner", "simulated", "--profile", "cpu-tiny")]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                              env={**os.environ, **ENGINE_ENV})
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot serve on 127.0.0.1:" in lines[0]
