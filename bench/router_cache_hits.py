"""Does the router send a prompt where its prefix is cached? Mooncake replay through routers.

N fake backends, each with an LRU-bounded prefix cache (in blocks), sit behind one router
process at a time; the Mooncake conversation trace is replayed open-loop (time-compressed,
each hash id expanded into text) through kvfleet's policies and sglang-router's. Backends
charge time per uncached block and per output token (also compressed), so where a request
lands shows up in latency as well as in the hit counters.

Reported per target:
- hit fraction: prompt blocks that hit the chosen backend's bounded cache (the backends
  count; the per-response `cached_tokens` must agree);
- backends per shared prefix (1 = perfect affinity);
- load imbalance (max - min) / mean in-flight, at instants and over windows;
- latency p50/p99 and errors.

Router replicas (issue 29): `kvfleet-replicas3:cache-aware` is three kvfleet routers of one
pool (one admin token, `exchange: {enabled: true, peers: [the three]}`) behind Envoy as an
L4 balancer (TCP proxy, round-robin over new connections; kvfleet_bench/balancer.py), and
the client opens a new connection per request, as clients behind a Service do;
`kvfleet-replicas3-noexchange:cache-aware` is the same with the exchange off. Their hit
fraction is also reported as a ratio to the single router's (kvfleet:cache-aware) in the
same repetition (the bar: >= 0.97x in every repetition). Which replica served each request
comes from Envoy's access log (the client's port joins it), not from the router.

Restart-warm (`--restart-replica`): during each replay of a replica target, replica 0 is
stopped (SIGTERM, as a rollout stops a pod) at --restart-at of the replay, started again
after --restart-down-s with the same token and config (it warms from a peer,
`exchange.warm`), and its hit fraction is compared with the other two replicas' in
--restart-window-s windows from the first request it serves again (the bar: from 10 s
after that, >= 0.97x the others'). The no-exchange target is the cold-restart control.

    .venv/bin/python bench/router_cache_hits.py            # full run (replicas included), ~25 min
    # restart-warm, ~15 min (writes bench/results/router_cache_hits_restart.json):
    .venv/bin/python bench/router_cache_hits.py --restart-replica --num-requests 3000 \\
        --out bench/results/router_cache_hits_restart.json
    .venv/bin/python bench/router_cache_hits.py --quick    # seconds; the smoke test uses it
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvfleet_bench import loadgen, procs, routers
from kvfleet_bench import traces as trace_mooncake
from kvfleet_bench.cache_replay import (
    add_scenario_args,
    git_state,
    pin_client,
    pooled_reference,
    quick_scenario,
    router_options,
    run_target,
    start_backends,
    summarise_reps,
)
from kvfleet_bench.procs import RESULTS_DIR
from kvfleet_bench.readme import refresh_section
from kvfleet_bench.sections.router_cache_hits import results_markdown

DEFAULT_TARGETS = [
    "kvfleet:cache-aware",
    "kvfleet:prefix-cache",
    "kvfleet:round-robin",
    "sglang:cache_aware",
    "vllm:cache_aware",
    "kvfleet-replicas3:cache-aware",
    "kvfleet-replicas3-noexchange:cache-aware",
]
RESTART_TARGETS = ["kvfleet-replicas3:cache-aware", "kvfleet-replicas3-noexchange:cache-aware"]
SINGLE = "kvfleet:cache-aware"
REPLICAS_RATIO_BAR = 0.97


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--targets", default=None,
                   help=f"default: {','.join(DEFAULT_TARGETS)}; with --restart-replica: "
                        f"{','.join(RESTART_TARGETS)}")
    add_scenario_args(p, "repetitions; medians are reported")
    p.add_argument("--size-kvfleet-prefix", action="store_true",
                   help="size kvfleet's prefix index to the backends' caches (default: every "
                        "router at its shipped defaults)")
    p.add_argument("--out", default=str(RESULTS_DIR / "router_cache_hits.json"))
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--quick", action="store_true", help="a few seconds per target")
    g = p.add_argument_group("restart-warm (replica targets only)")
    g.add_argument("--restart-replica", action="store_true",
                   help="stop and restart replica 0 during each replica target's replay")
    g.add_argument("--restart-at", type=float, default=0.25,
                   help="when to stop it, as a fraction of the replay's duration")
    g.add_argument("--restart-down-s", type=float, default=1.0,
                   help="real seconds between the stop and the new start")
    g.add_argument("--restart-window-s", type=float, default=2.0,
                   help="real seconds per window of the comparison")
    args = p.parse_args(argv)
    if args.targets is None:
        args.targets = ",".join(RESTART_TARGETS if args.restart_replica else DEFAULT_TARGETS)
    if args.quick:
        quick_scenario(args)
        if args.restart_replica:
            # long enough for a stop, a start and a few windows after it
            args.num_requests, args.speedup, args.restart_window_s = 1500, 60.0, 1.0
    args.target_list = [t for t in args.targets.split(",") if t]
    if "direct" in [t.split(":")[0] for t in args.target_list]:
        p.error("direct has no routing policy; pick router targets")
    if args.quick:
        args.reps = 1
    if min(args.num_requests, args.num_backends, args.block_chars, args.cache_blocks,
           args.reps) < 1:
        p.error("counts must be positive")
    if not 0 < args.restart_at < 1 or args.restart_down_s < 0 or args.restart_window_s <= 0:
        p.error("--restart-at is in (0, 1), --restart-down-s >= 0, --restart-window-s > 0")
    if args.restart_replica and not any(t.startswith("kvfleet-replicas")
                                        for t in args.target_list):
        p.error("--restart-replica needs a kvfleet-replicas3 target")
    for target in args.target_list:
        try:
            routers.parse_target(target)
        except ValueError as exc:
            p.error(str(exc))
    return args


def compare(results: dict[str, dict]) -> dict[str, Any]:
    """kvfleet's cache-aware policy against each peer's cache-aware policy, per repetition
    (both measured in the same repetition) and as ranges, so a gap smaller than the spread
    is shown as such."""
    ours = results.get(SINGLE)
    peers = {t: r for t, r in results.items()
             if t.split(":")[0] in ("sglang", "vllm") and "cache" in t}
    replicas = replicas_vs_single(results)
    if not ours or not peers:
        out_: dict[str, Any] = {"compared": False,
                                "why": "needs kvfleet:cache-aware and a peer's cache_aware policy"}
        if replicas:
            out_["replicas_vs_single"] = replicas
        return out_
    out: dict[str, Any] = {"compared": True}
    if replicas:
        out["replicas_vs_single"] = replicas
    for t, theirs in peers.items():
        diffs = [a["hit_fraction"] - b["hit_fraction"]
                 for a, b in zip(ours["reps"], theirs["reps"], strict=True)]
        imb = [a["imbalance"]["window_max"] - b["imbalance"]["window_max"]
               for a, b in zip(ours["reps"], theirs["reps"], strict=True)]
        lo, hi = ours["spread"]["hit_fraction"]
        plo, phi = theirs["spread"]["hit_fraction"]
        out[t] = {
            "hit_fraction": {"kvfleet": ours["hit_fraction"], "peer": theirs["hit_fraction"]},
            "hit_fraction_ranges_overlap": not (lo > phi or hi < plo),
            "hit_fraction_diff_per_rep": diffs,
            "is_hit_fraction_higher_every_rep": all(d > 0 for d in diffs),
            "is_hit_fraction_lower_every_rep": all(d < 0 for d in diffs),
            "window_max_imbalance": {"kvfleet": ours["imbalance"]["window_max"],
                                     "peer": theirs["imbalance"]["window_max"]},
            "window_max_imbalance_diff_per_rep": imb,
        }
    return out


def replicas_vs_single(results: dict[str, dict]) -> dict[str, Any]:
    """Each replica target's hit fraction over the single router's, per repetition (the two
    ran in the same repetition), against the bar of 0.97x in every repetition."""
    single = results.get(SINGLE)
    out: dict[str, Any] = {}
    if not single:
        return out
    for t, r in results.items():
        if not t.startswith("kvfleet-replicas"):
            continue
        ratios = [a["hit_fraction"] / b["hit_fraction"] if b["hit_fraction"] else float("nan")
                  for a, b in zip(r["reps"], single["reps"], strict=True)]
        out[t] = {"ratio_per_rep": ratios, "bar": REPLICAS_RATIO_BAR,
                  "is_at_bar_every_rep": all(x >= REPLICAS_RATIO_BAR for x in ratios)}
    return out


def plot(results: dict[str, dict], reference: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    axes[0].barh(names, [results[n]["hit_fraction"] for n in names])
    axes[0].axvline(reference, color="k", linestyle="--", label="one pooled cache")
    axes[0].set_title("prompt blocks hitting the chosen backend's LRU cache")
    axes[0].legend(fontsize=7)
    axes[1].barh(names, [results[n]["mean_backends_per_shared_prefix"] for n in names])
    axes[1].set_title("backends per shared prefix (1 = affinity)")
    y = range(len(names))
    axes[2].barh([i + 0.2 for i in y], [results[n]["imbalance"]["window_max"] for n in names],
                 0.4, label="max over windows")
    axes[2].barh([i - 0.2 for i in y], [results[n]["imbalance"]["window_mean"] for n in names],
                 0.4, label="mean over windows")
    axes[2].set_yticks(list(y), names)
    axes[2].set_title("load imbalance (max-min)/mean in-flight")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def restart_line(rs: dict[str, Any]) -> str:
    if not rs.get("served"):
        return "restart: the restarted replica served nothing afterwards"
    a, b = rs["after_10s"], rs["first_10s"]
    return (f"restart: down {rs['down_s']:.1f} s; restarted vs others hit fraction, first 10 s "
            f"{b['restarted']['hit_fraction']:.3f} vs {b['others']['hit_fraction']:.3f}, "
            f"after 10 s {a['restarted']['hit_fraction']:.3f} vs "
            f"{a['others']['hit_fraction']:.3f} (x{a['ratio']:.3f}); windows " + " ".join(
                f"{w['ratio']:.2f}" for w in rs["windows"]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    loadgen.install_uvloop()
    pin_client(args)
    try:
        requests = trace_mooncake.load(args.trace, args.num_requests, args.speedup, args.skip)
    except (OSError, ValueError, KeyError) as exc:
        print(f"router_cache_hits: cannot read the trace: {exc}", file=sys.stderr)
        return 2
    targets, skipped = routers.available_targets(args.target_list)
    for target, why in skipped.items():
        print(f"skip {target}: {why}", flush=True)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="kvfleet-bench-") as tmp:
        workdir = Path(tmp)
        backends, urls = start_backends(args, workdir)
        per_rep: dict[str, list[dict]] = {t: [] for t in targets}
        try:
            for rep in range(args.reps):
                # the order alternates by repetition, so no target always runs first
                for target in targets if rep % 2 == 0 else targets[::-1]:
                    per_rep[target].append(run_target(target, requests, args, urls, workdir))
                    r = per_rep[target][-1]
                    imb = r["imbalance"]
                    print(f"rep {rep} {target:<24} hit {r['hit_fraction']:.3f} backends/prefix "
                          f"{r['mean_backends_per_shared_prefix']:.2f} imbalance window max "
                          f"{imb['window_max']:.2f} mean {imb['window_mean']:.2f} "
                          f"p50 {r['latency_p50_ms']:.0f} ms errors {r['num_errors']}",
                          flush=True)
                    if "per_replica" in r:
                        print("    per replica: " + ", ".join(
                            f"r{i} {x['num_requests']} req hit {x['hit_fraction']:.3f}"
                            for i, x in r["per_replica"].items())
                            + f"; unattributed {r['num_unattributed']}", flush=True)
                    if "restart" in r:
                        print("    " + restart_line(r["restart"]), flush=True)
        finally:
            procs.stop(backends)
    results = {t: summarise_reps(rows) for t, rows in per_rep.items() if rows}
    reference = pooled_reference(requests, args)
    result = {
        "meta": {
            "command": "python bench/router_cache_hits.py " + " ".join(argv or sys.argv[1:]),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "wall_s": time.time() - started,
            "is_pinned": not args.no_pin,
            "trace": Path(args.trace).name,
            "trace_shape": trace_mooncake.shape(requests),
            "num_backends": args.num_backends,
            "cache_blocks_per_backend": args.cache_blocks,
            "block_chars": args.block_chars,
            "speedup": args.speedup,
            "reps": args.reps,
            "prefill_ms_per_block": args.prefill_ms_per_block,
            "ms_per_output_token": args.ms_per_output_token,
            "router_options": router_options(args),
            "connections": args.connections,
            "restart": ({"at": args.restart_at, "down_s": args.restart_down_s,
                         "window_s": args.restart_window_s} if args.restart_replica else None),
            "git": git_state(),
            "skipped": skipped,
        },
        "pooled_cache_hit_fraction": reference,
        "results": results,
        "comparison": compare(results),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    is_plotted = not args.no_plot and bool(results)
    if is_plotted:
        plot(results, reference, out.with_suffix(".png"))
    text = results_markdown(result)
    out.with_suffix(".md").write_text(text + "\n")
    print(text)
    print(f"wrote {out} (+ .md{', .png' if is_plotted else ''})")
    refresh_section("router_cache_hits", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
