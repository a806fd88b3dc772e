"""bench/sim_fidelity.py: `kvfleet up` (live) vs `kvfleet sim` on one scenario, with
`--routing` the routers' hit fractions live vs simulated (sim_routing_fidelity.json), and
with `--autoscaling` the autoscaler's replica-seconds and attainment (sim_scaling_fidelity)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvfleet_bench.sections._fmt import code, pct, table

FILES = ("sim_fidelity", "sim_fidelity_slo", "sim_fidelity_latency", "sim_routing_fidelity",
         "sim_routing_fidelity_run1", "sim_scaling_fidelity")
ROUTING_FILES = FILES[3:5]

_ROWS = [("TTFT p50 (ms)", "ttft_p50_s", 1000), ("TTFT p90 (ms)", "ttft_p90_s", 1000),
         ("E2E p50 (ms)", "e2e_p50_s", 1000), ("E2E p90 (ms)", "e2e_p90_s", 1000),
         ("output tokens/s", "output_tokens_per_s", 1), ("requests/s", "requests_per_s", 1)]


def _gap(x: float) -> str:
    return f"{100 * x:+.1f}%"


def render_sim_fidelity(results: dict[str, Any]) -> str:
    text = _render_latency(results["sim_fidelity"])
    text += "\n\n" + render_mape(results["sim_fidelity"], results.get("sim_fidelity_slo"),
                                results.get("sim_fidelity_latency"))
    text += "\n\n" + render_policy_runs(results["sim_fidelity"], results.get("sim_fidelity_slo"),
                                       results.get("sim_fidelity_latency"))
    routing = [stem for stem in ROUTING_FILES if stem in results]
    for i, stem in enumerate(routing):
        text += "\n\n" + render_routing(results[stem], stem, is_first=i == 0)
    if "sim_scaling_fidelity" in results:
        text += "\n\n" + render_scaling(results["sim_scaling_fidelity"])
    return text


def render_scaling(r: dict[str, Any]) -> str:
    """The autoscaler live (`kvfleet up`) against the simulator on the same slice."""
    a, live, sim, gap = r["args"], r["live"], r["sim"], r["gap"]
    per_seed = r["sim_per_seed"]
    over = r["over_tolerance"]
    rows = [["replica-seconds", f"{live['replica_seconds']:.0f}",
             f"{sim['replica_seconds']:.0f}",
             " / ".join(f"{s['replica_seconds']:.0f}" for s in per_seed),
             _gap(gap["replica_seconds"])],
            ["SLO met", pct(1)(live["slo_attainment"]), pct(1)(sim["slo_attainment"]),
             " / ".join(pct(1)(s["slo_attainment"]) for s in per_seed),
             _gap(gap["slo_attainment"])],
            ["most replicas", str(live["max_replicas"]), f"{sim['max_replicas']:g}",
             " / ".join(str(s["max_replicas"]) for s in per_seed), ""],
            ["replica-count changes", str(live["num_changes"]), f"{sim['num_changes']:g}",
             " / ".join(str(s["num_changes"]) for s in per_seed), ""]]
    startup = (f"{r['startup_s']:.1f} s as the live fleet measured it (median of "
               f"{len(live['startups_s'])} scale-ups)" if r["is_startup_measured"]
               else f"{r['startup_s']:.1f} s (assumed: the live fleet never scaled up)")
    return "\n".join([
        "**Autoscaling: replica-seconds and attainment live vs simulated** (`--autoscaling`)",
        "", code(".venv/bin/python bench/sim_fidelity.py --autoscaling   # writes "
                 "bench/results/sim_scaling_fidelity.json"), "",
        f"Scenario: `{Path(a['trace']).name}` [{a['start_s']:g}, "
        f"{a['start_s'] + a['duration_s']:g}) s ({live['num_requests']} requests), "
        f"`{r['pool']}` scaled by kvfleet's autoscaler from its SLO (TTFT <= "
        f"{r['ttft_slo_s']:g} s, mean ITL <= {1000 * r['itl_slo_s']:g} ms); live from "
        f"`kvfleet up` started at its minimum, the simulator with a start-up of {startup}, "
        f"{len(per_seed)} seeds, median. Measured on commit {r['measured']['commit']}, "
        f"{r['measured']['started_utc']}, load average {live['loadavg_1m'][0]:.2f} -> "
        f"{live['loadavg_1m'][1]:.2f} on {r['measured']['num_cpus']} cores.", "",
        table(["figure", "`kvfleet up` (live)", "`kvfleet sim` (median)", "sim per seed",
               "gap"], rows), "",
        f"Gap = (sim - live) / live; tolerance {pct(0)(a['tolerance'])} on replica-seconds "
        f"and attainment: {'exceeded on ' + ', '.join(over) if over else 'met'}."])


def render_mape(default: dict[str, Any], slo: dict[str, Any] | None,
                latency: dict[str, Any] | None = None) -> str:
    """The perf model's error, live and simulated, per run of the latency scenario."""
    rows = []
    for name, r in (("pool's policy", default), ("`--policy slo`", slo),
                    ("`--policy latency`", latency)):
        m = r and r.get("perf_model_mape")
        if not m:
            continue
        live, sim = m["live"], m["sim"]
        seeds = " / ".join(pct(1)(v) for v in sim["ttft"]["per_seed"])
        rows.append([f"{name} (`{r['args'].get('policy') or 'cache-aware'}`)",
                     pct(1)(live["ttft"]["mape"]), pct(1)(sim["ttft"]["mape"]), seeds,
                     pct(1)(live["tpot"]["mape"]), pct(1)(sim["tpot"]["mape"]),
                     f"{live['ttft']['num']:.0f} / {live['tpot']['num']:.0f}"])
    if not rows:
        return "(no perf-model error recorded in these results)"
    return "\n".join([
        "**The router's performance model, live and simulated** (same scenario; `--policy "
        "slo --json bench/results/sim_fidelity_slo.json` and `--policy latency --json "
        "bench/results/sim_fidelity_latency.json` run it under those policies, whose own "
        "predictions are then the ones scored): the mean absolute percentage error of the "
        "TTFT and TPOT predicted for each finished stream.", "",
        table(["run", "TTFT MAPE, live", "TTFT MAPE, sim (median)", "sim per seed",
               "TPOT MAPE, live", "TPOT MAPE, sim (median)", "live predictions TTFT / TPOT"],
              rows)])


def render_policy_runs(default: dict[str, Any], slo: dict[str, Any] | None,
                       latency: dict[str, Any] | None) -> str:
    """TTFT live against the simulator per routing policy run of the scenario: does the
    simulator's verdict on each policy hold live? (Each file is its own run, at the commit
    and load it names: a fidelity check per policy, not a live ranking of the policies.)"""
    rows = []
    for name, r in (("pool's policy", default), ("`--policy slo`", slo),
                    ("`--policy latency`", latency)):
        if not r:
            continue
        live, sim, gap = r["live"], r["sim"], r["gap"]
        rows.append([f"{name} (`{r['args'].get('policy') or 'cache-aware'}`)",
                     *(f"{1000 * live[k]:.1f} / {1000 * sim[k]:.1f} ({_gap(gap[k])})"
                       for k in ("ttft_p50_s", "ttft_p90_s")),
                     f"{live['requests_per_replica']} / {sim['requests_per_replica']}",
                     ", ".join(r.get("over_tolerance") or []) or "none",
                     str(r.get("measured", {}).get("commit", "(not recorded)"))])
    return "\n".join([
        "**Each policy run, live against the simulator** (TTFT in ms, live / sim (gap); the "
        "simulator with the run's client latency; requests per replica live / sim seed 0). "
        "Each row is its own run, at the commit and machine load it names: whether the "
        "simulator's figures for that policy hold live, not a live ranking of the policies.",
        "", table(["run", "TTFT p50", "TTFT p90", "requests per replica",
                   "over the tolerance", "commit"], rows)])


def _hit(d: dict[str, Any]) -> str:
    if len(d["values"]) == 1:
        return f"{d['median']:.3f}"
    return f"{d['median']:.3f} ({d['min']:.3f}–{d['max']:.3f})"


def render_routing(r: dict[str, Any], stem: str, is_first: bool) -> str:
    m = r["meta"]
    git = m["git"]
    out = []
    if is_first:
        out += ["**Routing: hit fraction live vs simulated** (`--routing`)", "",
                code(".venv/bin/python bench/sim_fidelity.py --routing   # writes "
                     "bench/results/sim_routing_fidelity.json",
                     ".venv/bin/python bench/sim_fidelity.py --routing --quick   # seconds; "
                     "what tests/bench runs"), ""]
    out += [f"**`bench/results/{stem}.json`**:", ""]
    shape = m["trace_shape"]
    out.append(
        f"Run: `{m['command'].strip()}`, started {m['started_utc']}; `{m['trace']}`, "
        f"{shape['num_requests']} requests after skipping {m['skip']}, replayed at "
        f"x{m['speedup']:g}; {m['num_backends']} backends x {m['cache_blocks_per_backend']} "
        f"blocks (LRU), one hash id = {m['block_chars']} characters live = "
        f"{m['sim_block_tokens']} token ids in the simulator; "
        f"{m['prefill_ms_per_block']:g} ms per missed block and {m['ms_per_output_token']:g} "
        f"ms per output token before compression, outputs capped at "
        f"{m['max_output_tokens']} tokens. Live: {m['reps']} repetitions; simulator "
        f"(`{m['sim_pool']}`, fake-backend replicas, steps of at most {m['sim_step_ms']:g} "
        f"ms): {m['sim_seeds']} seeds. Cells: median (min–max). Commit "
        f"{git['commit'][:10]}{' (router/ differed from it)' if git['router_tree_differs'] else ''}"
        f", load average {m['loadavg_1m'][0]:g} -> {m['loadavg_1m'][1]:g}. Pooled-cache "
        f"ceiling {r['pooled_cache_hit_fraction']:.3f}.")
    out.append("")
    rows = []
    for target, row in r["rows"].items():
        live, sim = row["live"], row["sim"]
        rows.append([f"`{target}`", f"`{row['sim_policy']}`", _hit(live["hit_fraction"]),
                     _hit(sim["hit_fraction"]), f"{100 * row['gap']:+.1f}%",
                     f"{live['mean_backends_per_shared_prefix']['median']:.2f} / "
                     f"{sim['mean_backends_per_shared_prefix']['median']:.2f}",
                     str(live["num_errors"])])
    out.append(table(["live target", "simulator policy", "hit fraction, live",
                      "hit fraction, sim", "gap", "backends per shared prefix, live / sim",
                      "live errors"], rows))
    rank = r["ranking"]
    over = r["over_tolerance"]
    disagree = [" vs ".join(d["pair"]) for d in rank["disagreements"]]
    same = "the same order" if rank["is_median_order_equal"] else "a different order"
    out += ["",
            "Per repetition, live: " + "; ".join(
                f"{t} " + ", ".join(f"{v:.3f}" for v in row["live"]["hit_fraction"]["values"])
                for t, row in r["rows"].items()) + ". Per seed, sim: " + "; ".join(
                f"{row['sim_policy']} " + ", ".join(
                    f"{v:.3f}" for v in row["sim"]["hit_fraction"]["values"])
                for row in r["rows"].values()) + ".",
            "",
            f"Ranking by median hit fraction, live: {' > '.join(rank['live'])}; sim: "
            f"{' > '.join(rank['sim'])} ({same}). "
            f"Rank disagreements (a pair ordered differently where a side's ranges separate "
            f"it): {', '.join(disagree) or 'none'}. Gap = (sim - live) / live; tolerance "
            f"{pct(0)(m['tolerance'])}: {'exceeded by ' + ', '.join(over) if over else 'met'}. "
            f"Verdict: {'pass' if r['is_ok'] else 'FAIL'}."]
    return "\n".join(out)


def _render_latency(r: dict[str, Any]) -> str:
    a, info, measured = r["args"], r["live_info"], r.get("measured", {})
    live, sim, free = r["live"], r["sim"], r["sim_network_free"]
    client_ms = 1000 * r["client_latency_s"]
    out = [code(".venv/bin/python bench/sim_fidelity.py     # writes "
                "bench/results/sim_fidelity.json",
                ".venv/bin/python bench/sim_fidelity.py --start-s 1410 --duration-s 40   "
                "# a shorter slice"), ""]
    out.append(
        f"Scenario: `{Path(a['trace']).name}` [{a['start_s']:g}, "
        f"{a['start_s'] + a['duration_s']:g}) s ({r['num_requests']} requests), "
        f"`{Path(a['pool']).name}` ({r['num_replicas']} replicas, profile `{r['profile']}`); "
        f"the simulator over {a['sim_seeds']} seeds, median; client latency "
        f"`{a['client_latency']}` = {client_ms:.1f} ms (isolated probes: "
        f"{r['probe_live_minus_sim']['ttft_p50_ms']:.1f} ms). Measured on commit "
        f"{measured.get('commit', '(not recorded)')}, load average "
        f"{measured.get('loadavg_1m', '(not recorded)')}.")
    out.append("")
    rows = []
    for label, key, scale in _ROWS:
        rows.append([label, f"{scale * live[key]:.1f}", f"{scale * sim[key]:.1f}",
                     _gap(r["gap"][key]), f"{scale * free[key]:.1f}",
                     _gap(r["gap_network_free"][key])])
    rows.append(["requests per replica", str(live["requests_per_replica"]),
                 f"{sim['requests_per_replica']} (seed 0)", "", "", ""])
    out.append(table(["figure", "`kvfleet up` (live)",
                      f"`kvfleet sim`, client latency {client_ms:.1f} ms", "gap",
                      "`kvfleet sim`, network free", "gap"], rows))
    within = info["ttft_fraction_within"]
    bounds = list(within["live_engines"])
    mean = info["ttft_mean_s"]
    paired = r["paired_live_minus_sim"]
    over = r.get("over_tolerance")
    out += ["",
            f"Gap = (sim - live) / live; tolerance {pct(0)(a['tolerance'])} on TTFT p50/p90 and "
            f"throughput: {'exceeded on ' + ', '.join(over) if over else 'met'}. "
            f"Client minus engines' TTFT split: {client_ms:.1f} ms per request.",
            "",
            "The engines' TTFT distribution, share of requests within "
            + " / ".join(f"{float(b):g}" for b in bounds) + " s: live engines "
            + " / ".join(pct(1)(within["live_engines"][b]) for b in bounds)
            + ", simulated (network free) "
            + " / ".join(pct(1)(within["sim_network_free"][b]) for b in bounds)
            + f"; mean TTFT {1000 * mean['engine']:.1f} ms live (engines) vs "
            f"{1000 * mean['sim_network_free']:.1f} ms simulated. Same-request TTFT "
            f"difference live - sim, p10 / p50 / p90: {paired['ttft_p10_ms']:+.0f} / "
            f"{paired['ttft_p50_ms']:+.0f} / {paired['ttft_p90_ms']:+.0f} ms over "
            f"{paired['num_pairs']} pairs; isolated probes finish "
            f"{r['probe_live_minus_sim']['e2e_p50_ms']:.1f} ms later live (E2E p50) and get "
            f"their first token {r['probe_live_minus_sim']['ttft_p50_ms']:.1f} ms later."]
    return "\n".join(out)
