"""The processes of bench/flow_control.py: kvfleet engines with the simulated runner on a slow
cost profile (so one or two replicas saturate at a few requests per second), a kvfleet
router in front of them with a flow-control config, and `kvfleet up` for the waiting room.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from kvfleet_bench import procs, routers

MODEL = "flow-sim"


@dataclass(frozen=True, slots=True)
class EngineShape:
    """The pool: replicas of the simulated runner whose every step costs `step_ms` plus
    `prefill_us_per_token` per prompt token it computes."""

    num_engines: int = 1
    max_num_seqs: int = 4
    step_ms: float = 20.0
    prefill_us_per_token: float = 50.0

    def profile(self) -> dict[str, Any]:
        return {
            "name": "flow-bench-slow", "overhead_s": self.step_ms / 1000, "floor_s": 0.0,
            "prefill_s_per_token": self.prefill_us_per_token / 1e6, "decode_s_per_seq": 0.0,
            "s_per_kv_token": 0.0, "num_gpu_blocks": 4096, "block_size": 16,
            "vocab_size": 32000,
            "source": "bench/flow_control.py: a made-up slow step so a pool saturates at a "
                      "few requests per second on a CPU",
        }


def start_engines(shape: EngineShape, workdir: Path, cpus: str | None
                  ) -> tuple[list[subprocess.Popen], list[str]]:
    profile = workdir / "flow-profile.json"
    profile.write_text(json.dumps(shape.profile()))
    started: list[subprocess.Popen] = []
    urls = []
    try:
        for i in range(shape.num_engines):
            port = procs.free_port()
            cmd = [*_kvfleet(), "engine", "--runner", "simulated", "--profile", str(profile),
                   "--model", "llama3-8b-sim", "--served-model-name", MODEL,
                   "--host", procs.HOST, "--port", str(port),
                   "--max-num-seqs", str(shape.max_num_seqs), "--log-level", "warning"]
            proc = procs.start(cmd, workdir / f"engine-{i}.log", cpus)
            started.append(proc)
            url = f"http://{procs.HOST}:{port}"
            procs.wait_until(partial(procs.http_get, f"{url}/health"), proc, f"engine {i}", 60)
            urls.append(url)
    except BaseException:
        for proc in started:
            procs.stop(proc)
        raise
    return started, urls


def _kvfleet() -> list[str]:
    return [str(routers.KVFLEET_BIN)]


def start_router(urls: list[str], workdir: Path, cpus: str | None, capacity: int,
                 sections: dict[str, dict]) -> routers.RouterProcess:
    """A kvfleet router over `urls`, each endpoint holding at most `capacity` requests
    in flight (beyond that, flow control queues), with `sections` merged into its config."""
    return routers.launch_kvfleet("least-request", urls, workdir, cpus,
                                  endpoint={"capacity": capacity, "engine": "builtin",
                                            "models": [MODEL]},
                                  sections=sections)


def reset_engines(urls: list[str], timeout_s: float = 30.0) -> None:
    """Wait until no engine has a request running or waiting (a stopped router's aborted
    streams are freed), so one run does not start on the last one's leftovers."""
    deadline = time.monotonic() + timeout_s
    for url in urls:
        while time.monotonic() < deadline:
            text = procs.http_get(f"{url}/metrics").decode()
            busy = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith(("vllm:num_requests_running",
                                           "vllm:num_requests_waiting")))
            if busy == 0:
                break
            time.sleep(0.1)


# --- the waiting room: `kvfleet up`, and a request sent the moment the port opens ---

POOL_YAML = """\
apiVersion: kvfleet.io/v1alpha1
kind: InferencePool
metadata:
  name: flow-waiting-room
spec:
  model:
    name: meta-llama/Meta-Llama-3-8B-Instruct
    source: builtin://llama3-8b-sim
    servedModelName: {model}
  engine:
    kind: builtin
    runner: simulated
    profile: h100-llama3-8b
    maxNumSeqs: 8
  topology:
    unified:
      replicas:
        min: 1
        max: 1
"""


def _is_port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.05)
        return sock.connect_ex((procs.HOST, port)) == 0


def first_request_at_port_open(workdir: Path, cpus: str | None, timeout_s: float = 60.0
                               ) -> dict[str, Any]:
    """Start `kvfleet up` on a fresh pool, poll its router port every millisecond, and the
    moment it accepts send GET /health (how many endpoints are ready then) and one
    completion. Returns the timings, both answers, and whether `up` printed a URL before
    its endpoint announcement."""
    port = procs.free_port()
    pool = workdir / "flow-waiting-room.yaml"
    pool.write_text(POOL_YAML.format(model=MODEL))
    log = workdir / f"up-{port}.log"
    t0 = time.perf_counter()
    proc = procs.start([*_kvfleet(), "up", str(pool), "--port", str(port),
                        "--state-dir", str(workdir / f"state-{port}")], log, cpus)
    out: dict[str, Any] = {}
    try:
        while not _is_port_open(port):
            if proc.poll() is not None:
                raise RuntimeError(f"kvfleet up exited with {proc.returncode}; see {log}")
            if time.perf_counter() - t0 > timeout_s:
                raise RuntimeError(f"kvfleet up: router port not open after {timeout_s:.0f}s")
            time.sleep(0.001)
        t_open = time.perf_counter()
        base = f"http://{procs.HOST}:{port}"
        try:
            health = json.loads(procs.http_get(f"{base}/health", 5))
        except (OSError, ValueError) as exc:
            health = {"error": repr(exc)}
        t_send = time.perf_counter()
        req = urllib.request.Request(
            f"{base}/v1/completions", method="POST",
            data=json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 8}).encode(),
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                status, body = resp.status, resp.read()
                reason = ""
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read()
            reason = exc.headers.get("x-kvfleet-drop-reason", "")
        t_done = time.perf_counter()
        # the announcement comes on the control loop's next tick: wait for it (bounded)
        url = f"http://{procs.HOST}:{port}"
        deadline = time.perf_counter() + 15
        while "OpenAI endpoint" not in log.read_text() and time.perf_counter() < deadline:
            time.sleep(0.05)
        lines = log.read_text().splitlines()
        with_url = [i for i, line in enumerate(lines) if url in line]
        announce = [i for i, line in enumerate(lines) if "OpenAI endpoint" in line]
        out = {
            "port_open_after_start_s": t_open - t0,
            "health_at_open": health,
            "status": status,
            "drop_reason": reason,
            "is_ok": status == 200,
            "latency_s": t_done - t_send,
            "answer_excerpt": body[:200].decode(errors="replace"),
            "is_announced": bool(announce),
            "is_url_printed_before_announcement": bool(
                with_url and (not announce or with_url[0] < announce[0])),
        }
    finally:
        procs.stop(proc, timeout_s=15)
    return out
