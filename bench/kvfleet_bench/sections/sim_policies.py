"""bench/sim_policies.py: routing policies, autoscalers and scaling efficiency, simulated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvfleet_bench.sections._fmt import code, fixed, pct, table, times

FILES = ("sim_policies",)


def _short(arg: str) -> str:
    """Machine paths as the repository's relative ones."""
    if arg.startswith("/") and "/shared/traces/" in arg:
        return "../shared/traces/" + arg.split("/shared/traces/", 1)[1]
    if arg.startswith("/") and "/bench/results/" in arg:
        return "bench/results/" + arg.split("/bench/results/", 1)[1]
    return arg


def _run_name(run: dict[str, Any], entry_args: dict[str, Any]) -> str:
    v = run["variant"]
    parts = []
    if len(entry_args.get("pool") or []) > 1:
        parts.append(Path(v["pool_path"]).stem)
    several_scalers = len(entry_args.get("scaler") or []) > 1
    if several_scalers or v.get("policy") is None and v["scaler"] != "fixed-max":
        parts.append(v["scaler"])
    if v.get("policy"):
        parts.append(v["policy"])
    return " / ".join(parts) or Path(v["pool_path"]).stem


def _compare(entry: dict[str, Any]) -> str:
    r = entry["result"]
    args = r["args"]
    runs = r["runs"]
    fixed_max = {run["variant"]["pool_path"]: run["summary"]["replica_seconds"]
                 for run in runs if run["variant"]["scaler"] == "fixed-max"}
    scalers = len(args.get("scaler") or []) > 1
    has_optimum = any(run["summary"].get("x_optimum") is not None for run in runs)
    rows = []
    # --seeds: the per-column medians over the router seeds (the runs are the first seed's)
    for run, s in zip(runs, r.get("medians") or [run["summary"] for run in runs], strict=True):
        slo = pct(1)(s["slo_attainment"])
        if "spread" in s:
            slo += " ({}–{})".format(*map(pct(1), s["spread"]["slo_attainment"]))
        spent = fixed(0)(s["replica_seconds"])
        lo, hi = s.get("spread", {}).get("replica_seconds", (None, None))
        if lo != hi:  # where the seeds moved the scaler (older results carry no spread)
            spent += f" ({fixed(0)(lo)}–{fixed(0)(hi)})"
        row = [_run_name(run, args), slo, pct(1)(s["prefix_hit_rate"]),
               f"{1000 * s['ttft_p50_s']:,.0f} / {1000 * s['ttft_p90_s']:,.0f}",
               f"{s['imbalance_mean']:.2f}", spent]
        if scalers:
            base = fixed_max.get(run["variant"]["pool_path"])
            row.append(times(2)(s["replica_seconds"] / base) if base else "–")
        if has_optimum:
            x = s.get("x_optimum")
            row.append(times(2)(x) if x is not None else "–")
        row.append(s["num_failed"])
        rows.append(row)
    header = ["run", "SLO met", "prefix hit", "TTFT p50 / p90 (ms)", "imbalance mean",
              "replica-s"]
    if scalers:
        header.append("replica-s vs fixed-max (same pool)")
    if has_optimum:
        header.append("× optimum (hindsight)")
    header.append("failed")
    return table(header, rows)


def _efficiency(entry: dict[str, Any]) -> str:
    r = entry["result"]
    rows = [[p["replicas"], f"{p['max_rate']:.3g} (< {p['upper_rate']:.3g})",
             f"{p['req_per_s']:,.1f}", pct(1)(p["slo_attainment"]), pct(1)(p["efficiency"])]
            for p in r["points"]]
    head = (f"Target: {pct(0)(r['slo_attainment'])} of requests within the SLO; bisection to "
            f"{pct(0)(r['tolerance'])}; efficiency = rate(N) / (N x rate(1)).")
    return head + "\n\n" + table(["replicas", "max rate multiplier (lowest failing)", "req/s",
                                  "SLO met", "efficiency"], rows)


def render_sim_policies(results: dict[str, Any]) -> str:
    entries = results["sim_policies"]
    first = entries[0]["result"]
    out = [code(".venv/bin/python bench/sim_policies.py --jobs 2   # deterministic; writes "
                "bench/sim_policies.md and bench/results/sim_policies.json"), "",
           f"SLO per request: TTFT <= {first['ttft_slo_s']:g} s (the pools' `ttftP90Seconds`) "
           f"and mean ITL <= {1000 * first['itl_slo_s']:g} ms. The results file records no "
           f"commit or date; the full tables (every percentile) are in "
           f"`bench/sim_policies.md`."]
    for entry in entries:
        r = entry["result"]
        command = "kvfleet sim " + " ".join([r["args"]["command"], *map(_short, entry["args"])])
        out += ["", f"**{entry['title']}**", "", code(command), ""]
        out.append(_efficiency(entry) if "points" in r else _compare(entry))
    return "\n".join(out)
