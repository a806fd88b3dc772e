"""Open-loop trace replay against a live `kvfleet up` fleet, each request streamed.

`Fleet` starts `kvfleet up POOL` in a private state dir and waits until every replica is
ready and active in the router; `replay` sends each request at its arrival time (open
loop: no request waits for another) as a streamed `/v1/completions` with the prompt as
token ids, and times it at the client: TTFT at the first streamed token (an engine sends
no byte before it), E2E at `data: [DONE]`. Used by bench/sim_fidelity.py.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

READY_TIMEOUT_S = 90.0
START_DELAY_S = 0.5  # from building the bodies to the slice's t = 0


@dataclass(slots=True)
class Request:
    t: float  # arrival, seconds from the slice start
    prompt: list[int]
    max_tokens: int


@dataclass(slots=True)
class Done:
    """One completed request; times in seconds from the slice start."""

    arrival: float
    first_token: float
    finished: float
    num_output_tokens: int
    replica: str = ""
    index: int = -1  # the request's place in the slice


@dataclass(slots=True)
class Replayed:
    done: list[Done]
    num_failed: int
    lateness_s: list[float]  # how late each request left the client (its own delays)


class Fleet:
    """`kvfleet up POOL` in a private state dir; `stop()` ends it and its children."""

    def __init__(self, pool: Path, num_replicas: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="kvfleet-replay-"))
        self.num_replicas = num_replicas
        env = {**os.environ, "XDG_STATE_HOME": str(self.dir / "xdg")}
        self.log = open(self.dir / "up.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvfleet_operator.cli.main", "up", str(pool),
             "--state-dir", str(self.dir / "state"), "--quiet"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip

    def state(self) -> dict[str, Any]:
        try:
            return json.loads((self.dir / "state" / "state.json").read_text())
        except (OSError, json.JSONDecodeError):
            return {}

    def wait_serving(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """The OpenAI endpoint, once every replica is ready and active in the router."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            s = self.state()
            eps = s.get("router", {}).get("endpoints", {}).values()
            active = [e for e in eps if e["state"] == "active" and e["is_healthy"]]
            if s.get("is_serving") and len(active) == self.num_replicas:
                return str(s["endpoint"])
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        tail = (self.dir / "up.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"the fleet did not come up with {self.num_replicas} replicas:\n{tail}")

    def served(self) -> dict[str, dict[str, float]]:
        """Each engine's counters from its /metrics: requests finished (the router's
        spread), and the sum of their TTFT as the engine measured it (from the request
        reaching it), which splits the client's TTFT into hops and engine."""
        out = {}
        for r in self.state().get("replicas", []):
            if r["role"] != "router":
                out[r["name"]] = engine_counters(r["address"])
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


ENGINE_COUNTERS = {
    "vllm:e2e_request_latency_seconds_count": "num_requests",
    "vllm:time_to_first_token_seconds_sum": "ttft_sum_s",
    "vllm:time_to_first_token_seconds_count": "num_ttft",
}


TTFT_BOUNDS = ("0.1", "0.25", "0.5")  # buckets of the engines' TTFT histogram, seconds


def engine_counters(address: str) -> dict[str, float]:
    """The counters above, plus `ttft_le_<bound>`: requests whose engine-side TTFT was
    at most that many seconds."""
    with urllib.request.urlopen(f"{address}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = dict.fromkeys([*ENGINE_COUNTERS.values(), *(f"ttft_le_{b}" for b in TTFT_BOUNDS)], 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in ENGINE_COUNTERS:
            out[ENGINE_COUNTERS[name]] += float(line.rsplit(" ", 1)[1])
        elif name == "vllm:time_to_first_token_seconds_bucket":
            for b in TTFT_BOUNDS:
                if f'le="{b}"' in line:
                    out[f"ttft_le_{b}"] += float(line.rsplit(" ", 1)[1])
    return out


def load_requests(trace: str | Path, start_s: float, duration_s: float, rate: float,
                  max_model_len: int) -> list[Request]:
    """A slice's requests exactly as the simulator builds them (kvfleet_sim.fleet)."""
    from kvfleet_sim.trace import load_trace

    sliced = load_trace(str(trace), start_s, duration_s, 1.0, rate)
    return [as_request(r, i, max_model_len) for i, r in enumerate(sliced)]


def as_request(r: Any, index: int, max_model_len: int) -> Request:
    from kvfleet_sim.trace import prompt_tokens

    prompt = prompt_tokens(r, index, max_model_len - r.num_output_tokens)
    return Request(r.t, prompt, min(r.num_output_tokens, max_model_len - len(prompt)))


def body(model: str, req: Request) -> bytes:
    return json.dumps({
        "model": model, "prompt": req.prompt, "max_tokens": req.max_tokens, "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 0.0,
    }).encode()  # fmt: skip


async def stream_one(session: aiohttp.ClientSession, url: str, data: bytes, t0: float,
                     i: int, req: Request) -> tuple[Done | None, float]:  # fmt: skip
    """(the request's figures, or None when it failed; how late it left)."""
    delay = t0 + req.t - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    sent = time.perf_counter()
    late = sent - t0 - req.t
    first = math.nan
    num_tokens = -1
    buf = b""
    try:
        async with session.post(url, data=data) as resp:
            if resp.status != 200:
                return None, late
            async for chunk in resp.content.iter_any():
                if math.isnan(first):
                    first = time.perf_counter()
                *events, buf = (buf + chunk).split(b"\n\n")
                for event in events:
                    payload = event.removeprefix(b"data: ")
                    if payload == b"[DONE]":
                        end = time.perf_counter() - t0
                        return Done(sent - t0, first - t0, end, num_tokens, "", i), late
                    usage = json.loads(payload).get("usage")
                    if usage:
                        num_tokens = int(usage["completion_tokens"])
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        pass
    return None, late


async def _replay(endpoint: str, model: str, reqs: list[Request]) -> Replayed:
    bodies = [body(model, r) for r in reqs]
    url = endpoint.rstrip("/") + "/completions"
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=600),
        headers={"Content-Type": "application/json"},
    ) as session:  # fmt: skip
        t0 = time.perf_counter() + START_DELAY_S  # perf_counter: uvloop's loop.time() is in ms
        results = await asyncio.gather(
            *(stream_one(session, url, data, t0, i, reqs[i]) for i, data in enumerate(bodies))
        )
    done = [d for d, _ in results if d is not None]
    return Replayed(done, len(results) - len(done), [late for _, late in results])


def replay(endpoint: str, model: str, reqs: list[Request]) -> Replayed:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_replay(endpoint, model, reqs))
    return uvloop.run(_replay(endpoint, model, reqs))
