"""Does the router's memory stay bounded under an endless stream of unique clients?

production-stack#687: a router's prefix trie grew with every new prompt until the router
was OOM-killed. This soak sends kvfleet's router (a real `kvfleet router` process, the
default `cache-aware` policy) N requests in front of fast fake backends, every one with a
prompt, a session id (`x-session-id`) and a tenant (`x-kvfleet-tenant`) never seen
before, and samples the router process's RSS (/proc VmRSS) every `--sample-every`
completed requests. What grows with them, and its cap (router/README.md, "Memory bounds"):

- the approximate prefix index: every prompt is `--prompt-bytes` long with its unique id
  first, so each request records that many / 64 new block hashes
  (`prefix.max_blocks_per_endpoint`, LRU);
- the per-endpoint output-length table by session (10,000 keys per endpoint), which
  streamed answers teach (every `--stream-every`th request is streamed);
- flow control's attained-service meters (`flow_control.max_tracked_tenants`) and tenant
  metric labels (`flow_control.max_tenant_labels`);
- quota buckets: `quotas.default.rpm` is 1, so each new tenant's request-bucket is left
  empty for a minute and cannot be dropped as full (`quotas.max_tracked_tenants`).

Answers are one token (most not streamed), so the soak is as many requests as the
machine can push; the load side is aiohttp with `--concurrency` connections. The claim is
a plateau: RSS after the caps fill stays flat. The summary states the peak RSS, and the
growth between the middle of the run and its end.

    flock /tmp/kvfleet-cpu.lock .venv/bin/python bench/router_memory.py   # 1M requests
    .venv/bin/python bench/router_memory.py --quick       # 20k, written to /tmp
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
from kvfleet_bench import loadgen, procs, routers
from kvfleet_bench.procs import RESULTS_DIR
from kvfleet_bench.readme import refresh_section
from kvfleet_bench.sections.router_memory import render_router_memory

MIB = 1024 * 1024
FILLER = "memory soak: this filler makes the prompt span several prefix blocks. " * 64


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=1_000_000)
    p.add_argument("--sample-every", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--prompt-bytes", type=int, default=512,
                   help="prompt length (the unique id first, then filler)")
    p.add_argument("--num-backends", type=int, default=2)
    p.add_argument("--stream-every", type=int, default=4,
                   help="every Nth request is streamed (streams teach the per-session table)")
    p.add_argument("--max-blocks-per-endpoint", type=int, default=65536,
                   help="prefix.max_blocks_per_endpoint (the default)")
    p.add_argument("--out", default=str(RESULTS_DIR / "router_memory.json"))
    p.add_argument("--quick", action="store_true",
                   help="20k requests sampled every 2k, written under /tmp")
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.sample_every = 20_000, 2_000
        if args.out == p.get_default("out"):
            args.out = str(Path(tempfile.gettempdir()) / "router_memory_quick.json")
    for name in ("requests", "sample_every", "concurrency", "prompt_bytes", "num_backends",
                 "stream_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def prompt(i: int, num_bytes: int) -> str:
    """A prompt no other request shares from its first block on."""
    head = f"{i:012d} "
    return (head + FILLER)[:max(num_bytes, len(head))]


def router_sections(args: argparse.Namespace) -> dict[str, dict]:
    return {
        "prefix": {"max_blocks_per_endpoint": args.max_blocks_per_endpoint},
        "quotas": {"default": {"rpm": 1, "tpm": 0}},
        "queue": {"max_size": 4096},
    }


def start_backends(num: int, workdir: Path) -> tuple[subprocess.Popen, list[str]]:
    ports = [procs.free_port() for _ in range(num)]
    cmd = [sys.executable, "-m", "kvfleet_bench.fake_backend", "--num-tokens", "1"]
    for port in ports:
        cmd += ["--port", str(port)]
    proc = procs.start(cmd, workdir / "backends.log")
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    for url in urls:
        procs.wait_until(partial(procs.http_get, f"{url}/health"), proc, "fake backend")
    return proc, urls


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def soak(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    """Send every request once; a sample at 0 and after each `sample_every` completed."""
    counter = iter(range(args.requests))
    done, errors = 0, Counter[str]()
    samples: list[dict[str, Any]] = []
    t0, cpu0 = time.monotonic(), cpu_s(pid)

    def sample() -> None:
        samples.append({"requests": done, "rss_mib": procs.rss_bytes(pid) / MIB,
                        "elapsed_s": round(time.monotonic() - t0, 2),
                        "router_cpu_s": round(cpu_s(pid) - cpu0, 2),
                        "num_errors": sum(errors.values())})
        s = samples[-1]
        print(f"{s['requests']:>9,} requests  RSS {s['rss_mib']:7.1f} MiB  "
              f"{s['elapsed_s']:7.1f} s  errors {s['num_errors']}", flush=True)

    sample()
    connector = aiohttp.TCPConnector(limit=args.concurrency, limit_per_host=args.concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def worker() -> None:
            nonlocal done
            for i in counter:
                body = {"model": "fake-model", "prompt": prompt(i, args.prompt_bytes),
                        "max_tokens": 1, "stream": i % args.stream_every == 0}
                headers = {"x-session-id": f"session-{i}", "x-kvfleet-tenant": f"tenant-{i}"}
                try:
                    async with session.post(url + "/v1/completions", json=body,
                                            headers=headers) as resp:
                        await resp.read()
                        if resp.status != 200:
                            errors[f"http-{resp.status}"] += 1
                except (TimeoutError, aiohttp.ClientError) as exc:
                    errors[type(exc).__name__] += 1
                done += 1
                if done % args.sample_every == 0:
                    sample()

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    if samples[-1]["requests"] != done:
        sample()
    return {"samples": samples, "errors": dict(errors), "wall_s": time.monotonic() - t0}


def summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Peak RSS; growth from the first sample at or past half the run to the last, and the
    range the second half's samples moved in."""
    last = samples[-1]
    half = next(s for s in samples if s["requests"] >= last["requests"] / 2)
    second_half = [s["rss_mib"] for s in samples if s["requests"] >= half["requests"]]
    return {
        "num_requests": last["requests"],
        "num_errors": last["num_errors"],
        "rss_start_mib": samples[0]["rss_mib"],
        "rss_peak_mib": max(s["rss_mib"] for s in samples),
        "rss_end_mib": last["rss_mib"],
        "half_requests": half["requests"],
        "rss_half_mib": half["rss_mib"],
        "growth_second_half_mib": last["rss_mib"] - half["rss_mib"],
        "rss_second_half_min_mib": min(second_half),
        "rss_second_half_max_mib": max(second_half),
        "requests_per_s": last["requests"] / last["elapsed_s"] if last["elapsed_s"] else 0.0,
        "router_cpu_us_per_request": (1e6 * last["router_cpu_s"] / last["requests"]
                                      if last["requests"] else 0.0),
    }


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=procs.REPO_DIR,
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    loadgen.install_uvloop()
    started, measured_commit = time.time(), commit()  # the code the router starts with
    with tempfile.TemporaryDirectory(prefix="kvfleet-bench-") as tmp:
        workdir = Path(tmp)
        backends, urls = start_backends(args.num_backends, workdir)
        router = None
        try:
            router = routers.launch_kvfleet("cache-aware", urls, workdir, None,
                                            endpoint={"capacity": 100_000},
                                            sections=router_sections(args))
            assert router.proc is not None
            run = asyncio.run(soak(router.urls[0], router.proc.pid, args))
        finally:
            if router is not None:
                router.stop()
            procs.stop(backends)
    result = {
        "meta": {
            "command": " ".join(["python bench/router_memory.py", *argv]),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "commit": measured_commit,
            "cpu": next((ln.split(":", 1)[1].strip() for ln in
                         Path("/proc/cpuinfo").read_text().splitlines()
                         if ln.startswith("model name")), ""),
            "num_cpus": os.cpu_count(),
            "concurrency": args.concurrency,
            "prompt_bytes": args.prompt_bytes,
            "num_backends": args.num_backends,
            "stream_every": args.stream_every,
            "router_sections": router_sections(args),
        },
        "summary": summarise(run["samples"]),
        "errors": run["errors"],
        "samples": run["samples"],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(render_router_memory({"router_memory": result}))
    print(f"wrote {out}")
    refresh_section("router_memory", out)
    return 0 if not run["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
