"""Start several `kvfleet engine` processes at once (their start-up overlaps), plus helpers
to read their Prometheus counters. Used by the router acceptance tests."""

from __future__ import annotations

import os
import re
import subprocess
import urllib.request

from helpers.procs import ProcessGroup, ServerProcess, free_port, kvfleet_argv, wait_healthy

ENGINE_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
TINY = ("--model", "tiny-random", "--num-blocks", "256", "--max-model-len", "512")
SIMULATED = ("--model", "tiny-random", "--runner", "simulated", "--profile", "h100-llama3-8b")


def start_engines(procs: ProcessGroup, argvs: list[tuple[str, ...]],
                  env: dict[str, str] | None = None) -> list[ServerProcess]:
    started = []
    procs.log_dir.mkdir(parents=True, exist_ok=True)
    for extra in argvs:
        port = free_port()
        argv = kvfleet_argv("engine", "--host", "127.0.0.1", "--port", str(port), *extra)
        log_path = procs.log_dir / f"engine-{len(procs.processes)}-{port}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**os.environ, **ENGINE_ENV, **(env or {})})
        server = ServerProcess(proc, port, log_path)
        procs.processes.append(server)
        started.append(server)
    for server in started:
        wait_healthy(server, timeout_s=180)
    return started


def metric_sum(url: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels` (0 when absent)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    pattern = re.compile(rf"^{re.escape(name)}(?:{{([^}}]*)}})? (\S+)$", re.M)
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(float(value) for found, value in pattern.findall(text)
               if all(w in found.split(",") for w in wanted))
