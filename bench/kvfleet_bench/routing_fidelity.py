"""Simulator fidelity for routing (issue 26, item 4): `bench/sim_fidelity.py --routing`.

The same requests, the same backends and the same pacing, two ways:
- live: bench/router_cache_hits.py's replay (`cache_replay`): N fake backends with
  LRU-bounded prefix caches, one router process in front of them at a time (kvfleet's
  router at each policy, the real sglang-router at its defaults), a Mooncake slice sent
  open-loop at its compressed arrival times; the backends count the hits;
- sim: `kvfleet sim`'s fleet (`kvfleet_sim.run.build_sim`, the real `RouterCore` behind
  the operator's own router config) over the same slice, each replica modelling the fake
  backend (`kvfleet_sim.fake_backend`: the same LRU bound in blocks, the same time per
  missed block and per output token, no batching); sglang-router is modelled by
  `kvfleet_sim.sgl_rule`. Several seeds (the routers' random tie-breaks).

A hash id is `block_chars` characters of text live, which kvfleet's router hashes as
`block_chars` bytes; in the simulator it is `block_chars / 8` token ids, which the router
packs into 8 bytes each: the same bytes per block, so the prefix index holds as many
blocks of prompt either way.

Reported per policy: the hit fraction both ways (live: median and min-max over
repetitions; sim: median and min-max over seeds), the relative gap (sim - live) / live,
backends per shared prefix, and the ranking of the policies by hit fraction both ways.
Live rows also carry the LRU model replayed on the routes the router took:
`hit_fraction_on_routes_in_arrival_order`, each backend seeing its requests in the order
they reached it (the fake's response ids number them), which the backends' counts equal
exactly (None where a router rewrote the ids), and `hit_fraction_on_routes_in_trace_order`,
each backend seeing them in trace order. The two differ by the reordering concurrent sends
bring (a few ms apart, they swap on a busy machine); where the live hit fraction differs
from the simulator's on a policy whose routes depend only on order (round-robin), that
reordering, not the cache model, is why.
Rankings disagree when two policies are ordered differently by their medians and at
least one side separates them (its min-max ranges do not overlap); two policies within
each side's spread are a tie, whatever the order of their medians. Fails (exit 1) when a
gap exceeds the tolerance or the rankings disagree.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from array import array
from collections import Counter
from itertools import combinations
from pathlib import Path
from typing import Any

from kvfleet_bench import load_stats, loadgen, procs, routers
from kvfleet_bench import traces as trace_mooncake
from kvfleet_bench.cache_replay import (
    add_scenario_args,
    git_state,
    pin_client,
    pooled_reference,
    quick_scenario,
    run_target,
    start_backends,
)
from kvfleet_bench.procs import RESULTS_DIR

# (live target, simulator policy): kvfleet's policies both ways; sglang-router live
# against its model in the simulator
PAIRS = (
    ("kvfleet:cache-aware", "cache-aware"),
    ("kvfleet:least-request", "least-request"),
    ("kvfleet:round-robin", "round-robin"),
    ("sglang:cache_aware", "sgl-cache-aware"),
)
TOKEN_BYTES = array("q").itemsize  # how kvfleet's router packs a token-id prompt
POOL = procs.REPO_DIR / "sim" / "pools" / "fake-backends.yaml"
OUT = RESULTS_DIR / "sim_routing_fidelity.json"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sim_fidelity.py --routing", description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--targets", default=",".join(t for t, _ in PAIRS),
                   help="live targets, each paired with its simulator policy (PAIRS)")
    add_scenario_args(p, "live repetitions")
    p.add_argument("--sim-seeds", type=int, default=21,
                   help="simulator seeds (about a second each)")
    p.add_argument("--step-ms", type=float, default=1.0,
                   help="the simulated fake backend's longest step, virtual ms")
    p.add_argument("--tolerance", type=float, default=0.10, help="relative, on hit fraction")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--quick", action="store_true", help="seconds; what tests/bench runs")
    args = p.parse_args(argv)
    if args.quick:  # router_cache_hits.py --quick's slice and sizes
        quick_scenario(args)
        args.reps, args.sim_seeds = 1, 2
    pairs = dict(PAIRS)
    args.target_list = [t for t in args.targets.split(",") if t]
    unknown = [t for t in args.target_list if t not in pairs]
    if unknown or not args.target_list:
        p.error(f"targets must be among {', '.join(pairs)}")
    if min(args.num_requests, args.num_backends, args.cache_blocks, args.reps,
           args.sim_seeds) < 1 or args.step_ms <= 0:
        p.error("counts and --step-ms must be positive")
    if args.block_chars % TOKEN_BYTES or args.block_chars < TOKEN_BYTES:
        p.error(f"--block-chars must be a multiple of {TOKEN_BYTES} (the simulator's token "
                f"ids are {TOKEN_BYTES} bytes each to the router)")
    args.size_kvfleet_prefix = False  # every router at its shipped defaults
    return args


# --- the simulator side ------------------------------------------------------------------


def sim_trace(requests: list[trace_mooncake.TraceRequest], args: argparse.Namespace) -> list:
    """The live replay's requests for the simulator: every hash id a whole block (the live
    prompt is all of its ids' text), the output capped as the live client caps it."""
    from kvfleet_sim.trace import TraceRequest

    size = args.block_chars // TOKEN_BYTES
    return [TraceRequest(r.arrival_s, len(r.hash_ids) * size,
                         max(1, min(r.output_length, args.max_output_tokens)), r.hash_ids,
                         size) for r in requests]  # fmt: skip


def run_sim(policy: str | None, trace: list, requests: list[trace_mooncake.TraceRequest],
            args: argparse.Namespace, seed: int, pool: Path = POOL) -> dict[str, Any]:
    """One simulated replay; `policy` None: the pool file's own routing."""
    from kvfleet_sim.fake_backend import FakeBackendModel
    from kvfleet_sim.fleet import SimSettings
    from kvfleet_sim.run import Variant, build_sim

    fake = FakeBackendModel(
        cache_blocks=args.cache_blocks, block_tokens=args.block_chars // TOKEN_BYTES,
        prefill_s_per_block=args.prefill_ms_per_block / 1000 / args.speedup,
        s_per_output_token=args.ms_per_output_token / 1000 / args.speedup,
        step_s=args.step_ms / 1000,
    )  # fmt: skip
    variant = Variant(str(pool), scaler="fixed-max", policy=policy, replicas=args.num_backends)
    settings = SimSettings(startup_s=0.0, seed=seed)
    result = build_sim(variant, variant.load(), settings, fake).run(trace)
    queried, hit = result.prefix_tokens
    where = {f.request_id: f.replica for f in result.finished}
    routes = [(r.hash_ids, where[f"q{i}"]) for i, r in enumerate(requests)]
    return {"hit_fraction": hit / queried if queried else 0.0,
            "requests_per_backend": dict(Counter(where.values())),
            **load_stats.backends_per_prefix(routes)}


# --- the comparison ----------------------------------------------------------------------


def _side(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "values": values}


def ranking(rows: dict[str, dict[str, Any]], side: str) -> list[str]:
    return sorted(rows, key=lambda t: -rows[t][side]["hit_fraction"]["median"])


def rank_disagreements(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Pairs ordered differently by the two sides' medians where at least one side
    separates them (min-max ranges apart); within both sides' spreads a pair is a tie."""
    out = []
    for a, b in combinations(rows, 2):
        order, separated = {}, {}
        for side in ("live", "sim"):
            x, y = rows[a][side]["hit_fraction"], rows[b][side]["hit_fraction"]
            order[side] = (x["median"] > y["median"]) - (x["median"] < y["median"])
            separated[side] = x["min"] > y["max"] or y["min"] > x["max"]
        if order["live"] != order["sim"] and (separated["live"] or separated["sim"]):
            out.append({"pair": [a, b], "live_order": order["live"], "sim_order": order["sim"],
                        "separated": separated})
    return out


def compare(live: dict[str, list[dict]], sim: dict[str, list[dict]],
            args: argparse.Namespace) -> dict[str, Any]:
    pairs = dict(PAIRS)
    rows: dict[str, dict[str, Any]] = {}
    for target, reps in live.items():
        seeds = sim[target]
        row: dict[str, Any] = {"sim_policy": pairs[target]}
        for side, runs in (("live", reps), ("sim", seeds)):
            row[side] = {
                "hit_fraction": _side([r["hit_fraction"] for r in runs]),
                "mean_backends_per_shared_prefix": _side(
                    [r["mean_backends_per_shared_prefix"] for r in runs]),
                "requests_per_backend": [sorted(r["requests_per_backend"].values(),
                                                reverse=True) for r in runs],
            }
        row["live"]["hit_fraction_on_routes_in_trace_order"] = _side(
            [r["hit_fraction_on_routes_in_trace_order"] for r in reps])
        in_arrival = [r.get("hit_fraction_on_routes_in_arrival_order") for r in reps]
        row["live"]["hit_fraction_on_routes_in_arrival_order"] = (
            None if None in in_arrival else _side(in_arrival))
        row["live"]["num_errors"] = sum(r["num_errors"] for r in reps)
        row["live"]["window_max_imbalance"] = _side(
            [r["imbalance"]["window_max"] for r in reps])
        lh, sh = row["live"]["hit_fraction"]["median"], row["sim"]["hit_fraction"]["median"]
        row["gap"] = (sh - lh) / lh if lh else float("inf")
        rows[target] = row
    over = [t for t, r in rows.items() if abs(r["gap"]) > args.tolerance]
    live_rank, sim_rank = ranking(rows, "live"), ranking(rows, "sim")
    disagree = rank_disagreements(rows)
    errors = sum(r["live"]["num_errors"] for r in rows.values())
    return {
        "rows": rows,
        "ranking": {"live": live_rank, "sim": [rows[t]["sim_policy"] for t in sim_rank],
                    "sim_as_live_targets": sim_rank, "is_median_order_equal":
                        live_rank == sim_rank, "disagreements": disagree},
        "over_tolerance": over,
        "num_live_errors": errors,
        "is_ok": not over and not disagree and errors == 0,
    }


# --- the run -----------------------------------------------------------------------------


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    loadgen.install_uvloop()
    pin_client(args)
    requests = trace_mooncake.load(args.trace, args.num_requests, args.speedup, args.skip)
    targets, skipped = routers.available_targets(args.target_list)
    for target, why in skipped.items():
        print(f"skip {target}: {why}", flush=True)
    if not targets:
        raise RuntimeError("no live target can run here")
    started = time.time()
    load_before = os.getloadavg()[0]
    pairs = dict(PAIRS)
    trace = sim_trace(requests, args)
    sim: dict[str, list[dict]] = {t: [] for t in targets}
    for target in targets:
        for seed in range(args.sim_seeds):
            sim[target].append(run_sim(pairs[target], trace, requests, args, seed))
        print(f"sim  {pairs[target]:<24} hit " + " ".join(
            f"{r['hit_fraction']:.3f}" for r in sim[target]), flush=True)
    live: dict[str, list[dict]] = {t: [] for t in targets}
    with tempfile.TemporaryDirectory(prefix="kvfleet-bench-") as tmp:
        workdir = Path(tmp)
        backends, urls = start_backends(args, workdir)
        try:
            for rep in range(args.reps):
                # the order alternates by repetition, so no target always runs first
                for target in targets if rep % 2 == 0 else targets[::-1]:
                    r = run_target(target, requests, args, urls, workdir)
                    live[target].append(r)
                    print(f"live rep {rep} {target:<24} hit {r['hit_fraction']:.3f} "
                          f"errors {r['num_errors']}", flush=True)
        finally:
            procs.stop(backends)
    out = compare(live, sim, args)
    out["meta"] = {
        "command": " ".join(["python bench/sim_fidelity.py --routing", *argv]),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": time.time() - started,
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "is_pinned": not args.no_pin,
        "trace": Path(args.trace).name,
        "trace_shape": trace_mooncake.shape(requests),
        "skip": args.skip,
        "num_backends": args.num_backends,
        "cache_blocks_per_backend": args.cache_blocks,
        "block_chars": args.block_chars,
        "sim_block_tokens": args.block_chars // TOKEN_BYTES,
        "speedup": args.speedup,
        "prefill_ms_per_block": args.prefill_ms_per_block,
        "ms_per_output_token": args.ms_per_output_token,
        "max_output_tokens": args.max_output_tokens,
        "reps": args.reps,
        "sim_seeds": args.sim_seeds,
        "sim_step_ms": args.step_ms,
        "sim_pool": str(POOL.relative_to(procs.REPO_DIR)),
        "tolerance": args.tolerance,
        "git": git_state(),
        "skipped": skipped,
    }
    out["pooled_cache_hit_fraction"] = pooled_reference(requests, args)
    return out


def summary(out: dict[str, Any]) -> str:
    lines = [f"{'live target':<24} {'live hit':>22} {'sim hit':>22} {'gap':>7}"]
    for target, row in out["rows"].items():
        cells = []
        for side in ("live", "sim"):
            h = row[side]["hit_fraction"]
            cells.append(f"{h['median']:.3f} ({h['min']:.3f}-{h['max']:.3f})")
        lines.append(f"{target:<24} {cells[0]:>22} {cells[1]:>22} {100 * row['gap']:+6.1f}%")
    rank = out["ranking"]
    lines.append(f"ranking live: {' > '.join(rank['live'])}")
    lines.append(f"ranking sim:  {' > '.join(rank['sim_as_live_targets'])}")
    lines.append(f"over tolerance: {out['over_tolerance'] or 'none'}; rank disagreements: "
                 f"{[d['pair'] for d in rank['disagreements']] or 'none'}; live errors: "
                 f"{out['num_live_errors']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from kvfleet_bench.fidelity_run import finish

    args = parse(argv)
    return finish("sim_fidelity --routing", lambda: run(args, argv), args.out, summary,
                  lambda out: out["is_ok"])
