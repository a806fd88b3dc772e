"""bench/sim_kv_pool.py: peer prefix fetch in the simulator at 64 replicas."""

from __future__ import annotations

from typing import Any

from kvfleet_bench.sections._fmt import code, table

FILES = ("sim_kv_pool",)

# the tables are also those bench/sim_kv_pool.py writes beside its JSON


def comparison_table(rows: list[dict[str, Any]]) -> str:
    cells = []
    for r in rows:
        hints = r["hints"]
        outcomes = ", ".join(f"{k} {v}" for k, v in r["fetches"].items()) or "-"
        asked = sum(hints.values())
        by = r["hints_by_decision"]
        balanced = sum(v for k, v in by.items() if k.startswith("balanced/"))
        q = max(1, r["prefix_tokens_queried"])
        cells.append([
            r["case"], r["num_requests"],
            f"{r['prefix_tokens_local'] / q:.1%} / {r['prefix_tokens_fetched'] / q:.1%} "
            f"({r['prefix_tokens_local']:,} / {r['prefix_tokens_fetched']:,} of "
            f"{r['prefix_tokens_queried']:,})",
            f"{r['ttft_p50_s'] * 1000:.0f} / {r['ttft_p90_s'] * 1000:.0f}",
            f"{r['output_tokens_per_s']:,.0f}", f"{r['bytes_moved'] / 1e9:.1f}",
            f"{hints.get('attached', 0) if asked else '-'} / {asked or '-'}",
            f"{balanced} ({by.get('balanced/attached', 0)})" if asked else "-",
            outcomes, f"{r['imbalance_mean']:.2f}", r["num_failed"]])
    return table(["routing", "requests", "prefix tokens reused: local / fetched (of looked up)",
                  "TTFT p50 / p90 (ms)", "output tok/s", "KV moved (GB)",
                  "hints attached / asked", "guard-balanced (attached)", "fetch outcomes",
                  "imbalance mean", "failed"], cells)


def gain_line(policy: str, off: dict[str, Any], on: dict[str, Any]) -> str:
    per_seed = ", ".join(f"{a['ttft_p90_s'] / b['ttft_p90_s']:.2f}"
                         for a, b in zip(off["seeds"], on["seeds"], strict=True))
    p90 = off["ttft_p90_s"] / on["ttft_p90_s"]
    p50 = off["ttft_p50_s"] / on["ttft_p50_s"]
    thr = on["output_tokens_per_s"] / off["output_tokens_per_s"]
    return (f"- {policy}: TTFT p90 without / with fetch {p90:.2f}x (per seed: {per_seed}), "
            f"p50 {p50:.2f}x; output throughput with / without {thr:.3f}x")


def sweep_table(base: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    cells = []
    for r in rows:
        reused = r["prefix_tokens_local"] + r["prefix_tokens_fetched"]
        cells.append([
            f"{r['gbytes_per_s']:g}", f"{r['ttft_p90_s'] / base['ttft_p90_s']:.3f}",
            f"{r['ttft_p50_s'] / base['ttft_p50_s']:.3f}",
            f"{r['prefix_tokens_fetched'] / reused if reused else 0:.1%}",
            f"{r['hints'].get('attached', 0)} / {r['hints'].get('recompute-cheaper', 0)}",
            ", ".join(f"{k} {v}" for k, v in r["fetches"].items()) or "-",
            f"{r['fetch_mean_s'] * 1000:.1f}"])
    return table(["GB/s", f"TTFT p90 with fetch / without ({base['ttft_p90_s'] * 1000:.0f} ms)",
                  "TTFT p50 ratio", "fetched share of reuse",
                  "hints attached / recompute-cheaper", "fetch outcomes", "mean fetch (ms)"],
                 cells)


def render_sim_kv_pool(results: dict[str, Any]) -> str:
    r = results["sim_kv_pool"]
    a, rows = r["args"], r["comparison"]
    by_case = {row["case"]: row for row in rows}
    pairs = {row["policy"]: (row, by_case[row["case"] + " + peer fetch"])
             for row in rows if not row["kv_sharing"] and row["case"] + " + peer fetch" in by_case}
    first = rows[0]
    out = [code(f".venv/bin/python bench/sim_kv_pool.py --jobs {a['jobs']}   # writes "
                "bench/results/sim_kv_pool.{json,md,png}"), "",
           f"{a['replicas']} fixed replicas, the Mooncake trace [{a['start_s']:g}, "
           f"{a['start_s'] + a['duration_s']:g}) s after {a['warmup_s']:g} s of warm-up, "
           f"compressed {a['compress']:g}x ({first['num_requests']} measured requests); link "
           f"{a['gbytes_per_s']:g} GB/s with {a['latency_ms']:g} ms latency; router seeds 0 to "
           f"{a['seeds'] - 1}, medians. The results record no commit or date (the simulator's "
           f"figures do not depend on the machine).", "",
           f"Comparison at {a['gbytes_per_s']:g} GB/s:", "", comparison_table(rows), "",
           "\n".join(gain_line(pol, off, on) for pol, (off, on) in pairs.items())]
    if a["sweep_policy"] in pairs and r.get("sweep"):
        base = pairs[a["sweep_policy"]][0]
        out += ["", f"Bandwidth sweep ({a['sweep_policy']} with fetch over "
                    f"{a['sweep_policy']} alone):", "", sweep_table(base, r["sweep"])]
    return "\n".join(out)
