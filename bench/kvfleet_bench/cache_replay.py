"""The router prefix-affinity replay (bench/router_cache_hits.py), shared with
bench/sim_fidelity.py's routing comparison: fake backends with LRU-bounded prefix caches,
one router in front of them at a time, a Mooncake slice replayed open-loop through it.

`args` is the benchmark's argparse namespace: num_backends, cache_blocks, block_chars,
prefill_ms_per_block, ms_per_output_token (real time, divided by speedup), speedup,
max_output_tokens, window_s, size_kvfleet_prefix, no_pin, client_cpu and router_cpu_pin;
connections (auto/reuse/new) and, for the restart measurement, restart_replica, restart_at,
restart_down_s and restart_window_s.

Targets behind a balancer (several router replicas, kvfleet_bench.replicas) are attributed
request by request: with one request per connection, Envoy's access log names the replica
each client port was proxied to (kvfleet_bench.balancer.attribute).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from kvfleet_bench import load_stats, loadgen, procs, routers
from kvfleet_bench import traces as trace_mooncake
from kvfleet_bench.fake_backend import arrival_number
from kvfleet_bench.prefix_cache import LRUPrefixCache
from kvfleet_bench.stats import percentile

MODEL = "fake-model"


def add_scenario_args(p: argparse.ArgumentParser, reps_help: str) -> None:
    """The replay scenario's options (slice, pacing, backends, CPUs), one set for
    router_cache_hits.py and sim_fidelity.py --routing."""
    p.add_argument("--trace", default=str(trace_mooncake.default_trace_path()))
    p.add_argument("--num-requests", type=int, default=1500)
    p.add_argument("--skip", type=int, default=0, help="trace lines to skip first")
    p.add_argument("--speedup", type=float, default=11.0, help="time compression")
    p.add_argument("--num-backends", type=int, default=4)
    p.add_argument("--block-chars", type=int, default=512, help="characters per hash id")
    p.add_argument("--cache-blocks", type=int, default=3000, help="LRU bound per backend")
    p.add_argument("--prefill-ms-per-block", type=float, default=40.0, help="real time")
    p.add_argument("--ms-per-output-token", type=float, default=20.0, help="real time")
    p.add_argument("--max-output-tokens", type=int, default=1024)
    p.add_argument("--window-s", type=float, default=1.0, help="imbalance window, compressed")
    p.add_argument("--reps", type=int, default=3, help=reps_help)
    p.add_argument("--router-cpu", default="0")
    p.add_argument("--client-cpu", default="1")
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--kvfleet-pipelines", type=pipelines_arg, default=None, metavar="JSON",
                   help="routing pipelines for kvfleet's config (policy.pipelines, "
                        "router/README.md), by name, e.g. '{\"heavy\": {\"scorers\": "
                        "{\"prefix\": 1, \"queue\": 64}, \"guard\": true}}'; the target "
                        "kvfleet:heavy runs one (every preset stays as shipped)")
    p.add_argument("--connections", choices=("auto", "reuse", "new"), default="auto",
                   help="new: a new TCP connection per request; auto (default): new for "
                        "targets behind the L4 balancer (router replicas), reuse otherwise")


def is_new_connection(target: str, args: argparse.Namespace) -> bool:
    """Clients behind an L4 balancer open connections as real ones do (one per request),
    else round-robin over connections would pin each keep-alive connection to a replica."""
    if args.connections == "auto":
        return routers.parse_target(target)[0].startswith("kvfleet-replicas")
    return args.connections == "new"


def pin_client(args: argparse.Namespace) -> None:
    """The load generator on --client-cpu and the router on --router-cpu when two CPUs
    are usable and --no-pin is not given (sets args.router_cpu_pin; else args.no_pin)."""
    can_pin = not args.no_pin and len(procs.usable_cpus()) >= 2
    args.router_cpu_pin = args.router_cpu if can_pin else None
    if can_pin:
        os.sched_setaffinity(0, {int(args.client_cpu)})
    else:
        args.no_pin = True


def quick_scenario(args: argparse.Namespace) -> None:
    """--quick: enough of the trace for multi-turn reuse, squeezed into seconds a target."""
    args.num_requests, args.speedup, args.block_chars = 400, 60.0, 128
    args.cache_blocks, args.window_s = 1500, 0.25


def pipelines_arg(text: str) -> dict[str, dict]:
    """--kvfleet-pipelines: a JSON object of pipeline name -> pipeline object (the router
    checks each pipeline itself when it loads the config)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict) or not value or not all(
            isinstance(v, dict) for v in value.values()):
        raise argparse.ArgumentTypeError("want a JSON object of name -> pipeline object")
    return value


def router_options(args: argparse.Namespace) -> dict[str, dict]:
    """Every router at its shipped defaults, unless --size-kvfleet-prefix sizes kvfleet's
    prefix index like the backends' caches (an operator's tuning the peers do not get);
    --kvfleet-pipelines adds named pipelines beside kvfleet's presets, which stay as
    shipped."""
    sections: dict[str, dict] = {}
    if args.size_kvfleet_prefix:
        block_bytes = 64
        sections["prefix"] = {
            "block_bytes": block_bytes,
            "max_blocks_per_endpoint": args.cache_blocks * args.block_chars // block_bytes,
        }
    if args.kvfleet_pipelines:
        sections["policy"] = {"pipelines": args.kvfleet_pipelines}
    return {"kvfleet": {"sections": sections}} if sections else {}


def git_state() -> dict[str, Any]:
    """The commit measured, and whether router/ differed from it in the working tree (other
    engineers edit it concurrently): a hash of `git diff HEAD -- router/` pins that too."""
    import hashlib
    import subprocess

    def git(*a: str) -> str:
        proc = subprocess.run(["git", *a], capture_output=True, text=True, cwd=procs.REPO_DIR)
        return proc.stdout if proc.returncode == 0 else ""

    diff = git("diff", "HEAD", "--", "router/")
    return {"commit": git("rev-parse", "HEAD").strip(),
            "router_last_commit": git("log", "-1", "--format=%h %s", "--", "router/").strip()[:90],
            "router_tree_differs": bool(diff),
            "router_diff_sha1": hashlib.sha1(diff.encode()).hexdigest()[:12] if diff else ""}


def start_backends(args: argparse.Namespace, workdir: Path):
    ports = [procs.free_port() for _ in range(args.num_backends)]
    cmd = [
        sys.executable, "-m", "kvfleet_bench.fake_backend", "--model", MODEL,
        "--cache-blocks", str(args.cache_blocks), "--block-chars", str(args.block_chars),
        "--prefill-ms-per-block", str(args.prefill_ms_per_block / args.speedup),
        "--token-delay-ms", str(args.ms_per_output_token / args.speedup),
        "--max-num-tokens", str(args.max_output_tokens),
    ]
    for port in ports:
        cmd += ["--port", str(port)]
    proc = procs.start(cmd, workdir / "backends.log", None if args.no_pin else args.client_cpu)
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    for url in urls:
        procs.wait_until(partial(procs.http_get, f"{url}/health"), proc, "fake backend")
    return proc, urls


async def replay(
    url: str, requests: list[trace_mooncake.TraceRequest], args: argparse.Namespace,
    is_new_connection: bool = False, side: Any = None,
) -> list[dict[str, Any]]:
    """Send each request at its (compressed) arrival time; collect where it went. `side`,
    a coroutine function, runs alongside (the restart measurement's kill and start)."""
    out: list[dict[str, Any]] = [{} for _ in requests]

    async def one(i: int, req: trace_mooncake.TraceRequest, session: aiohttp.ClientSession):
        body = json.dumps({
            "model": MODEL,
            "prompt": trace_mooncake.prompt_text(req.hash_ids, args.block_chars),
            "max_tokens": max(1, min(req.output_length, args.max_output_tokens)),
        }).encode()
        result = await loadgen.send(session, url, body, is_stream=False, keep_body=True,
                                    is_port_kept=is_new_connection)
        row: dict[str, Any] = {"is_ok": result.is_ok, "latency_s": result.latency_s,
                               "error": result.error, "local_port": result.local_port,
                               "start_wall_s": result.start_wall_s}
        if result.is_ok:
            try:
                parsed = json.loads(result.body)
                row["backend"] = parsed["system_fingerprint"]
                cached = parsed["usage"]["prompt_tokens_details"]["cached_tokens"]
                row["num_hit_blocks"] = cached // args.block_chars
                row["backend_seq"] = arrival_number(parsed.get("id"), row["backend"])
            except (ValueError, KeyError, TypeError):
                row.update(is_ok=False, error="unparsable response")
        out[i] = row

    t0 = time.perf_counter()
    tasks = []
    side_task = asyncio.create_task(side()) if side is not None else None
    async with loadgen.new_session(120.0, is_new_connection) as session:
        for i, req in enumerate(requests):
            delay = t0 + req.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, req, session)))
        await asyncio.gather(*tasks)
        await loadgen.settle_drains()
    if side_task is not None:
        await side_task
    return out


def pooled_reference(requests: list[trace_mooncake.TraceRequest], args) -> float:
    """Hit fraction of one cache as big as all backends' together: an upper bound on affinity."""
    return lru_hit_fraction([(req, "pooled") for req in requests],
                            args.cache_blocks * args.num_backends, args.block_chars)


def hit_fraction_in_arrival_order(served: list[tuple[trace_mooncake.TraceRequest, dict]],
                                  args) -> float | None:
    """The LRU model replayed with each backend seeing its requests in the order they
    reached it (their arrival numbers): what the backends' own counts must be, whatever
    the timing; None when a response carried no arrival number."""
    if any(r.get("backend_seq") is None for _, r in served):
        return None
    ordered = sorted(served, key=lambda pair: (pair[1]["backend"], pair[1]["backend_seq"]))
    return lru_hit_fraction([(req, r["backend"]) for req, r in ordered], args.cache_blocks,
                            args.block_chars)


def hit_fraction_on_routes(routes: list[tuple[trace_mooncake.TraceRequest, str]],
                           args) -> float:
    """The hit fraction these routes give when every backend's cache sees its requests in
    trace order: what the live counts would be without the arrival reordering that
    concurrent sends bring (so a gap between the two is timing, not the cache model)."""
    return lru_hit_fraction(routes, args.cache_blocks, args.block_chars)


def lru_hit_fraction(routes: list[tuple[trace_mooncake.TraceRequest, str]],
                     blocks_per_cache: int, block_chars: int) -> float:
    """Each request looked up and stored, in order, in its backend's own LRU cache."""
    caches: dict[str, LRUPrefixCache] = {}
    num_hit = num_blocks = 0
    for req, backend in routes:
        cache = caches.setdefault(backend, LRUPrefixCache(blocks_per_cache, block_chars))
        lookup = cache.lookup_and_store(trace_mooncake.prompt_text(req.hash_ids, block_chars))
        num_hit += lookup.num_hit_blocks
        num_blocks += lookup.num_prompt_blocks
    return num_hit / num_blocks if num_blocks else 0.0


def run_target(target, requests, args, backend_urls, workdir) -> dict[str, Any]:
    for url in backend_urls:
        procs.http_post_json(f"{url}/bench/reset", {})
    router = routers.launch(target, backend_urls, workdir, args.router_cpu_pin,
                            router_options(args))
    rs = router.replica_set
    restart: dict[str, float] = {}
    side = None
    if rs is not None and getattr(args, "restart_replica", False):
        at_s = args.restart_at * (requests[-1].arrival_s if requests else 0.0)

        async def side() -> None:
            await asyncio.sleep(at_s)
            restart["stop_wall_s"] = time.time()
            restart["ready_wall_s"] = await asyncio.to_thread(rs.restart, 0,
                                                              args.restart_down_s)
    is_new = is_new_connection(target, args)
    try:
        t_start = time.time()
        rows = asyncio.run(replay(router.urls[0] + "/v1/completions", requests, args, is_new,
                                  side))
        t_end = time.time()
        peak_rss_mb = sum(procs.rss_bytes(pid) for pid in router.router_pids) / 2**20
        if rs is not None:
            attribute_rows(rows, rs)
    finally:
        router.stop()
    stats = [json.loads(procs.http_get(f"{u}/bench/stats?timeline=1", 10)) for u in backend_urls]
    num_blocks = sum(s["num_prompt_blocks"] for s in stats)
    num_hit = sum(s["num_hit_blocks"] for s in stats)
    ok = [r for r in rows if r["is_ok"]]
    served = [(req, r) for req, r in zip(requests, rows, strict=True) if r["is_ok"]]
    client_blocks = sum(len(req.hash_ids) for req, _ in served)
    routes = [(req.hash_ids, r["backend"]) for req, r in served]
    latencies = [r["latency_s"] for r in ok]
    return {
        "num_requests": len(rows),
        "num_errors": len(rows) - len(ok),
        "errors": dict(Counter(r["error"] for r in rows if not r["is_ok"])),
        "hit_fraction": num_hit / num_blocks if num_blocks else 0.0,
        "hit_fraction_from_responses": (
            sum(r["num_hit_blocks"] for r in ok) / client_blocks if client_blocks else 0.0
        ),
        "hit_fraction_on_routes_in_trace_order": hit_fraction_on_routes(
            [(req, r["backend"]) for req, r in served], args),
        "hit_fraction_on_routes_in_arrival_order": hit_fraction_in_arrival_order(served, args),
        "num_prompt_blocks": num_blocks,
        "requests_per_backend": {s["name"]: s["num_requests"] for s in stats},
        **load_stats.backends_per_prefix(routes),
        "imbalance": load_stats.imbalance_summary(
            [s["timeline"] for s in stats], t_start, t_end, args.window_s, 0.01
        ),
        "latency_p50_ms": percentile(latencies, 50) * 1000,
        "latency_p99_ms": percentile(latencies, 99) * 1000,
        "router_peak_rss_mb": peak_rss_mb,
        "wall_s": t_end - t_start,
        "is_new_connection_per_request": is_new,
        **(replica_stats(requests, rows, restart, args) if rs is not None else {}),
    }


def attribute_rows(rows: list[dict[str, Any]], rs: Any) -> None:
    """row["replica"]: the index of the replica Envoy proxied the request's connection to
    (-1 where the access log has no line for it)."""
    time.sleep(0.5)  # Envoy flushes its access log every 200 ms
    from kvfleet_bench import balancer

    log = balancer.read_access_log(rs.balancer.access_log)
    index = rs.replica_of()
    keys = [(r.get("start_wall_s", 0.0), r.get("local_port", 0)) for r in rows]
    for row, upstream in zip(rows, balancer.attribute(keys, log), strict=True):
        row["replica"] = index.get(upstream, -1)


def _hits(pairs: list[tuple[Any, dict[str, Any]]]) -> dict[str, float]:
    """Hit fraction (from the responses' cached_tokens) of answered requests."""
    ok = [(req, r) for req, r in pairs if r["is_ok"]]
    blocks = sum(len(req.hash_ids) for req, _ in ok)
    hits = sum(r["num_hit_blocks"] for _, r in ok)
    return {"num_requests": len(pairs), "num_errors": len(pairs) - len(ok),
            "num_prompt_blocks": blocks,
            "hit_fraction": hits / blocks if blocks else math.nan}


def replica_stats(requests, rows, restart: dict[str, float], args) -> dict[str, Any]:
    """Requests and hit fraction per replica; with a restart, the restarted replica (0)
    against the others in windows of `restart_window_s` from when it first served again."""
    pairs = list(zip(requests, rows, strict=True))
    replicas = sorted({r.get("replica", -1) for r in rows})
    out: dict[str, Any] = {
        "num_unattributed": sum(1 for r in rows if r.get("replica", -1) < 0),
        "per_replica": {str(i): _hits([(q, r) for q, r in pairs if r.get("replica") == i])
                        for i in replicas if i >= 0},
    }
    if restart:
        out["restart"] = restart_windows(pairs, restart, args.restart_window_s)
    return out


WARM_RATIO = 0.97  # "at the others' hit fraction": within 3 %, the replicas' bar too
WARM_WITHIN_S = 10.0


def restart_windows(pairs, restart: dict[str, float], window_s: float) -> dict[str, Any]:
    """The restarted replica's hit fraction vs the others', window by window from its first
    request served after the restart, and over [10 s, end) (the acceptance: from 10 s after
    it serves, at least 0.97x the others')."""
    after = [(q, r) for q, r in pairs if r.get("start_wall_s", 0.0) >= restart["ready_wall_s"]]
    mine = [(q, r) for q, r in after if r.get("replica") == 0]
    if not mine:
        return {**restart, "served": False}
    t_serve = min(r["start_wall_s"] for _, r in mine)
    end = max(r["start_wall_s"] for _, r in after)

    def split(lo: float, hi: float) -> dict[str, Any]:
        inside = [(q, r) for q, r in after if lo <= r["start_wall_s"] - t_serve < hi]
        return {"restarted": _hits([(q, r) for q, r in inside if r.get("replica") == 0]),
                "others": _hits([(q, r) for q, r in inside if r.get("replica", -1) > 0])}

    def ratio(cell: dict[str, Any]) -> float:
        a, b = cell["restarted"]["hit_fraction"], cell["others"]["hit_fraction"]
        return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan

    windows = []
    t = 0.0
    while t <= end - t_serve:
        cell = split(t, t + window_s)
        windows.append({"start_s": t, **cell, "ratio": ratio(cell)})
        t += window_s
    later = split(WARM_WITHIN_S, math.inf)
    first = split(0.0, WARM_WITHIN_S)
    later_ratio = ratio(later)
    # the noise floor of such a ratio: two replicas that were never restarted, same interval
    late = [(q, r) for q, r in after if r["start_wall_s"] - t_serve >= WARM_WITHIN_S]
    r1 = _hits([(q, r) for q, r in late if r.get("replica") == 1])["hit_fraction"]
    r2 = _hits([(q, r) for q, r in late if r.get("replica") == 2])["hit_fraction"]
    return {
        **restart,
        "served": True,
        "down_s": restart["ready_wall_s"] - restart["stop_wall_s"],
        "serving_after_ready_s": t_serve - restart["ready_wall_s"],
        "observed_s": end - t_serve,
        "window_s": window_s,
        "windows": windows,
        "first_10s": {**first, "ratio": ratio(first)},
        "after_10s": {**later, "ratio": later_ratio},
        "control_ratio_after_10s": r1 / r2 if r2 and not math.isnan(r1) else math.nan,
        "is_warm_within_10s": bool(later_ratio >= WARM_RATIO)
        if not math.isnan(later_ratio) else None,
    }


MEDIAN_FIELDS = ("hit_fraction", "hit_fraction_from_responses", "mean_backends_per_shared_prefix",
                 "fraction_shared_on_one_backend", "latency_p50_ms", "latency_p99_ms",
                 "router_peak_rss_mb")


def summarise_reps(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians and [min, max] over repetitions (imbalance field by field); errors add up."""
    out: dict[str, Any] = {k: statistics.median(r[k] for r in reps) for k in MEDIAN_FIELDS}
    out["imbalance"] = {k: statistics.median(r["imbalance"][k] for r in reps)
                        for k in reps[0]["imbalance"]}
    out["spread"] = {k: [min(r[k] for r in reps), max(r[k] for r in reps)]
                     for k in MEDIAN_FIELDS}
    out["spread"]["window_max"] = [min(r["imbalance"]["window_max"] for r in reps),
                                   max(r["imbalance"]["window_max"] for r in reps)]
    out["spread"]["window_mean"] = [min(r["imbalance"]["window_mean"] for r in reps),
                                    max(r["imbalance"]["window_mean"] for r in reps)]
    out["num_requests"] = reps[0]["num_requests"]
    out["num_errors"] = sum(r["num_errors"] for r in reps)
    out["reps"] = reps
    return out
