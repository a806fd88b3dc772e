"""bench/router_memory.py: the router's RSS under unique prompts, sessions and tenants."""

from __future__ import annotations

from typing import Any

from kvfleet_bench.sections._fmt import code, table

FILES = ("router_memory",)
MAX_ROWS = 11  # samples shown: evenly spaced, the first and the last always


def _rows(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if len(samples) <= MAX_ROWS:
        return samples
    step = (len(samples) - 1) / (MAX_ROWS - 1)
    return [samples[round(k * step)] for k in range(MAX_ROWS)]


def render_router_memory(results: dict[str, Any]) -> str:
    r = results["router_memory"]
    meta, s = r["meta"], r["summary"]
    out = [code(".venv/bin/" + meta["command"]), "",
           f"Measured {meta['started_utc'][:10]} on commit {meta['commit']}, "
           f"{meta['num_cpus']} × {meta['cpu']} shared by the router, the fake backends "
           f"({meta['num_backends']}) and the load side ({meta['concurrency']} connections); "
           f"{meta['prompt_bytes']}-byte prompts, 1-token answers (one request in "
           f"{meta['stream_every']} streamed), {s['requests_per_s']:,.0f} "
           f"requests/s, {s['router_cpu_us_per_request']:,.0f} µs of router CPU per "
           f"request; errors: {s['num_errors']:,}.", ""]
    rows = [[f"{x['requests']:,}", f"{x['rss_mib']:,.1f}", f"{x['elapsed_s']:,.0f}"]
            for x in _rows(r["samples"])]
    out.append(table(["requests (all unique)", "router RSS (MiB)", "elapsed (s)"], rows))
    out += ["", f"**Bound:** the router's RSS peaked at {s['rss_peak_mib']:,.1f} MiB "
            f"(started at {s['rss_start_mib']:,.1f} MiB) over {s['num_requests']:,} requests "
            f"with a new prompt, session and tenant each; from {s['half_requests']:,} "
            f"requests to the end it changed by {s['growth_second_half_mib']:+,.1f} MiB, "
            f"moving between {s['rss_second_half_min_mib']:,.1f} and "
            f"{s['rss_second_half_max_mib']:,.1f} MiB."]
    return "\n".join(out)
