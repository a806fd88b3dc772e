"""Fleet-wide KV in the simulator: routing with and without peer prefix fetch at 64
replicas on the h100-llama3-8b profile; then a bandwidth sweep.

    .venv/bin/python bench/sim_kv_pool.py --jobs 2   # the figures in bench/README.md, ~15 min
    .venv/bin/python bench/sim_kv_pool.py --replicas 8 --duration-s 60 --sweep 1,10 --seeds 1

Every run is the simulator (sim/kvfleet_sim: real engine scheduler and prefix-cached KV per
replica, the router's RouterCore with its precise index fed by the engines' KV events, the
operator's control loop) over the same Mooncake slice, fixed at `--replicas` replicas
(sim/pools/h100-llama3-8b-16.yaml with its replica count pinned, `prefixMode: precise`).
The trace is time-compressed (`--compress`) until the load is high enough for the
imbalance guard to send requests away from the replica that holds their prefix; the
"guard-balanced" column counts those decisions (the policy's `balanced` reason).

* comparison, at `--gbytes-per-s` and `--latency-ms` per fetch, for each of `--policies`
  without and with `routing.kvSharing` (the router's own `decide_peer_hint`, margin 1.5):
  kvfleet's cache-aware (its default weights, prefix 1 / queue 4), `sgl-cache-aware`
  (prefix affinity only, sgl-router's guard: the guard alone spreads load; the simulator's
  `--policy sgl-cache-aware`) and round-robin; prefix tokens reused (local hits / fetched
  from peers), TTFT p50/p90, output throughput, KV bytes moved;
* sweep: `--sweep-policy` with kvSharing at each bandwidth of `--sweep` (GB/s), TTFT p90
  (and p50) with fetch over without, against bandwidth (log x): where the ratio reaches 1,
  fetching stops paying off.

Each case runs with router seeds 0..`--seeds`-1 (the picker's tie-breaks); figures are the
medians, and the per-seed p90 ratios are listed. Results: bench/results/sim_kv_pool.json,
.md and .png.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import textwrap
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kvfleet_bench.procs import REPO_DIR as ROOT
from kvfleet_bench.readme import refresh_section
from kvfleet_bench.report import write_report
from kvfleet_bench.sections.sim_kv_pool import comparison_table, gain_line, sweep_table

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
POOL = ROOT / "sim" / "pools" / "h100-llama3-8b-16.yaml"
RESULTS = ROOT / "bench" / "results"
TTFT_SLO_S, ITL_SLO_S = 2.0, 0.05  # the pool's targets


@dataclass(frozen=True, slots=True)
class Case:
    label: str
    policy: str
    sharing: bool
    gbytes_per_s: float
    latency_ms: float
    seed: int = 0


def pool_doc(replicas: int, policy: str, sharing: bool) -> dict[str, Any]:
    m = yaml.safe_load(POOL.read_text())
    spec = m["spec"]
    m["metadata"]["name"] = f"h100-llama3-8b-{replicas}"
    spec["topology"]["unified"]["replicas"] = {"min": replicas, "max": replicas}
    spec["routing"].update(policy=policy, prefixMode="precise",
                           kvSharing={"enabled": sharing, "margin": 1.5})
    if policy == "sgl-cache-aware":  # kvfleet_sim.run's override: prefix only, sgl's guard
        spec["routing"].update(policy="cache-aware",
                               weights={"prefix": 1.0, "queue": 0.0, "kv": 0.0},
                               imbalance={"absThreshold": 32, "relThreshold": 1.0001})
    return m


def run_case(case: Case, args: dict[str, Any]) -> dict[str, Any]:
    """One replay; its summary and what the comparison reports."""
    from kvfleet_operator.api import parse_pool
    from kvfleet_sim.fleet import FleetSim, SimSettings
    from kvfleet_sim.report import summarize
    from kvfleet_sim.run import load_slice
    from kvfleet_sim.scalers import SCALERS

    pool = parse_pool(pool_doc(args["replicas"], case.policy, case.sharing))
    compress = args["compress"]
    trace = load_slice(str(TRACE), args["start_s"], args["duration_s"], args["warmup_s"],
                       compress, 1.0)
    start, end = args["warmup_s"] / compress, (args["warmup_s"] + args["duration_s"]) / compress
    settings = SimSettings(seed=case.seed, measure_from_s=start,
                           peer_bytes_per_s=case.gbytes_per_s * 1e9,
                           peer_latency_s=case.latency_ms / 1000)
    t0 = time.perf_counter()
    sim = FleetSim(pool, SCALERS["fixed-max"](pool.spec), settings)
    result = sim.run(trace)
    wall = time.perf_counter() - t0
    s = summarize(case.label, result, TTFT_SLO_S, ITL_SLO_S, start, end)
    measured = [f for f in result.finished if start <= f.arrival < end and not f.is_aborted]
    last = max((f.finished for f in measured), default=end)
    out_tokens = sum(f.num_output_tokens for f in measured)
    queried, hit = result.prefix_tokens
    peer = s.peer or {}
    return {
        "case": case.label, "policy": case.policy, "kv_sharing": case.sharing,
        "gbytes_per_s": case.gbytes_per_s, "latency_ms": case.latency_ms, "seed": case.seed,
        "num_requests": s.num_requests, "num_failed": s.num_failed,
        "ttft_p50_s": s.ttft_p50_s, "ttft_p90_s": s.ttft_p90_s, "ttft_p99_s": s.ttft_p99_s,
        "e2e_p50_s": s.e2e_p50_s, "slo_attainment": s.slo_attainment,
        "output_tokens_per_s": out_tokens / (last - start) if last > start else 0.0,
        "requests_per_s": len(measured) / (last - start) if last > start else 0.0,
        "prefix_tokens_queried": queried,
        "prefix_tokens_local": peer.get("prefix_tokens_local", hit),
        "prefix_tokens_fetched": peer.get("prefix_tokens_fetched", 0),
        "bytes_moved": peer.get("bytes_moved", 0),
        "hints": peer.get("hints", {}), "fetches": peer.get("fetches", {}),
        "hints_by_decision": peer.get("hints_by_decision", {}),
        "fetch_mean_s": peer.get("fetch_mean_s", 0.0),
        "imbalance_mean": s.imbalance_mean, "imbalance_p90": s.imbalance_p90,
        "wall_s": wall,
    }


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One case over its seeds: the median of every figure (and of every count in the
    hint and outcome tables), with each seed's own row kept under `seeds`."""
    out: dict[str, Any] = {}
    for k, v in rows[0].items():
        if isinstance(v, bool) or not isinstance(v, int | float | dict):
            out[k] = v
        elif isinstance(v, dict):
            keys = sorted({key for r in rows for key in r[k]})
            out[k] = {key: statistics.median(r[k].get(key, 0) for r in rows) for key in keys}
        else:
            out[k] = statistics.median(r[k] for r in rows)
    out["seeds"] = rows
    return out


def plot_sweep(path: Path, base: dict[str, Any], rows: list[dict[str, Any]],
               title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["gbytes_per_s"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(xs, [r["ttft_p90_s"] / base["ttft_p90_s"] for r in rows], "o-",
            label="TTFT p90, with fetch / without")
    ax.plot(xs, [r["ttft_p50_s"] / base["ttft_p50_s"] for r in rows], "s--", alpha=0.7,
            label="TTFT p50, with fetch / without")
    ax.axhline(1.0, color="grey", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("peer link bandwidth (GB/s)")
    ax.set_ylabel("ratio (below 1: fetching pays off)")
    ax2 = ax.twinx()
    ax2.bar(xs, [r["prefix_tokens_fetched"] / max(1, r["prefix_tokens_queried"]) for r in rows],
            width=[x * 0.25 for x in xs], alpha=0.25, color="tab:green",
            label="prompt tokens fetched (share)")
    ax2.set_ylabel("prompt tokens fetched / looked up")
    lines = ax.get_legend_handles_labels()
    bars = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + bars[0], lines[1] + bars[1], loc="best", fontsize=8)
    ax.set_title(textwrap.fill(title, 100), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=64)
    p.add_argument("--start-s", type=float, default=600.0, help="slice start in the trace")
    p.add_argument("--warmup-s", type=float, default=60.0, help="trace seconds, not measured")
    p.add_argument("--duration-s", type=float, default=240.0, help="measured trace seconds")
    p.add_argument("--compress", type=float, default=16.0, help="time compression")
    p.add_argument("--gbytes-per-s", type=float, default=12.5,
                   help="the peer link of the comparison (100 Gb/s)")
    p.add_argument("--latency-ms", type=float, default=2.0, help="fixed cost per fetch")
    p.add_argument("--sweep", default="0.05,0.1,0.3,1,3,12.5,50",
                   help="bandwidths (GB/s) for the crossover plot")
    p.add_argument("--policies", default="cache-aware,sgl-cache-aware,round-robin",
                   help="each without and with kvSharing")
    p.add_argument("--sweep-policy", default="sgl-cache-aware",
                   help="the policy of the bandwidth sweep")
    p.add_argument("--seeds", type=int, default=5, help="router seeds per case (medians)")
    p.add_argument("--jobs", type=int, default=1, help="replays side by side")
    p.add_argument("--out", default=str(RESULTS / "sim_kv_pool.json"))
    args = p.parse_args()
    sweep = [float(x) for x in args.sweep.split(",") if x]
    conf = {k: getattr(args, k) for k in ("replicas", "start_s", "warmup_s", "duration_s",
                                          "compress")}
    bw, lat = args.gbytes_per_s, args.latency_ms
    policies = [x for x in args.policies.split(",") if x]
    if args.sweep_policy not in policies:
        p.error("--sweep-policy must be one of --policies")
    cases = [Case(f"{pol} + peer fetch" if on else pol, pol, on, bw, lat)
             for pol in policies for on in (False, True)]
    cases += [Case(f"{args.sweep_policy} + peer fetch at {g:g} GB/s", args.sweep_policy, True,
                   g, lat) for g in sweep if g != bw]
    seeded = [dataclasses.replace(c, seed=k) for c in cases for k in range(args.seeds)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        futures = [ex.submit(run_case, c, conf) for c in seeded]
        done = []
        for c, f in zip(seeded, futures, strict=True):
            done.append(f.result())
            print(f"{c.label} seed {c.seed}: {done[-1]['wall_s']:.0f} s wall", flush=True)
    rows = [median_row(done[i * args.seeds:(i + 1) * args.seeds]) for i in range(len(cases))]
    pairs = {pol: (rows[2 * i], rows[2 * i + 1]) for i, pol in enumerate(policies)}
    base, with_fetch = pairs[args.sweep_policy]
    by_bw = {r["gbytes_per_s"]: r for r in rows[2 * len(policies):]}
    by_bw[bw] = with_fetch
    swept = [by_bw[g] for g in sorted(set(sweep) | {bw})]
    where = (f"{args.replicas} replicas (h100-llama3-8b, fixed), Mooncake trace "
             f"[{args.start_s:g}, {args.start_s + args.duration_s:g}) s after "
             f"{args.warmup_s:g} s of warm-up, compressed {args.compress:g}x; "
             f"{lat:g} ms per fetch; medians over router seeds 0-{args.seeds - 1}")
    text = "\n\n".join([
        f"Simulator, {where}.",
        f"Comparison at {bw:g} GB/s:\n\n" + comparison_table(rows[:2 * len(policies)]),
        "\n".join(gain_line(pol, off, on) for pol, (off, on) in pairs.items()),
        f"Bandwidth sweep ({args.sweep_policy} with kvSharing over {args.sweep_policy} "
        "alone):\n\n" + sweep_table(base, swept),
        f"({len(done)} replays in {time.perf_counter() - t0:.0f} s wall, --jobs {args.jobs})",
    ])
    out = Path(args.out)
    write_report(out, {"args": vars(args), "comparison": rows[:2 * len(policies)],
                       "sweep": swept}, text)
    plot_sweep(out.with_suffix(".png"), base, swept,
               f"{args.sweep_policy} + peer fetch: {where}")
    print(text)
    print(f"wrote {out}, {out.with_suffix('.md')}, {out.with_suffix('.png')}")
    refresh_section("sim_kv_pool", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
