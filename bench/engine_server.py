"""Engine server benchmark: TTFT and ITL at 1, 16 and 64 concurrent streams, and the
server's overhead over the same engine driven offline (in process, no HTTP).

Workload (identical for both): closed loop, C requests in flight; each request has its
own seeded random token-id prompt (no prefix sharing), greedy, EOS ignored, a fixed
number of output tokens. The client is this file's own aiohttp SSE reader (no tokenizer
download): TTFT = send -> first content chunk; ITL = gaps between content chunks.
Offline: the engine built from the same flags, fed by the same closed loop in process;
TTFT = add_request -> first token; ITL = gaps between a request's tokens.
Server and offline runs alternate level by level, for --rounds rounds, samples pooled.

    python bench/engine_server.py                      # smollm2-135m, 1/16/64 streams
    python bench/engine_server.py --model tiny-random \\
        --out bench/results/engine_server_tiny.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from kvfleet_bench.procs import free_port
from kvfleet_bench.readme import refresh_section
from kvfleet_bench.stats import percentile

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "engine_server.json"


@dataclass(slots=True)
class LevelResult:
    mode: str  # "server" | "offline"
    concurrency: int
    num_requests: int
    num_output_tokens: int
    wall_s: float
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    num_errors: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "mode": self.mode, "concurrency": self.concurrency,
            "num_requests": self.num_requests, "num_errors": self.num_errors,
            "wall_s": round(self.wall_s, 3),
            "output_tok_per_s": round(self.num_output_tokens / self.wall_s, 1),
            "ttft_p50_ms": round(1e3 * percentile(self.ttft_s, 50), 2),
            "ttft_p99_ms": round(1e3 * percentile(self.ttft_s, 99), 2),
            "itl_p50_ms": round(1e3 * percentile(self.itl_s, 50), 2),
            "itl_p99_ms": round(1e3 * percentile(self.itl_s, 99), 2),
        }


def make_prompts(num: int, num_tokens: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    low = min(300, vocab_size // 4)  # skip the low ids, where special tokens usually live
    return [[rng.randrange(low, vocab_size) for _ in range(num_tokens)] for _ in range(num)]


# --- the server side: a real `kvfleet engine` process and an SSE client ---


async def one_stream(session: aiohttp.ClientSession, url: str, model: str, prompt: list[int],
                     max_tokens: int, result: LevelResult) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    chunk_times: list[float] = []
    num_tokens = 0
    async with session.post(url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            result.num_errors += 1
            await resp.read()
            return
        async for raw in resp.content:
            if not raw.startswith(b"data: {"):
                continue
            event = json.loads(raw[6:])
            if event.get("choices") and event["choices"][0].get("text"):
                chunk_times.append(time.perf_counter())
            if event.get("usage"):
                num_tokens = event["usage"]["completion_tokens"]
    if num_tokens != max_tokens or not chunk_times:
        result.num_errors += 1
        return
    result.ttft_s.append(chunk_times[0] - started)
    result.itl_s.extend(b - a for a, b in zip(chunk_times, chunk_times[1:], strict=False))
    result.num_output_tokens += num_tokens


async def server_level(url: str, model: str, prompts: list[list[int]], concurrency: int,
                       max_tokens: int) -> LevelResult:
    result = LevelResult("server", concurrency, len(prompts), 0, 0.0)
    queue = list(reversed(prompts))
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            while queue:
                await one_stream(session, url, model, queue.pop(), max_tokens, result)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.wall_s = time.perf_counter() - started
    return result


def start_server(engine_flags: list[str], log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    argv = [sys.executable, "-m", "kvfleet_operator.cli.main", "engine", "--host", "127.0.0.1",
            "--port", str(port), *engine_flags]
    log = open(log_path, "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"engine exited early; see {log_path}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"engine not healthy after 300s; see {log_path}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


# --- the offline side: the same engine, no HTTP, no event loop ---


def offline_level(engine: Any, prompts: list[list[int]], concurrency: int, max_tokens: int,
                  tag: str) -> LevelResult:
    from kvfleet_engine.core.sampling_params import SamplingParams

    result = LevelResult("offline", concurrency, len(prompts), 0, 0.0)
    queue = list(reversed(list(enumerate(prompts))))
    added: dict[str, float] = {}
    last: dict[str, float] = {}
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    started = time.perf_counter()
    while queue or added:
        while queue and len(added) < concurrency:
            i, prompt = queue.pop()
            rid = f"{tag}-{i}"
            engine.add_request(rid, prompt, params)
            added[rid] = time.perf_counter()
        for out in engine.step():
            now = time.perf_counter()
            if out.new_token_ids:
                if out.request_id in last:
                    result.itl_s.append(now - last[out.request_id])
                else:
                    result.ttft_s.append(now - added[out.request_id])
                last[out.request_id] = now
                result.num_output_tokens += len(out.new_token_ids)
            if out.is_finished:
                added.pop(out.request_id, None)
                last.pop(out.request_id, None)
    result.wall_s = time.perf_counter() - started
    return result


def _pool(pooled: dict[tuple[str, int], LevelResult], run: LevelResult) -> None:
    """Merge rounds: samples are concatenated, counts and wall time add up."""
    key = (run.mode, run.concurrency)
    if key not in pooled:
        pooled[key] = run
        return
    acc = pooled[key]
    acc.num_requests += run.num_requests
    acc.num_output_tokens += run.num_output_tokens
    acc.wall_s += run.wall_s
    acc.num_errors += run.num_errors
    acc.ttft_s += run.ttft_s
    acc.itl_s += run.itl_s


def build_offline_engine(engine_flags: list[str]) -> Any:
    from kvfleet_engine.cli import build_parser
    from kvfleet_engine.server.build import build_server_parts

    args = build_parser().parse_args(["--port", "0", *engine_flags])
    engine, _, settings = build_server_parts(args)
    return engine, settings


# --- report ---


def ratios(server: dict[str, Any], offline: dict[str, Any]) -> dict[str, float]:
    return {
        "wall": round(server["wall_s"] / offline["wall_s"], 3),
        "ttft_p50": round(server["ttft_p50_ms"] / offline["ttft_p50_ms"], 3),
        "itl_p50": round(server["itl_p50_ms"] / offline["itl_p50_ms"], 3),
    }


def _report_lines(report: dict[str, Any]) -> list[str]:
    cfg = report["config"]
    lines = [
        f"**{cfg['model']}** — `{cfg['command']}`: {cfg['runner']} runner, "
        f"{cfg['prompt_tokens']}-token random prompts, {cfg['output_tokens']} output tokens, "
        f"greedy, EOS ignored; closed loop; {cfg['threads']} torch thread(s); "
        f"{cfg['rounds']} alternating rounds pooled; "
        f"measured {cfg['date']} on {cfg['machine']}.",
        "",
        "| streams | mode | req | out tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for level in report["levels"]:
        for row in (level["server"], level["offline"]):
            lines.append(
                f"| {row['concurrency']} | {row['mode']} | {row['num_requests']} | "
                f"{row['output_tok_per_s']} | {row['ttft_p50_ms']} / {row['ttft_p99_ms']} | "
                f"{row['itl_p50_ms']} / {row['itl_p99_ms']} |")
    lines += ["", "Server overhead = server / offline (1.0 means none):", "",
              "| streams | wall time | TTFT p50 | ITL p50 |", "|---|---|---|---|"]
    for level in report["levels"]:
        r = level["ratio"]
        lines.append(f"| {level['server']['concurrency']} | {r['wall']} | {r['ttft_p50']} | "
                     f"{r['itl_p50']} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--requests-per-level", type=int, default=0,
                   help="default: max(8, concurrency)")
    p.add_argument("--num-blocks", type=int, default=1200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=2, help="alternating server/offline rounds")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads for both sides (OMP_NUM_THREADS); on a small shared "
                        "machine more threads than free cores make torch spin")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before torch loads, here and in the server
    flags = ["--model", args.model, "--num-blocks", str(args.num_blocks),
             "--max-num-seqs", str(max(args.concurrency)),
             "--max-model-len", str(args.prompt_tokens + args.output_tokens + 16)]
    engine, settings = build_offline_engine(flags)
    workloads = {}
    for c in args.concurrency:
        n = args.requests_per_level or max(8, c)
        workloads[c] = make_prompts(n, args.prompt_tokens, settings.vocab_size, args.seed + c)
    warm = make_prompts(2, args.prompt_tokens, settings.vocab_size, 999)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    model = settings.served_model_names[0]
    log_path = Path(tempfile.gettempdir()) / "kvfleet-bench-engine-server.log"
    proc, url = start_server(flags, log_path)
    pooled: dict[tuple[str, int], LevelResult] = {}
    try:
        asyncio.run(server_level(url, model, warm, 2, 8))
        offline_level(engine, warm, 2, 8, "warm")
        # alternate server and offline per level and round, so drift in the machine's load
        # hits both alike (the idle server costs nothing while the offline engine runs)
        for rnd in range(args.rounds):
            for c, prompts in workloads.items():
                runs = (asyncio.run(server_level(url, model, prompts, c, args.output_tokens)),
                        offline_level(engine, prompts, c, args.output_tokens, f"r{rnd}c{c}"))
                for run in runs:
                    print(f"round {rnd}", run.summary(), flush=True)
                    _pool(pooled, run)
    finally:
        stop_server(proc)
    levels = []
    for c in workloads:
        server, offline = pooled["server", c].summary(), pooled["offline", c].summary()
        levels.append({"server": server, "offline": offline, "ratio": ratios(server, offline)})
    report = {
        "config": {
            "command": "python bench/engine_server.py " + " ".join(argv or sys.argv[1:]),
            "model": args.model, "runner": "torch", "prompt_tokens": args.prompt_tokens,
            "output_tokens": args.output_tokens, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                       time.gmtime()),
            "machine": f"{os.cpu_count()} CPU cores, shared", "threads": args.threads,
            "rounds": args.rounds,
        },
        "levels": levels,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("\n".join(_report_lines(report)))
    refresh_section("engine_server", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
