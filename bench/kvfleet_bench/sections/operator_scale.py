"""bench/operator_scale.py: 1,000 InferencePools against kmock."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kvfleet_bench.sections._fmt import code, pct, stat, table

FILES = ("operator_scale",)


def _num(x: float) -> str:
    return f"{x:,.1f}" if x % 1 else f"{x:,.0f}"


def render_operator_scale(results: dict[str, Any]) -> str:
    r = results["operator_scale"]
    s, runs = r["summary"], r["runs"]
    targets = s["targets"]

    def met(key: str) -> str:
        return "met" if s[key]["max"] < targets[key] else (
            "met by the median" if s[key]["median"] < targets[key] else "**missed**")

    out = [code(".venv/bin/" + s["command"]), "",
           f"Measured {s['date']} on commit {s['commit']}, {s['machine']}, pinned: "
           f"{s['pinned']}. Medians of {s['num_runs']} runs (min–max); operator tracebacks: "
           f"{_num(s['operator_tracebacks']['max'])}.", ""]
    rows = [
        ["time until every pool's children exist (s)", stat(s["seconds_to_all_children"], _num),
         f"under {targets['seconds_to_all_children']} s: {met('seconds_to_all_children')}"],
        ["operator peak RSS (MB)", stat(s["operator_peak_rss_mb"], _num),
         f"under {targets['operator_peak_rss_mb']} MB: {met('operator_peak_rss_mb')}"],
        ["operator CPU until then (s)", stat(s["operator_cpu_s_until_children"], _num), ""],
        ["mock CPU until then (s; kmock + the bench, one process)",
         stat(s["mock_cpu_s_until_children"], _num), ""],
        ["API requests until then", stat(s["api_requests"], _num), ""],
        ["idle API requests/s afterwards", stat(s["idle_api_requests_per_s"], _num), ""],
    ]
    out.append(table(["", f"{s['num_pools']:,} pools", "target"], rows))
    idle: Counter[str] = Counter()
    for run in runs:
        idle.update(run.get("idle_api_requests_by_call", {}))
    total = sum(idle.values())
    if total:
        out += ["", "Idle API requests by call, all runs together: " + ", ".join(
            f"{call} {pct(1)(n / total)}" for call, n in idle.most_common()) + "."]
    return "\n".join(out)
