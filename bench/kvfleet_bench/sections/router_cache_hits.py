"""bench/router_cache_hits.py: prefix affinity on the Mooncake trace, routers at defaults."""

from __future__ import annotations

from typing import Any

from kvfleet_bench.sections._fmt import code

# the training slice first, then held-out ones (another trace, later slices, 8 backends)
FILES = ("router_cache_hits", "router_cache_hits_2139", "router_cache_hits_skip4000",
         "router_cache_hits_skip8000", "router_cache_hits_8backends")

# the tables are also those bench/router_cache_hits.py writes beside its JSON and prints


def results_markdown(result: dict[str, Any]) -> str:
    """A run's tables, from its result JSON (also what the script writes as .md)."""
    meta, res = result["meta"], result["results"]
    git = meta.get("git", {})
    dirty = (f"; router/ differed from that commit in the working tree (diff sha1 "
             f"{git['router_diff_sha1']})" if git.get("router_tree_differs") else
             "; router/ clean at that commit")
    lines = [f"Run: `{meta['command'].strip()}`, started {meta['started_utc']}, "
             f"{meta['reps']} repetitions, {meta['trace_shape'].get('num_requests', '?')} requests "
             f"replayed at x{meta['speedup']:g}, {meta['num_backends']} backends x "
             f"{meta['cache_blocks_per_backend']} blocks; routers "
             f"{'at defaults' if not meta['router_options'] else meta['router_options']}; "
             f"commit {git.get('commit', '?')[:10]} (router: {git.get('router_last_commit', '?')})"
             f"{dirty}. Pooled-cache ceiling {result['pooled_cache_hit_fraction']:.3f}. Cells: "
             "median (min–max) over repetitions.", "",
             "| target | hit fraction | backends per shared prefix | imbalance, 1 s windows: "
             "mean / max | latency p50 / p99 (ms) | errors |", "|---|---|---|---|---|---|"]

    def cell(r: dict, k: str, digits: int) -> str:
        lo, hi = r["spread"][k]
        v = r["imbalance"][k] if k.startswith("window_") else r[k]
        return f"{v:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"

    for t, r in res.items():
        lines.append(f"| {t} | {cell(r, 'hit_fraction', 3)} | "
                     f"{cell(r, 'mean_backends_per_shared_prefix', 2)} | "
                     f"{cell(r, 'window_mean', 2)} / {cell(r, 'window_max', 2)} | "
                     f"{r['latency_p50_ms']:.0f} / {r['latency_p99_ms']:.0f} | "
                     f"{r['num_errors']} |")
    lines.append("")
    lines.append("Per repetition (hit fraction, window max imbalance): " + "; ".join(
        f"{t} " + ", ".join(f"({x['hit_fraction']:.3f}, {x['imbalance']['window_max']:.2f})"
                            for x in r["reps"]) for t, r in res.items()) + ".")
    cmp_ = result.get("comparison", {})
    for t, c in cmp_.items():
        if not isinstance(c, dict):
            continue
        d = c["hit_fraction_diff_per_rep"]
        verdict = ("higher in every repetition" if c["is_hit_fraction_higher_every_rep"] else
                   "lower in every repetition" if c["is_hit_fraction_lower_every_rep"] else
                   "not consistently higher or lower")
        lines.append(f"kvfleet:cache-aware vs {t}: hit fraction difference per repetition "
                     f"{', '.join(f'{x:+.3f}' for x in d)} ({verdict}; ranges "
                     f"{'overlap' if c['hit_fraction_ranges_overlap'] else 'do not overlap'}); "
                     f"window-max imbalance difference "
                     f"{', '.join(f'{x:+.2f}' for x in c['window_max_imbalance_diff_per_rep'])}.")
    return "\n".join(lines)


def render_router_cache_hits(results: dict[str, Any]) -> str:
    out = [code(".venv/bin/python bench/router_cache_hits.py          # writes "
                "bench/results/router_cache_hits.{json,md,png}",
                ".venv/bin/python bench/router_cache_hits.py --quick --no-pin   "
                "# seconds; what tests/bench runs")]
    for stem, result in results.items():
        errors = {t: [x.get("errors") or {} for x in r["reps"]]
                  for t, r in result["results"].items()}
        out += ["", f"**`bench/results/{stem}.json`**:", "", results_markdown(result)]
        failed = {t: e for t, e in errors.items() if any(e)}
        if failed:
            out += ["", "Errors by repetition: " + "; ".join(
                f"{t} " + ", ".join(
                    f"rep {i}: " + (" + ".join(f"{n} x {kind}" for kind, n in rep.items())
                                    or "none") for i, rep in enumerate(e))
                for t, e in failed.items()) + "."]
    return "\n".join(out)
