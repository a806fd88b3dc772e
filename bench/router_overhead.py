"""What does a router cost? kvfleet's router vs sglang-router and vllm-router vs direct access.

Same machine, same run, same fake backends. The router runs alone on one core (`taskset`);
the load side (Debian's `wrk`, C) and the fake backends share the other. Targets take turns
level by level and repetition by repetition, so machine noise hits them alike.

Headline: the router process's CPU time per request (utime + stime of its process tree from
/proc/<pid>/stat over the measured interval, divided by the requests completed in it) at a
paced load that no router saturates, and the one-core req/s ceiling it implies (1e6 / µs).
Throughput at a saturating closed loop is reported too, but the load side shares a core with
the backends, so it caps direct traffic and separates the routers less well than CPU does.

Phase 1 (levels "connections:think_ms"): each connection sends one stream after another,
waiting a random think time (uniform in [0, 2 x think_ms]) before each; think 0 is a plain
closed loop. Added latency = the target's percentile minus direct access's in the same
repetition; quote it only at the paced (unsaturated) levels.
Phase 1b (streamed level, issue 29): answers of --answer-tokens (129, the median output of
the Azure conversation trace) with tokens --answer-token-delay-ms (10) apart from the fake
backends, a closed loop of --streamed-level connections (64:0, ~50 streams/s, no router
saturated); router CPU per stream (and per token) and added stream latency, every target
each repetition, kvfleet's ratio to each peer's same policy per repetition.
Phase 1c (workers): `kvfleet router --workers 2` (target kvfleet-w2:cache-aware) against
one worker (kvfleet:cache-aware) at the saturating closed loop, req/s and router CPU, both
routers allowed the same 2 cores (--router-cpu and --client-cpu): on this 2-core machine
the load side and the backends then share those cores with the router, so the row shows
what a second worker buys under that contention, not a clean 2-core ceiling. The targets
alternate their order by repetition. Skipped (with the reason) where the router has no
--workers.
The target aiohttp-floor (kvfleet_bench.floor_proxy: aiohttp's server and kvfleet's upstream
client, backends in turn, nothing else) is the least an aiohttp router can spend; the
floor's CPU over each peer's cache_aware, and kvfleet's over the floor, are reported per
repetition at the headline and streamed levels.
Phase 2 (capacity): N long streams open at once; errors and the router's peak RSS.

    bash bench/setup_peers.sh                            # once: sglang-router, vllm-router
    .venv/bin/python bench/router_overhead.py            # full run, ~15 min
    .venv/bin/python bench/router_overhead.py --quick    # seconds; the smoke test uses it
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from kvfleet_bench import loadgen, procs, routers, wrkload
from kvfleet_bench.procs import RESULTS_DIR
from kvfleet_bench.readme import refresh_section
from kvfleet_bench.sections.router_overhead import results_markdown
from kvfleet_bench.stats import spread as stat

DEFAULT_TARGETS = [
    "direct",
    "kvfleet:cache-aware",
    "kvfleet:round-robin",
    "sglang:round_robin",
    "sglang:cache_aware",
    "vllm:round_robin",
    "vllm:cache_aware",
    "kvfleet-w2:cache-aware",
    "aiohttp-floor:round-robin",
]
PEERS = ("sglang", "vllm")
FLOOR = "aiohttp-floor"  # the bare aiohttp proxy: what the stack alone costs
# targets measured only in the workers phase, against this one-worker target
WORKER_TARGETS = ("kvfleet-w2",)
ONE_WORKER = "kvfleet:cache-aware"
# The peers run without admission limits (see routers.py); kvfleet's endpoints get a
# capacity no run here reaches, so all three proxy every request instead of queueing it.
ROUTER_OPTIONS = {"kvfleet": {"endpoint": {"capacity": 100_000}}}
# ~1,000 req/s offered at 16, 64 and 256 connections; 64:0 is the saturating closed loop
DEFAULT_LEVELS = "1:0,16:16,64:64,256:256,64:0"
HEADLINE_LEVEL = "64:64"


def parse_level(text: str) -> tuple[int, float]:
    conns, _, think = text.partition(":")
    return int(conns), float(think or 0)


def level_key(conns: int, think_ms: float) -> str:
    return f"{conns}:{think_ms:g}"


def is_paced(key: str) -> bool:
    """One connection, or think time between requests: the router is not saturated."""
    conns, think = parse_level(key)
    return conns == 1 or think > 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--targets", default=",".join(DEFAULT_TARGETS))
    p.add_argument("--levels", default=DEFAULT_LEVELS,
                   help="connections:think_ms, comma-separated")
    p.add_argument("--headline-level", default=HEADLINE_LEVEL,
                   help="the level whose router CPU per request is the headline")
    p.add_argument("--duration", type=float, default=5.0, help="seconds measured per run")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--load", choices=("auto", "wrk", "python"), default="auto",
                   help="wrk (C) when installed, else loadgen.py")
    p.add_argument("--max-tokens", type=int, default=8, help="tokens per short stream")
    p.add_argument("--num-backends", type=int, default=2)
    p.add_argument("--streams", type=int, default=2000)
    p.add_argument("--stream-tokens", type=int, default=20)
    p.add_argument("--stream-token-delay-ms", type=float, default=250.0)
    p.add_argument("--streamed-level", default="64:0",
                   help="connections:think_ms of the streamed level ('' to skip it)")
    p.add_argument("--answer-tokens", type=int, default=129,
                   help="tokens per answer at the streamed level")
    p.add_argument("--answer-token-delay-ms", type=float, default=10.0)
    p.add_argument("--router-cpu", default="0")
    p.add_argument("--client-cpu", default="1")
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--out", default=str(RESULTS_DIR / "router_overhead.json"))
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--quick", action="store_true", help="a few seconds in all, for smoke tests")
    p.add_argument("--render", metavar="JSON",
                   help="re-summarise a saved result (its runs) and rewrite its .md; no run")
    args = p.parse_args(argv)
    if args.quick:
        args.levels, args.headline_level = "1:0,8:8,8:0", "8:8"
        args.duration, args.warmup, args.reps = 1.0, 0.0, 1
        args.streams, args.stream_tokens, args.stream_token_delay_ms = 50, 5, 20.0
        if args.streamed_level:
            args.streamed_level, args.answer_tokens = "8:0", 20
    args.target_list = [t for t in args.targets.split(",") if t]
    try:
        args.level_list = [level_key(*parse_level(x)) for x in args.levels.split(",") if x]
        args.headline_level = level_key(*parse_level(args.headline_level))
        if args.streamed_level:
            args.streamed_level = level_key(*parse_level(args.streamed_level))
    except ValueError:
        p.error("levels look like 64:16 (connections:think_ms)")
    if args.answer_tokens < 1 or args.answer_token_delay_ms < 0:
        p.error("--answer-tokens must be >= 1 and --answer-token-delay-ms >= 0")
    if "direct" not in args.target_list:
        args.target_list.insert(0, "direct")  # the baseline for added latency
    if any(parse_level(k)[0] < 1 or parse_level(k)[1] < 0 for k in args.level_list):
        p.error("connections must be >= 1 and think time >= 0")
    if args.reps < 1 or args.duration <= 0 or args.streams < 1:
        p.error("reps, duration and streams must be positive")
    if args.headline_level not in args.level_list:
        p.error(f"--headline-level {args.headline_level} is not among --levels")
    for target in args.target_list:
        try:
            routers.parse_target(target)
        except ValueError as exc:
            p.error(str(exc))
    return args


def start_backends(args: argparse.Namespace, workdir: Path, token_delay_ms: float, tag: str):
    ports = [procs.free_port() for _ in range(args.num_backends)]
    cmd = [sys.executable, "-m", "kvfleet_bench.fake_backend", "--num-tokens", "8",
           "--token-delay-ms", str(token_delay_ms)]
    for port in ports:
        cmd += ["--port", str(port)]
    cpus = None if args.no_pin else args.client_cpu
    proc = procs.start(cmd, workdir / f"backends-{tag}.log", cpus)
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    for url in urls:
        procs.wait_until(partial(procs.http_get, f"{url}/health"), proc, "fake backend")
    return proc, urls


def load_once(args, urls: list[str], key: str, duration_s: float, workdir: Path,
              max_tokens: int | None = None) -> dict:
    """One run of the load side at a level; latency in ms, rate in req/s."""
    conns, think_ms = parse_level(key)
    tokens = args.max_tokens if max_tokens is None else max_tokens
    if args.load_kind == "wrk":
        return asdict(wrkload.run(urls, conns, think_ms, duration_s, tokens, workdir,
                                  None if args.no_pin else args.client_cpu))
    stats = asyncio.run(loadgen.closed_loop(
        [u + "/v1/completions" for u in urls],
        lambda n: loadgen.completion_body("fake-model", tokens, True, f"hello {n}"),
        True, conns, duration_s, 0.0, think_s=think_ms / 1000))
    row = asdict(stats)
    row["p90_ms"] = float("nan")  # loadgen reports p50 and p99 only
    row["connections"], row["think_ms"] = conns, think_ms
    return row


def launch_all(args, targets, backend_urls, workdir,
               launched: dict[str, routers.RouterProcess]) -> None:
    """Start every target's router into `launched` (the caller stops what started)."""
    for target in targets:
        launched[target] = routers.launch(target, backend_urls, workdir, args.router_cpu_pin,
                                          ROUTER_OPTIONS)


def phase_latency(args, targets, backend_urls, workdir) -> dict[str, Any]:
    """Every target at every level, `reps` times, interleaved (order alternating)."""
    runs: dict[str, dict[str, list[dict]]] = {t: {k: [] for k in args.level_list}
                                              for t in targets}
    launched: dict[str, routers.RouterProcess] = {}
    try:
        launch_all(args, targets, backend_urls, workdir, launched)
        for rep in range(args.reps):
            for key in args.level_list:
                # the order reverses every other repetition: no target always goes first
                for target in targets if rep % 2 == 0 else targets[::-1]:
                    row = measure(args, launched[target], key, workdir)
                    runs[target][key].append(row)
                    print_row(f"rep {rep} {key:<8} {target:<22}", row)
    finally:
        for router in launched.values():
            router.stop()
    return runs


def measure(args, router: routers.RouterProcess, key: str, workdir: Path,
            max_tokens: int | None = None) -> dict:
    """One measured load run against a router (after the warm-up), with the CPU time its
    process tree spent meanwhile."""
    if args.warmup > 0:
        load_once(args, router.urls, key, args.warmup, workdir, max_tokens)
    cpu0 = procs.cpu_seconds(router.pid) if router.pid else 0.0
    drops0 = procs.listen_drops()
    row = load_once(args, router.urls, key, args.duration, workdir, max_tokens)
    # SYNs dropped by a full listen backlog come back only after a 1 s retry
    row["listen_drops"] = procs.listen_drops() - drops0
    if router.pid:
        cpu = procs.cpu_seconds(router.pid) - cpu0
        row["router_cpu_s"] = cpu
        row["router_util"] = cpu / row["duration_s"]
        if row["num_ok"]:
            row["router_cpu_us_per_req"] = cpu / row["num_ok"] * 1e6
    return row


def print_row(label: str, row: dict) -> None:
    print(f"{label} p50 {row['p50_ms']:7.2f} ms "
          f"p99 {row['p99_ms']:7.2f} ms {row['rps']:7.0f} req/s "
          f"cpu {row.get('router_cpu_us_per_req', 0):5.0f} us/req "
          f"util {row.get('router_util', 0):4.2f} errors {row['num_errors']} "
          f"listen drops {row['listen_drops']}", flush=True)


def phase_streamed(args, targets, backend_urls, workdir) -> dict[str, list[dict]]:
    """Every target at the streamed level (answers of --answer-tokens, tokens spaced by the
    backends), `reps` times, interleaved; the order alternates by repetition."""
    runs: dict[str, list[dict]] = {t: [] for t in targets}
    launched: dict[str, routers.RouterProcess] = {}
    try:
        launch_all(args, targets, backend_urls, workdir, launched)
        for rep in range(args.reps):
            for target in targets if rep % 2 == 0 else targets[::-1]:
                row = measure(args, launched[target], args.streamed_level, workdir,
                              args.answer_tokens)
                runs[target].append(row)
                print_row(f"rep {rep} streamed {args.streamed_level:<8} {target:<22}", row)
    finally:
        for router in launched.values():
            router.stop()
    return runs


def phase_workers(args, targets, backend_urls, workdir) -> dict[str, list[dict]]:
    """N workers against one at the saturating level, both allowed the same cores
    (args.workers_cpus); one router process tree at a time, the order alternating."""
    runs: dict[str, list[dict]] = {t: [] for t in targets}
    for rep in range(args.reps):
        for target in targets if rep % 2 == 0 else targets[::-1]:
            router = routers.launch(target, backend_urls, workdir, args.workers_cpus,
                                    ROUTER_OPTIONS)
            try:
                row = measure(args, router, args.workers_level, workdir)
            finally:
                router.stop()
            runs[target].append(row)
            print_row(f"rep {rep} workers {args.workers_level:<8} {target:<22}", row)
    return runs


def summarise_streamed(runs: dict[str, list[dict]], answer_tokens: int) -> dict[str, Any]:
    """CPU per stream (and per token) per target, added stream latency against direct, and
    kvfleet's CPU ratio to each peer with the same policy, per repetition."""
    base = runs.get("direct", [])
    out: dict[str, Any] = {"per_target": {}, "cpu_ratio_same_policy": {}}
    for t, reps in runs.items():
        row: dict[str, Any] = {
            "num_errors": sum(r["num_errors"] for r in reps),
            "streams_per_s": stat([r["rps"] for r in reps]),
            "p50_ms": stat([r["p50_ms"] for r in reps]),
            "p99_ms": stat([r["p99_ms"] for r in reps]),
        }
        if t != "direct":
            row["router_cpu_us_per_stream"] = stat(
                [r.get("router_cpu_us_per_req", float("nan")) for r in reps])
            row["router_cpu_us_per_token"] = stat(
                [r.get("router_cpu_us_per_req", float("nan")) / answer_tokens for r in reps])
            row["router_util"] = stat([r.get("router_util", float("nan")) for r in reps])
            if base:
                row["added_p50_ms"] = stat([r["p50_ms"] - d["p50_ms"]
                                            for r, d in zip(reps, base, strict=True)])
        out["per_target"][t] = row
    for t, reps in runs.items():
        if not t.startswith("kvfleet"):
            continue
        policy = t.split(":", 1)[1].replace("-", "_")
        for pt, preps in runs.items():
            if pt.split(":")[0] in PEERS and pt.split(":", 1)[1] == policy:
                out["cpu_ratio_same_policy"][f"{t} / {pt}"] = stat(
                    [a.get("router_cpu_us_per_req", float("nan"))
                     / b.get("router_cpu_us_per_req", float("nan"))
                     for a, b in zip(reps, preps, strict=True)])
    out["floor_ratios"] = floor_ratios(runs)
    return out


def summarise_workers(runs: dict[str, list[dict]]) -> dict[str, Any]:
    """req/s and router CPU per target, and each N-worker target's req/s over one worker's
    in the same repetition."""
    out: dict[str, Any] = {"per_target": {}, "rps_ratio_to_one_worker": {}}
    for t, reps in runs.items():
        out["per_target"][t] = {
            "num_errors": sum(r["num_errors"] for r in reps),
            "rps": stat([r["rps"] for r in reps]),
            "p50_ms": stat([r["p50_ms"] for r in reps]),
            "router_util": stat([r.get("router_util", float("nan")) for r in reps]),
            "router_cpu_us_per_req": stat([r.get("router_cpu_us_per_req", float("nan"))
                                           for r in reps]),
        }
    one = runs.get(ONE_WORKER)
    for t, reps in runs.items():
        if one and t != ONE_WORKER:
            out["rps_ratio_to_one_worker"][t] = stat(
                [a["rps"] / b["rps"] if b["rps"] else float("nan")
                 for a, b in zip(reps, one, strict=True)])
    return out


def phase_streams(args, targets, backend_urls, workdir) -> dict[str, Any]:
    out = {}
    body = loadgen.completion_body("fake-model", args.stream_tokens, True, "hello")
    for target in targets:
        router = routers.launch(target, backend_urls, workdir, args.router_cpu_pin,
                                ROUTER_OPTIONS)
        drops0 = procs.listen_drops()
        try:
            stats = asyncio.run(
                loadgen.open_streams(
                    [u + "/v1/completions" for u in router.urls], body, args.streams,
                    ramp_s=min(2.0, args.streams / 1000), timeout_s=120.0,
                    router_pid=router.pid,
                )
            )
        finally:
            router.stop()
        out[target] = {**asdict(stats), "listen_drops": procs.listen_drops() - drops0}
        print(f"streams {target:<22} ok {stats.num_ok}/{stats.num_streams} errors "
              f"{stats.errors} peak open {stats.peak_open} RSS {stats.peak_rss_mb:.0f} MB",
              flush=True)
    return out


def summarise(runs: dict, streams: dict, levels: list[str], headline_level: str) -> dict[str, Any]:
    """Medians and spreads over repetitions, added latency against direct, the headline."""
    base = runs["direct"]
    latency: dict[str, dict[str, Any]] = {}
    for target, by_level in runs.items():
        latency[target] = {}
        for key in levels:
            reps, direct = by_level[key], base[key]
            pairs = list(zip(reps, direct, strict=True))
            row: dict[str, Any] = {
                "is_paced": is_paced(key),
                "num_errors": sum(r["num_errors"] for r in reps),
                "listen_drops": sum(r.get("listen_drops", 0) for r in reps),
            }
            for m in ("p50_ms", "p90_ms", "p99_ms", "rps", "router_cpu_us_per_req",
                      "router_util"):
                row[m] = stat([r.get(m, float("nan")) for r in reps])
            for m in ("p50_ms", "p90_ms", "p99_ms"):
                row[f"added_{m}"] = stat([r[m] - d[m] for r, d in pairs])
            row["rps_vs_direct"] = stat([r["rps"] / d["rps"] for r, d in pairs if d["rps"]])
            latency[target][key] = row
    return {"latency": latency, "streams": streams,
            "headline": headline(runs, latency, headline_level, levels)}


def headline(runs: dict, latency: dict, key: str, levels: list[str]) -> dict[str, Any]:
    """Router CPU µs per request at the headline level, the one-core ceiling it implies, and
    kvfleet's ratio to the cheapest peer, per repetition (same repetition, same machine
    state) and as the median of those."""
    cpu = {t: rows[key]["router_cpu_us_per_req"] for t, rows in latency.items()
           if t != "direct"}
    out: dict[str, Any] = {
        "level": key,
        "router_cpu_us_per_req": cpu,
        "implied_one_core_rps": {t: 1e6 / c["median"] for t, c in cpu.items() if c["median"]},
    }
    saturating = [k for k in levels if not is_paced(k)]
    if saturating:
        out["saturating_level"] = saturating[-1]
        out["saturated_rps"] = {t: rows[saturating[-1]]["rps"] for t, rows in latency.items()}
        out["saturated_router_util"] = {t: rows[saturating[-1]]["router_util"]
                                        for t, rows in latency.items() if t != "direct"}
    peers = [t for t in cpu if t.split(":")[0] in PEERS]
    mine = [t for t in cpu if t.startswith("kvfleet")]
    if peers and mine:
        ratios: dict[str, dict[str, float]] = {}
        for t in mine:
            per_rep = []
            for i, row in enumerate(runs[t][key]):
                best = min(runs[pt][key][i].get("router_cpu_us_per_req", float("inf"))
                           for pt in peers)
                per_rep.append(row.get("router_cpu_us_per_req", float("nan")) / best)
            ratios[t] = stat(per_rep)
        out["cpu_ratio_to_cheapest_peer"] = ratios
        # like for like: kvfleet's cache-aware against the peers' cache_aware, round-robin
        # against round_robin, per repetition
        same: dict[str, dict[str, float]] = {}
        for t in mine:
            policy = t.split(":", 1)[1].replace("-", "_")
            for pt in peers:
                if pt.split(":", 1)[1] != policy:
                    continue
                per_rep = [a.get("router_cpu_us_per_req", float("nan"))
                           / b.get("router_cpu_us_per_req", float("nan"))
                           for a, b in zip(runs[t][key], runs[pt][key], strict=True)]
                same[f"{t} / {pt}"] = stat(per_rep)
        out["cpu_ratio_same_policy"] = same
    out["floor_ratios"] = floor_ratios({t: reps[key] for t, reps in runs.items()})
    return out


def floor_ratios(runs: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """The bare aiohttp proxy's CPU per request over each peer's and each one-process
    kvfleet router's over the floor, per repetition: how much of a CPU target the stack
    alone already takes, and how much kvfleet's own work adds."""
    floor = next((t for t in runs if t.split(":")[0] == FLOOR), None)
    if floor is None:
        return {}
    pairs = [(floor, t) for t in runs if t.split(":")[0] in PEERS]
    pairs += [(t, floor) for t in runs if t.split(":")[0] == "kvfleet"]
    return {f"{a} / {b}": stat([x.get("router_cpu_us_per_req", float("nan"))
                                / y.get("router_cpu_us_per_req", float("nan"))
                                for x, y in zip(runs[a], runs[b], strict=True)])
            for a, b in pairs}


def plot(summary: dict, levels: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = [t for t in summary["latency"] if t != "direct"]
    head = summary["headline"]
    paced = [k for k in levels if is_paced(k)]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    cpu = [head["router_cpu_us_per_req"][t] for t in targets]
    err = [[c["median"] - c["min"] for c in cpu], [c["max"] - c["median"] for c in cpu]]
    axes[0].barh(targets, [c["median"] for c in cpu], xerr=err)
    axes[0].set_title(f"router CPU µs per request at {head['level']} (conns:think ms)")
    width = 0.8 / max(1, len(targets))
    for i, target in enumerate(targets):
        rows = summary["latency"][target]
        xs = [j + i * width for j in range(len(paced))]
        axes[1].bar(xs, [rows[k]["added_p50_ms"]["median"] for k in paced], width, label=target)
    axes[1].set_xticks([j + 0.4 - width / 2 for j in range(len(paced))], paced)
    axes[1].set_xlabel("paced level (connections:think ms)")
    axes[1].set_title("added p50 latency (ms), unsaturated levels")
    axes[1].legend(fontsize=7)
    if "saturated_rps" in head:
        names = list(head["saturated_rps"])
        axes[2].barh(names, [head["saturated_rps"][t]["median"] for t in names])
        axes[2].set_title(f"req/s at the closed loop {head['saturating_level']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine_info() -> dict[str, Any]:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {"cpu": model, "num_cpus": os.cpu_count(), "loadavg": os.getloadavg()}


def render(path: Path) -> int:
    result = json.loads(path.read_text())
    meta = result["meta"]
    head_level = result.get("headline", {}).get("level", HEADLINE_LEVEL)
    result.update(summarise(result["runs"], result["streams"], meta["levels"], head_level))
    if result.get("runs_streamed"):
        result["streamed"] = {**result["streamed"], **summarise_streamed(
            result["runs_streamed"], meta["answer_tokens"])}
    if result.get("runs_workers"):
        result["workers"] = {**result["workers"], **summarise_workers(result["runs_workers"])}
    path.write_text(json.dumps(result, indent=1))
    text = results_markdown(result)
    path.with_suffix(".md").write_text(text + "\n")
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.render:
        return render(Path(args.render))
    loadgen.install_uvloop()
    cpus = procs.usable_cpus()
    can_pin = not args.no_pin and len(cpus) >= 2
    args.router_cpu_pin = args.router_cpu if can_pin else None
    if can_pin:
        os.sched_setaffinity(0, {int(args.client_cpu)})
    else:
        args.no_pin = True
    has_wrk, wrk_note = wrkload.available()
    if args.load == "wrk" and not has_wrk:
        print(f"--load wrk: {wrk_note}", file=sys.stderr)
        return 2
    args.load_kind = "wrk" if args.load == "wrk" or (args.load == "auto" and has_wrk) \
        else "python"
    load_desc = (f"{wrk_note} with TCP_QUICKACK shim" if args.load_kind == "wrk"
                 else "loadgen.py (Python, aiohttp + uvloop)")
    print(f"load side: {load_desc}", flush=True)
    available, skipped = routers.available_targets(args.target_list)
    for target, why in skipped.items():
        print(f"skip {target}: {why}", flush=True)
    targets = [t for t in available if routers.parse_target(t)[0] not in WORKER_TARGETS]
    worker_targets = [t for t in available if t not in targets]
    saturating = [k for k in args.level_list if not is_paced(k)]
    args.workers_level = saturating[-1] if saturating else ""
    if worker_targets and not args.workers_level:
        print("skip the workers phase: no saturating level (connections:0) in --levels",
              flush=True)
        worker_targets = []
    if worker_targets and ONE_WORKER not in worker_targets:
        worker_targets.insert(0, ONE_WORKER)  # the baseline of the req/s ratio
    args.workers_cpus = None if args.no_pin else f"{args.router_cpu},{args.client_cpu}"
    started = time.time()
    runs_streamed: dict[str, list[dict]] = {}
    runs_workers: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="kvfleet-bench-") as tmp:
        workdir = Path(tmp)
        backends, urls = start_backends(args, workdir, 0.0, "fast")
        try:
            runs = phase_latency(args, targets, urls, workdir)
            if worker_targets:
                runs_workers = phase_workers(args, worker_targets, urls, workdir)
        finally:
            procs.stop(backends)
        if args.streamed_level:
            backends, urls = start_backends(args, workdir, args.answer_token_delay_ms,
                                            "streamed")
            try:
                runs_streamed = phase_streamed(args, targets, urls, workdir)
            finally:
                procs.stop(backends)
        backends, urls = start_backends(args, workdir, args.stream_token_delay_ms, "slow")
        try:
            streams = phase_streams(args, targets, urls, workdir)
        finally:
            procs.stop(backends)
    summary = summarise(runs, streams, args.level_list, args.headline_level)
    result = {
        "meta": {
            "command": "python bench/router_overhead.py " + " ".join(argv or sys.argv[1:]),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "wall_s": time.time() - started,
            "is_pinned": not args.no_pin,
            "load": load_desc,
            "machine": machine_info(),
            "levels": args.level_list,
            "reps": args.reps,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "num_backends": args.num_backends,
            "streams": args.streams,
            "stream_tokens": args.stream_tokens,
            "stream_token_delay_ms": args.stream_token_delay_ms,
            "skipped": skipped,
            "streamed_level": args.streamed_level,
            "answer_tokens": args.answer_tokens,
            "answer_token_delay_ms": args.answer_token_delay_ms,
        },
        **summary,
        "runs": runs,
    }
    if runs_streamed:
        result["streamed"] = {"level": args.streamed_level, "answer_tokens": args.answer_tokens,
                              "token_delay_ms": args.answer_token_delay_ms,
                              **summarise_streamed(runs_streamed, args.answer_tokens)}
        result["runs_streamed"] = runs_streamed
    if runs_workers:
        result["workers"] = {
            "level": args.workers_level, "router_cpus": args.workers_cpus,
            "note": ("every router in this phase is allowed the same cores "
                     f"({args.workers_cpus or 'all, unpinned'}); the load side and the "
                     "backends share them, so the rows include that contention"),
            **summarise_workers(runs_workers)}
        result["runs_workers"] = runs_workers
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    text = results_markdown(result)
    out.with_suffix(".md").write_text(text + "\n")
    if not args.no_plot:
        plot(summary, args.level_list, out.with_suffix(".png"))
    print(text)
    print(f"wrote {out} (+ .md, .png)")
    refresh_section("router_overhead", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
