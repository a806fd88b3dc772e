"""bench/kv_pool.py: peer prefix fetch on a live fleet of real SmolLM2 engines."""

from __future__ import annotations

from typing import Any

from kvfleet_bench.sections._fmt import code

FILES = ("kv_pool", "kv_pool_c8", "kv_pool_c12_probe", "kv_pool_c16_probe")
P90_TARGET = 1.3  # the target for TTFT p90 without / with peer fetch

# the table is also the one bench/kv_pool.py writes beside its JSON


def results_table(rows: list[dict[str, Any]]) -> str:
    """A run's table, one row per config (also what the script writes as .md)."""
    out = ["| routing | requests | prefix tokens reused: local / fetched (of looked up) "
           "| TTFT p50 / p90 (ms) | output tok/s | KV moved (MB) | hints attached / asked "
           "| fetch outcomes | failed |", "|" + "---|" * 9]
    for r in rows:
        q = max(1.0, r["prefix_tokens_queried"])
        hints = r["hints"]
        outcomes = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["fetches"].items())) or "-"
        asked = sum(hints.values())
        out.append(
            f"| {r['config']} | {r['num_requests']} "
            f"| {r['prefix_tokens_local'] / q:.1%} / {r['prefix_tokens_fetched'] / q:.1%} "
            f"({r['prefix_tokens_local']:,.0f} / {r['prefix_tokens_fetched']:,.0f} of "
            f"{r['prefix_tokens_queried']:,.0f}) "
            f"| {r['ttft_p50_s'] * 1000:.0f} / {r['ttft_p90_s'] * 1000:.0f} "
            f"| {r['output_tokens_per_s']:.1f} | {r['bytes_moved'] / 1e6:.1f} "
            f"| {hints.get('attached', 0):.0f} / {asked:.0f} | {outcomes} "
            f"| {r['num_failed']} |")
    return "\n".join(out)


def _load(values: list[float]) -> str:
    return f"{values[0]:.2f}"


def _one(stem: str, r: dict[str, Any]) -> str:
    a, rows = r["args"], r["results"]
    before, after = r["load_average"]
    per_round = (rows[0]["num_requests"] + rows[0]["num_failed"]) // max(1, a["rounds"])
    head = (f"**{a['compress']:g}x** (`bench/results/{stem}.json`): {a['rounds']} round(s) of "
            f"{per_round} requests, {per_round / a['duration_s'] * a['compress']:.1f} "
            f"requests/s offered; load average {_load(before)} before, {_load(after)} after; "
            f"the results record no commit.")
    if "reuse_ceiling" in r:
        head += (f" An unbounded cache pooled over the fleet would reuse "
                 f"{r['reuse_ceiling']:.1%} of prompt tokens.")
    lines = [head, "", results_table(rows), ""]
    words = [f"TTFT p90 {rows[0]['config']} / {rows[1]['config']}: "
             f"{r['ttft_p90_speedup']:.2f}x (target >= {P90_TARGET:g}x); output throughput with "
             f"fetch / without: {r['throughput_ratio']:.3f}x"]
    for row in rows:
        hits = row["fetches"].get("hit", 0) + row["fetches"].get("partial", 0)
        if hits:
            words.append(f"{row['config']}: {row['fetch_seconds'] / hits:.2f} s per completed "
                         f"fetch ({hits:.0f} fetches, {row['fetch_seconds']:.1f} s, "
                         f"{row['bytes_moved'] / hits / 1e6:.1f} MB each)")
        if row["num_failed"]:
            words.append(f"{row['config']}: {row['num_failed']} of "
                         f"{row['num_requests'] + row['num_failed']} requests failed")
    return "\n".join(lines) + "\n" + "; ".join(words) + "."


def render_kv_pool(results: dict[str, Any]) -> str:
    first = next(iter(results.values()))["args"]
    out = [code('.venv/bin/python bench/kv_pool.py --configs "cache-aware,cache-aware + peer '
                'fetch,round-robin"',
                '.venv/bin/python bench/kv_pool.py --compress 8 --configs "cache-aware,'
                'cache-aware + peer fetch,round-robin" \\',
                "    --out bench/results/kv_pool_c8.json",
                '.venv/bin/python bench/kv_pool.py --compress 12 --rounds 1 --configs '
                '"cache-aware,cache-aware + peer fetch" \\',
                "    --out bench/results/kv_pool_c12_probe.json     # also --compress 16"), "",
           f"Fleet: {first['replicas']} x `{first['model']}` engines ({first['threads']} thread "
           f"each, {first['num_blocks']:,} KV blocks, maxNumSeqs {first['max_num_seqs']}); "
           f"Mooncake [{first['start_s']:g}, {first['start_s'] + first['duration_s']:g}) s, "
           f"one conversation in {first['one_conversation_in']}, {first['block_tokens']} tokens "
           f"per hash id, prompts cut at {first['max_prompt_tokens']} tokens, up to "
           f"{first['max_tokens']} output tokens; hint margin {first['margin']:g}."]
    for stem, r in results.items():
        out += ["", _one(stem, r)]
    return "\n".join(out)
