"""Simulator fidelity (issue 14, item 7): one scenario through `kvfleet up` and `kvfleet sim`.

    .venv/bin/python bench/sim_fidelity.py                    # 3-minute slice, ~4 min wall
    .venv/bin/python bench/sim_fidelity.py --duration-s 30    # a shorter slice

The scenario: `sim/pools/fidelity-4.yaml`, exactly four replicas of kvfleet's engine with
the `simulated` runner on the `h100-llama3-8b` profile (the same profile file both ways),
and a slice of the Azure code trace (by default [1200, 1380) s, its own arrival times).

- live: `kvfleet up` runs the pool as processes (router, four engines whose steps sleep the
  cost model's time). Once all four serve, an open-loop client replays the slice at the
  trace's arrival times through the router, each request streamed (`/v1/completions`,
  the trace's prompt as token ids, `ignore_eos`, `max_tokens` = the trace's output length).
  TTFT is the first streamed token at the client; E2E the `[DONE]` event.
- sim: `kvfleet sim` replays the same slice (same prompts, same seed) in virtual time.

Both report TTFT and E2E p50/p90 and throughput (output tokens/s and requests/s from the
first arrival to the last completion), and the gap (sim - live) / live of each. Writes
bench/results/sim_fidelity.json; exits 1 when a TTFT or throughput gap exceeds
`--tolerance` (default 0.15, the issue's target).

Why this slice: four simulated H100s are loaded but not overloaded by it. The code trace
is prefill-heavy (prompts ~2.3k tokens, outputs ~26), and its bursts queue prefills
(TTFT p90 is several times p50) while ~99% of requests still meet a 2 s TTFT, so TTFT is
decided by the cost model, the scheduler and the router's spread rather than by a constant.
Its short outputs keep the live fleet's streaming (a few hundred SSE events per second)
far below what two shared CPU cores can carry, so the live side measures the model, not
this machine. The Mooncake trace overloads four replicas (a 120k-token prompt occupies a
replica for ~12 s); the Azure chat trace leaves them nearly idle at TTFT = one prefill.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "azure_llm_2023_code.csv"
POOL = ROOT / "sim" / "pools" / "fidelity-4.yaml"
RESULTS = ROOT / "bench" / "results" / "sim_fidelity.json"
READY_TIMEOUT_S = 90.0
GAP_KEYS = ("ttft_p50_s", "ttft_p90_s", "output_tokens_per_s", "requests_per_s")


@dataclass(slots=True)
class Done:
    """One request as either side saw it; times in seconds from the slice start."""

    arrival: float
    first_token: float
    finished: float
    num_output_tokens: int
    replica: str = ""


@dataclass(slots=True)
class Figures:
    num_requests: int
    num_failed: int
    ttft_p50_s: float
    ttft_p90_s: float
    e2e_p50_s: float
    e2e_p90_s: float
    output_tokens_per_s: float
    requests_per_s: float
    requests_per_replica: list[int]


def percentile(values: list[float], q: float) -> float:
    """Nearest rank, as `kvfleet sim` reports (kvfleet_sim.report)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))]


def figures(done: list[Done], num_failed: int, per_replica: list[int]) -> Figures:
    ttft = [d.first_token - d.arrival for d in done]
    e2e = [d.finished - d.arrival for d in done]
    span = max(d.finished for d in done) - min(d.arrival for d in done) if done else math.nan
    return Figures(
        num_requests=len(done) + num_failed, num_failed=num_failed,
        ttft_p50_s=percentile(ttft, 50), ttft_p90_s=percentile(ttft, 90),
        e2e_p50_s=percentile(e2e, 50), e2e_p90_s=percentile(e2e, 90),
        output_tokens_per_s=sum(d.num_output_tokens for d in done) / span,
        requests_per_s=len(done) / span, requests_per_replica=sorted(per_replica, reverse=True),
    )  # fmt: skip


def gaps(sim: Figures, live: Figures) -> dict[str, float]:
    """(sim - live) / live per figure: positive when the simulator says slower / more."""
    out = {}
    for key in ("ttft_p50_s", "ttft_p90_s", "e2e_p50_s", "e2e_p90_s",
                "output_tokens_per_s", "requests_per_s"):  # fmt: skip
        a, b = getattr(sim, key), getattr(live, key)
        out[key] = (a - b) / b if b else math.nan
    return out


# --- the scenario's requests -------------------------------------------------------------


@dataclass(slots=True)
class Request:
    t: float
    prompt: list[int]
    max_tokens: int


def requests(trace: str, start_s: float, duration_s: float, rate: float,
             max_model_len: int) -> list[Request]:  # fmt: skip
    """The slice's requests exactly as the simulator builds them (kvfleet_sim.fleet)."""
    from kvfleet_sim.trace import load_trace, prompt_tokens

    out = []
    for i, r in enumerate(load_trace(trace, start_s, duration_s, 1.0, rate)):
        prompt = prompt_tokens(r, i, max_model_len - r.num_output_tokens)
        out.append(Request(r.t, prompt, min(r.num_output_tokens, max_model_len - len(prompt))))
    return out


# --- sim -----------------------------------------------------------------------------------


def run_sim(args: argparse.Namespace) -> tuple[Figures, float]:
    from kvfleet_sim.fleet import SimSettings
    from kvfleet_sim.run import Variant, run_variants

    started = time.perf_counter()
    runs, _, _ = run_variants(
        str(args.trace), [Variant(str(args.pool), "fixed-max")], args.start_s,
        args.duration_s, 0.0, 1.0, SimSettings(seed=args.seed), rate=args.rate,
    )  # fmt: skip
    fin = runs[0].result.finished
    done = [Done(f.arrival, f.first_token, f.finished, f.num_output_tokens, f.replica)
            for f in fin if not f.is_aborted]  # fmt: skip
    per_replica = Counter(d.replica for d in done)
    return figures(done, len(fin) - len(done), list(per_replica.values())), \
        time.perf_counter() - started  # fmt: skip


# --- live ----------------------------------------------------------------------------------


class Fleet:
    """`kvfleet up POOL` in a private state dir; stopped (and its children) on exit."""

    def __init__(self, pool: Path, num_replicas: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="kvfleet-fidelity-"))
        self.num_replicas = num_replicas
        env = {**os.environ, "XDG_STATE_HOME": str(self.dir / "xdg")}
        self.log = open(self.dir / "up.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvfleet_operator.cli", "up", str(pool),
             "--state-dir", str(self.dir / "state"), "--quiet"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip

    def state(self) -> dict[str, Any]:
        try:
            return json.loads((self.dir / "state" / "state.json").read_text())
        except (OSError, json.JSONDecodeError):
            return {}

    def wait_serving(self, timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
        """Every replica ready and active in the router's config."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            s = self.state()
            eps = s.get("router", {}).get("endpoints", {})
            active = [e for e in eps.values() if e["state"] == "active" and e["is_healthy"]]
            if s.get("is_serving") and len(active) == self.num_replicas:
                return s
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        tail = (self.dir / "up.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"the fleet did not come up with {self.num_replicas} replicas:\n{tail}")

    def engines(self) -> dict[str, str]:
        return {r["name"]: r["address"] for r in self.state().get("replicas", [])
                if r["role"] != "router"}  # fmt: skip

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def served_requests(address: str) -> int:
    """Requests an engine finished, from its /metrics (the router's spread, as it happened)."""
    with urllib.request.urlopen(f"{address}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith("vllm:e2e_request_latency_seconds_count"):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


async def stream_one(session: aiohttp.ClientSession, url: str, body: bytes,
                     t0: float, req: Request) -> tuple[Done | None, float]:  # fmt: skip
    """(the request's figures or None when it failed, how late it was sent)."""
    delay = t0 + req.t - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    sent = time.perf_counter()
    first = math.nan
    num_tokens = -1
    buf = b""
    try:
        async with session.post(url, data=body) as resp:
            if resp.status != 200:
                return None, sent - t0 - req.t
            async for chunk in resp.content.iter_any():
                if math.isnan(first):
                    first = time.perf_counter()  # the engine sends nothing before the first token
                buf += chunk
                *events, buf = buf.split(b"\n\n")
                for event in events:
                    data = event.removeprefix(b"data: ")
                    if data == b"[DONE]":
                        done = time.perf_counter()
                        return Done(sent - t0, first - t0, done - t0, num_tokens), sent - t0 - req.t
                    usage = json.loads(data).get("usage")
                    if usage:
                        num_tokens = usage["completion_tokens"]
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        pass
    return None, sent - t0 - req.t


async def replay(
    endpoint: str, model: str, reqs: list[Request]
) -> tuple[list[Done], int, list[float]]:
    bodies = [json.dumps({
        "model": model, "prompt": r.prompt, "max_tokens": r.max_tokens, "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 0.0,
    }).encode() for r in reqs]  # fmt: skip
    url = endpoint.rstrip("/") + "/completions"
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers={"Content-Type": "application/json"}
    ) as session:
        t0 = time.perf_counter() + 0.5  # uvloop's loop.time() has 1 ms steps
        results = await asyncio.gather(
            *(stream_one(session, url, b, t0, r) for b, r in zip(bodies, reqs, strict=True))
        )
    done = [d for d, _ in results if d is not None]
    return done, len(results) - len(done), [late for _, late in results]


def run_live(args: argparse.Namespace, reqs: list[Request], model: str,
             num_replicas: int) -> tuple[Figures, dict[str, Any]]:  # fmt: skip
    fleet = Fleet(args.pool, num_replicas)
    try:
        started = time.monotonic()
        state = fleet.wait_serving()
        ready_s = time.monotonic() - started
        try:
            import uvloop

            runner: Any = uvloop.run
        except ImportError:
            runner = asyncio.run
        load_before = os.getloadavg()
        done, num_failed, late = runner(replay(state["endpoint"], model, reqs))
        load_after = os.getloadavg()
        per_replica = [served_requests(a) for a in fleet.engines().values()]
    finally:
        fleet.stop()
    lateness = {"p50_ms": percentile(late, 50) * 1e3, "p99_ms": percentile(late, 99) * 1e3,
                "max_ms": max(late, default=math.nan) * 1e3}  # fmt: skip
    return figures(done, num_failed, per_replica), {
        "fleet_ready_s": ready_s, "client_send_lateness": lateness,
        "loadavg_1m_before": load_before[0], "loadavg_1m_after": load_after[0],
    }  # fmt: skip


# --- report --------------------------------------------------------------------------------


def table(sim: Figures, live: Figures, gap: dict[str, float]) -> str:
    rows = [
        ("TTFT p50 (ms)", "ttft_p50_s", 1e3),
        ("TTFT p90 (ms)", "ttft_p90_s", 1e3),
        ("E2E p50 (ms)", "e2e_p50_s", 1e3),
        ("E2E p90 (ms)", "e2e_p90_s", 1e3),
        ("output tokens/s", "output_tokens_per_s", 1),
        ("requests/s", "requests_per_s", 1),
    ]
    out = ["| figure | `kvfleet up` (live) | `kvfleet sim` | gap (sim - live) / live |",
           "|---|---|---|---|"]  # fmt: skip
    for label, key, scale in rows:
        out.append(f"| {label} | {getattr(live, key) * scale:.1f} "
                   f"| {getattr(sim, key) * scale:.1f} | {gap[key]:+.1%} |")  # fmt: skip
    out.append(f"| requests per replica | {live.requests_per_replica} "
               f"| {sim.requests_per_replica} | |")  # fmt: skip
    return "\n".join(out)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--pool", type=Path, default=POOL)
    p.add_argument("--start-s", type=float, default=1200.0, help="slice start in the trace")
    p.add_argument("--duration-s", type=float, default=180.0, help="slice length (trace time)")
    p.add_argument("--rate", type=float, default=1.0, help="request-rate multiplier")
    p.add_argument("--seed", type=int, default=0, help="the simulated router's seed")
    p.add_argument("--tolerance", type=float, default=0.15,
                   help="largest |gap| of TTFT p50/p90 and throughput that passes")  # fmt: skip
    p.add_argument("--json", type=Path, default=RESULTS)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    from kvfleet_operator.api import load_pool

    pool = load_pool(str(args.pool))
    spec = pool.spec
    reps = spec.topology.unified.replicas if spec.topology.unified else None
    if reps is None or reps.min != reps.max:
        print("sim_fidelity: the pool must be unified with replicas.min == max", file=sys.stderr)
        return 2
    reqs = requests(str(args.trace), args.start_s, args.duration_s, args.rate,
                    spec.engine.max_model_len or 8192)  # fmt: skip
    sim, sim_wall_s = run_sim(args)
    live, live_info = run_live(args, reqs, spec.model.api_name, reps.max)
    gap = gaps(sim, live)
    worst = {k: gap[k] for k in GAP_KEYS if not abs(gap[k]) <= args.tolerance}
    out = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "num_replicas": reps.max, "profile": spec.engine.profile,
        "live": asdict(live), "sim": asdict(sim), "gap": gap, "live_info": live_info,
        "sim_wall_s": sim_wall_s, "over_tolerance": worst,
    }  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1))
    print(table(sim, live, gap))
    print(
        f"(load average {live_info['loadavg_1m_before']:.2f} -> "
        f"{live_info['loadavg_1m_after']:.2f}; client send lateness p99 "
        f"{live_info['client_send_lateness']['p99_ms']:.1f} ms; wrote {args.json})"
    )
    if worst:
        print("over tolerance: " + ", ".join(f"{k} {v:+.1%}" for k, v in worst.items()))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
