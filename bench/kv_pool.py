"""Fleet-wide KV on a live local fleet: cache-aware routing with and without peer prefix
fetch (`routing.kvSharing`), and round-robin (without and with fetch: what fetching
recovers for a cache-blind policy), side by side in one run, rounds alternating.

    .venv/bin/python bench/kv_pool.py              # SmolLM2-135M, 2 replicas, ~35 min
    .venv/bin/python bench/kv_pool.py --model tiny-random --one-conversation-in 1 \\
        --max-requests 12 --rounds 1 --duration-s 30   # a smoke run, seconds

Each (round, configuration) starts a fresh `kvfleet up` fleet (kvfleet_bench/fleet_replay.py) of
`--replicas` real engines (torch runner on CPU, fixed replica count, `prefixMode:
precise`), replays the same Mooncake slice through its router open loop (each request
streamed, its prompt as token ids), reads every engine's and the router's /metrics, and
stops the fleet. The configurations run in a rotated order each round, so a drift in the
machine's speed hits all four alike.

The Mooncake trace's prefix structure, scaled to SmolLM2's 2,048-token context: each
`hash_id` (512 tokens in the trace) becomes `--block-tokens` pseudo-tokens (the first
ones of the simulator's expansion, `kvfleet_sim.trace.block_tokens`, so equal ids are equal
token blocks and shared ids shared prefixes), a prompt is its ids' blocks in order, cut to
input_length x block-tokens / 512 and to `--max-prompt-tokens`; outputs are capped at
`--max-tokens`. Arrivals are the trace's, compressed `--compress` times. A conversation's
turns come minutes apart (median 123 s), more than a CPU fleet can replay at the trace's
3.4 requests/s, so `--one-conversation-in K` keeps every K-th conversation (a request's
`hash_ids[1]`, the block after the shared system prompt; hashed, so the sample is
deterministic) with all its turns: the same prefix structure over a long window at 1/K of
the rate, which `--compress` then brings up to the load wanted.

Reported per configuration (all rounds pooled): prefix tokens reused, local (engine
prefix hits less fetched) and fetched (`kvfleet:peer_fetch_tokens_total`), TTFT p50/p90 at
the client, output throughput, KV bytes moved (`kvfleet:peer_fetch_bytes_total`), the
router's peer-hint reasons and the engines' fetch outcomes. Results:
bench/results/kv_pool.json and .md (the machine's load average is recorded).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kvfleet_bench.fleet_replay import Fleet, Replayed, Request, replay
from kvfleet_bench.procs import REPO_DIR as ROOT
from kvfleet_bench.readme import refresh_section
from kvfleet_bench.report import write_report
from kvfleet_bench.sections.kv_pool import results_table
from kvfleet_bench.stats import percentile

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
RESULTS = ROOT / "bench" / "results"
MOONCAKE_BLOCK = 512
MODELS = {"smollm2-135m": "SmolLM2-135M-Instruct", "tiny-random": "tiny-random"}


@dataclass(frozen=True, slots=True)
class Config:
    label: str
    policy: str
    sharing: bool


CONFIGS = (Config("cache-aware", "cache-aware", False),
           Config("cache-aware + peer fetch", "cache-aware", True),
           Config("round-robin", "round-robin", False),
           Config("round-robin + peer fetch", "round-robin", True))


def pool_doc(cfg: Config, args: argparse.Namespace) -> dict[str, Any]:
    """A fixed-size local pool of builtin torch engines, precise prefix index."""
    return {
        "apiVersion": "kvfleet.io/v1alpha1", "kind": "InferencePool",
        "metadata": {"name": "kv-pool-bench"},
        "spec": {
            "model": {"name": MODELS[args.model], "source": f"builtin://{args.model}",
                      "servedModelName": "m"},
            "engine": {"kind": "builtin", "runner": "torch", "maxNumSeqs": args.max_num_seqs,
                       "maxNumBatchedTokens": 512, "maxModelLen": 2048, "blockSize": 16,
                       "numBlocks": args.num_blocks, "enablePrefixCaching": True},
            "topology": {"unified": {"replicas": {"min": args.replicas,
                                                  "max": args.replicas}}},
            "routing": {"policy": cfg.policy, "prefixMode": "precise",
                        "kvSharing": {"enabled": cfg.sharing, "margin": args.margin}},
            "autoscaling": {"intervalSeconds": 2, "windowSeconds": 10,
                            "drainTimeoutSeconds": 10},
        },
    }


def is_sampled(hash_ids: list[int], index: int, one_in: int) -> bool:
    """Whether a request's conversation is in the 1-in-`one_in` sample: its turns share
    `hash_ids[1]`; a single-block prompt is a conversation of its own."""
    key = hash_ids[1] if len(hash_ids) > 1 else -1 - index
    return one_in <= 1 or (key * 2654435761) % (1 << 32) % one_in == 0


def scaled_requests(args: argparse.Namespace) -> list[Request]:
    """The Mooncake slice with its prefix structure scaled to the model's context."""
    from kvfleet_sim.trace import block_tokens, load_mooncake

    b = args.block_tokens
    out = []
    for i, r in enumerate(load_mooncake(TRACE, args.start_s, args.duration_s, args.compress)):
        if not is_sampled(r.hash_ids, i, args.one_conversation_in):
            continue
        n = min(math.ceil(r.num_prompt_tokens * b / MOONCAKE_BLOCK), len(r.hash_ids) * b,
                args.max_prompt_tokens)
        prompt = [t for h in r.hash_ids for t in block_tokens(h)[:b]][:max(1, n)]
        out.append(Request(r.t, prompt, max(1, min(r.num_output_tokens, args.max_tokens))))
        if args.max_requests and len(out) >= args.max_requests:
            break
    return out


def reuse_ceiling(reqs: list[Request], block_size: int = 16) -> float:
    """The share of prompt tokens an unbounded cache pooled over the whole fleet could
    serve from cache: every usable leading block that an earlier request already held
    (no eviction, no timing). No routing, with or without peer fetch, reuses more."""
    from kvfleet_engine.core.prefix_share import chained_hashes, num_usable_blocks

    seen: set[int] = set()
    hits = total = 0
    for r in reqs:
        total += len(r.prompt)
        chain = chained_hashes(r.prompt, block_size, len(r.prompt) // block_size)
        usable = num_usable_blocks(len(r.prompt), block_size)
        hits += block_size * next((i for i, h in enumerate(chain[:usable]) if h not in seen),
                                  usable)
        seen.update(chain)
    return hits / total if total else 0.0


def metrics_text(address: str) -> str:
    with urllib.request.urlopen(f"{address}/metrics", timeout=5) as resp:
        return resp.read().decode()


def sum_series(text: str, want: dict[str, str]) -> dict[str, float]:
    """Summed samples of the series in `want` (name -> key; a `_total` suffix is allowed),
    split by the label value in `{label="value"}` when the key ends with `{label}`."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        key = want.get(name.removesuffix("_total")) or want.get(name)
        if key is None:
            continue
        if key.endswith("}"):
            label = key[key.index("{") + 1:-1]
            found = [p.split("=", 1)[1].strip('"') for p in labels.rstrip("}").split(",")
                     if p.startswith(label + "=")]
            key = key[:key.index("{")] + ":" + (found[0] if found else "")
        out[key] = out.get(key, 0.0) + float(value)
    return out


ENGINE_SERIES = {
    "vllm:prefix_cache_queries": "prefix_queries", "vllm:prefix_cache_hits": "prefix_hits",
    "kvfleet:peer_fetch_tokens": "fetched_tokens", "kvfleet:peer_fetch_blocks": "fetched_blocks",
    "kvfleet:peer_fetch_bytes": "fetched_bytes", "kvfleet:peer_export_bytes": "exported_bytes",
    "kvfleet:peer_fetch": "fetch{outcome}", "kvfleet:peer_fetch_seconds_sum": "fetch_seconds",
}
ROUTER_SERIES = {"kvfleet_router_peer_hints": "hints{reason}"}


def fleet_counters(fleet: Fleet) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in fleet.state().get("replicas", []):
        want = ROUTER_SERIES if r["role"] == "router" else ENGINE_SERIES
        for k, v in sum_series(metrics_text(r["address"]), want).items():
            out[k] = out.get(k, 0.0) + v
    return out


def run_one(cfg: Config, reqs: list[Request], args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump(pool_doc(cfg, args), fh)
        pool_path = Path(fh.name)
    fleet = Fleet(pool_path, args.replicas)
    try:
        endpoint = fleet.wait_serving(args.ready_timeout_s)
        time.sleep(1.0)  # the router's KV-event subscriptions connect
        before = fleet_counters(fleet)
        t0 = time.perf_counter()
        got: Replayed = replay(endpoint, "m", reqs)
        wall = time.perf_counter() - t0
        time.sleep(0.5)
        after = fleet_counters(fleet)
    finally:
        fleet.stop()
        pool_path.unlink(missing_ok=True)
    counters = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    return {"config": cfg.label, "ttfts": [d.first_token - d.arrival for d in got.done],
            "num_output_tokens": sum(d.num_output_tokens for d in got.done),
            "span_s": (max((d.finished for d in got.done), default=0.0)
                       - min((d.arrival for d in got.done), default=0.0)),
            "num_failed": got.num_failed, "wall_s": wall, "counters": counters,
            "lateness_p90_s": percentile(got.lateness_s, 90)}


def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration over all its rounds."""
    ttfts = [t for r in runs for t in r["ttfts"]]
    c: dict[str, float] = {}
    for r in runs:
        for k, v in r["counters"].items():
            c[k] = c.get(k, 0.0) + v
    fetched = c.get("fetched_tokens", 0.0)
    span = sum(r["span_s"] for r in runs)
    return {
        "config": runs[0]["config"], "num_requests": len(ttfts),
        "num_failed": sum(r["num_failed"] for r in runs),
        "ttft_p50_s": percentile(ttfts, 50), "ttft_p90_s": percentile(ttfts, 90),
        "output_tokens_per_s": sum(r["num_output_tokens"] for r in runs) / span if span else 0,
        "prefix_tokens_queried": c.get("prefix_queries", 0.0),
        "prefix_tokens_local": max(0.0, c.get("prefix_hits", 0.0) - fetched),
        "prefix_tokens_fetched": fetched, "bytes_moved": c.get("fetched_bytes", 0.0),
        "hints": {k.split(":", 1)[1]: v for k, v in c.items() if k.startswith("hints:") and v},
        "fetches": {k.split(":", 1)[1]: v for k, v in c.items() if k.startswith("fetch:") and v},
        "fetch_seconds": c.get("fetch_seconds", 0.0),
        "rounds": [{k: v for k, v in r.items() if k != "ttfts"} for r in runs],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="smollm2-135m")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--start-s", type=float, default=600.0, help="slice start in the trace")
    p.add_argument("--duration-s", type=float, default=1200.0, help="trace seconds replayed")
    p.add_argument("--compress", type=float, default=5.0, help="time compression")
    p.add_argument("--max-requests", type=int, default=0, help="the slice's first N (0: all)")
    p.add_argument("--one-conversation-in", type=int, default=10,
                   help="keep every K-th conversation with all its turns (1: all)")
    p.add_argument("--block-tokens", type=int, default=16,
                   help="tokens per Mooncake hash id (512 in the trace)")
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=16, help="output cap per request")
    p.add_argument("--num-blocks", type=int, default=2048, help="KV blocks per engine")
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--margin", type=float, default=1.5, help="routing.kvSharing.margin")
    p.add_argument("--configs", default=",".join(c.label for c in CONFIGS),
                   help="comma list of the configurations to run (the first two compared)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ready-timeout-s", type=float, default=180.0)
    p.add_argument("--threads", type=int, default=1, help="torch threads per engine")
    p.add_argument("--out", default=str(RESULTS / "kv_pool.json"))
    args = p.parse_args()
    if args.block_tokens % 16:
        p.error("--block-tokens must be a multiple of the KV block size, 16")
    known = {c.label: c for c in CONFIGS}
    wanted = [w.strip() for w in args.configs.split(",") if w.strip()]
    if len(wanted) < 2 or any(w not in known for w in wanted):
        p.error(f"--configs: two or more of {', '.join(known)}")
    configs = tuple(known[w] for w in wanted)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the engines inherit it
    reqs = scaled_requests(args)
    load_before = os.getloadavg()
    ceiling = reuse_ceiling(reqs)
    print(f"{len(reqs)} requests, mean prompt {sum(len(r.prompt) for r in reqs) / len(reqs):.0f}"
          f" tokens, reuse ceiling {ceiling:.1%}; load average {load_before[0]:.2f}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {c.label: [] for c in configs}
    for rnd in range(args.rounds):
        k = rnd % len(configs)
        order = configs[k:] + configs[:k]
        for cfg in order:
            r = run_one(cfg, reqs, args)
            runs[cfg.label].append(r)
            print(f"round {rnd + 1} {cfg.label}: TTFT p90 {percentile(r['ttfts'], 90):.3f} s, "
                  f"{r['num_failed']} failed, {r['wall_s']:.0f} s", flush=True)
    rows = [pooled(runs[c.label]) for c in configs]
    base, fetch = rows[0], rows[1]
    ratio = base["ttft_p90_s"] / fetch["ttft_p90_s"] if fetch["ttft_p90_s"] else math.nan
    thr = (fetch["output_tokens_per_s"] / base["output_tokens_per_s"]
           if base["output_tokens_per_s"] else math.nan)
    load_after = os.getloadavg()
    text = "\n\n".join([
        f"Live fleet: {args.replicas} x {MODELS[args.model]} (builtin engine, torch on CPU, "
        f"{args.threads} thread each), Mooncake [{args.start_s:g}, "
        f"{args.start_s + args.duration_s:g}) s compressed {args.compress:g}x, "
        f"{len(reqs)} requests, {args.block_tokens} tokens per hash id, prompts <= "
        f"{args.max_prompt_tokens}, outputs <= {args.max_tokens}; {args.rounds} rounds "
        f"alternating; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after. "
        f"An unbounded cache pooled over the fleet would reuse {ceiling:.1%} of prompt tokens.",
        results_table(rows),
        f"TTFT p90 {base['config']} / {fetch['config']}: {ratio:.2f}x (target >= 1.3x); output "
        f"throughput with fetch / without: {thr:.3f}x (target >= 1).",
    ])
    write_report(Path(args.out), {"args": vars(args), "load_average": [load_before, load_after],
                                  "results": rows, "reuse_ceiling": ceiling,
                                  "ttft_p90_speedup": ratio,
                                  "throughput_ratio": thr}, text)
    print(text)
    refresh_section("kv_pool", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
