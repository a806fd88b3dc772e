"""bench/autoscale_local.py: kvfleet's autoscaler vs fixed-max vs the KEDA waiting rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvfleet_bench.sections._fmt import code, fixed, pct, table, times

FILES = ("autoscale_local", "autoscale_local_heldout")


def _sim_command(args: dict[str, Any]) -> str:
    trace = Path(args["trace"]).name
    pool = " ".join("examples/" + Path(p).name for p in args["pool"])
    return (f"# = kvfleet sim --trace ../shared/traces/{trace} --pool {pool} \\\n"
            f"#     --start-s {args['start_s']:g} --duration-s {args['duration_s']:g} "
            f"--warmup-s {args['warmup_s']:g} --compress {args['compress']:g} "
            f"--startup-s {args['startup_s']:g}")


def render_autoscale_local(results: dict[str, Any]) -> str:
    r = results["autoscale_local"]
    args, runs = r["args"], {run["summary"]["name"]: run["summary"] for run in r["runs"]}
    first = next(iter(runs.values()))
    measured_s = first["duration_s"]
    out = [code(".venv/bin/python bench/autoscale_local.py      # deterministic; writes "
                "bench/results/autoscale_local.{json,png}", _sim_command(args)), ""]
    out.append(
        f"Slice: `{Path(args['trace']).name}` from trace second {args['start_s']:g} for "
        f"{args['duration_s']:g} s after {args['warmup_s']:g} s of unmeasured warm-up, "
        f"compressed {args['compress']:g}x: {first['num_requests']:,} requests in "
        f"{measured_s:g} virtual seconds ({first['num_requests'] / measured_s:.1f} req/s); "
        f"replica start-up {args['startup_s']:g} s. SLO per request: TTFT <= "
        f"{r['ttft_slo_s']:g} s and mean inter-token latency <= "
        f"{1000 * r['itl_slo_s']:g} ms. The results file records no commit, date or "
        f"machine (the simulator's figures do not depend on the machine).")
    out.append("")
    rows = []
    for name, s in runs.items():
        rows.append([
            name, pct(1)(s["slo_attainment"]),
            f"{s['ttft_p50_s']:.2f} / {s['ttft_p90_s']:.2f} / {s['ttft_p99_s']:.2f}",
            f"{1000 * s['itl_p50_s']:.1f} / {1000 * s['itl_p90_s']:.1f}",
            fixed(0)(s["replica_seconds"]), f"{s['mean_replicas']:.2f} / {s['max_replicas']}",
            s["num_scale_events"], s["num_failed"],
        ])
    out.append(table(["scaler", "SLO met", "TTFT p50 / p90 / p99 (s)", "ITL p50 / p90 (ms)",
                      "replica-s", "mean / max replicas", "scale events", "failed"], rows))
    base = runs.get("fixed-max")
    if base:
        out.append("")
        words = []
        for name, s in runs.items():
            if name == "fixed-max":
                continue
            words.append(f"{name} {times(2)(s['replica_seconds'] / base['replica_seconds'])} "
                         f"of fixed-max's replica-seconds, SLO missed by "
                         f"{pct(1)(1 - s['slo_attainment'])} of requests, "
                         f"{s['num_scale_events']} scale events")
        out.append("Ratios: " + "; ".join(words) + ".")
    if "autoscale_local_heldout" in results:
        out += ["", _held_out(results["autoscale_local_heldout"])]
    return "\n".join(out)


def _held_out(r: dict[str, Any]) -> str:
    """Per held-out slice, each scaler's SLO attainment and replica-seconds."""
    slices = r["slices"]
    names = [s["name"] for s in slices[0]["summaries"]]
    rows = []
    for sl in slices:
        a, by = sl["args"], {s["name"]: s for s in sl["summaries"]}
        rows.append([f"`{Path(a['trace']).name}` from {a['start_s']:g} s"] + [
            f"{pct(1)(by[n]['slo_attainment'])} / {fixed(0)(by[n]['replica_seconds'])}"
            for n in names])
    first = slices[0]
    return "\n".join([
        code(".venv/bin/python bench/autoscale_local.py --held-out   # writes "
             "bench/results/autoscale_local_heldout.json"), "",
        f"Held-out slices (chosen after the pool's defaults were set): the same pool, "
        f"warm-up, compression and start-up, SLO TTFT <= {first['ttft_slo_s']:g} s and "
        f"mean inter-token latency <= {1000 * first['itl_slo_s']:g} ms. Each cell: SLO met "
        f"/ replica-s.", "",
        table(["slice", *names], rows)])
