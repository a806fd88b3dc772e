"""bench/sim_fidelity.py: `kvfleet up` (live) vs `kvfleet sim` on one scenario."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvfleet_bench.sections._fmt import code, pct, table

FILES = ("sim_fidelity",)

_ROWS = [("TTFT p50 (ms)", "ttft_p50_s", 1000), ("TTFT p90 (ms)", "ttft_p90_s", 1000),
         ("E2E p50 (ms)", "e2e_p50_s", 1000), ("E2E p90 (ms)", "e2e_p90_s", 1000),
         ("output tokens/s", "output_tokens_per_s", 1), ("requests/s", "requests_per_s", 1)]


def _gap(x: float) -> str:
    return f"{100 * x:+.1f}%"


def render_sim_fidelity(results: dict[str, Any]) -> str:
    r = results["sim_fidelity"]
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
