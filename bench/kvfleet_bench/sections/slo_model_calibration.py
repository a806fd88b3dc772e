"""bench/slo_model_calibration.py: the autoscaler's SLO model against what a fleet pinned
at N replicas measured, in the simulator."""

from __future__ import annotations

import math
from typing import Any

from kvfleet_bench.sections._fmt import code, pct, table

FILES = ("slo_model_calibration",)


def _ms(s: float) -> str:
    return "inf" if not math.isfinite(s) else f"{s * 1000:,.0f}"


def _ms1(s: float) -> str:
    return "inf" if not math.isfinite(s) else f"{s * 1000:.1f}"


def _count(x: float) -> str:
    return f"{x:g}"


def _predicted(d: dict[str, Any] | None, fmt: Any) -> str:
    if d is None:
        return "no fit"
    text = f"{fmt(d['p50'])} / {fmt(d['p90'])}"
    return text + (f", {d['num_infeasible']} infeasible" if d["num_infeasible"] else "")


def smallest(rows: list[dict[str, Any]], ok: Any) -> str:
    """The smallest pinned count whose measured figures satisfy `ok`, or "none of these"."""
    found = [r["count"] for r in rows if ok(r["measured"], r["slo"])]
    return str(min(found)) if found else "none of these counts"


def slice_markdown(s: dict[str, Any]) -> str:
    rows = s["rows"]
    body = [[r["count"],
             _ms(r["measured"]["ttft_p90_s"]), _predicted(r["predicted"]["ttft_p90_s"], _ms),
             _predicted(r["predicted"].get("ttft_p90_shared_s"), _ms),
             _ms(r["shared_solo_ttft_p90_s"]) if "shared_solo_ttft_p90_s" in r else "-",
             _ms1(r["measured"]["itl_p90_s"]), _predicted(r["predicted"]["itl_p90_s"], _ms1),
             pct()(r["measured"]["slo_attainment"]), pct()(r["measured"]["prefix_hit_rate"]),
             _predicted(r["predicted"]["asked"], _count), r["num_ticks_fleet_model"]]
            for r in rows]
    meets_targets = smallest(rows, lambda m, slo: m["ttft_p90_s"] <= slo["ttft_p90_s"]
                             and m["itl_p90_s"] <= slo["itl_p90_s"])
    meets_bar = smallest(rows, lambda m, slo: m["slo_attainment"] >= s["bar"])
    asks = [r["predicted"]["asked"]["p90"] for r in rows if r["predicted"]["asked"]]
    slo = rows[0]["slo"]
    return "\n".join([
        f"**{s['label']}** (`{s['trace']}` from {s['start_s']:g} s, `{s['pool']}`, targets "
        f"TTFT p90 <= {_ms(slo['ttft_p90_s'])} ms, ITL p90 <= {_ms1(slo['itl_p90_s'])} ms"
        + (f"; the p90 of its requests' solo TTFT, each prompt alone on an idle replica with "
           f"an empty cache: {_ms(s['solo_ttft_p90_s'])} ms" if "solo_ttft_p90_s" in s else "")
        + (f"; its p90 prompt is {s['prompt_tail']:.2f}x its mean prompt"
           if "prompt_tail" in s else "")
        + ")",
        "",
        table(["replicas (pinned)", "TTFT p90 measured (ms)", "TTFT p90 predicted (ms)",
               "processor-sharing candidate (ms)",
               "solo p90 / (1 - rho) (ms)",
               "ITL p90 measured (ms)", "ITL p90 predicted (ms)", "SLO met", "prefix hit",
               "model asks for", "ticks"], body),
        "",
        f"Smallest count measured within both targets: {meets_targets}; smallest count "
        f"whose SLO attainment reached {pct()(s['bar'])}: {meets_bar}; the model asked for "
        f"{_count(min(asks)) if asks else '-'} to {_count(max(asks)) if asks else '-'} "
        "(the p90 of its asks per pinned count)."])


def results_markdown(result: dict[str, Any]) -> str:
    head = (f"Run: `{result['command']}` on commit {result['commit']}; each slice "
            f"{result['duration_s']:g} s measured after {result['warmup_s']:g} s of warm-up, "
            f"start-up {result['startup_s']:g} s. Predicted cells: p50 / p90 over the "
            "control-loop ticks of the measured window that had load and where the routers' "
            "fit had replaced the seed (ticks); the TTFT and ITL predicted at the p"
            f"{result['predict_quantile'] * 100:g} for one of N replicas; \"model asks "
            "for\": the count the SLO sizing chose at those ticks, at the pool's targets as "
            "the autoscaler checks them (its scale-down hold keeps about the p90); "
            "\"processor-sharing candidate\": not what the sizing uses yet, the perf model's "
            "TTFT alone on a replica of the routers' recent p90 uncached prompt, stretched by "
            "1 / (1 - rho), rho = the role's request rate per replica x the model's prefill "
            "of the routers' recent mean prompt (`shared_ttft_s`); \"solo p90 / (1 - "
            "rho)\": not the model but a reference from the cost model, the solo p90 "
            "stretched as a processor-sharing queue stretches a job (chunked prefill shares "
            "an engine's token budget among its admitted prompts), rho = measured requests "
            "per second per replica x the mean solo TTFT; no prefix hits.")
    return "\n\n".join([head, *(slice_markdown(s) for s in result["slices"])]) + "\n"


def render_slo_model_calibration(results: dict[str, Any]) -> str:
    out = [code(".venv/bin/python bench/slo_model_calibration.py   # writes "
                "bench/results/slo_model_calibration.{json,md}",
                ".venv/bin/python bench/slo_model_calibration.py --quick   # seconds; what "
                "tests/bench runs")]
    if "slo_model_calibration" in results:
        out += ["", results_markdown(results["slo_model_calibration"]).rstrip("\n")]
    return "\n".join(out)
