"""bench/router_cache_hits.py: prefix affinity on the Mooncake trace, routers at defaults."""

from __future__ import annotations

from typing import Any

from kvfleet_bench.sections._fmt import code

# the training slice first, then the router replicas (issue 29: three behind Envoy, with and
# without the exchange; restart-warm), then the other slices the defaults were checked (and,
# for policy.min_prefix_match, tuned) on, then the slices held out from that tuning
FILES = ("router_cache_hits", "router_cache_hits_replicas", "router_cache_hits_restart",
         "router_cache_hits_2139", "router_cache_hits_skip4000",
         "router_cache_hits_skip8000", "router_cache_hits_8backends",
         "router_cache_hits_skip2000", "router_cache_hits_skip6000",
         "router_cache_hits_skip10500", "router_cache_hits_8backends_skip6000")

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
    for t, c in cmp_.get("replicas_vs_single", {}).items():
        verdict = ("at or above" if c["is_at_bar_every_rep"] else "below")
        lines.append(f"{t} vs kvfleet:cache-aware (one router): hit fraction ratio per "
                     f"repetition {', '.join(f'{x:.3f}x' for x in c['ratio_per_rep'])} ({verdict} "
                     f"{c['bar']:g}x in every repetition).")
    replica_lines = [per_replica_line(t, r) for t, r in res.items()
                     if "per_replica" in r["reps"][0]]
    if replica_lines:
        lines += ["", "Replica targets: Envoy (TCP proxy, round-robin over new connections) in "
                  "front of 3 router processes, a new client connection per request "
                  f"(--connections {meta.get('connections', 'auto')}); requests and hit "
                  "fraction per replica, from Envoy's access log joined on the client port:"]
        lines += replica_lines
    restarts = {t: [x["restart"] for x in r["reps"] if "restart" in x] for t, r in res.items()}
    restarts = {t: v for t, v in restarts.items() if v}
    if restarts:
        lines += ["", restart_markdown(meta, restarts)]
    for t, c in cmp_.items():
        if not isinstance(c, dict) or t == "replicas_vs_single":
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


def per_replica_line(target: str, r: dict[str, Any]) -> str:
    reps = []
    for i, x in enumerate(r["reps"]):
        cells = ", ".join(f"r{k} {v['num_requests']} req / {v['hit_fraction']:.3f}"
                          for k, v in x["per_replica"].items())
        reps.append(f"rep {i}: {cells}; unattributed {x['num_unattributed']}")
    return f"- {target}: " + "; ".join(reps) + "."


def _hf(cell: dict[str, Any]) -> str:
    x = cell["hit_fraction"]
    return "—" if x != x else f"{x:.3f}"


def _x(ratio: float) -> str:
    return "—" if ratio != ratio else f"{ratio:.3f}x"


def restart_markdown(meta: dict[str, Any], restarts: dict[str, list[dict]]) -> str:
    """The restart-warm table: replica 0 stopped and started again mid-replay; its hit
    fraction against the other two replicas', before and after 10 s of serving."""
    conf = meta.get("restart") or {}
    lines = [f"Restart-warm: replica 0 stopped (SIGTERM) at {conf.get('at', '?')} of the replay, "
             f"started again {conf.get('down_s', '?')} s later with the same token and config; "
             "hit fraction of the requests it served vs the other replicas' over the same "
             f"time, from its first request served again; {conf.get('window_s', '?')} s windows "
             "(ratio restarted / others per window). Bar: from 10 s after it serves, "
             ">= 0.97x the others'.", "",
             "| target | rep | down (s) | first 10 s: restarted / others | after 10 s: "
             "restarted / others (ratio) | observed (s) | warm within 10 s | window ratios |",
             "|---|---|---|---|---|---|---|---|"]
    for t, reps in restarts.items():
        for i, x in enumerate(reps):
            if not x.get("served"):
                lines.append(f"| {t} | {i} | — | served nothing after the restart | | | | no "
                             "| |")
                continue
            a, b = x["after_10s"], x["first_10s"]
            ratio = a["ratio"]
            control = x.get("control_ratio_after_10s", float("nan"))
            verdict = {True: "yes", False: "no", None: "—"}[x["is_warm_within_10s"]]
            windows = " ".join("—" if w["ratio"] != w["ratio"] else f"{w['ratio']:.2f}"
                               for w in x["windows"])
            lines.append(f"| {t} | {i} | {x['down_s']:.1f} | {_hf(b['restarted'])} / "
                         f"{_hf(b['others'])} | {_hf(a['restarted'])} / {_hf(a['others'])} "
                         f"({'—' if ratio != ratio else f'{ratio:.3f}x'}) | {_x(control)} | "
                         f"{x['observed_s']:.0f} | {verdict} | {windows} |")
    return "\n".join(lines)


def render_router_cache_hits(results: dict[str, Any]) -> str:
    out = [code(".venv/bin/python bench/router_cache_hits.py          # writes "
                "bench/results/router_cache_hits.{json,md,png}",
                ".venv/bin/python bench/router_cache_hits.py --quick --no-pin   "
                "# seconds; what tests/bench runs")]
    if "router_cache_hits_restart" in results:
        out[0] = code(".venv/bin/python bench/router_cache_hits.py          # writes "
                      "bench/results/router_cache_hits.{json,md,png}",
                      ".venv/bin/python bench/router_cache_hits.py --restart-replica "
                      "--num-requests 3000 "
                      "--out bench/results/router_cache_hits_restart.json",
                      ".venv/bin/python bench/router_cache_hits.py --quick --no-pin   "
                      "# seconds; what tests/bench runs")
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
