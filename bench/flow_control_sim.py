"""Flow control in the simulator (issue 28's acceptance "in the simulator with the same
code"): bench/flow_control.py's isolation, fair-share and priority scenarios replayed in
virtual time by `kvfleet sim`'s fleet, whose router holds and admits requests with the
router's own flow-control code (kvfleet_router.flow: FairQueue, AttainedService, FlowGate)
and whose engine is kvfleet's real scheduler, which orders and preempts by the priority
the router gives it.

The pool (sim/pools/flow-bench.yaml): one engine with the simulated runner on the live
bench's made-up slow profile (sim/pools/profiles/flow-bench.json: every step 20 ms plus
50 µs per prompt token computed), `max_num_seqs` 4; the router's in-flight cap per
endpoint `--capacity` (4 as in the live bench's main run, and 8, twice the batch, as the
operator sets it). Requests: 256 prompt tokens, 16 output tokens, Poisson arrivals
(open loop), each tenant its own stream of the seed.

1. isolation: tenant A alone at `--rate` req/s, then beside tenant B at `--flood-factor`
   times that (equal weight, one band); A's arrivals are the same in both runs. A's TTFT
   p90 flood / alone (target <= 1.25x), A loses nothing.
2. fair shares: four backlogged tenants of weights 1, 1, 2, 4, each sending
   `--fair-rate` req/s (far past the pool's capacity; queue TTL 30 s and a queue deep
   enough that no tenant is ever turned away for room, so all four stay backlogged, as
   the live bench's closed-loop clients do): each one's share of the served tokens against
   its weight's (target within 10%), Jain's index between the two of weight 1 (>= 0.95).
3. priorities: a critical tenant at `--rate`, alone then beside a sheddable flood at
   `--flood-factor` times that: its TTFT p99 ratio (target <= 1.25x); the sheddable
   tenant's served tokens against the pool's capacity (from 2) less critical's.

Each run has `--warmup-s` unmeasured, then `--measure-s` measured (latency by arrival,
throughput by end, as kvfleet_bench.flow_stats measures the live runs: each simulated
request becomes the live client's Outcome, 429/503 with the router's reason when flow
control refused it). Figures are medians (min–max) over `--seeds`. Virtual time is
cheap, so `--measure-s` is 300 s: a p90 and a p99 of ~450 TTFTs, not of the ~30 that
20 s gives (sampling noise, not the flow control, set the spread of 20 s runs).

    flock /tmp/kvfleet-cpu.lock .venv/bin/python bench/flow_control_sim.py   # ~45 s
    .venv/bin/python bench/flow_control_sim.py --fairness off --out /tmp/unfair.json
        # every request one tenant's (FCFS): the broken case
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kvfleet_bench import flow_stats, procs
from kvfleet_bench.cache_replay import git_state
from kvfleet_bench.flow_client import Outcome
from kvfleet_bench.flow_stats import FAIR_WEIGHTS, TARGETS
from kvfleet_bench.readme import refresh_section
from kvfleet_operator.api.pool import parse_pool
from kvfleet_sim.fleet import FleetSim, SimResult, SimSettings
from kvfleet_sim.scalers import SCALERS
from kvfleet_sim.trace import TraceRequest

ROOT = Path(__file__).resolve().parents[1]
POOL = ROOT / "sim" / "pools" / "flow-bench.yaml"
PROFILE = ROOT / "sim" / "pools" / "profiles" / "flow-bench.json"
SCENARIOS = ("isolation", "fair", "priority")
NO_ENDPOINT = "no-endpoint"  # the one refusal the router answers with 503


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--warmup-s", type=float, default=5.0)
    p.add_argument("--measure-s", type=float, default=300.0)
    p.add_argument("--capacities", default="4,8",
                   help="router in-flight caps per endpoint to run (the first is the main run)")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--rate", type=float, default=1.5, help="tenant A's (and critical's) req/s")
    p.add_argument("--flood-factor", type=float, default=10.0)
    p.add_argument("--fair-rate", type=float, default=10.0, help="each fair tenant's req/s")
    p.add_argument("--queue-ttl-s", type=float, default=5.0)
    p.add_argument("--fairness", choices=("on", "off"), default="on",
                   help="off: every request is the default tenant's (FCFS): the broken case")
    p.add_argument("--out", default=str(procs.RESULTS_DIR / "flow_control_sim.json"))
    args = p.parse_args(argv)
    args.scenario_list = [s for s in args.scenarios.split(",") if s]
    if bad := [s for s in args.scenario_list if s not in SCENARIOS]:
        p.error(f"unknown scenario(s) {', '.join(bad)}; choose from {', '.join(SCENARIOS)}")
    try:
        args.capacity_list = [int(c) for c in args.capacities.split(",") if c]
    except ValueError:
        p.error(f"--capacities must be integers separated by commas, got {args.capacities!r}")
    if not args.capacity_list or min(args.capacity_list) < 1:
        p.error("--capacities must name at least one cap, each >= 1")
    if min(args.seeds, args.prompt_tokens, args.max_tokens) < 1:
        p.error("--seeds, --prompt-tokens and --max-tokens must be >= 1")
    if min(args.measure_s, args.rate, args.flood_factor, args.fair_rate) <= 0 \
            or min(args.warmup_s, args.queue_ttl_s) < 0:
        p.error("durations and rates must be positive")
    return args


def pool(flow: dict[str, Any]) -> Any:
    """flow-bench.yaml with `flow` merged into its routing.flowControl."""
    manifest = yaml.safe_load(POOL.read_text(encoding="utf-8"))
    manifest["spec"]["routing"]["flowControl"].update(flow)
    return parse_pool(manifest)


def poisson(args, tenant: str, rate: float, seed: int) -> list[TraceRequest]:
    """A tenant's open-loop arrivals over the run, its own stream of `seed`."""
    rng = random.Random(f"{seed}:{tenant}")
    end, t, out = args.warmup_s + args.measure_s, 0.0, []
    while (t := t + rng.expovariate(rate)) < end:
        out.append(TraceRequest(t, args.prompt_tokens, args.max_tokens,
                                tenant=tenant if args.fairness == "on" else "default"))
    return out


def outcomes(result: SimResult, tenant_of: dict[str, str]) -> list[Outcome]:
    """The live client's view of each simulated request: 200 with its TTFT and tokens, or
    429/503 with the router's reason, or a loss (status 0: cut off by a replica's end)."""
    out = []
    for f in result.finished:
        tenant = tenant_of[f.request_id]
        if f.refusal:
            status = 503 if f.refusal == NO_ENDPOINT else 429
            out.append(Outcome(tenant, f.arrival, f.finished, status=status, reason=f.refusal))
        elif f.is_aborted:
            out.append(Outcome(tenant, f.arrival, f.finished, reason="cut off"))
        else:
            out.append(Outcome(tenant, f.arrival, f.finished, f.first_token - f.arrival, 200,
                               num_prompt_tokens=f.num_prompt_tokens,
                               num_completion_tokens=f.num_output_tokens))
    return out


def run(args, capacity: int, streams: list[list[TraceRequest]], names: list[str],
        flow: dict[str, Any]) -> dict[str, Any]:
    """One simulated run of the merged streams; flow_stats' summary by tenant name (the
    stream's name, also with --fairness off, when the router sees one tenant)."""
    trace: list[tuple[TraceRequest, str]] = sorted(
        ((r, name) for stream, name in zip(streams, names, strict=True) for r in stream),
        key=lambda x: x[0].t)
    p = pool({"queueTtlSeconds": args.queue_ttl_s, **flow})
    sim = FleetSim(p, SCALERS["fixed-max"](p.spec),
                   SimSettings(startup_s=0.0, replica_profiles=(str(PROFILE),),
                               endpoint_capacity=capacity))
    result = sim.run([r for r, _ in trace])
    tenant_of = {f"q{i}": name for i, (_, name) in enumerate(trace)}
    summary = flow_stats.summarise(outcomes(result, tenant_of), args.warmup_s,
                                   args.warmup_s + args.measure_s)
    summary["refusals"] = result.refusals
    return summary


def isolation(args, capacity: int, seed: int) -> dict[str, Any]:
    a = poisson(args, "A", args.rate, seed)
    out = {"alone": run(args, capacity, [a], ["A"], {}),
           "flood": run(args, capacity, [a, poisson(args, "B", args.rate * args.flood_factor,
                                                    seed)], ["A", "B"], {})}
    a_alone, a_flood = out["alone"]["tenants"]["A"], out["flood"]["tenants"]["A"]
    out["ttft_p90_ratio"] = a_flood["ttft_p90_ms"] / a_alone["ttft_p90_ms"]
    out["a_lost"] = a_flood["num_requests"] - a_flood["num_ok"]
    return out


def fair(args, capacity: int, seed: int) -> dict[str, Any]:
    tenants = [{"name": t, "weight": w} for t, w in FAIR_WEIGHTS.items()]
    streams = [poisson(args, t, args.fair_rate, seed) for t in FAIR_WEIGHTS]
    summary = run(args, capacity, streams, list(FAIR_WEIGHTS),
                  {"tenants": tenants, "queueTtlSeconds": 30.0, "maxQueued": 100_000})
    served = {t: s["served_tokens"] for t, s in summary["tenants"].items()}
    return {"run": summary, "shares": flow_stats.weighted_shares(served, FAIR_WEIGHTS),
            "capacity_tokens_per_s": summary["served_tokens_per_s"]}


def priority(args, capacity: int, seed: int, capacity_tps: float | None) -> dict[str, Any]:
    flow = {"tenants": [{"name": "crit", "band": "critical"},
                        {"name": "shed", "band": "sheddable"}]}
    crit = poisson(args, "crit", args.rate, seed)
    out: dict[str, Any] = {
        "alone": run(args, capacity, [crit], ["crit"], flow),
        "flood": run(args, capacity, [crit, poisson(args, "shed", args.rate * args.flood_factor,
                                                    seed)], ["crit", "shed"], flow)}
    crit_alone, crit_flood = out["alone"]["tenants"]["crit"], out["flood"]["tenants"]["crit"]
    out["ttft_p99_ratio"] = crit_flood["ttft_p99_ms"] / crit_alone["ttft_p99_ms"]
    out["crit_lost"] = crit_flood["num_requests"] - crit_flood["num_ok"]
    shed = out["flood"]["tenants"]["shed"]["served_tokens_per_s"]
    if capacity_tps:
        left = capacity_tps - crit_flood["served_tokens_per_s"]
        out["shed_of_capacity_left"] = shed / left if left > 0 else float("nan")
    return out


def figures(reps: dict[str, list[dict]]) -> dict[str, Any]:
    """Medians with spread over seeds, and each target met or not (the live bench's)."""
    f: dict[str, Any] = {}
    if rows := reps.get("isolation"):
        f["isolation"] = flow_stats.isolation_figures(rows) | {
            "b_refused": sum(r["flood"]["tenants"]["B"]["num_refused"] for r in rows)}
    if rows := reps.get("fair"):
        f["fair"] = flow_stats.fair_figures(rows)
    if rows := reps.get("priority"):
        f["priority"] = flow_stats.priority_figures(rows)
    return f


def num_unexplained(reps: dict[str, list[dict]]) -> int:
    """Requests neither served nor refused with 429/503 and a reason, in every run."""
    total = 0
    for name, rows in reps.items():
        for r in rows:
            runs = [r["run"]] if name == "fair" else [r["alone"], r["flood"]]
            total += sum(x["num_unexplained"] for x in runs)
    return total


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started, cpu0 = time.time(), time.process_time()
    by_cap: dict[str, Any] = {}
    for capacity in args.capacity_list:
        reps: dict[str, list[dict]] = {s: [] for s in args.scenario_list}
        for seed in range(args.seeds):
            capacity_tps = None
            for name in args.scenario_list:
                if name == "isolation":
                    row = isolation(args, capacity, seed)
                    note = f"A p90 ratio {row['ttft_p90_ratio']:.2f}, A lost {row['a_lost']}"
                elif name == "fair":
                    row = fair(args, capacity, seed)
                    capacity_tps = row["capacity_tokens_per_s"]
                    note = (f"max rel error {row['shares']['max_rel_error']:.3f}, jain "
                            f"{row['shares']['jain_equal_weight']['1']:.3f}")
                else:
                    row = priority(args, capacity, seed, capacity_tps)
                    note = f"crit p99 ratio {row['ttft_p99_ratio']:.2f}"
                reps[name].append(row)
                print(f"cap {capacity} seed {seed} {name:<9} {note}", flush=True)
        by_cap[str(capacity)] = {"figures": figures(reps), "num_unexplained": num_unexplained(reps),
                                 "reps": reps}
    command = "python bench/flow_control_sim.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    result = {
        "meta": {
            "command": command,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "wall_s": time.time() - started,
            "cpu_s": time.process_time() - cpu0,
            "git": git_state(),
            "args": {k: v for k, v in vars(args).items()
                     if k not in ("scenario_list", "capacity_list")},
            "capacities": args.capacity_list,
            "pool": str(POOL.relative_to(ROOT)),
            "engine_profile": json.loads(PROFILE.read_text(encoding="utf-8")),
            "targets": TARGETS,
        },
        "by_capacity": by_cap,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({c: r["figures"] for c, r in by_cap.items()}, indent=1))
    print("requests neither served nor refused with a reason: "
          f"{sum(r['num_unexplained'] for r in by_cap.values())}")
    print(f"wrote {out}")
    refresh_section("flow_control_sim", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
